"""Tool calls on `localllm serve`, with the official openai client (and the ollama one), on the real
Gemma 3 270M: a base model, so its template is the transcript and the tools go through the generic JSON
format, whose grammar makes every call parse. The arguments are checked with `jsonschema`."""

from __future__ import annotations

import json

import jsonschema
import ollama
import openai
import pytest

import localllm
from localllm.server import BackgroundServer, ServeOptions

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                        "unit": {"enum": ["celsius", "fahrenheit"]}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def model(gemma_path):
    return localllm.load(gemma_path, n_ctx=2048, threads=2)


@pytest.fixture(scope="module")
def server(model):
    with BackgroundServer(model, ServeOptions(port=0, parallel=4, cache_mb=64), model_id="gemma-test") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def create(client, messages=QUESTION, **kwargs):
    kwargs = {"max_tokens": 300, "temperature": 0, **kwargs}
    return client.chat.completions.create(model="gemma-test", messages=messages, tools=TOOLS, **kwargs)


def check_calls(calls, names=None):
    assert calls
    for call in calls:
        assert call.type == "function" and call.id
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    if names is not None:
        assert [c.function.name for c in calls] == names


@pytest.mark.parametrize("seed", range(4))
def test_required_gives_calls_whose_arguments_validate(client, seed):
    reply = create(client, tool_choice="required", temperature=0.8, seed=seed)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    check_calls(choice.message.tool_calls)


def test_a_named_function_is_the_one_call(client):
    reply = create(client, tool_choice={"type": "function", "function": {"name": "add"}})
    check_calls(reply.choices[0].message.tool_calls, names=["add"])


def test_parallel_calls_off_gives_one_call(client):
    reply = create(client, tool_choice="required", parallel_tool_calls=False)
    assert len(reply.choices[0].message.tool_calls) == 1


def test_streamed_calls_are_the_same_calls(client):
    whole = create(client, tool_choice="required").choices[0].message.tool_calls
    deltas, finish = [], None
    for chunk in create(client, tool_choice="required", stream=True):
        if chunk.choices:
            deltas += chunk.choices[0].delta.tool_calls or []
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert [(d.index, d.function.name, json.loads(d.function.arguments)) for d in deltas] == \
           [(i, c.function.name, json.loads(c.function.arguments)) for i, c in enumerate(whole)]


def test_a_conversation_with_a_call_and_its_result_is_answered(client):
    call = create(client, tool_choice="required", parallel_tool_calls=False).choices[0].message.tool_calls[0]
    messages = QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "clear"})},
    ]
    reply = create(client, messages=messages, tool_choice="auto")
    choice = reply.choices[0]
    assert choice.finish_reason in ("stop", "tool_calls")
    if choice.finish_reason == "stop":
        assert isinstance(choice.message.content, str) and choice.message.tool_calls is None
    else:
        check_calls(choice.message.tool_calls)


def test_tool_choice_none_is_a_plain_answer(client):
    reply = create(client, tool_choice="none", max_tokens=20)
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("kwargs,message", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not one of"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "together with tools"),
])
def test_unsupported_combinations_are_refused_with_400(client, kwargs, message):
    with pytest.raises(openai.BadRequestError, match=message):
        create(client, **kwargs)


def test_bad_tools_and_choice_without_tools_are_refused(client):
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "string", "pattern": "a+"}}}]
    with pytest.raises(openai.BadRequestError, match="pattern"):
        client.chat.completions.create(model="gemma-test", messages=QUESTION, tools=bad, tool_choice="required")
    with pytest.raises(openai.BadRequestError, match="needs 'tools'"):
        client.chat.completions.create(model="gemma-test", messages=QUESTION, tool_choice="required")


def test_ollama_chat_with_tools(server):
    client = ollama.Client(host=server.base_url)
    reply = client.chat(model="gemma-test", messages=QUESTION, tools=TOOLS, options={"temperature": 0, "num_predict": 300})
    calls = reply.message.tool_calls or []
    for call in calls:  # auto: the model may answer instead, but a call it makes validates
        jsonschema.validate(dict(call.function.arguments), SCHEMAS[call.function.name])
    streamed = list(client.chat(model="gemma-test", messages=QUESTION, tools=TOOLS, stream=True,
                                options={"temperature": 0, "num_predict": 300}))
    streamed_calls = [c for part in streamed for c in (part.message.tool_calls or [])]
    assert [(c.function.name, dict(c.function.arguments)) for c in streamed_calls] == \
           [(c.function.name, dict(c.function.arguments)) for c in calls]
    assert "".join(part.message.content or "" for part in streamed) == (reply.message.content or "")
