"""RemoteModel: a model another engine serves, with the `generate` of a local Model.

`generate` sends a chat (a list of messages) to /chat/completions and a text or a list of token ids to
/completions, streamed, and yields the events a local model yields: 'token' events with the text as it
arrives (`token` is None: the remote's token ids are not sent), then 'done' with the finish reason and
Timings (prompt and generated tokens from the answer's usage; time to first token and rates as measured
here, network included).

The sampling settings go with the request: OpenAI's fields (temperature, top_p, seed, penalties, logit_bias)
always; the others (top_k, min_p, the repetition penalty, GBNF grammars) only when they differ from
SamplingConfig's defaults (at those, the remote's own defaults apply: llama.cpp's and localllm's are the same
values; a localllm engine's chat with a base model then takes its transcript's penalty, as a local chat does),
under the names the remote's engine takes (EXTENSIONS). One the engine has no field for is refused before
anything is sent. What only a local model has (a session's KV cache, log-
probabilities by token id, a draft model, context shifting) is refused too: nothing is faked.
"""

from __future__ import annotations

import json
import time
from typing import Iterator, Optional, Union

from ..engine.sequence import Event, Timings
from ..errors import LocalLLMError
from ..sampling_config import SamplingConfig
from .client import Client, RemoteError, RemoteStreamCut
from .config import Remote

# SamplingConfig fields beyond OpenAI's, by engine: the request field each goes in (a missing one: the engine
# has no such setting). vLLM: SamplingParams' extra fields; llama.cpp: llama-server's /completion options;
# localllm: server/protocol.py.
EXTENSIONS = {
    "localllm": {"top_k": "top_k", "min_p": "min_p", "repeat_penalty": "repeat_penalty", "grammar": "grammar"},
    "llama.cpp": {"top_k": "top_k", "min_p": "min_p", "repeat_penalty": "repeat_penalty", "typical_p": "typical_p",
                  "repeat_last_n": "repeat_last_n", "grammar": "grammar"},
    "vllm": {"top_k": "top_k", "min_p": "min_p", "repeat_penalty": "repetition_penalty"},
    "tgi": {},
    "openai": {},
}
# The engine an answer to GET /models names in its "owned_by" (anything else: plain OpenAI fields only).
OWNERS = {"vllm": "vllm", "llamacpp": "llama.cpp", "localllm": "localllm", "tgi": "tgi"}


class RemoteUnsupported(LocalLLMError):
    """A request a remote model cannot honour (refused before anything is sent)."""


class RemoteModel:
    """A model served by `remote`. Nothing is sent until it is used; `connect()` checks it now."""

    is_remote = True
    session = None  # a remote keeps its own cache (prefix caching is the engine's)

    def __init__(self, remote: Remote, client: Optional[Client] = None):
        self.remote = remote
        self.client = client or Client(remote)
        self._listing: Optional[dict] = None  # GET /models, once

    # -- what it is --
    @property
    def label(self) -> str:
        return self.remote.label

    @property
    def path(self) -> str:  # what a local model's path stands for in messages and saved conversations
        return self.label

    def listing(self) -> dict:
        """The remote's GET /models answer ({} when it has no such endpoint), fetched once."""
        if self._listing is None:
            try:
                self._listing = self.client.get_json("/models")
            except RemoteError as exc:
                if exc.status not in (404, 405):
                    raise
                self._listing = {}
        return self._listing

    def served_models(self) -> list:
        data = self.listing().get("data")
        return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)] if isinstance(data, list) else []

    def _entry(self) -> dict:
        data = self.listing().get("data")
        entries = [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []
        return next((m for m in entries if m.get("id") == self.model_name), {})

    @property
    def model_name(self) -> str:
        """The name requests carry: the reference's, else the first the remote lists."""
        if self.remote.model:
            return self.remote.model
        served = self.served_models()
        if not served:
            raise RemoteError(f"{self.label} lists no models: name one (remote:URL#MODEL, or 'model' in the config)")
        return served[0]

    @property
    def engine(self) -> str:
        """Which engine it is (EXTENSIONS' keys): the config's word, else what its model list says."""
        if self.remote.engine:
            return self.remote.engine
        return OWNERS.get(str(self._entry().get("owned_by", "")).lower(), "openai")

    @property
    def n_ctx(self) -> Optional[int]:
        """The context length the remote reports (vLLM's max_model_len, llama-server's n_ctx), else None."""
        entry = self._entry()
        for value in (entry.get("max_model_len"), (entry.get("meta") or {}).get("n_ctx_train")):
            if isinstance(value, int) and value > 0:
                return value
        return None

    def connect(self) -> "RemoteModel":
        """Ask the remote for its models now: RemoteUnreachable, or RemoteError for a model it does not
        serve (with the names it does), before any prompt."""
        served = self.served_models()
        if served and self.model_name not in served:
            raise RemoteError(f"{self.label} serves no model '{self.model_name}' (it serves: {', '.join(served[:8])})",
                              status=404)
        return self

    def describe(self) -> dict:
        return {"remote": self.label, "url": self.remote.url, "model": self.model_name, "engine": self.engine,
                "context_length": self.n_ctx}

    def check_generates(self) -> None:
        """Remote models generate (an embedding model's remote answers its own error)."""

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "RemoteModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _local_only(self, what: str):
        return RemoteUnsupported(f"{what} needs a local model; {self.label} is served by another engine")

    def tokenize(self, *args, **kwargs):
        raise self._local_only("tokenize")

    def new_session(self):
        raise self._local_only("a session (a KV cache of its own)")

    # -- embeddings --
    def embeddings(self, inputs, *, normalize: bool = True, pooling: Optional[str] = None, truncate: bool = False,
                   dimensions: Optional[int] = None):
        """Model.embeddings through the remote's /embeddings: one vector per input (a text, token ids, or a
        list of either). The engine pools and normalises as it does for every client; asking for another
        pooling, unnormalised vectors or truncation is refused. Token counts per input are not reported
        by the API (None each; the total is in the answer's usage)."""
        import numpy as np

        from ..embeddings import Embeddings

        for given, what in ((pooling is not None, "a pooling"), (not normalize, "unnormalised vectors"),
                            (truncate, "truncation")):
            if given:
                raise RemoteUnsupported(f"{what} cannot be asked of {self.label}: its engine pools and normalises")
        single = isinstance(inputs, str) or (isinstance(inputs, list) and inputs and isinstance(inputs[0], int))
        items = [inputs] if single else list(inputs)
        body = {"model": self.model_name, "input": items, "encoding_format": "float"}
        if dimensions is not None:
            body["dimensions"] = dimensions
        answer = self.client.post_json("/embeddings", body)
        try:
            rows = sorted(answer["data"], key=lambda row: row["index"])
            vectors = np.array([row["embedding"] for row in rows], dtype=np.float32)
        except (KeyError, TypeError, ValueError):
            raise RemoteError(f"{self.label} answered /embeddings without a list of vectors") from None
        if vectors.ndim != 2 or len(vectors) != len(items):
            raise RemoteError(f"{self.label} answered {len(vectors)} vectors for {len(items)} inputs")
        return Embeddings(vectors, [None] * len(items), "as the remote engine pools")

    def embed(self, inputs, **options):
        return self.embeddings(inputs, **options).vectors

    # -- generation --
    def generate(
        self,
        prompt: Union[str, list],
        *,
        max_tokens: int = 256,
        sampling: Optional[SamplingConfig] = None,
        session=None,
        stop: Optional[list] = None,
        top_logprobs: Optional[int] = None,
        add_bos: Optional[bool] = None,
        context_shift: bool = False,
        grammar: Optional[str] = None,
        json_schema=None,
        speculation=None,
        **sampling_options,
    ) -> Iterator[Event]:
        """Model.generate's events for `prompt` (a text, chat messages or token ids), generated remotely."""
        for given, what in ((session is not None, "a session"), (top_logprobs is not None, "top_logprobs"),
                            (add_bos is not None, "add_bos"), (context_shift, "context_shift")):
            if given:
                raise self._local_only(what)
        if speculation is not None and getattr(speculation, "draft", None) is not None:
            raise self._local_only("a draft model")
        if sampling is None:
            sampling = SamplingConfig(**sampling_options)
        elif sampling_options:
            raise TypeError("pass either sampling= or sampling keyword options, not both")
        if max_tokens is None or max_tokens < 0:
            raise ValueError("max_tokens must be an integer >= 0")
        is_chat = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict)
        body = {"model": self.model_name, "stream": True, "stream_options": {"include_usage": True},
                "max_tokens": max_tokens}
        body.update(self.sampling_fields(sampling, grammar, json_schema))
        stops = list(stop or []) + list(sampling.stop or [])
        if stops:
            body["stop"] = stops
        if is_chat:
            body["messages"] = prompt
        elif isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            body["prompt"] = prompt
        else:
            raise ValueError("prompt must be a text, a list of chat messages or a list of token ids")
        return self._events("/chat/completions" if is_chat else "/completions", body, is_chat)

    def sampling_fields(self, sampling: SamplingConfig, grammar: Optional[str] = None, json_schema=None) -> dict:
        """The request fields of `sampling` (and of a grammar or a JSON schema) for this remote's engine;
        RemoteUnsupported for a setting it has no field for and that is not at its default."""
        fields = {"temperature": sampling.temperature, "top_p": sampling.top_p}
        if sampling.seed is not None:
            fields["seed"] = sampling.seed
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(sampling, name):
                fields[name] = getattr(sampling, name)
        if sampling.logit_bias:
            fields["logit_bias"] = {str(k): v for k, v in sampling.logit_bias.items()}
        names = EXTENSIONS[self.engine]
        defaults = SamplingConfig()
        for option in ("top_k", "min_p", "repeat_penalty", "typical_p", "repeat_last_n"):
            value = getattr(sampling, option)
            if value == getattr(defaults, option):
                continue  # the remote's own default applies (llama.cpp's and localllm's are these values)
            if option in names:
                fields[names[option]] = value
            else:
                raise RemoteUnsupported(f"{self.label} ({self.engine}) takes no {option}: leave it at its default "
                                        f"({getattr(defaults, option)}) for a remote model")
        if json_schema is not None:
            schema = json.loads(json_schema) if isinstance(json_schema, str) else json_schema
            fields["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
        grammar = grammar or sampling.grammar
        if grammar is not None:
            if json_schema is not None:
                raise RemoteUnsupported("give a grammar or a JSON schema, not both")
            if "grammar" not in names:
                raise RemoteUnsupported(f"{self.label} ({self.engine}) takes no GBNF grammar: use a JSON schema "
                                        "(--json-schema), which goes to every engine as response_format")
            fields[names["grammar"]] = grammar
        return fields

    def _events(self, path: str, body: dict, is_chat: bool) -> Iterator[Event]:
        tally = StreamTally(is_chat)
        stream = self.client.stream(path, body)
        try:
            try:
                for chunk in stream:
                    for text in tally.add(chunk):
                        yield Event("token", text=text)
            except RemoteStreamCut:
                if tally.finish is None:
                    raise  # an answer that ended cleanly but without [DONE] is whole
        finally:
            stream.close()
        if tally.finish is None:
            raise RemoteError(f"{self.label} ended the reply without a finish reason")
        yield Event("done", finish_reason=tally.finish, timings=tally.timings())


class StreamTally:
    """What a streamed OpenAI answer has said so far: its texts in order (`add`), its finish reason and usage,
    and the times here (from the request to the first text, and to now) for its Timings. Shared by
    RemoteModel and the gateway's RemoteHandle."""

    def __init__(self, is_chat: bool):
        self.is_chat = is_chat
        self.t0, self.t_first = time.perf_counter(), None
        self.finish: Optional[str] = None
        self.usage: dict = {}
        self.pieces = 0

    def add(self, chunk: dict) -> list:
        """The texts of one event (a chat chunk's delta contents, a completion chunk's texts)."""
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        texts = []
        for choice in chunk.get("choices") or []:
            text = choice_text(choice, self.is_chat)
            if text:
                self.t_first = self.t_first or time.perf_counter()
                self.pieces += 1
                texts.append(text)
            self.finish = choice.get("finish_reason") or self.finish
        return texts

    def timings(self) -> Timings:
        """Token counts from the usage (generated: the texts counted when it has none), times as measured."""
        now = time.perf_counter()
        t_first = self.t_first or now
        timings = Timings(prompt_tokens=int(self.usage.get("prompt_tokens") or 0),
                          generated_tokens=int(self.usage.get("completion_tokens") or self.pieces))
        timings.time_to_first_token = timings.prompt_seconds = t_first - self.t0
        timings.generation_seconds = now - t_first
        details = self.usage.get("prompt_tokens_details")
        timings.cached_tokens = int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
        return timings


def choice_text(choice: dict, is_chat: bool) -> str:
    """The text of one streamed choice: a chat chunk's delta content, a completion chunk's text."""
    if is_chat:
        delta = choice.get("delta")
        return (delta.get("content") or "") if isinstance(delta, dict) else ""
    return choice.get("text") or ""
