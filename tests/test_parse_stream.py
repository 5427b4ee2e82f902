"""One state machine: token by token, in random runs, or all at once, the result is the same."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

import harmonykit as hk
from budget import examples
from harmonykit.parse.result import ParseResult
from test_parse_differential import _ENC, mutated

SETTINGS = examples(300, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def one_by_one(tokens: list[int], role: hk.Role | None, tools: list[str] | None = None) -> ParseResult:
    p = hk.StreamableParser(_ENC, role, strict=False, tools=tools)
    for t in tokens:
        p.process(t)
    p.process_eos()
    return p.result()


def in_runs(tokens: list[int], role: hk.Role | None, cuts: list[int]) -> ParseResult:
    m = _ENC.machine(role, strict=False)
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
            if shown:
                assert p.messages[before].content[0].text.startswith("".join(shown))  # type: ignore[union-attr]
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


_PIECES = ["<|start|>assistant", "<|channel|>", "analysis", "final", "commentary", " to=functions.get_weather",
           " to=browser.open", " code", " <|constrain|>json", "<|message|>", "<|end|>", "<|return|>",
           "<|call|>", "{\"a\": 1}", " to", "\n", " ", "finalThe", "assistantfinal", "analysisWe"]


@st.composite
def long_headers(draw: st.DrawFn) -> list[int]:
    """Outputs whose headers run past HEADER_LIMIT tokens: prose, with header pieces around it."""
    text = ""
    for _ in range(draw(st.integers(1, 4))):
        text += "".join(draw(st.lists(st.sampled_from(_PIECES), max_size=4)))
        words = draw(st.integers(0, 90))
        text += "".join(f" w{i % 7}" for i in range(words))
    return _ENC.encode(text, allowed_special="all")


@SETTINGS
@given(long_headers(), st.sampled_from([hk.Role.ASSISTANT, None]),
       st.lists(st.integers(min_value=0, max_value=400), max_size=6))
def test_long_headers_same_result_however_tokens_arrive(tokens: list[int], role: hk.Role | None,
                                                        cuts: list[int]) -> None:
    batch = _ENC.parse_completion(tokens, role)
    assert one_by_one(tokens, role) == batch
    assert in_runs(tokens, role, [c for c in cuts if c <= len(tokens)]) == batch
    covered = sorted(batch.spans + batch.skipped)  # every token accounted for, once
    pos = 0
    for start, end in covered:
        assert start == pos
        pos = end
    assert pos == len(tokens)


@SETTINGS
@given(long_headers(), st.sampled_from([hk.Role.ASSISTANT, None]))
def test_long_headers_deltas_are_never_taken_back(tokens: list[int], role: hk.Role | None) -> None:
    p = hk.StreamableParser(_ENC, role, strict=False)
    shown: list[str] = []
    for t in tokens:
        before = len(p.messages)
        p.process(t)
        if len(p.messages) > before:
            if shown:
                assert p.messages[before].content[0].text.startswith("".join(shown))  # type: ignore[union-attr]
            shown = []
        if p.last_content_delta is not None:
            shown.append(p.last_content_delta)
            assert p.current_content == "".join(shown)


def shown_and_kept(tokens: list[int], role: hk.Role | None) -> list[tuple[str, str]]:
    """Each message's streamed text (the deltas joined) beside the text it was kept with."""
    p = hk.StreamableParser(_ENC, role, strict=False)
    out, shown = [], ""
    for t in tokens:
        before = len(p.messages)
        p.process(t)
        out += [(shown, m.content[0].text) for m in p.messages[before:]]  # type: ignore[union-attr]
        shown = "" if len(p.messages) > before else shown
        shown += p.last_content_delta or ""
    return out


# Found by hypothesis (test_long_headers_deltas_are_never_taken_back) on a clean clone: a header
# read as a body past HEADER_LIMIT streamed a "\n", which then went to the next header when
# " to=functions.get_weather<|message|>" made the text before it a message of its own.
_WORDS = [286, 15, 286, 16, 286, 17, 286, 18, 286, 19, 286, 20, 286, 21]  # " w0 w1 ... w6"


@pytest.mark.parametrize(("tail", "messages"), [
    ([198, 316, 28, 44580, 775, 170154, 200008], [(None, "w3"), ("functions.get_weather", "")]),
    ([198, 198, 220, 316, 28, 44580, 775, 170154, 200008], [(None, "w3"), ("functions.get_weather", "")]),
    ([558, 316, 28, 44580, 775, 170154, 200008], [(None, "w3."), ("functions.get_weather", "")]),  # ".\n": one token
    ([558, 198, 316, 28, 44580, 775, 170154, 200008], [(None, "w3."), ("functions.get_weather", "")]),
    # " to" held as maybe a recipient, then ".\n": " to." shown, the newline held still
    ([316, 558, 316, 28, 44580, 775, 170154, 200008], [(None, "w3 to."), ("functions.get_weather", "")]),
    ([198, 286, 15, 200007], [(None, "w3\n w0")]),  # white space held, then shown with what follows
    ([558, 286, 15, 200007], [(None, "w3.\n w0")]),
    ([198, 200002], [(None, "w3\n")]),  # and kept at the end, never dropped
], ids=["newline-then-recipient", "blank-run-then-recipient", "stop-newline-then-recipient",
        "stop-newline-newline-then-recipient", "to-then-stop-newline-then-recipient", "newline-then-words", "stop-newline-then-words", "newline-at-end"])
def test_a_loose_body_never_shows_what_a_header_takes_back(tail: list[int],
                                                             messages: list[tuple[str | None, str]]) -> None:
    tokens = _WORDS * 4 + [286, 15, 286, 16, 286, 17, 286, 18] + tail
    pairs = shown_and_kept(tokens, hk.Role.ASSISTANT)
    for shown, kept in pairs:
        assert kept.startswith(shown), (shown[-20:], kept[-20:])
    result = _ENC.parse_completion(tokens, hk.Role.ASSISTANT)
    assert len(result.messages) == len(messages)
    assert [(m.recipient, m.content[0].text[-len(end):] if end else m.content[0].text)  # type: ignore[union-attr]
            for m, (_, end) in zip(result.messages, messages, strict=True)] == messages
    assert one_by_one(tokens, hk.Role.ASSISTANT) == result


def test_a_long_header_is_a_body_from_the_bound_on() -> None:
    from harmonykit.parse.machine import HEADER_LIMIT

    tokens = _ENC.encode("".join(f" word{i}." for i in range(200)) + "<|return|>", allowed_special="all")
    p = hk.StreamableParser(_ENC, hk.Role.ASSISTANT, strict=False)
    shown_at = None
    for index, t in enumerate(tokens):
        p.process(t)
        if p.current_content:
            shown_at = index
            break
    assert shown_at == HEADER_LIMIT - 1 and p.current_content.startswith("word0. word1.")
    # text that may still be a recipient, should <|message|> follow, is held back
    p = hk.StreamableParser(_ENC, hk.Role.ASSISTANT, strict=False)
    for t in _ENC.encode("<|channel|>analysis" + "".join(f" word{i}." for i in range(60)) + " Let's open to=browser.open code",
                         allowed_special="all"):
        p.process(t)
    assert p.current_content.endswith("Let's open") and p.current_channel == "analysis"
    for t in _ENC.encode("<|message|>{}<|call|>", allowed_special="all"):
        p.process(t)
    assert [(m.channel, m.recipient) for m in p.messages] == [("analysis", None), ("analysis", "browser.open")]
    assert p.messages[0].content[0].text.endswith("Let's open")  # type: ignore[union-attr]
