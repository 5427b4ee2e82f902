"""The tolerant reading of a header: ``resolve`` runs the recovery rules of ``RULES`` in order.

Each rule is a small named function that reads one thing of the header (its role, its
recipients, ...) or repairs one kind of damage, and declares the repair kinds it may report;
they share the header being read (``Reading``). Registered in order with ``@rule``, as a
linter registers its checks: a new repair is a new rule, not a new branch in a long function.

>>> [r.name for r in RULES][:3]
['role', 'channel_markers', 'channel_without_marker']
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ..model import Role
from ..tokens import CONSTRAIN_MARKER
from .header import (
    DOUBLED_ROLE,
    FOLLOWERS,
    GLUED_CHANNEL,
    KNOWN_CHANNELS,
    ROLES,
    TITLE_WORD,
    Header,
    HeaderText,
    Word,
    header_words,
    is_content_type,
    leftover_text,
    named_nothing,
    repair_channel,
    tool_match,
)
from .result import REPAIR_KINDS, Repair

Field = tuple[str, int, int]  # a value and where it stands in the header text (chars)


@dataclass
class Resolution:
    """A tolerant header reading: the header, free text found in it, and the repairs."""

    header: Header
    leftover: str = ""
    leftover_end: int = 0  # char offset just past the last leftover word
    leftover_start: int = 0
    fields_start: int = 0  # char offset of the first recipient or content type
    repairs: list[Repair] = field(default_factory=list)


@dataclass
class Reading:
    """A header being read: its words, what the rules found so far, and the repairs."""

    ht: HeaderText
    role_hint: Role | None
    default_role: Role
    tools: frozenset[str] | None
    with_body: bool  # the header reached <|message|>
    words: list[Word] = field(default_factory=list)
    channel_values: list[tuple[int, int, str]] = field(default_factory=list)  # after each <|channel|>
    repairs: list[Repair] = field(default_factory=list)
    role: Role = Role.ASSISTANT
    name: str | None = None
    channel_candidates: list[Field] = field(default_factory=list)
    recipients: list[Field] = field(default_factory=list)
    content_types: list[Field] = field(default_factory=list)
    stray_channels: list[Word] = field(default_factory=list)
    had_channel: bool = False  # a channel was named before the stray channel words were read
    channel: str | None = None
    recipient: str | None = None
    content_type: str | None = None
    removed: list[tuple[int, int]] = field(default_factory=list)  # text cut out of the leftover
    rule: Rule | None = None  # the rule running now

    @property
    def text(self) -> str:
        return self.ht.text

    def rep(self, kind: str, start_char: int, end_char: int, detail: str) -> None:
        """Report a repair over the tokens that hold ``text[start_char:end_char]``."""
        assert self.rule is None or kind in self.rule.kinds, f"rule {self.rule.name} reports {kind}"
        start = self.ht.token_at(start_char)
        end = max(self.ht.token_at(max(end_char - 1, start_char)) + 1, start + 1)
        self.repairs.append(Repair(kind, start, min(end, self.ht.end), detail))

    def field_at(self, fields: list[Field], value: str) -> tuple[int, int]:
        return next((s, e) for v, s, e in fields if v == value)


@dataclass(frozen=True)
class Rule:
    """A recovery rule: its name, the repair kinds it may report, and what it does."""

    name: str
    kinds: tuple[str, ...]
    apply: Callable[[Reading], None]


RULES: list[Rule] = []


def rule(*kinds: str) -> Callable[[Callable[[Reading], None]], Callable[[Reading], None]]:
    """Register a rule, run after those registered before it."""
    unknown = [k for k in kinds if k not in REPAIR_KINDS]
    if unknown:
        raise ValueError(f"undocumented repair kinds {unknown}: add them to REPAIR_KINDS")

    def register(fn: Callable[[Reading], None]) -> Callable[[Reading], None]:
        RULES.append(Rule(fn.__name__.lstrip("_"), kinds, fn))
        return fn

    return register


def resolve(
    ht: HeaderText,
    role_hint: Role | None,
    default_role: Role,
    tools: frozenset[str] | None,
    with_body: bool,
) -> Resolution:
    """Read a header tolerantly: never fails, names each repair. ``with_body``: the header
    reached <|message|>."""
    r = Reading(ht, role_hint, default_role, tools, with_body)
    r.words, r.channel_values = header_words(ht.text)
    for each in RULES:
        r.rule = each
        each.apply(r)
    r.rule = None
    leftover, left_start, left_end = leftover_text(r.text, r.removed)
    res = Resolution(Header(r.role, r.name, r.recipient, r.channel, r.content_type), leftover,
                     leftover_start=left_start, leftover_end=left_end, repairs=r.repairs)
    res.fields_start = min([s for _, s, _ in r.recipients + r.content_types], default=len(r.text))
    return res


# -- the rules, in the order they run -------------------------------------------------------


@rule("missing_role", "unknown_role", "doubled_role", "glued_channel")
def _role(r: Reading) -> None:
    """The role: the caller's, or the header's first word (doubled, glued to a channel, a
    tool's dotted name), else the default with a repair."""
    words = r.words
    first = words[0] if words and words[0].section == 0 and words[0].n == 0 else None
    if r.role_hint is not None:
        r.role = r.role_hint
        if first is not None:
            _take_role_word(r, first)
        return
    if first is None:
        r.role = r.default_role
        r.rep("missing_role", 0, 0, f"header has no role; {r.default_role.value} assumed")
        return
    if first.text.startswith(CONSTRAIN_MARKER) and len(first.text) > len(CONSTRAIN_MARKER):
        # <|constrain|> before the role: the marker is junk (set aside by stray_markers with
        # the other markers no field took), the rest may be the role.
        first.start += len(CONSTRAIN_MARKER)
        first.text = first.text[len(CONSTRAIN_MARKER) :]
    exact = ROLES.get(first.text)
    nxt = words[1] if len(words) > 1 and words[1].n == 1 else None
    if exact is not None:
        r.role, first.used = exact, True
    elif _take_role_word(r, first):
        r.role = ROLES[re.match(r"(user|assistant|system|developer)", first.text).group()]  # type: ignore[union-attr]
    elif "<|" not in first.text and ("." in first.text or (nxt is not None and nxt.text.startswith("to="))):
        r.role, r.name, first.used = Role.TOOL, first.text, True
    else:
        r.role = r.default_role
        r.rep("unknown_role", first.start, first.end,
              f"{first.text!r} is not a role; {r.default_role.value} assumed")


def _take_role_word(r: Reading, first: Word) -> bool:
    """Consume the role word (or a doubled or channel-glued form of it)."""
    role = r.role_hint
    if role is not None and first.text == role.value:
        first.used = True
        return True
    m = DOUBLED_ROLE.match(first.text)
    if m and (role is None or m.group(1) == role.value):
        first.used = True
        r.rep("doubled_role", first.start, first.end, f"role word {first.text!r} read as {m.group(1)!r}")
        return True
    m = GLUED_CHANNEL.match(first.text)
    if m and (role is None or first.text.startswith(role.value)):
        first.used = True
        r.channel_candidates.append((m.group(2), first.start, first.end))
        r.rep("glued_channel", first.start, first.end,
              f"{first.text!r} read as role {m.group(1)!r} and channel {m.group(2)!r}")
        return True
    return False


@rule()
def _channel_markers(r: Reading) -> None:
    """The value after each <|channel|> names a channel (chosen by pick_channel)."""
    r.channel_candidates += [(value, start, end) for start, end, value in r.channel_values]


@rule("missing_channel_marker")
def _channel_without_marker(r: Reading) -> None:
    """No <|channel|> at all, but the header opens with a channel name ("commentary to=...")."""
    opening = next((w for w in r.words if not w.used and w.section == 0 and w.n <= 1), None)
    if not r.channel_candidates and opening is not None and opening.text in KNOWN_CHANNELS \
            and (opening.n == 0 or r.words[0].used):
        opening.used = True
        r.channel_candidates.append((opening.text, opening.start, opening.end))
        r.rep("missing_channel_marker", opening.start, opening.end,
              f"channel {opening.text!r} written without <|channel|>")


@rule("recipient_with_spaces")
def _recipients(r: Reading) -> None:
    """Each ``to=NAME`` (or ``to= NAME``), with names of several words when they name a tool."""
    words, text = r.words, r.text
    for i, w in enumerate(words):
        if w.used or not w.text.startswith("to="):
            continue
        w.used = True
        value, end = w.text[3:], w.end
        j = i + 1
        if not value and j < len(words) and not words[j].used and words[j].n == w.n + 1 \
                and words[j].section == w.section \
                and not words[j].text.startswith((CONSTRAIN_MARKER, "to=")):
            value, end = words[j].text, words[j].end
            words[j].used = True
            j += 1
        extra = _spaced_name(words, j, w.section, value, r.tools)
        if extra:
            for k in range(j, j + extra):
                words[k].used = True
            end = words[j + extra - 1].end
            value = " ".join(text[w.start + 3 : end].split())
            r.rep("recipient_with_spaces", w.start, end, f"recipient {value!r} has spaces")
        r.recipients.append((value, w.start, end))


def _spaced_name(words: list[Word], j: int, section: int, value: str, tools: frozenset[str] | None) -> int:
    """How many words after ``to=value`` belong to a recipient name with spaces."""
    run: list[str] = []
    for k in range(j, min(len(words), j + FOLLOWERS)):
        w = words[k]
        if w.used or w.section != section or w.text.startswith(("to=", CONSTRAIN_MARKER)) \
                or w.n != words[j].n + len(run):
            break
        run.append(w.text)
    if tools:
        for n in range(len(run), 0, -1):
            if tool_match(" ".join([value, *run[:n]]), tools):
                return n
        return 0
    if tool_match(value, tools) or "." in value:
        return 0
    n = 0
    for word in run:
        if not TITLE_WORD.match(word):
            break
        n += 1
    return n


@rule("unknown_header_word")
def _constrained_types(r: Reading) -> None:
    """``<|constrain|>TYPE`` (or ``<|constrain|> TYPE``); one with no type is set aside."""
    words = r.words
    for i, w in enumerate(words):
        if w.used or not w.text.startswith(CONSTRAIN_MARKER):
            continue
        w.used = True
        value, end = w.text, w.end
        if value == CONSTRAIN_MARKER and i + 1 < len(words) and not words[i + 1].used \
                and words[i + 1].n == w.n + 1 and words[i + 1].section == w.section \
                and not words[i + 1].text.startswith(CONSTRAIN_MARKER):
            value, end = value + words[i + 1].text, words[i + 1].end
            words[i + 1].used = True
        if repair_channel(value[len(CONSTRAIN_MARKER) :]) is not None:
            # <|constrain|>final: the word is a channel name, read as one; the marker is left to
            # stray_markers, which sets it aside.
            if value == w.text:
                w.text, w.used = value[len(CONSTRAIN_MARKER) :], False
                w.start += len(CONSTRAIN_MARKER)
            else:
                words[i + 1].used = False
            continue
        if value == CONSTRAIN_MARKER or "<|" in value[len(CONSTRAIN_MARKER) :]:
            what = "with no content type" if value == CONSTRAIN_MARKER else f"{value!r} holding markup"
            r.rep("unknown_header_word", w.start, end, f"<|constrain|> {what} set aside")
            continue
        r.content_types.append((value, w.start, end))


@rule()
def _bare_content_type(r: Reading) -> None:
    """A content-type word at the end of a header with a recipient or a channel (``json``)."""
    if not r.with_body or r.content_types:
        return
    rest = [w for w in r.words if not w.used]
    if rest and is_content_type(rest[-1].text) and (r.recipients or rest[-1].section > 0):
        last = rest[-1]
        last.used = True
        r.content_types.append((last.text, last.start, last.end))


@rule()
def _stray_channel_words(r: Reading) -> None:
    """Unknown words that are channel names, bare or with junk around them (``––commentary``,
    ``final final``): the channel when the header names none (judged by repeated_channel_words
    otherwise)."""
    r.had_channel = any(value for value, _, _ in r.channel_candidates)
    if not r.with_body:
        return
    r.stray_channels = [w for w in r.words if not w.used and repair_channel(w.text) is not None]
    for w in r.stray_channels:
        w.used = True
        if not r.had_channel:
            r.channel_candidates.append((w.text, w.start, w.end))


@rule("channel_repaired", "duplicate_channel", "empty_channel")
def _pick_channel(r: Reading) -> None:
    """The last channel named, repaired; an empty one is ``final`` when a body follows."""
    candidates = r.channel_candidates
    if not candidates:
        return
    chosen: str | None = None
    for value, start, end in candidates:
        if not value:
            continue
        fixed = repair_channel(value)
        if fixed is not None and fixed != value:
            r.rep("channel_repaired", start, end, f"channel {value!r} read as {fixed!r}")
        chosen = fixed if fixed is not None else value
    if len(candidates) > 1:
        r.rep("duplicate_channel", candidates[0][1], candidates[-1][2],
              f"{len(candidates)} channels given; {chosen or 'none'!r} kept")
    if chosen is None:
        # <|channel|><|message|> after reasoning is the answer; with no <|message|> at
        # all it is free text, left without a channel.
        chosen = "final" if r.with_body else None
        r.rep("empty_channel", candidates[0][1], candidates[0][2], f"empty channel read as {chosen!r}")
    r.channel = chosen


@rule("channel_repaired", "unknown_header_word")
def _repeated_channel_words(r: Reading) -> None:
    """Stray channel words in a header that named its channel: a repeat of it, or set aside."""
    if not r.had_channel:
        return
    for w in r.stray_channels:
        if repair_channel(w.text) == r.channel:
            r.rep("channel_repaired", w.start, w.end, f"channel {r.channel!r} repeated as {w.text!r}")
        else:
            r.rep("unknown_header_word", w.start, w.end, f"stray channel word {w.text!r} set aside")


@rule("bad_recipient", "duplicate_recipient")
def _pick_recipient(r: Reading) -> None:
    """The last declared tool named, else the last recipient; one naming nothing is dropped."""
    if not r.recipients:
        return
    for value, start, end in r.recipients:
        if named_nothing(value):
            r.rep("bad_recipient", start, end, f"recipient {value!r} names nothing; dropped")
    values = [v for v, _, _ in r.recipients if not named_nothing(v)]
    if not values:
        return
    chosen = next((v for v in reversed(values) if tool_match(v, r.tools)), values[-1])
    if len(r.recipients) > 1:
        r.rep("duplicate_recipient", r.recipients[0][1], r.recipients[-1][2],
              f"{len(r.recipients)} recipients given; {chosen!r} kept")
    r.recipient = chosen


@rule("unknown_header_word")
def _pick_content_type(r: Reading) -> None:
    """The last content type given."""
    types = r.content_types
    r.content_type = types[-1][0] if types else None
    if len(types) > 1:
        r.rep("unknown_header_word", types[0][1], types[-2][2],
              "content type given more than once; the last one was kept")


@rule("self_recipient")
def _self_recipient(r: Reading) -> None:
    """An assistant message addressed ``to=assistant`` is addressed to nobody."""
    if r.recipient is not None and r.role is Role.ASSISTANT and r.recipient == "assistant":
        start, end = r.field_at(r.recipients, r.recipient)
        r.rep("self_recipient", start, end, "assistant message addressed to=assistant; dropped")
        r.recipient = None


@rule("content_type_glued")
def _content_type_glued(r: Reading) -> None:
    """``to=functions.fjson``: a declared tool with its content type glued on."""
    recipient = r.recipient
    if recipient is None or not r.tools or tool_match(recipient, r.tools):
        return
    for suffix in ("json", "code"):
        stem = recipient[: -len(suffix)]
        if recipient.endswith(suffix) and tool_match(stem, r.tools):
            start, end = r.field_at(r.recipients, recipient)
            r.rep("content_type_glued", start, end,
                  f"{recipient!r} read as recipient {stem!r} with content type {suffix!r}")
            r.recipient = stem
            if r.content_type is None:
                r.content_type = suffix
            return


@rule("recipient_without_message", "unknown_header_word")
def _header_without_body(r: Reading) -> None:
    """A header that never reached <|message|> sends nothing: its recipient and content type go."""
    if r.with_body:
        return
    for value, start, end in r.recipients:
        r.rep("recipient_without_message", start, end,
              f"to={value} dropped: the header never reached <|message|>")
    r.recipient = None
    for value, start, end in r.content_types:
        r.rep("unknown_header_word", start, end, f"content type {value!r} dropped with its header")
    r.content_type = None


@rule("unknown_header_word")
def _stray_markers(r: Reading) -> None:
    """A marker token no field took is never text: cut out of the leftover, with a repair."""
    r.removed = [(a, b) for a, b, _ in r.channel_values] + [(w.start, w.end) for w in r.words if w.used]
    for a, b in _uncovered(r.ht.markers(), r.removed):
        r.rep("unknown_header_word", a, b, f"{r.text[a:b]} outside any header field set aside")
        r.removed.append((a, b))


def _uncovered(ranges: list[tuple[int, int]], cover: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ``ranges`` that lie inside none of the ``cover`` ranges (one sweep over both, sorted)."""
    out: list[tuple[int, int]] = []
    cover = sorted(cover)
    k, reach = 0, -1
    for a, b in sorted(ranges):
        while k < len(cover) and cover[k][0] <= a:
            reach = max(reach, cover[k][1])
            k += 1
        if reach < b:
            out.append((a, b))
    return out
