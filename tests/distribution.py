"""Checking that sampled tokens follow a distribution: the exact distribution of a top-k, temperature
sampler over a model's logits, and Pearson's chi-square test (its tail without SciPy).

Used by the speculative decoding tests (tests/test_speculative.py, tests/engine/test_engine_speculation.py):
sampled output with drafts must have plain sampling's distribution."""

from __future__ import annotations

import itertools
import math

import numpy as np

# p-values under this bound fail a test: with every sampled quantity drawn as it should be, such a test
# fails by chance with probability 1e-4.
P_BOUND = 1e-4


def chi2_sf(stat: float, dof: int) -> float:
    """P(X >= stat) for X chi-square with `dof` degrees of freedom: the regularized upper incomplete gamma
    Q(dof/2, stat/2), by its series below a + 1 and its continued fraction (Lentz) above."""
    a, x = dof / 2.0, stat / 2.0
    if x <= 0:
        return 1.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        for n in range(1, 1000):
            term *= x / (a + n)
            total += term
            if term < total * 1e-15:
                break
        return 1.0 - total * math.exp(log_front)
    tiny = 1e-300
    b, c, d = x + 1 - a, 1 / tiny, 1 / (x + 1 - a)
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return math.exp(log_front) * h


def chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """p-value of Pearson's chi-square test of `counts` against `probs` (bins of expected count < 5 merged)."""
    n = counts.sum()
    expected = probs * n
    order = np.argsort(expected)
    c, e = counts[order].astype(float), expected[order]
    small = np.cumsum(e) < 5  # merge the rarest bins into one
    if small.any():
        c = np.concatenate([[c[small].sum() + c[~small][0]], c[~small][1:]])
        e = np.concatenate([[e[small].sum() + e[~small][0]], e[~small][1:]])
    stat = float(((c - e) ** 2 / e).sum())
    return chi2_sf(stat, len(c) - 1)


def exact_probs(logits: np.ndarray, temperature: float, top_k: int) -> np.ndarray:
    """The distribution a top-k, temperature sampler draws from (NumPy, float64)."""
    out = np.zeros(logits.size)
    top = np.argsort(-logits.astype(np.float64), kind="stable")[:top_k]
    z = logits[top].astype(np.float64) / temperature
    w = np.exp(z - z.max())
    out[top] = w / w.sum()
    return out


def exact_joint(model, prompt: list, steps: int, top_k: int, bias_row: np.ndarray) -> dict:
    """{the `steps` tokens after prompt: their probability} under top-k sampling at temperature 1 of
    `model`'s logits plus bias_row, enumerated over every prefix (top_k ** steps sequences)."""
    exact = {}
    for ranks in itertools.product(range(top_k), repeat=steps):  # the chosen token's rank at each step
        prob, ids = 1.0, list(prompt)
        for rank in ranks:
            p = exact_probs(model.logits(ids)[-1] + bias_row, 1.0, top_k)
            token = int(np.argsort(-p, kind="stable")[rank])
            prob *= p[token]
            ids.append(token)
        exact[tuple(ids[len(prompt):])] = prob
    return exact
