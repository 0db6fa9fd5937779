"""Embeddings on `localllm serve`: OpenAI's /v1/embeddings through the `openai` package and Ollama's
/api/embed through the `ollama` package, on the tiny models of tests/tiny_encoders.py; expected vectors
are llama.cpp's (tests/data/llamacpp_embeddings.npz), L2-normalised."""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import ollama
import openai
import pytest

import localllm
from localllm.server import BackgroundServer, ServeOptions
from tiny_encoders import EMBED_TEXTS, embed_model

DATA = Path(__file__).resolve().parent.parent / "data" / "llamacpp_embeddings.npz"
MIN_COSINE = 0.9999


def expected(name: str) -> np.ndarray:
    """llama.cpp's vectors of EMBED_TEXTS for a tiny model (the last token's for the decoder without a
    pooling type), normalised."""
    recorded = np.load(DATA)
    rows = recorded[f"embd_{name}_F32"].astype(np.float64)
    if rows.shape[0] != len(EMBED_TEXTS):
        rows = rows[np.cumsum(recorded[f"lengths_{name}"]) - 1]
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def close(got, want) -> bool:
    got = np.asarray(got, dtype=np.float64)
    cos = np.sum(got * want, axis=-1) / np.linalg.norm(got, axis=-1)
    return bool(np.all(cos >= MIN_COSINE)) and np.allclose(np.linalg.norm(got, axis=-1), 1.0, atol=1e-5)


@pytest.fixture(scope="module")
def bert_server(tmp_path_factory):
    path = embed_model(tmp_path_factory.mktemp("embed-server"), "bert", "F32")
    with localllm.load(str(path), threads=2) as model:
        with BackgroundServer(model, ServeOptions(port=0, parallel=2, cache_mb=4), model_id="tiny-bert") as srv:
            yield srv


@pytest.fixture(scope="module")
def oai(bert_server):
    return openai.OpenAI(base_url=bert_server.base_url + "/v1", api_key="none")


def test_openai_client_gets_llamacpps_vectors(oai):
    """The openai package asks for base64 by default and decodes it; a list gives one vector per text, in
    order, with the tokens counted."""
    result = oai.embeddings.create(model="tiny-bert", input=list(EMBED_TEXTS))
    assert [d.index for d in result.data] == list(range(len(EMBED_TEXTS)))
    assert close([d.embedding for d in result.data], expected("bert"))
    assert result.model == "tiny-bert" and result.object == "list"
    assert result.usage.prompt_tokens == result.usage.total_tokens > len(EMBED_TEXTS)
    one = oai.embeddings.create(model="tiny-bert", input=EMBED_TEXTS[1], encoding_format="float")
    assert len(one.data) == 1 and close(one.data[0].embedding, expected("bert")[1])


def test_base64_is_little_endian_float32(bert_server):
    body = {"model": "tiny-bert", "input": EMBED_TEXTS[0], "encoding_format": "base64"}
    reply = httpx.post(bert_server.base_url + "/v1/embeddings", json=body, timeout=60).json()
    vector = np.frombuffer(base64.b64decode(reply["data"][0]["embedding"]), dtype="<f4")
    assert vector.shape == (256,) and close(vector, expected("bert")[0])
    floats = httpx.post(bert_server.base_url + "/v1/embeddings", json={**body, "encoding_format": "float"}, timeout=60).json()
    assert np.array_equal(np.array(floats["data"][0]["embedding"], dtype=np.float32), vector)


def test_token_ids_and_dimensions(oai, bert_server):
    with localllm.load(str(Path(bert_server.engine.model.path)), threads=2) as model:
        ids = [model.tokenize(text) for text in EMBED_TEXTS[:2]]
    by_ids = oai.embeddings.create(model="tiny-bert", input=ids, encoding_format="float")
    assert close([d.embedding for d in by_ids.data], expected("bert")[:2])
    assert by_ids.usage.prompt_tokens == sum(map(len, ids))
    single = oai.embeddings.create(model="tiny-bert", input=ids[0], encoding_format="float")
    assert np.array_equal(single.data[0].embedding, by_ids.data[0].embedding)
    cut = oai.embeddings.create(model="tiny-bert", input=EMBED_TEXTS[0], dimensions=64, encoding_format="float")
    want = expected("bert")[0][:64]
    assert close(cut.data[0].embedding, want / np.linalg.norm(want))


@pytest.mark.parametrize("body,param", [
    ({"input": 3}, "input"),
    ({"input": []}, "input"),
    ({"input": ["a", [1, 2]]}, "input"),
    ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "a", "dimensions": 0}, None),
    ({"input": "a", "dimensions": 257}, None),
    ({"input": "a", "dimensions": "64"}, "dimensions"),
    ({"input": [[101, 10**6]]}, None),
])
def test_bad_requests_are_400_in_openais_shape(bert_server, body, param):
    reply = httpx.post(bert_server.base_url + "/v1/embeddings", json={"model": "tiny-bert", **body}, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"] and error["param"] == param


def test_too_long_unknown_model_and_generation(oai, bert_server):
    with pytest.raises(openai.APIStatusError) as err:
        oai.embeddings.create(model="tiny-bert", input="fox " * 500)
    assert err.value.status_code == 413 and "context" in str(err.value)
    with pytest.raises(openai.NotFoundError):
        oai.embeddings.create(model="another", input="a")
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        oai.completions.create(model="tiny-bert", prompt="the fox", max_tokens=2)


def test_ollama_embed(bert_server):
    client = ollama.Client(host=bert_server.base_url)
    result = client.embed(model="tiny-bert", input=list(EMBED_TEXTS))
    assert result.model == "tiny-bert" and close(result.embeddings, expected("bert"))
    assert result.prompt_eval_count > len(EMBED_TEXTS) and result.total_duration > 0
    single = client.embed(model="tiny-bert:latest", input=EMBED_TEXTS[2])
    assert len(single.embeddings) == 1 and close(single.embeddings[0], expected("bert")[2])
    assert client.embed(model="tiny-bert", input=[]).embeddings == []  # Ollama's load request
    long = client.embed(model="tiny-bert", input="fox " * 500)  # truncated by default, as Ollama does
    assert len(long.embeddings[0]) == 256 and long.prompt_eval_count == 128
    with pytest.raises(ollama.ResponseError) as err:
        client.embed(model="tiny-bert", input="fox " * 500, truncate=False)
    assert err.value.status_code == 413
    reply = httpx.post(bert_server.base_url + "/api/embed", json={"model": "tiny-bert", "input": [1, 2]}, timeout=60)
    assert reply.status_code == 400 and "'input'" in reply.json()["error"]  # the package refuses to send it


def test_a_decoder_embeds_while_it_generates(tmp_path):
    """A decoder used as an embedder (Qwen3 with last-token pooling): llama.cpp's vectors, while greedy
    completions stream on the same server and give the tokens they give alone."""
    path = embed_model(tmp_path, "qwen3-last", "F32")
    prompts = ["the quick brown fox", "a b c d e f"]
    with localllm.load(str(path), n_ctx=128, threads=2) as model:
        alone = ["".join(e.text for e in model.generate(p, max_tokens=12, temperature=0, session=model.new_session())
                         if e.kind == "token") for p in prompts]
        with BackgroundServer(model, ServeOptions(port=0, parallel=2, cache_mb=4), model_id="tiny-qwen") as srv:
            oai = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none")
            client = ollama.Client(host=srv.base_url)

            def complete(prompt):
                return oai.completions.create(model="tiny-qwen", prompt=prompt, max_tokens=12, temperature=0).choices[0].text

            def embed(_):
                return client.embed(model="tiny-qwen", input=list(EMBED_TEXTS)).embeddings

            with ThreadPoolExecutor(4) as pool:
                texts = pool.map(complete, prompts)
                vectors = list(pool.map(embed, range(2)))
            assert list(texts) == alone and all(alone)
    assert all(close(v, expected("qwen3-last")) for v in vectors)
