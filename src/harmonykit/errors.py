"""The exceptions harmonykit raises."""

from __future__ import annotations


class HarmonyError(RuntimeError):
    """Raised where ``openai_harmony`` raises ``HarmonyError``.

    Like the reference's error it is a ``RuntimeError``, so code that catches
    either keeps working. Parse errors carry ``token_index``: the position of
    the token at which parsing failed (``None`` where no token is to blame, for
    example at the end of the stream).

    >>> try:
    ...     raise HarmonyError("Unknown role: foo", token_index=3)
    ... except RuntimeError as e:
    ...     e.token_index
    3
    """

    def __init__(self, message: str, *, token_index: int | None = None) -> None:
        super().__init__(message)
        self.token_index = token_index


class VocabularyError(HarmonyError):
    """The o200k_base vocabulary could not be found offline (says where it looked)."""
