"""A large body read in pieces is read as orjson reads it: the same value, or the same refusal."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from budget import examples
from harmonykit.server import large as body_module
from harmonykit.server.large import loads_in_pieces


@pytest.fixture(autouse=True)
def _every_body_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(body_module, "PIECES_OBJECTS", 0)  # small bodies too, so the pieces are what is tested

_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12)
_bodies = st.dictionaries(st.sampled_from(["model", "messages", "input", "tools", "x", "stream"]), _values,
                          max_size=5).map(lambda d: {**d, "messages": d.get("messages", [])} if d else d)


def same(data: bytes) -> None:
    try:
        expected: Any = orjson.loads(data)
    except orjson.JSONDecodeError:
        with pytest.raises(orjson.JSONDecodeError):
            loads_in_pieces(data)
        return
    assert loads_in_pieces(data) == expected


@examples(300, suppress_health_check=[HealthCheck.too_slow])
@given(_bodies, st.sampled_from([None, 0, 2]), st.data())
def test_the_same_value_or_the_same_refusal(body: dict[str, Any], indent: int | None, data: st.DataObject) -> None:
    text = json.dumps(body, indent=indent, ensure_ascii=data.draw(st.booleans()))
    same(text.encode())
    cut = data.draw(st.integers(0, len(text)))
    same(text[:cut].encode())  # truncated: both refuse (or both read a shorter valid body)
    same((text[:cut] + data.draw(st.sampled_from(["", ",", "}", "]", " x", '"'])) + text[cut:]).encode())


@pytest.mark.parametrize("data", [
    b'{"messages": [{"content": NaN}]}', b'{"messages": [], "t": Infinity}', b'{"messages": ["\\ud800"]}',
    b'{"messages": [1e400]}', b'{"messages": [123456789012345678901234567890]}', b'\xef\xbb\xbf{"messages": []}',
    b'{"messages": [1, 2,]}', b'{"messages": [] "x": 1}', b'{"a": 1, "a": 2}', b'[1, 2]', b'{"messages": []} x',
    b'{"messages": ["\xff"]}', b' {"messages" : [ {"role":"user"} , {} ] } ', b'{}', b'',
])
def test_corners(data: bytes) -> None:
    same(data)


def test_a_conversation_of_250k_messages() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": f"q {i}"} for i in range(250_000)]}
    same(orjson.dumps(body))
