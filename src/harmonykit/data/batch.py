"""Columns in, columns out: for ``datasets.Dataset.map(batched=True, num_proc=N)`` and Ray
Data's ``map_batches`` (the callable classes load the encoding once per worker).

A record that cannot be rendered never stops the batch and never vanishes: its row
gets empty outputs and the reason in ``error`` (``None`` for good rows).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .. import HarmonyEncodingName, load_harmony_encoding
from ..encoding import HarmonyEncoding
from ..errors import HarmonyError
from ..openai.errors import RequestError
from .examples import parse_example, render_example


def _rows(batch: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    columns = {k: _plain(v) for k, v in batch.items()}
    n = len(next(iter(columns.values()))) if columns else 0
    for i in range(n):
        yield {k: v[i] for k, v in columns.items() if not _missing(v[i])}


def _missing(value: Any) -> bool:
    # Arrow gives None for a field a row lacks; pandas gives NaN or pandas.NA (not imported here)
    return value is None or (isinstance(value, float) and value != value) or type(value).__name__ == "NAType"


def _plain(column: Any) -> list[Any]:
    """A column as a list of plain Python values (pandas, NumPy and Arrow columns included)."""
    if hasattr(column, "to_pylist"):
        return list(column.to_pylist())
    if hasattr(column, "tolist"):
        return [_plain_value(v) for v in column.tolist()]
    return [_plain_value(v) for v in column]


def _plain_value(value: Any) -> Any:
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return _plain_value(value.tolist())
    if isinstance(value, dict):
        return {k: _plain_value(v) for k, v in value.items() if not _missing(v)}
    if isinstance(value, (list, tuple)):
        return [_plain_value(v) for v in value]
    return value


def error_text(e: Exception) -> str:
    """One line naming the field: ``messages[3].tool_calls[0].function.arguments: ...``."""
    if isinstance(e, RequestError):
        return f"{e.param}: {e.message}" if e.param else e.message
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def render_batch(batch: Mapping[str, Any], *, encoding: HarmonyEncoding | None = None,
                 train_on: str = "last_turn", cot: str = "inference") -> dict[str, list[Any]]:
    """``render_example`` over a batch of columns (``messages``, ``tools``, ... or ``input``).

    >>> out = render_batch({"messages": [[{"role": "user", "content": "Hi"},
    ...                                   {"role": "assistant", "content": "Hello"}], [{"role": "wizard"}]]})
    >>> [len(ids) > 0 for ids in out["input_ids"]], out["error"][1]
    ([True, False], "messages[0].role: unknown role 'wizard'")
    """
    enc = encoding or load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    out: dict[str, list[Any]] = {"input_ids": [], "labels": [], "assistant_mask": [], "error": []}
    for record in _rows(batch):
        err: str | None = None
        try:
            ex = render_example(enc, record, train_on=train_on, cot=cot)
        except (RequestError, HarmonyError, ValueError, TypeError) as e:
            ex, err = {"input_ids": [], "labels": [], "assistant_mask": []}, error_text(e)
        for k in ("input_ids", "labels", "assistant_mask"):
            out[k].append(ex[k])
        out["error"].append(err)
    return out


def parse_batch(batch: Mapping[str, Any], *, encoding: HarmonyEncoding | None = None,
                column: str = "completion", tools: Sequence[str] | None = None) -> dict[str, list[Any]]:
    """``parse_example`` over a column of completions (ids or text); JSON-friendly columns out."""
    enc = encoding or load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    out: dict[str, list[Any]] = {"messages": [], "repairs": [], "stop": [], "complete": [], "error": []}
    for value in _plain(batch[column]):
        err: str | None = None
        try:
            r = parse_example(enc, value, tools=tools)
        except (HarmonyError, TypeError, ValueError) as e:
            r, err = {"messages": [], "repairs": [], "stop": None, "complete": False}, error_text(e)
        for k in ("messages", "repairs", "stop", "complete"):
            out[k].append(r[k])
        out["error"].append(err)
    return out


class RenderBatches:
    """For Ray Data: ``ds.map_batches(RenderBatches, fn_constructor_kwargs={...}, batch_format="pandas")``;
    the encoding loads once per worker."""

    def __init__(self, train_on: str = "last_turn", cot: str = "inference") -> None:
        self.encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
        self.train_on, self.cot = train_on, cot

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, list[Any]]:
        return render_batch(batch, encoding=self.encoding, train_on=self.train_on, cot=self.cot)


class ParseBatches:
    """For Ray Data: ``ds.map_batches(ParseBatches, batch_format="pandas")``."""

    def __init__(self, column: str = "completion", tools: Sequence[str] | None = None) -> None:
        self.encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
        self.column, self.tools = column, tools

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, list[Any]]:
        return parse_batch(batch, encoding=self.encoding, column=self.column, tools=self.tools)
