"""``reasoning.encrypted_content``: the model's reasoning, sealed for the client to send back.

A client that stores nothing (``store: false``, the Vercel AI SDK's and Codex's way) asks for
``include: ["reasoning.encrypted_content"]`` and sends each reasoning item back on the next
step; the gateway opens it and the model keeps its chain of thought. The seal is AES-256-GCM
under the gateway's state key (``--state-key``, shared by replicas; else one generated once and
kept in the data directory, readable by its owner only), bound to the API key's owner: a blob
that fails its check — altered, another gateway's, another key's — is refused, never trusted.

>>> s = Sealer(bytes(32))
>>> s.open(s.seal("think", "owner-a"), "owner-a")
'think'
"""

from __future__ import annotations

import base64
import os
import secrets
from pathlib import Path

PREFIX = "hk1."  # the format, so that a later one can be told apart


class SealError(Exception):
    """An encrypted_content that is not this gateway's, for this key, unaltered."""


class Sealer:
    """Seals and opens reasoning text under one 32-byte key."""

    def __init__(self, key: bytes) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        if len(key) != 32:
            raise ValueError("the state key must be 32 bytes (base64: 44 characters)")
        self._aead = AESGCM(key)

    def seal(self, text: str, owner: str) -> str:
        nonce = secrets.token_bytes(12)
        blob = nonce + self._aead.encrypt(nonce, text.encode("utf-8"), owner.encode())
        return PREFIX + base64.urlsafe_b64encode(blob).decode()

    def open(self, sealed: str, owner: str) -> str:
        from cryptography.exceptions import InvalidTag

        if not isinstance(sealed, str) or not sealed.startswith(PREFIX):
            raise SealError("not an encrypted_content this gateway made")
        try:
            blob = base64.urlsafe_b64decode(sealed[len(PREFIX):].encode())
            return self._aead.decrypt(blob[:12], blob[12:], owner.encode()).decode("utf-8")
        except (InvalidTag, ValueError, UnicodeDecodeError):
            raise SealError("the encrypted_content failed its check (altered, or sealed by another "
                            "gateway or for another key)") from None


def state_key(given: str | None, folder: Path) -> bytes:
    """The key from ``--state-key`` (base64 of 32 bytes), else the one kept in ``folder``
    (made once, mode 0600)."""
    if given:
        try:
            key = base64.b64decode(given.encode(), validate=True)
        except ValueError:
            raise ValueError("--state-key must be 32 bytes in base64 (openssl rand -base64 32)") from None
        if len(key) != 32:
            raise ValueError("--state-key must be 32 bytes in base64 (e.g. openssl rand -base64 32)")
        return key
    path = folder / "state.key"
    if path.exists():
        key = base64.b64decode(path.read_text().strip())
        if len(key) == 32:
            return key
    folder.mkdir(parents=True, exist_ok=True)
    key = secrets.token_bytes(32)
    fd = os.open(str(path) + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(base64.b64encode(key).decode() + "\n")
    os.replace(str(path) + ".tmp", path)
    return key
