"""Stored responses and conversations through the gateway, for real: uvicorn on 127.0.0.1, the
real ``openai`` client, every object validated strictly against the SDK's types, on both stores
(a SQLite file and a real PostgreSQL). The engine is the scripted stand-in (tests/engine.py):
what it answers is chosen by the last user message."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.types.conversations import Conversation, ConversationDeletedResource, ConversationItemList
from openai.types.conversations.conversation_item import ConversationItem
from openai.types.responses import Response, ResponseItemList
from openai.types.responses.response_stream_event import ResponseStreamEvent
from pydantic import TypeAdapter

import harmonykit as hk
from budget import examples
from engine import Engine, serving
from harmonykit.server import Settings, create_app

MODEL = "gpt-oss-20b"
ENC = hk.load_harmony_encoding(hk.HarmonyEncodingName.HARMONY_GPT_OSS)
EVENT = TypeAdapter(ResponseStreamEvent)
ITEM = TypeAdapter(ConversationItem)
TOOLS = [{"type": "function", "name": "lookup", "description": "Look a thing up.",
          "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}]


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[Engine, str]]:
    eng = Engine(seed=3)
    with serving(eng) as url:
        yield eng, url


@pytest.fixture
def gw(engine: tuple[Engine, str], store_url: str) -> Iterator[str]:
    with serving(create_app(Settings(upstream=(engine[1],), store=store_url, upstream_timeout=60))) as url:
        yield url


def client(base: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=120)


def strict(model: Any, data: Any) -> Any:
    """An object as the SDK types it, strictly (wrong types fail, not coerced)."""
    if isinstance(model, TypeAdapter):
        return model.validate_python(data, strict=True)
    return model.model_validate(data, strict=True)


def raw(base: str, method: str, path: str, key: str = "none", **kw: Any) -> httpx.Response:
    return httpx.request(method, base + path, headers={"Authorization": f"Bearer {key}"}, timeout=120, **kw)


def wait_for(condition: Callable[[], Any]) -> None:
    """A guard of 600 looks, 50 ms apart: the loop ends when the condition holds (never a timing)."""
    for _ in range(600):
        if condition():
            return
        time.sleep(0.05)


@contextlib.contextmanager
def stopped_mid_generation(eng: Engine, start: Callable[[], Any]) -> Iterator[Any]:
    """A background response held mid-generation (the engine paused at its third chunk) for the
    block to stop (cancel, delete); on leaving, the engine's request must have been aborted."""
    eng.pause_at, eng.resume = 3, threading.Event()
    before = eng.cancelled
    try:
        bg = start()
        wait_for(lambda: eng.active)
        yield bg
        wait_for(lambda: eng.cancelled > before)
        assert eng.cancelled > before, "the engine's request was never aborted"
    finally:
        eng.resume.set()
        eng.pause_at = None


def wait_until_done(c: openai.OpenAI, rid: str) -> Any:
    """Poll as a client does (a guard of 600 polls, never a timed assertion)."""
    for _ in range(600):
        r = c.responses.retrieve(rid)
        if r.status not in ("queued", "in_progress"):
            return r
        time.sleep(0.05)
    raise AssertionError(f"{rid} never ended")


def test_previous_response_id_continues_with_the_new_requests_instructions(gw: str, engine: tuple[Engine, str]) -> None:
    eng = engine[0]
    c = client(gw)
    r1 = c.responses.create(model=MODEL, input="say:one", instructions="Old rules.")
    assert r1.output_text == "one" and r1.background is False
    r2 = c.responses.create(model=MODEL, input="say:two", previous_response_id=r1.id, instructions="New rules.")
    assert r2.output_text == "two" and r2.previous_response_id == r1.id
    prompt = ENC.decode(eng.requests[-1]["prompt"])
    assert "New rules." in prompt and "Old rules." not in prompt  # instructions never carried over
    assert prompt.index("say:one") < prompt.index("one<|end|>") < prompt.index("say:two")
    got = raw(gw, "GET", f"/v1/responses/{r2.id}").json()
    assert strict(Response, got).output_text == "two" and got == r2.model_dump(mode="json", exclude_unset=True) | got
    items = strict(ResponseItemList, raw(gw, "GET", f"/v1/responses/{r2.id}/input_items").json())
    assert [(i.type, i.role) for i in items.data] == [("message", "user")]  # its own input, not the chain's
    assert c.responses.retrieve(r1.id, include=["message.output_text.logprobs"]).id == r1.id


def test_input_items_page_by_after_limit_and_order(gw: str) -> None:
    c = client(gw)
    r = c.responses.create(model=MODEL, input=[{"role": "user", "content": f"m{i}"} for i in range(4)]
                           + [{"role": "user", "content": "say:ok"}])
    desc = [i.id for i in c.responses.input_items.list(r.id)]  # newest first, as OpenAI's default
    asc = [i.id for i in c.responses.input_items.list(r.id, order="asc")]
    assert desc == asc[::-1] and len(asc) == 5
    first = c.responses.input_items.list(r.id, order="asc", limit=2)
    assert [i.id for i in first.data] == asc[:2] and first.has_more
    assert [i.id for i in c.responses.input_items.list(r.id, order="asc", after=asc[1], limit=2).data] == asc[2:4]
    assert [i.id for i in c.responses.input_items.list(r.id, order="asc", limit=2)] == asc  # pages followed
    page = strict(ResponseItemList, raw(gw, "GET", f"/v1/responses/{r.id}/input_items?limit=2&order=asc").json())
    assert page.first_id == asc[0] and page.last_id == asc[1]
    for query, param in (("limit=0", "limit"), ("limit=101", "limit"), ("order=up", "order"), ("after=a%20b", "after"),
                         ("include=nope", "include")):
        bad = raw(gw, "GET", f"/v1/responses/{r.id}/input_items?{query}")
        assert bad.status_code == 400 and bad.json()["error"]["param"] == param, query


def test_delete_and_unknown_and_malformed_ids(gw: str) -> None:
    c = client(gw)
    r = c.responses.create(model=MODEL, input="say:bye")
    assert raw(gw, "DELETE", f"/v1/responses/{r.id}").json() == {"id": r.id, "object": "response", "deleted": True}
    for method, path in (("GET", ""), ("DELETE", ""), ("GET", "/input_items"), ("POST", "/cancel")):
        gone = raw(gw, method, f"/v1/responses/{r.id}{path}")
        assert gone.status_code == 404 and gone.json()["error"]["message"] == f"Response with id '{r.id}' not found."
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    with pytest.raises(openai.BadRequestError, match="not found"):
        c.responses.create(model=MODEL, input="say:x", previous_response_id=r.id)
    for bad in ("nope", "resp_a.b", "conv_123", "resp_" + "x" * 200):
        got = raw(gw, "GET", f"/v1/responses/{bad}")
        assert got.status_code == 400 and "Expected an ID that begins with 'resp_'" in got.json()["error"]["message"]
    assert raw(gw, "POST", "/v1/responses", json={"model": MODEL, "input": "x", "previous_response_id": 5}).status_code == 400
    assert raw(gw, "GET", "/v1/conversations/resp_1").status_code == 400
    for n in range(3):  # unknown paths are no label of their own
        assert raw(gw, "GET", f"/v1/nothing/{n}").status_code == 404
    metrics = raw(gw, "GET", "/metrics").text
    assert 'endpoint="/v1/responses/{response_id}",status="404"' in metrics
    assert "resp_" not in metrics and "/v1/nothing" not in metrics


def test_a_previous_response_still_running_is_refused(gw: str, engine: tuple[Engine, str]) -> None:
    eng = engine[0]
    c = client(gw)
    eng.pause_at, eng.resume = 1, threading.Event()
    try:
        bg = c.responses.create(model=MODEL, input="long:50", background=True)
        with pytest.raises(openai.BadRequestError, match="still"):
            c.responses.create(model=MODEL, input="say:x", previous_response_id=bg.id)
    finally:
        eng.resume.set()
        eng.pause_at = None
    assert wait_until_done(c, bg.id).status == "completed"


def test_store_false_is_not_kept_but_may_continue_a_stored_one(gw: str) -> None:
    c = client(gw)
    r1 = c.responses.create(model=MODEL, input="say:kept")
    r2 = c.responses.create(model=MODEL, input="say:not", previous_response_id=r1.id, store=False)
    assert r2.output_text == "not"
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r2.id)
    with pytest.raises(openai.BadRequestError, match="store"):
        c.responses.create(model=MODEL, input="say:x", background=True, store=False)


def test_background_is_answered_at_once_then_polled(gw: str) -> None:
    c = client(gw)
    bg = c.responses.create(model=MODEL, input="say:later", background=True)
    assert bg.status == "queued" and bg.background is True and bg.output == []
    done = wait_until_done(c, bg.id)
    assert done.status == "completed" and done.output_text == "later"
    strict(Response, raw(gw, "GET", f"/v1/responses/{bg.id}").json())


def test_a_background_stream_is_resumed_after_a_disconnect(gw: str, engine: tuple[Engine, str]) -> None:
    """The client reads a few events and leaves; generation goes on; it comes back with
    starting_after and gets exactly the rest, every event strictly an SDK event."""
    c = client(gw)
    stream = c.responses.create(model=MODEL, input="long:40", background=True, stream=True)
    seen = []
    for event in stream:
        seen.append(event)
        if len(seen) == 5:
            break
    stream.close()
    last = seen[-1].sequence_number
    rest = list(c.responses.retrieve(seen[0].response.id, stream=True, starting_after=last))
    assert [e.sequence_number for e in rest] == list(range(last + 1, last + 1 + len(rest)))
    assert rest[-1].type == "response.completed"
    text = "".join(e.delta for e in seen + rest if e.type == "response.output_text.delta")
    assert text == " word" * 40
    whole = list(c.responses.retrieve(seen[0].response.id, stream=True))
    assert [e.sequence_number for e in whole] == list(range(len(whole)))
    with httpx.stream("GET", gw + f"/v1/responses/{seen[0].response.id}?stream=true&starting_after=2",
                      headers={"Authorization": "Bearer none"}, timeout=120) as r:
        frames = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    for frame in frames:
        strict(EVENT, httpx.Response(200, content=frame).json())
    fg = c.responses.create(model=MODEL, input="say:fg")
    assert raw(gw, "GET", f"/v1/responses/{fg.id}?stream=true").status_code == 400


def test_cancel_stops_the_engine_and_keeps_what_was_made(gw: str, engine: tuple[Engine, str]) -> None:
    eng = engine[0]
    c = client(gw)
    with stopped_mid_generation(eng, lambda: c.responses.create(model=MODEL, input="long:60", background=True)) as bg:
        assert c.responses.cancel(bg.id).status == "cancelled"
    final = c.responses.retrieve(bg.id)
    assert final.status == "cancelled"
    strict(Response, raw(gw, "GET", f"/v1/responses/{bg.id}").json())
    assert c.responses.cancel(bg.id).status == "cancelled"  # again: unchanged
    done = c.responses.create(model=MODEL, input="say:quick", background=True)
    assert wait_until_done(c, done.id).status == "completed"
    assert c.responses.cancel(done.id).status == "completed"  # finished: returned as it is
    fg = c.responses.create(model=MODEL, input="say:fg")
    with pytest.raises(openai.BadRequestError, match="background=true"):
        c.responses.cancel(fg.id)
    # deleted while it is generated: stopped as well
    with stopped_mid_generation(eng, lambda: c.responses.create(model=MODEL, input="long:60", background=True)) as bg:
        assert raw(gw, "DELETE", f"/v1/responses/{bg.id}").status_code == 200
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(bg.id)


def test_conversations_api(gw: str, engine: tuple[Engine, str]) -> None:
    c = client(gw)
    conv = c.conversations.create(items=[{"role": "user", "content": "Remember: 42."}], metadata={"topic": "t"})
    strict(Conversation, raw(gw, "GET", f"/v1/conversations/{conv.id}").json())
    assert c.conversations.retrieve(conv.id).metadata == {"topic": "t"}
    assert c.conversations.update(conv.id, metadata={"topic": "u"}).metadata == {"topic": "u"}
    added = c.conversations.items.create(conv.id, items=[{"type": "message", "role": "user", "content": "More."}])
    assert len(added.data) == 1
    r = c.responses.create(model=MODEL, input="say:answer", conversation=conv.id)
    assert r.conversation is not None and r.conversation.id == conv.id
    prompt = ENC.decode(engine[0].requests[-1]["prompt"])
    assert prompt.index("Remember: 42.") < prompt.index("More.") < prompt.index("say:answer")
    listed = strict(ConversationItemList, raw(gw, "GET", f"/v1/conversations/{conv.id}/items?order=asc").json())
    kinds = [(i.type, getattr(i, "role", None)) for i in listed.data]
    assert kinds == [("message", "user"), ("message", "user"), ("message", "user"), ("reasoning", None),
                     ("message", "assistant")]
    one = listed.data[-1]
    strict(ITEM, raw(gw, "GET", f"/v1/conversations/{conv.id}/items/{one.id}").json())
    assert c.conversations.items.retrieve(one.id, conversation_id=conv.id).id == one.id
    assert c.conversations.items.delete(one.id, conversation_id=conv.id).id == conv.id
    with pytest.raises(openai.NotFoundError, match="Item with id"):
        c.conversations.items.retrieve(one.id, conversation_id=conv.id)
    assert [i.id for i in c.conversations.items.list(conv.id)] == [i.id for i in listed.data[:-1]][::-1]
    # the next response sees what is there now: the deleted answer is gone from its prompt
    c.responses.create(model=MODEL, input="say:again", conversation={"id": conv.id})
    assert "final<|message|>answer" not in ENC.decode(engine[0].requests[-1]["prompt"])
    deleted = strict(ConversationDeletedResource, raw(gw, "DELETE", f"/v1/conversations/{conv.id}").json())
    assert deleted.deleted
    with pytest.raises(openai.NotFoundError, match=f"Conversation with id '{conv.id}' not found"):
        c.conversations.retrieve(conv.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model=MODEL, input="x", conversation=conv.id)


def test_conversation_requests_are_checked(gw: str) -> None:
    c = client(gw)
    conv = c.conversations.create()
    r1 = c.responses.create(model=MODEL, input="say:x")
    bad = raw(gw, "POST", "/v1/responses", json={"model": MODEL, "input": "x", "conversation": conv.id,
                                                 "previous_response_id": r1.id})
    assert bad.status_code == 400 and "Mutually exclusive" in bad.json()["error"]["message"]
    for body, param in (({"metadata": {"k": 1}}, "metadata"), ({"metadata": {str(i): "v" for i in range(17)}}, "metadata"),
                        ({"items": [{"role": "wizard", "content": "x"}]}, "items[0].role"),
                        ({"items": [{"role": "user", "content": "x"}] * 21}, "items"), ({"color": 1}, "color")):
        got = raw(gw, "POST", "/v1/conversations", json=body)
        assert got.status_code == 400 and got.json()["error"]["param"] == param, body
    assert raw(gw, "POST", f"/v1/conversations/{conv.id}/items", json={"items": []}).status_code == 400
    assert raw(gw, "POST", "/v1/conversations", content=b"{").status_code == 400


def test_truncation_auto_drops_the_oldest_items(engine: tuple[Engine, str], store_url: str) -> None:
    small = Engine(seed=4)
    small.context = 400
    with serving(small) as up, serving(create_app(Settings(upstream=(up,), store=store_url))) as gw:
        c = client(gw)
        r = c.responses.create(model=MODEL, input="say:start " + "filler " * 60)
        for i in range(4):
            r = c.responses.create(model=MODEL, input=f"say:step{i} " + "filler " * 60, previous_response_id=r.id,
                                   max_output_tokens=50)
            if len(small.requests[-1]["prompt"]) > 200:
                break
        with pytest.raises(openai.BadRequestError, match="context length"):
            for i in range(6):
                r = c.responses.create(model=MODEL, input=f"say:more{i} " + "filler " * 60, previous_response_id=r.id,
                                       max_output_tokens=50)
        kept = c.responses.create(model=MODEL, input="say:fits " + "filler " * 60, previous_response_id=r.id,
                                  truncation="auto", max_output_tokens=50)
        assert kept.output_text.startswith("fits") and kept.truncation == "auto"
        prompt = small.requests[-1]["prompt"]
        assert len(prompt) + 50 <= 400 and "say:start" not in ENC.decode(prompt)
        # nothing but reasoning would be left: no truncation can help, the context error says so
        left = [{"role": "user", "content": "say:x " + "filler " * 600},
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}]}]
        got = raw(gw, "POST", "/v1/responses", json={"model": MODEL, "input": left, "truncation": "auto"})
        assert got.status_code == 400 and got.json()["error"]["code"] == "context_length_exceeded"
        assert got.json()["error"]["param"] == "input"  # a Responses prompt is its input (Chat's: messages)


def test_each_key_sees_only_its_own(engine: tuple[Engine, str], store_url: str, tmp_path: Any) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# team keys\nkey-b\n")
    settings = Settings(upstream=(engine[1],), store=store_url, api_key=("key-a",), api_keys_file=str(keys))
    with serving(create_app(settings)) as gw:
        a, b = client(gw, "key-a"), client(gw, "key-b")
        r = a.responses.create(model=MODEL, input="say:mine")
        conv = a.conversations.create(items=[{"role": "user", "content": "secret"}])
        unknown_r, unknown_c = "resp_" + "0" * 24, "conv_" + "0" * 24
        for rid, cid in ((r.id, conv.id), (unknown_r, unknown_c)):
            for method, path in (("GET", f"/v1/responses/{rid}"), ("DELETE", f"/v1/responses/{rid}"),
                                 ("GET", f"/v1/responses/{rid}/input_items"), ("POST", f"/v1/responses/{rid}/cancel"),
                                 ("GET", f"/v1/conversations/{cid}"), ("GET", f"/v1/conversations/{cid}/items"),
                                 ("DELETE", f"/v1/conversations/{cid}")):
                got = raw(gw, method, path, key="key-b")
                assert got.status_code == 404, (method, path)
                assert got.json()["error"]["message"].endswith(f"with id '{rid if 'responses' in path else cid}' not found.")
        assert "secret" not in raw(gw, "GET", f"/v1/conversations/{conv.id}/items", key="key-b").text
        with pytest.raises(openai.BadRequestError, match="not found"):
            b.responses.create(model=MODEL, input="say:x", previous_response_id=r.id)
        with pytest.raises(openai.NotFoundError):
            b.responses.create(model=MODEL, input="say:x", conversation=conv.id)
        assert a.responses.retrieve(r.id).output_text == "mine"
        assert raw(gw, "GET", f"/v1/responses/{r.id}", key="nope").status_code == 401


def test_store_none_refuses_what_needs_it(engine: tuple[Engine, str]) -> None:
    with serving(create_app(Settings(upstream=(engine[1],), store="none"))) as gw:
        c = client(gw)
        r = c.responses.create(model=MODEL, input="say:x")
        for kw in ({"previous_response_id": r.id}, {"background": True}, {"conversation": "conv_1"}):
            with pytest.raises(openai.BadRequestError, match="--store none"):
                c.responses.create(model=MODEL, input="say:x", **kw)
        got = raw(gw, "GET", f"/v1/responses/{r.id}")
        assert got.status_code == 400 and got.json()["error"]["code"] == "store_disabled"


def test_concurrent_responses_on_one_conversation_lose_nothing(gw: str) -> None:
    async def go() -> None:
        a = openai.AsyncOpenAI(base_url=gw + "/v1", api_key="none", max_retries=0, timeout=120)
        conv = await a.conversations.create()
        await asyncio.gather(*(a.responses.create(model=MODEL, input=f"say:n{i}", conversation=conv.id)
                               for i in range(12)))
        items = [i async for i in a.conversations.items.list(conv.id, order="asc", limit=100)]
        assert len(items) == 12 * 3
        for start in range(0, 36, 3):  # each response's input, reasoning, answer: together, in order
            user, reasoning, answer = items[start:start + 3]
            assert user.type == "message" and reasoning.type == "reasoning" and answer.type == "message"
            assert answer.content[0].text == user.content[0].text.removeprefix("say:")
        await a.close()
    asyncio.run(go())


# -- equivalence: a chain through previous_response_id is the conversation sent whole ------------

STEP = st.sampled_from(["say", "call", "instructions"])


@given(steps=st.lists(STEP, min_size=10, max_size=10), effort=st.sampled_from([None, "low", "high"]))
@examples(4)
def test_a_chain_sends_the_engine_what_the_whole_conversation_sends(steps: list[str], effort: str | None) -> None:
    """Ten steps of messages, tool calls and their outputs, reasoning and answers, with
    instructions changing mid-chain: step for step, the prompt tokens the engine gets through
    previous_response_id are those of the same conversation sent whole."""
    eng, _, gw = _EQUIVALENCE
    c = client(gw)
    previous: str | None = None
    whole: list[dict[str, Any]] = []
    instructions = "Rules 0."
    pending_call: Any = None
    for n, step in enumerate(steps):
        if step == "instructions":
            instructions = f"Rules {n}."
        if pending_call is not None:
            new = [{"type": "function_call_output", "call_id": pending_call.call_id, "output": f"result {n}"}]
        elif step == "call":
            new = [{"role": "user", "content": 'call:lookup:{"q": "s' + str(n) + '"}'}]
        else:
            new = [{"role": "user", "content": f"say:answer {n}"}]
        extra: dict[str, Any] = {"reasoning": {"effort": effort}} if effort else {}
        chained = c.responses.create(model=MODEL, input=new, previous_response_id=previous, instructions=instructions,
                                     tools=TOOLS, **extra)
        via_chain = eng.requests[-1]["prompt"]
        c.responses.create(model=MODEL, input=whole + new, instructions=instructions, tools=TOOLS, store=False, **extra)
        sent_whole = eng.requests[-1]["prompt"]
        assert via_chain == sent_whole, f"step {n}: {ENC.decode(via_chain)!r} != {ENC.decode(sent_whole)!r}"
        whole += new + [o.model_dump(mode="json", exclude_none=True) for o in chained.output]
        calls = [o for o in chained.output if o.type == "function_call"]
        pending_call = calls[-1] if calls else None
        previous = chained.id


_EQUIVALENCE: tuple[Engine, str, str]


@pytest.fixture(autouse=True, scope="module")
def _equivalence_stack(engine: tuple[Engine, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    global _EQUIVALENCE
    url = f"sqlite:///{tmp_path_factory.mktemp('eq') / 'store.db'}"
    with serving(create_app(Settings(upstream=(engine[1],), store=url))) as gw:
        _EQUIVALENCE = (engine[0], url, gw)
        yield


def test_a_long_stored_history_is_rendered_whole(gw: str, engine: tuple[Engine, str]) -> None:
    """A conversation past LONG_HISTORY items (rendered off the event loop): every item reaches
    the prompt, in order."""
    c = client(gw)
    conv = c.conversations.create()
    for start in range(0, 1040, 20):
        c.conversations.items.create(conv.id, items=[{"role": "user", "content": f"n{i}"} for i in range(start, start + 20)])
    assert c.responses.create(model=MODEL, input="say:long", conversation=conv.id).output_text == "long"
    prompt = ENC.decode(engine[0].requests[-1]["prompt"])
    marks = [prompt.index(f"<|message|>n{i}<|end|>") for i in range(1040)]
    assert marks == sorted(marks)
