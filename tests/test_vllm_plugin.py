"""harmonykit inside ``vllm serve``: vLLM's own endpoints, with the plugin and without it.

The same real vLLM (tests/real) runs twice: with this checkout's plugin (the session's
``vllm``), and with ``HARMONYKIT_VLLM=0``, which reproduces vLLM's own losses on the
same noise, so the comparison can fail. The noise is a ``logit_bias`` that makes the
tiny random model write Harmony's control tokens where they do not belong; ``logprobs``
show what it wrote.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
import types
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

import harmonykit as hk
from budget import examples
from harmonykit.tokens import CALL, CHANNEL, CONSTRAIN, END, MESSAGE, RETURN, START
from real.servers import SERVED, vllm_server
from strategies import assistant_turns

pytestmark = pytest.mark.real_engines

ENC = hk.load_harmony_encoding(hk.HarmonyEncodingName.HARMONY_GPT_OSS)
NOISE = {**{str(t): 9 for t in (CHANNEL, MESSAGE, START, CONSTRAIN, END)}, str(RETURN): 5, str(CALL): 5}
TERSE = {str(t): 12 for t in (END, RETURN, CALL, CONSTRAIN)} | {str(ENC.encode('"}')[0]): 8,
                                                                 str(ENC.encode('"')[0]): 6}
# JSON under a schema lets a random model write whitespace for ever: no whitespace tokens.
TERSE |= {str(i): -100 for i in range(199998) if not ENC.decode_bytes([i]).strip()}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
SEEDS = range(24)


@pytest.fixture(scope="module")
def vllm_without(vllm: str) -> Iterator[str]:
    with vllm_server(env={"HARMONYKIT_VLLM": "0"}) as url:
        yield url


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)


def _body(seed: int, **extra: Any) -> dict[str, Any]:
    return {"model": SERVED, "messages": [{"role": "user", "content": f"Say something {seed}."}],
            "max_tokens": 48, "seed": seed, "logprobs": True,
            "extra_body": {"logit_bias": NOISE}, **({"tools": TOOLS} if seed % 3 == 0 else {}), **extra}


def _wrote_text(logprobs: Any) -> bool:
    """Whether the model wrote any ordinary text (vLLM's chat logprobs list every output token)."""
    tokens = [e.token for e in (logprobs.content if logprobs else None) or []]
    return any(t.strip() and not (t.startswith("<|") and t.endswith("|>")) for t in tokens)


def tally(url: str, stream: bool) -> dict[str, int]:
    """Over the noise: answers with control-token text, empty answers to written text, errors."""
    out = {"leaked": 0, "empty": 0, "errors": 0}
    c = client(url)
    for seed in SEEDS:
        try:
            if stream:
                content, reasoning, calls, lps = "", "", "", []
                for ch in c.chat.completions.create(**_body(seed), stream=True):
                    for choice in ch.choices:
                        d = choice.delta
                        content += d.content or ""
                        reasoning += (d.model_extra or {}).get("reasoning") or ""
                        for tc in d.tool_calls or []:
                            calls += (tc.function.name or "") + (tc.function.arguments or "")
                        lps += (choice.logprobs.content or []) if choice.logprobs else []
                wrote = any(t.token.strip() and not t.token.startswith("<|") for t in lps)
            else:
                r = c.chat.completions.create(**_body(seed))
                m = r.choices[0].message
                content, reasoning = m.content or "", (m.model_extra or {}).get("reasoning") or ""
                calls = "".join(tc.function.name + tc.function.arguments for tc in m.tool_calls or [])
                wrote = _wrote_text(r.choices[0].logprobs)
        except openai.APIError:
            out["errors"] += 1
            continue
        out["leaked"] += "<|" in content + reasoning + calls
        out["empty"] += wrote and not (content or reasoning or calls)
    return out


@pytest.mark.parametrize("stream", [False, True])
def test_vllms_own_chat_endpoint_loses_nothing_with_the_plugin(vllm: str, vllm_without: str,
                                                              stream: bool) -> None:
    with_plugin, without = tally(vllm, stream), tally(vllm_without, stream)
    print(f"\nstream={stream}: with the plugin {with_plugin}, without {without}")
    assert with_plugin == {"leaked": 0, "empty": 0, "errors": 0}
    assert without["leaked"] + without["empty"] + without["errors"] > 0  # vLLM's own parser loses output


@pytest.mark.parametrize("stream", [False, True])
def test_responses_endpoint_with_the_plugin(vllm: str, stream: bool) -> None:
    c = client(vllm)
    for seed in range(8):
        kw: dict[str, Any] = {"model": SERVED, "input": f"Say something {seed}.", "max_output_tokens": 48,
                              "extra_body": {"seed": seed, "logit_bias": NOISE}}
        if seed % 2:
            kw["tools"] = [{"type": "function", "name": "get_weather", "parameters": TOOLS[0]["function"]["parameters"]}]
        if stream:
            events = list(c.responses.create(**kw, stream=True))
            text = json.dumps([e.model_dump() for e in events])
        else:
            text = json.dumps(c.responses.create(**kw).model_dump())
        assert "<|" not in text


@examples(300, suppress_health_check=[HealthCheck.too_slow])
@given(assistant_turns(), st.booleans())
def test_well_formed_output_reads_as_without_the_plugin(messages: list[hk.Message], returned: bool) -> None:
    """On well-formed output vLLM reads exactly what it reads without the plugin: token by token
    (channel, recipient, delta: what its streaming uses) and the messages (what the rest uses).

    vLLM's own structural tags do not make the tiny random model write well-formed Harmony (they
    admit ``final json``, which vLLM's parser then rejects, and let go after the answer), so this
    compares the two parsers vLLM would call, on well-formed turns, in process."""
    import openai_harmony as ref

    from harmonykit.vllm_plugin import VLLMParser

    tokens = ENC.render_conversation(hk.Conversation.from_messages(messages))[2:]
    if returned and messages[-1].channel == "final":
        tokens[-1] = RETURN
    theirs = ref.StreamableParser(_reference(), role=ref.Role.ASSISTANT)
    ours = VLLMParser(ENC)
    for t in tokens:
        theirs.process(t)
        ours.process(t)
        face = (ours.current_channel, ours.current_recipient, ours.last_content_delta or "")
        assert face == (theirs.current_channel, vllm_recipient(theirs.current_recipient),
                        theirs.last_content_delta or "")
        assert len(ours.messages) == len(theirs.messages)
    theirs.process_eos()
    ours.process_eos()

    def read(m: Any) -> dict[str, Any]:  # as vLLM reads a message
        d = m.to_dict()
        return {"role": d["role"], "channel": d.get("channel"), "recipient": vllm_recipient(d.get("recipient")),
                "text": "".join(c.get("text", "") for c in d["content"])}
    assert [read(m) for m in ours.messages] == [read(m) for m in theirs.messages]
    assert ours.tail == []


@functools.cache
def _reference() -> Any:
    import openai_harmony as ref

    return ref.load_harmony_encoding(ref.HarmonyEncodingName.HARMONY_GPT_OSS)


def vllm_recipient(recipient: str | None) -> str | None:
    """vLLM's ``HarmonyParser._normalize_recipient``: the reference reads a content type written
    without a recipient as the recipient; vLLM cuts it off."""
    if recipient is None or "<|constrain|>" not in recipient:
        return recipient
    return recipient[: recipient.find("<|constrain|>")].rstrip() or None


def test_an_unsupported_version_warns_and_changes_nothing(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    from harmonykit import vllm_plugin

    original = object()

    class HarmonyParser:
        def flush(self) -> list[Any]:
            return []

    harmony = types.SimpleNamespace(get_streamable_parser_for_assistant=original, HarmonyParser=HarmonyParser,
                                    Segment=tuple)
    fake = types.ModuleType("vllm")
    fake.__version__ = "0.31.1"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.parser", types.SimpleNamespace(harmony=harmony))  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "vllm.parser.harmony", harmony)  # type: ignore[arg-type]
    monkeypatch.delenv("HARMONYKIT_VLLM", raising=False)
    with caplog.at_level(logging.INFO, "vllm.harmonykit"):
        vllm_plugin.register()
    assert harmony.get_streamable_parser_for_assistant is original
    assert [r.levelname for r in caplog.records] == ["WARNING"] and "0.31.1" in caplog.text
    fake.__version__ = "0.32.0"  # type: ignore[attr-defined]
    monkeypatch.setenv("HARMONYKIT_VLLM", "0")
    vllm_plugin.register()
    assert harmony.get_streamable_parser_for_assistant is original
    monkeypatch.delenv("HARMONYKIT_VLLM")
    vllm_plugin.register()
    assert harmony.get_streamable_parser_for_assistant is vllm_plugin.tolerant_parser_for_assistant
