"""JSON Schema -> the TypeScript-like declarations gpt-oss reads in its tool sections.

The output matches the reference renderer character for character, odd corners
included (see docs/compatibility.md): descriptions of ``oneOf`` properties move
above the property, string defaults of enums are unquoted, only string
``examples`` are listed, and JSON values in ``default`` comments are printed the
way Rust's serde_json prints them.

The behaviour follows openai-harmony's Rust renderer (Apache-2.0, Copyright OpenAI) branch by
branch; see NOTICE.

>>> print(schema_to_typescript({"type": "object", "properties": {"n": {"type": "integer"}}}, ""))
{
n?: number,
}
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .cache import PartsCache

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def _json_string(s: str) -> str:
    out = ['"']
    for ch in s:
        esc = _ESCAPES.get(ch)
        if esc is not None:
            out.append(esc)
        elif ch < " ":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _json_float(x: float) -> str:
    # serde_json prints floats with ryu: shortest round-trip digits, an
    # exponent without "+" or padding, and scientific notation outside
    # 1e-5 <= |x| < 1e16.
    if not math.isfinite(x):
        return "null"
    if x == 0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    r = repr(abs(x))
    mantissa, _, exp_s = r.partition("e")
    exp = int(exp_s) if exp_s else 0
    int_part, _, frac_part = mantissa.partition(".")
    digits = (int_part + frac_part).lstrip("0")
    # Decimal exponent of the first significant digit.
    if int_part.strip("0"):
        point = len(int_part.lstrip("0")) + exp
    else:
        point = -(len(frac_part) - len(frac_part.lstrip("0"))) + exp
    digits = digits.rstrip("0") or "0"
    sign = "-" if x < 0 else ""
    n = len(digits)
    if 0 < point <= 16:
        if n <= point:
            return f"{sign}{digits}{'0' * (point - n)}.0"
        return f"{sign}{digits[:point]}.{digits[point:]}"
    if -5 < point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    e = point - 1
    body = digits[0] + ("." + digits[1:] if n > 1 else "")
    return f"{sign}{body}e{e}"


_POW10 = [float(f"1e{i}") for i in range(309)]
_U64_MAX = 2**64 - 1


def _serde_f64(significand: int, exponent: int, positive: bool) -> float:
    # serde_json (without float_roundtrip) scales a u64 significand by a power
    # of ten in one rounding step, which can be an ulp off the exact value.
    f = float(significand)
    while True:
        if abs(exponent) < len(_POW10):
            pow10 = _POW10[abs(exponent)]
            f = f * pow10 if exponent >= 0 else f / pow10
            break
        if f == 0.0 or exponent >= 0:
            break
        f /= 1e308
        exponent += 308
    return f if positive else -f


def serde_number(text: str) -> int | float:
    """The number serde_json reads from a JSON number's text (ints stay exact when they fit)."""
    positive = not text.startswith("-")
    digits = text.lstrip("-")
    mantissa, _, exp_text = digits.replace("E", "e").partition("e")
    int_part, dot, frac_part = mantissa.partition(".")
    significand, exponent, overflowed = 0, 0, False
    for ch in int_part:
        if overflowed:
            exponent += 1
        elif significand * 10 + int(ch) > _U64_MAX:
            overflowed, exponent = True, exponent + 1
        else:
            significand = significand * 10 + int(ch)
    if not dot and not exp_text and not overflowed:
        if positive:
            return significand
        if significand <= 2**63 and significand != 0:
            return -significand
        return -float(significand)
    for ch in frac_part:
        if overflowed or significand * 10 + int(ch) > _U64_MAX:
            overflowed = True
            continue
        significand = significand * 10 + int(ch)
        exponent -= 1
    if exp_text:
        exponent += int(exp_text)
    return _serde_f64(significand, exponent, positive)


def json_compact(value: Any) -> str:
    """A JSON value as serde_json's ``Display`` writes it (compact, UTF-8, ryu floats)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, (int, float)):
        # The reference hands schemas to Rust as JSON text; print what serde_json read.
        number = serde_number(json.dumps(value))
        return str(number) if isinstance(number, int) else _json_float(number)
    if isinstance(value, str):
        return _json_string(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{_json_string(str(k))}:{json_compact(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(json_compact(v) for v in value) + "]"
    return _json_string(str(value))


def _get(schema: Any, key: str) -> Any:
    return schema.get(key) if isinstance(schema, dict) else None


def _is_enum(schema: Any) -> bool:
    values = _get(schema, "enum")
    return isinstance(values, list) and len(values) > 0


def _default_text(schema: Any, default: Any, enum_raw: bool = True) -> str:
    # A string default is quoted as is, unless the schema is an enum: then it
    # is bare (or, in a top-level oneOf, printed as JSON), as the reference does.
    if isinstance(default, str):
        if not _is_enum(schema):
            return f'"{default}"'
        if enum_raw:
            return default
    return json_compact(default)


def _nullable(variant: Any, type_str: str) -> str:
    if _get(variant, "nullable") is True and "null" not in type_str:
        return f"{type_str} | null"
    return type_str


def _variant_comments(
    variant: Any, skip_description: bool, property_desc: str | None, enum_raw: bool
) -> str:
    comments: list[str] = []
    desc = _get(variant, "description")
    if not skip_description and isinstance(desc, str) and desc != property_desc:
        comments.append(desc)
    if isinstance(variant, dict) and "default" in variant:
        comments.append(f"default: {_default_text(variant, variant['default'], enum_raw)}")
    return f" // {' '.join(comments)}" if comments else ""


def schema_to_typescript(schema: Any, indent: str) -> str:
    """Render one JSON Schema as the TypeScript type the reference would write."""
    one_of = _get(schema, "oneOf")
    if isinstance(one_of, list):
        out = []
        for variant in one_of:
            out.append(f"\n{indent} | ")
            out.append(_nullable(variant, schema_to_typescript(variant, indent + "   ")))
            out.append(_variant_comments(variant, False, None, enum_raw=False))
        return "".join(out)
    ty = _get(schema, "type")
    if isinstance(ty, list):
        names = ["number" if t == "integer" else t for t in ty if isinstance(t, str)]
        if names:
            return " | ".join(names)
    if isinstance(ty, str):
        if ty == "object":
            return _object_to_typescript(schema, indent)
        if ty == "string":
            values = _get(schema, "enum")
            if isinstance(values, list):
                quoted = [f'"{v}"' for v in values if isinstance(v, str)]
                if quoted:
                    return " | ".join(quoted)
            return "string"
        if ty in ("number", "integer"):
            return "number"
        if ty == "boolean":
            return "boolean"
        if ty == "array":
            if isinstance(schema, dict) and "items" in schema:
                return f"{schema_to_typescript(schema['items'], indent)}[]"
            return "Array<any>"
    return "any"


def _object_to_typescript(schema: dict[str, Any], indent: str) -> str:
    out: list[str] = []
    desc = schema.get("description")
    if isinstance(desc, str):
        out.append(f"{indent}// {desc}\n")
    out.append("{\n")
    props = schema.get("properties")
    if isinstance(props, dict):
        req = schema.get("required")
        required = {r for r in req if isinstance(r, str)} if isinstance(req, list) else set()
        for key, val in props.items():
            out.append(_property_to_typescript(key, val, key in required, indent))
    out.append(f"{indent}}}")
    return "".join(out)


def _property_to_typescript(key: str, val: Any, required: bool, indent: str) -> str:
    out: list[str] = []
    mark = "" if required else "?"
    title = _get(val, "title")
    if isinstance(title, str):
        out.append(f"{indent}// {title}\n{indent}//\n")
    desc = _get(val, "description")
    desc_str = desc if isinstance(desc, str) else None
    has_one_of = isinstance(val, dict) and "oneOf" in val
    if not has_one_of and desc_str is not None:
        out.append(f"{indent}// {desc_str}\n")
    examples = _get(val, "examples")
    if isinstance(examples, list) and examples:
        out.append(f"{indent}// Examples:\n")
        for ex in examples:
            if isinstance(ex, str):
                out.append(f'{indent}// - "{ex}"\n')
    one_of = _get(val, "oneOf")
    if isinstance(one_of, list):
        first_desc = _get(one_of[0], "description") if one_of else None
        above = desc_str is not None and desc_str != first_desc
        if above:
            out.append(f"{indent}// {desc_str}\n")
        if "default" in val:
            out.append(f"{indent}// default: {_default_text(val, val['default'])}\n")
        out.append(f"{indent}{key}{mark}:\n")
        for i, variant in enumerate(one_of):
            out.append(f"{indent} | ")
            out.append(_nullable(variant, schema_to_typescript(variant, indent + "   ")))
            out.append(_variant_comments(variant, i == 0 and above, desc_str, enum_raw=True))
            out.append("\n")
        out.append(f"{indent},\n")
        return "".join(out)
    out.append(f"{indent}{key}{mark}: ")
    out.append(_nullable(val, schema_to_typescript(val, indent + "    ")))
    out.append(",")
    if not has_one_of and isinstance(val, dict) and "default" in val:
        out.append(f" // default: {_default_text(val, val['default'])}")
    out.append("\n")
    return "".join(out)


def rust_lines(text: str) -> list[str]:
    """Split like Rust's ``str::lines``: on ``\\n`` or ``\\r\\n``, no empty last line."""
    pieces = text.split("\n")
    last = pieces.pop()
    lines = [p[:-1] if p.endswith("\r") else p for p in pieces]
    if last:
        lines.append(last)
    return lines


@dataclass(frozen=True)
class ToolText:
    """One tool as a ``namespace`` block shows it: its ``lines`` (description, then type), and
    the same text as the part its tokens are kept by, after the block's first line (``first``)
    or after another tool (``later``); see ``namespace_parts``."""

    lines: tuple[str, ...]
    first: str
    later: str


#: Tools as TypeScript, by definition: a tool set that is new only in some of its tools
#: pays for those.
TOOL_CACHE: PartsCache[ToolText] = PartsCache(size=4096)


def tool_text(name: str, description: str, parameters: dict[str, Any] | None) -> ToolText:
    """One tool in a ``namespace`` block (cached by its definition).

    >>> tool_text("f", "Says hi.", None).lines
    ('// Says hi.', 'type f = () => any;\\n')
    """

    def build() -> ToolText:
        lines = [f"// {line}" for line in rust_lines(description)]
        if parameters is not None:
            lines.append(f"type {name} = (_: {schema_to_typescript(parameters, '')}) => any;\n")
        else:
            lines.append(f"type {name} = () => any;\n")
        body = "\n".join(lines)[: -len(_TYPE_END)]
        return ToolText(tuple(lines), " {\n\n" + body, _TYPE_END + "\n" + body)

    return TOOL_CACHE.get((name, description, parameters), build)


# Every tool's type ends so; the namespace's parts are cut before its ``;``.
_TYPE_END = ";\n"


def namespace_parts(name: str, description: str | None, tools: Sequence[ToolText]) -> list[str]:
    """A namespace's section (``## name`` on), in parts that encode as the whole does
    (``render.py`` says why each cut is safe): so a new tool set costs only its new tools.

    >>> "".join(namespace_parts("functions", None, [tool_text("f", "", None)]))
    '## functions\\n\\nnamespace functions {\\n\\ntype f = () => any;\\n\\n} // namespace functions'
    """
    head, end = _namespace_frame(name, description, bool(tools))
    if not tools:
        return [head]
    parts = [head, tools[0].first]
    parts += [t.later for t in tools[1:]]
    parts.append(end)
    if not (name[-1:].isascii() and name[-1:].isalnum()):
        parts[:2] = [parts[0] + parts[1]]  # the cut before " {" is safe after a letter or digit only
    return parts


@functools.lru_cache(maxsize=256)
def _namespace_frame(name: str, description: str | None, has_tools: bool) -> tuple[str, str]:
    """A namespace section's text before its first tool (or the whole, without tools), and
    after its last."""
    lines = [f"## {name}\n"]
    if description is not None:
        lines += [f"// {line}" if has_tools else line for line in rust_lines(description)]
    if has_tools:
        lines.append(f"namespace {name}")
    return "\n".join(lines), f"{_TYPE_END}\n}} // namespace {name}"


def tools_section_parts(namespaces: dict[str, Any]) -> list[str]:
    """The ``# Tools`` section for a map of namespace name -> ToolNamespaceConfig, in parts
    (``namespace_parts``)."""
    # The reference keeps namespaces in a BTreeMap: sorted by key.
    return section_parts([namespace_parts(ns.name, ns.description,
                                          [tool_text(t.name, t.description, t.parameters) for t in ns.tools])
                          for ns in (namespaces[key] for key in sorted(namespaces))])


def section_parts(namespaces: Sequence[list[str]]) -> list[str]:
    """The ``# Tools`` section of namespaces given in parts (``namespace_parts``), in parts."""
    parts = ["# Tools"]
    for first, *rest in namespaces:
        parts[-1] += "\n\n" + first
        parts += rest
    return parts


def tools_section(namespaces: dict[str, Any]) -> str:
    """The ``# Tools`` section for a map of namespace name -> ToolNamespaceConfig."""
    return "".join(tools_section_parts(namespaces))
