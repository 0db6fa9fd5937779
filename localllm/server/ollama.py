"""Ollama's API beside OpenAI's, on the same server and engine: /api/version, /api/tags, /api/ps,
/api/show, /api/generate, /api/chat and /api/embed (its work done by server/embeddings.py), as Ollama's
own server answers them (docs/api.md of ollama/ollama; the `ollama` Python package is the tests' client).

Generation streams by default, as Ollama's does: one JSON object a line (NDJSON, `application/x-ndjson`),
each with the text so far's next piece, then a last one with `done: true`, the reason and the timings in
nanoseconds; `"stream": false` gives that last object alone with the whole text. Sampling comes from
`options` (Ollama's names: num_predict, temperature, top_k, top_p, min_p, seed, stop, repeat_penalty,
presence_penalty, frequency_penalty); an option localllm does not apply is ignored, as Ollama ignores
options a runner does not know. `format` ("json", or a JSON schema) constrains the output as
/v1/chat/completions' response_format does, and /api/chat takes `tools` as /v1/chat/completions does with
tool_choice auto (chat/tools.py). What would change the output and is not supported (images, tools on
/api/generate, `suffix`, a custom `template`, `context`) is refused with 400, never ignored.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import time
from datetime import datetime, timezone
from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .. import __version__
from ..model.info import describe
from . import embeddings
from . import protocol as p

# Ollama's option names -> the OpenAI request fields protocol.sampling_request reads
OPTIONS = {"num_predict": "max_tokens", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
           "min_p": "min_p", "seed": "seed", "stop": "stop", "repeat_penalty": "repeat_penalty",
           "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty"}
UNSUPPORTED = ("images", "tools", "suffix", "template", "context")


def routes(api) -> list:
    """The /api routes, answered by `api` (app._API: its engine, model, preparation and errors)."""
    ollama = _Ollama(api)
    return [
        Route("/api/version", ollama.version, methods=["GET"]),
        Route("/api/tags", ollama.tags, methods=["GET"]),
        Route("/api/ps", ollama.ps, methods=["GET"]),
        Route("/api/show", ollama.show, methods=["POST"]),
        Route("/api/generate", ollama.generate, methods=["POST"]),
        Route("/api/chat", ollama.chat, methods=["POST"]),
        Route("/api/pull", ollama.pull, methods=["POST"]),
        Route("/api/embed", ollama.embed, methods=["POST"]),
    ]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def sampling_body(body: dict) -> dict:
    """The OpenAI-shaped fields of an Ollama request's `options` (num_predict -1: no limit)."""
    options = body.get("options") or {}
    if not isinstance(options, dict):
        raise p.invalid("'options' must be an object", "options")
    fields = {OPTIONS[k]: v for k, v in options.items() if k in OPTIONS}
    if fields.get("max_tokens") is not None and isinstance(fields["max_tokens"], int) and fields["max_tokens"] < 0:
        del fields["max_tokens"]
    fmt = body.get("format")
    if fmt == "json":  # Ollama's JSON mode: a JSON object
        fields["json_schema"] = {"type": "object"}
    elif isinstance(fmt, dict):  # structured outputs: a JSON schema
        fields["json_schema"] = fmt
    elif fmt not in (None, ""):
        raise p.invalid("'format' must be \"json\" or a JSON schema object", "format")
    return fields


def refuse_unsupported(body: dict, allowed: tuple = ()) -> None:
    for name in UNSUPPORTED:
        if name in allowed:
            continue
        if body.get(name) not in (None, "", [], {}):
            raise p.invalid(f"'{name}' is not supported by localllm's Ollama API", name)


class _Ollama:
    def __init__(self, api):
        self.api = api
        self.loaded_at = _now()

    # -- models -------------------------------------------------------------------------------------------------
    def details(self) -> dict:
        info = describe(self.api.model.reader)
        billions = info["parameters"] / 1e9
        return {"parent_model": "", "format": "gguf", "family": info["architecture"], "families": [info["architecture"]],
                "parameter_size": f"{billions:.1f}B" if billions >= 1 else f"{info['parameters'] / 1e6:.0f}M",
                "quantization_level": info["file_type"] or ""}

    def model_entry(self) -> dict:
        """One model as /api/tags lists it. The digest stands for the file (its name, size and modification
        time, hashed), not its bytes: hashing gigabytes for a listing would take seconds."""
        path = Path(self.api.model.path)
        stat = path.stat()
        digest = hashlib.sha256(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
        modified = datetime.fromtimestamp(stat.st_mtime, timezone.utc).isoformat().replace("+00:00", "Z")
        name = self.api.config.model_id
        return {"name": name, "model": name, "modified_at": modified, "size": stat.st_size, "digest": digest,
                "details": self.details()}

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": __version__})

    async def tags(self, request: Request) -> Response:
        def listed():
            remotes = [{"name": name, "model": name, "modified_at": self.loaded_at, "size": 0, "digest": "",
                        "details": {"parent_model": "", "format": "remote", "family": "", "families": [],
                                    "parameter_size": "", "quantization_level": ""}} for name in self.api.routes.names]
            return JSONResponse({"models": [self.model_entry(), *remotes]})
        return await self._answer(request, listed)

    async def ps(self, request: Request) -> Response:
        def running():
            entry = self.model_entry()
            entry.update(expires_at="0001-01-01T00:00:00Z", size_vram=0)
            return JSONResponse({"models": [entry]})
        return await self._answer(request, running)

    async def show(self, request: Request) -> Response:
        async def shown():
            body = await self.api.body(request)
            self._check_model(body)
            info = describe(self.api.model.reader)
            model_info = {f"general.{k}": info[k] for k in ("architecture", "name", "parameters") if info[k] is not None}
            template = self.api.model.reader.metadata.get_str("tokenizer.chat_template", "") or ""
            return JSONResponse({"license": "", "modelfile": f"FROM {self.api.model.path}\n", "parameters": "",
                                 "template": template, "details": self.details(), "model_info": model_info,
                                 "modified_at": self.model_entry()["modified_at"]})
        return await self._answer(request, shown)

    # -- generation ---------------------------------------------------------------------------------------------
    async def generate(self, request: Request) -> Response:
        async def generated():
            body = await self.api.body(request)
            if self.api.routes.find(body.get("model")):
                return await self._remote(request, body, "response")
            model_id = self._check_model(body)
            refuse_unsupported(body)
            prompt = body.get("prompt", "")
            system = body.get("system")
            if not isinstance(prompt, str) or (system is not None and not isinstance(system, str)):
                raise p.invalid("'prompt' and 'system' must be strings", "prompt")
            if not prompt:  # Ollama's way to load a model: an empty prompt, answered done at once
                return JSONResponse(self._final(model_id, "load", None, 0, "response"))
            gen = p.sampling_request(sampling_body(body), [], None)
            await self.api.compile_grammar(gen)
            if p._boolean(body, "raw", False):
                self.api.prepare.check(prompt, "prompt")
                gen.prompt = await self.api.prepare.run(self.api.model.tokenize, prompt)
            else:  # the model's chat template, as Ollama applies its template to system and prompt
                messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
                gen.prompt = await self.api.prepare.run(self.api._chat_prompt, messages)
                self._chat_defaults(body, gen)
            return await self._run(request, body, gen, model_id, "response")
        return await self._answer(request, generated)

    async def chat(self, request: Request) -> Response:
        async def chatted():
            body = await self.api.body(request)
            if self.api.routes.find(body.get("model")):
                return await self._remote(request, body, "message")
            model_id = self._check_model(body)
            refuse_unsupported(body, allowed=("tools",))
            for i, message in enumerate(body.get("messages") or []):
                if isinstance(message, dict) and message.get("images"):
                    raise p.invalid(f"messages[{i}]: images are not supported", "messages")
            messages = p.chat_messages(body)
            gen = p.sampling_request(sampling_body(body), [], None)
            calling = self.api.tool_calling({"tools": body.get("tools")}, gen)  # Ollama's choice: always auto
            await self.api.compile_grammar(gen)
            gen.prompt = await self.api.prepare.run(self.api._chat_prompt, messages, calling)
            self._chat_defaults(body, gen)
            return await self._run(request, body, gen, model_id, "message", calling)
        return await self._answer(request, chatted)

    def _chat_defaults(self, body: dict, gen) -> None:
        """A chat turn's stop strings, and its repetition penalty unless the options set one, as
        /v1/chat/completions takes them (a base model's transcript: a stop at a new "User:" line, and 1.1)."""
        gen.stop = gen.stop + self.api.model.chat_stop()
        if (body.get("options") or {}).get("repeat_penalty") is None:
            gen.sampling = dataclasses.replace(gen.sampling, repeat_penalty=self.api.model.chat_repeat_penalty())

    async def _remote(self, request: Request, body: dict, kind: str) -> Response:
        """/api/chat or /api/generate for a routed remote model (server/gateway.py): the request as OpenAI's
        /chat/completions (or /completions for a raw prompt), its events rendered as for a local model."""
        refuse_unsupported(body)
        model_id = body["model"]
        fields = sampling_body(body)
        schema = fields.pop("json_schema", None)
        if schema is not None:
            fields["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
        if kind == "message":
            path, fields["messages"] = "/chat/completions", p.chat_messages(body)
        elif p._boolean(body, "raw", False):
            path, fields["prompt"] = "/completions", body.get("prompt", "")
        else:
            system = body.get("system")
            path = "/chat/completions"
            fields["messages"] = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": body.get("prompt", "")}]
        handle = await self.api.routes.handle(self.api.routes.find(model_id), path, fields)
        return await self._run(request, body, None, model_id, kind, handle=handle)

    async def _run(self, request: Request, body: dict, gen, model_id: str, kind: str, calling=None, handle=None) -> Response:
        """Submit `gen` and answer as NDJSON chunks (the default) or one object (stream false); kind:
        "response" (/api/generate's text field) or "message" (/api/chat's). With tools (`calling`), the
        calls go into the message's tool_calls, as Ollama writes them ({"function": {name, arguments}}).
        `handle`: a remote's (gateway.RemoteHandle) in place of the engine's; its counts are the remote's."""
        started = time.perf_counter_ns()
        if handle is None:
            handle = self.api.engine.submit(gen, asyncio.get_running_loop())
        n_prompt = len(gen.prompt) if gen is not None else None
        tools = calling.stream() if calling is not None and calling.active else None
        if p._boolean(body, "stream", True):
            return self._stream(handle, model_id, kind, n_prompt, started, tools)
        pieces, n_generated = [], 0
        try:
            async for event in handle.events():
                if event.kind == "token":
                    n_generated += event.token is not None
                    pieces.append(event.text)
                elif event.kind == "error":
                    raise p.APIError(500, event.text, type="server_error")
                else:
                    final = self._final(model_id, event.finish_reason, event.timings, started, kind, n_prompt, n_generated)
                    final[kind] = self._piece("".join(pieces), kind)
                    if tools is not None:
                        tools.feed("".join(pieces))
                        content, calls = tools.finish()
                        final[kind] = self._piece(content.strip() if calls else content, kind, calls)
                    return JSONResponse(final)
        finally:
            handle.cancel()  # a no-op once done; frees the slot if the client went away
        raise p.APIError(500, "the generation ended without a result", type="server_error")

    def _stream(self, handle, model_id: str, kind: str, n_prompt: int, started: int, tools=None) -> StreamingResponse:
        def chunk(text: str, calls=()) -> str:
            piece = {"model": model_id, "created_at": _now(), kind: self._piece(text, kind, calls), "done": False}
            return json.dumps(piece, ensure_ascii=False) + "\n"

        async def lines():
            finished, n_generated = False, 0
            try:
                async for event in handle.events():
                    if event.kind == "token":
                        n_generated += event.token is not None
                        text = event.text if tools is None else tools.feed(event.text)
                        if text:
                            yield chunk(text)
                    elif event.kind == "error":
                        yield json.dumps({"error": event.text}) + "\n"
                    else:
                        if tools is not None:
                            rest, calls = tools.finish()
                            if rest or calls:
                                yield chunk(rest, calls)
                        final = self._final(model_id, event.finish_reason, event.timings, started, kind, n_prompt, n_generated)
                        yield json.dumps(final, ensure_ascii=False) + "\n"
                finished = True
            finally:
                if not finished:
                    handle.cancel()
        return StreamingResponse(lines(), media_type="application/x-ndjson")

    @staticmethod
    def _piece(text: str, kind: str, calls=()):
        if kind != "message":
            return text
        message = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = [{"function": {"name": c.name, "arguments": c.arguments}} for c in calls]
        return message

    def _final(self, model_id: str, reason, timings, started: int, kind: str, n_prompt: int = 0, n_generated: int = 0) -> dict:
        """The last object of an answer: done, Ollama's reason ("stop", "length", "load") and timings (ns)."""
        out = {"model": model_id, "created_at": _now(), kind: self._piece("", kind), "done": True,
               "done_reason": reason, "total_duration": time.perf_counter_ns() - started if started else 0,
               "load_duration": 0}
        if timings is not None:
            remote = n_prompt is None  # a remote's answer: its own counts
            out.update(prompt_eval_count=timings.prompt_tokens if remote else n_prompt,
                       prompt_eval_duration=int(timings.prompt_seconds * 1e9),
                       eval_count=timings.generated_tokens if remote else n_generated,
                       eval_duration=int(timings.generation_seconds * 1e9))
        return out

    # -- pulling ------------------------------------------------------------------------------------------------------
    async def pull(self, request: Request) -> Response:
        """/api/pull {model, stream (default true)}: download a model into localllm's store, as `localllm pull`
        does (a registry or Ollama name, or a Hub reference), answering with Ollama's status objects:
        "pulling manifest", "pulling <digest>" with total and completed bytes, "verifying sha256 digest",
        "writing manifest", "success". The server goes on serving the model it was started with; the
        pulled one is there for `localllm run`/`serve`."""
        async def pulled():
            body = await self.api.body(request)
            name = body.get("model") or body.get("name")
            if not isinstance(name, str) or not name.strip():
                raise p.invalid("'model' must be a model name", "model")
            statuses: asyncio.Queue = asyncio.Queue()
            loop = asyncio.get_running_loop()

            def report(status: dict) -> None:
                loop.call_soon_threadsafe(statuses.put_nowait, status)

            task = asyncio.ensure_future(asyncio.to_thread(_pull_model, name.strip(), report))
            if not p._boolean(body, "stream", True):
                try:
                    await task
                except Exception as exc:  # noqa: BLE001 - answered in the API's shape
                    raise _pull_error(exc) from None
                return JSONResponse({"status": "success"})
            return StreamingResponse(_status_lines(task, statuses), media_type="application/x-ndjson")
        return await self._answer(request, pulled)

    # -- embeddings -----------------------------------------------------------------------------------------------
    async def embed(self, request: Request) -> Response:
        """/api/embed: {model, input: text or texts, truncate (default true), dimensions, options, keep_alive}
        -> {model, embeddings, total_duration, load_duration, prompt_eval_count}; vectors L2-normalised, as
        Ollama's. An empty input gives no vectors (Ollama's way to load a model); `options` and
        `keep_alive` change nothing here (one model, always loaded)."""
        async def embedded():
            started = time.perf_counter_ns()
            body = await self.api.body(request)
            model_id = self._check_model(body)
            value = body.get("input")
            texts = [value] if isinstance(value, str) and value else [] if value in (None, "") else value
            if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
                raise p.invalid("'input' must be a string or a list of strings", "input")
            if len(texts) > embeddings.MAX_INPUTS:
                raise p.invalid(f"'input' has {len(texts)} entries; at most {embeddings.MAX_INPUTS} per request", "input")
            sampling_body(body)  # options must be an object
            truncate = p._boolean(body, "truncate", True)
            result = await embeddings.compute(self.api, texts, truncate, embeddings.dimensions_of(body)) if texts else None
            return JSONResponse({"model": model_id, "embeddings": result.vectors.tolist() if result else [],
                                 "total_duration": time.perf_counter_ns() - started, "load_duration": 0,
                                 "prompt_eval_count": result.total_tokens if result else 0})
        return await self._answer(request, embedded)

    # -- plumbing -----------------------------------------------------------------------------------------------
    def _check_model(self, body: dict) -> str:
        """The served model under any of its names (with or without Ollama's ':latest'); 404 for another."""
        name = body.get("model")
        if isinstance(name, str) and name.endswith(":latest"):
            body = {**body, "model": name[: -len(":latest")]}
        return p.check_model(body, self.api.config.model_ids)

    async def _answer(self, request: Request, make) -> Response:
        """Authorise, then answer; every error as Ollama sends it: {"error": "..."} with the status."""
        try:
            self.api.authorize(request)
            result = make()
            return await result if asyncio.iscoroutine(result) else result
        except Exception as exc:  # noqa: BLE001 - every failure becomes an HTTP answer
            error = p.as_api_error(exc)
            return JSONResponse({"error": str(error)}, status_code=error.status)


async def _status_lines(task, statuses: asyncio.Queue):
    """NDJSON lines of the statuses a pull reports while it runs, then "success" or its error."""
    waiting = asyncio.ensure_future(statuses.get())
    while not task.done():
        await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
        while waiting.done():
            yield json.dumps(waiting.result()) + "\n"
            waiting = asyncio.ensure_future(statuses.get())
            await asyncio.sleep(0)  # (lets a queued status land before looking again)
    waiting.cancel()
    await asyncio.sleep(0)  # statuses reported just before the end are queued by now
    while not statuses.empty():
        yield json.dumps(statuses.get_nowait()) + "\n"
    if task.exception() is not None:
        yield json.dumps({"error": str(_pull_error(task.exception()))}) + "\n"
    else:
        yield json.dumps({"status": "success"}) + "\n"


def _pull_model(name: str, report) -> None:
    """Download `name` (hub/pull.py), reporting Ollama's status objects through `report` (from this thread)."""
    from ..hub.default_model import default_model_path
    from ..hub.pull import pull as pull_file
    from ..hub.resolve import is_default, pull_ref

    report({"status": "pulling manifest"})
    if is_default(name):  # built in: assembled from its PyPI package, nothing to download
        default_model_path()
        return
    ref = pull_ref(name)
    bars = []

    def progress(description: str, total: int, done: int):
        first = not bars
        bars.append(description)
        status = f"pulling {ref.filename or ref.repo_id}" if first else "verifying sha256 digest"
        return _StatusBar(report, status, total, done, every=0 if not first else max(total // 100, 1))

    pull_file(ref, progress=progress)
    report({"status": "writing manifest"})


class _StatusBar:
    """A progress bar (hub/pull.py's) that reports {status, total, completed}, about every 1% of the bytes."""

    def __init__(self, report, status: str, total: int, done: int, every: int):
        self.report, self.status, self.total, self.completed, self.every = report, status, total, done, every
        self.last = done
        report({"status": status, "total": total, "completed": done} if every else {"status": status})

    def update(self, n: int) -> None:
        self.completed += n
        if self.every and self.completed - self.last >= self.every:
            self.last = self.completed
            self.report({"status": self.status, "total": self.total, "completed": self.completed})

    def close(self) -> None:
        if self.every and self.completed != self.last:
            self.report({"status": self.status, "total": self.total, "completed": self.completed})


def _pull_error(exc: Exception) -> p.APIError:
    from ..errors import ModelNotFound

    if isinstance(exc, ModelNotFound):
        return p.APIError(404, str(exc), code="model_not_found")
    return p.as_api_error(exc)
