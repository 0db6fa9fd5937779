"""Sampling: each filter on small hand-worked distributions, the whole chain's statistics, seeding,
option validation, log-probabilities against a float64 log-softmax, and stop strings.

Distributions are written as probabilities and turned into logits with log(), so softmax(logits) gives
the probabilities back and the arithmetic in the comments is the arithmetic of the test.
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from localllm.errors import LocalLLMError
from localllm.sampling import (
    Sampler,
    SamplingConfig,
    SamplingError,
    StopMatcher,
    logprobs,
)


def only(**options) -> SamplingConfig:
    """A config with every filter off (temperature 1, seed 0) except the options given."""
    base = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "seed": 0}
    return SamplingConfig(**{**base, **options})


def logits_of(*probs: float) -> np.ndarray:
    return np.log(np.asarray(probs, dtype=np.float64)).astype(np.float32)


def kept(config: SamplingConfig, logits: np.ndarray) -> set[int]:
    ids, _ = Sampler(config, logits.size).candidates(logits)
    return {int(i) for i in ids}


# -- the filters ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("k,expected", [(1, {1}), (2, {1, 3}), (3, {1, 3, 2}), (5, {0, 1, 2, 3, 4}), (9, {0, 1, 2, 3, 4})])
def test_top_k_keeps_exactly_the_k_largest(k, expected):
    # logits by id: 0:1, 1:5, 2:3, 3:4, 4:2 -> descending ids 1, 3, 2, 4, 0
    assert kept(only(top_k=k), np.array([1, 5, 3, 4, 2], dtype=np.float32)) == expected


def test_top_k_zero_is_off_but_banned_tokens_never_survive():
    logits = np.array([1, 5, -np.inf, 4], dtype=np.float32)
    assert kept(only(top_k=0), logits) == {0, 1, 3}
    assert kept(only(top_k=4), logits) == {0, 1, 3}


def _largest_finite(scores: np.ndarray, k: int) -> list[int]:
    """The k largest finite scores' ids by a plain sort: largest first, a tie to the lower id."""
    finite = [i for i in range(scores.size) if np.isfinite(scores[i])]
    return sorted(finite, key=lambda i: (-float(scores[i]), i))[:k]


@pytest.mark.parametrize("allowed", [None, 30_000, 200, 7])
def test_top_k_on_a_large_vocabulary_gives_the_k_largest_finite_in_order(allowed):
    # A Gemma-sized vocabulary: unmasked, or masked as a grammar masks it (-inf outside `allowed` ids),
    # with +inf and NaN, ties (values rounded to a coarse grid) and fewer allowed ids than k.
    rng = np.random.default_rng(allowed or 1)
    n = 262_144
    scores = np.round(rng.normal(0, 3, n) * 4).astype(np.float32) / 4  # many equal values
    if allowed is not None:
        mask = np.full(n, -np.inf, dtype=np.float32)
        ids = rng.choice(n, allowed, replace=False)
        mask[ids] = scores[ids]
        scores = mask
    scores[rng.integers(0, n, 3)] = np.inf  # not finite: never a candidate
    scores[rng.integers(0, n, 2)] = np.nan  # (Sampler.sample refuses NaN logits; candidates passes them over)
    for k in (1, 40, 100):
        ids, kept_logits = Sampler(only(top_k=k), n).candidates(scores)
        assert ids.tolist() == _largest_finite(scores, k)
        np.testing.assert_array_equal(kept_logits, scores[ids])


@pytest.mark.parametrize("p,expected", [(0.0, {1}), (0.35, {1}), (0.5, {1, 3}), (0.75, {1, 3, 2}), (0.95, {0, 1, 2, 3})])
def test_top_p_keeps_the_smallest_prefix_reaching_p(p, expected):
    # probabilities by id: 0:0.1, 1:0.4, 2:0.2, 3:0.3; sorted 0.4 (1), 0.3 (3), 0.2 (2), 0.1 (0);
    # cumulative 0.4, 0.7, 0.9, 1.0. p=0.35 -> {1}; 0.5 -> first cumulative >= 0.5 is 0.7 -> {1, 3};
    # 0.75 -> 0.9 -> {1, 3, 2}; 0.95 -> all; p=0 still keeps one token.
    assert kept(only(top_p=p), logits_of(0.1, 0.4, 0.2, 0.3)) == expected


def test_top_p_on_a_large_vocabulary_keeps_the_most_likely_prefix_in_order():
    # top-k off, so top-p sorts a Gemma-sized vocabulary itself, chunk by chunk (_top_p)
    rng = np.random.default_rng(5)
    n = 262_144
    logits = rng.standard_normal(n).astype(np.float32)
    x = logits.astype(np.float64)
    order = sorted(range(n), key=lambda i: (-float(logits[i]), i))
    cumulative = np.cumsum(np.exp(x[order] - x.max())) / np.exp(x - x.max()).sum()
    keeps = []
    for mass in (0.01, 0.05, 0.2):
        keeps.append(int(np.searchsorted(cumulative, mass, side="left")) + 1)
        ids, _ = Sampler(only(top_p=mass), n).candidates(logits)
        assert ids.tolist() == order[: keeps[-1]]
    assert keeps[0] < 1024 < keeps[1] < 8192 < keeps[2]  # found in the first, second and third chunk


@pytest.mark.parametrize("ratio,expected", [(0.3, {0, 1, 3}), (0.45, {0, 3}), (0.9, {0}), (1.0, {0})])
def test_min_p_drops_tokens_below_min_p_times_the_top_probability(ratio, expected):
    # probabilities 0.5, 0.2, 0.05, 0.25; p_max = 0.5. ratio 0.3 -> threshold 0.15 drops only id 2 (0.05);
    # 0.45 -> 0.225 keeps 0.5 and 0.25; 0.9 -> 0.45 keeps only the top.
    assert kept(only(min_p=ratio), logits_of(0.5, 0.2, 0.05, 0.25)) == expected


@pytest.mark.parametrize("mass,expected", [(0.2, {1}), (0.6, {1, 0}), (0.95, {0, 1, 2, 3})])
def test_typical_p_keeps_the_tokens_nearest_the_entropy(mass, expected):
    # probabilities 0.5, 0.25, 0.125, 0.125. Entropy H = 0.5*ln2 + 0.25*2ln2 + 2*0.125*3ln2 = 1.75 ln2 = 1.2130.
    # Surprise -ln p: 0.6931, 1.3863, 2.0794, 2.0794; distance to H: 0.520, 0.173, 0.866, 0.866.
    # Most typical first: id 1 (0.25), id 0 (0.5), then ids 2 and 3; cumulative 0.25, 0.75, 0.875, 1.0.
    # mass 0.2 -> {1}; 0.6 -> {1, 0}; 0.95 -> all four.
    assert kept(only(typical_p=mass), logits_of(0.5, 0.25, 0.125, 0.125)) == expected


def brute_force_chain(logits: np.ndarray, top_k: int, top_p: float, min_p: float) -> set[int]:
    """top-k, top-p, min-p by full sorts in float64, straight from their definitions."""
    x = logits.astype(np.float64)
    order = np.argsort(-x, kind="stable")
    if top_k:
        order = order[:top_k]
    probs = np.exp(x[order] - x[order].max())
    probs /= probs.sum()
    if top_p < 1:
        reached = np.nonzero(np.cumsum(probs) >= top_p)[0]
        n = reached[0] + 1 if reached.size else order.size
        order, probs = order[:n], probs[:n] / probs[:n].sum()
    if min_p > 0:
        keep = probs >= min_p * probs.max()
        order = order[keep]
    return {int(i) for i in order}


@pytest.mark.parametrize("top_k,top_p,min_p", [(0, 0.9, 0.0), (0, 0.5, 0.0), (0, 0.99, 0.01), (300, 0.9, 0.0), (0, 0.95, 0.05)])
def test_large_vocabulary_filters_agree_with_full_sorts(top_k, top_p, min_p):
    # 50,000 tokens with a flat-ish distribution, so top-p must look far beyond its first sorted chunk.
    logits = np.random.default_rng(7).normal(0.0, 1.5, 50_000).astype(np.float32)
    assert kept(only(top_k=top_k, top_p=top_p, min_p=min_p), logits) == brute_force_chain(logits, top_k, top_p, min_p)


# -- bias and penalties -------------------------------------------------------------------------------------


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    logits = np.array([2.0, -2.0, 1.0, 0.5, 3.0], dtype=np.float32)
    sampler = Sampler(only(repeat_penalty=2.0), 5)
    # ids 0 and 1 seen (1 twice: the repetition penalty applies once per distinct token)
    adjusted = sampler.adjusted(logits, [0, 1, 1])
    np.testing.assert_array_equal(adjusted, [1.0, -4.0, 1.0, 0.5, 3.0])


@pytest.mark.parametrize("last_n,expected", [(2, [2.0, 0.5, -2.0, 3.0]), (-1, [1.0, 0.5, -2.0, 3.0]), (0, [2.0, 1.0, -1.0, 3.0])])
def test_repetition_penalty_window(last_n, expected):
    logits = np.array([2.0, 1.0, -1.0, 3.0], dtype=np.float32)
    # history 0, 1, 2: the last 2 are ids 1 and 2; -1 means all of it; 0 switches the penalty off.
    adjusted = Sampler(only(repeat_penalty=2.0, repeat_last_n=last_n), 4).adjusted(logits, [0, 1, 2])
    np.testing.assert_array_equal(adjusted, expected)


def test_frequency_and_presence_penalties_follow_openai():
    # logit -= count * frequency + (count > 0) * presence; id 1 seen 3 times, id 2 once:
    # id 1: -(3 * 0.5 + 0.25) = -1.75; id 2: -(0.5 + 0.25) = -0.75.
    sampler = Sampler(only(frequency_penalty=0.5, presence_penalty=0.25), 5)
    adjusted = sampler.adjusted(np.zeros(5, dtype=np.float32), [1, 1, 1, 2])
    np.testing.assert_allclose(adjusted, [0.0, -1.75, -0.75, 0.0, 0.0])


def test_logit_bias_forces_and_bans_tokens():
    logits = np.array([0.0, 1.0, 2.0], dtype=np.float32)
    forced = Sampler(only(logit_bias={0: 100.0}, seed=1), 3)
    assert {forced.sample(logits, []) for _ in range(200)} == {0}
    banned = Sampler(only(logit_bias={"2": -math.inf}, seed=1), 3)  # JSON-style string key
    assert {banned.sample(logits, []) for _ in range(500)} == {0, 1}
    assert Sampler(only(temperature=0, logit_bias={2: -math.inf}), 3).sample(logits, []) == 1


def test_everything_banned_or_nan_is_an_error():
    with pytest.raises(SamplingError, match="banned"):
        Sampler(only(logit_bias={0: -math.inf, 1: -math.inf}), 2).sample(np.zeros(2, np.float32), [])
    with pytest.raises(SamplingError, match="NaN"):
        Sampler(only(), 2).sample(np.array([0.0, np.nan], np.float32), [])
    with pytest.raises(SamplingError, match="shape"):
        Sampler(only(), 3).sample(np.zeros(2, np.float32), [])


def test_callers_logits_are_never_modified():
    logits = np.random.default_rng(0).normal(size=1000).astype(np.float32)
    original = logits.copy()
    logits.flags.writeable = False  # a write would raise
    config = SamplingConfig(seed=0, repeat_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.1, logit_bias={3: 5.0})
    sampler = Sampler(config, 1000)
    for _ in range(5):
        sampler.sample(logits, [3, 5, 7, 3])
    np.testing.assert_array_equal(logits, original)


# -- temperature, the draw, seeds ----------------------------------------------------------------------------------


def test_temperature_zero_is_deterministic_argmax_after_penalties():
    rng = np.random.default_rng(3)
    for _ in range(20):
        logits = rng.normal(size=300).astype(np.float32)
        a = Sampler(SamplingConfig(temperature=0.0, seed=1), 300)
        b = Sampler(SamplingConfig(temperature=0.0, seed=2), 300)
        assert a.sample(logits, []) == b.sample(logits, []) == int(np.argmax(logits))
    # with a penalty the argmax moves: id 0 (logit 2.0, seen) becomes 2.0 / 4 = 0.5 < id 1 (1.0)
    assert Sampler(SamplingConfig(temperature=0.0, repeat_penalty=4.0), 2).sample(np.array([2.0, 1.0], np.float32), [0]) == 1


def test_empirical_frequencies_match_the_filtered_distribution():
    # probabilities by id: 0:0.05, 1:0.3, 2:0.15, 3:0.4, 4:0.1
    # top-k 4 drops id 0; renormalized over 0.95: 3:0.421, 1:0.316, 2:0.158, 4:0.105; cumulative 0.421, 0.737,
    # 0.895 -> top-p 0.8 keeps ids 3, 1, 2; min-p 0.3: threshold 0.3 * 0.4 = 0.12 of the raw scale keeps id 2 (0.15).
    # temperature 0.5 squares the probabilities: 0.16, 0.09, 0.0225 (sum 0.2725) -> 0.5872, 0.3303, 0.0826.
    config = SamplingConfig(temperature=0.5, top_k=4, top_p=0.8, min_p=0.3, typical_p=1.0, seed=1234)
    sampler = Sampler(config, 5)
    logits = logits_of(0.05, 0.3, 0.15, 0.4, 0.1)
    draws = 20_000
    counts = np.bincount([sampler.sample(logits, []) for _ in range(draws)], minlength=5)
    assert counts[0] == counts[4] == 0
    expected = np.array([0.16, 0.09, 0.0225]) / 0.2725 * draws  # ids 3, 1, 2
    observed = counts[[3, 1, 2]]
    chi_square = float(np.sum((observed - expected) ** 2 / expected))
    # 2 degrees of freedom: P(chi2 > 13.8) = 0.001 for a correct sampler; a wrong distribution (e.g. the
    # temperature ignored: 0.47/0.35/0.18) gives chi2 in the thousands.
    assert chi_square < 13.8, (observed, expected)


def test_same_seed_same_tokens_different_seeds_differ():
    rng = np.random.default_rng(11)
    steps = [rng.normal(0, 1, 2000).astype(np.float32) for _ in range(60)]

    def run(seed):
        sampler = Sampler(SamplingConfig(seed=seed, top_k=0, min_p=0.0, top_p=1.0, temperature=1.5), 2000)
        return [sampler.sample(logits, []) for logits in steps]

    assert run(42) == run(42)
    assert run(42) != run(43)
    assert run(None) != run(None)  # OS entropy: equal sequences of 60 draws from ~2000 tokens are impossible in practice


def test_default_sampling_is_fast_at_gemma_vocabulary_size():
    n_vocab = 262_144
    rng = np.random.default_rng(5)
    logits = (rng.normal(size=n_vocab) * 3).astype(np.float32)
    history = list(rng.integers(0, n_vocab, 512))
    sampler = Sampler(SamplingConfig(seed=0), n_vocab)
    sampler.sample(logits, history)
    started = time.perf_counter()
    for _ in range(50):
        sampler.sample(logits, history)
    assert (time.perf_counter() - started) / 50 < 0.005


# -- options ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options,name",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": -0.1}, "top_p"),
        ({"min_p": 2}, "min_p"),
        ({"typical_p": -1}, "typical_p"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"repeat_penalty": 0}, "repeat_penalty"),
        ({"repeat_last_n": -2}, "repeat_last_n"),
        ({"frequency_penalty": 3}, "frequency_penalty"),
        ({"presence_penalty": -2.5}, "presence_penalty"),
        ({"seed": -1}, "seed"),
        ({"seed": "7"}, "seed"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
        ({"logit_bias": {1: math.inf}}, "logit_bias"),
        ({"logit_bias": [1, 2]}, "logit_bias"),
        ({"stop": [1]}, "stop"),
        ({"max_tokens": -5}, "max_tokens"),
    ],
)
def test_bad_options_name_the_option_and_its_range(options, name):
    with pytest.raises(SamplingError, match=rf"^{name} must be ") as info:
        SamplingConfig(**options)
    assert isinstance(info.value, LocalLLMError) and isinstance(info.value, ValueError)
    assert "\n" not in str(info.value)


def test_defaults_are_valid_and_bias_ids_are_checked_against_the_vocabulary():
    config = SamplingConfig(logit_bias={"5": -1.0}, stop="###")
    assert config.logit_bias == {5: -1.0} and config.stop == ["###"]
    with pytest.raises(SamplingError, match="logit_bias"):
        Sampler(SamplingConfig(logit_bias={10: 1.0}), 10)


# -- log-probabilities -------------------------------------------------------------------------------------


def test_logprobs_match_a_float64_log_softmax():
    logits = np.random.default_rng(2).normal(0, 4, 5000).astype(np.float32)
    x = logits.astype(np.float64)
    reference = x - (x.max() + np.log(np.sum(np.exp(x - x.max()))))
    chosen, top = logprobs(logits, 17, 5)
    assert chosen == pytest.approx(reference[17], abs=1e-5)
    assert [i for i, _ in top] == list(np.argsort(-x)[:5])
    np.testing.assert_allclose([lp for _, lp in top], np.sort(reference)[::-1][:5], atol=1e-5)
    # over the whole vocabulary the probabilities sum to 1
    _, everything = logprobs(logits, 0, logits.size)
    assert len(everything) == logits.size
    assert math.fsum(math.exp(lp) for _, lp in everything) == pytest.approx(1.0, abs=1e-5)
    assert logprobs(logits, 3, 0) == (pytest.approx(reference[3], abs=1e-5), [])


def test_logprobs_of_a_hand_worked_distribution():
    # probabilities 0.5, 0.25, 0.25 -> log 0.5 = -0.6931, log 0.25 = -1.3863; a tie goes to the lower id
    chosen, top = logprobs(logits_of(0.5, 0.25, 0.25), 2, 2)
    assert chosen == pytest.approx(math.log(0.25), abs=1e-6)
    assert top[0][0] == 0 and top[0][1] == pytest.approx(math.log(0.5), abs=1e-6)
    assert top[1][0] == 1 and top[1][1] == pytest.approx(math.log(0.25), abs=1e-6)
    with pytest.raises(SamplingError, match="token"):
        logprobs(logits_of(0.5, 0.5), 2, 0)


# -- stop strings ----------------------------------------------------------------------------------------------


def test_stop_string_spanning_several_feeds():
    matcher = StopMatcher(["lo w"])
    # "Hel": its last "l" could begin "lo w", so only "He" is safe
    assert matcher.feed("Hel") == ("He", False)
    # "l" + "lo wor" = "llo wor" contains "lo w" at 1: emit the "l" before it and stop
    assert matcher.feed("lo wor") == ("l", True)
    assert matcher.stopped
    assert matcher.feed("ld") == ("", True)
    assert matcher.flush() == ""


def test_the_earliest_of_several_stops_wins():
    # "o w" (at 4) completes before "world" (at 6) and starts earlier: the text stops after "Hell".
    matcher = StopMatcher(["world", "o w", "zzz"])
    out = [matcher.feed(piece) for piece in ("Hel", "lo", " wo", "rld!")]
    assert "".join(text for text, _ in out) == "Hell"
    assert [stopped for _, stopped in out] == [False, False, True, True]


def test_stop_at_the_very_start():
    matcher = StopMatcher(["<end>"])
    assert matcher.feed("<en") == ("", False)
    assert matcher.feed("d> more") == ("", True)


def test_held_text_is_released_when_it_cannot_be_a_stop_and_flushed_at_the_end():
    matcher = StopMatcher(["###"])
    assert matcher.feed("a #") == ("a ", False)
    assert matcher.feed("#") == ("", False)
    assert matcher.feed("b") == ("##b", False)
    assert matcher.feed("##") == ("", False)
    assert matcher.flush() == "##"
    assert StopMatcher([]).feed("anything") == ("anything", False)
    assert StopMatcher(["", "x"]).feed("ab") == ("ab", False)


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="ab c", max_size=40),
    stops=st.lists(st.text(alphabet="ab c", min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=8),
)
def test_everything_before_the_first_stop_is_emitted_exactly_once(text, stops, cuts):
    # A stop inside another stop (not at its start) can complete first: then the streamed cut is allowed
    # to differ from the whole-text one (see StopMatcher), so such stop sets are left out here.
    assume(not any(a != b and b in a[1:] for a in stops for b in stops))
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    pieces = [text[i:j] for i, j in itertools.pairwise(bounds)]
    matcher = StopMatcher(stops)
    emitted, stopped = [], False
    for piece in pieces:
        out, stopped = matcher.feed(piece)
        emitted.append(out)
    if not stopped:
        emitted.append(matcher.flush())
    positions = [text.find(s) for s in stops if s in text]
    expected = text[: min(positions)] if positions else text
    assert "".join(emitted) == expected
    assert stopped == bool(positions)
