"""Datasets: render_example against the reference, labels, batches, and the same rows through the
CLI (1 and 2 workers), Hugging Face datasets (num_proc=2) and Ray Data (a local Ray, 2 CPUs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai_harmony as oh
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

import harmonykit as hk
from budget import examples
from harmonykit.data import IGNORE, parse_example, render_example
from harmonykit.data.batch import parse_batch, render_batch
from reference_mapping import reference_messages

ENC = hk.load_harmony_encoding(hk.HarmonyEncodingName.HARMONY_GPT_OSS)
RETURN, END, START = 200002, 200007, 200006
TOOLS = [{"type": "function", "function": {"name": "get weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
_text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12).filter(lambda s: "<|" not in s)


@st.composite
def records(draw: st.DrawFn) -> dict[str, Any]:
    """Chat records with an answer: multi-turn, reasoning, tool calls and their results."""
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(_text)})
    calls = 0
    for _ in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": draw(_text)})
        for _ in range(draw(st.integers(0, 2))):  # tool round trips
            calls += 1
            msg: dict[str, Any] = {"role": "assistant", "content": draw(st.one_of(st.none(), _text)), "tool_calls": [
                {"id": f"c{calls}", "type": "function",
                 "function": {"name": "get weather", "arguments": json.dumps({"city": draw(_text)})}}]}
            if draw(st.booleans()):
                msg["reasoning_content"] = draw(_text)
            messages += [msg, {"role": "tool", "tool_call_id": f"c{calls}", "content": draw(_text)}]
        answer: dict[str, Any] = {"role": "assistant", "content": draw(_text)}
        if draw(st.booleans()):
            answer["reasoning_content"] = draw(_text)
        messages.append(answer)
    record: dict[str, Any] = {"messages": messages}
    if calls or draw(st.booleans()):
        record["tools"] = TOOLS
    if draw(st.booleans()):
        record["reasoning_effort"] = draw(st.sampled_from(["low", "high"]))
    return record


def _reference_messages(record: dict[str, Any]) -> list[Any]:
    """The record's conversation in the reference's own classes, built by hand (not by harmonykit)."""
    return reference_messages(record)


@examples(120, suppress_health_check=[HealthCheck.too_slow])
@given(records(), st.sampled_from(["last_turn", "all_assistant"]))
def test_renders_match_the_reference(ref: Any, record: dict[str, Any], train_on: str) -> None:
    msgs = _reference_messages(record)
    # cot="reference": the reference's training render exactly
    ex = render_example(ENC, record, cot="reference", train_on=train_on)
    assert ex["input_ids"] == ref.render_conversation_for_training(oh.Conversation.from_messages(msgs))
    # cot="inference": the reference's prompt for the last turn, then that turn's messages as it renders each
    turn = max(i for i, m in enumerate(msgs) if m.author.role == oh.Role.USER) + 1
    prompt = ref.render_conversation_for_completion(oh.Conversation.from_messages(msgs[:turn]), oh.Role.ASSISTANT)
    expected = prompt[:-2]
    for m in msgs[turn:]:
        tokens = ref.render(m)
        if m.author.role == oh.Role.ASSISTANT and m.channel == "final":
            tokens[-1] = RETURN
        expected += tokens
    ex = render_example(ENC, record, train_on=train_on)
    assert ex["input_ids"] == expected
    # labelled tokens: exactly the selected assistant messages, less the <|start|>assistant a prompt gives
    want: list[int] = []
    previous = None
    pos = len(prompt) - 2
    for m in msgs[turn:]:
        tokens = expected[pos : pos + len(ref.render(m))]
        pos += len(tokens)
        if m.author.role == oh.Role.ASSISTANT:
            want += tokens if previous == oh.Role.ASSISTANT else tokens[2:]
        previous = m.author.role
    got = [t for t, label in zip(ex["input_ids"], ex["labels"], strict=True) if label != IGNORE]
    if train_on == "last_turn":
        assert got == want
    else:
        assert got[-len(want):] == want and len(got) >= len(want)
    assert all(label in (IGNORE, t) for t, label in zip(ex["input_ids"], ex["labels"], strict=True))
    assert len(ex["assistant_mask"]) == len(ex["input_ids"])


def test_the_trap_the_reference_sets() -> None:
    """In a one-turn example the reference drops the very reasoning one means to train on."""
    record = {"messages": [{"role": "user", "content": "2+2?"},
                           {"role": "assistant", "reasoning_content": "Add them.", "content": "4"}]}
    reasoning = ENC.encode("Add them.")
    ours = render_example(ENC, record)
    trained = [t for t, label in zip(ours["input_ids"], ours["labels"], strict=True) if label != IGNORE]
    assert ENC.decode(trained).startswith("<|channel|>analysis<|message|>Add them.<|end|>")
    reference = render_example(ENC, record, cot="reference")["input_ids"]
    assert not any(reference[i : i + len(reasoning)] == reasoning for i in range(len(reference)))


@pytest.mark.parametrize(("record", "fragment"), [
    ({"messages": [{"role": "user", "content": "x"}]}, "no assistant answer"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": "hi"}, "messages"),
    ([1, 2], "must be an object"),
])
def test_bad_records(record: Any, fragment: str) -> None:
    out = render_batch({"messages": [record.get("messages") if isinstance(record, dict) else record]})
    assert out["input_ids"] == [[]] and out["error"][0]  # the row stays, empty, with its reason
    with pytest.raises((ValueError, TypeError)) as info:
        render_example(ENC, record)  # type: ignore[arg-type]
    assert fragment in str(info.value)


def test_responses_shape_and_parse() -> None:
    record = {"input": [{"role": "user", "content": "Hi"},
                        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Greet."}]},
                        {"role": "assistant", "content": [{"type": "output_text", "text": "Hello"}]}]}
    ex = render_example(ENC, record)
    assert ENC.decode([t for t, lab in zip(ex["input_ids"], ex["labels"], strict=True) if lab != IGNORE]) == \
        "<|channel|>analysis<|message|>Greet.<|end|><|start|>assistant<|channel|>final<|message|>Hello<|return|>"
    r = parse_example(ENC, "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final json"
                           "<|message|>{}<|return|>")
    assert r["stop"] == "return" and r["complete"] and [m["channel"] for m in r["messages"]] == ["analysis", "final"]
    out = parse_batch({"completion": ["<|channel|>final<|message|>Hi<|return|>", [200005, 35644, 200008]]})
    assert out["complete"] == [True, False] and out["error"] == [None, None]


# -- the same rows every way ---------------------------------------------------------------

RECORDS = [
    {"messages": [{"role": "user", "content": f"What is {i} + {i}?"},
                  {"role": "assistant", "reasoning_content": "Add.", "content": str(2 * i)}],
     **({"tools": TOOLS} if i % 3 == 0 else {})}
    for i in range(40)
] + [{"messages": [{"role": "user", "content": "weather?"},
                   {"role": "assistant", "content": None, "tool_calls": [
                       {"id": "a", "type": "function", "function": {"name": "get weather", "arguments": "{}"}}]},
                   {"role": "tool", "tool_call_id": "a", "content": "sun"},
                   {"role": "assistant", "content": "Sunny."}], "tools": TOOLS}]


def _expected() -> list[dict[str, Any]]:
    return [render_example(ENC, r) for r in RECORDS]


def _cli(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harmonykit", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_cli_one_and_two_workers_give_the_same_rows(tmp_path: Path, fmt: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / f"in.{fmt}"
    if fmt == "jsonl":
        src.write_text("".join(json.dumps(r) + "\n" for r in RECORDS), encoding="utf-8")
    else:
        pq.write_table(pa.Table.from_pylist(RECORDS), src)
    rows = []
    for workers in (1, 2):
        out = tmp_path / f"out{workers}.{fmt}"
        proc = _cli(["data", "render", str(src), "-o", str(out), "--workers", str(workers)])
        assert proc.returncode == 0, proc.stderr
        summary = json.loads(proc.stderr.strip().splitlines()[-1])
        assert summary["records"] == summary["written"] == len(RECORDS) and summary["rejected"] == 0
        if fmt == "jsonl":
            rows.append([json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()])
        else:
            rows.append(pq.read_table(out).to_pylist())
    assert rows[0] == rows[1] == _expected()


def test_cli_bad_input_is_reported_and_the_rest_written(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    lines = [json.dumps(RECORDS[0]), "{broken", json.dumps({"messages": [{"role": "wizard", "content": "x"}]}),
             json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [
                 {"id": "a", "function": {"name": "f", "arguments": 5}}]}]}), "", json.dumps(RECORDS[1])]
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    proc = _cli(["data", "render", str(src), "-o", str(out), "--workers", "2"])
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()] == _expected()[:2]
    rejects = [json.loads(x) for x in (tmp_path / "out.jsonl.rejects.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [(r["line"], r["error"].split(":")[0]) for r in rejects] == [
        (2, "not JSON"), (3, "messages[0].role"), (4, "messages[1].tool_calls[0].function.arguments")]
    strict = _cli(["data", "render", str(src), "-o", str(tmp_path / "s.jsonl"), "--strict", "--workers", "1"])
    assert strict.returncode == 1 and "line 2" in strict.stderr
    # --max-tokens drops and counts
    proc = _cli(["data", "render", str(src), "-o", str(tmp_path / "m.jsonl"), "--max-tokens", "10"])
    assert json.loads(proc.stderr.strip().splitlines()[-1])["dropped_too_long"] == 2
    # an unterminated Parquet file
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = tmp_path / "good.parquet"
    pq.write_table(pa.Table.from_pylist(RECORDS), good)
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    proc = _cli(["data", "render", str(cut), "-o", str(tmp_path / "c.jsonl")])
    assert proc.returncode == 0
    rejects = (tmp_path / "c.jsonl.rejects.jsonl").read_text(encoding="utf-8")
    assert "Parquet" in rejects


def test_cli_parse(tmp_path: Path) -> None:
    src = tmp_path / "rollouts.jsonl"
    src.write_text(json.dumps({"completion": "<|channel|>final<|message|>4<|end|><|return|>"}) + "\n"
                   + json.dumps({"completion": [200005, 17196, 200008, 19, 200002]}) + "\n"
                   + json.dumps({"completion": 5}) + "\n", encoding="utf-8")
    proc = _cli(["data", "parse", str(src), "-o", str(tmp_path / "p.jsonl"), "--workers", "1"])
    summary = json.loads(proc.stderr.strip().splitlines()[-1])
    assert summary["written"] == 2 and summary["rejected"] == 1 and summary["repairs"] == {"stray_stop_token": 1}
    assert summary["tokens"] == len(ENC.encode("<|channel|>final<|message|>4<|end|><|return|>", allowed_special="all")) + 5


def test_hugging_face_datasets_map_num_proc_2() -> None:
    import datasets  # a dev dependency: missing is a failure, not a skip

    ds = datasets.Dataset.from_list(RECORDS)
    out = ds.map(render_batch, batched=True, num_proc=2, remove_columns=ds.column_names)
    assert out["error"] == [None] * len(RECORDS)
    assert [{k: row[k] for k in ("input_ids", "labels", "assistant_mask")} for row in out] == _expected()


# Ray (2.60) binds its gRPC servers to every interface, whatever its node address: so it runs in
# a network namespace of its own with loopback alone (unshare, as root, as here and in CI), told
# its node is 127.0.0.1. Nothing it opens is reachable from anywhere but this namespace.
_RAY = """
import json, sys
import ray
from harmonykit.data.batch import ParseBatches, RenderBatches
records = json.load(sys.stdin)
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
         _node_ip_address="127.0.0.1")
try:
    rows = ray.data.from_items(records).map_batches(RenderBatches, batch_format="pandas", concurrency=2,
                                                    batch_size=8).take_all()
    rendered = [{k: [int(x) for x in r[k]] for k in ("input_ids", "labels", "assistant_mask")} for r in rows]
    parsed = ray.data.from_items([{"completion": "<|channel|>final<|message|>Hi<|return|>"}] * 4) \\
        .map_batches(ParseBatches, batch_format="pandas", concurrency=1).take_all()
    print(json.dumps({"rendered": rendered, "stops": [p["stop"] for p in parsed]}))
finally:
    ray.shutdown()
"""


def test_ray_data_map_batches() -> None:
    proc = subprocess.run(["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$0" -c "$1"',
                           sys.executable, _RAY], input=json.dumps(RECORDS), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(out["rendered"], key=lambda r: r["input_ids"]) == sorted(_expected(), key=lambda r: r["input_ids"])
    assert out["stops"] == ["return"] * 4
