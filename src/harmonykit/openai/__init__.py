"""OpenAI Chat Completions and Responses <-> Harmony, both directions, streaming included.

Plain dicts in and out, no HTTP; importing this does not import the ``openai``
package. Requests become prompts (``render_chat_request``,
``render_responses_request``); engine output tokens become a Chat choice or
Responses output items, at once or as a stream. Every repair is reported in the
``harmony`` extension field (docs/openai.md).
"""

from .chat import ChatCompletionStream, completion_to_chat_choice, completion_to_chat_completion, merge_deltas
from .errors import RequestError, StreamClosed
from .names import ToolNames, identifier
from .request import Prompt, render_chat_request, render_responses_request
from .responses import ResponsesStream, completion_to_response, completion_to_response_output
from .turn import FINISH_REASONS, NOTE_KINDS, Note

__all__ = [
    "FINISH_REASONS",
    "NOTE_KINDS",
    "ChatCompletionStream",
    "Note",
    "Prompt",
    "RequestError",
    "ResponsesStream",
    "StreamClosed",
    "ToolNames",
    "completion_to_chat_choice",
    "completion_to_chat_completion",
    "completion_to_response",
    "completion_to_response_output",
    "identifier",
    "merge_deltas",
    "render_chat_request",
    "render_responses_request",
]
