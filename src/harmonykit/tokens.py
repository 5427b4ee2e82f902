"""Harmony's special tokens: names, ids and the stop-token sets.

Both the renderer and the parser work from these constants; neither knows the
other.
"""

from __future__ import annotations

import operator
import re
import sys
from array import array
from collections.abc import Iterable
from typing import Final, Literal

StopName = Literal["return", "call", "end"]

START: Final = 200006
END: Final = 200007
MESSAGE: Final = 200008
CHANNEL: Final = 200005
CONSTRAIN: Final = 200003
RETURN: Final = 200002
CALL: Final = 200012
STARTOFTEXT: Final = 199998
ENDOFTEXT: Final = 199999

#: One past the largest id of the o200k_harmony vocabulary.
N_VOCAB: Final = 201089

_NAMED: Final = {
    STARTOFTEXT: "<|startoftext|>",
    ENDOFTEXT: "<|endoftext|>",
    RETURN: "<|return|>",
    CONSTRAIN: "<|constrain|>",
    CHANNEL: "<|channel|>",
    START: "<|start|>",
    END: "<|end|>",
    MESSAGE: "<|message|>",
    CALL: "<|call|>",
}


def _special_tokens() -> dict[str, int]:
    # Every id from 199998 up that is not named is a reserved slot.
    out: dict[str, int] = {}
    for rank in range(STARTOFTEXT, N_VOCAB):
        out[_NAMED.get(rank, f"<|reserved_{rank}|>")] = rank
    return out


#: name -> id for all 1091 special tokens of o200k_harmony.
SPECIAL_TOKENS: Final[dict[str, int]] = _special_tokens()
#: id -> name, the inverse of SPECIAL_TOKENS.
SPECIAL_TOKEN_NAMES: Final[dict[int, str]] = {v: k for k, v in SPECIAL_TOKENS.items()}

CHANNEL_MARKER: Final = "<|channel|>"
CONSTRAIN_MARKER: Final = "<|constrain|>"

#: Tokens that end a message (what `stop_tokens()` returns, in the reference's order).
STOP_TOKENS: Final = (CALL, END, RETURN)
#: Tokens at which an assistant's sampling stops.
STOP_TOKENS_FOR_ASSISTANT_ACTIONS: Final = (CALL, RETURN)
STOP_TOKEN_SET: Final = frozenset(STOP_TOKENS)

#: The word for each stop token in `ParseResult.stop`.
STOP_NAMES: Final[dict[int, StopName]] = {RETURN: "return", CALL: "call", END: "end"}


def token_id(value: object, where: str) -> int:
    """One token id: an int (or anything with ``__index__``, such as a NumPy integer).

    >>> token_id(3.0, "tokens[2]")
    Traceback (most recent call last):
    TypeError: tokens[2] must be an int token id, got float 3.0
    """
    if isinstance(value, (float, str, bytes)) or value is None:
        raise TypeError(f"{where} must be an int token id, got {type(value).__name__} {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{where} must be an int token id, got {type(value).__name__} {value!r}") from None


def as_token_ids(tokens: Iterable[int], argument: str = "tokens") -> list[int]:
    """``tokens`` as a list of ints, or a ``TypeError`` naming the argument or the bad item.

    The check runs at C speed (an ``array``) and only falls back to a Python loop to
    name what is wrong, or for ids beyond 64 bits (kept: tolerant parsing reports them).

    >>> as_token_ids([200006, "user"])
    Traceback (most recent call last):
    TypeError: tokens[1] must be an int token id, got str 'user'
    """
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Iterable):
        hint = '; encode text first: enc.encode(text, allowed_special="all")' \
            if isinstance(tokens, (str, bytes)) else ""
        raise TypeError(f"{argument} must be a sequence of int token ids, got {type(tokens).__name__}{hint}")
    ids = tokens if type(tokens) is list else list(tokens)
    try:
        array("q", ids)
    except (TypeError, OverflowError):
        return [token_id(t, f"{argument}[{i}]") for i, t in enumerate(ids)]
    return ids


# In a 32-bit id, the byte holding bits 16-23 and the one holding bits 24-31.
_B2, _B3 = (2, 3) if sys.byteorder == "little" else (1, 0)
_HIGH = re.compile(rb"[\x03-\xff]")  # bits 16-23 of every id >= STARTOFTEXT (0x30D3E) are >= 3
_NONZERO = re.compile(rb"[^\x00]")


def special_positions(tokens: Iterable[int], argument: str = "tokens") -> tuple[list[int], list[int]]:
    """``tokens`` as a list of ints (checked as ``as_token_ids`` checks them), and the positions
    of those that are not ordinary text (special tokens, ids outside the vocabulary).

    One pass at C speed: the ids are packed as 32-bit integers and only ids whose high bytes
    could make them special are looked at in Python.

    >>> special_positions([200005, 35644, 200008, 12, 200007])
    ([200005, 35644, 200008, 12, 200007], [0, 2, 4])
    """
    ids = tokens if type(tokens) is list else None
    try:
        if ids is None:
            raise TypeError
        packed = array("I", ids)
    except (TypeError, OverflowError):  # not a list, not ints, or ids below 0 or beyond 32 bits
        ids = as_token_ids(tokens, argument)
        return ids, [i for i, t in enumerate(ids) if not 0 <= t < STARTOFTEXT]
    raw = packed.tobytes()
    top = raw[_B3::4]
    hits = [m.start() for m in _HIGH.finditer(raw[_B2::4])]  # in order
    if top.count(0) != len(top):  # ids of 2**24 and more (none in a well-formed completion)
        hits = sorted({*hits, *(m.start() for m in _NONZERO.finditer(top))})
    return ids, [i for i in hits if ids[i] >= STARTOFTEXT]
