"""Token sampling: logits -> the next token id; log-probabilities; stop strings. The settings (SamplingConfig,
its defaults and ranges) are localllm/sampling_config.py, re-exported here.

The chain is llama.cpp's default order (common/sampling.cpp), each step working on the candidates the
previous one left:

    logit bias -> penalties -> grammar -> top-k -> typical-p -> top-p -> min-p -> temperature -> draw

- logit bias: `logit[id] += bias` (-inf bans a token; a large positive bias forces it).
- penalties, over the last `repeat_last_n` tokens of the history (-1: all of it, 0: none):
  repetition (CTRL paper, as llama.cpp): every token seen has a positive logit divided by
  `repeat_penalty` and a negative one multiplied by it; frequency/presence (OpenAI):
  `logit -= count * frequency_penalty + (count > 0) * presence_penalty`.
- grammar (config.grammar, GBNF; localllm/grammar/): tokens the grammar does not allow next get -inf, so
  whatever follows draws only from allowed ones (llama.cpp applies it to the candidates it is about to
  draw from; here it comes before top-k, so top-k's k tokens are all allowed ones).
- top-k keeps the k largest logits (0: off). typical-p, top-p and min-p measure probabilities with the
  softmax of the *current candidates at temperature 1* (temperature is applied after them, as in
  llama.cpp):
  typical-p keeps the tokens whose surprise -log p is closest to the entropy, fewest first, until their
  probability reaches `typical_p` (1: off); top-p keeps the smallest most-likely prefix whose probability
  reaches `top_p` (1: off); min-p drops tokens with p < min_p * p_max (0: off). Each keeps >= 1 token.
- temperature divides the survivors' logits, and a token is drawn from their softmax with the sampler's
  own `numpy.random.Generator(PCG64(seed))`. temperature <= 0 is greedy: argmax after bias and
  penalties, no randomness used.

Cost at a 262,144-token vocabulary with default settings: two passes over the logits (top-k, see
_top_k) and work on 40 candidates, well under a millisecond; the caller's logits are never written
(bias and penalties work on a copy, made only when they are active).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .sampling_config import SamplingConfig, SamplingError, is_int, require

__all__ = ["SamplingConfig", "SamplingError", "Sampler", "StopMatcher", "logprobs"]

# Scores per slice whose maxima set top-k's floor (_top_k): 1,024 slices at a 262,144-token vocabulary.
_TOP_K_SLICE = 256
# Above this many candidates, top-p sorts progressively (largest first) instead of sorting them all.
_PARTIAL_SORT_START = 1024


# -- the chain's steps, on candidate arrays (ids, logits) -------------------------------------------------


def _softmax64(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits.astype(np.float64) - float(np.max(logits)))
    return shifted / shifted.sum()


def _top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest finite scores, largest first, a tie going to the lower id (as llama.cpp's
    top-k leaves its candidates: sorted); all finite ones, in id order, when k is 0 or >= n.

    Not one argpartition over the vocabulary: that costs milliseconds at a 262,144-token vocabulary,
    and ten times more once a grammar has set most scores to -inf (its selection degrades on many
    equal values; figures in docs/performance.md). First a floor no higher than the k-th largest value: the k-th largest of the maxima of disjoint slices
    of _TOP_K_SLICE scores (k distinct values reach it); then only the scores at or above it are
    ranked. Where that floor is not finite (a grammar's mask leaves fewer than k slices any finite
    score), or fewer than k finite scores reach it (a maximum was +inf, which is no candidate), the
    finite scores are the ones ranked."""
    n = scores.shape[0]
    if not 0 < k < n:
        ids = np.arange(n)
        finite = np.isfinite(scores)
        return ids if finite.all() else ids[finite]
    slices = max(k, n // _TOP_K_SLICE)
    maxima = scores[: n - n % slices].reshape(slices, -1).max(axis=1)
    floor = np.partition(maxima, slices - k)[slices - k]  # NaN sorts as the largest
    ids = np.flatnonzero(scores >= floor) if np.isfinite(floor) else np.empty(0, dtype=np.intp)
    ids = ids[np.isfinite(scores[ids])]
    if ids.size < k:
        ids = np.flatnonzero(np.isfinite(scores))
    if ids.size > k:  # keep the k largest (ids ascending: a tie at the k-th value keeps the lower ids)
        values = scores[ids]
        kth = np.partition(values, ids.size - k)[ids.size - k]
        above = ids[values > kth]
        ids = np.concatenate([above, ids[values == kth][: k - above.size]])
    return ids[np.lexsort((ids, -scores[ids]))]  # by score, largest first; then by id


def _typical(logits: np.ndarray, mass: float) -> np.ndarray:
    """Locally typical sampling (Meister et al.): keep tokens whose -log p is closest to the entropy H,
    in that order, until their probability reaches `mass`."""
    probs = _softmax64(logits)
    log_probs = np.log(np.maximum(probs, np.finfo(np.float64).tiny))
    entropy = -np.sum(probs * log_probs)
    order = np.argsort(np.abs(-log_probs - entropy), kind="stable")
    keep = int(np.searchsorted(np.cumsum(probs[order]), mass, side="left")) + 1
    return order[: min(max(keep, 1), order.size)]


def _top_p(logits: np.ndarray, mass: float, at_most: int | None = None) -> np.ndarray:
    """Indices (into `logits`) of the smallest most-likely set whose probability reaches `mass`.

    Only the leading part of the sorted order matters, so large candidate sets are sorted in growing
    chunks of their largest elements (_top_k) until a chunk's probability reaches `mass`.
    `at_most`: only that many leading tokens can survive later anyway (min-p's count), so the search
    stops there, keeping them all when they do not reach `mass`. Probabilities are normalized over all
    of `logits` either way."""
    n = logits.size
    limit = n if at_most is None else max(1, min(n, at_most))
    weights = np.exp(logits.astype(np.float64) - float(np.max(logits)))
    total = weights.sum()
    chunk = min(limit, _PARTIAL_SORT_START)
    while True:
        if chunk < n:
            head = _top_k(logits, chunk)  # sorted, largest first (logits here are all finite)
        else:
            head = np.argsort(-logits, kind="stable")
        cumulative = np.cumsum(weights[head]) / total
        if cumulative[-1] >= mass or chunk == limit:
            keep = int(np.searchsorted(cumulative, mass, side="left")) + 1
            return head[: min(keep, head.size)]
        chunk = min(limit, chunk * 8)


def _min_p(logits: np.ndarray, ratio: float) -> np.ndarray:
    """Indices of the tokens with p >= ratio * p_max, i.e. logit >= max_logit + log(ratio)."""
    return np.flatnonzero(logits.astype(np.float64) >= float(np.max(logits)) + math.log(ratio))


class Sampler:
    """Picks next tokens with one SamplingConfig; owns its random generator (seeded: reproducible)."""

    def __init__(self, config: SamplingConfig, n_vocab: int, tokenizer=None):
        """`tokenizer`: the model's, needed when the config has a grammar (the tokens' bytes)."""
        require(is_int(n_vocab) and n_vocab > 0, "n_vocab", "a positive integer", n_vocab)
        self.config = config
        self.n_vocab = int(n_vocab)
        # PCG64(None) draws its seed from the OS's entropy source.
        self.rng = np.random.Generator(np.random.PCG64(config.seed))
        bias = config.logit_bias or {}
        too_large = [t for t in bias if t >= self.n_vocab]
        require(not too_large, "logit_bias", f"keyed by token ids < {self.n_vocab} (the vocabulary size)", too_large[:5])
        self._bias_ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
        self._bias_values = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
        self.constraint = None
        if config.grammar is not None:
            from .grammar.constraint import Constraint, compile_grammar

            if tokenizer is None:
                raise SamplingError("a grammar needs the model's tokenizer (Sampler(..., tokenizer=...))")
            self.constraint = Constraint(compile_grammar(config.grammar, tokenizer, self.n_vocab, config.special_tokens))

    # -- public -----------------------------------------------------------------------------------------
    def sample(self, logits: np.ndarray, history: Sequence[int]) -> int:
        """The next token id for float32[n_vocab] logits, given the tokens so far (prompt + generated).
        With a grammar, only the tokens it allows can be drawn, and the chosen one advances it."""
        scores = self._allowed(logits, history)
        token = self._choose(scores)
        if self.constraint is not None:
            self.constraint.accept(token)
        return token

    def _allowed(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        """The logits after bias and penalties, and the grammar's mask when there is one."""
        scores = self.adjusted(logits, history)
        return scores if self.constraint is None else self.constraint.apply(scores)

    def verify(self, logits: np.ndarray, history: Sequence[int], draft: int, draft_probs=None) -> tuple[int, bool]:
        """Speculative decoding's acceptance rule (Leviathan et al. 2023; Chen et al. 2023) for a drafted
        token: (the token to emit, whether it is the draft). The emitted token is distributed exactly as
        `sample(logits, history)`'s, whatever the draft. Greedy: the draft is kept when it is the argmax,
        else the argmax is emitted. Sampling, with p the distribution `sample` draws from: the draft x is
        kept with probability min(1, p(x) / q(x)), else a token is drawn from max(0, p - q) normalised.
        draft_probs: q, float[n_vocab], the distribution x was drawn from; None for a draft chosen
        without chance (a lookup, a greedy draft model): q is one-hot at x, so x is kept with probability
        p(x) and a refusal draws from p without x. The grammar, if any, advances with the emitted token."""
        scores = self._allowed(logits, history)
        if self.config.temperature <= 0:
            token = self._choose(scores)
        else:
            token = self._verify_draw(scores, int(draft), draft_probs)
        if self.constraint is not None:
            self.constraint.accept(token)
        return token, token == draft

    def _verify_draw(self, scores: np.ndarray, draft: int, draft_probs) -> int:
        self._choose_checks(scores)
        ids, kept = self.candidates(scores)
        p = _softmax64(kept / np.float32(self.config.temperature))
        at = np.flatnonzero(ids == draft)
        p_draft = float(p[at[0]]) if at.size else 0.0
        q_draft = 1.0 if draft_probs is None else float(draft_probs[draft])
        if self.rng.random() * q_draft < p_draft:
            return draft
        q = np.zeros(ids.size) if draft_probs is None else np.asarray(draft_probs, dtype=np.float64)[ids]
        if draft_probs is None and at.size:
            q[at[0]] = 1.0
        residual = np.maximum(p - q, 0.0)
        if not residual.sum() > 0.0:  # only reachable through rounding (p <= q everywhere means p == q)
            residual = p
        return int(ids[self.draw(residual)])

    def probabilities(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        """float64[n_vocab]: the distribution `sample` draws from (zero outside the candidates; one-hot at
        the argmax when greedy). A draft model's q (verify's draft_probs). Does not advance the grammar."""
        scores = self._allowed(logits, history)
        out = np.zeros(self.n_vocab)
        if self.config.temperature <= 0:
            out[self._choose(scores)] = 1.0
            return out
        self._choose_checks(scores)
        ids, kept = self.candidates(scores)
        out[ids] = _softmax64(kept / np.float32(self.config.temperature))
        return out

    def draw(self, weights: np.ndarray) -> int:
        """An index drawn in proportion to float64 weights (>= 0, not all 0) with this sampler's generator:
        one uniform number against their cumulative sum."""
        cumulative = np.cumsum(weights)
        point = self.rng.random() * cumulative[-1]
        return min(int(np.searchsorted(cumulative, point, side="right")), weights.size - 1)

    @staticmethod
    def _choose_checks(scores: np.ndarray) -> None:
        best = float(np.max(scores))
        if math.isnan(best):
            raise SamplingError("the logits contain NaN")
        if best == -math.inf:
            raise SamplingError("every token is banned (all logits are -inf after logit_bias and the grammar)")

    def _choose(self, scores: np.ndarray) -> int:
        self._choose_checks(scores)
        if self.config.temperature <= 0:
            return int(np.argmax(scores))
        ids, logits_kept = self.candidates(scores)
        return int(ids[self._draw(logits_kept / np.float32(self.config.temperature))])

    def candidates(self, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The (ids, logits) that top-k, typical-p, top-p and min-p leave of `scores` (already biased and
        penalized), before temperature. Exposed for tests and for inspection."""
        cfg = self.config
        ids = _top_k(scores, cfg.top_k)
        kept = scores[ids]
        if cfg.typical_p < 1.0 and ids.size > 1:
            pick = _typical(kept, cfg.typical_p)
            ids, kept = ids[pick], kept[pick]
        if cfg.top_p < 1.0 and ids.size > 1:
            # min-p (next) keeps the tokens above a logit threshold set by the maximum, which top-p never
            # removes: so only those can survive both, and top-p need not sort past them.
            survivors = _min_p(kept, cfg.min_p).size if cfg.min_p > 0.0 else None
            pick = _top_p(kept, cfg.top_p, at_most=survivors)
            ids, kept = ids[pick], kept[pick]
        if cfg.min_p > 0.0 and ids.size > 1:
            pick = _min_p(kept, cfg.min_p)
            ids, kept = ids[pick], kept[pick]
        return ids, kept

    def adjusted(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        """The logits after logit bias and penalties: a new array when either changes anything, else
        the caller's own (float32) array, which is never written."""
        scores = np.asarray(logits)
        if scores.shape != (self.n_vocab,):
            raise SamplingError(f"logits must have shape ({self.n_vocab},), got {scores.shape}")
        converted = scores.dtype != np.float32
        if converted:
            scores = scores.astype(np.float32)  # a new array, ours to change
        window = self._penalty_window(history)
        if self._bias_ids.size == 0 and window is None:
            return scores  # nothing to change, so no copy
        if not converted:
            scores = scores.copy()  # never write the caller's logits
        if self._bias_ids.size:
            scores[self._bias_ids] += self._bias_values
        if window is not None:
            self._penalize(scores, window)
        return scores

    # -- steps ---------------------------------------------------------------------------------------------
    def _penalty_window(self, history: Sequence[int]) -> np.ndarray | None:
        cfg = self.config
        active = cfg.repeat_penalty != 1.0 or cfg.frequency_penalty != 0.0 or cfg.presence_penalty != 0.0
        if not active or cfg.repeat_last_n == 0 or len(history) == 0:
            return None
        recent = history if cfg.repeat_last_n == -1 else history[-cfg.repeat_last_n :]
        window = np.asarray(recent, dtype=np.int64)
        window = window[(window >= 0) & (window < self.n_vocab)]
        return window if window.size else None

    def _penalize(self, scores: np.ndarray, window: np.ndarray) -> None:
        cfg = self.config
        ids, counts = np.unique(window, return_counts=True)
        seen = scores[ids]
        if cfg.repeat_penalty != 1.0:
            penalty = np.float32(cfg.repeat_penalty)
            seen = np.where(seen > 0, seen / penalty, seen * penalty)
        if cfg.frequency_penalty != 0.0 or cfg.presence_penalty != 0.0:
            seen = seen - (counts * cfg.frequency_penalty + cfg.presence_penalty).astype(np.float32)
        scores[ids] = seen

    def _draw(self, logits: np.ndarray) -> int:
        """Index drawn from softmax(logits): one uniform number against the cumulative weights."""
        if logits.size == 1:
            return 0
        return self.draw(np.exp(logits.astype(np.float64) - float(np.max(logits))))


# -- log-probabilities ---------------------------------------------------------------------------------------


def logprobs(logits: np.ndarray, token: int, top_n: int) -> tuple[float, list[tuple[int, float]]]:
    """log softmax(logits)[token], and the top_n (id, logprob) pairs, most likely first ([] for top_n 0).

    The normalizer is summed in float64 over float32 exponentials: about 1e-7 relative error, at a
    fraction of a full float64 pass's cost (this runs every decode step)."""
    x = np.asarray(logits)
    if x.ndim != 1 or x.size == 0:
        raise SamplingError(f"logits must be a non-empty 1-D array, got shape {x.shape}")
    require(is_int(token) and 0 <= token < x.size, "token", f"an id between 0 and {x.size - 1}", token)
    require(is_int(top_n) and top_n >= 0, "top_n", "an integer >= 0", top_n)
    peak = float(np.max(x))
    log_normalizer = peak + math.log(float(np.exp(x - np.float32(peak), dtype=np.float32).sum(dtype=np.float64)))
    chosen = float(x[token]) - log_normalizer
    if top_n == 0:
        return chosen, []
    head = _top_k(x, top_n) if top_n < x.size else np.argsort(-x, kind="stable")  # (ids of finite logits)
    return chosen, [(int(i), float(x[i]) - log_normalizer) for i in head]


# -- stop strings -----------------------------------------------------------------------------------------------


class StopMatcher:
    """Cuts streamed text at the first stop string, holding back text that might be the start of one.

    feed(text) returns (text safe to emit now, stopped). A suffix of what has been fed that is a prefix
    of some stop string is held back until later text decides it; on a match, the text before the stop
    string is returned with True, and every later feed returns ("", True). flush() returns the held-back
    text when generation ends without a stop. Empty stop strings are ignored.

    A stop string counts as soon as it is complete, as in llama.cpp: with stops "abcd" and "c", the text
    "abc" stops at "c" even though "abcd" might have begun earlier. Otherwise the result does not depend
    on how the text is split into feeds."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in dict.fromkeys(stops or []) if s]
        self.stopped = False
        self._held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        buffer = self._held + text
        if not self.stops:
            return buffer, False
        first = min((i for i in (buffer.find(s) for s in self.stops) if i >= 0), default=-1)
        if first >= 0:
            self.stopped = True
            self._held = ""
            return buffer[:first], True
        hold = self._longest_partial_stop(buffer)
        self._held = buffer[len(buffer) - hold :] if hold else ""
        return buffer[: len(buffer) - hold], False

    def flush(self) -> str:
        if self.stopped:
            return ""
        held, self._held = self._held, ""
        return held

    def _longest_partial_stop(self, buffer: str) -> int:
        """Length of the longest suffix of `buffer` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self.stops:
            for length in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:length]):
                    longest = length
                    break
        return longest
