"""A plain NumPy float64 forward of the BERT encoders (`bert`, `nomic-bert`): the second oracle of
tests/model/test_embeddings.py, beside llama.cpp's vectors.

Written from BERT's definition (and nomic-bert's changes: RoPE instead of the position table, a SiLU
gate), independently of localllm/model: weights dequantized by the NumPy reference dequantizers
(tests/reference_forward.load_weights), every step the textbook formula in float64, attention over the
whole text. Gives every token's final hidden state; pooling is the test's.
"""

from __future__ import annotations

import numpy as np

from reference_forward import gelu_tanh, load_weights, rope, silu


def layer_norm(x, weight, bias, eps):
    centred = x - x.mean(axis=-1, keepdims=True)
    return centred / np.sqrt((centred**2).mean(axis=-1, keepdims=True) + eps) * weight + bias


def attend_all(q, k, v, scale):
    """q, k, v [T, H, D]: every position attends to every position."""
    scores = np.einsum("thd,shd->hts", q, k) * scale
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hts,shd->thd", p, v)


def hidden_states(reader, tokens) -> np.ndarray:
    """float64 [T, n_embd]: the last block's output for `tokens` from position 0."""
    md, arch = reader.metadata, reader.architecture
    nomic = arch == "nomic-bert"
    w = load_weights(reader)
    n_head = int(md[f"{arch}.attention.head_count"])
    eps = float(md[f"{arch}.attention.layer_norm_epsilon"])
    tokens = np.asarray(tokens)
    n, e = len(tokens), w["token_embd.weight"].shape[1]
    d = e // n_head
    positions = np.arange(n)
    x = w["token_embd.weight"][tokens] + w["token_types.weight"][0]
    if not nomic:
        x = x + w["position_embd.weight"][positions]
    x = layer_norm(x, w["token_embd_norm.weight"], w["token_embd_norm.bias"], eps)
    for il in range(int(md[f"{arch}.block_count"])):
        p = f"blk.{il}."
        if nomic:
            q, k, v = np.split(x @ w[p + "attn_qkv.weight"].T, 3, axis=-1)
        else:
            q, k, v = (x @ w[p + f"attn_{c}.weight"].T + w[p + f"attn_{c}.bias"] for c in "qkv")
        q, k, v = (a.reshape(n, n_head, d) for a in (q, k, v))
        if nomic:
            base = float(md[f"{arch}.rope.freq_base"])
            q, k = rope(q, positions, d, base, neox=True), rope(k, positions, d, base, neox=True)
        attn = attend_all(q, k, v, 1.0 / np.sqrt(d)).reshape(n, e)
        h = layer_norm(x + attn @ w[p + "attn_output.weight"].T + w[p + "attn_output.bias"],
                       w[p + "attn_output_norm.weight"], w[p + "attn_output_norm.bias"], eps)
        if nomic:
            ffn = (silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
        else:
            up = gelu_tanh(h @ w[p + "ffn_up.weight"].T + w[p + "ffn_up.bias"])
            ffn = up @ w[p + "ffn_down.weight"].T + w[p + "ffn_down.bias"]
        x = layer_norm(h + ffn, w[p + "layer_output_norm.weight"], w[p + "layer_output_norm.bias"], eps)
    return x
