"""The library façade: `localllm.load(...)` -> Model; `model.generate(...)` yields events."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Union

import numpy as np

from .backends import create_backend
from .errors import ContextOverflow, LocalLLMError
from .generate import Event, Session, generate_tokens
from .gguf import GGUFReader
from .host import available_memory, well_within
from .model.archs import architecture_class
from .model.kv_cache import KVCache, KVCacheTooLarge
from .runtime import Runtime

log = logging.getLogger(__name__)

# The context when none is asked for, as llama.cpp (llama-cli, llama-server) and Ollama choose it: 4096
# tokens, or the model's trained length when that is shorter. `chat`, `run` and `serve` all take it from
# default_context. (A longer context only costs memory until it is used, but the model's trained length can
# be 128k tokens, gigabytes of KV cache for a 7B model.)
DEFAULT_CTX = 4096
# When the file does not say how long a context it was trained on.
ASSUMED_TRAINED_CTX = 2048


@dataclass
class MemoryEstimate:
    weights_bytes: int  # the file's tensors: mapped, or copied by the CPU backend (backends/cpu/weight_memory.py)
    kv_bytes: int
    n_ctx: int
    # On a device backend: weights as uploaded + KV cache + buffers, all in device memory (0 on the CPU).
    device_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes


def read_ahead_if_small(reader: GGUFReader) -> bool:
    """Have the kernel read the model file ahead into the page cache when it takes under half the
    available memory (so a model that barely fits does not push out what it needs).

    Why: the CPU backend computes on the weights where they lie in the mapping (or copies them from it at
    upload, which load runs after this), so a file that is not in the page cache is read 4 KiB fault by
    fault during the first forward pass (or the copies), a layer at a time.
    Measured, Llama-3-8B-shaped file (4.9 GB) evicted from the cache beforehand: first 64-token prefill
    27 s with the advice, 67-110 s without (a loaded machine; the second pass 49-84 s either way)."""
    return well_within(reader.file_size, available_memory()) and reader.read_ahead()


def _kv_bytes(reader, n_ctx: int) -> int:
    """The KV cache's bytes at n_ctx positions (with a hybrid's recurrent buffers and their checkpoints)."""
    from .model.archs import ARCHITECTURES
    from .model.hparams import HParams

    hp = HParams.from_reader(reader, n_vocab=1)
    # An architecture whose layers' caches differ says how (an unsupported one counts as uniform: load
    # refuses it anyway, and `show` only describes it)
    layout = architecture_class(reader.architecture).kv_layout_of(reader, hp) if reader.architecture in ARCHITECTURES else None
    return KVCache.bytes_needed(hp, n_ctx, layout)


def estimate_memory(path, n_ctx: Optional[int] = None, check: bool = False) -> MemoryEstimate:
    """Weights + KV cache at n_ctx (default: the context `load` would choose). Reads only metadata.
    With `check`, raises what `load` would for that context first (too small, KVCacheTooLarge)."""
    with GGUFReader(path) as reader:
        memory = _estimate(reader, n_ctx)
    if check:
        check_fits(memory)
    return memory


def trained_context(reader) -> int:
    """The context length the model was trained on (its metadata's `<arch>.context_length`)."""
    return reader.metadata.get_int(reader.arch_key("context_length"), None, min=1) or ASSUMED_TRAINED_CTX


def default_context(trained: int) -> int:
    """The context used when none is asked for: DEFAULT_CTX, or `trained` when shorter."""
    return min(DEFAULT_CTX, trained)


def _estimate(reader, n_ctx: Optional[int]) -> MemoryEstimate:
    if n_ctx is None:
        n_ctx = default_context(trained_context(reader))
    weights = sum(t.nbytes for t in reader.tensors.values())
    return MemoryEstimate(weights, _kv_bytes(reader, n_ctx), n_ctx)


def check_fits(memory: MemoryEstimate, available: Optional[int] = None) -> None:
    """LocalLLMError for a context under 16 tokens; KVCacheTooLarge when the KV cache (memory.kv_bytes) would
    exceed `available` (default: the memory available now), with the context that would fit. The weights do
    not count: they are mapped from the file, and the page cache gives them back under pressure (a model
    larger than the memory runs, reading them from disk, as llama.cpp's mmap does)."""
    if memory.n_ctx < 16:
        raise LocalLLMError(f"context size {memory.n_ctx} is too small (minimum 16)")
    available = available_memory() if available is None else available
    if memory.kv_bytes > available:
        per_token = max(memory.kv_bytes // max(memory.n_ctx, 1), 1)
        raise KVCacheTooLarge(memory.n_ctx, memory.kv_bytes, available, int(available // per_token))


def check_context(reader, memory: MemoryEstimate, host: bool = True, available: Optional[int] = None) -> None:
    """Before any cache is allocated: on a host backend (the cache in this machine's memory; a device
    backend checks its own in plan_memory) raise KVCacheTooLarge when the KV cache for memory.n_ctx would
    not fit in the memory available now; log a one-line warning when the context is longer than the model
    was trained on (it runs, but positions past the trained length give poor text).

    (A cache that does not fit is not refused by NumPy itself until it is far beyond the memory: zero pages
    are allocated lazily, and the machine would run out of memory later, while filling the cache.)"""
    if host:
        check_fits(memory, available)
    elif memory.n_ctx < 16:
        raise LocalLLMError(f"context size {memory.n_ctx} is too small (minimum 16)")
    trained = trained_context(reader)
    if memory.n_ctx > trained:
        log.warning("warning: a context of %d tokens is longer than the %d this model was trained on; "
                    "text past that point may degrade", memory.n_ctx, trained)


class Model:
    """A loaded model: decoder bound to a backend, tokenizer, chat template, default session."""

    def __init__(self, path: Path, reader, decoder, tokenizer, backend, memory: MemoryEstimate):
        self.path = path
        self.reader = reader
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.backend = backend
        self.memory = memory
        self.n_ctx = memory.n_ctx
        decoder.use_context(self.n_ctx)
        self.trained_ctx = trained_context(reader)
        self._template = None
        self._embed_cache: Optional[KVCache] = None  # embed's own cache (embedding_cache)
        self.session = self.new_session()

    def close(self) -> None:
        """Release the mapped file (the model cannot be used afterwards)."""
        self.session = None
        self._embed_cache = None
        self.decoder = None
        self.reader.close()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- pieces -----------------------------------------------------------------------------------------
    @property
    def architecture(self) -> str:
        return self.reader.architecture

    @property
    def chat_template(self):
        if self._template is None:
            from .chat.templates import ChatTemplate

            tok = self.tokenizer
            bos = tok.tokens[tok.bos_id] if tok.bos_id is not None and tok.bos_id >= 0 else ""
            eos = tok.tokens[tok.eos_id] if tok.eos_id is not None and tok.eos_id >= 0 else ""
            self._template = ChatTemplate.for_model(self.reader.metadata, Path(self.path).name, bos_token=bos, eos_token=eos)
        return self._template

    @property
    def is_base_model(self) -> bool:
        """Pretrained only (no chat template, no chat-tuning word in its names): chat uses a transcript."""
        return self.chat_template.for_base_model

    def chat_stop(self) -> list[str]:
        """Stop strings every chat reply honours (the transcript's "\nUser:"; none for a model's own format)."""
        return list(self.chat_template.stop)

    def chat_repeat_penalty(self, asked: Optional[float] = None) -> float:
        """The repetition penalty for a chat reply: `asked` when the caller set one, else the template's
        default (1.1 for a base model's transcript), else 1.0 (off)."""
        if asked is not None:
            return asked
        return self.chat_template.repeat_penalty or 1.0

    def resize_context(self, n_ctx: int) -> None:
        """Use a context of `n_ctx` tokens from now on (sessions made afterwards get a cache that long).

        Checked first (check_context: KVCacheTooLarge, too small); a refused size changes nothing. The default
        session is replaced by an empty one; sessions made before keep their old cache."""
        memory = MemoryEstimate(self.memory.weights_bytes, _kv_bytes(self.reader, n_ctx), n_ctx)
        check_context(self.reader, memory, host=self.backend.host_buffers)
        self.backend.plan_memory(self.reader, memory, self.decoder.hp, ctx_given=True)  # a host backend's: nothing
        self.memory = memory
        self.n_ctx = memory.n_ctx
        self.decoder.use_context(self.n_ctx)
        self.session = self.new_session()

    def new_session(self) -> Session:
        return Session(cache=KVCache(self.backend, self.decoder.hp, self.n_ctx, self.decoder.kv_layout()))

    def tokenize(self, text: str, add_bos: Optional[bool] = None, special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_bos=add_bos, parse_special=special)

    def detokenize(self, ids) -> str:
        return self.tokenizer.decode(list(ids))

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """Chat messages -> prompt token ids (the template's text, special tokens parsed, no extra BOS
        when the template already starts with it)."""
        return self.encode_chat(self.chat_template.apply(messages, add_generation_prompt=add_generation_prompt))

    def encode_chat(self, text: str) -> list[int]:
        """A rendered chat prompt's text -> its token ids (special tokens parsed, no second BOS)."""
        ids = self.tokenizer.encode(text, add_bos=True, parse_special=True)
        bos = self.tokenizer.bos_id
        if len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
            ids = ids[1:]
        return ids

    def fit_conversation(self, messages: list[dict], reserve: int = 0, shift: bool = False) -> list[int]:
        """Render `messages` to prompt ids that leave `reserve` tokens of room in the context.

        Without `shift` an oversized conversation raises ContextOverflow (never silent truncation). With it,
        the oldest turns after the system prompt are dropped, whole (a user message with its replies: the
        rule of chat/history.py, as `localllm chat`), keeping the system prompt and the newest turn."""
        from .chat.history import drop_oldest_turns

        what = "conversation (with room for the reply)"
        if not shift:
            ids = self.render_chat(messages)
            if len(ids) + reserve >= self.n_ctx:
                raise ContextOverflow(len(ids) + reserve, self.n_ctx, what)
            return ids
        return drop_oldest_turns(list(messages), self.render_chat, self.n_ctx, reserve, what)[0]

    def logits(self, tokens, session: Optional[Session] = None) -> np.ndarray:
        """Logits at every position of `tokens`, evaluated from position 0 in one batched pass."""
        session = session or self.new_session()
        if len(tokens) > self.n_ctx:
            raise ContextOverflow(len(tokens), self.n_ctx)
        session.reset()
        out = self.decoder.forward(np.asarray(tokens, dtype=np.int32), 0, session.cache, all_logits=True)
        session.tokens = list(tokens)
        return out.copy()

    # -- embeddings -----------------------------------------------------------------------------------------
    def embeddings(self, inputs, *, normalize: bool = True, pooling: Optional[str] = None, truncate: bool = False,
                   dimensions: Optional[int] = None):
        """Embed a text, a list of texts, token ids or a list of token-id lists: an embeddings.Embeddings
        (vectors float32 [inputs, n_embd], each input's token count, the pooling used).

        Each input runs alone from position 0; its final hidden states are pooled as the file says
        (`<arch>.pooling_type`: mean, CLS or last token; a decoder without one: its last token) or as
        `pooling` asks, cut to its first `dimensions` values when given, then L2-normalised unless
        `normalize=False` (localllm/embeddings.py). An input longer than the context raises
        ContextOverflow, or is cut to it with `truncate=True`."""
        from .embeddings import embed

        return embed(self, inputs, normalize_vectors=normalize, pooling=pooling, truncate=truncate, dimensions=dimensions)

    def embed(self, inputs, *, normalize: bool = True, pooling: Optional[str] = None, truncate: bool = False,
              dimensions: Optional[int] = None) -> np.ndarray:
        """The vectors of `embeddings` (float32 [inputs, n_embd], one row per input)."""
        return self.embeddings(inputs, normalize=normalize, pooling=pooling, truncate=truncate,
                               dimensions=dimensions).vectors

    def embedding_cache(self, n_tokens: int) -> KVCache:
        """A KV cache of its own for embed (the default session's stays as it is), at least n_tokens long:
        kept and reused while long enough, grown to the longest input; new for every input of a model
        with recurrent layers, whose state must start from zero."""
        from .embeddings import MIN_CACHE

        cache = self._embed_cache
        if cache is None or cache.n_ctx < n_tokens or cache.states is not None:
            size = min(max(n_tokens, MIN_CACHE), self.n_ctx)
            cache = self._embed_cache = KVCache(self.backend, self.decoder.hp, size, self.decoder.kv_layout())
        return cache

    def check_generates(self) -> None:
        """LocalLLMError unless the model can generate text (an embedding model such as BERT cannot)."""
        if not self.decoder.GENERATES:
            raise LocalLLMError(f"{Path(self.path).name} is an embedding model ({self.architecture}): it does not "
                                "generate text; use `localllm embed` or the server's embeddings endpoints")

    def warm_up(self) -> None:
        """Run a 32-token prompt and one decode step on a small scratch cache, so that the kernels a
        conversation needs are compiled (the first run on a machine: ~20 s for Gemma 3 270M) or loaded
        from Numba's cache (~1 s) now, rather than while the user waits for a first reply."""
        rows = min(32, self.n_ctx - 1)
        if rows < 1:
            return
        cache = KVCache(self.backend, self.decoder.hp, rows + 1, self.decoder.kv_layout())
        tokens = np.arange(rows, dtype=np.int32) % self.decoder.hp.n_vocab
        if not self.decoder.GENERATES:  # an encoder: embeddings are all it computes
            self.decoder.hidden_states(tokens, cache)
            return
        self.decoder.forward(tokens, 0, cache)
        self.decoder.forward(tokens[:1], rows, cache)

    # -- generation -----------------------------------------------------------------------------------------
    def generate(
        self,
        prompt: Union[str, list[dict], list[int]],
        *,
        max_tokens: int = 256,
        sampling=None,
        session: Optional[Session] = None,
        stop: Optional[list[str]] = None,
        top_logprobs: Optional[int] = None,
        add_bos: Optional[bool] = None,
        context_shift: bool = False,
        grammar: Optional[str] = None,
        json_schema=None,
        speculation=None,
        **sampling_options,
    ) -> Iterator[Event]:
        """Yield events for a text prompt, a list of chat messages (template applied), or token ids.

        `sampling` is a SamplingConfig; keyword options (temperature=…, seed=…) build one instead.
        Chat messages also stop at the template's stop strings (chat_stop), and without `sampling` take its
        repetition penalty unless `repeat_penalty=` is given (chat_repeat_penalty: 1.1 for a base model).
        The default session keeps its KV cache across calls: a prompt that extends the previous one
        (a chat's next turn) prefills only the new tokens. A prompt that does not fit raises
        ContextOverflow; with `context_shift=True` a conversation instead drops its oldest turns (the
        system prompt and the last user turn are kept) until it fits.
        `grammar` (GBNF text) or `json_schema` (a dict or its JSON text) constrain the output: every
        token drawn keeps it a prefix of the grammar's language, and the end of generation is allowed
        only once it is complete (localllm/grammar/). A GrammarError says what is wrong with either.
        `speculation`: a Speculation (localllm/speculative.py): prompt lookup and/or a draft model guess
        tokens that one forward pass checks; the output is the same (greedy) or identically distributed.
        """
        from .grammar import grammar_text
        from .sampling import Sampler, SamplingConfig

        self.check_generates()
        is_chat = not isinstance(prompt, str) and bool(prompt) and isinstance(prompt[0], dict)
        if sampling is None:
            if is_chat:  # the template's default penalty (a base model's transcript: 1.1) unless one is given
                sampling_options["repeat_penalty"] = self.chat_repeat_penalty(sampling_options.get("repeat_penalty"))
            sampling = SamplingConfig(**sampling_options)
        elif sampling_options:
            raise TypeError("pass either sampling= or sampling keyword options, not both")
        if isinstance(prompt, str):
            ids = self.tokenize(prompt, add_bos=add_bos)
        elif is_chat:
            ids = self.fit_conversation(prompt, reserve=min(max_tokens, self.n_ctx // 4), shift=context_shift)
        else:
            ids = [int(t) for t in prompt]
        constraint = grammar_text(grammar, json_schema)
        if constraint is not None:
            sampling = dataclasses.replace(sampling, grammar=constraint)
        sampler = Sampler(sampling, self.decoder.hp.n_vocab, self.tokenizer)
        stops = list(stop or []) + list(getattr(sampling, "stop", None) or [])
        if is_chat:
            stops += self.chat_stop()
        drafters = speculation.drafters(self, sampling) if speculation is not None and speculation.active else None
        yield from generate_tokens(
            self.decoder,
            self.tokenizer,
            session or self.session,
            ids,
            sampler,
            max_tokens=max_tokens,
            n_ctx=self.n_ctx,
            stop=stops,
            top_logprobs=top_logprobs,
            drafters=drafters,
            draft_length=speculation.draft_length(self) if drafters else None,
        )


def load(model: Union[str, Path, None] = None, n_ctx: Optional[int] = None, threads: Optional[int] = None, backend: str = "cpu",
         runtime: Optional[Runtime] = None):
    """Load a GGUF model by path or name (None: the built-in default) and bind it to a backend:
    "cpu", "cuda" (numba-cuda; weights, KV cache and activations in device memory) or "auto" (CUDA when
    a device is present, else CPU). `runtime`: the settings (default: resolved from the environment now,
    once, and passed to the backend); `threads`, when given, in place of its own.

    A `remote:` reference, or a name the config file routes to a remote (localllm/remote/routing.py),
    gives a RemoteModel instead: the same `generate`, run by another engine (nothing is sent yet).

    Every tensor is checked (presence, shape, type) before any kernel runs; nothing is printed.
    """
    if isinstance(model, Path):
        return load_path(model, n_ctx=n_ctx, threads=threads, backend=backend, runtime=runtime)
    from .remote.routing import open_target, resolve_target

    return open_target(resolve_target(model), n_ctx=n_ctx, threads=threads, backend=backend, runtime=runtime)


def load_path(path: Union[str, Path], n_ctx: Optional[int] = None, threads: Optional[int] = None, backend: str = "cpu",
              runtime: Optional[Runtime] = None) -> Model:
    """`load` for a .gguf file (a path or a name hub/resolve.py resolves, without routing)."""
    from .hub.resolve import resolve_model
    from .model.hparams import HParams
    from .tokenizer import Tokenizer

    runtime = (runtime or Runtime.resolve()).with_arguments(threads=threads)
    path = resolve_model(str(path))
    reader = GGUFReader(path)
    try:
        arch_cls = architecture_class(reader.architecture)
        memory = _estimate(reader, n_ctx)
        tokenizer = Tokenizer.from_metadata(reader.metadata)
        ops = create_backend(backend, runtime=runtime)
        check_context(reader, memory, host=ops.host_buffers)
        ops.plan_memory(reader, memory, HParams.from_reader(reader, tokenizer.vocab_size), ctx_given=n_ctx is not None)
        if ops.reads_mapped_weights:  # before upload: the CPU backend may copy the matrices there
            read_ahead_if_small(reader)
        decoder = arch_cls(reader, ops, n_vocab=tokenizer.vocab_size)
        ops.prepare_kernels(path)
    except BaseException:
        reader.close()
        raise
    return Model(path, reader, decoder, tokenizer, ops, memory)
