"""Perplexity of a model on a text, and its KL divergence from a base model, as llama.cpp measures them.

The method of llama.cpp's `llama-perplexity` (tools/perplexity/perplexity.cpp, `perplexity()`):
- the whole text is tokenized once (BOS first when the vocabulary adds one);
- it is cut into n_tokens // ctx non-overlapping windows of ctx tokens (a tail shorter than ctx is
  not used); at least two windows are needed;
- each window is evaluated from an empty cache, its first token replaced by BOS when the vocabulary
  adds BOS (so every window starts the way a prompt does);
- only the second half is scored: with first = ctx // 2, the logits at positions first .. ctx-2
  predict tokens first+1 .. ctx-1 (ctx - 1 - first tokens per window), so each scored token has at
  least ctx/2 tokens of context;
- per scored token v = -log softmax(logits)[next token]; over all N scored tokens
  PPL = exp(mean v), and its standard error PPL * sqrt((mean v^2 - (mean v)^2) / (N - 1)).
KL mode (llama.cpp's `--kl-divergence`): both models over the same windows and positions; per token
KL(base || model) = sum_i p_base,i (log p_base,i - log p_model,i); reported as the mean with its
standard error, and the share of tokens where both models' most likely token agrees.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import numpy as np

from .errors import LocalLLMError

MIN_CTX = 16
# Positions evaluated per forward call in the scored half: bounds the logits buffer (rows x vocabulary
# floats: 256 x 262,144 x 4 bytes = 256 MiB for Gemma) whatever --ctx is, while a prefill call still
# covers the whole scored half at --ctx 512 (each call re-reads the output matrix, 70% of Gemma's weights).
SCORE_BATCH = 256
# Rows turned into float64 log-probabilities at a time (64 x 262,144 x 8 bytes = 128 MiB for Gemma).
ROWS_PER_STEP = 64

Progress = Callable[[int, int], None]  # (windows done, windows in all)


class PerplexityError(LocalLLMError):
    """Input perplexity cannot be measured on (empty or too short text, a bad context size, models
    with different vocabularies)."""


@dataclass
class KLStats:
    kld: float  # mean KL(base || model) in nats per scored token
    kld_stderr: float
    top1_agreement: float  # percent of scored tokens where both models' argmax is the same token
    top1_agreement_stderr: float
    base_ppl: float
    base_ppl_stderr: float


@dataclass
class PerplexityResult:
    ppl: float
    ppl_stderr: float
    n_windows: int
    n_scored: int
    n_tokens: int
    ctx: int
    kl: Optional[KLStats] = None

    def to_json(self) -> dict:
        out = {"ppl": self.ppl, "ppl_stderr": self.ppl_stderr, "n_windows": self.n_windows, "n_scored": self.n_scored}
        if self.kl is not None:
            out.update(asdict(self.kl))
        return out


class _Moments:
    """Running sums of a per-token quantity, for its mean and the standard error of the mean."""

    def __init__(self) -> None:
        self.n, self.total, self.total_sq = 0, 0.0, 0.0

    def add(self, values: np.ndarray) -> None:
        self.n += values.size
        self.total += float(values.sum())
        self.total_sq += float((values * values).sum())

    def mean(self) -> float:
        return self.total / self.n

    def stderr(self) -> float:
        """sqrt((E[v^2] - E[v]^2) / (n - 1)); 0 when that variance is not positive (llama.cpp prints none)."""
        mean = self.mean()
        var = self.total_sq / self.n - mean * mean
        return math.sqrt(var / (self.n - 1)) if var > 0 and self.n > 1 else 0.0


def windows(tokens: list[int], ctx: int, bos_id: Optional[int]) -> list[np.ndarray]:
    """The n_tokens // ctx windows of ctx tokens; the first token of each set to bos_id unless None."""
    out = []
    for i in range(len(tokens) // ctx):
        window = np.array(tokens[i * ctx:(i + 1) * ctx], dtype=np.int32)
        if bos_id is not None:
            window[0] = bos_id
        out.append(window)
    return out


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Rows of float logits -> float64 log-probabilities."""
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    x -= np.log(np.exp(x).sum(axis=-1, keepdims=True))
    return x


def token_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log softmax(row)[target] per row, in float64 (log-sum-exp less the target's logit)."""
    x = logits.astype(np.float64)
    top = x.max(axis=-1)
    lse = top + np.log(np.exp(x - top[:, None]).sum(axis=-1))
    return lse - x[np.arange(len(targets)), targets]


def _scored_chunks(model, window: np.ndarray, session, batch: int):
    """Yield (logits rows, positions) for positions first .. ctx-2 of `window`, evaluated in order from
    position 0 with the model's KV cache (the first half once, the scored half `batch` rows at a time).
    The rows live in the decoder's buffer: use them before the next chunk."""
    ctx = len(window)
    first = ctx // 2
    decoder, cache = model.decoder, session.cache
    session.reset()
    decoder.forward(window[:first], 0, cache, all_logits=False)
    for start in range(first, ctx - 1, batch):
        stop = min(start + batch, ctx - 1)
        yield decoder.forward(window[start:stop], start, cache, all_logits=True), np.arange(start, stop)


def _check(model, tokens: list[int], ctx: int, base) -> None:
    if ctx < MIN_CTX:
        raise PerplexityError(f"context size {ctx} is too small (minimum {MIN_CTX})")
    trained = model.decoder.hp.context_length
    if ctx > trained:
        raise PerplexityError(f"context size {ctx} exceeds the model's training context ({trained} tokens)")
    if ctx > model.n_ctx:
        raise PerplexityError(f"context size {ctx} exceeds the loaded context ({model.n_ctx}); load the model with n_ctx >= {ctx}")
    if len(tokens) < 2 * ctx:
        raise PerplexityError(
            f"the text has {len(tokens)} tokens; at least {2 * ctx} (two windows of {ctx}) are needed (use a longer text or a smaller --ctx)"
        )
    if base is not None:
        if base.tokenizer.tokens != model.tokenizer.tokens:
            raise PerplexityError("the base model has a different vocabulary; KL divergence needs the same tokens")
        if ctx > base.n_ctx:
            raise PerplexityError(f"context size {ctx} exceeds the base model's loaded context ({base.n_ctx})")


def perplexity(model, text: str, ctx: int = 512, base=None, progress: Optional[Progress] = None,
               batch: int = SCORE_BATCH) -> PerplexityResult:
    """Perplexity of `model` (a loaded localllm Model) on `text` with windows of `ctx` tokens; with
    `base` (another Model, same vocabulary) also KL(base || model) and top-1 agreement."""
    if not text or not text.strip():
        raise PerplexityError("the text is empty")
    tokens = model.tokenize(text)
    _check(model, tokens, ctx, base)
    tok = model.tokenizer
    bos = tok.bos_id if tok.add_bos and tok.bos_id is not None else None
    chunks = windows(tokens, ctx, bos)
    nll, base_nll, kld, same = _Moments(), _Moments(), _Moments(), _Moments()
    session = model.new_session()
    base_session = base.new_session() if base is not None else None
    for index, window in enumerate(chunks):
        base_chunks = _scored_chunks(base, window, base_session, batch) if base is not None else None
        for logits, positions in _scored_chunks(model, window, session, batch):
            base_logits = None
            if base_chunks is not None:
                # Same decoder when base is model: its buffer is about to be overwritten, keep a copy.
                logits = logits.copy() if base is model else logits
                base_logits, _ = next(base_chunks)
            for lo in range(0, len(positions), ROWS_PER_STEP):
                rows = slice(lo, lo + ROWS_PER_STEP)
                targets = window[positions[rows] + 1]
                if base_logits is None:
                    nll.add(token_nll(logits[rows], targets))
                    continue
                logp, base_logp = log_softmax(logits[rows]), log_softmax(base_logits[rows])
                picked = np.arange(len(targets))
                nll.add(-logp[picked, targets])
                base_nll.add(-base_logp[picked, targets])
                kld.add((np.exp(base_logp) * (base_logp - logp)).sum(axis=-1))
                same.add((base_logp.argmax(-1) == logp.argmax(-1)).astype(np.float64))
        if progress is not None:
            progress(index + 1, len(chunks))
    ppl = math.exp(nll.mean())
    kl = None
    if base is not None:
        agree = same.mean()
        base_ppl = math.exp(base_nll.mean())
        kl = KLStats(
            kld=kld.mean(), kld_stderr=kld.stderr(),
            top1_agreement=100.0 * agree,
            top1_agreement_stderr=100.0 * math.sqrt(agree * (1 - agree) / (same.n - 1)),
            base_ppl=base_ppl, base_ppl_stderr=base_ppl * base_nll.stderr(),
        )
    return PerplexityResult(ppl=ppl, ppl_stderr=ppl * nll.stderr(), n_windows=len(chunks), n_scored=nll.n,
                            n_tokens=len(tokens), ctx=ctx, kl=kl)


def read_text(path) -> str:
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        raise PerplexityError(f"{path}: no such file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise PerplexityError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def perplexity_of_file(model_name, text_path, ctx: int = 512, base_name=None, threads: Optional[int] = None,
                       progress: Optional[Progress] = None) -> PerplexityResult:
    """Load MODEL (and BASE) with a context of `ctx` and measure on the file's text. The text and `ctx`
    are checked before any model is loaded (a huge ctx never allocates a KV cache)."""
    from .api import load

    text = read_text(text_path)
    if not text.strip():
        raise PerplexityError(f"{text_path}: the text is empty")
    if ctx < MIN_CTX:
        raise PerplexityError(f"context size {ctx} is too small (minimum {MIN_CTX})")
    _check_trained_context(model_name, ctx)
    with load(model_name, n_ctx=ctx, threads=threads) as model:
        if base_name is None:
            return perplexity(model, text, ctx, progress=progress)
        _check_trained_context(base_name, ctx)
        with load(base_name, n_ctx=ctx, threads=threads) as base:
            return perplexity(model, text, ctx, base=base, progress=progress)


def _check_trained_context(model_name, ctx: int) -> None:
    from .gguf import GGUFReader
    from .hub.resolve import resolve_model

    with GGUFReader(resolve_model(None if model_name is None else str(model_name))) as reader:
        trained = reader.metadata.get_int(reader.arch_key("context_length"), None, min=1)  # GGUFError if not an integer
    if trained is not None and ctx > int(trained):
        raise PerplexityError(f"context size {ctx} exceeds the model's training context ({int(trained)} tokens)")
