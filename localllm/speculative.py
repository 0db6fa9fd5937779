"""Speculative decoding: guess several next tokens cheaply, check them all in one forward pass of the model.

Decoding reads every weight once per token, so its speed is the memory's. A forward pass over a few
rows reads the weights once for all of them (the multi-row kernels), so checking k guessed tokens costs
little more than producing one; every guess the model agrees with is a token for free.

A step, with t the last token emitted (not yet in the cache) at position p:
  1. a drafter proposes d1..dk (PromptLookup: tokens copied from earlier in the context; DraftModel: a
     small model with the same vocabulary);
  2. Decoder.verify runs t, d1..dk at positions p..p+k: row i's logits are, bit for bit, those a decode
     step would give after t, d1..di;
  3. row by row, the sampler's acceptance rule (Sampler.verify) keeps d(i+1) or emits its own token in
     its place and ends the step; when every draft is kept, the last row gives one more token.
So greedy output is the plain decode's token for token, and sampled output has plain sampling's
distribution. Positions past the kept tokens hold refused drafts' K and V: a sequence's next step writes
over them before anything reads them. Recurrent layers cannot be cut back, so a step that refuses part of
its draft restores their state as it was before the step (KVCache.save_state) and runs the kept tokens
again.

DraftLength chooses k from the drafts' recent acceptance and what a drafted token costs: long drafts
while they are kept, none while a drafter's guesses are mostly refused (so prompt lookup costs little
where the answer repeats nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .errors import LocalLLMError
from .model.decoder import MAX_VERIFY_ROWS

# The most tokens one step drafts (Decoder.verify takes one row more).
MAX_DRAFT = 16
# What one more verified row costs, in decode steps (DraftLength's model): measured with
# scripts/bench_speculative.py --costs, verify of k + 1 rows against one decode step, 2 threads: Gemma 3
# 270M 0.17 per row (its 262k-token output projection is most of it), the Llama-3-8B-shaped file 0.14;
# the server's steps 0.16-0.2 (docs/performance.md, docs/server.md).
ROW_COST = 0.2
# A draft model stops drafting when its most likely next token has less than this probability (at
# temperature 1): a guess it is unsure of is mostly refused, and each refused row costs a row of
# verification. (llama.cpp's --draft-p-min defaults to 0.75 in its server; 0.5 here, a guess at even
# odds, not tuned: no draft pair with real weights of two sizes is at hand.)
DRAFT_P_MIN = 0.5
# Tokens whose text must agree for a draft model's vocabulary to be the target's: all of them, as
# llama.cpp's common_speculative_are_compatible checks, from id 5 (the first few are often control
# tokens that differ between sizes of a family), with vocabulary sizes at most 128 apart.
VOCAB_CHECK_START = 5
VOCAB_MAX_SIZE_DIFFERENCE = 128


class IncompatibleDraft(LocalLLMError):
    """A draft model whose vocabulary is not the target's: its token ids would mean other text."""


@dataclass
class SpeculationStats:
    """Counts over a generation: draft tokens proposed, kept, and verification steps run."""

    drafted: int = 0
    accepted: int = 0
    steps: int = 0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def add(self, other: "SpeculationStats") -> None:
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.steps += other.steps


class DraftLength:
    """How many tokens to draft next.

    The length follows the last steps: it starts at 2, grows by 2 after a draft kept whole (up to
    `maximum`) and falls to one more than the tokens kept after a refusal. A drafter copying a passage
    is kept whole step after step, and one that starts missing (the answer stops repeating its input)
    falls back at once.

    Drafting stops while it does not pay: a drafted token costs `token_cost` decode steps (its verified
    row, plus the draft model's step for a draft model) and gains a token with probability a, its recent
    acceptance, so a one-token draft beats plain decoding only when a > token_cost (longer drafts need
    more). a is kept / (kept + refusals) over exponentially decaying counts (DECAY per drafting step),
    from a prior of one half; a step that drafts nothing for that reason moves the counts back toward
    the prior (IDLE_DRIFT), so drafting is tried again now and then."""

    PRIOR = 2.0  # kept and refused counts at the start: a = 0.5, worth a couple of steps of evidence
    DECAY = 0.7  # per drafting step: the last few steps weigh most
    IDLE_DRIFT = 0.1  # per step without a draft, the share of the way back to the prior

    def __init__(self, maximum: int, token_cost: Optional[float] = None):
        self.maximum = maximum
        self.token_cost = ROW_COST if token_cost is None else token_cost
        self.kept = self.refused = self.PRIOR
        self.cap = min(2, maximum)
        self.k = self._choose()

    @property
    def acceptance(self) -> float:
        return self.kept / (self.kept + self.refused)

    def update(self, drafted: int, accepted: int) -> None:
        """A step drafted `drafted` tokens and the model kept the first `accepted` of them."""
        if drafted == 0:
            return
        whole = accepted == drafted
        self.kept = self.kept * self.DECAY + accepted
        self.refused = self.refused * self.DECAY + (0.0 if whole else 1.0)
        self.cap = min(self.maximum, self.cap + 2) if whole else max(1, min(self.maximum, accepted + 1))
        self.k = self._choose()

    def idle(self) -> None:
        """A step that drafted nothing because k was 0."""
        self.kept += self.IDLE_DRIFT * (self.PRIOR - self.kept)
        self.refused += self.IDLE_DRIFT * (self.PRIOR - self.refused)
        self.k = self._choose()

    def _choose(self) -> int:
        return self.cap if self.acceptance > self.token_cost else 0


class PromptLookup:
    """Drafts copied from the context (prompt lookup decoding): the tokens that followed the latest
    earlier occurrence of the context's last n tokens, the longest n from n_max down to n_min that
    occurs. What pays on editing, summarising and code, where the answer repeats its input. n_min 3:
    drafts after a two-token match were mostly refused (Gemma 3 270M, eight short chats: 14 of 66 kept;
    an editing task: 4 of 10, against 128 of 161 after four-token matches).

    The n-grams of the history are indexed as it grows (a dict per n: n-gram -> where it last began),
    so each step costs a few dictionary lookups whatever the context's length."""

    def __init__(self, n_min: int = 3, n_max: int = 4):
        self.n_min, self.n_max = n_min, n_max
        self.index: dict[int, dict] = {n: {} for n in range(n_min, n_max + 1)}
        self.indexed = 0  # n-grams ending before this position are indexed

    def propose(self, history: list, k: int) -> tuple[list, None]:
        """Up to k tokens to follow `history` (none when its last n tokens never occurred before)."""
        end = len(history) - 1  # index the n-grams that have a token after them inside the history
        for e in range(max(self.indexed, self.n_min), end + 1):
            for n, table in self.index.items():
                if e >= n:
                    table[tuple(history[e - n : e])] = e - n
        self.indexed = max(self.indexed, end + 1)
        for n in range(self.n_max, self.n_min - 1, -1):
            if len(history) <= n:
                continue
            first = self.index[n].get(tuple(history[-n:]))
            if first is not None:
                return list(history[first + n : first + n + k]), None
        return [], None

    def close(self) -> None:
        pass


class DraftModel:
    """A small model drafting for a larger one with the same vocabulary (Gemma 3 270M for a larger Gemma 3,
    Llama 3.2 1B for Llama 3.1 8B). It keeps its own session: each step it runs what the target kept
    since the last step, then drafts up to k tokens one at a time, greedily when the target samples
    greedily, else drawn from its own distribution (given to the acceptance rule as q)."""

    def __init__(self, model, target_tokenizer, target_vocab: int, p_min: float = DRAFT_P_MIN, check: bool = True):
        """check False: the vocabularies were checked already (the server makes one per sequence)."""
        if check:
            check_vocabularies(model.tokenizer, target_tokenizer, model.path)
        self.model = model
        self.session = model.new_session()  # kept across generations: a chat's next turn runs only what is new
        self.n_vocab = min(target_vocab, model.decoder.hp.n_vocab)
        self.p_min = p_min
        self.sampler = None

    def use_sampling(self, sampling) -> None:
        """Draft as the target samples: greedily for a greedy target, else drawn from the draft's own
        distribution under the same settings (without grammar or logit bias: q may be any distribution)."""
        from dataclasses import replace

        from .sampling import Sampler

        self.sampler = None
        if sampling is not None and sampling.temperature > 0:
            seed = None if sampling.seed is None else sampling.seed + 1
            self.sampler = Sampler(replace(sampling, grammar=None, logit_bias=None, seed=seed), self.model.decoder.hp.n_vocab)

    def propose(self, history: list, k: int) -> tuple[list, Optional[list]]:
        from .generate import prefill

        decoder, session = self.model.decoder, self.session
        n_ctx = self.model.n_ctx
        if len(history) + k >= n_ctx:
            return [], None
        logits, _ = prefill(decoder, session, history, n_ctx)
        drafts, probs = [], ([] if self.sampler is not None else None)
        step = np.zeros(1, dtype=np.int32)
        for i in range(k):
            logits = np.asarray(logits)
            if self._top_probability(logits) < self.p_min:
                break
            if self.sampler is None:
                token = int(np.argmax(logits))
            else:
                q = self.sampler.probabilities(logits, history + drafts)
                token = self.sampler.draw(q)
                probs.append(q)
            if token >= self.n_vocab:  # a token the target does not have
                break
            drafts.append(token)
            if i + 1 < k:
                step[0] = token
                logits = decoder.forward(step, len(session.tokens), session.cache)[0]
                session.tokens.append(token)
        return drafts, probs

    @staticmethod
    def _top_probability(logits: np.ndarray) -> float:
        peak = float(np.max(logits))
        return 1.0 / float(np.exp(logits - np.float32(peak), dtype=np.float32).sum(dtype=np.float64))

    def close(self) -> None:
        pass


class Replay:
    """Drafts a known continuation: `answer`, the tokens a plain generation of the same prompt gave
    (greedy), so every draft is kept. What verification costs at its ceiling (`localllm bench --replay`,
    scripts/bench_speculative.py), with no drafting cost."""

    def __init__(self, prompt_len: int, answer: list):
        self.prompt_len, self.answer = prompt_len, list(answer)

    def propose(self, history: list, k: int) -> tuple[list, None]:
        done = len(history) - self.prompt_len
        return self.answer[done : done + k], None

    def close(self) -> None:
        pass


def check_vocabularies(draft_tokenizer, target_tokenizer, draft_path="the draft model") -> None:
    """IncompatibleDraft unless the two tokenizers give token ids the same meaning (llama.cpp's rule:
    same kind of vocabulary, same BOS and EOS, sizes at most 128 apart, the same text for every id from 5
    up to the smaller size)."""
    a, b = draft_tokenizer, target_tokenizer
    name = getattr(draft_path, "name", draft_path)
    reasons = []
    if a.model != b.model:
        reasons.append(f"its tokenizer is {a.model!r}, the model's {b.model!r}")
    if a.bos_id != b.bos_id or a.eos_id != b.eos_id:
        reasons.append(f"its BOS/EOS ids are {a.bos_id}/{a.eos_id}, the model's {b.bos_id}/{b.eos_id}")
    if abs(a.vocab_size - b.vocab_size) > VOCAB_MAX_SIZE_DIFFERENCE:
        reasons.append(f"its vocabulary has {a.vocab_size} tokens, the model's {b.vocab_size}")
    if not reasons:
        for i in range(VOCAB_CHECK_START, min(a.vocab_size, b.vocab_size)):
            if a.tokens[i] != b.tokens[i]:
                reasons.append(f"token {i} is {a.tokens[i]!r} there and {b.tokens[i]!r} in the model")
                break
    if reasons:
        raise IncompatibleDraft(f"{name} cannot draft for this model: {reasons[0]}")


@dataclass
class Speculation:
    """How `generate` speculates: prompt lookup, a draft model, or both (the draft model drafts when the
    lookup finds nothing); at most `max_draft` tokens a step (1..MAX_DRAFT); lookups match the context's
    last ngram_max down to ngram_min tokens."""

    lookup: bool = True
    draft: object = None  # a loaded Model (localllm.load) sharing the target's vocabulary
    drafter: object = None  # any other drafter (propose(history, k) -> (tokens, probs or None); close()), asked first
    max_draft: int = 8
    ngram_min: int = 3
    ngram_max: int = 4
    draft_p_min: float = DRAFT_P_MIN  # the draft model stops below this top-token probability
    # a drafted token's cost in decode steps (DraftLength); None: ROW_COST, plus for a draft model the
    # draft's bytes over the target's (each of its steps reads its weights once). 0: always max_draft.
    token_cost: Optional[float] = None
    _drafter: Optional[tuple] = field(default=None, repr=False, compare=False)  # (target, DraftModel)

    def __post_init__(self):
        if not 1 <= int(self.max_draft) <= MAX_DRAFT:
            raise ValueError(f"max_draft must be between 1 and {MAX_DRAFT}, got {self.max_draft}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"ngram sizes must satisfy 1 <= ngram_min <= ngram_max, got {self.ngram_min}, {self.ngram_max}")

    @property
    def active(self) -> bool:
        return bool(self.lookup or self.draft is not None or self.drafter is not None)

    def drafters(self, target, sampling) -> list:
        """The drafters of one generation, in the order they are asked. The draft model's drafter (its
        vocabulary checked, its session) is made once per target and kept: one conversation at a time."""
        found = [] if self.drafter is None else [self.drafter]
        if self.lookup:
            found.append(PromptLookup(self.ngram_min, self.ngram_max))
        if self.draft is not None:
            found.append(self.draft_model(target))
            found[-1].use_sampling(sampling)
        return found

    def draft_length(self, target) -> DraftLength:
        """A generation's DraftLength (k starts from the prior, adapts to this generation's drafts)."""
        cost = self.token_cost
        if cost is None:
            cost = ROW_COST
            if self.draft is not None:
                cost += self.draft.reader.file_size / target.reader.file_size
        return DraftLength(self.max_draft, cost)

    def draft_model(self, target) -> DraftModel:
        """The DraftModel drafting for `target` (IncompatibleDraft if its vocabulary is not target's)."""
        kept = self._drafter
        if kept is None or kept[0] is not target:
            drafter = DraftModel(self.draft, target.tokenizer, target.decoder.hp.n_vocab, self.draft_p_min)
            kept = self._drafter = (target, drafter)
        return kept[1]


assert MAX_DRAFT + 1 <= MAX_VERIFY_ROWS


def draft_size(length: DraftLength, out, position: int, n_ctx: int, cap: int = MAX_DRAFT) -> int:
    """How many tokens a sequence drafts in this step (0: none; the length idles then): at most its
    DraftLength's k and `cap`, and as many as leave room for the token after them in the context (the
    sampled token goes to `position`) and in its token budget (out: its SequenceOutput)."""
    if length.k == 0:  # drafts have been mostly refused: none this step
        length.idle()
        return 0
    k = min(length.k, cap, n_ctx - position - 2)
    if out.max_tokens is not None:
        k = min(k, out.max_tokens - out.generated - 1)
    return max(k, 0)


@dataclass
class Verdict:
    """What one step's rows gave: the events, the tokens emitted (in order), how many drafts were kept as
    they were (their rows ran: their K, V and state are the sequence's) and how many the rule accepted."""

    events: list
    tokens: list
    kept: int = 0
    accepted: int = 0


def accept_rows(sampler, out, logits, drafts: list, probs, position: int, verdict: Optional[Verdict] = None) -> Verdict:
    """Row by row over logits [1 + len(drafts), vocab] (the rows of the last sampled token, at `position`,
    and of the drafts): the acceptance rule (Sampler.verify) keeps a draft or emits its own token and ends;
    a row after every draft kept gives one more token. Each token goes through out.accept (the sequence's
    history, stop strings and limits), which may end the sequence. probs: a sampled draft model's q rows,
    else None (one-hot drafts). `verdict`: the caller's, filled as the rows go (what came before a
    SamplingError stays in it)."""
    verdict = Verdict([], []) if verdict is None else verdict
    for i in range(len(drafts) + 1):
        if i < len(drafts):
            token, hit = sampler.verify(logits[i], out.ids, drafts[i], None if probs is None else probs[i])
        else:
            token, hit = sampler.sample(logits[i], out.ids), False
        event = out.accept(token, logits[i], position + 1 + i)
        verdict.tokens.append(token)
        if event is not None:
            verdict.events.append(event)
        verdict.accepted += hit
        if not hit or out.finish is not None:
            break
        verdict.kept += 1
    return verdict


def speculative_steps(decoder, session, out, sampler, drafters, first_logits, length: DraftLength, stats: SpeculationStats):
    """The decode loop of `generate_tokens` with speculation: yields the token events. `out`: the
    SequenceOutput (engine/sequence.py), its history `out.ids`; first_logits: the prompt's last row;
    length: the generation's DraftLength (Speculation.draft_length)."""
    token = sampler.sample(first_logits, out.ids)
    event = out.accept(token, first_logits, len(session.tokens))
    if event is not None:
        yield event
    cache = session.cache
    rows = np.zeros(MAX_DRAFT + 1, dtype=np.int32)
    while out.finish is None:
        position = len(session.tokens)  # where `token` goes
        drafts, probs = propose(drafters, out.ids, draft_size(length, out, position, out.n_ctx))
        n = len(drafts) + 1
        rows[0] = token
        rows[1:n] = drafts
        if n > 1:
            cache.save_state()
            logits = decoder.verify(rows[:n], position, cache)
        else:
            logits = decoder.forward(rows[:1], position, cache)
        verdict = accept_rows(sampler, out, logits, drafts, probs, position)
        yield from verdict.events
        session.tokens += [token, *verdict.tokens[: verdict.kept]]
        token = verdict.tokens[-1]
        if drafts:
            stats.drafted += len(drafts)
            stats.accepted += verdict.accepted
            stats.steps += 1
            length.update(len(drafts), verdict.kept)
            if verdict.kept < len(drafts) and cache.states is not None:  # recurrent layers: back to the kept tokens
                cache.restore_state()
                decoder.verify(rows[: verdict.kept + 1], position, cache)


def propose(drafters, history: list, k: int) -> tuple[list, Optional[list]]:
    """The first drafter's that proposes anything: (at most k tokens, their q rows or None)."""
    if k <= 0:
        return [], None
    for drafter in drafters:
        drafts, probs = drafter.propose(history, k)
        if drafts:
            return drafts[:k], probs
    return [], None
