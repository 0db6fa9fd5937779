"""Every architecture module against the float64 NumPy reference forward (tests/reference_forward.py).

Tiny random models (tests/tiny_models.py) are written by our GGUF writer in each quant type and loaded
through the public API. Tolerances, and why:
- Prefill of >= BLAS_MIN_ROWS (32) tokens, for the weight types without multi-row integer kernels
  (matmul.blas_min_rows), dequantizes weight tiles exactly (bit-exact dequantizers, tested elsewhere) and
  multiplies in float32 through BLAS, so it differs from the float64 reference only by float32 rounding
  accumulated over a handful of layers: max |error| <= 2e-3 x max |logit|.
- Decode (one token), prefill of fewer tokens, and prefill of any length for the types with multi-row
  integer kernels (Q4_0, Q5_0, Q8_0, Q4_K, Q6_K) quantize each activation vector to 8 bits per block,
  as llama.cpp does, before the integer dot products. Each element then carries up to d/2 = amax/254 of error; through a few layers
  that is about 1% of the logit scale: max |error| <= 4e-2 x max |logit| for quantized weights
  (float weights pair with float32 activations: same bound as prefill).
"""

from __future__ import annotations

import numpy as np
import pytest

import localllm
from localllm import quant
from localllm.errors import ContextOverflow, LocalLLMError, TensorError, UnsupportedArchitecture
from localllm.gguf import GGUFReader, GGUFWriter
from localllm.model import moe
from localllm.model.archs import ARCHITECTURES, architecture_class

import reference_forward
from tiny_models import TINY_ARCHS, write_tiny_model

ARCHS = sorted(TINY_ARCHS)  # every architecture, and Mixtral (llama with experts)
# 40 tokens: a prefill through BLAS where the type has no multi-row kernels (>= BLAS_MIN_ROWS), longer
# than the tiny Gemma's window of 5
PROMPT = [2, 300, 17, 281, 299, 5, 260, 310, 333, 290, 301, 7, 270, 275, 12, 318, 263, 297, 40, 311,
          288, 9, 325, 266, 302, 31, 279, 315, 258, 294, 21, 307, 272, 330, 285, 14, 261, 322, 291, 268]
SHORT_PROMPT = PROMPT[:14]  # a prefill through the integer kernels for every quantized type
PREFILL_RTOL = 2e-3
DECODE_RTOL_QUANT = 4e-2
# The tiny mixtures of experts with quantized weights: their experts' 8-bit activations move a few rows'
# logits much further from the float64 reference than the dense families' (measured over 20 seeds: up to
# 0.13 for an OLMoE Q2_K file, where llama.cpp's own logits are 0.147 from the reference on the same row
# and ours 0.019 from llama.cpp's). So the worst row gets MOE_RTOL_QUANT and the median row the dense
# families' DECODE_RTOL_QUANT; the llama.cpp oracle (test_llamacpp_archs.py) holds them to 4e-2.
MOE_RTOL_QUANT = 0.15
# The tiny hybrids (Qwen3.5's delta nets) with quantized weights likewise: the dense one's worst row is
# 3-15% from the float64 reference for every type (every quantized type, four seeds: up to 0.146, Q4_K
# seed 0, where llama.cpp's own logits are 0.139 from the reference on the same row and ours 0.027 from
# llama.cpp's; median rows at most 0.031); with experts (qwen35moe, qwen3next: three or four seeds) up
# to 0.18, medians at most 0.026. The 8-bit activations feed the delta nets' L2-normalised keys and
# their state, which carries each token's rounding into every later one. The worst row gets
# HYBRID_RTOL_QUANT, the median row DECODE_RTOL_QUANT; the llama.cpp oracle holds the hybrids to its 4e-2.
HYBRID_RTOL_QUANT = 0.25


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(arch, qtype) -> path of a tiny model, written once per module."""
    cache = {}
    root = tmp_path_factory.mktemp("tiny")

    def make(arch, qtype="F32"):
        key = (arch, qtype)
        if key not in cache:
            cache[key] = write_tiny_model(root / f"{arch}-{qtype}.gguf", arch, qtype, seed=len(cache))
        return cache[key]

    return make


def reference_logits(path, tokens, neox_override=None, **moe_options):
    """The float64 reference's logits; moe_options: reference_forward.forward's route_record and routes."""
    with GGUFReader(path) as reader:
        return reference_forward.forward(reader, tokens, neox_override=neox_override, **moe_options)


# Mixtures of experts. Where two experts score within rounding of each other, our engine and the float64
# reference may pick different ones (as llama.cpp's and ours may), and the logits then part by far more
# than any tolerance. So the reference is run with our engine's choices of experts (its own arithmetic
# and probabilities throughout), and the choices are checked apart: equal to the reference's wherever
# its margin (last chosen expert's score over the best one left out) is clear, relative to the spread
# (standard deviation) of the layer's scores. With quantized weights our experts take 8-bit activations,
# as llama.cpp's do, which move the next layer's scores by up to 0.15 of their spread from the reference's
# (measured: every tiny mixture of experts, Q2_K to Q5_K and IQ4_XS, 10 seeds each; Gemma 4's the most,
# Qwen3-MoE's 0.08): twice that is clear.
ROUTE_MARGIN_FLOAT, ROUTE_MARGIN_QUANT = 1e-4, 0.3
# In the hybrids with quantized weights the delta nets carry the 8-bit activations' rounding along the
# sequence: routes moved by up to 0.41 of the spread (qwen3next Q2_K; four seeds, every quantized type),
# and above that margin too few of a short prompt's rows remain to check. There the choices are left to
# the llama.cpp oracle (test_llamacpp_archs.py: its activations are rounded as ours, and it checks every
# route clear of 0.1); the reference still runs with our choices.


class RouteRecorder:
    """Records the experts our engine chooses (model.moe.expert_weights) while in its `with` block."""

    def __enter__(self):
        self.calls, self._original = [], moe.expert_weights

        def recording(scores, params):
            chosen, weights = self._original(scores, params)
            self.calls.append(chosen.copy())
            return chosen, weights

        moe.expert_weights = recording
        return self

    def __exit__(self, *exc):
        moe.expert_weights = self._original

    def per_layer(self, n_layer: int) -> list:
        """The choices int[rows, k] of each layer, over the forwards run in the block, rows in order."""
        return [np.concatenate(self.calls[il::n_layer]) for il in range(n_layer)]


def reference_with_our_routes(path, arch, qtype, tokens, recorder=None):
    """The reference's logits [T, vocab] for tokens, with the experts our engine chose in the forwards
    `recorder` saw (a mixture of experts); checks our choices against the reference's own where its
    margin is clear."""
    if not TINY_ARCHS[arch].n_expert:
        return reference_logits(path, tokens)
    record: list = []
    reference_logits(path, tokens, route_record=record)
    ours = recorder.per_layer(len(record))
    floats = quant.get(qtype).act == "f32"
    floor = ROUTE_MARGIN_FLOAT if floats else ROUTE_MARGIN_QUANT
    if TINY_ARCHS[arch].attention_interval and not floats:
        record = []  # the hybrids' choices: the llama.cpp oracle's to check (above)
    for il, ((theirs, margins, spread), mine) in enumerate(zip(record, ours)):
        clear = margins >= floor * spread
        same = (np.sort(theirs, axis=1) == np.sort(mine, axis=1)).all(axis=1)
        assert same[clear].all(), f"layer {il}: rows {np.flatnonzero(clear & ~same)} routed otherwise"
        assert clear.mean() >= 0.1  # the check sees some of the rows (llama.cpp's oracle checks nearly all)
    return reference_logits(path, tokens, routes=ours)


def prefill_tolerance(qtype: str, n_tokens: int, arch: str = "llama") -> float:
    """PREFILL_RTOL where the prefill multiplies float32 activations (float weights, or BLAS on exactly
    dequantized tiles), DECODE_RTOL_QUANT where it quantizes them for the integer kernels (always, for
    a mixture of experts' experts: matmul_experts computes each row as a one-row product does)."""
    from localllm.backends.cpu.matmul import blas_min_rows

    qt = quant.get(qtype)
    if qt.act == "f32" or (n_tokens >= blas_min_rows(qt) and not TINY_ARCHS[arch].n_expert):
        return PREFILL_RTOL
    return quant_tolerance(arch)


def quant_tolerance(arch: str) -> float:
    spec = TINY_ARCHS[arch]
    return HYBRID_RTOL_QUANT if spec.attention_interval else MOE_RTOL_QUANT if spec.n_expert else DECODE_RTOL_QUANT


def assert_close(ours, ref, tolerance: float) -> None:
    """Every row within `tolerance` (relative to the largest |logit|); where that is wider than
    DECODE_RTOL_QUANT (mixtures of experts, the hybrid), the median row within DECODE_RTOL_QUANT."""
    rows = np.abs(ours - ref).max(axis=-1) / np.abs(ref).max()
    assert rows.max() <= tolerance
    if tolerance > DECODE_RTOL_QUANT:
        assert np.median(rows) <= DECODE_RTOL_QUANT


def max_rel_error(ours, ref):
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("qtype", quant.supported_names())
@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_matches_float64_reference(tiny, arch, qtype):
    path = tiny(arch, qtype)
    model = localllm.load(path, n_ctx=64, threads=2)
    with RouteRecorder() as routes:
        ours = model.logits(PROMPT)
    ref = reference_with_our_routes(path, arch, qtype, PROMPT, routes)
    assert ours.shape == ref.shape
    assert_close(ours, ref, prefill_tolerance(qtype, len(PROMPT), arch))


def test_the_long_prompt_takes_the_blas_path_where_a_type_has_it_and_the_short_one_the_integer_kernels():
    from localllm.backends.cpu.matmul import BLAS_MIN_ROWS

    assert len(SHORT_PROMPT) < BLAS_MIN_ROWS <= len(PROMPT)
    # and both paths are exercised: some quantized types go through BLAS at this length, some not
    tolerances = {prefill_tolerance(name, len(PROMPT)) for name in quant.supported_names() if quant.get(name).act != "f32"}
    assert tolerances == {PREFILL_RTOL, DECODE_RTOL_QUANT}


@pytest.mark.parametrize("qtype", quant.supported_names())
@pytest.mark.parametrize("arch", ARCHS)
def test_short_prefill_matches_float64_reference_within_the_activation_rounding(tiny, arch, qtype):
    path = tiny(arch, qtype)
    model = localllm.load(path, n_ctx=64, threads=2)
    with RouteRecorder() as routes:
        ours = model.logits(SHORT_PROMPT)
    ref = reference_with_our_routes(path, arch, qtype, SHORT_PROMPT, routes)
    assert_close(ours, ref, prefill_tolerance(qtype, len(SHORT_PROMPT), arch))


@pytest.mark.parametrize("qtype", ["F32", "Q8_0", "Q4_K", "Q6_K"])
@pytest.mark.parametrize("arch", ARCHS)
def test_token_by_token_and_cached_decode_match(tiny, arch, qtype):
    """Prefill 9 tokens in one pass, decode the other 5 one at a time from the KV cache; every decoded
    position must match both the reference and a fresh one-pass prefill of the whole prompt."""
    path = tiny(arch, qtype)
    model = localllm.load(path, n_ctx=64, threads=2)
    session = model.new_session()
    split = 9
    with RouteRecorder() as routes:
        rows = [model.decoder.forward(np.array(PROMPT[:split], np.int32), 0, session.cache)[-1].copy()]
        for pos in range(split, len(PROMPT)):
            rows.append(model.decoder.forward(np.array([PROMPT[pos]], np.int32), pos, session.cache)[0].copy())
    decoded = np.stack(rows)  # logits at positions split-1 .. T-1
    with RouteRecorder() as full_routes:
        full = model.logits(PROMPT)[split - 1 :]
    ref = reference_with_our_routes(path, arch, qtype, PROMPT, routes)[split - 1 :]
    if TINY_ARCHS[arch].n_expert:  # the one-pass prefill compared where it routed as the decode did
        same = [(a == b).all(axis=1) for a, b in zip(routes.per_layer(len(routes.calls) // (1 + len(PROMPT) - split)),
                                                     full_routes.per_layer(len(full_routes.calls)))]
        rows = np.logical_and.reduce(same)[split - 1 :]
        decoded, full, ref = decoded[rows], full[rows], ref[rows]
    tol = PREFILL_RTOL if quant.get(qtype).act == "f32" else quant_tolerance(arch)
    assert_close(decoded, ref, tol)
    assert_close(decoded, full, tol)
    # Where the reference's top-1 leads its top-2 by more than twice the allowed error, no error within
    # the tolerance can change the winner: the argmax must agree there.
    top2 = np.sort(ref, axis=-1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 2 * tol * np.abs(ref).max()
    assert (decoded.argmax(-1) == ref.argmax(-1))[clear].all()


@pytest.mark.parametrize("arch", ARCHS)
def test_negative_control_wrong_rope_pairing_is_caught(tiny, arch):
    """The same comparison against a reference with the other RoPE pairing (normal <-> NeoX) must fail by
    a wide margin: the tolerance above is tight enough to see a RoPE bug."""
    path = tiny(arch)
    model = localllm.load(path, n_ctx=64, threads=2)
    ours = model.logits(PROMPT)
    right = reference_logits(path, PROMPT)
    neox = architecture_class(TINY_ARCHS[arch].architecture or arch).ROPE_NEOX
    wrong = reference_logits(path, PROMPT, neox_override=not neox)
    assert max_rel_error(ours, right) <= PREFILL_RTOL
    assert max_rel_error(ours, wrong) > 20 * PREFILL_RTOL


def test_gemma_sliding_window_matters(tiny):
    """Gemma 3's local layers see only the last `sliding_window` tokens: a reference without the window
    disagrees with us, so the window is really applied (prompt length 14 > window 5)."""
    path = tiny("gemma3")
    model = localllm.load(path, n_ctx=64, threads=2)
    ours = model.logits(PROMPT)
    with GGUFReader(path) as reader:
        reader.metadata["gemma3.attention.sliding_window"] = 10_000
        no_window = reference_forward.forward(reader, PROMPT)
    assert max_rel_error(ours[6:], no_window[6:]) > 20 * PREFILL_RTOL
    np.testing.assert_allclose(ours[:5], no_window[:5], rtol=0, atol=PREFILL_RTOL * np.abs(no_window).max())


# -- bad models and bad prompts ---------------------------------------------------------------------------


def _rewrite(src, dst, *, arch=None, drop=None, reshape=None):
    """Copy a model, changing its architecture name, dropping a tensor or giving one a wrong shape."""
    with GGUFReader(src) as r:
        w = GGUFWriter(dst)
        w.copy_metadata(r)
        if arch:
            w.add("general.architecture", arch)
        for name, info in r.tensors.items():
            if name == drop:
                continue
            data = np.array(r.tensor_bytes(name))
            shape = info.shape
            if name == reshape:
                shape, data = (shape[0], shape[1] - 1), data[:-1]
            w.add_tensor(name, data, info.ggml_type.name, shape=shape)
        w.write()
    return dst


def test_unknown_architecture_lists_supported(tiny, tmp_path):
    path = _rewrite(tiny("llama"), tmp_path / "m.gguf", arch="mamba")
    with pytest.raises(UnsupportedArchitecture) as err:
        localllm.load(path)
    assert "mamba" in str(err.value) and all(a in str(err.value) for a in ARCHITECTURES)


def test_missing_tensor_is_named(tiny, tmp_path):
    path = _rewrite(tiny("qwen2"), tmp_path / "m.gguf", drop="blk.1.attn_k.bias")
    with pytest.raises(TensorError, match="blk.1.attn_k.bias"):
        localllm.load(path)


def test_wrong_shape_is_named(tiny, tmp_path):
    path = _rewrite(tiny("llama"), tmp_path / "m.gguf", reshape="blk.0.ffn_up.weight")
    with pytest.raises(TensorError, match=r"blk\.0\.ffn_up\.weight.*shape"):
        localllm.load(path)


def test_prompt_over_context_raises_with_the_numbers(tiny):
    model = localllm.load(tiny("llama"), n_ctx=16)
    with pytest.raises(ContextOverflow) as err:
        list(model.generate(list(range(260, 280)), max_tokens=4, temperature=0))
    assert err.value.n_tokens >= 20 and err.value.n_ctx == 16
    with pytest.raises(LocalLLMError):
        localllm.load(tiny("llama"), n_ctx=8)


@pytest.mark.parametrize("arch", ARCHS)
def test_memory_estimate_counts_the_kv_cache_load_allocates(tiny, arch):
    """estimate_memory's KV bytes (from metadata alone) equal the bytes of the cache a session holds:
    Gemma 4's narrower local layers and shared layers included; for a hybrid, its recurrent buffers and
    room for their MAX_CHECKPOINTS copies (made as prompts are prefilled) and for the copy speculative
    decoding keeps (KVCache.save_state, made at its first step)."""
    from localllm.api import estimate_memory
    from localllm.model.recurrent import MAX_CHECKPOINTS

    path = tiny(arch)
    model = localllm.load(path, n_ctx=64, threads=2)
    cache = model.session.cache
    allocated = sum(a.nbytes for a in {id(a): a for a in cache.k + cache.v if a is not None}.values())
    if cache.states is not None:
        allocated += (2 + MAX_CHECKPOINTS) * sum(b.nbytes for bs in cache.states.layers.values() for b in bs)
    assert estimate_memory(path, n_ctx=64).kv_bytes == model.memory.kv_bytes == allocated


def test_longrope_factors_follow_the_context(tiny):
    """Phi-3's LongRoPE: the short factors within rope.scaling.original_context_length (32 in the tiny
    model), the long ones past it, chosen again when the context is resized."""
    path = tiny("phi3")
    prompt = PROMPT[:12]
    short = localllm.load(path, n_ctx=16, threads=2)
    long = localllm.load(path, n_ctx=64, threads=2)
    at_16, at_64 = short.logits(prompt), long.logits(prompt)
    assert max_rel_error(at_16, at_64) > 1e-2
    short.resize_context(64)
    np.testing.assert_array_equal(short.logits(prompt), at_64)
