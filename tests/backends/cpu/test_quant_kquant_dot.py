"""Q4_K, Q5_K, Q6_K, Q4_0 and IQ4_NL vec_dot against a NumPy model of their arithmetic, bit for bit.

Per super-block the kernels compute exact integers (Q4_K, Q5_K: sum_k scale_k * <q_k, a_k> and
sum_k min_k * <1, a_k>; Q6_K: sum_g scale_g * <q_g - 32, a_g>), however their vector code is arranged
(AVX-512, AVX2, generic; see test_quant_isa), then one float step per block in a fixed order, with fused multiply-adds (rounded once):
  Q4_K, Q5_K: fma(ad, fma(d, float(scaled), -(dmin * float(mins))), acc)
  Q6_K: fma(ad * d, float(total), acc)
  Q4_0 (32-element blocks, block_sums): fma(float(sum_j (q_j - 8) * a_j), d * ad, acc)
  IQ4_NL (the same, block_sums): fma(float(sum_j KVALUES[q_j] * a_j), d * ad, acc)
(what the kernels computed when this test was written: LLVM had contracted the written
acc + ad * (d * scaled - dmin * mins) so; they now state the fmas). The model computes the integers in
int64 and the float steps exactly (fractions, one rounding), so any change to either (a reordered or
differently contracted float step, a lost integer) shows as a different bit pattern. Rows of 256..14336 (Llama-3-8B's widths) and extreme activations.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from quant_rows import bits, random_rows

from localllm import quant
from localllm.backends.cpu.quant_kernels import kernel_record
from localllm.quant.activation import QuantizedActivation
from localllm.quant.iq4_nl import KVALUES
from localllm.quant.kquant_fit import unpack_scales_mins
from localllm.quant.q6_k import unpack_quants


def fma32(a, b, c):
    """a * b + c rounded once to float32 (round to nearest, ties to even), for float32 a, b, c."""
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    near = np.float32(float(exact))
    candidates = [near, np.nextafter(near, np.float32(np.inf)), np.nextafter(near, np.float32(-np.inf))]
    return min(candidates, key=lambda x: (abs(Fraction(float(x)) - exact), int(x.view(np.uint32)) & 1))


def _q4_k_model(row, aqs, ad, asum):
    blocks = row.reshape(-1, 144)
    packed = blocks[:, 16:].reshape(-1, 4, 1, 32)
    q = np.concatenate([packed & 15, packed >> 4], axis=2).reshape(-1, 8, 32).astype(np.int64)
    return _k4_float_steps(blocks, q, aqs, ad, asum)


def _q5_k_model(row, aqs, ad, asum):
    blocks = row.reshape(-1, 176)
    packed = blocks[:, 48:].reshape(-1, 4, 1, 32)
    low = np.concatenate([packed & 15, packed >> 4], axis=2).reshape(-1, 8, 32)  # sub-block k = 2c + half
    fifth = (blocks[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    q = (low | (fifth << 4)).astype(np.int64)
    return _k4_float_steps(blocks, q, aqs, ad, asum)


def _k4_float_steps(blocks, q, aqs, ad, asum):
    """Q4_K's and Q5_K's integers (q: the unsigned quants [nb, 8, 32]) and float steps."""
    scales, mins = (x.astype(np.int64) for x in unpack_scales_mins(blocks[:, 4:16]))
    a = aqs.reshape(-1, 8, 32).astype(np.int64)
    scaled = ((q * a).sum(axis=2) * scales).sum(axis=1)
    mins_sum = (asum.reshape(-1, 8, 2).astype(np.int64).sum(axis=2) * mins).sum(axis=1)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)[:, 0]
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)[:, 0]
    acc = np.float32(0.0)
    for b in range(blocks.shape[0]):
        step = fma32(d[b], np.float32(np.int32(scaled[b])), -(dmin[b] * np.float32(np.int32(mins_sum[b]))))
        acc = fma32(ad[b], step, acc)
    return acc


def _q6_k_model(row, aqs, ad, asum):
    blocks = row.reshape(-1, 210)
    q = unpack_quants(blocks).astype(np.int64).reshape(-1, 16, 16) - 32
    scales = blocks[:, 192:208].view(np.int8).astype(np.int64)
    total = ((q * aqs.reshape(-1, 16, 16).astype(np.int64)).sum(axis=2) * scales).sum(axis=1)
    d = blocks[:, 208:210].copy().view(np.float16).astype(np.float32)[:, 0]
    acc = np.float32(0.0)
    for b in range(blocks.shape[0]):
        acc = fma32(ad[b] * d[b], np.float32(np.int32(total[b])), acc)
    return acc


def _iq4_nl_model(row, aqs, ad, asum):
    blocks = row.reshape(-1, 18)
    index = np.concatenate([blocks[:, 2:] & 15, blocks[:, 2:] >> 4], axis=1)
    levels = np.asarray(KVALUES, dtype=np.int64)[index]
    return _block_sums_steps(blocks, levels, aqs, ad)


def _q4_0_model(row, aqs, ad, asum):
    blocks = row.reshape(-1, 18)
    q = np.concatenate([blocks[:, 2:] & 15, blocks[:, 2:] >> 4], axis=1).astype(np.int64) - 8
    return _block_sums_steps(blocks, q, aqs, ad)


def _block_sums_steps(blocks, weights, aqs, ad):
    """One float step per 32-element block: weights int64[nb, 32] (the quants or levels), d at byte 0."""
    total = (weights * aqs.reshape(-1, 32).astype(np.int64)).sum(axis=1)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)[:, 0]
    acc = np.float32(0.0)
    for b in range(blocks.shape[0]):
        acc = fma32(np.float32(np.int32(total[b])), d[b] * ad[b], acc)
    return acc


MODELS = {"Q4_K": _q4_k_model, "Q5_K": _q5_k_model, "Q6_K": _q6_k_model, "Q4_0": _q4_0_model, "IQ4_NL": _iq4_nl_model}


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("k", [256, 2048, 4096, 14336])
def test_vec_dot_equals_the_integer_and_float_model(name, k):
    rng = np.random.default_rng(k)
    qt = quant.get(name)
    raw = np.concatenate([random_rows(name, 6, k, rng), qt.quantize(rng.normal(0, 0.05, (2, k)).astype(np.float32))])
    act = QuantizedActivation(qt.act, k)
    for scale in (0.01, 1.0, 1e4):
        x = (rng.standard_normal(k) * scale).astype(np.float32)
        x[:3] = [-1e5, 1e5, 0.0]  # activation quants at -127 and 127
        aqs, ad, asum = (a.copy() for a in act.quantize(x))
        ours = np.array([kernel_record(qt).vec_dot(row, aqs, ad, asum) for row in raw], dtype=np.float32)
        model = np.array([MODELS[name](row, aqs, ad, asum) for row in raw], dtype=np.float32)
        np.testing.assert_array_equal(bits(ours), bits(model), err_msg=f"{name} K={k} scale={scale}")
