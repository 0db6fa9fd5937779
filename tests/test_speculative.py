"""Speculative decoding (localllm/speculative.py): the output is plain decoding's.

- Greedy: token for token (and log-probabilities bit for bit) what generate gives without speculation,
  with prompt lookup and with a draft model, on the real Gemma 3 270M and on tiny models of every kind
  of layer (attention, mixture of experts, the recurrent hybrids whose state is rolled back), with
  drafts both kept and refused, and across a next turn on the same session.
- Sampling: the acceptance rule keeps plain sampling's distribution: at the sampler (many draws against
  the exact distribution) and end to end (the joint distribution of the first three tokens over many
  seeded runs against the model's exact one, enumerated with NumPy from its logits).
"""

from __future__ import annotations

import numpy as np
import pytest

import localllm
from localllm.sampling import Sampler, SamplingConfig
from localllm.speculative import DraftLength, IncompatibleDraft, PromptLookup, Speculation, check_vocabularies

from distribution import P_BOUND, chi2_sf, chi_square_p, exact_joint, exact_probs
from tiny_models import write_tiny_model

# A prompt whose greedy continuation repeats itself and the prompt (drafts are kept), with turns where it
# does not (drafts are refused).
REPEATING = ("def area(w, h):\n    return w * h\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n\n"
             "The same two functions again:\n\ndef area(w, h):\n")


def _run(model, prompt, speculation=None, session=None, **kw):
    tokens, logprobs, done = [], [], None
    for event in model.generate(prompt, speculation=speculation, session=session, **kw):
        if event.kind == "token" and event.token is not None:
            tokens.append(event.token)
            logprobs.append((event.logprob, event.top_logprobs))
        elif event.kind == "done":
            done = event
    return tokens, logprobs, done


@pytest.fixture(scope="module")
def gemma(gemma_path):
    return localllm.load(gemma_path, n_ctx=1024)


@pytest.fixture(scope="module")
def gemma_draft(gemma_path):
    return localllm.load(gemma_path, n_ctx=1024)


def test_lookup_greedy_is_plain_decoding_on_gemma(gemma):
    plain, plain_lp, _ = _run(gemma, REPEATING, max_tokens=120, temperature=0, top_logprobs=3,
                              session=gemma.new_session())
    spec, spec_lp, done = _run(gemma, REPEATING, Speculation(lookup=True, max_draft=8), max_tokens=120, temperature=0,
                               top_logprobs=3, session=gemma.new_session())
    assert spec == plain
    assert spec_lp == plain_lp  # the verified rows' logits are the decode steps' bit for bit
    t = done.timings
    assert 0 < t.draft_accepted < t.draft_tokens  # drafts were kept, and some refused


def test_draft_model_greedy_is_plain_decoding_and_drafting_for_itself_keeps_all(gemma, gemma_draft):
    prompt = "The capital of France is"
    plain, _, _ = _run(gemma, prompt, max_tokens=40, temperature=0, session=gemma.new_session())
    # token_cost 0: draft the maximum whatever it costs (the same model drafting never pays: DraftLength)
    spec, _, done = _run(gemma, prompt, Speculation(lookup=False, draft=gemma_draft, max_draft=4, token_cost=0.0),
                         max_tokens=40, temperature=0, session=gemma.new_session())
    assert spec == plain
    t = done.timings
    # the same weights draft what the model decodes: every draft is kept (drafting stops only where the
    # draft's top token is below DRAFT_P_MIN)
    assert t.draft_tokens > 0 and t.draft_accepted == t.draft_tokens


def test_stop_strings_budgets_and_the_context_end_fall_where_plain_decoding_puts_them(gemma_path):
    small = localllm.load(gemma_path, n_ctx=150)
    ids = small.tokenize(REPEATING)
    for kw in ({"max_tokens": 17}, {"max_tokens": 200}, {"max_tokens": 60, "stop": ["perimeter"]}):
        plain = _run(small, ids, max_tokens=kw["max_tokens"], stop=kw.get("stop"), temperature=0,
                     session=small.new_session())
        spec = _run(small, ids, Speculation(max_draft=16), max_tokens=kw["max_tokens"], stop=kw.get("stop"),
                    temperature=0, session=small.new_session())
        assert spec[0] == plain[0]
        assert spec[2].finish_reason == plain[2].finish_reason
        assert spec[2].timings.generated_tokens == plain[2].timings.generated_tokens


def test_a_grammar_constrains_the_verified_rows_as_it_constrains_decode_steps(gemma):
    grammar = 'root ::= ("abc, " | "abd, ")+ "end"'
    kw = dict(max_tokens=40, temperature=0, grammar=grammar)
    plain, _, _ = _run(gemma, "Letters: ", session=gemma.new_session(), **kw)
    spec, _, done = _run(gemma, "Letters: ", Speculation(max_draft=8), session=gemma.new_session(), **kw)
    assert spec == plain and done.timings.draft_tokens > 0


TINY = ["llama", "gemma3", "qwen3moe", "gpt-oss", "qwen35", "qwen3next"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("spec")


def _tiny_prompt(n_vocab):
    rng = np.random.default_rng(5)
    motif = [int(t) for t in rng.integers(4, n_vocab, 6)]
    return [2] + motif * 3 + [int(t) for t in rng.integers(4, n_vocab, 5)] + motif[:3]


class FaultyReplay:
    """A drafter that knows the answer (plain decoding's tokens) but gets every `wrong`-th drafted token
    wrong: steps that keep their whole draft and steps refused part way, at every draft length."""

    def __init__(self, prompt_len: int, answer: list, wrong: int, n_vocab: int):
        self.prompt_len, self.answer, self.wrong, self.n_vocab = prompt_len, answer, wrong, n_vocab
        self.count = 0

    def propose(self, history, k):
        done = len(history) - self.prompt_len
        drafts = []
        for token in self.answer[done : done + k]:
            self.count += 1
            drafts.append((token + 1) % self.n_vocab if self.count % self.wrong == 0 else token)
        return drafts, None

    def close(self):
        pass


@pytest.mark.parametrize("arch", TINY)
def test_greedy_is_plain_decoding_on_every_kind_of_layer(arch, tiny_dir):
    """Lookup drafts (the prompt repeats a motif), a draft model (another architecture over the same
    vocabulary) and a drafter that is right but for every fifth token, on tiny models; recurrent hybrids
    restore their state after every refusal. A next turn on the same session then continues from what the
    cache holds, as plain decoding's session does."""
    path = write_tiny_model(tiny_dir / f"{arch}.gguf", arch, "Q4_K", seed=1)
    other = "gemma3" if arch == "llama" else "llama"
    draft_path = write_tiny_model(tiny_dir / f"{arch}-draft.gguf", other, "Q4_K", seed=2)
    model = localllm.load(path, n_ctx=160)
    draft = localllm.load(draft_path, n_ctx=160)
    n_vocab = model.decoder.hp.n_vocab
    prompt = _tiny_prompt(n_vocab)
    answer, _, _ = _run(model, prompt, max_tokens=40, temperature=0, session=model.new_session())
    replay = Speculation(lookup=False, drafter=FaultyReplay(len(prompt), answer, 5, n_vocab), max_draft=6)
    for spec in (Speculation(max_draft=5), Speculation(lookup=False, draft=draft, max_draft=3, draft_p_min=0.0, token_cost=0.0),
                 replay):
        plain_session, spec_session = model.new_session(), model.new_session()
        plain, plain_lp, _ = _run(model, prompt, max_tokens=40, temperature=0, top_logprobs=2, session=plain_session)
        got, got_lp, done = _run(model, prompt, spec, max_tokens=40, temperature=0, top_logprobs=2, session=spec_session)
        assert got == plain and got_lp == plain_lp  # the verified rows' logits are the decode steps' bit for bit
        if spec is replay:  # drafts kept and refused: the recurrent layers' rollback ran
            assert 0 < done.timings.draft_accepted < done.timings.draft_tokens
            replay.drafter.answer = []  # the next turn drafts nothing this way
        assert spec_session.tokens == plain_session.tokens
        follow = prompt + plain + prompt[1:8]  # a next turn extending what the sessions hold
        plain2, _, _ = _run(model, follow, max_tokens=12, temperature=0, session=plain_session)
        got2, _, _ = _run(model, follow, spec, max_tokens=12, temperature=0, session=spec_session)
        assert got2 == plain2


# -- sampling: the distribution -------------------------------------------------------------------------------


def test_the_chi_square_tail_matches_known_quantiles():
    # textbook critical values: P(X >= 3.841) = 0.05 at 1 dof, P(X >= 23.209) = 0.01 at 10, 0.001 at 26 dof: 54.052
    assert chi2_sf(3.841, 1) == pytest.approx(0.05, rel=1e-3)
    assert chi2_sf(23.209, 10) == pytest.approx(0.01, rel=1e-3)
    assert chi2_sf(54.052, 26) == pytest.approx(0.001, rel=1e-3)


@pytest.mark.parametrize("with_q", [False, True])
def test_the_acceptance_rule_draws_from_the_samplers_distribution(with_q):
    rng = np.random.default_rng(0)
    n_vocab, draws = 12, 20000
    logits = rng.normal(0, 1.5, n_vocab).astype(np.float32)
    config = SamplingConfig(temperature=0.9, top_k=8, top_p=1.0, min_p=0.0, seed=3)
    sampler = Sampler(config, n_vocab)
    p = exact_probs(logits, 0.9, 8)
    q = rng.dirichlet(np.ones(n_vocab))  # a draft distribution unlike p, with mass where p has none
    counts = np.zeros(n_vocab, dtype=np.int64)
    kept = 0
    for _ in range(draws):
        draft = int(rng.choice(n_vocab, p=q)) if with_q else int(rng.choice(n_vocab, p=p))
        token, accepted = sampler.verify(logits, [], draft, q if with_q else None)
        counts[token] += 1
        kept += accepted
        assert accepted == (token == draft) or not accepted
    assert chi_square_p(counts, p) > P_BOUND
    assert 0 < kept < draws


def test_speculative_sampling_keeps_the_models_distribution_over_three_tokens(tiny_dir):
    """A tiny model samples three tokens (top-k 3, temperature 1, a logit bias) 1,500 times with a
    sampled draft model and prompt lookup; the frequencies of the 27 sequences against the model's exact
    joint distribution, from its logits at each prefix. The draft model is the same weights; it leaves
    the logit bias out of its own distribution q, so q differs from the model's p and both branches of the rule (a draft kept with probability p/q < 1, a refusal drawing from p - q) run."""
    path = write_tiny_model(tiny_dir / "dist.gguf", "llama", "F32", seed=11)
    model = localllm.load(path, n_ctx=64)
    draft = localllm.load(path, n_ctx=64)
    prompt = [2, 17, 33, 17, 33, 17]
    top_k, steps, runs = 3, 3, 1500
    n_vocab = model.decoder.hp.n_vocab
    bias_row = np.random.default_rng(1).normal(0, 0.7, n_vocab).astype(np.float32)  # every token's logit moved
    bias_row[list(model.tokenizer.eog_ids)] = -np.inf  # three tokens every run: no end of generation
    bias = {i: float(b) for i, b in enumerate(bias_row)}
    exact = exact_joint(model, prompt, steps, top_k, bias_row)
    keys = list(exact)
    assert abs(sum(exact.values()) - 1) < 1e-9
    spec = Speculation(lookup=True, draft=draft, max_draft=2, draft_p_min=0.0, token_cost=0.0)
    counts = np.zeros(len(keys), dtype=np.int64)
    drafted = kept = 0
    session = model.new_session()
    for seed in range(runs):
        tokens, _, done = _run(model, prompt, spec, max_tokens=steps, temperature=1.0, top_k=top_k, top_p=1.0,
                               min_p=0.0, seed=seed, logit_bias=bias, session=session)
        counts[keys.index(tuple(tokens))] += 1
        drafted += done.timings.draft_tokens
        kept += done.timings.draft_accepted
    assert chi_square_p(counts, np.array([exact[k] for k in keys])) > P_BOUND
    assert 0.2 * drafted < kept < drafted


# -- the parts ---------------------------------------------------------------------------------------------------


def test_prompt_lookup_copies_what_followed_the_latest_longest_match():
    lookup = PromptLookup(n_min=2, n_max=3)
    history = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2, 3]
    # the 3-gram (1, 2, 3) last began at 0: drafts 4, 5, 9; the 2-gram (2, 3) alone would copy 7, 8
    assert lookup.propose(history, 3) == ([4, 5, 9], None)
    assert lookup.propose(history + [6], 3) == ([], None)  # (3, 6) never occurred
    assert PromptLookup(2, 3).propose([5, 6, 5, 6], 4) == ([5, 6], None)  # a copy runs up to the history's end


def test_the_draft_length_follows_the_drafts_and_stops_where_they_do_not_pay():
    length = DraftLength(maximum=8, token_cost=0.2)
    assert length.acceptance == 0.5 and length.k == 2
    length.update(2, 2)
    assert length.k == 4  # kept whole: two more
    length.update(4, 4)
    length.update(6, 6)
    length.update(8, 8)
    assert length.k == 8  # up to the maximum
    length.update(8, 2)
    assert length.k == 3  # a refusal after two kept: one more than those
    for _ in range(8):  # refused at once, again and again: acceptance under the token's cost, no drafts
        length.update(max(length.k, 1), 0)
    assert length.acceptance < 0.2 and length.k == 0
    idle = 0
    while length.k == 0:  # steps without drafts bring the estimate back toward the prior: a draft is tried again
        length.idle()
        idle += 1
    assert 1 <= idle <= 20 and length.k == 1
    # a draft model as large as the model (each drafted token costs more than a step): never
    costly = DraftLength(maximum=5, token_cost=1.2)
    for _ in range(20):
        costly.update(5, 5)
    assert costly.acceptance > 0.95 and costly.k == 0


def test_a_draft_with_another_vocabulary_is_refused_in_one_line(gemma, tiny_dir):
    tiny = localllm.load(write_tiny_model(tiny_dir / "other.gguf", "llama", "F32"), n_ctx=32)
    with pytest.raises(IncompatibleDraft, match="cannot draft for this model: its vocabulary has 384 tokens"):
        Speculation(draft=tiny).draft_model(gemma)
    changed = type(gemma.tokenizer).__new__(type(gemma.tokenizer))
    vars(changed).update(vars(gemma.tokenizer))
    changed.tokens = list(gemma.tokenizer.tokens)
    changed.tokens[1000] = "<changed>"
    with pytest.raises(IncompatibleDraft, match="token 1000 is '<changed>' there"):
        check_vocabularies(changed, gemma.tokenizer, "draft.gguf")
    check_vocabularies(gemma.tokenizer, gemma.tokenizer)  # the same vocabulary passes


def test_settings_out_of_range_are_refused():
    with pytest.raises(ValueError, match="max_draft must be between 1 and 16"):
        Speculation(max_draft=0)
    with pytest.raises(ValueError, match="ngram sizes"):
        Speculation(ngram_min=3, ngram_max=2)
