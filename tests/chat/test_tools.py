"""Tool calling's formats (localllm/chat/tools.py) against the official chat templates of each family
(tests/data/chat_templates, SOURCES.md says where each was read).

The oracle for each format is its own template: the text a template writes for an assistant turn with
tool calls is what the model was trained to write, so parsing that text must give those calls back. The
grammars of `required` and named choices are checked by writing random sentences of them, which must
parse into calls whose arguments validate (`jsonschema`)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import jsonschema
import pytest

from localllm.chat.templates import ChatTemplate
from localllm.chat.tools import ToolCalling, ToolError, detect_format, parse_tool_choice, parse_tools
from localllm.grammar.automaton import DEAD, Automaton
from localllm.grammar.gbnf import parse_gbnf

TEMPLATES = Path(__file__).parent.parent / "data" / "chat_templates"

TOOLS = parse_tools([
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                      "parameters": {"type": "object",
                                                     "properties": {"city": {"type": "string", "maxLength": 12},
                                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "Add numbers",
                                      "parameters": {"type": "object",
                                                     "properties": {"a": {"type": "integer"}, "b": {"type": "number"},
                                                                    "note": {"enum": ["x", "y"]}},
                                                     "required": ["a", "b"]}}},
])
SCHEMAS = {t.name: t.parameters for t in TOOLS}

# template file, the format it writes, the text that ends an assistant turn, whether it takes two calls in one turn
FORMATS = [
    ("qwen2.5.jinja", "hermes", "<|im_end|>", True),
    ("qwen3.jinja", "hermes", "<|im_end|>", True),
    ("qwen3.5.jinja", "qwen-xml", "<|im_end|>", True),
    ("llama3.1.jinja", "llama3", "<|eot_id|>", False),
    ("llama3.2.jinja", "llama3", "<|eot_id|>", False),
    ("mistral-nemo.jinja", "mistral", "</s>", True),
    ("mistral-small-3.2.jinja", "mistral-args", "</s>", True),
    ("ministral-3.jinja", "mistral-args", "</s>", True),
    ("gpt-oss.jinja", "harmony", "<|call|>", False),
    ("gemma4.jinja", "gemma4", "<|tool_response>", True),
    ("gemma3.jinja", "generic", "<end_of_turn>", True),
    ("phi4-mini.jinja", "generic", "<|end|>", True),
]


def template(name: str) -> ChatTemplate:
    return ChatTemplate((TEMPLATES / name).read_text(encoding="utf-8"), "gguf", "<s>", "</s>")


def openai_call(call_id: str, name: str, arguments: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


@pytest.mark.parametrize("name,fmt,end,two", FORMATS)
def test_each_template_is_recognised_and_its_own_tool_calls_parse_back(name, fmt, end, two):
    calling = ToolCalling(template(name), TOOLS, "auto")
    assert calling.format == fmt == detect_format(template(name).source) or fmt == "generic"
    calls = [("Paris", 3), ("Oslo", 1)] if two else [("Paris", 3)]  # (Gemma 4 writes keys sorted: city, days)
    user = [{"role": "user", "content": "Weather in Paris and Oslo?"}]
    assistant = {"role": "assistant", "content": "",
                 "tool_calls": [openai_call(f"call{i:05d}x", "get_weather", {"city": c, "days": d})
                                for i, (c, d) in enumerate(calls)]}
    prompt = calling.render(user)
    whole = calling.render(user + [assistant], add_generation_prompt=False)
    assert "get_weather" in prompt  # the tools are in the prompt
    # what the model writes after the prompt, up to its end-of-turn token (Gemma 4's prompt ends with an
    # empty thought that its history leaves out: the reply starts after the model turn's opening line)
    shared = os.path.commonprefix([prompt, whole])
    if fmt == "gemma4":
        shared = shared[: shared.rindex("<|turn>model\n") + len("<|turn>model\n")]
    assert shared == prompt or fmt == "gemma4"
    reply = whole[len(shared):].split(end)[0]
    content, parsed = calling.parse(reply)
    assert [(c.name, c.arguments) for c in parsed] == [("get_weather", {"city": c, "days": d}) for c, d in calls]
    assert content.strip() in ("", "<think>\n\n</think>", "</think>")


@pytest.mark.parametrize("name,fmt,end,two", FORMATS)
def test_a_conversation_with_calls_and_results_renders(name, fmt, end, two):
    calling = ToolCalling(template(name), TOOLS, "auto")
    messages = [{"role": "user", "content": "What is 2 + 3?"},
                {"role": "assistant", "content": None, "tool_calls": [openai_call("call_abc", "add", {"a": 2, "b": 3})]},
                {"role": "tool", "tool_call_id": "call_abc", "name": "add", "content": "5"}]
    text = calling.render(messages)
    assert "5" in text and text.count("add") >= 2  # the call and its result are both in the prompt


def random_sentence(fsm: Automaton, rng: random.Random, limit: int = 4000) -> str:
    """A sentence of the grammar, drawn byte by byte (printable ASCII preferred, so it stays short)."""
    state, out = fsm.start, bytearray()
    while not (fsm.accepting[state] and (fsm.only_end[state] or rng.random() < 0.5)):
        live = [b for b in range(256) if fsm.step(state, b) != DEAD]
        ascii_live = [b for b in live if 0x20 <= b < 0x7F] if len(out) < limit else []
        byte = rng.choice(ascii_live or live)
        out.append(byte)
        state = fsm.step(state, byte)
    return out.decode("utf-8")


@pytest.mark.parametrize("name,fmt", [(n, f) for n, f, _, _ in FORMATS if f != "generic"] + [("gemma3.jinja", "generic")])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_required_and_named_choices_always_give_calls_that_validate(name, fmt, choice):
    calling = ToolCalling(template(name), TOOLS, parse_tool_choice(choice, TOOLS), parallel=True)
    fsm = Automaton(parse_gbnf(calling.grammar()))
    rng = random.Random(f"{name}{choice}")
    for _ in range(30):
        text = random_sentence(fsm, rng)
        content, calls = calling.parse(text)
        assert calls, text
        if isinstance(choice, dict):
            assert [c.name for c in calls] == ["add"]
        for call in calls:
            jsonschema.validate(call.arguments, SCHEMAS[call.name])


def test_auto_with_a_native_format_decodes_freely_and_plain_text_stays_content():
    calling = ToolCalling(template("qwen2.5.jinja"), TOOLS, "auto")
    assert calling.grammar() is None and calling.special
    assert calling.parse("It is sunny.") == ("It is sunny.", [])
    content, calls = calling.parse('Let me check.\n<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>')
    assert calls == [] and "nope" in content  # an unknown tool is no call


def test_streamed_content_stops_where_a_call_begins():
    stream = ToolCalling(template("qwen2.5.jinja"), TOOLS, "auto").stream()
    sent = "".join(stream.feed(piece) for piece in ["Let me ", "check.<tool", "_call>\n{\"name\": \"add\", ",
                                                    "\"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>"])
    rest, calls = stream.finish()
    assert sent + rest == "Let me check." and [(c.name, c.arguments) for c in calls] == [("add", {"a": 1, "b": 2})]


def test_generic_format_constrains_auto_too_and_reads_the_response():
    calling = ToolCalling(template("gemma3.jinja"), TOOLS, "auto")
    assert calling.format == "generic" and not calling.special
    fsm = Automaton(parse_gbnf(calling.grammar()))
    assert fsm.accepts(b'{"response": "Hello!"}')
    assert fsm.accepts(b'{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2.5}}]}')
    assert not fsm.accepts(b'{"tool_calls": [{"name": "add", "arguments": {"a": 1}}]}')  # b is required
    assert calling.parse('{"response": "Hello!"}') == ("Hello!", [])


def test_gemma4_stops_where_the_tool_response_would_begin():
    assert ToolCalling(template("gemma4.jinja"), TOOLS, "auto").stop == ["<|tool_response>"]
    assert ToolCalling(template("qwen2.5.jinja"), TOOLS, "auto").stop == []


def test_tool_choice_none_renders_no_tools():
    calling = ToolCalling(template("qwen2.5.jinja"), TOOLS, "none")
    assert "get_weather" not in calling.render([{"role": "user", "content": "Hi"}]) and calling.grammar() is None


@pytest.mark.parametrize("tools,choice,message", [
    ([], "auto", "non-empty list"),
    ([{"type": "function", "function": {"name": "bad name!"}}], "auto", "letters"),
    ([{"type": "retrieval"}], "auto", "type"),
    ([{"type": "function", "function": {"name": "f", "parameters": "x"}}], "auto", "parameters"),
    ([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}], "auto", "two tools"),
    ([{"type": "function", "function": {"name": "f"}}], "sometimes", "tool_choice"),
    ([{"type": "function", "function": {"name": "f"}}], {"type": "function", "function": {"name": "g"}}, "not one of"),
])
def test_bad_tools_and_choices_are_refused(tools, choice, message):
    with pytest.raises(ToolError, match=message):
        parse_tool_choice(choice, parse_tools(tools))
