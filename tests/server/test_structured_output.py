"""Structured output on `localllm serve`: OpenAI's response_format (json_object, json_schema), llama.cpp's
`grammar` and `json_schema` fields, and Ollama's `format`, driven by the official openai and ollama clients
on the real Gemma 3 270M (a base model: the grammar alone makes its output JSON). The oracle for the
output is `json` and `jsonschema`."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import ollama
import openai
import pytest

import localllm
from localllm.server import BackgroundServer, ServeOptions

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "langs": {"type": "array", "items": {"enum": ["en", "fr", "de"]}, "maxItems": 3},
    },
    "required": ["name", "age", "langs"],
}


@pytest.fixture(scope="module")
def model(gemma_path):
    return localllm.load(gemma_path, n_ctx=1024, threads=2)


@pytest.fixture(scope="module")
def server(model):
    with BackgroundServer(model, ServeOptions(port=0, parallel=4, cache_mb=48), model_id="gemma-test") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def ask(client, response_format=None, content="Describe a person.", **extra):
    kwargs = {"max_tokens": 300, "temperature": 0.7, "seed": 3, **extra}
    if response_format is not None:
        kwargs["response_format"] = response_format
    return client.chat.completions.create(model="gemma-test", messages=[{"role": "user", "content": content}], **kwargs)


def test_json_schema_response_format_gives_valid_json(client):
    reply = ask(client, {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_json_object_response_format_gives_an_object(client):
    reply = ask(client, {"type": "json_object"}, content="Give me a JSON object about cats.")
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_streamed_json_schema_output_is_the_same_json(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    whole = ask(client, fmt, temperature=0).choices[0].message.content
    stream = client.chat.completions.create(model="gemma-test", messages=[{"role": "user", "content": "Describe a person."}],
                                            max_tokens=300, temperature=0, response_format=fmt, stream=True)
    pieces = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert pieces == whole
    jsonschema.validate(json.loads(pieces), PERSON)


def test_llama_cpp_grammar_and_json_schema_fields(client):
    reply = client.completions.create(model="gemma-test", prompt="The answer is", max_tokens=20, temperature=0,
                                      extra_body={"grammar": 'root ::= " " ("yes" | "no") "."'})
    assert reply.choices[0].text in (" yes.", " no.")
    reply = client.completions.create(model="gemma-test", prompt="Numbers:", max_tokens=60, temperature=0.9, seed=1,
                                      extra_body={"json_schema": {"type": "array", "items": {"type": "integer"}, "maxItems": 4}})
    value = json.loads(reply.choices[0].text)
    assert isinstance(value, list) and len(value) <= 4 and all(isinstance(v, int) for v in value)


def test_concurrent_requests_with_different_schemas_each_follow_their_own(client):
    schemas = [PERSON, {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 2},
               {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]},
               {"enum": ["red", "green", "blue"]}]

    def one(schema):
        fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
        return ask(client, fmt).choices[0].message.content

    with ThreadPoolExecutor(len(schemas)) as pool:
        outputs = list(pool.map(one, schemas))
    for schema, text in zip(schemas, outputs):
        jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("response_format,message", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "^a$"}}}, "pattern"),
    ({"type": "yaml"}, "not supported"),
    ({"type": "json_schema"}, "json_schema"),
    ("json", "response_format"),
])
def test_unsupported_formats_are_refused_with_400(client, response_format, message):
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, response_format)
    assert message in str(caught.value)


def test_a_bad_grammar_and_two_constraints_at_once_are_refused(client):
    with pytest.raises(openai.BadRequestError, match="line 1"):
        client.completions.create(model="gemma-test", prompt="x", max_tokens=5, extra_body={"grammar": 'root ::= ("a"'})
    with pytest.raises(openai.BadRequestError, match="only one of"):
        ask(client, {"type": "json_object"}, extra_body={"grammar": 'root ::= "a"'})


def test_ollama_format_schema_and_json(server):
    client = ollama.Client(host=server.base_url)
    reply = client.chat(model="gemma-test", messages=[{"role": "user", "content": "Describe a person."}],
                        format=PERSON, options={"temperature": 0.7, "seed": 5, "num_predict": 300})
    jsonschema.validate(json.loads(reply.message.content), PERSON)
    reply = client.generate(model="gemma-test", prompt="A JSON object about dogs:", format="json",
                            options={"temperature": 0.7, "seed": 5, "num_predict": 300})
    assert reply.done_reason == "stop" and isinstance(json.loads(reply.response), dict)
    with pytest.raises(ollama.ResponseError) as caught:
        client.generate(model="gemma-test", prompt="x", format={"type": "number", "minimum": 0.5})
    assert caught.value.status_code == 400


def test_a_request_whose_grammar_leaves_no_token_fails_alone(server, model):
    """Every token the grammar allows is banned by the request's own logit bias: that request ends with an
    error, and a request beside it in the same batch is answered as usual."""
    import asyncio

    from localllm.engine.batching import GenerationRequest
    from localllm.grammar.trie import token_trie
    from localllm.sampling import SamplingConfig

    only_a = [i for i, piece in enumerate(token_trie(model.tokenizer).pieces) if piece == b"a"]
    assert only_a
    banned = SamplingConfig(grammar='root ::= "a"', logit_bias={i: float("-inf") for i in only_a})
    prompt = model.tokenize("Say a:")

    async def both():
        loop = asyncio.get_running_loop()
        handles = [server.engine.submit(GenerationRequest(prompt=prompt, sampling=s, max_tokens=5), loop)
                   for s in (banned, SamplingConfig(temperature=0))]
        return [[e async for e in h.events()] for h in handles]

    failed, served = asyncio.run(both())
    assert failed[-1].kind == "error" and "banned" in failed[-1].text
    assert served[-1].kind == "done" and served[-1].finish_reason == "length"
