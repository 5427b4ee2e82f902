"""Every public path is linear in its input: time at 10x the size is about 10x, never 100x.

Each case builds an adversarial input of n tokens for one state of the parser
(or one path of the mapping) and compares the best of a few runs at n and 10n.
A ratio, not a time: the machine's speed cancels out; a quadratic path shows
as ~100x, far above the bound.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

import pytest

import harmonykit as hk
from harmonykit.openai import ChatCompletionStream, completion_to_chat_choice, completion_to_response

ENC = hk.load_harmony_encoding(hk.HarmonyEncodingName.HARMONY_GPT_OSS)
START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL = 200006, 200007, 200008, 200005, 200003, 200002, 200012
RESERVED = 200014
WORD = ENC.encode(" word")[0]
TO_A = ENC.encode(" to=a")
FINAL, ANALYSIS, COMMENTARY = ENC.encode("final"), ENC.encode("analysis"), ENC.encode("commentary")
TO_F = ENC.encode(" to=functions.f")
BOUND = 40  # linear is ~10-16 (allocation grows a little with size); quadratic ~100


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
    "stripped_markup": lambda n: ENC.encode("analysis" + " word" * n + "assistantfinal" + " word" * n),
}

PATHS: dict[str, Callable[[list[int]], object]] = {
    "parse": lambda toks: ENC.parse_completion(toks),
    "strict_lenient": lambda toks: ENC.parse_messages_from_completion_tokens(toks, hk.Role.ASSISTANT, strict=False),
}


def _best(fn: Callable[[], object], repeat: int) -> float:
    # The collector off while timing: its full passes scale with the heap, not the algorithm.
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
        finally:
            gc.enable()
    return best


def _ratio(make: Callable[[int], list[int]], run: Callable[[list[int]], object], n: int) -> float:
    small, large = make(n), make(10 * n)
    run(small)  # warm caches
    return _best(lambda: run(large), 3) / max(_best(lambda: run(small), 5), 1e-6)


@pytest.mark.parametrize("case", sorted(CASES))
def test_parser_is_linear(case: str) -> None:
    n = 1_000 if case == "stripped_markup" else 4_000
    ratio = _ratio(CASES[case], PATHS["parse"], n)
    assert ratio < BOUND, f"{case}: 10x the tokens took {ratio:.0f}x the time"


def _stream(toks: list[int]) -> None:
    p = hk.StreamableParser(ENC, hk.Role.ASSISTANT, strict=False)
    for t in toks:
        p.process(t)
    p.process_eos()


@pytest.mark.parametrize("case", ["body", "header_never_ends", "many_to_words", "control_tokens_in_body"])
def test_stream_is_linear(case: str) -> None:
    assert _ratio(CASES[case], _stream, 5_000) < BOUND


ANSWER = lambda n: header([CHANNEL], FINAL, [MESSAGE], [WORD] * n, [RETURN])  # noqa: E731
ARGUMENTS = lambda n: header([CHANNEL], COMMENTARY, TO_F, [MESSAGE], ENC.encode('{"a": "'),  # noqa: E731
                             [WORD] * n, ENC.encode('"}'), [CALL])
REQUEST = {"tools": [{"type": "function", "function": {"name": "f"}}]}


def _chat_stream(toks: list[int]) -> None:
    stream = ChatCompletionStream(ENC, request=REQUEST, prompt_tokens=0)
    for i in range(0, len(toks), 4):
        stream.feed(toks[i : i + 4])
    stream.close()


@pytest.mark.parametrize(("path", "run"), [
    ("chat", lambda toks: completion_to_chat_choice(ENC, toks, request=REQUEST)),
    ("responses", lambda toks: completion_to_response(ENC, toks, request=REQUEST, prompt_tokens=0)),
    ("chat_stream", _chat_stream),
])
@pytest.mark.parametrize("make", [ANSWER, ARGUMENTS], ids=["answer", "arguments"])
def test_mapping_is_linear(path: str, run: Callable[[list[int]], object],
                           make: Callable[[int], list[int]]) -> None:
    ratio = _ratio(make, run, 5_000)
    assert ratio < BOUND, f"{path}: 10x the tokens took {ratio:.0f}x the time"
