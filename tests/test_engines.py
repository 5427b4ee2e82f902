"""Engine profiles as data: recognition, the request each engine gets, and what its answers mean
(the shapes seen from a real vLLM 0.32 and llama.cpp server; SGLang's from its source)."""

from __future__ import annotations

from typing import Any

import pytest

import harmonykit as hk
from harmonykit.openai.errors import RequestError
from harmonykit.server.engines import PROFILES, Job, ModelInfo, profile_of, vllm_guided_problem
from harmonykit.server.upstream import ContextExceeded, Engine, Upstream
from harmonykit.tokens import CALL, RETURN

ENC = hk.load_harmony_encoding(hk.HarmonyEncodingName.HARMONY_GPT_OSS)


@pytest.mark.parametrize(("models", "version", "name"), [
    ({"data": [{"id": "m", "owned_by": "vllm", "max_model_len": 1024}]}, None, "vllm"),
    ({"data": [{"id": "m", "owned_by": "sglang"}]}, None, "sglang"),
    ({"data": [{"id": "/m.gguf", "owned_by": "llamacpp", "meta": {"n_ctx": 512}}]}, None, "llamacpp"),
    ({"data": [{"id": "m"}]}, {"version": "0.32.0"}, "vllm"),
])
def test_recognised(models: dict[str, Any], version: dict[str, Any] | None, name: str) -> None:
    assert profile_of(models, version).name == name


@pytest.mark.parametrize(("name", "choice", "ids", "finish"), [
    # vLLM: an EOS of the generation config stays in token_ids, stop_reason null
    ("vllm", {"token_ids": [1, RETURN], "finish_reason": "stop", "stop_reason": None}, [1, RETURN], "stop"),
    # vLLM: a stop_token_ids hit, named and kept
    ("vllm", {"token_ids": [1, CALL], "finish_reason": "stop", "stop_reason": CALL}, [1, CALL], "stop"),
    # an engine that leaves the named stop token out
    ("vllm", {"token_ids": [1], "finish_reason": "stop", "stop_reason": CALL}, [1, CALL], "stop"),
    ("sglang", {"token_ids": [1, RETURN], "finish_reason": "stop", "matched_stop": RETURN}, [1, RETURN], "stop"),
    ("vllm", {"token_ids": [1, 2], "finish_reason": "length"}, [1, 2], "length"),
    ("llamacpp", {"tokens": [5, CALL], "stop": True, "stop_type": "eos", "tokens_predicted": 2}, [5, CALL], "stop"),
    ("llamacpp", {"tokens": [5], "stop": True, "stop_type": "limit"}, [5], "length"),
    ("llamacpp", {"tokens": [5], "stop": False}, [5], None),
])
def test_reads(name: str, choice: dict[str, Any], ids: list[int], finish: str | None) -> None:
    piece = PROFILES[name].read(choice, ENC, None)
    assert (piece.ids, piece.finish_reason) == (ids, finish)


def test_llama_request_and_logprobs() -> None:
    body = PROFILES["llamacpp"].body(Job([1, 2], {"temperature": 0.5, "repetition_penalty": 1.1,
                                                  "logit_bias": {"7": 3.0}, "stop": ["x"]}, 9, 2), "m", True)
    assert body == {"prompt": [1, 2], "n_predict": 9, "stream": True, "return_tokens": True, "cache_prompt": True,
                    "temperature": 0.5, "repeat_penalty": 1.1, "stop": ["x"], "logit_bias": [[7, 3.0]], "n_probs": 2}
    event = {"tokens": [13], "stop": False, "completion_probabilities": [
        {"id": 13, "logprob": -1.5, "top_logprobs": [{"id": 13, "logprob": -1.5}, {"id": 14, "logprob": -2.0},
                                                     {"id": 15, "logprob": -3.0}]}]}
    entry = PROFILES["llamacpp"].read(event, ENC, 2).logprobs[0]
    assert entry["token"] == ENC.decode([13]) and entry["logprob"] == -1.5 and len(entry["top_logprobs"]) == 2


def test_vllm_refuses_first_what_vllm_would() -> None:
    for field, value in (("seed", 2**63), ("top_p", 0), ("repetition_penalty", 0)):
        with pytest.raises(RequestError) as e:
            PROFILES["vllm"].check(Job([1], {field: value}))
        assert e.value.param == field
    assert vllm_guided_problem("0.10.2") and not vllm_guided_problem("0.11.0")


def test_limit_and_model_name() -> None:
    up = Upstream(("http://127.0.0.1:1",), timeout=1, max_tokens_default=77)
    engine = Engine("http://127.0.0.1:1", info=ModelInfo(("served",), 100))
    assert up.limit(engine, Job([0] * 10, {})).max_tokens == 90  # the room the context leaves
    assert up.limit(engine, Job([0] * 10, {}, 5)).max_tokens == 5  # the client's
    with pytest.raises(ContextExceeded):
        up.limit(engine, Job([0] * 100, {}))
    assert up.limit(Engine("u", info=ModelInfo(("a",), None)), Job([0], {})).max_tokens == 77
    assert up.served_model(engine, "gpt-4o") == "served" and up.served_model(engine, "served") == "served"
    forced = Upstream(("http://127.0.0.1:1",), timeout=1, model="pinned")
    assert forced.served_model(engine, "served") == "pinned"
