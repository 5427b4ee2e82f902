"""Inputs that drive each state of the parser (and each path of the mapping) n tokens deep.

Shared by the linearity tests (tests/test_scaling.py: the work done, counted) and make bench
(benchmarks/scaling.py: the time taken): a quadratic path shows in both as ~100x at 10x n.
"""

from __future__ import annotations

from collections.abc import Callable

import harmonykit as hk
from harmonykit.openai import ChatCompletionStream, completion_to_chat_choice, completion_to_response

ENC = hk.load_harmony_encoding(hk.HarmonyEncodingName.HARMONY_GPT_OSS)
START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL = 200006, 200007, 200008, 200005, 200003, 200002, 200012
RESERVED = 200014
WORD = ENC.encode(" word")[0]
TO_A = ENC.encode(" to=a")
FINAL, ANALYSIS, COMMENTARY = ENC.encode("final"), ENC.encode("analysis"), ENC.encode("commentary")
TO_F = ENC.encode(" to=functions.f")
NEWLINE = ENC.encode("\n")[0]


def header(*parts: list[int]) -> list[int]:
    return [t for p in parts for t in p]


# name -> n tokens -> the input
CASES: dict[str, Callable[[int], list[int]]] = {
    "body": lambda n: header([CHANNEL], FINAL, [MESSAGE], [WORD] * n, [RETURN]),
    "header_never_ends": lambda n: header([CHANNEL], ANALYSIS, [WORD] * n),
    "prose_header_then_call": lambda n: header([CHANNEL], ANALYSIS, [WORD] * n, TO_F, [MESSAGE], [WORD], [CALL]),
    "many_constrain": lambda n: header([CHANNEL], FINAL, [CONSTRAIN] * n, [MESSAGE], [WORD]),
    "constrain_and_words": lambda n: header([CHANNEL], FINAL, [CONSTRAIN, WORD] * (n // 2), [MESSAGE], [WORD]),
    "many_reserved": lambda n: header([CHANNEL], FINAL, [RESERVED, WORD] * (n // 2), [MESSAGE], [WORD]),
    "many_invalid_ids": lambda n: header([CHANNEL], FINAL, [300000, WORD] * (n // 2), [MESSAGE], [WORD]),
    "many_to_words": lambda n: header([CHANNEL], COMMENTARY, TO_A * (n // len(TO_A)), [MESSAGE], [WORD]),
    "many_channels": lambda n: header([CHANNEL, WORD] * (n // 2), [MESSAGE], [WORD]),
    "stray_stops": lambda n: [END] * n,
    "many_messages": lambda n: header([CHANNEL], FINAL, [MESSAGE, WORD, END, START]) * (n // 7),
    "control_tokens_in_body": lambda n: header([CHANNEL], FINAL, [MESSAGE], [CONSTRAIN, WORD] * (n // 2)),
    "stray_text_after_end": lambda n: header([CHANNEL], FINAL, [MESSAGE, WORD, END], [WORD] * n),
    # a header read as a body past HEADER_LIMIT, then white space it holds back, then a recipient
    "loose_body_blank_run": lambda n: header([CHANNEL], ANALYSIS, [WORD] * 70, [NEWLINE] * n, TO_F, [MESSAGE]),
    "stripped_markup": lambda n: ENC.encode("analysis" + " word" * n + "assistantfinal" + " word" * n),
}

PATHS: dict[str, Callable[[list[int]], object]] = {
    "parse": lambda toks: ENC.parse_completion(toks),
    "strict_lenient": lambda toks: ENC.parse_messages_from_completion_tokens(toks, hk.Role.ASSISTANT, strict=False),
}


#: Sizes: n for each case (stripped markup is read by regexes over the whole text, so smaller).
SIZES = {"stripped_markup": 1_000}
SIZE = 4_000


def stream(toks: list[int]) -> None:
    p = hk.StreamableParser(ENC, hk.Role.ASSISTANT, strict=False)
    for t in toks:
        p.process(t)
    p.process_eos()


ANSWER = lambda n: header([CHANNEL], FINAL, [MESSAGE], [WORD] * n, [RETURN])  # noqa: E731
ARGUMENTS = lambda n: header([CHANNEL], COMMENTARY, TO_F, [MESSAGE], ENC.encode('{"a": "'),  # noqa: E731
                             [WORD] * n, ENC.encode('"}'), [CALL])
REQUEST = {"tools": [{"type": "function", "function": {"name": "f"}}]}


def _chat_stream(toks: list[int]) -> None:
    stream = ChatCompletionStream(ENC, request=REQUEST, prompt_tokens=0)
    for i in range(0, len(toks), 4):
        stream.feed(toks[i : i + 4])
    stream.close()


MAPPINGS: dict[str, Callable[[list[int]], object]] = {
    "chat": lambda toks: completion_to_chat_choice(ENC, toks, request=REQUEST),
    "responses": lambda toks: completion_to_response(ENC, toks, request=REQUEST, prompt_tokens=0),
    "chat_stream": _chat_stream,
}
MAPPING_INPUTS = {"answer": ANSWER, "arguments": ARGUMENTS}
