"""The golden scenarios, written once against a library module (harmonykit or openai_harmony).

Each builder takes the module, so the same scenario renders through both.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

IDENTITY = "You are ChatGPT, a large language model trained by OpenAI."

WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
        "format": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
    },
    "required": ["location"],
}
MULTI_WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "locations": {
            "type": "array",
            "items": {"type": "string"},
            "description": 'List of city and state, e.g. ["San Francisco, CA", "New York, NY"]',
        },
        "format": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
    },
    "required": ["locations"],
}
KITCHENSINK_PARAMS = {
    "description": "params object",
    "type": "object",
    "properties": {
        "string": {"type": "string", "title": "STRING", "description": "A string",
                   "examples": ["hello", "world"]},
        "string_nullable": {"type": "string", "nullable": True, "description": "A nullable string",
                            "default": "the default"},
        "string_enum": {"type": "string", "enum": ["a", "b", "c"]},
        "oneof_string_or_number": {
            "oneOf": [
                {"type": "string", "default": "default_string_in_oneof"},
                {"type": "number", "description": "numbers can happen too"},
            ],
            "description": "a oneof",
            "default": 20,
        },
    },
}
LOOKUP_WEATHER_DESC = (
    "Use this tool to lookup the weather in a given location. Call it with the parameter "
    "'location', can be any textual description of a location."
)

# (golden file, builder(lib) -> (conversation, method, args))
Scenario = Callable[[ModuleType], tuple[Any, str, tuple[Any, ...]]]


def _completion(lib: ModuleType, messages: list[Any], config: Any = None) -> tuple[Any, str, tuple[Any, ...]]:
    return lib.Conversation.from_messages(messages), "render_conversation_for_completion", (
        lib.Role.ASSISTANT, config)


def simple_convo(lib: ModuleType) -> tuple[Any, str, tuple[Any, ...]]:
    return _completion(lib, [
        lib.Message.from_role_and_content(
            lib.Role.SYSTEM, lib.SystemContent.new().with_model_identity(IDENTITY)),
        lib.Message.from_role_and_content(lib.Role.USER, "What is 2 + 2?"),
    ])


def effort(level: str, instructions: bool) -> Scenario:
    def build(lib: ModuleType) -> tuple[Any, str, tuple[Any, ...]]:
        sys = lib.SystemContent.new().with_model_identity(IDENTITY).with_reasoning_effort(
            getattr(lib.ReasoningEffort, level))
        msgs = [lib.Message.from_role_and_content(lib.Role.SYSTEM, sys)]
        if instructions:
            msgs.append(lib.Message.from_role_and_content(
                lib.Role.DEVELOPER,
                lib.DeveloperContent.new().with_instructions("Answer the user's questions like a robot.")))
        msgs.append(lib.Message.from_role_and_content(
            lib.Role.USER, "What is the capital of the largest country in the world?"))
        return _completion(lib, msgs)
    return build


def reasoning_system(level: str, user: str, dates: bool) -> Scenario:
    def build(lib: ModuleType) -> tuple[Any, str, tuple[Any, ...]]:
        sys = lib.SystemContent.new().with_model_identity(IDENTITY).with_reasoning_effort(
            getattr(lib.ReasoningEffort, level))
        if dates:
            sys = sys.with_conversation_start_date("2021-01-01").with_knowledge_cutoff("2021-01")
        sys = sys.with_required_channels(["analysis", "final"])
        return _completion(lib, [lib.Message.from_role_and_content(lib.Role.SYSTEM, sys),
                                 lib.Message.from_role_and_content(lib.Role.USER, user)])
    return build


def functions_with_parameters(lib: ModuleType) -> tuple[Any, str, tuple[Any, ...]]:
    T = lib.ToolDescription
    dev = lib.DeveloperContent.new().with_instructions("Always respond in riddles").with_function_tools([
        T.new("get_location", "Gets the location of the user."),
        T.new("get_current_weather", "Gets the current weather in the provided location.",
              parameters=WEATHER_PARAMS),
        T.new("get_multiple_weathers", "Gets the current weather in the provided list of locations.",
              parameters=MULTI_WEATHER_PARAMS),
        T.new("kitchensink", "A function with various complex schemas.", parameters=KITCHENSINK_PARAMS),
    ])
    sys = lib.SystemContent.new().with_reasoning_effort(lib.ReasoningEffort.HIGH) \
        .with_conversation_start_date("2025-06-28")
    return _completion(lib, [
        lib.Message.from_role_and_content(lib.Role.SYSTEM, sys),
        lib.Message.from_role_and_content(lib.Role.DEVELOPER, dev),
        lib.Message.from_role_and_content(lib.Role.USER, "What is the weather like in SF?"),
    ])


def system_tools(browser: bool, python: bool, function: bool) -> Scenario:
    def build(lib: ModuleType) -> tuple[Any, str, tuple[Any, ...]]:
        sys = lib.SystemContent.new().with_conversation_start_date("2025-06-28")
        if browser:
            sys = sys.with_browser_tool()
        if python:
            sys = sys.with_python_tool()
        msgs = [lib.Message.from_role_and_content(lib.Role.SYSTEM, sys)]
        if function:
            msgs.append(lib.Message.from_role_and_content(
                lib.Role.DEVELOPER, lib.DeveloperContent.new().with_function_tools([
                    lib.ToolDescription.new("lookup_weather", LOOKUP_WEATHER_DESC, parameters={
                        "type": "object", "properties": {"location": {"type": "string"}},
                        "required": ["location"]})])))
        return _completion(lib, msgs)
    return build


def cot(kind: str) -> Scenario:
    def build(lib: ModuleType) -> tuple[Any, str, tuple[Any, ...]]:
        M, R = lib.Message, lib.Role
        if kind == "ongoing":
            msgs = [
                M.from_role_and_content(R.USER, "What is the weather in SF?"),
                M.from_role_and_content(
                    R.ASSISTANT,
                    "User asks: “What is the weather in SF?” We need to use lookup_weather tool.",
                ).with_channel("analysis"),
                M.from_role_and_content(R.ASSISTANT, '{"location": "San Francisco"}')
                .with_channel("commentary").with_recipient("functions.lookup_weather")
                .with_content_type("<|constrain|>json"),
                M.from_author_and_content(lib.Author.new(R.TOOL, "functions.lookup_weather"),
                                          '{"temperature": 20, "description": "sunny"}'),
            ]
            return _completion(lib, msgs, lib.RenderConversationConfig(auto_drop_analysis=True))
        if kind == "between_finals":
            msgs = [
                M.from_role_and_content(R.USER, "What is 2 + 2?"),
                M.from_role_and_content(R.ASSISTANT, "thinking 2+2").with_channel("analysis"),
                M.from_role_and_content(R.ASSISTANT, "4").with_channel("final"),
                M.from_role_and_content(R.USER, "What is 3 + 5?"),
                M.from_role_and_content(R.ASSISTANT, "thinking 3+5").with_channel("analysis"),
                M.from_role_and_content(R.ASSISTANT, "8").with_channel("final"),
            ]
            return lib.Conversation.from_messages(msgs), "render_conversation", (None,)
        thought = (
            "User asks: “What is 2 + 2?” Simple arithmetic. Provide answer."
            if kind == "drop"
            else 'User asks a simple question: "What is 2 + 2?" The answer: 4.'
        )
        msgs = [
            M.from_role_and_content(R.USER, "What is 2 + 2?"),
            M.from_role_and_content(R.ASSISTANT, thought).with_channel("analysis"),
            M.from_role_and_content(R.ASSISTANT, "2 + 2 equals 4.").with_channel("final"),
            M.from_role_and_content(R.USER, "What about 9 / 2?"),
        ]
        return _completion(lib, msgs, lib.RenderConversationConfig(auto_drop_analysis=kind == "drop"))
    return build


SCENARIOS: dict[str, Scenario] = {
    "test_simple_convo.txt": simple_convo,
    "test_simple_convo_low_effort.txt": effort("LOW", True),
    "test_simple_convo_medium_effort.txt": effort("MEDIUM", True),
    "test_simple_convo_high_effort.txt": effort("HIGH", True),
    "test_simple_convo_low_effort_no_instruction.txt": effort("LOW", False),
    "test_simple_convo_medium_effort_no_instruction.txt": effort("MEDIUM", False),
    "test_simple_convo_high_effort_no_instruction.txt": effort("HIGH", False),
    "test_reasoning_system_message.txt": reasoning_system("MEDIUM", "What is 2 + 2?", False),
    "test_reasoning_system_message_no_instruction.txt": reasoning_system(
        "HIGH", "What is the best place to eat candy in the world?", False),
    "test_reasoning_system_message_with_dates.txt": reasoning_system("MEDIUM", "What is 42 * pi?", True),
    "test_render_functions_with_parameters.txt": functions_with_parameters,
    "test_no_tools.txt": system_tools(False, False, False),
    "test_browser_tool_only.txt": system_tools(True, False, False),
    "test_browser_and_python_tool.txt": system_tools(True, True, False),
    "test_browser_and_function_tool.txt": system_tools(True, False, True),
    "test_dropping_cot_by_default.txt": cot("drop"),
    "test_preserve_cot.txt": cot("preserve"),
    "test_does_not_drop_if_ongoing_analysis.txt": cot("ongoing"),
    "test_keep_analysis_between_finals.txt": cot("between_finals"),
}


def render(lib: ModuleType, encoding: Any, scenario: Scenario) -> list[int]:
    convo, method, args = scenario(lib)
    return list(getattr(encoding, method)(convo, *args))
