"""OutputEnd: stop strings cut on ids (never reach the parser), the stop token put back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import harmonykit as hk
from budget import examples
from harmonykit.openai.stops import OutputEnd
from harmonykit.tokens import CALL, RETURN

ENC = hk.load_harmony_encoding(hk.HarmonyEncodingName.HARMONY_GPT_OSS)


def run(text: str, stops: list[str], *, one_by_one: bool = False, ended: bool = True) -> tuple[str, bool]:
    ids = ENC.encode(text, allowed_special="all")
    end = OutputEnd(ENC, stops)
    out: list[int] = []
    for chunk in ([[t] for t in ids] if one_by_one else [ids]):
        out += end.feed(chunk)[0]
    out += end.finish(ended)[0]
    return ENC.decode(out), end.stopped


@pytest.mark.parametrize(("text", "stops", "want"), [
    ("<|channel|>final<|message|>Hi ### there<|return|>", ["###"], "<|channel|>final<|message|>Hi <|return|>"),
    ("<|channel|>final<|message|>abcdef<|return|>", ["cd", "bcx"], "<|channel|>final<|message|>ab<|return|>"),
    ("<|channel|>final<|message|>no stop here<|return|>", ["zzz"], "<|channel|>final<|message|>no stop here<|return|>"),
    ("<|channel|>final<|message|>ends with a partial #", ["##"], "<|channel|>final<|message|>ends with a partial #<|return|>"),
    ("<|channel|>commentary to=functions.f<|message|>{\"a\": 1}", [], "<|channel|>commentary to=functions.f<|message|>{\"a\": 1}<|call|>"),
    (" to=functions.f<|channel|>commentary<|message|>{}", [], " to=functions.f<|channel|>commentary<|message|>{}<|call|>"),
    ("<|channel|>final<|message|>héllo wörld", ["ö"], "<|channel|>final<|message|>héllo w<|return|>"),
])
def test_cuts_and_restores(text: str, stops: list[str], want: str) -> None:
    assert run(text, stops)[0] == want
    assert run(text, stops, one_by_one=True)[0] == want


def test_a_cut_off_output_gets_no_stop_token() -> None:
    assert run("<|channel|>final<|message|>Hi", [], ended=False)[0] == "<|channel|>final<|message|>Hi"


def test_the_engines_stop_token_is_kept_not_doubled() -> None:
    ids = ENC.encode("<|channel|>final<|message|>Hi<|call|>", allowed_special="all")
    end = OutputEnd(ENC)
    out = end.feed(ids)[0] + end.finish(True)[0]
    assert out == ids and out.count(CALL) == 1 and RETURN not in out


@examples(300)
@given(st.text(st.sampled_from("ab #\n\u00e9\u4e2d"), max_size=40),
       st.lists(st.text(st.sampled_from("ab #\u00e9"), min_size=1, max_size=3), max_size=3),
       st.booleans())
def test_no_stop_string_ever_passes_and_chunking_changes_nothing(body: str, stops: list[str], ended: bool) -> None:
    # Stop strings match the raw output, markup included, as engines match them: a body alone here.
    text = body
    whole, stopped = run(text, stops, ended=ended)
    assert whole == run(text, stops, one_by_one=True, ended=ended)[0]
    shown = whole.removesuffix("<|return|>")
    assert not any(s in shown for s in stops)
    assert stopped == any(s in body for s in stops)
    if not stopped:
        assert shown == body
