"""One state machine: token by token, in random runs, or all at once, the result is the same."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import harmonykit as hk
from harmonykit.parse.result import ParseResult
from test_parse_differential import _ENC, mutated

SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def one_by_one(tokens: list[int], role: hk.Role | None, tools: list[str] | None = None) -> ParseResult:
    p = hk.StreamableParser(_ENC, role, strict=False, tools=tools)
    for t in tokens:
        p.process(t)
    p.process_eos()
    return p.result()


def in_runs(tokens: list[int], role: hk.Role | None, cuts: list[int]) -> ParseResult:
    m = _ENC._machine(role, strict=False)
    pos = 0
    for cut in sorted(set(cuts)) + [len(tokens)]:
        chunk = tokens[pos:cut]
        # A chunk's text tokens go in as one run, the rest one by one.
        run: list[int] = []
        for t in chunk:
            if 0 <= t < 199998:
                run.append(t)
                continue
            m.feed_text(run)
            run = []
            m.feed(t)
        m.feed_text(run)
        pos = max(pos, cut)
    m.end()
    return m.result()


@SETTINGS
@given(mutated(_ENC), st.lists(st.integers(min_value=0, max_value=200), max_size=6))
def test_same_result_however_tokens_arrive(case: tuple[list[int], hk.Role | None], cuts: list[int]) -> None:
    tokens, role = case
    batch = _ENC.parse_completion(tokens, role)
    assert one_by_one(tokens, role) == batch
    assert in_runs(tokens, role, [c for c in cuts if c <= len(tokens)]) == batch


@SETTINGS
@given(mutated(_ENC))
def test_deltas_are_never_taken_back(case: tuple[list[int], hk.Role | None]) -> None:
    tokens, role = case
    p = hk.StreamableParser(_ENC, role, strict=False)
    shown: list[str] = []  # what a client has printed of the current message
    for t in tokens:
        before = len(p.messages)
        p.process(t)
        if len(p.messages) > before:
            # Messages completed by this token start with everything already shown.
            done = p.messages[before].content[0].text if shown else None
            if done is not None and p.messages[before].channel is not None:
                assert done.startswith("".join(shown))
            shown = []
        if p.last_content_delta is not None:
            shown.append(p.last_content_delta)
            assert p.current_content.endswith(p.last_content_delta)
            assert p.current_content == "".join(shown)


def test_strict_batch_and_stream_agree_on_valid_output(enc: hk.HarmonyEncoding) -> None:
    text = ("<|channel|>analysis<|message|>Think 😊.<|end|><|start|>assistant<|channel|>commentary "
            "to=functions.f <|constrain|>json<|message|>{}<|call|>")
    tokens = enc.encode(text, allowed_special="all")
    p = hk.StreamableParser(enc, hk.Role.ASSISTANT)
    for t in tokens:
        p.process(t)
    p.process_eos()
    assert p.messages == enc.parse_messages_from_completion_tokens(tokens, hk.Role.ASSISTANT)
    assert p.result() == enc.parse_completion(tokens, strict=True)


def test_messages_view_is_rebuilt_only_on_change(enc: hk.HarmonyEncoding) -> None:
    p = hk.StreamableParser(enc, hk.Role.ASSISTANT)
    for t in enc.encode("<|channel|>final<|message|>hello there", allowed_special="all"):
        p.process(t)
    first = p.messages
    assert p.messages is first
    p.process(200007)
    assert p.messages is not first and len(p.messages) == 1
