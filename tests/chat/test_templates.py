"""Chat templates: built-ins against the models' official templates, the file-template path, the sandbox.

Oracles:
- tests/data/chat_templates/*.jinja: the official `chat_template` texts from the models' tokenizer_config.json
  (SOURCES.md says where each was read). They are rendered here by a plain jinja2 Environment set up as HF
  transformers sets up its own (trim_blocks, lstrip_blocks, loopcontrols; raise_exception, strftime_now),
  i.e. without any localllm code, and compared with localllm's independently written built-ins.
- llama.cpp's tests/test-chat-template.cpp expected outputs for its six-message conversation (copied
  below as literals), a second, independent statement of several of the formats.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tracemalloc
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
import pytest

from localllm.chat.builtin import BUILTINS, choose_builtin
from localllm.chat import sandbox
from localllm.chat.sandbox import MAX_OUTPUT_CHARS
from localllm.chat.templates import ChatTemplate
from localllm.errors import LocalLLMError, TemplateError

OFFICIAL_DIR = Path(__file__).parents[1] / "data" / "chat_templates"

SYSTEM = {"role": "system", "content": "You are a helpful assistant"}
# The conversation of the brief: system, user, assistant, user.
TWO_TURNS = [
    SYSTEM,
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi there"},
    {"role": "user", "content": "Who are you"},
]
NO_SYSTEM = TWO_TURNS[1:]
# Surrounding whitespace shows which families trim contents and which keep them verbatim.
UNTRIMMED = [
    {"role": "system", "content": "  Be brief.\n"},
    {"role": "user", "content": " Hello\n"},
    {"role": "assistant", "content": "   I am an assistant   "},
    {"role": "user", "content": "Another question"},
]
SINGLE_USER = [{"role": "user", "content": "Grüße, 世界 🌍 — \"quotes\" & <tags>"}]

CONVERSATIONS = {"two_turns": TWO_TURNS, "no_system": NO_SYSTEM, "untrimmed": UNTRIMMED, "single_user": SINGLE_USER}
WITH_SYSTEM = ("two_turns", "untrimmed")
WITHOUT_SYSTEM = ("no_system", "single_user")


def official_render(name: str, messages, add_generation_prompt: bool, bos: str, eos: str, tools=None, **extra) -> str:
    """Render an official template the way HF transformers does, with plain jinja2 (no localllm code)."""

    def raise_exception(message):
        raise ValueError(message)

    def hf_tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # transformers' chat-template tojson: json.dumps without jinja2's HTML escaping or key sorting
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = hf_tojson
    template = env.from_string((OFFICIAL_DIR / name).read_text(encoding="utf-8"))
    return template.render(messages=messages, add_generation_prompt=add_generation_prompt, bos_token=bos, eos_token=eos, tools=tools,
                           **extra)


# (built-in, official file, the BOS and EOS texts of that model family, conversations it is compared on)
PAIRS = [
    ("gemma", "gemma3.jinja", "<bos>", "<eos>", tuple(CONVERSATIONS)),
    ("gemma", "gemma2.jinja", "<bos>", "<eos>", WITHOUT_SYSTEM),  # Gemma 2 refuses a system role
    ("chatml", "chatml.jinja", "", "<|im_end|>", tuple(CONVERSATIONS)),
    ("chatml", "qwen2.5.jinja", "", "<|im_end|>", WITH_SYSTEM),  # Qwen2.5 invents a system prompt when absent
    ("llama3", "llama3.jinja", "<|begin_of_text|>", "<|eot_id|>", tuple(CONVERSATIONS)),
    ("llama2", "llama2.jinja", "<s>", "</s>", tuple(CONVERSATIONS)),
    ("mistral", "mistral.jinja", "<s>", "</s>", tuple(CONVERSATIONS)),
    ("phi3", "phi3.jinja", "<s>", "<|endoftext|>", tuple(CONVERSATIONS)),
    ("zephyr", "zephyr.jinja", "<s>", "</s>", tuple(CONVERSATIONS)),
    ("phi3", "phi3.5.jinja", "<s>", "<|endoftext|>", tuple(CONVERSATIONS)),
    ("gemma4", "gemma4.jinja", "<bos>", "<eos>", tuple(CONVERSATIONS)),
    ("phi4", "phi4.jinja", "<|endoftext|>", "<|im_end|>", tuple(CONVERSATIONS)),
    ("phi4-mini", "phi4-mini.jinja", "<|endoftext|>", "<|endoftext|>", tuple(CONVERSATIONS)),
    # Granite 3.3, Mistral Small 3.2 and Ministral 3 write a default system prompt (with today's date, for
    # Granite) when the conversation has none; the built-ins add none, so they are compared with one.
    ("granite", "granite3.3.jinja", "<|end_of_text|>", "<|end_of_text|>", WITH_SYSTEM),
    ("mistral-v7-tekken", "mistral-small-3.2.jinja", "<s>", "</s>", WITH_SYSTEM),
    ("mistral-v7-tekken", "ministral-3.jinja", "<s>", "</s>", WITH_SYSTEM),
    ("tulu", "olmo2.jinja", "<|endoftext|>", "<|endoftext|>", tuple(CONVERSATIONS)),
]


def pair_cases():
    for builtin, official, bos, eos, conversations in PAIRS:
        for conversation in conversations:
            for gen in (True, False):
                yield pytest.param(builtin, official, bos, eos, conversation, gen, id=f"{builtin}-{official}-{conversation}-gen{int(gen)}")


@pytest.mark.parametrize("builtin,official,bos,eos,conversation,gen", list(pair_cases()))
def test_builtin_renders_what_the_official_template_renders(builtin, official, bos, eos, conversation, gen):
    messages = CONVERSATIONS[conversation]
    expected = official_render(official, messages, gen, bos, eos)
    assert ChatTemplate.builtin(builtin, bos, eos).apply(messages, add_generation_prompt=gen) == expected


def test_every_builtin_is_checked_against_an_official_template():
    assert {pair[0] for pair in PAIRS} == set(BUILTINS)


def test_builtins_use_the_family_bos_and_eos_when_none_is_given():
    # Official Gemma 3 template with its tokenizer's BOS "<bos>", versus our built-in with no tokens given.
    expected = official_render("gemma3.jinja", TWO_TURNS, True, "<bos>", "<eos>")
    assert ChatTemplate.builtin("gemma").apply(TWO_TURNS) == expected
    assert ChatTemplate.builtin("gemma").apply(TWO_TURNS).startswith("<bos><start_of_turn>user\n")


# llama.cpp tests/test-chat-template.cpp: the same six messages rendered by each format, with no BOS.
LLAMA_CPP_CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi there"},
    {"role": "user", "content": "Who are you"},
    {"role": "assistant", "content": "   I am an assistant   "},
    {"role": "user", "content": "Another question"},
]
LLAMA_CPP_EXPECTED = {
    "chatml": "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n<|im_start|>assistant\n",
    "gemma": "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_turn>model\nHi there<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\nI am an assistant<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n<start_of_turn>model\n",
    "llama3": "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    "phi3": "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an assistant   <|end|>\n<|user|>\nAnother question<|end|>\n<|assistant|>\n",
    "mistral": " [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you [/INST]    I am an assistant   </s> [INST] Another question [/INST]",
    # "ibm-granite/granite-3.0-8b-instruct" and "phi-4" in the same file.
    "granite": "<|start_of_role|>system<|end_of_role|>You are a helpful assistant<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Hello<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>Hi there<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Who are you<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>   I am an assistant   <|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Another question<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>",
    "phi4": "<|im_start|>system<|im_sep|>You are a helpful assistant<|im_end|><|im_start|>user<|im_sep|>Hello<|im_end|><|im_start|>assistant<|im_sep|>Hi there<|im_end|><|im_start|>user<|im_sep|>Who are you<|im_end|><|im_start|>assistant<|im_sep|>   I am an assistant   <|im_end|><|im_start|>user<|im_sep|>Another question<|im_end|><|im_start|>assistant<|im_sep|>",
}


@pytest.mark.parametrize("name", sorted(LLAMA_CPP_EXPECTED))
def test_builtin_agrees_with_llama_cpp_expected_output(name):
    template = ChatTemplate.builtin(name, eos_token="</s>")
    rendered = template.apply(LLAMA_CPP_CONVERSATION)
    # llama.cpp renders without a BOS; ours starts with the family's BOS text where the format has one.
    bos = {"chatml": "", "gemma": "<bos>", "llama3": "<|begin_of_text|>", "mistral": "<s>", "phi3": "", "granite": "", "phi4": ""}[name]
    assert rendered == bos + LLAMA_CPP_EXPECTED[name]


def test_gemma_builtin_refuses_non_alternating_roles_like_the_official_one():
    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ValueError):
        official_render("gemma3.jinja", messages, True, "<bos>", "<eos>")
    with pytest.raises(TemplateError, match="alternate"):
        ChatTemplate.builtin("gemma").apply(messages)


# -- the published templates of the newer families, rendered in the sandbox --------------------------------
#
# The templates the GGUF files of Gemma 2, Gemma 4, Phi-3.5, Phi-4, Phi-4-mini, Granite 3.3, SmolLM3, Mistral
# Small 3.2, Ministral 3, OLMo 2, gpt-oss and Qwen3.5 carry (tests/data/chat_templates/SOURCES.md), rendered by localllm's
# sandbox with a system message and tools where the template takes them: the text must be what plain jinja2
# renders (HF's setup), and hold the family's role tags, the tool definitions and the generation prompt.

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                       "required": ["city"]},
    },
}


def _phi4_mini_tools_system():
    # Phi-4-mini reads its tools from the system message's "tools" field, a JSON string.
    return {"role": "system", "content": "You are a helpful assistant", "tools": json.dumps([WEATHER_TOOL["function"]])}


# file: (bos, eos, system message or None, whether `tools=` is used, markers that must appear, generation-prompt ending)
PUBLISHED = {
    "gemma2.jinja": ("<bos>", "<eos>", None, False,
                     ["<bos><start_of_turn>user\nHello<end_of_turn>\n", "<start_of_turn>model\nHi there<end_of_turn>\n"],
                     "<start_of_turn>model\n"),
    "gemma4.jinja": ("<bos>", "<eos>", SYSTEM, True,
                     ["<bos><|turn>system\nYou are a helpful assistant<|tool>declaration:get_weather{description:<|\"|>Get the current weather in a city<|\"|>",
                      "required:[<|\"|>city<|\"|>]", "<|turn>user\nHello<turn|>\n", "<|turn>model\nHi there<turn|>\n"],
                     "<|turn>model\n<|channel>thought\n<channel|>"),
    "phi3.5.jinja": ("<s>", "<|endoftext|>", SYSTEM, False,
                     ["<|system|>\nYou are a helpful assistant<|end|>\n", "<|user|>\nHello<|end|>\n", "<|assistant|>\nHi there<|end|>\n"],
                     "<|assistant|>\n"),
    "phi4.jinja": ("<|endoftext|>", "<|im_end|>", SYSTEM, False,
                   ["<|im_start|>system<|im_sep|>You are a helpful assistant<|im_end|>", "<|im_start|>user<|im_sep|>Hello<|im_end|>"],
                   "<|im_start|>assistant<|im_sep|>"),
    "phi4-mini.jinja": ("<|endoftext|>", "<|endoftext|>", _phi4_mini_tools_system(), False,
                        ["<|system|>You are a helpful assistant<|tool|>" + json.dumps([WEATHER_TOOL["function"]]) + "<|/tool|><|end|>",
                         "<|user|>Hello<|end|>", "<|assistant|>Hi there<|end|>"],
                        "<|assistant|>"),
    "granite3.3.jinja": ("<|end_of_text|>", "<|end_of_text|>", SYSTEM, True,
                         ["<|start_of_role|>system<|end_of_role|>You are a helpful assistant<|end_of_text|>\n",
                          "<|start_of_role|>available_tools<|end_of_role|>" + json.dumps([WEATHER_TOOL], indent=4) + "<|end_of_text|>\n",
                          "<|start_of_role|>user<|end_of_role|>Hello<|end_of_text|>\n"],
                         "<|start_of_role|>assistant<|end_of_role|>"),
    "smollm3.jinja": ("", "<|im_end|>", SYSTEM, False,
                      ["<|im_start|>system\n## Metadata\n", "## Custom Instructions\n\nYou are a helpful assistant\n\n<|im_end|>\n",
                       "<|im_start|>user\nHello<|im_end|>\n"],
                      "<|im_start|>assistant\n"),
    "mistral-small-3.2.jinja": ("<s>", "</s>", SYSTEM, True,
                                ["<s>[SYSTEM_PROMPT]You are a helpful assistant[/SYSTEM_PROMPT][INST]Hello[/INST]Hi there</s>",
                                 "[AVAILABLE_TOOLS]" + json.dumps([WEATHER_TOOL]) + "[/AVAILABLE_TOOLS]"],
                                "[INST]Who are you[/INST]"),
    "ministral-3.jinja": ("<s>", "</s>", SYSTEM, True,
                          ["<s>[SYSTEM_PROMPT]You are a helpful assistant[/SYSTEM_PROMPT]",
                           "[AVAILABLE_TOOLS]" + json.dumps([WEATHER_TOOL]) + "[/AVAILABLE_TOOLS]", "[INST]Hello[/INST]Hi there</s>"],
                          "[INST]Who are you[/INST]"),
    # gpt-oss's "harmony" format: a system message of its own (model identity, today's date, the channels),
    # the conversation's system message as the developer's instructions, the tools as a TypeScript namespace
    "gpt-oss.jinja": ("<|startoftext|>", "<|return|>", SYSTEM, True,
                      ["<|start|>system<|message|>You are ChatGPT", "Calls to these tools must go to the commentary channel",
                       "<|start|>developer<|message|># Instructions\n\nYou are a helpful assistant\n\n# Tools",
                       "type get_weather = (_: {\n// The city\ncity: string,\n}) => any;",
                       "<|start|>user<|message|>Hello<|end|>", "<|start|>assistant<|channel|>final<|message|>Hi there<|end|>"],
                      "<|start|>assistant"),
    # Qwen3.5: ChatML with the tools (as JSON) and their XML call format ahead of the system message, and a
    # generation prompt that opens the thinking block
    "qwen3.5.jinja": ("", "<|im_end|>", SYSTEM, True,
                      ["<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
                       + json.dumps(WEATHER_TOOL) + "\n</tools>", "<tool_call>\n<function=example_function_name>",
                       "You are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n",
                       "<|im_start|>assistant\nHi there<|im_end|>\n"],
                      "<|im_start|>assistant\n<think>\n"),
    "olmo2.jinja": ("<|endoftext|>", "<|endoftext|>", SYSTEM, False,
                    ["<|endoftext|><|system|>\nYou are a helpful assistant\n<|user|>\nHello\n<|assistant|>\nHi there<|endoftext|>\n"],
                    "<|user|>\nWho are you\n<|assistant|>\n"),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_template_renders_in_the_sandbox_like_plain_jinja(name):
    bos, eos, system, uses_tools, markers, prompt_end = PUBLISHED[name]
    messages = ([system] if system else []) + NO_SYSTEM
    tools = [WEATHER_TOOL] if uses_tools else None
    rendered = ChatTemplate((OFFICIAL_DIR / name).read_text(encoding="utf-8"), "gguf", bos, eos).apply(messages, tools=tools)
    assert rendered == official_render(name, messages, True, bos, eos, tools=tools)
    for marker in markers:
        assert marker in rendered, marker
    assert rendered.endswith(prompt_end)
    assert rendered.count("Who are you") == 1


def test_smollm3_template_takes_enable_thinking():
    source = (OFFICIAL_DIR / "smollm3.jinja").read_text(encoding="utf-8")
    template = ChatTemplate(source, "gguf", "", "<|im_end|>")
    thinking = template.apply(NO_SYSTEM)
    plain = template.apply(NO_SYSTEM, enable_thinking=False)
    assert "Reasoning Mode: /think\n" in thinking and thinking.endswith("<|im_start|>assistant\n")
    assert "Reasoning Mode: /no_think\n" in plain and plain.endswith("<|im_start|>assistant\n<think>\n\n</think>\n")
    assert plain == official_render("smollm3.jinja", NO_SYSTEM, True, "", "<|im_end|>", enable_thinking=False)


# A tool call and its result, as OpenAI-style messages (Mistral's templates insist on 9-character ids).
TOOL_ROUND_TRIP = [
    SYSTEM,
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "abcDEF123", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "18 C, sunny", "tool_call_id": "abcDEF123", "name": "get_weather"},
]


@pytest.mark.parametrize("name, call_marker, result_marker", [
    ("gemma4.jinja", "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>", "<|tool_response>response:get_weather{value:<|\"|>18 C, sunny<|\"|>}"),
    ("mistral-small-3.2.jinja", '[TOOL_CALLS]get_weather[CALL_ID]abcDEF123[ARGS]{"city": "Paris"}</s>',
     "[TOOL_RESULTS]abcDEF123[TOOL_CONTENT]18 C, sunny[/TOOL_RESULTS]"),
    ("ministral-3.jinja", "[TOOL_CALLS]get_weather[ARGS]", "[TOOL_RESULTS]18 C, sunny[/TOOL_RESULTS]"),
    ("gpt-oss.jinja", '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>',
     '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"18 C, sunny"<|end|>'),
])
def test_published_template_renders_a_tool_call_and_its_result(name, call_marker, result_marker):
    bos, eos = PUBLISHED[name][:2]
    rendered = ChatTemplate((OFFICIAL_DIR / name).read_text(encoding="utf-8"), "gguf", bos, eos).apply(TOOL_ROUND_TRIP, tools=[WEATHER_TOOL])
    assert rendered == official_render(name, TOOL_ROUND_TRIP, True, bos, eos, tools=[WEATHER_TOOL])
    assert call_marker in rendered and result_marker in rendered


def test_gemma2_template_refuses_a_system_message_in_the_sandbox_too():
    source = (OFFICIAL_DIR / "gemma2.jinja").read_text(encoding="utf-8")
    with pytest.raises(TemplateError, match="System role not supported"):
        ChatTemplate(source, "gguf", "<bos>", "<eos>").apply(TWO_TURNS)


# -- choosing a template from GGUF metadata ------------------------------------------------------------------


def test_file_template_is_used_and_rendered_like_hf():
    source = (OFFICIAL_DIR / "gemma3.jinja").read_text(encoding="utf-8")
    template = ChatTemplate.from_metadata({"general.architecture": "gemma3", "tokenizer.chat_template": source}, bos_token="<bos>", eos_token="<eos>")
    assert template.name == "gguf" and template.source == source
    for messages in CONVERSATIONS.values():
        assert template.apply(messages) == official_render("gemma3.jinja", messages, True, "<bos>", "<eos>")


def test_file_template_gets_strftime_now_and_tools_none():
    # Llama 3.2's template dates the system prompt with strftime_now("%d %b %Y") and tests `tools is not none`.
    source = (OFFICIAL_DIR / "llama3.2.jinja").read_text(encoding="utf-8")
    template = ChatTemplate.from_metadata({"general.architecture": "llama", "tokenizer.chat_template": source}, bos_token="<|begin_of_text|>")
    rendered = template.apply(TWO_TURNS)
    assert rendered == official_render("llama3.2.jinja", TWO_TURNS, True, "<|begin_of_text|>", "")
    assert f"Today Date: {datetime.now().strftime('%d %b %Y')}\n\nYou are a helpful assistant<|eot_id|>" in rendered


def test_llama32_template_with_tools_matches_plain_jinja():
    # The tools go into the first user message, each dumped with tojson(indent=4).
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"city": {"type": "string"}}}}
    source = (OFFICIAL_DIR / "llama3.2.jinja").read_text(encoding="utf-8")
    rendered = ChatTemplate(source, "gguf", "<|begin_of_text|>").apply(TWO_TURNS, tools=[tool])
    assert rendered == official_render("llama3.2.jinja", TWO_TURNS, True, "<|begin_of_text|>", "", tools=[tool])
    assert json.dumps(tool, indent=4) in rendered


def test_qwen_template_renders_tools_with_hf_tojson():
    # With tools, Qwen2.5's template dumps each with `tojson`; HF's tojson is json.dumps(ensure_ascii=False).
    tool = {"type": "function", "function": {"name": "météo", "parameters": {"b": 1, "a": [True, None]}}}
    template = ChatTemplate((OFFICIAL_DIR / "qwen2.5.jinja").read_text(encoding="utf-8"), "gguf")
    rendered = template.apply(NO_SYSTEM, tools=[tool])
    assert "<tools>\n" + json.dumps(tool, ensure_ascii=False) + "\n</tools>" in rendered


def tokens_with(*specials):
    return ["<pad>", "</s>", "<s>", "hello", *specials]


@pytest.mark.parametrize(
    "meta,expected",
    [
        ({"general.architecture": "gemma3"}, "gemma"),
        ({"general.architecture": "gemma2"}, "gemma"),
        ({"general.architecture": "gemma"}, "gemma"),
        ({"general.architecture": "qwen2"}, "chatml"),
        ({"general.architecture": "qwen3"}, "chatml"),
        ({"general.architecture": "phi3"}, "phi3"),
        ({"general.architecture": "llama", "tokenizer.ggml.tokens": tokens_with("<|start_header_id|>", "<|eot_id|>")}, "llama3"),
        ({"general.architecture": "llama", "tokenizer.ggml.tokens": tokens_with("[INST]", "[/INST]")}, "mistral"),
        ({"general.architecture": "llama", "tokenizer.ggml.tokens": tokens_with("<|im_start|>")}, "chatml"),
        ({"general.architecture": "llama", "tokenizer.ggml.tokens": tokens_with()}, "llama2"),
        ({"general.architecture": "llama", "general.name": "Zephyr 7B Beta", "tokenizer.ggml.tokens": tokens_with()}, "zephyr"),
        ({"general.architecture": "somethingnew", "tokenizer.ggml.tokens": tokens_with("<start_of_turn>")}, "gemma"),
        # The new families: each by the turn tokens its vocabulary has (or its name, for OLMo 2 / Tulu 3).
        ({"general.architecture": "gemma4", "tokenizer.ggml.tokens": tokens_with("<|turn>", "<turn|>")}, "gemma4"),
        ({"general.architecture": "gemma2", "tokenizer.ggml.tokens": tokens_with("<start_of_turn>")}, "gemma"),
        ({"general.architecture": "phi3", "tokenizer.ggml.tokens": tokens_with("<|user|>", "<|end|>", "<|assistant|>")}, "phi3"),
        ({"general.architecture": "phi3", "tokenizer.ggml.tokens": tokens_with("<|im_start|>", "<|im_sep|>")}, "phi4"),
        ({"general.architecture": "phi3", "tokenizer.ggml.tokens": tokens_with("<|user|>", "<|end|>", "<|tool|>")}, "phi4-mini"),
        ({"general.architecture": "granite", "tokenizer.ggml.tokens": tokens_with("<|start_of_role|>")}, "granite"),
        ({"general.architecture": "mistral3", "tokenizer.ggml.tokens": tokens_with("[INST]", "[SYSTEM_PROMPT]")}, "mistral-v7-tekken"),
        ({"general.architecture": "olmo2", "general.name": "OLMo 2 1124 7B Instruct", "tokenizer.ggml.tokens": tokens_with("<|im_start|>")}, "tulu"),
        ({"general.architecture": "olmo2", "general.basename": "OLMo-2-0425", "tokenizer.ggml.tokens": tokens_with()}, "tulu"),
        ({"general.architecture": "llama", "general.name": "Llama 3.1 Tulu 3 8B", "tokenizer.ggml.tokens": tokens_with("<|start_header_id|>")}, "tulu"),
        ({"general.architecture": "olmo3", "general.name": "Olmo 3 7B Instruct", "tokenizer.ggml.tokens": tokens_with("<|im_start|>")}, "chatml"),
        ({"general.architecture": "smollm3", "tokenizer.ggml.tokens": tokens_with("<|im_start|>")}, "chatml"),
        ({"general.architecture": "somethingnew"}, "chatml"),
    ],
)
def test_builtin_choice_from_metadata(meta, expected):
    assert choose_builtin(meta) == expected
    assert ChatTemplate.from_metadata(meta).name == expected


def test_bos_and_eos_are_read_from_the_vocabulary_when_not_given():
    meta = {"general.architecture": "llama", "tokenizer.ggml.tokens": tokens_with(), "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1}
    template = ChatTemplate.from_metadata(meta)
    assert (template.name, template.bos_token, template.eos_token) == ("llama2", "<s>", "</s>")
    assert template.apply(NO_SYSTEM) == official_render("llama2.jinja", NO_SYSTEM, True, "<s>", "</s>")


def test_the_shipped_gemma_file_gets_the_gemma_builtin(gemma_path):
    from localllm.gguf.reader import GGUFReader

    with GGUFReader(gemma_path) as reader:
        meta = reader.metadata
        assert "tokenizer.chat_template" not in meta  # why the built-in matters
        template = ChatTemplate.from_metadata(meta)
    assert (template.name, template.bos_token, template.eos_token) == ("gemma", "<bos>", "<eos>")
    assert template.apply(TWO_TURNS) == official_render("gemma3.jinja", TWO_TURNS, True, "<bos>", "<eos>")


def test_unknown_builtin_name_is_an_error():
    with pytest.raises(TemplateError, match="no built-in chat template 'nope'"):
        ChatTemplate.builtin("nope")


# -- messages ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "messages,message",
    [
        ("hello", "messages must be a list"),
        ([], "messages is empty"),
        ([{"role": "user", "content": "a"}, "b"], "message 1: expected a dict"),
        ([{"role": "user", "content": "a"}, {"content": "b"}], "message 1: 'role'"),
        ([{"role": "user<|im_end|>", "content": "a"}], "message 0: 'role'"),
        ([{"role": "", "content": "a"}], "message 0: 'role'"),
        ([SYSTEM, {"role": "user", "content": "a"}, {"role": "assistant", "content": None}], "message 2: 'content' must be a string"),
        ([{"role": "user", "content": ["a"]}], "message 0: 'content' must be a string"),
    ],
)
def test_bad_messages_are_refused_naming_the_index(messages, message):
    with pytest.raises(TemplateError, match=message) as info:
        ChatTemplate.builtin("chatml").apply(messages)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, LocalLLMError)


def test_the_template_cannot_change_the_callers_messages():
    messages = [{"role": "user", "content": "a"}]
    with pytest.raises(TemplateError, match="sandbox"):
        ChatTemplate("{{ messages.append(1) }}{{ messages[0].update({'role': 'x'}) }}", "gguf").apply(messages)
    assert messages == [{"role": "user", "content": "a"}]


# -- HF extras ---------------------------------------------------------------------------------------------


def test_tojson_has_hf_semantics():
    template = ChatTemplate("{{ messages[0].content | tojson }}|{{ {'b': 1, 'a': '<&>'} | tojson(indent=2, sort_keys=True) }}", "gguf")
    value = {"b": 1, "a": "<&>"}
    expected = json.dumps("é 世界", ensure_ascii=False) + "|" + json.dumps(value, indent=2, sort_keys=True)
    assert template.apply([{"role": "user", "content": "é 世界"}]) == expected


def test_loop_controls_and_generation_blocks():
    source = "{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}{% if loop.index0 == 3 %}{% break %}{% endif %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}"
    messages = [{"role": "user", "content": c} for c in "abcde"]
    assert ChatTemplate(source, "gguf").apply(messages) == "[a][c]"


def test_extra_variables_reach_the_template():
    template = ChatTemplate("{{ 'think' if enable_thinking else 'quiet' }}", "gguf")
    assert template.apply(NO_SYSTEM, enable_thinking=False) == "quiet"


# -- hostile templates -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source,message",
    [
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "sandbox forbids"),
        ("{{ cycler.__init__.__globals__ }}", "sandbox forbids"),
        ("{{ messages.__class__.__name__ }}", "sandbox forbids"),
        ("{% for x in %}{% endfor %}", "syntax error on line 1"),
        ("{% if messages %}\n{{ oops( }}\n{% endif %}", "syntax error on line 2"),
        ("{{ raise_exception('nope') }}", "the template raised an error: nope"),
        ("{{ undefined_thing.attribute }}", "undefined"),
        ("{{ lipsum(1000000) }}", "'lipsum' is undefined"),
        ("{{ 1 / 0 }}", "ZeroDivisionError"),
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursed too deeply"),
        ("{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}", "recursed too deeply"),
    ],
)
def test_hostile_or_broken_templates_raise_template_error(source, message):
    with pytest.raises(TemplateError, match=message) as info:
        ChatTemplate(source, "gguf").apply(TWO_TURNS)
    assert "\n" not in str(info.value)


def test_a_broken_file_template_fails_when_loaded():
    with pytest.raises(TemplateError, match="chat template 'gguf': syntax error"):
        ChatTemplate.from_metadata({"general.architecture": "llama", "tokenizer.chat_template": "{% for %}"})
    with pytest.raises(TemplateError, match="expected a string"):
        ChatTemplate.from_metadata({"general.architecture": "llama", "tokenizer.chat_template": 42})


@pytest.mark.parametrize(
    "source",
    [
        "{% for i in range(10**7) %}xxxxxxxxxx{% endfor %}",  # the sandbox's range limit, or ours
        "{% for i in range(100000) %}{% for j in range(20) %}xxxxxxxxxx{% endfor %}{% endfor %}",  # output cap
        "{{ 'x' * 10**9 }}",
        "{{ [0] * 10**9 }}",
        "{{ 10 ** (10 ** 10) }}",
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
        "{{ 'x' | center(10**9) }}",
        "{{ 'x' | indent(999999999, true) }}",
        "{{ '%0999999999d' | format(1) }}",
        "{{ '%0999999999d' % 1 }}",
        "{{ '{:>999999999}'.format(1) }}",
        "{{ 'x'.ljust(999999999) }}",
        # inputs within the limit whose product is not
        "{% set s = 'x' * 1000000 %}{{ s | replace('', s) }}",
        "{% set s = 'x' * 1000000 %}{{ s.replace('x', s) }}",
        "{{ [('x' * 1000000)] * 1000000 }}",
        "{% set s = 'x' * 400000 %}{{ [s, s, s] }}",
        "{% set s = 'x' * 400000 %}{{ [s, s, s] | string }}",
        "{{ range(100000) | join('x' * 1000000) }}",
        "{{ range(20000) | map('string') | join('x' * 1000) }}",
        "{{ ('x' * 1000).join(range(20000) | map('string')) }}",
        "{{ ('\t' * 1000000).expandtabs(1000000) }}",
        "{{ ('\n' * 1000000) | indent(1000000) }}",
        "{{ ('x' * 1000) | wordwrap(1, wrapstring='y' * 1000000) }}",
        "{{ '{0}{0}{0}{0}'.format('x' * 400000) }}",
        "{{ '%(a)s%(a)s%(a)s' % {'a': 'x' * 400000} }}",
        "{{ range(20000) | list | tojson(indent=100) }}",
    ],
)
def test_runaway_templates_stop_quickly_without_eating_memory(source):
    # Constant expressions may already fail when compiled (jinja2 folds them), others when rendered.
    started = time.perf_counter()
    with pytest.raises(TemplateError, match="exceeded a limit"):
        ChatTemplate(source, "gguf").apply(TWO_TURNS)
    assert time.perf_counter() - started < 1.0
    # Again under tracemalloc (which slows Python down, so not timed): the peak stays near the cap.
    tracemalloc.start()
    try:
        with pytest.raises(TemplateError, match="exceeded a limit"):
            ChatTemplate(source, "gguf").apply(TWO_TURNS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * MAX_OUTPUT_CHARS + (20 << 20)


def test_loops_that_output_nothing_are_stopped_by_the_clock():
    # 10^10 empty iterations: no output, no calls; only the per-line deadline can stop it.
    source = "{% set r = range(100000) %}{% for a in r %}{% for b in r %}{% endfor %}{% endfor %}"
    started = time.perf_counter()
    with pytest.raises(TemplateError, match="longer than"):
        ChatTemplate(source, "gguf").apply(TWO_TURNS)
    assert time.perf_counter() - started < 3.0


def test_output_just_under_the_cap_is_fine():
    source = "{% for i in range(" + str(MAX_OUTPUT_CHARS // 1024 - 1) + ") %}{{ 'x' * 1024 }}{% endfor %}"
    assert len(ChatTemplate(source, "gguf").apply(TWO_TURNS)) == MAX_OUTPUT_CHARS - 1024


def test_long_conversations_get_room_beyond_the_fixed_cap():
    # Three 600,000-character messages: the prompt alone is 1.8 M characters, above MAX_OUTPUT_CHARS, and
    # renders; a template that prints the conversation ten times over still hits the (scaled) limit.
    messages = [{"role": role, "content": letter * 600_000} for role, letter in (("user", "a"), ("assistant", "b"), ("user", "c"))]
    rendered = ChatTemplate.builtin("chatml").apply(messages)
    assert len(rendered) > 3 * 600_000 and rendered.endswith("<|im_start|>assistant\n")
    repeating = "{% for i in range(10) %}{% for m in messages %}{{ m.content }}{% endfor %}{% endfor %}"
    with pytest.raises(TemplateError, match="exceeds"):
        ChatTemplate(repeating, "gguf").apply(messages)


# -- attacks whose cost is in C: str() of containers, joins, formats (issue 25) ------------------------
#
# Each renders in a fresh process (tests/chat/template_attack.py), which reports the render's CPU time and the
# growth of its peak resident memory: the promise is a TemplateError within 1 s of CPU and 100 MB. Compiling
# the source comes before and is timed apart, with a looser bound: it is jinja's parse and Python's compile,
# which grow faster than the source (the 44 kB namespace_5000 takes 1.2-1.8 s on a slow 2-core Zen 3).

_MB_STRING = "{% set s = 'x' * 1000000 %}"


def _namespace_of(count: int) -> str:
    return _MB_STRING + "{% set n = namespace(" + ", ".join(f"a{i}=s" for i in range(count)) + ") %}"


def _largest_namespace() -> str:
    """_namespace_of as many attributes as the source cap (sandbox.MAX_SOURCE_CHARS) lets in: one long
    keyword-argument list is the slowest shape to compile known (2-3 s of CPU at 64 kB on a 2-core Zen 3)."""
    room = sandbox.MAX_SOURCE_CHARS - len(_namespace_of(0) + "{{ n }}")
    used, count = 0, 0  # used: len(", ".join(f"a{i}=s" for i in range(count)))
    while used + (2 if count else 0) + len(f"a{count}=s") <= room:
        used += (2 if count else 0) + len(f"a{count}=s")
        count += 1
    return _namespace_of(count) + "{{ n }}"


def _namespace_set_one_by_one(count: int) -> str:
    return _MB_STRING + "{% set n = namespace() %}" + "".join(f"{{% set n.a{i} = s %}}" for i in range(count))


def _dict_of(count: int) -> str:
    return _MB_STRING + "{% set d = {" + ", ".join(f"'a{i}': s" for i in range(count)) + "} %}"


C_SIDE_ATTACKS = {
    # The issue's: 6 kB of template took 3.6 s and 2 GB (1,000 attributes), 30 s and 4.8 GB (5,000).
    "namespace_1000": _namespace_of(1000) + "{{ n }}",
    "namespace_5000": _namespace_of(5000) + "{{ n }}",
    "namespace_at_the_source_cap": _largest_namespace(),
    "dict_values_view": _dict_of(1000) + "{{ d.values() }}",
    "dict_items_view": _dict_of(1000) + "{{ d.items() }}",
    # Other ways to stringify the namespace.
    "namespace_string_filter": _namespace_of(1000) + "{{ n | string | length }}",
    "namespace_percent": _namespace_of(1000) + "{{ ('%s' % n) | length }}",
    "namespace_format_filter": _namespace_of(1000) + "{{ '%s' | format(n) | length }}",
    "namespace_str_format": _namespace_of(1000) + "{{ '{}'.format(n) | length }}",
    "namespace_in_a_list": _namespace_of(1000) + "{{ [n] }}",
    "namespace_pprint": _namespace_of(1000) + "{{ n | pprint | length }}",
    "namespace_strftime": _namespace_of(1000) + "{{ strftime_now(n) | length }}",
    "namespace_raise": _namespace_of(1000) + "{{ raise_exception(n) }}",
    # Widths that come from the arguments, or are short enough to pass the 7-digit rule.
    "percent_star_widths": "{{ ('%*d' * 200) % ((1000000, 1) * 200) }}",
    "format_widths": "{{ ('{0:>999999}' * 200).format(1) }}",
    "format_map_widths": "{{ ('{a:{w}}' * 200).format_map({'a': 1, 'w': 1000000}) }}",
    # Methods and filters whose output multiplies their inputs.
    "translate": _MB_STRING + "{{ s.translate({120: s}) }}",
    "join_a_string": _MB_STRING + "{{ s.join(s[:1000]) }}",
    "bytes_repeat": "{{ 'x'.encode() * 10 ** 9 }}",
    "empty_slices": "{{ [] | slice(1000000) | list | length }}",
    # Output that goes to a buffer (block set, macro) instead of the render's output.
    "block_set": _MB_STRING + "{% set x %}{% for i in range(1000) %}{{ s }}{% endfor %}{% endset %}{{ x | length }}",
    "macro_output": _MB_STRING + "{% macro m() %}{% for i in range(1000) %}{{ s }}{% endfor %}{% endmacro %}{{ m() | length }}",
    # Many values kept at once, each within the limit.
    "doubling_list_literal": _MB_STRING + "{% set ns = namespace(x=[s]) %}{% for i in range(60) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x == [ns.x[0], ns.x[1]] }}",
    "recursion_holding_values": _MB_STRING + "{% macro f(n, t) %}{% set u = t ~ n %}{{ f(n + 1, u) }}{% endmacro %}{{ f(0, s) }}",
    "many_kept_values": _MB_STRING + "".join(f"{{% set a{i} = s ~ {i} %}}" for i in range(300)),
    "many_kept_wide_values": "{% set s = '\U0001f600' * 1000000 %}" + "".join(f"{{% set a{i} = s ~ {i} %}}" for i in range(300)),
    "many_kept_slices": _MB_STRING + "".join(f"{{% set a{i} = s[{i}:] %}}" for i in range(300)),
    "urlize_target": "{{ ('a.com ' * 100000) | urlize(target='x' * 1000000) }}",
    # A namespace filled one attribute at a time, then stringified by a test, a filter, `~`.
    "namespace_set_one_by_one": _namespace_set_one_by_one(1000) + "{{ n }}",
    "namespace_is_lower": _namespace_set_one_by_one(1000) + "{{ n is lower }}",
    "namespace_escape_filter": _namespace_set_one_by_one(1000) + "{{ n | e | length }}",
    "namespace_concat": _namespace_set_one_by_one(1000) + "{{ (n ~ '') | length }}",
    # Lists of a million small items, from C (split, list) or from a generator (batch).
    "split_into_empty_strings": _MB_STRING + "{{ s.split('x') | length }}",
    "list_of_characters": _MB_STRING + "{{ s | list | length }}",
    "generator_into_a_list": _MB_STRING + "{{ s | batch(1) | list | length }}",
    "generator_into_sort": _MB_STRING + "{{ s | batch(1) | sort | length }}",
    "integer_squaring": "{% set ns = namespace(x=2 ** 2000) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
}


def test_a_source_longer_than_the_cap_is_refused_in_one_line_and_one_at_the_cap_compiles():
    cap = sandbox.MAX_SOURCE_CHARS
    assert ChatTemplate("x" * cap, "gguf").apply([{"role": "user", "content": "hi"}]) == "x" * cap
    with pytest.raises(TemplateError) as refused:
        ChatTemplate("x" * (cap + 1), "gguf")
    assert str(refused.value) == f"chat template 'gguf': {cap + 1:,} characters is more than the {cap:,} allowed"


def _render_in_a_fresh_process(source: str, conversation_kb: int = 0) -> tuple[dict, str]:
    script = Path(__file__).with_name("template_attack.py")
    done = subprocess.run([sys.executable, str(script), str(conversation_kb)], input=source, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout), done.stderr


@pytest.mark.parametrize("name", sorted(C_SIDE_ATTACKS))
def test_values_stringified_in_c_are_bounded_before_they_are_built(name):
    report, stderr = _render_in_a_fresh_process(C_SIDE_ATTACKS[name])
    assert report["error"] is not None and report["error"].startswith("chat template 'gguf': ")
    assert "\n" not in report["error"]
    assert report["cpu_s"] < 1.0
    assert report["compile_s"] < 10.0
    assert report["rss_growth_mb"] < 100
    assert stderr == ""


# Copies of a long conversation kept at once: the room a render gets grows with the conversation (the
# template may repeat it), and was counted at repr size (a string with a newline at 10x its length), then
# multiplied by BUILD_FACTOR: 400 kB of user text let such a template hold 142 MB.
LONG_CONVERSATION_ATTACKS = {
    "kept_copies_of_the_conversation": "{% set s = messages[0].content %}"
    + "".join(f"{{% set a{i} = s ~ {i} %}}" for i in range(300)),
    "kept_copies_in_a_list": "{% set ns = namespace(x=[]) %}{% for i in range(300) %}"
    "{% set ns.x = ns.x + [messages[0].content ~ i] %}{% endfor %}{{ ns.x | length }}",
}


@pytest.mark.parametrize("name", sorted(LONG_CONVERSATION_ATTACKS))
def test_a_long_conversation_does_not_lift_the_memory_bound(name):
    report, stderr = _render_in_a_fresh_process(LONG_CONVERSATION_ATTACKS[name], conversation_kb=400)
    assert report["error"] is not None and report["error"].startswith("chat template 'gguf': ")
    assert report["cpu_s"] < 1.0
    assert report["rss_growth_mb"] < 100
    assert stderr == ""


def test_a_timed_out_render_prints_nothing_on_stderr():
    report, stderr = _render_in_a_fresh_process(
        "{% set r = range(100000) %}{% for a in r %}{% for b in r %}{{ (b ~ '')[:0] }}{% endfor %}{% endfor %}"
    )
    assert "longer than" in report["error"]
    assert stderr == ""


_DEADLINE_AT_EVERY_POINT = """
import sys, types
from localllm.chat import sandbox
from localllm.chat.templates import ChatTemplate
from localllm.errors import TemplateError

# The clock is read at every trace event, and passes the deadline after `cutoff` reads: for each cutoff
# in turn, so that the deadline falls at every point of a render, the output limit's failure included.
sandbox._TRACE_CHECK_EVERY = 1
template = ChatTemplate("{% for i in range(3) %}{{ 'x' * 600000 }}{% endfor %}", "gguf")
for cutoff in range(1, 400):
    reads = iter(range(10**9))
    sandbox.time = types.SimpleNamespace(monotonic=lambda: 0.0 if next(reads) < cutoff else 1e9)
    try:
        template.apply([{"role": "user", "content": "hi"}])
    except TemplateError as exc:
        print(str(exc).split(": ")[-1].split()[0])  # 'rendering' or 'the' (output) or 'a'
"""


def test_a_render_stopped_at_any_point_prints_nothing_on_stderr():
    # Issue 25: "Exception ignored in: <generator object Template.generate ...>" reached stderr when the
    # output limit stopped a render while the deadline tracer, its deadline passed, was still installed.
    done = subprocess.run([sys.executable, "-c", _DEADLINE_AT_EVERY_POINT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(done.stdout.splitlines()) == 399  # every render failed, with a TemplateError
    assert done.stderr == ""


def test_the_render_generator_is_closed_after_the_deadline_tracer_is_removed():
    # A render that fails leaves jinja2's generator suspended; closing it runs the template's cleanup
    # code, which under the deadline tracer (past its deadline) raised again: "Exception ignored in:
    # <generator object Template.generate ...>" on stderr. It must be closed with the tracer gone.
    tracer_at_close = []

    class Template:
        def generate(self, variables):
            try:
                while True:
                    yield "x" * 1000
            finally:
                tracer_at_close.append(sys.gettrace())

    with pytest.raises(sandbox.LimitExceeded, match="output exceeds"):
        sandbox._render_bounded(Template(), {}, room=0)
    assert tracer_at_close == [None]


def test_the_build_budget_does_not_refuse_a_long_real_conversation():
    # 200 turns of 5,000 characters through a template that concatenates and trims every message: about
    # 5 x the conversation built, below BUILD_FACTOR x MAX_OUTPUT_CHARS + ROOM_BUILD_FACTOR x room (room: twice it).
    messages = [{"role": ("user", "assistant")[i % 2], "content": chr(97 + i % 26) * 5000} for i in range(200)]
    source = (
        "{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] | trim"
        " + '<|eot_id|>' }}{% endfor %}{{ messages | tojson | length }}"
    )
    rendered = ChatTemplate(source, "gguf").apply(messages)
    assert rendered.count("<|eot_id|>") == 200 and len(rendered) > 200 * 5000
