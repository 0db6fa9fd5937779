"""Continuous batching over a paged KV cache: one engine thread, many sequences.

Every step the engine admits queued requests while there are free slots (`parallel`) and KV blocks,
then runs ONE forward pass over all active sequences: one row per decoding sequence (its last sampled
token; more with speculation, below) plus the next prompt chunk of the sequences still reading their
prompts, oldest first, as many as fit in one chunk's rows (PREFILL_CHUNK) together (the first always
runs). Each weight is read once per step for all of them (Backend.matmul_segments): the prompt chunks
of BLAS_MIN_ROWS rows or more, for a type without multi-row kernels, share each dequantized tile for
their own BLAS products; the other chunks (every chunk, for the types with multi-row kernels) go through the row kernels in one call, each
row as the row kernels compute it alone. Each sequence samples from its own logits with its own Sampler
(own seed, penalties), hands the token to its SequenceOutput (engine/sequence.py: the output path
`generate` runs too: end of generation, logprobs, text, stop strings, limits), and its events go to the
request's asyncio queue. A request cancelled by its client (stream closed) is dropped, and its blocks
freed, at the start of the next step. Nothing here knows HTTP: localllm.server is a front end to it.

Sequence results do not depend on the batch: decode rows are computed row by row with the one-row
kernels (Buffers.n_rowwise), and each prefill chunk is computed as if alone with the same chunking as
`generate` (PREFILL_CHUNK from the first uncached position). So a greedy request returns the same
tokens as `Model.generate` alone, whatever else runs with it, when its prompt found nothing in the
prefix cache (a prefix hit changes where the prefill chunks start; see docs/server.md).

Speculative decoding (Engine(speculation=...), `serve --lookup`, `serve --draft MODEL`): each decoding
sequence may draft up to k tokens by prompt lookup and/or with a draft model (its own PromptLookup, its
own session of the draft model, run one token at a time on this thread, and its own DraftLength;
localllm/speculative.py) and then runs 1 + k rows instead of one: its last token and its drafts, all in
the leading row-wise rows
(BatchLayout.n_rowwise counts every decoding row), so each is computed as a one-token step computes it
(matmul_rows; its attention, under 32 rows, by the Numba kernel; recurrent layers stepwise),
with the logits of every one of them. Sampler.verify then keeps drafts or replaces the first refused
one (Engine._verify), so greedy answers stay Model.generate's and sampled ones keep their distribution.
A sequence never drafts past MAX_VERIFY_ROWS rows, its token budget or the context.

Work that needs the model to itself and is no sequence (an embedding: Model.embed's forward pass on its
own cache) is handed to the engine thread with `call`, and runs there between two steps: the model's
buffers and the backend's scratch are only ever used from this thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..errors import ContextOverflow, LocalLLMError
from ..model.decoder import MAX_VERIFY_ROWS
from ..model.kv_paged import DEFAULT_BLOCK_SIZE, LayoutBuilder, PagedKVCache, SequenceBlocks
from ..sampling import Sampler, SamplingConfig, SamplingError
from ..speculative import (DraftLength, DraftModel, PromptLookup, Speculation, Verdict, accept_rows, draft_size,
                           propose)
from .sequence import PREFILL_CHUNK, Event, SequenceOutput, Timings
from .stats import EngineStats

DEFAULT_CACHE_MB = 512


class QueueFull(LocalLLMError):
    """The engine's request queue is full (the HTTP server answers 503)."""


@dataclass
class GenerationRequest:
    prompt: list
    sampling: SamplingConfig
    max_tokens: Optional[int] = None  # None: until the end of the context
    stop: list = field(default_factory=list)
    top_logprobs: Optional[int] = None  # None: none; 0: the chosen token's; n: also the n best


class RequestHandle:
    """The caller's side of a request: its events arrive on an asyncio queue; cancel() drops it."""

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop, engine: "Engine"):
        self.request = request
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.cancelled = False
        self._engine = engine

    def cancel(self) -> None:
        self.cancelled = True
        self._engine.wake()

    def push(self, event: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self.cancelled = True

    async def events(self):
        """Yield events until (and including) the 'done' or 'error' one."""
        while True:
            event = await self.queue.get()
            yield event
            if event.kind in ("done", "error"):
                return


class Sequence:
    """Engine-thread state of one admitted request."""

    def __init__(self, handle: RequestHandle, tokenizer, n_vocab: int, blocks: SequenceBlocks, n_cached: int,
                 n_ctx: int, speculation: Optional[Speculation] = None, length: Optional[DraftLength] = None,
                 draft_model=None):
        req = handle.request
        self.handle = handle
        self.ids = list(req.prompt)  # prompt + generated tokens (the output path appends to it)
        self.n_prompt = len(req.prompt)
        self.n_past = n_cached  # tokens of self.ids whose K/V are in the cache
        self.blocks = blocks
        self.sampler = Sampler(req.sampling, n_vocab, tokenizer)
        self.timings = Timings(prompt_tokens=self.n_prompt, cached_tokens=n_cached)
        self.out = SequenceOutput(tokenizer, self.ids, max_tokens=req.max_tokens, n_ctx=n_ctx, timings=self.timings,
                                  stop=req.stop, top_logprobs=req.top_logprobs, special=req.sampling.special_tokens)
        # speculation: its own drafters (prompt lookup, its draft model's session) and draft length;
        # `drafts` and `probs`, the tokens drafted for this step and the draft model's distributions (q)
        self.drafters = []
        if speculation is not None and speculation.lookup:
            self.drafters.append(PromptLookup(speculation.ngram_min, speculation.ngram_max))
        if draft_model is not None:
            draft_model.use_sampling(req.sampling)
            self.drafters.append(draft_model)
        self.length = length
        self.drafts: list = []
        self.probs: Optional[list] = None

    @property
    def decoding(self) -> bool:
        """Its prompt has run and it has sampled: its rows are ids[n_past:] (the last sampled token, after
        the kept rows a recurrent rollback runs again: Engine._verify), then its drafts."""
        return len(self.ids) > self.n_prompt


class Engine:
    def __init__(self, model, parallel: int = 4, cache_mb: float = DEFAULT_CACHE_MB, block_size: int = DEFAULT_BLOCK_SIZE,
                 max_queue: int = 64, prefill_chunk: int = PREFILL_CHUNK, speculation: Optional[Speculation] = None):
        """speculation: each decoding sequence drafts by prompt lookup (Speculation.lookup) and/or with the
        draft model (Speculation.draft: its vocabulary checked here; each sequence gets its own session of
        it, a KV cache of the draft's context, and runs it one token at a time on this thread); None or
        neither: no speculation."""
        if parallel < 1:
            raise LocalLLMError(f"parallel must be >= 1 (got {parallel})")
        active = speculation is not None and (speculation.lookup or speculation.draft is not None)
        self.speculation = speculation if active else None
        if self.speculation is not None and speculation.draft is not None:
            speculation.draft_model(model)  # IncompatibleDraft now, not at the first request
        self.model = model
        self.decoder = model.decoder
        self.tokenizer = model.tokenizer
        self.parallel = parallel
        self.max_queue = max_queue
        self.prefill_chunk = prefill_chunk
        n_blocks = PagedKVCache.blocks_for_bytes(self.decoder.hp, int(cache_mb * 2**20), block_size,
                                                 self.decoder.kv_layout())
        if n_blocks < 2:
            raise LocalLLMError(f"--cache-mb {cache_mb:g} holds fewer than 2 KV blocks of {block_size} tokens")
        # recurrent layers: a state slot per running sequence (and the warm-up's two)
        self.cache = PagedKVCache(model.backend, self.decoder.hp, n_blocks, block_size, self.decoder.kv_layout(),
                                  state_slots=max(parallel, 2))
        self.states = self.cache.states  # None without recurrent layers
        self.pool = self.cache.pool
        self.block_size = block_size
        # A sequence can never hold more positions than the context or the whole pool.
        self.seq_ctx = min(model.n_ctx, n_blocks * block_size)
        self.layouts = LayoutBuilder(block_size, max_rows=parallel + prefill_chunk, max_seqs=parallel)
        self._queue: deque[RequestHandle] = deque()
        self._jobs: deque = deque()  # (fn, loop, future) of `call`, run between steps
        self._active: list[Sequence] = []
        self._wake = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._stopping = False
        self.stats = EngineStats()
        self.ready = threading.Event()  # set once a started engine has warmed up (start(warm_up=True))
        self.warm_up_error: Optional[Exception] = None

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self, warm_up: bool = False) -> None:
        """Start the step loop on its own thread; with warm_up, that thread first runs warm_up() (see
        there) and `ready` is set when it is done (at once otherwise). Requests submitted meanwhile wait
        in the queue."""
        self._stopping = False
        self.ready.clear()
        self._thread = threading.Thread(target=self._run, args=(warm_up,), name="localllm-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def wake(self) -> None:
        with self._wake:
            self._wake.notify()

    def warm_up(self, prompt_rows: int = 32) -> None:
        """Run one step shaped like the server's busiest (a decode row beside a prompt chunk) on scratch
        blocks that are never published, so the kernels of the batched path are compiled (the first
        run on a machine) or loaded from Numba's cache before the first request waits for them.

        Run it on the engine's thread (start(warm_up=True)), not beside the step loop, and not from
        another thread: the first parallel kernel a thread launches gives that thread its own team of
        OpenMP workers, and a warm-up from the main thread left a second team beside the engine's
        (measured, Gemma 3 270M through bench_server.py, 1 client: 58-64 tok/s against 74-79)."""
        if not self.decoder.GENERATES:  # an encoder: it only embeds, through `call`
            self.model.warm_up()
            return
        bs = self.block_size
        rows = min(prompt_rows, self.seq_ctx - 1)
        need = 1 + -(-rows // bs)
        if rows < 1 or self.pool.available < need:
            return
        decode_row, chunk = SequenceBlocks(), SequenceBlocks()
        self.pool.reserve(need)
        decode_row.reserved, chunk.reserved = 1, need - 1
        if self.states is not None:
            decode_row.state_slot, chunk.state_slot = self.states.take(), self.states.take()
        n_vocab = self.decoder.hp.n_vocab
        tokens = [i % n_vocab for i in range(rows)]
        entries = [(decode_row, tokens[:1], 0), (chunk, tokens, 0)]
        try:
            for blocks, ids, start in entries:
                blocks.ensure(self.pool, start + len(ids))
            layout = self.layouts.build(entries, n_rowwise=1)
            self.decoder.forward_batch(self.cache, layout, np.array([0, rows], dtype=np.int32))
        finally:
            for blocks in (decode_row, chunk):
                self._free(blocks)

    # -- requests ---------------------------------------------------------------------------------------------
    def check(self, request: GenerationRequest) -> None:
        """Raise what the request gets wrong before it queues (ContextOverflow, SamplingError)."""
        if not self.decoder.GENERATES:
            raise LocalLLMError("this is an embedding model: it does not generate text (use the embeddings endpoints)")
        if not request.prompt:
            raise LocalLLMError("the prompt is empty")
        if len(request.prompt) >= self.seq_ctx:
            raise ContextOverflow(len(request.prompt) + 1, self.seq_ctx)
        bad = [t for t in request.prompt if not 0 <= t < self.decoder.hp.n_vocab]
        if bad:
            raise LocalLLMError(f"token ids out of range: {bad[:5]}")
        # validates logit_bias ids against the vocabulary, and compiles a grammar (cached for the sequence)
        Sampler(request.sampling, self.decoder.hp.n_vocab, self.tokenizer)

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> RequestHandle:
        self.check(request)
        handle = RequestHandle(request, loop, self)
        with self._wake:
            if len(self._queue) >= self.max_queue:
                self.stats.rejected += 1
                raise QueueFull(f"the request queue is full ({self.max_queue} waiting); try again later")
            self._queue.append(handle)
            self._wake.notify()
        return handle

    def call(self, fn, loop: asyncio.AbstractEventLoop) -> asyncio.Future:
        """Run fn() on the engine's thread between two steps, with the model to itself (an embedding's
        forward pass): an asyncio future, on `loop`, of its result or its exception. Each call is one
        job, so a caller with much to do (many texts) calls once per piece and the sequences being
        generated go on stepping between them. QueueFull when max_queue jobs wait already."""
        future = loop.create_future()
        with self._wake:
            if len(self._jobs) >= self.max_queue:
                self.stats.rejected += 1
                raise QueueFull(f"the request queue is full ({self.max_queue} waiting); try again later")
            self._jobs.append((fn, loop, future))
            self._wake.notify()
        return future

    def _run_job(self) -> None:
        """The oldest job of `call`, if any."""
        with self._wake:
            if not self._jobs:
                return
            fn, loop, future = self._jobs.popleft()
        try:
            result, error = fn(), None
        except Exception as exc:  # handed to the caller
            result, error = None, exc
        _hand_over(loop, future, result, error)

    @property
    def queue_length(self) -> int:
        return len(self._queue)

    @property
    def n_active(self) -> int:
        return len(self._active)

    # -- the step loop -----------------------------------------------------------------------------------------
    def _run(self, warm_up: bool = False) -> None:
        try:
            if warm_up:
                self.warm_up()
        except Exception as exc:  # kept for whoever waits on `ready` (serve() reports it and stops)
            self.warm_up_error = exc
        finally:
            self.ready.set()
        while not self._stopping:
            self._run_job()
            with self._wake:
                self._drop_cancelled()
                self._admit()
                if not self._active:
                    if not self._jobs:
                        self._wake.wait(timeout=0.5)
                    continue
            try:
                self._step()
            except Exception as exc:  # a bug or an unexpected input: fail the batch, keep serving
                for seq in list(self._active):
                    seq.handle.push(Event("error", text=f"{type(exc).__name__}: {exc}"))
                    self._finish(seq)
        for seq in list(self._active):
            seq.handle.push(Event("error", text="the server is shutting down"))
            self._finish(seq)
        with self._wake:
            jobs, self._jobs = list(self._jobs), deque()
        for _, loop, future in jobs:
            _hand_over(loop, future, None, LocalLLMError("the server is shutting down"))

    def _positions_needed(self, request: GenerationRequest) -> int:
        """Cache positions the request can fill: its prompt and every generated token but the last."""
        budget = request.max_tokens if request.max_tokens is not None else self.seq_ctx
        return min(len(request.prompt) + max(budget - 1, 0), self.seq_ctx)

    def _admit(self) -> None:
        """Move queued requests into the batch, oldest first, while slots and KV blocks allow."""
        bs = self.block_size
        while self._queue and len(self._active) < self.parallel:
            handle = self._queue[0]
            prompt = handle.request.prompt
            limit = len(prompt) - 1  # the last prompt token always runs: its logits are needed
            # a recurrent layer's state cannot be taken from another request's blocks: no prefix reuse there
            hits, lru_hits = self.pool.cached_prefix(prompt, limit) if self.states is None else (0, 0)
            total = -(-self._positions_needed(handle.request) // bs)
            if total - hits > self.pool.available - lru_hits:
                return  # wait for blocks: a finishing sequence frees some
            self._queue.popleft()
            blocks = SequenceBlocks()
            n_cached = blocks.attach_prefix(self.pool, prompt, limit) if self.states is None else 0
            if self.states is not None:
                blocks.state_slot = self.states.take()
            blocks.reserved = total - len(blocks.table)
            self.pool.reserve(blocks.reserved)
            seq = Sequence(handle, self.tokenizer, self.decoder.hp.n_vocab, blocks, n_cached, self.seq_ctx,
                           self.speculation, *self._speculation_parts())
            self.stats.admitted(len(prompt), n_cached)
            self._active.append(seq)

    def _drop_cancelled(self) -> None:
        for handle in [h for h in self._queue if h.cancelled]:
            self._queue.remove(handle)
            self.stats.cancelled += 1
        for seq in [s for s in self._active if s.handle.cancelled]:
            self.stats.cancelled += 1
            self._finish(seq)

    def _step(self) -> None:
        decoding = [s for s in self._active if s.decoding]
        prefilling = [s for s in self._active if not s.decoding]
        for seq in decoding:
            seq.drafts = self._draft(seq)
        entries = [(s.blocks, s.ids[s.n_past :] + s.drafts, s.n_past) for s in decoding]
        n_rowwise = sum(len(chunk) for _, chunk, _ in entries)  # every decoding row, as a T=1 step computes it
        n_out = [len(s.drafts) + 1 for s in decoding]  # logits rows per sequence: its last token's, its drafts'
        runs = list(decoding)
        budget = self.prefill_chunk
        for seq in prefilling:  # prompt chunks, oldest request first, while they fit in one chunk's rows
            end = min(seq.n_past + self.prefill_chunk, seq.n_prompt)
            if self.states is not None and seq.n_past < seq.n_prompt - 1:
                end = min(end, seq.n_prompt - 1)  # recurrent layers: the last token alone, as `prefill` runs it
            if runs[len(decoding):] and end - seq.n_past > budget:
                break
            budget -= end - seq.n_past
            entries.append((seq.blocks, seq.ids[seq.n_past : end], seq.n_past))
            n_out.append(int(end == seq.n_prompt))  # the prompt's last row gives the first token
            runs.append(seq)
        for (blocks, chunk, start) in entries:
            blocks.ensure(self.pool, start + len(chunk))
        layout = self.layouts.build(entries, n_rowwise=n_rowwise)
        logit_rows = self._logit_rows(layout, n_out)
        for seq in decoding:  # recurrent layers: the state before the step, should a draft be refused
            if seq.drafts and self.states is not None:
                self.states.save(seq.blocks.state_slot)
        t0 = time.perf_counter()
        logits = self.decoder.forward_batch(self.cache, layout, logit_rows)
        self.stats.step(time.perf_counter() - t0, len(layout.tokens))
        first = 0  # the sequence's first row of logits
        for i, seq in enumerate(runs):
            rows = logits[first : first + n_out[i]]
            first += n_out[i]
            if i < len(decoding):
                self._verify(seq, rows)
                continue
            seq.n_past += len(entries[i][1])
            seq.blocks.publish(self.pool, seq.ids, seq.n_past)
            if n_out[i]:
                self._sample(seq, rows[0])

    @staticmethod
    def _logit_rows(layout, n_out: list) -> np.ndarray:
        """int32[sum(n_out)]: the last n_out[s] rows of each sequence s, in row order."""
        ends = layout.seq_first + layout.seq_rows
        return np.array([r for end, n in zip(ends.tolist(), n_out) for r in range(end - n, end)], dtype=np.int32)

    def _speculation_parts(self) -> tuple:
        """(DraftLength, DraftModel or None) for a new sequence, (None, None) without speculation."""
        spec = self.speculation
        if spec is None:
            return None, None
        draft = None
        if spec.draft is not None:
            draft = DraftModel(spec.draft, self.tokenizer, self.decoder.hp.n_vocab, spec.draft_p_min, check=False)
        return spec.draft_length(self.model), draft

    def _draft(self, seq: Sequence) -> list:
        """The tokens seq drafts for this step (none without speculation): at most its DraftLength, as many
        as leave the context and its token budget room for the token after them (speculative_steps'
        bounds, which also keep every position inside the blocks it reserved), and no more than make its
        rows MAX_VERIFY_ROWS (below the batch thresholds of attention and matmul)."""
        seq.probs = None
        if not seq.drafters:
            return []
        position = len(seq.ids) - 1  # where the last sampled token goes
        rows_before = len(seq.ids) - seq.n_past  # kept rows a refusal left to run again (_verify)
        k = draft_size(seq.length, seq.out, position, self.seq_ctx, cap=MAX_VERIFY_ROWS - rows_before)
        drafts, seq.probs = propose(seq.drafters, seq.ids, k)  # probs: a sampled draft model's q, else None
        return drafts

    def _verify(self, seq: Sequence, logits: np.ndarray) -> None:
        """A decoding sequence's step: logits [1 + len(drafts), vocab], the rows of its last sampled token
        and of its drafts. Row by row the acceptance rule (Sampler.verify) keeps the draft or emits its
        own token and ends; a row after every draft kept gives one more token (speculative_steps' loop).

        Refused drafts' K and V sit past the kept positions, and the next step writes over them. Recurrent
        layers cannot be cut back: after a refusal the slot goes back to its state before this step
        (saved in _step) and n_past with it, so the next step runs this step's kept rows again, in its
        own rows before its new ones (no forward pass of its own; each row again as a T=1 step computes
        it, so exact). Those rows count in the next step's MAX_VERIFY_ROWS (_draft)."""
        out, drafts, start = seq.out, seq.drafts, seq.n_past
        position = len(seq.ids) - 1  # the first logits row's token's position
        verdict, failed = Verdict([], []), False
        try:
            accept_rows(seq.sampler, out, logits, drafts, seq.probs, position, verdict)
        except SamplingError as exc:  # this request's settings leave no token (e.g. its grammar): it alone fails
            verdict.events.append(Event("error", text=str(exc)))
            failed = True
        for event in verdict.events:
            seq.handle.push(event)
        self.stats.generated(len(verdict.tokens))
        if failed:
            self._finish(seq)
            return
        kept, accepted = verdict.kept, verdict.accepted
        seq.n_past = position + 1 + kept
        if drafts:
            seq.timings.draft_tokens += len(drafts)
            seq.timings.draft_accepted += accepted
            self.stats.drafted(len(drafts), accepted)
            seq.length.update(len(drafts), kept)
            if kept < len(drafts) and self.states is not None and out.finish is None:
                self.states.restore(seq.blocks.state_slot)
                seq.n_past = start
        seq.blocks.publish(self.pool, seq.ids, seq.n_past)
        if out.finish is not None:
            self._done(seq)

    def _sample(self, seq: Sequence, logits: np.ndarray) -> None:
        """Sample seq's next token and deliver what it produces (engine/sequence.py decides)."""
        out = seq.out
        if out.finish is None:  # (a request for 0 tokens is finished before its first)
            try:
                token = seq.sampler.sample(logits, seq.ids)
            except SamplingError as exc:  # this request's settings leave no token (e.g. its grammar): it alone fails
                seq.handle.push(Event("error", text=str(exc)))
                self._finish(seq)
                return
            event = out.accept(token, logits, seq.n_past)
            if out.generated == 1:  # the prompt's time, for the server, runs until its first token
                seq.timings.prompt_seconds = seq.timings.time_to_first_token
            self.stats.generated(1)
            if event is not None:
                seq.handle.push(event)
        if out.finish is not None:
            self._done(seq)

    def _done(self, seq: Sequence) -> None:
        for event in seq.out.close():
            seq.handle.push(event)
        self.stats.completed += 1
        self._finish(seq)

    def _finish(self, seq: Sequence) -> None:
        self._free(seq.blocks)
        if seq in self._active:
            self._active.remove(seq)

    def _free(self, blocks: SequenceBlocks) -> None:
        blocks.free(self.pool)
        if blocks.state_slot >= 0:
            self.states.give(blocks.state_slot)
            blocks.state_slot = -1


def _hand_over(loop, future: asyncio.Future, result, error) -> None:
    """A job's outcome to its caller's loop (nothing when that loop has closed meanwhile)."""
    try:
        loop.call_soon_threadsafe(_settle, future, result, error)
    except RuntimeError:
        pass


def _settle(future: asyncio.Future, result, error) -> None:
    """On the caller's loop: a job's outcome into its future (unless the caller gave up on it)."""
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
