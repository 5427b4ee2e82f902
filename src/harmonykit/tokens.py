"""Harmony's special tokens: names, ids and the stop-token sets.

Both the renderer and the parser work from these constants; neither knows the
other.
"""

from __future__ import annotations

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
