"""Training examples and rollouts, one record at a time: Harmony token ids with a loss mask,
and parsed completions, as plain JSON-friendly dicts.

Records are Chat Completions requests plus their answer (``messages`` with
``tool_calls`` and ``reasoning_content``; optional ``tools``,
``reasoning_effort``) or Responses requests (``input`` items); they are read by
the OpenAI mapping's own request conversion, so tools are rendered exactly as a
server would render them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..encoding import HarmonyEncoding
from ..model import Role
from ..openai.errors import RequestError
from ..openai.request import Request, api_of, read_chat_request, read_responses_request
from ..render import drop_boundary
from ..tokens import END, RETURN

IGNORE = -100  # the label of a token that carries no loss
TRAIN_ON = ("last_turn", "all_assistant")
COT = ("inference", "reference")


def _read(encoding: HarmonyEncoding, record: dict[str, Any]) -> Request:
    if not isinstance(record, dict):
        raise RequestError(None, f"a record must be an object, got {type(record).__name__}")
    # A dataset's records rarely share a message: the message cache would only churn.
    if api_of(record) == "responses":
        return read_responses_request(encoding, record, cache=False)
    return read_chat_request(encoding, record, cache=False)


def render_example(encoding: HarmonyEncoding, record: dict[str, Any], *, train_on: str = "last_turn",
                   cot: str = "inference") -> dict[str, Any]:
    """A record as ``input_ids``, ``labels`` (``-100`` where no loss) and ``assistant_mask``.

    ``cot="inference"`` renders what the model sees and writes at inference: the history
    as ``render_conversation_for_completion`` gives it for the last turn, then the last turn
    as generated, its reasoning kept, calls ending in ``<|call|>``, tool results in between,
    the final answer ending in ``<|return|>``. ``cot="reference"`` gives the reference's
    ``render_conversation_for_training`` exactly (which drops every analysis message before
    the first final one, the trained turn's reasoning included).

    ``train_on="last_turn"`` trains the assistant messages after the last user message;
    ``"all_assistant"`` every assistant message rendered. A message's opening
    ``<|start|>assistant`` is trained only where the model writes it (after another
    assistant message), not where the prompt gives it.

    >>> from harmonykit import load_harmony_encoding
    >>> enc = load_harmony_encoding("HarmonyGptOss")
    >>> ex = render_example(enc, {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant",
    ...     "reasoning_content": "Easy.", "content": "4"}]})
    >>> enc.decode([t for t, label in zip(ex["input_ids"], ex["labels"]) if label != -100])
    '<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>'
    """
    if train_on not in TRAIN_ON:
        raise ValueError(f"train_on must be one of {', '.join(TRAIN_ON)}, got {train_on!r}")
    if cot not in COT:
        raise ValueError(f"cot must be one of {', '.join(COT)}, got {cot!r}")
    read = _read(encoding, record)
    roles, channels = read.roles(), read.channels()
    # The turn trained: the messages after the last user message.
    turn = len(roles) - roles[::-1].index("user") if "user" in roles else 0
    if "assistant" not in roles[turn:]:
        raise RequestError("messages" if "messages" in record else "input",
                           "the record has no assistant answer after its last user message to train on")
    # The chain-of-thought rule over the history only (inference) or the whole record
    # (reference); the head (system, developer) takes no part in it.
    ruled = turn if cot == "inference" else len(roles)
    drop = drop_boundary(roles[:ruled], channels[:ruled]) if "final" in channels[:ruled] else 0
    head, flat, spans = read.head.tokens, read.tokens, read.spans
    if "analysis" in channels[:drop]:  # the tokens of the messages kept, and where each starts
        kept: Sequence[int] = [i for i in range(len(roles)) if i >= drop or channels[i] != "analysis"]
        tokens, at = list(head), []
        for i in kept:
            start, end = spans[i]
            at.append(len(tokens))
            tokens += flat[start:end]
    else:
        kept, tokens = range(len(roles)), [*head, *flat]
        at = [len(head) + start for start, _ in spans]
    labels, mask = [IGNORE] * len(tokens), [0] * len(tokens)
    last, previous = len(roles) - 1, -2
    for k, i in enumerate(kept):
        if roles[i] != "assistant":
            continue
        start, end = spans[i]
        begin, end = at[k], at[k] + end - start
        if channels[i] == "final" and (i >= turn if cot == "inference" else i == last) \
                and tokens[end - 1] == END:
            tokens[end - 1] = RETURN  # generation ends there
        # <|start|>assistant is the prompt's where the turn opens, the model's after its own message
        if previous != k - 1:
            begin += 2
        previous = k
        mask[begin:end] = [1] * (end - begin)
        if train_on == "all_assistant" or i >= turn:
            labels[begin:end] = tokens[begin:end]
    return {"input_ids": tokens, "labels": labels, "assistant_mask": mask}


def parse_example(encoding: HarmonyEncoding, completion: str | Sequence[int], *,
                  tools: Sequence[str] | None = None) -> dict[str, Any]:
    """A rollout parsed tolerantly: ``messages``, ``repairs``, ``stop``, ``complete`` (and the
    ``spans`` and ``skipped`` ranges). ``completion`` is token ids, or text with the special
    tokens written out (what follows the prompt's ``<|start|>assistant``).

    >>> from harmonykit import load_harmony_encoding
    >>> enc = load_harmony_encoding("HarmonyGptOss")
    >>> r = parse_example(enc, "<|channel|>final<|message|>4<|return|>")
    >>> r["messages"][0]["content"][0]["text"], r["stop"], r["complete"]
    ('4', 'return', True)
    """
    ids = encoding.encode(completion, allowed_special="all") if isinstance(completion, str) else completion
    return encoding.parse_completion(ids, Role.ASSISTANT, tools=tools).to_dict()
