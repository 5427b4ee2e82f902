"""The harmonykit command: parse, render, inspect; one-line errors, exit codes."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harmonykit.cli import main

CALL = '<|channel|>commentary to=Get Intersection Layout<|message|>{"id": 1}<|call|>'


def run(args: list[str], stdin: str = "", capsys: pytest.CaptureFixture[str] | None = None) -> tuple[int, str, str]:
    out = io.StringIO()
    old = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        code = main(args, out)
    finally:
        sys.stdin = old
    err = capsys.readouterr().err if capsys else ""
    return code, out.getvalue(), err


def test_parse_prints_everything(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["parse", "--tool", "Get Intersection Layout"], CALL, capsys)
    data = json.loads(out)
    assert code == 0
    assert set(data) == {"messages", "spans", "skipped", "repairs", "stop", "complete"}
    assert data["messages"][0]["recipient"] == "Get Intersection Layout"
    assert data["stop"] == "call" and data["complete"] is True
    assert data["repairs"][0]["kind"] == "recipient_with_spaces"


def test_parse_strict_fails_like_the_reference(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["parse", "--strict"], CALL, capsys)
    assert code == 1 and out == ""
    assert err.strip() == ('harmonykit: error: unexpected tokens remaining in message header: '
                           'Some("to=Get") (at token 8)')


def test_parse_token_ids(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "ids.json"
    f.write_text("[200005, 17196, 200008, 12194, 200002]")
    code, out, _ = run(["parse", "--tokens", str(f)], capsys=capsys)
    assert code == 0 and json.loads(out)["messages"][0]["content"][0]["text"] == "Hi"


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["parse", "--tokens"], "[1, 2", "not a JSON list of token ids"),
        (["parse", "--tokens"], '["a"]', "expected a JSON list of integers"),
        (["parse", "/no/such/file"], "", "cannot read /no/such/file"),
        (["render"], "{", "not JSON"),
        (["render"], '{"messages": [{"role": "robot", "content": "x"}]}', "not a conversation"),
    ],
)
def test_bad_input_is_one_clear_line(args: list[str], stdin: str, message: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(args, stdin, capsys)
    assert code == 2
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_render(capsys: pytest.CaptureFixture[str]) -> None:
    convo = '{"messages": [{"role": "user", "content": "hi"}]}'
    assert run(["render"], convo, capsys)[1] == "<|start|>user<|message|>hi<|end|><|start|>assistant\n"
    assert run(["render", "--mode", "conversation"], convo, capsys)[1] == "<|start|>user<|message|>hi<|end|>\n"
    assert json.loads(run(["render", "--tokens"], convo, capsys)[1])[0] == 200006


def test_inspect_marks_repairs(capsys: pytest.CaptureFixture[str]) -> None:
    text = "<|channel|>analysis<|message|>Think.<|end|> 364 <|start|>assistant<|channel|>final<|message|>Hi<|return|>"
    code, out, _ = run(["inspect", "--color", "never"], text, capsys)
    assert code == 0
    assert "#0 assistant channel=analysis" in out and "#1 assistant channel=final" in out
    assert "✗ stray_text [tokens 6-9) ' 364 '" in out
    assert "2 messages, 1 repairs, stop=return, complete" in out
    _, colored, _ = run(["inspect", "--color", "always"], text, capsys)
    assert "\x1b[" in colored


def test_help_everywhere() -> None:
    for cmd in ([], ["parse"], ["render"], ["inspect"]):
        proc = subprocess.run([sys.executable, "-m", "harmonykit.cli", *cmd, "--help"], capture_output=True,
                              text=True, check=False, timeout=120)
        assert proc.returncode == 0 and "usage: harmonykit" in proc.stdout


def test_core_does_not_import_the_cli() -> None:
    code = "import sys, harmonykit; print('harmonykit.cli' in sys.modules, 'argparse' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert proc.stdout.split()[0] == "False"


def test_final_newline_is_not_part_of_the_completion(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "c.txt"
    f.write_text("<|channel|>final<|message|>Hi<|return|>\n", encoding="utf-8")
    code, out, _ = run(["parse", "--strict", str(f)], capsys=capsys)
    assert code == 0 and json.loads(out)["messages"][0]["content"][0]["text"] == "Hi"
    code, out, _ = run(["parse", str(f)], capsys=capsys)
    assert json.loads(out)["repairs"] == []
    # only one: a second newline is the model's
    f.write_text("<|channel|>final<|message|>Hi\n\n", encoding="utf-8")
    code, out, _ = run(["parse", str(f)], capsys=capsys)
    assert json.loads(out)["messages"][0]["content"][0]["text"] == "Hi\n"


CHAT_BODY = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
             "tools": [{"type": "function", "function": {"name": "get weather", "parameters": {"type": "object"}}}]}


@pytest.mark.parametrize(("body", "flag", "needle"), [
    (CHAT_BODY, None, "type get_weather = "),
    ({"input": "Hi", "instructions": "Be brief."}, None, "# Instructions\n\nBe brief."),
    ({"messages": [{"role": "user", "content": "Hi"}]}, "--chat", "<|start|>system<|message|>"),
    ({"input": "Hi"}, "--responses", "<|start|>user<|message|>Hi<|end|><|start|>assistant"),
])
def test_render_api_requests(body: dict[str, object], flag: str | None, needle: str,
                             capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["render", *([flag] if flag else [])], json.dumps(body), capsys)
    assert code == 0 and needle in out


def test_render_bad_request_names_the_param(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["render", "--chat"], json.dumps({"messages": [{"role": "wizard", "content": "x"}]}), capsys)
    assert code == 2 and "messages[0].role" in err


def test_version_and_module_entry() -> None:
    for argv in (["-m", "harmonykit", "--version"],):
        proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and proc.stdout.startswith("harmonykit ")
