"""What a parse returns: messages with their token spans, what was skipped and repaired."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..model import Message
from ..tokens import StopName


@dataclass(frozen=True)
class Repair:
    """One fix the tolerant parser made, over the token range ``[start, end)``.

    ``kind`` is a stable name (see ``REPAIR_KINDS``); ``detail`` says what was
    found and what was done, for people.
    """

    kind: str
    start: int
    end: int
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "start": self.start, "end": self.end, "detail": self.detail}


@dataclass
class ParseResult:
    """Everything a completion parsed into; nothing of the input is lost.

    ``spans[i]`` is the token range of ``messages[i]`` (header, body and
    terminator); ``skipped`` are the ranges that belong to no message. Together
    they tile ``[0, len(tokens))`` in order. Every skipped range has a repair.

    >>> from harmonykit import load_harmony_encoding, HarmonyEncodingName
    >>> enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    >>> toks = enc.encode("<|channel|>final<|message|>Hi<|end|><|return|>", allowed_special="all")
    >>> r = enc.parse_completion(toks)
    >>> [m.content[0].text for m in r.messages], r.skipped, r.repairs[0].kind
    (['Hi'], [(5, 6)], 'stray_stop_token')
    """

    messages: list[Message] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    skipped: list[tuple[int, int]] = field(default_factory=list)
    repairs: list[Repair] = field(default_factory=list)
    stop: StopName | None = None
    complete: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "messages": [m.to_dict() for m in self.messages],
            "spans": [list(s) for s in self.spans],
            "skipped": [list(s) for s in self.skipped],
            "repairs": [r.to_dict() for r in self.repairs],
            "stop": self.stop,
            "complete": self.complete,
        }


#: Every repair kind the tolerant parser reports, with what it means.
REPAIR_KINDS: dict[str, str] = {
    "stray_stop_token": "a stop token outside any message was set aside",
    "stray_text": "tokens between messages that start no message were set aside",
    "missing_start": "a message began without <|start|>; one was assumed",
    "doubled_start": "a second <|start|> before the header was ignored",
    "missing_role": "a header without a role word; the expected role was assumed",
    "unknown_role": "the role word was not a role; the expected role was assumed",
    "doubled_role": "the role word was written twice (assistantassistant)",
    "glued_channel": "the channel word was glued to the role word (assistantfinal)",
    "empty_channel": "<|channel|> had no channel name; final was assumed before <|message|>",
    "missing_channel_marker": "a channel name opened the header without <|channel|>",
    "channel_repaired": "junk around the channel name was removed",
    "duplicate_channel": "the channel was given twice; the last one was kept",
    "duplicate_recipient": "the recipient was given twice; one was kept",
    "bad_recipient": "a recipient that names nothing (empty, functions. alone, markup) was dropped",
    "self_recipient": "an assistant message addressed to the assistant; recipient dropped",
    "recipient_with_spaces": "a recipient of several words (a tool name with spaces)",
    "content_type_glued": "the content type was glued to the tool name (functions.shelljson)",
    "control_token_in_header": "a control token inside a header was removed",
    "unknown_header_word": "a header word that is no header field was set aside",
    "prose_in_header": "free text in a header became a message of its own",
    "missing_message_token": "a header ended without <|message|>; its text became the body",
    "recipient_without_message": "a recipient in a header that never reached <|message|> was dropped",
    "empty_message": "a message with no body was set aside",
    "header_inside_body": "a new header began inside a body; the body was ended there",
    "control_token_in_body": "a control token inside a body was removed",
    "wrong_stop_token": "a stop token of the wrong kind ended a message",
    "invalid_token": "a token id outside the vocabulary was replaced by U+FFFD",
    "invalid_utf8": "bytes that are not UTF-8 were replaced by U+FFFD",
    "stripped_markup": "text whose special tokens were stripped was split at its channel words",
}
