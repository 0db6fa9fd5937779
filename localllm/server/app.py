"""The HTTP API (Starlette): OpenAI's chat/completions/models, Ollama's /api/* (ollama.py), plus /health,
/metrics, /tokenize, /detokenize. Handlers parse and validate (protocol.py), have the prompt rendered and tokenized on a
preparation thread (prepare.py: never on the event loop, and text that cannot fit the context refused
before), submit to the engine and render its events; all generation happens on the engine thread."""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import math
from typing import Callable, Optional

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ..engine.batching import Engine
from . import embeddings, ollama
from . import protocol as p
from .access_log import AccessLog, note_tokens
from .metrics import render_metrics
from .prepare import PromptPreparer

DEFAULT_MAX_BODY_BYTES = 4 * 2**20


class ServerConfig:
    """model_id: the name the server answers with; aliases: other names requests may use for it (any
    case); access_log: called with one line per request (access_log.py), None for no log."""

    def __init__(self, model_id: str, api_key: Optional[str] = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 aliases: tuple = (), access_log: Optional[Callable[[str], None]] = None, routes=None):
        """routes: a gateway.RemoteRoutes, the remote models answered for beside the local one."""
        from .gateway import RemoteRoutes

        self.routes = routes if routes is not None else RemoteRoutes()
        self.model_id = model_id
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.model_ids = [model_id, *[a for a in dict.fromkeys(aliases) if a and a != model_id]]
        self.access_log = access_log


def create_app(engine: Engine, config: ServerConfig):
    """The ASGI app: Starlette's, inside the access log when config.access_log is set."""
    api = _API(engine, config)
    routes = [
        Route("/health", api.health, methods=["GET"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/v1/models/{model:path}", api.model_info, methods=["GET"]),
        Route("/metrics", api.metrics, methods=["GET"]),
        Route("/tokenize", api.tokenize, methods=["POST"]),
        Route("/detokenize", api.detokenize, methods=["POST"]),
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        *embeddings.routes(api),
        *ollama.routes(api),
    ]
    app = Starlette(routes=routes, exception_handlers={404: _not_found, 405: _not_allowed})
    return AccessLog(app, config.access_log) if config.access_log is not None else app


async def _not_found(request: Request, exc) -> Response:
    return _error(p.APIError(404, f"no route {request.url.path}", code="not_found"))


async def _not_allowed(request: Request, exc) -> Response:
    return _error(p.APIError(405, f"{request.method} is not allowed on {request.url.path}", code="method_not_allowed"))


def _error(exc: p.APIError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else {}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(exc.retry_after)
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers or None)


def _handler(method):
    """Map every error a handler raises to OpenAI's shape and status."""

    async def wrapped(self, request: Request) -> Response:
        try:
            self.authorize(request)
            return await method(self, request)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an HTTP answer
            return _error(p.as_api_error(exc))

    wrapped.__name__ = method.__name__
    return wrapped


class _API:
    def __init__(self, engine: Engine, config: ServerConfig):
        self.engine = engine
        self.model = engine.model
        self.tokenizer = engine.tokenizer
        self.config = config
        self.routes = config.routes
        self.prepare = PromptPreparer(self.tokenizer, engine.seq_ctx)

    # -- plumbing -----------------------------------------------------------------------------------------------
    def authorize(self, request: Request) -> None:
        key = self.config.api_key
        if not key or request.url.path == "/health":
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), key.encode()):
            raise p.APIError(401, "missing or invalid API key (send 'Authorization: Bearer <key>')",
                             code="invalid_api_key")

    async def body(self, request: Request) -> dict:
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise p.APIError(413, f"request body over {limit} bytes", code="body_too_large")
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > limit:
                raise p.APIError(413, f"request body over {limit} bytes", code="body_too_large")
        try:
            parsed = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise p.invalid(f"the request body is not valid JSON: {exc}") from None
        except RecursionError:  # arrays or objects nested deeper than Python's parser goes (~1000 levels)
            raise p.invalid("the request body nests arrays or objects too deeply") from None
        return p.require_object(parsed)

    # -- small endpoints ------------------------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    def model_object(self) -> dict:
        # max_model_len: each sequence's context, under vLLM's name (a remote client reads it: remote/model.py)
        return {"id": self.config.model_id, "object": "model", "created": 0, "owned_by": "localllm",
                "max_model_len": int(self.engine.seq_ctx)}

    @_handler
    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self.model_object(), *self.routes.model_objects()]})

    @_handler
    async def model_info(self, request: Request) -> Response:
        """GET /v1/models/{model}: the served model under any of its names, or a routed remote one; 404 for another."""
        name = request.path_params["model"]
        if self.routes.find(name):
            return JSONResponse(next(m for m in self.routes.model_objects() if m["id"].lower() == name.strip().lower()))
        p.check_model({"model": name}, self.config.model_ids)
        return JSONResponse(self.model_object())

    @_handler
    async def metrics(self, request: Request) -> Response:
        return PlainTextResponse(render_metrics(self.engine), media_type="text/plain; version=0.0.4")

    @_handler
    async def tokenize(self, request: Request) -> Response:
        body = await self.body(request)
        content = body.get("content")
        if not isinstance(content, str):
            raise p.invalid("'content' must be a string", "content")
        add_special = p._boolean(body, "add_special", False)
        parse_special = p._boolean(body, "parse_special", True)
        # Bounded as a prompt is: longer text could not be a prompt here, and tokenizing it would hold
        # a preparation thread for many seconds.
        self.prepare.check(content, "content", "the content")
        ids = await self.prepare.run(self._encode, content, add_special, parse_special)
        return JSONResponse({"tokens": ids})

    def _encode(self, content: str, add_special: bool, parse_special: bool) -> list:
        return self.tokenizer.encode(content, add_bos=add_special, parse_special=parse_special)

    @_handler
    async def detokenize(self, request: Request) -> Response:
        body = await self.body(request)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise p.invalid("'tokens' must be a list of token ids", "tokens")
        bad = [t for t in tokens if not 0 <= t < self.tokenizer.vocab_size]
        if bad:
            raise p.invalid(f"token ids out of range: {bad[:5]}", "tokens")
        return JSONResponse({"content": self.tokenizer.decode(tokens)})

    # -- generation -----------------------------------------------------------------------------------------------
    @_handler
    async def chat(self, request: Request) -> Response:
        body = await self.body(request)
        remotes = self.routes.find(body.get("model"))
        if remotes:
            return await self.routes.proxy(remotes, "/chat/completions", body)
        model_id = p.check_model(body, self.config.model_ids)
        messages = p.chat_messages(body)
        top = p.chat_top_logprobs(body)
        stream = p._boolean(body, "stream", False)
        include_usage = p.stream_options(body)
        gen = p.sampling_request(body, [], top)  # every field checked before the prompt is prepared
        self.ignore_eos(body, gen)
        calling = self.tool_calling(body, gen)
        await self.compile_grammar(gen)
        gen.prompt = await self.prepare.run(self._chat_prompt, messages, calling)
        # the template's stop strings, and its repetition penalty unless the request sets one (a base model's
        # transcript: "\nUser:" and 1.1; nothing for a model's own chat format)
        gen.stop = gen.stop + self.model.chat_stop()
        if body.get("repeat_penalty") is None:
            gen.sampling = dataclasses.replace(gen.sampling, repeat_penalty=self.model.chat_repeat_penalty())
        handle = self.engine.submit(gen, asyncio.get_running_loop())
        renderer = _ChatRenderer(self.tokenizer, model_id, len(gen.prompt), top is not None, calling=calling)
        note_tokens(request, renderer)
        if stream:
            return _sse(handle, renderer, include_usage)
        return await _collect(request, handle, renderer)

    def ignore_eos(self, body: dict, gen) -> None:
        """llama.cpp's and vLLM's `ignore_eos`: end-of-generation tokens are never drawn, so the reply runs
        to max_tokens (what a benchmark of a fixed length asks for; `localllm bench` on a remote does)."""
        if p._boolean(body, "ignore_eos", False):
            bias = {**(gen.sampling.logit_bias or {}), **{int(t): -math.inf for t in self.tokenizer.eog_ids}}
            gen.sampling = dataclasses.replace(gen.sampling, logit_bias=bias)

    async def compile_grammar(self, gen) -> None:
        """Compile the request's grammar (and, the first time, the vocabulary's trie: about a second at
        a 262k vocabulary) on a preparation thread, not the event loop: the engine's check then finds
        it cached."""
        if gen.sampling.grammar is not None:
            from ..grammar.constraint import compile_grammar

            await self.prepare.run(compile_grammar, gen.sampling.grammar, self.tokenizer, self.model.decoder.hp.n_vocab,
                                   gen.sampling.special_tokens)

    def tool_calling(self, body: dict, gen):
        """The request's tools (chat/tools.py), or None without any: its grammar and special-token output
        go into `gen`'s sampling. Combinations that cannot be honoured are refused."""
        from ..chat.tools import ToolCalling, ToolError, parse_tool_choice, parse_tools

        tools, choice = body.get("tools"), body.get("tool_choice")
        if tools is None or tools == []:
            if choice not in (None, "none", "auto"):
                raise p.invalid("'tool_choice' needs 'tools'", "tool_choice")
            return None
        try:
            parsed = parse_tools(tools)
            calling = ToolCalling(self.model.chat_template, parsed, parse_tool_choice(choice, parsed),
                                  p._boolean(body, "parallel_tool_calls", True))
            grammar = calling.grammar()
        except ToolError as exc:
            raise p.invalid(str(exc), "tools") from None
        except ValueError as exc:  # GrammarError: a parameter schema the grammar cannot express
            raise p.invalid(f"tools: {exc}", "tools") from None
        if calling.active and gen.sampling.grammar is not None:
            raise p.invalid("'response_format' (or a grammar) together with tools is not supported", "response_format")
        if calling.active:
            gen.sampling = dataclasses.replace(gen.sampling, grammar=grammar, special_tokens=calling.special)
            gen.stop = gen.stop + calling.stop
        return calling

    def _chat_prompt(self, messages: list, calling=None) -> list:
        """On a preparation thread: the template's text (with the tools, if any), refused by its size
        when it cannot fit, then its prompt ids."""
        if calling is None:
            text = self.model.chat_template.apply(messages, add_generation_prompt=True)
        else:
            text = calling.render(messages)
        self.prepare.check(text, "messages", "the rendered conversation")
        return self.model.encode_chat(text)

    @_handler
    async def completions(self, request: Request) -> Response:
        body = await self.body(request)
        remotes = self.routes.find(body.get("model"))
        if remotes:
            return await self.routes.proxy(remotes, "/completions", body)
        model_id = p.check_model(body, self.config.model_ids)
        if p._boolean(body, "echo", False):
            raise p.invalid("'echo' is not supported", "echo")
        if body.get("suffix") is not None:
            raise p.invalid("'suffix' is not supported", "suffix")
        prompt = p.completion_prompt(body)
        top = p.completion_top_logprobs(body)
        stream = p._boolean(body, "stream", False)
        include_usage = p.stream_options(body)
        gen = p.sampling_request(body, [], top)  # every field checked before the prompt is tokenized
        self.ignore_eos(body, gen)
        await self.compile_grammar(gen)
        if isinstance(prompt, str):
            self.prepare.check(prompt, "prompt")
            prompt = await self.prepare.run(self.model.tokenize, prompt)
        gen.prompt = prompt
        handle = self.engine.submit(gen, asyncio.get_running_loop())
        renderer = _CompletionRenderer(self.tokenizer, model_id, len(prompt), top is not None)
        note_tokens(request, renderer)
        if stream:
            return _sse(handle, renderer, include_usage)
        return await _collect(request, handle, renderer)


# -- rendering events ------------------------------------------------------------------------------------------------

class _Renderer:
    id_prefix = ""
    chunk_object = ""  # the "object" of streamed chunks

    def __init__(self, tokenizer, model_id: str, n_prompt: int, logprobs: bool):
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.n_prompt = n_prompt
        self.logprobs = logprobs
        self.id = p.new_id(self.id_prefix)
        self.created = p.now()
        self.pieces: list = []
        self.n_generated = 0

    def envelope(self, obj: str, choices: list) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model_id, "choices": choices}


class _ChatRenderer(_Renderer):
    """Chat answers; with tools (chat/tools.py), content streams until a call may begin, and the calls
    come at the end: one delta each (index, id, type, name and the whole arguments), finish 'tool_calls'."""

    id_prefix = "chatcmpl"
    chunk_object = "chat.completion.chunk"

    def __init__(self, *args, calling=None):
        super().__init__(*args)
        self.entries: list = []
        self.tools = calling.stream() if calling is not None and calling.active else None

    def first_chunk(self) -> Optional[dict]:
        return self.envelope("chat.completion.chunk", [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                         "logprobs": None, "finish_reason": None}])

    def token_chunk(self, event) -> Optional[dict]:
        lp = None
        if self.logprobs and event.token is not None:
            lp = {"content": [p.chat_logprob_entry(self.tokenizer, event)]}
        text = event.text if self.tools is None else self.tools.feed(event.text)
        if not text and lp is None:
            return None
        return self.envelope("chat.completion.chunk", [{"index": 0, "delta": {"content": text}, "logprobs": lp,
                                                         "finish_reason": None}])

    def final_chunks(self, finish: str) -> list:
        chunks = []
        if self.tools is not None:
            rest, calls = self.tools.finish()
            if rest:
                chunks.append(self.envelope("chat.completion.chunk", [{"index": 0, "delta": {"content": rest},
                                                                        "logprobs": None, "finish_reason": None}]))
            for index, call in enumerate(calls):
                delta = {"tool_calls": [{"index": index, **call.as_openai()}]}
                chunks.append(self.envelope("chat.completion.chunk", [{"index": 0, "delta": delta, "logprobs": None,
                                                                        "finish_reason": None}]))
            finish = "tool_calls" if calls else finish
        chunks.append(self.envelope("chat.completion.chunk", [{"index": 0, "delta": {}, "logprobs": None,
                                                                "finish_reason": finish}]))
        return chunks

    def add(self, event) -> None:
        self.pieces.append(event.text)
        if self.logprobs and event.token is not None:
            self.entries.append(p.chat_logprob_entry(self.tokenizer, event))

    def response(self, finish: str, timings) -> dict:
        message = {"role": "assistant", "content": "".join(self.pieces)}
        if self.tools is not None:
            self.tools.feed(message["content"])
            content, calls = self.tools.finish()
            if calls:
                message = {"role": "assistant", "content": content.strip() or None,
                           "tool_calls": [c.as_openai() for c in calls]}
                finish = "tool_calls"
            else:
                message["content"] = content
        choice = {"index": 0, "message": message,
                  "logprobs": {"content": self.entries} if self.logprobs else None, "finish_reason": finish}
        out = self.envelope("chat.completion", [choice])
        out["usage"] = p.usage(timings, self.n_prompt, self.n_generated)
        return out


class _CompletionRenderer(_Renderer):
    id_prefix = "cmpl"
    chunk_object = "text_completion"

    def __init__(self, *args):
        super().__init__(*args)
        self.lp = p.CompletionLogprobs(self.tokenizer)

    def first_chunk(self) -> Optional[dict]:
        return None

    def token_chunk(self, event) -> Optional[dict]:
        lp = self.lp.add(event) if self.logprobs and event.token is not None else None
        if not event.text and lp is None:
            return None
        return self.envelope("text_completion", [{"index": 0, "text": event.text, "logprobs": lp, "finish_reason": None}])

    def final_chunks(self, finish: str) -> list:
        return [self.envelope("text_completion", [{"index": 0, "text": "", "logprobs": None, "finish_reason": finish}])]

    def add(self, event) -> None:
        self.pieces.append(event.text)
        if self.logprobs and event.token is not None:
            self.lp.add(event)

    def response(self, finish: str, timings) -> dict:
        choice = {"index": 0, "text": "".join(self.pieces), "logprobs": self.lp.as_dict() if self.logprobs else None,
                  "finish_reason": finish}
        out = self.envelope("text_completion", [choice])
        out["usage"] = p.usage(timings, self.n_prompt, self.n_generated)
        return out


def _sse(handle, renderer: _Renderer, include_usage: bool) -> StreamingResponse:
    def data(obj) -> str:
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

    async def events():
        finished = False
        try:
            first = renderer.first_chunk()
            if first is not None:
                yield data(first)
            async for event in handle.events():
                if event.kind == "token":
                    renderer.n_generated += event.token is not None
                    chunk = renderer.token_chunk(event)
                    if chunk is not None:
                        yield data(chunk)
                elif event.kind == "error":
                    yield data(p.APIError(500, event.text, type="server_error").body())
                else:
                    for chunk in renderer.final_chunks(event.finish_reason):
                        yield data(chunk)
                    if include_usage:
                        tail = renderer.envelope(renderer.chunk_object, [])
                        tail["usage"] = p.usage(event.timings, renderer.n_prompt, renderer.n_generated)
                        yield data(tail)
            finished = True
            yield "data: [DONE]\n\n"
        finally:
            if not finished:
                handle.cancel()  # the client went away: its slot is freed at the next step

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


async def _collect(request: Request, handle, renderer: _Renderer) -> Response:
    """Gather a whole non-streamed answer, cancelling the request if the client disconnects first."""

    async def gather():
        async for event in handle.events():
            if event.kind == "token":
                renderer.n_generated += event.token is not None
                renderer.add(event)
            elif event.kind == "error":
                return _error(p.APIError(500, event.text, type="server_error"))
            else:
                return JSONResponse(renderer.response(event.finish_reason, event.timings))

    async def disconnected():
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    result = asyncio.ensure_future(gather())
    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({result, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not result.done():
        handle.cancel()
        result.cancel()
        return Response(status_code=499)
    return result.result()
