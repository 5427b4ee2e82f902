"""Guided decoding: the grammar admits well-formed turns, refuses malformed ones, and sampling
under its mask always yields output both parsers accept, with valid calls."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

import harmonykit as hk
from budget import examples
from harmonykit.grammar import GrammarError, HarmonyMatcher, harmony_grammar
from harmonykit.grammar.matcher import MASK_SIZE
from harmonykit.openai import RequestError
from test_parse_tolerant import WILD

ENC = hk.load_harmony_encoding(hk.HarmonyEncodingName.HARMONY_GPT_OSS)
START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL = 200006, 200007, 200008, 200005, 200003, 200002, 200012

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
           "required": ["city"], "additionalProperties": False}
FLAGS = {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"],
         "additionalProperties": False}
TOOLSETS = {
    "one": [("get_weather", WEATHER)],
    "spaced": [("Get Weather", WEATHER), ("github.toggle", FLAGS)],
    "three": [("get_weather", WEATHER), ("toggle", FLAGS), ("noop", {"type": "object", "properties": {},
                                                                     "additionalProperties": False})],
}


def request(tools: list[tuple[str, dict[str, Any]]], choice: Any = "auto", **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "hi"}], "tool_choice": choice,
            "tools": [{"type": "function", "function": {"name": n, "parameters": p}} for n, p in tools], **extra}


def run(matcher: HarmonyMatcher, text: str) -> bool:
    """Whether the whole text is accepted as one complete turn."""
    return all(matcher.consume(t) for t in ENC.encode(text, allowed_special="all")) and matcher.is_complete()


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20).filter(lambda s: "<|" not in s)
# llguidance's JSON lexer wants control characters escaped, U+007F-U+009F too (JSON allows them raw)
_json_text = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=20).filter(lambda s: "<|" not in s)


@st.composite
def turns(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    """A request with tools and a well-formed turn for it, as gpt-oss writes them."""
    tools = draw(st.sampled_from(sorted(TOOLSETS)))
    req = request(TOOLSETS[tools])
    parts = []
    if draw(st.booleans()):
        parts.append(f"<|channel|>analysis<|message|>{draw(_text)}<|end|>")
    if draw(st.booleans()):
        parts.append(f"<|channel|>commentary<|message|>{draw(_text)}<|end|>")
    ctype = draw(st.sampled_from(["", " <|constrain|>json"]))
    if draw(st.booleans()):
        parts.append(f"<|channel|>final<|message|>{draw(_text)}<|return|>")
    else:
        name, schema = draw(st.sampled_from(TOOLSETS[tools]))
        args = {"city": draw(_json_text), "days": draw(st.integers(0, 9))} if schema is WEATHER else \
            {"on": draw(st.booleans())} if schema is FLAGS else {}
        body = json.dumps(args, separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])), ensure_ascii=False)
        to = "to=functions." + name.replace(" ", "_").replace(".", "_")
        if draw(st.booleans()):
            parts.append(f"<|channel|>commentary {to}{ctype}<|message|>{body}<|call|>")
        else:  # the recipient before the channel, after the role
            parts.append(f" {to}<|channel|>commentary{ctype}<|message|>{body}<|call|>")
    return req, "<|start|>assistant".join(parts)


@examples(150, suppress_health_check=[HealthCheck.too_slow])
@given(turns())
def test_accepts_every_well_formed_turn(case: tuple[dict[str, Any], str]) -> None:
    req, text = case
    assert run(HarmonyMatcher(ENC, req), text), text


def test_admits_only_what_the_mapping_reads_with_no_repair() -> None:
    """A bare " json" content type can read as a recipient, and a preamble lands in content in
    front of a response format's JSON: the grammar admits neither."""
    req = request([("f", {"type": "object"})])
    assert not run(HarmonyMatcher(ENC, req), "<|channel|>commentary to=functions.f json<|message|>{}<|call|>")
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
    with_format = {"messages": [{"role": "user", "content": "hi"}], "response_format": fmt}
    assert run(HarmonyMatcher(ENC, with_format), "<|channel|>final <|constrain|>json<|message|>{}<|return|>")
    assert not run(HarmonyMatcher(ENC, with_format), "<|channel|>final json<|message|>{}<|return|>")
    assert not run(HarmonyMatcher(ENC, with_format), "<|channel|>commentary<|message|>Sure.<|end|><|start|>assistant"
                                                      "<|channel|>final <|constrain|>json<|message|>{}<|return|>")


@pytest.mark.parametrize("case", WILD, ids=[c["id"] for c in WILD])
def test_refuses_the_malformed_wild_outputs(case: dict[str, Any]) -> None:
    """Malformed (the tolerant parser repairs it, or it was cut off): refused. A case whose
    bug was the engine's, not the model's (wild-024), is well-formed: accepted."""
    tools = [(t["function"]["name"], t["function"].get("parameters") or {"type": "object"})
             for t in case.get("request", {}).get("tools", [])]
    assert run(HarmonyMatcher(ENC, request(tools)), case["text"]) is not _malformed(case)


def _malformed(case: dict[str, Any]) -> bool:
    """Repaired by the parser, cut off, or a call the request does not allow: to an undeclared
    tool, with a content type other than JSON, or arguments that break the tool's schema."""
    tools = {t["function"]["name"]: t["function"].get("parameters") or {"type": "object"}
             for t in case.get("request", {}).get("tools", [])}
    parsed = ENC.parse_completion(ENC.encode(case["text"], allowed_special="all"), tools=list(tools))
    if parsed.repairs or not parsed.complete or parsed.stop not in ("return", "call"):
        return True
    for m in parsed.messages:
        if m.recipient is None:
            continue
        name = m.recipient.removeprefix("functions.")
        if name not in tools or m.content_type not in (None, "json", "<|constrain|>json"):
            return True
        try:
            jsonschema.validate(json.loads(m.content[0].text), tools[name])  # type: ignore[union-attr]
        except (ValueError, jsonschema.ValidationError):
            return True
    return False


def test_the_wild_cases_are_mostly_malformed() -> None:
    assert sum(map(_malformed, WILD)) >= len(WILD) - 2  # else the test above proves little


def test_text_never_holds_a_control_token() -> None:
    m = HarmonyMatcher(ENC, request([]))
    for t in ENC.encode("<|channel|>analysis<|message|>Thinking", allowed_special="all"):
        assert m.consume(t)
    mask = m.allowed_mask()
    assert mask.shape == (MASK_SIZE,) and mask.dtype == np.bool_
    assert mask[END] and mask[ENC.encode(" more")[0]]
    assert not any(mask[t] for t in (START, CHANNEL, MESSAGE, CONSTRAIN, RETURN, CALL, 200014, 199999))
    assert not m.consume(START) and m.consume(END)  # a refused token changes nothing


@pytest.mark.parametrize(("choice", "final", "calls"), [
    ("auto", True, {"get_weather", "toggle", "noop"}),
    ("required", False, {"get_weather", "toggle", "noop"}),
    ("none", True, set()),
    ({"type": "function", "function": {"name": "toggle"}}, False, {"toggle"}),
])
def test_tool_choice(choice: Any, final: bool, calls: set[str]) -> None:
    req = request(TOOLSETS["three"], choice)
    assert run(HarmonyMatcher(ENC, req), "<|channel|>final<|message|>ok<|return|>") is final
    for name, body in (("get_weather", '{"city":"x"}'), ("toggle", '{"on":true}'), ("noop", "{}")):
        text = f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{body}<|call|>"
        assert run(HarmonyMatcher(ENC, req), text) is (name in calls), (choice, name)


def test_response_format_holds_the_answer() -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
              "additionalProperties": False}
    req = {"messages": [], "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}}
    assert run(HarmonyMatcher(ENC, req), '<|channel|>final<|message|>{"answer": 4}<|return|>')
    assert run(HarmonyMatcher(ENC, req), '<|channel|>final <|constrain|>json<|message|>{"answer":4}<|return|>')
    assert not run(HarmonyMatcher(ENC, req), '<|channel|>final<|message|>{"answer": "four"}<|return|>')
    responses = {"input": "x", "text": {"format": {"type": "json_schema", "name": "a", "schema": schema}}}
    assert run(HarmonyMatcher(ENC, responses), '<|channel|>final<|message|>{"answer": 1}<|return|>')


def test_bad_requests() -> None:
    with pytest.raises(RequestError) as info:
        harmony_grammar(request([("f", {"type": "object", "properties": []})]))
    assert info.value.param == "tools[0].function.parameters.properties"
    with pytest.raises(RequestError):
        harmony_grammar(request([], "required"))
    with pytest.raises(RequestError):
        harmony_grammar(request([("f", WEATHER)], {"type": "function", "function": {"name": "g"}}))
    with pytest.raises(GrammarError):  # valid JSON Schema llguidance cannot compile
        HarmonyMatcher(ENC, request([("f", {"type": "string", "pattern": "(?<=a)b"})]))
    with pytest.raises(TypeError):
        HarmonyMatcher(None, request([]))  # type: ignore[arg-type]


def test_rollback() -> None:
    m = HarmonyMatcher(ENC, request(TOOLSETS["one"]))
    ids = ENC.encode("<|channel|>final<|message|>Hi<|return|>", allowed_special="all")
    for t in ids:
        assert m.consume(t)
    m.rollback(2)
    assert not m.is_complete() and m.consume(ids[-2]) and m.consume(ids[-1]) and m.is_complete()


# -- sampling under the mask -----------------------------------------------------------

_BIASED = sorted({END, RETURN, CALL, START, CHANNEL, MESSAGE, CONSTRAIN}
                 | {ENC.encode(s)[0] for s in ['"', '"}', "}", ",", "0", "1", " true", "false", "{", '{"', "json"]})


def sample(matcher: HarmonyMatcher, rng: np.random.Generator, max_steps: int = 64) -> list[int] | None:
    """Sampling with random logits under the mask: each step an allowed token at random (the
    argmax of i.i.d. random logits over the allowed ids), nudged half the time towards a
    closing token so that turns end."""
    out: list[int] = []
    for _ in range(max_steps):
        mask = matcher.allowed_mask()
        nudge = [t for t in _BIASED if mask[t]] if rng.random() < 0.5 else []
        allowed = nudge or np.flatnonzero(mask)
        token = int(allowed[rng.integers(len(allowed))])
        assert mask[token] and matcher.consume(token)
        out.append(token)
        if matcher.is_complete():
            return out
    return None


@pytest.mark.parametrize("tools", sorted(TOOLSETS))
@pytest.mark.parametrize("choice", ["auto", "required", "none", "named"])
def test_sampled_completions_parse_and_call_only_allowed_tools(tools: str, choice: str, ref: Any) -> None:
    toolset = TOOLSETS[tools]
    tool_choice: Any = {"type": "function", "function": {"name": toolset[-1][0]}} if choice == "named" else choice
    req = request(toolset, tool_choice)
    allowed = {n.replace(" ", "_").replace(".", "_"): s for n, s in toolset}
    if choice == "named":
        allowed = {toolset[-1][0].replace(" ", "_").replace(".", "_"): toolset[-1][1]}
    rng = np.random.default_rng(sorted(TOOLSETS).index(tools) * 10 + ["auto", "required", "none", "named"]
                                .index(choice))
    ended = 0
    for _ in range(400):  # bounded; 12 combinations x 20 = 240 completions that ended
        if ended == 20:
            break
        tokens = sample(HarmonyMatcher(ENC, req), rng)
        if tokens is None:
            continue
        ended += 1
        ours = ENC.parse_messages_from_completion_tokens(tokens, hk.Role.ASSISTANT, strict=True)
        import openai_harmony

        theirs = ref.parse_messages_from_completion_tokens(tokens, openai_harmony.Role.ASSISTANT, strict=True)
        assert len(theirs) == len(ours)
        calls = [m for m in ours if m.recipient]
        if choice == "none":
            assert not calls
        if choice in ("required", "named"):
            assert calls and ours[-1].recipient
        for m in calls:
            assert m.recipient.startswith("functions.") and m.recipient[10:] in allowed, m.recipient
            jsonschema.validate(json.loads(m.content[0].text), allowed[m.recipient[10:]])  # type: ignore[union-attr]
    assert ended == 20


# -- the adapters ------------------------------------------------------------------------


def test_transformers_generate_stays_in_the_grammar() -> None:
    import torch  # dev dependencies: missing is a failure, not a skip
    import transformers

    from harmonykit.grammar.transformers import HarmonyLogitsProcessor

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=201088, n_embd=16, n_layer=1, n_head=1, n_positions=256)
    model = transformers.GPT2LMHeadModel(config).eval()  # random weights: random logits, no download
    req = request(TOOLSETS["one"], "required")
    prompt = hk.openai.render_chat_request(ENC, req).tokens
    proc = HarmonyLogitsProcessor(ENC, req)
    out = model.generate(input_ids=torch.tensor([prompt, prompt]), attention_mask=torch.ones(2, len(prompt)),
                         logits_processor=transformers.LogitsProcessorList([proc]), do_sample=True,
                         max_new_tokens=48, eos_token_id=[RETURN, CALL], pad_token_id=END)
    for row, matcher in zip(out.tolist(), proc.matchers, strict=True):
        generated = row[len(prompt):]
        if matcher.is_complete():
            generated = generated[: generated.index(CALL) + 1]
            messages = ENC.parse_messages_from_completion_tokens(generated, hk.Role.ASSISTANT, strict=True)
            assert messages[-1].recipient == "functions.get_weather"
        else:  # cut by max_new_tokens: every token was still allowed
            assert matcher.error is None


# A faithful minimal stand-in of vLLM's v1 logits-processor interface, for the fast suite (the real
# vLLM CPU build runs the processor too: tests/test_real_engines.py): the names, the BatchUpdate
# fields and the call order of vLLM's persistent batch (update_state, then apply; output token
# lists appended in place).
class _Direction(Enum):
    UNIDIRECTIONAL = 0
    SWAP = 1


@dataclass
class _BatchUpdate:
    batch_size: int
    removed: list[int] = field(default_factory=list)
    moved: list[tuple[int, int, _Direction]] = field(default_factory=list)
    added: list[tuple[int, Any, list[int], list[int]]] = field(default_factory=list)


@dataclass
class _SamplingParams:
    extra_args: dict[str, Any] | None = None


def test_vllm_logits_processor_against_a_standin(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    stand_in = types.ModuleType("vllm.v1.sample.logits_processor")
    stand_in.LogitsProcessor = type("LogitsProcessor", (), {})  # type: ignore[attr-defined]
    stand_in.MoveDirectionality = _Direction  # type: ignore[attr-defined]
    for name in ("vllm", "vllm.v1", "vllm.v1.sample"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.v1.sample.logits_processor", stand_in)
    monkeypatch.delitem(sys.modules, "harmonykit.grammar.vllm", raising=False)
    from harmonykit.grammar.vllm import HarmonyVLLMLogitsProcessor

    assert issubclass(HarmonyVLLMLogitsProcessor, stand_in.LogitsProcessor)  # type: ignore[attr-defined]
    proc = HarmonyVLLMLogitsProcessor(None, torch.device("cpu"), False)
    assert proc.is_argmax_invariant() is False
    req = request(TOOLSETS["one"], "required")
    out0: list[int] = []
    out1: list[int] = []
    proc.update_state(_BatchUpdate(2, added=[(0, _SamplingParams({"harmony_request": json.dumps(req)}), [1], out0),
                                             (1, _SamplingParams(None), [1], out1)]))
    rng = np.random.default_rng(3)
    for step in range(200):
        noise = rng.random((2, MASK_SIZE), dtype=np.float32)
        if rng.random() < 0.5:  # the same nudge towards closing tokens as sample()
            noise[:, _BIASED] += 2
        logits = torch.from_numpy(noise)
        masked = proc.apply(logits)
        token0, token1 = int(masked[0].argmax()), int(masked[1].argmax())
        assert torch.isfinite(masked[1]).all()  # a request without the extra argument is untouched
        out0.append(token0)
        out1.append(token1)
        if token0 in (RETURN, CALL):
            break
        if step == 5:  # vLLM condenses the batch: the rows swap places
            proc.update_state(_BatchUpdate(2, moved=[(0, 1, _Direction.SWAP)]))
            out0, out1 = out1, out0
            proc.update_state(_BatchUpdate(2, moved=[(1, 0, _Direction.SWAP)]))
            out0, out1 = out1, out0
    assert out0[-1] == CALL
    messages = ENC.parse_messages_from_completion_tokens(out0, hk.Role.ASSISTANT, strict=True)
    assert messages[-1].recipient == "functions.get_weather"
    proc.update_state(_BatchUpdate(1, removed=[0]))
    assert 0 not in proc.rows
