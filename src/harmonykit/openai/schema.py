"""Checking the JSON Schemas of a request (tool parameters, response formats) as OpenAI does.

A schema the renderer cannot show the model, or that is not JSON at all, is a
400-style ``RequestError`` naming the offending ``param``, never an error from
deep inside the renderer.
"""

from __future__ import annotations

import math
from typing import Any

from .errors import RequestError, shown

#: How deep a schema may nest (OpenAI allows 5 levels of objects in strict mode;
#: this only keeps pathological input from reaching the renderer).
MAX_DEPTH = 64
_TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "contains", "if", "then", "else",
               "propertyNames", "additionalItems", "unevaluatedProperties")


def check_json(value: Any, param: str, depth: int = 0, path: frozenset[int] = frozenset()) -> None:
    """``value`` is JSON: objects with string keys, arrays, strings, finite numbers, booleans, null."""
    if depth > MAX_DEPTH:
        raise RequestError(param, f"nested deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise RequestError(param, f"{value} is not a JSON number")
        return
    if isinstance(value, (dict, list)):
        if id(value) in path:
            raise RequestError(param, "refers to itself (a cycle is not JSON)")
        inner = path | {id(value)}
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if not isinstance(key, (str, int)):
                raise RequestError(param, f"object keys must be strings, got {type(key).__name__}")
            where = f"{param}.{key}" if isinstance(value, dict) else f"{param}[{key}]"
            check_json(item, where, depth + 1, inner)
        return
    raise RequestError(param, f"{type(value).__name__} is not a JSON value")


def check_schema(schema: Any, param: str) -> None:
    """A JSON Schema object, checked for what a renderer relies on.

    >>> check_schema({"type": "object", "properties": {"a": {"type": "strin"}}}, "p")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    harmonykit.openai.errors.RequestError: p.properties.a.type: unknown type 'strin'; ...
    """
    if not isinstance(schema, dict):
        raise RequestError(param, "must be a JSON Schema object")
    check_json(schema, param)  # first: no cycles or non-JSON values below
    _check(schema, param, 0)


def _check(schema: Any, param: str, depth: int) -> None:
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise RequestError(param, f"a schema must be an object, got {type(schema).__name__}")
    if depth > MAX_DEPTH:
        raise RequestError(param, f"nested deeper than {MAX_DEPTH} levels")
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        for k in kinds:
            if not isinstance(k, str) or k not in _TYPES:
                raise RequestError(f"{param}.type",
                                   f"unknown type {shown(k)}; use one of {', '.join(sorted(_TYPES))}")
    required = schema.get("required")
    names = required if isinstance(required, list) else [None]
    if required is not None and not all(isinstance(r, str) for r in names):
        raise RequestError(f"{param}.required", "required must be a list of property names (strings)")
    enum = schema.get("enum")
    if enum is not None and not isinstance(enum, list):
        raise RequestError(f"{param}.enum", "enum must be a list")
    for key in _SCHEMA_MAPS:
        if key in schema:
            value = schema[key]
            if not isinstance(value, dict):
                raise RequestError(f"{param}.{key}", f"{key} must be an object of schemas")
            for name, sub in value.items():
                _check(sub, f"{param}.{key}.{name}", depth + 1)
    for key in _SCHEMA_LISTS:
        if key in schema:
            value = schema[key]
            if not isinstance(value, list):
                raise RequestError(f"{param}.{key}", f"{key} must be a list of schemas")
            for i, sub in enumerate(value):
                _check(sub, f"{param}.{key}[{i}]", depth + 1)
    for key in _SCHEMA_ONE:
        if key in schema:
            value = schema[key]
            if key == "items" and isinstance(value, list):  # draft-4 tuple form
                for i, sub in enumerate(value):
                    _check(sub, f"{param}.items[{i}]", depth + 1)
            else:
                _check(value, f"{param}.{key}", depth + 1)
