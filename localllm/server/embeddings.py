"""Embeddings over HTTP: OpenAI's POST /v1/embeddings, and the work behind Ollama's POST /api/embed
(ollama.py answers it in Ollama's shape).

The texts are tokenized on a preparation thread (prepare.py); each input's forward pass then runs on the
engine's thread as one job between two generation steps (Engine.call), so embeddings never share the
model with a step, and sequences being generated go on stepping between the inputs of a long batch. The
vectors are Model.embed's (localllm/embeddings.py): pooled as the file says, L2-normalised.

/v1/embeddings: `input` a string, a list of strings, a list of token ids or a list of such lists (at most
MAX_INPUTS); `encoding_format` "float" (JSON numbers) or "base64" (each vector's little-endian float32
bytes, base64-encoded: what the openai package asks for by default, and decodes); `dimensions` cuts the
vectors to their first values and normalises them again (1..n_embd); `user` is accepted and ignored. An
input longer than the context is refused (413, context_length_exceeded), as OpenAI refuses it.
"""

from __future__ import annotations

import asyncio
import base64
import functools
from typing import Optional

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..embeddings import Embeddings, check_dimensions, embed_tokens, input_tokens, resolve_pooling
from ..errors import ContextOverflow
from . import protocol as p

MAX_INPUTS = 2048  # OpenAI's limit on the inputs of one request
ENCODINGS = ("float", "base64")


def routes(api) -> list:
    """The OpenAI route, answered by `api` (app._API: its engine, model, preparation and errors)."""
    return [Route("/v1/embeddings", functools.partial(openai_embeddings, api), methods=["POST"])]


def openai_inputs(body: dict) -> list:
    """`input` as a list of texts or of token-id lists."""
    value = body.get("input")

    def ids(item) -> bool:
        return isinstance(item, list) and bool(item) and all(isinstance(t, int) and not isinstance(t, bool) for t in item)

    if isinstance(value, str):
        inputs = [value]
    elif ids(value):
        inputs = [value]
    elif isinstance(value, list) and value and (all(isinstance(v, str) for v in value) or all(ids(v) for v in value)):
        inputs = value
    else:
        raise p.invalid("'input' must be a string, a list of strings, a list of token ids or a list of lists of "
                        "token ids (none empty)", "input")
    if len(inputs) > MAX_INPUTS:
        raise p.invalid(f"'input' has {len(inputs)} entries; at most {MAX_INPUTS} per request", "input")
    return inputs


def dimensions_of(body: dict) -> Optional[int]:
    value = body.get("dimensions")
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise p.invalid(f"'dimensions' must be an integer, not {p._quoted(value)}", "dimensions")
    return value


async def compute(api, inputs: list, truncate: bool = False, dimensions: Optional[int] = None) -> Embeddings:
    """The normalised vectors of `inputs` (texts or token-id lists), each on the engine thread."""
    model = api.model
    pooling = resolve_pooling(model.reader)
    check_dimensions(model, dimensions)
    if not truncate:  # text that certainly cannot fit is refused before it is tokenized
        for i, text in enumerate(inputs):
            if isinstance(text, str):
                api.prepare.check(text, "input", f"input {i}")
    try:
        token_lists = await api.prepare.run(input_tokens, model, inputs, truncate)
    except ContextOverflow as exc:
        raise p.APIError(413, str(exc), param="input", code="context_length_exceeded") from None
    loop = asyncio.get_running_loop()
    vectors = [await api.engine.call(functools.partial(embed_tokens, model, ids, pooling, True, dimensions), loop)
               for ids in token_lists]
    return Embeddings(np.stack(vectors), [len(ids) for ids in token_lists], pooling)


def encode(vector: np.ndarray, encoding: str):
    if encoding == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector.tolist()


async def openai_embeddings(api, request: Request) -> Response:
    try:
        api.authorize(request)
        body = await api.body(request)
        remotes = api.routes.find(body.get("model"))
        if remotes:  # a routed model: the remote's answer (server/gateway.py)
            return await api.routes.proxy(remotes, "/embeddings", body)
        model_id = p.check_model(body, api.config.model_ids)
        inputs = openai_inputs(body)
        encoding = body.get("encoding_format") or "float"
        if encoding not in ENCODINGS:
            raise p.invalid(f"'encoding_format' must be 'float' or 'base64', not {p._quoted(encoding)}", "encoding_format")
        if body.get("user") is not None and not isinstance(body.get("user"), str):
            raise p.invalid("'user' must be a string", "user")
        result = await compute(api, inputs, dimensions=dimensions_of(body))
        data = [{"object": "embedding", "index": i, "embedding": encode(v, encoding)} for i, v in enumerate(result.vectors)]
        usage = {"prompt_tokens": result.total_tokens, "total_tokens": result.total_tokens}
        return JSONResponse({"object": "list", "data": data, "model": model_id, "usage": usage})
    except Exception as exc:  # noqa: BLE001 - every failure becomes an HTTP answer (app._handler's mapping)
        error = p.as_api_error(exc)
        headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
        return JSONResponse(error.body(), status_code=error.status, headers=headers)
