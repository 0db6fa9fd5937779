"""A plain NumPy float64 forward pass for each architecture: the oracle for our engine.

Written from the architectures' definitions, independently of localllm/model: weights are dequantized with
the NumPy reference dequantizers (themselves checked bit for bit against llama.cpp's gguf package), and
every step is the textbook formula in float64. Slow and simple on purpose.
"""

from __future__ import annotations

import math

import numpy as np

from localllm import quant


def load_weights(reader) -> dict[str, np.ndarray]:
    """Every tensor dequantized to float64, NumPy order (ggml shape reversed)."""
    out = {}
    for name, info in reader.tensors.items():
        raw = reader.tensor_bytes(name)
        flat = quant.get(info.ggml_type.name).dequantize(np.ascontiguousarray(raw).reshape(-1))
        out[name] = flat.astype(np.float64).reshape(tuple(reversed(info.shape)))
    return out


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, positions, n_rot, base, neox, freq_scale=1.0, factors=None, yarn=None, mscale=1.0):
    """x [T, H, D] float64; rotates the first n_rot dims of each head; cos and sin times mscale.

    yarn: (original context, beta_fast, beta_slow) for YaRN (ggml's rope_yarn): pair i's angle mixes the
    interpolated angle (freq_scale times) and the extrapolated one by a ramp over the pairs between the
    correction dims, and mscale grows by 1 + 0.1 ln(1 / freq_scale)."""
    x = x.copy()
    half = n_rot // 2
    i = np.arange(half, dtype=np.float64)
    extrap = base ** (-i * 2.0 / n_rot)
    if factors is not None:
        extrap = extrap / factors
    inv = freq_scale * extrap
    if yarn is not None:
        orig_ctx, beta_fast, beta_slow = yarn
        corr = lambda turns: n_rot * math.log(orig_ctx / (turns * 2 * math.pi)) / (2 * math.log(base))  # noqa: E731
        low, high = max(0.0, math.floor(corr(beta_fast))), min(n_rot - 1.0, math.ceil(corr(beta_slow)))
        ramp = 1.0 - np.clip((i - low) / max(0.001, high - low), 0.0, 1.0)
        inv = inv * (1 - ramp) + extrap * ramp
        mscale = mscale * (1.0 + 0.1 * math.log(1.0 / freq_scale))
    ang = positions[:, None].astype(np.float64) * inv[None, :]  # [T, half]
    cos, sin = mscale * np.cos(ang)[:, None, :], mscale * np.sin(ang)[:, None, :]
    if neox:
        a, b = x[..., :half].copy(), x[..., half:n_rot].copy()
        x[..., :half], x[..., half:n_rot] = a * cos - b * sin, a * sin + b * cos
    else:
        a, b = x[..., 0:n_rot:2].copy(), x[..., 1:n_rot:2].copy()
        x[..., 0:n_rot:2], x[..., 1:n_rot:2] = a * cos - b * sin, a * sin + b * cos
    return x


def attend(q, k, v, scale, window, softcap=0.0, sinks=None):
    """q [T, Hq, D], k/v [T, Hkv, D]; causal, optional window; GQA by repeating kv heads; scores
    soft-capped to softcap * tanh(s / softcap) when softcap > 0; sinks [Hq]: a logit per head that joins
    each softmax's sum and brings no value (gpt-oss)."""
    t, hq, _ = q.shape
    group = hq // k.shape[1]
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    scores = np.einsum("thd,shd->hts", q, k) * scale
    if softcap:
        scores = softcap * np.tanh(scores / softcap)
    pos = np.arange(t)
    allowed = pos[None, :] <= pos[:, None]
    if window:
        allowed &= (pos[:, None] - pos[None, :]) < window
    scores = np.where(allowed[None], scores, -np.inf)
    top = scores.max(-1, keepdims=True)
    if sinks is not None:
        top = np.maximum(top, sinks[:, None, None])
    p = np.exp(scores - top)
    total = p.sum(-1, keepdims=True)
    if sinks is not None:
        total = total + np.exp(sinks[:, None, None] - top)
    p /= total
    return np.einsum("hts,shd->thd", p, v)


def silu(x):
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def forward(reader, tokens, neox_override=None, n_ctx=64, route_record=None, routes=None) -> np.ndarray:
    """Logits [T, vocab] (float64) for `tokens` from position 0, in a context of n_ctx tokens (LongRoPE's
    factors depend on it). Mixtures of experts: route_record, a list, gets per layer the reference's own
    choice of experts int[T, k], each token's margin [T] between the router scores of its last chosen
    expert and the best one left out, and the scores' standard deviation; routes: per layer the experts int[T, k] to use instead (weighted by
    the reference's own probabilities)."""
    arch = reader.architecture
    md = lambda key, default=None: reader.metadata.get(f"{arch}.{key}", default)  # noqa: E731
    w = load_weights(reader)
    if arch == "gemma4":
        return forward_gemma4(md, w, tokens, neox_override, route_record, routes)
    if arch in ("qwen35", "qwen35moe", "qwen3next"):
        return forward_qwen35(md, w, tokens, neox_override, route_record, routes, grouped=arch == "qwen3next")
    n_layer, n_embd = md("block_count"), md("embedding_length")
    n_head = md("attention.head_count")
    n_kv = md("attention.head_count_kv", n_head)
    head_dim = md("attention.key_length", n_embd // n_head)
    n_rot = md("rope.dimension_count", head_dim)
    eps = md("attention.layer_norm_rms_epsilon")
    base = md("rope.freq_base", 10000.0)
    gemma = arch in ("gemma2", "gemma3")
    gemma2 = arch == "gemma2"  # every other layer local (from layer 0), soft-capped scores and logits
    olmo2 = arch == "olmo2"  # norms after the sub-blocks instead of before; Q/K norms over whole rows
    full_qk_norm = arch in ("olmo2", "olmoe")  # Q/K norms over whole rows, before the heads are split
    gpt_oss = arch == "gpt-oss"  # every other layer local from layer 0, sinks, biases, its own experts
    granite = arch == "granite"
    neox = arch in ("qwen2", "qwen3", "gemma2", "gemma3", "olmo2", "phi3", "qwen2moe", "qwen3moe", "olmoe", "gpt-oss") \
        if neox_override is None else neox_override
    embedding_scale = md("embedding_scale", 0.0) if granite else 0.0
    residual_scale = md("residual_scale", 0.0) if granite else 0.0
    kq_scale = (md("attention.scale", 0.0) if granite else 0.0) or 1.0 / math.sqrt(head_dim)
    tokens = np.asarray(tokens)
    t = len(tokens)
    positions = np.arange(t)
    if arch == "phi3":  # fused Q/K/V and gate/up: split into the separate matrices
        for il in range(n_layer):
            p = f"blk.{il}."
            q_rows, kv_rows = n_head * head_dim, n_kv * head_dim
            qkv = w.pop(p + "attn_qkv.weight")
            w[p + "attn_q.weight"], w[p + "attn_k.weight"], w[p + "attn_v.weight"] = np.split(qkv, [q_rows, q_rows + kv_rows])
            w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"] = np.split(w.pop(p + "ffn_up.weight"), 2)
    # RoPE scaling: Phi-3's LongRoPE factors (long past the original context; the tests run at 64) and
    # attention factor; Mistral 3's YaRN and attention temperature
    orig_ctx = md("rope.scaling.original_context_length", md("context_length"))
    rope_factors, rope_mscale, yarn, freq_scale = w.get("rope_freqs.weight"), 1.0, None, 1.0
    if arch == "phi3":
        rope_factors = w["rope_factors_long.weight"] if n_ctx > orig_ctx else w["rope_factors_short.weight"]
        rope_mscale = md("rope.scaling.attn_factor", 1.0)
    if md("rope.scaling.type") == "yarn":
        factor = md("rope.scaling.factor")
        yarn, freq_scale = (orig_ctx, md("rope.scaling.yarn_beta_fast", 32.0), md("rope.scaling.yarn_beta_slow", 1.0)), 1 / factor
    temperature = md("attention.temperature_scale", 0.0)
    x = w["token_embd.weight"][tokens]
    if gemma:
        x = x * math.sqrt(n_embd)
    if embedding_scale:
        x = x * embedding_scale
    for il in range(n_layer):
        p = f"blk.{il}."
        h = x if olmo2 else rms_norm(x, w[p + "attn_norm.weight"], eps)
        q = h @ w[p + "attn_q.weight"].T
        k = h @ w[p + "attn_k.weight"].T
        v = h @ w[p + "attn_v.weight"].T
        if p + "attn_q.bias" in w:
            q, k, v = q + w[p + "attn_q.bias"], k + w[p + "attn_k.bias"], v + w[p + "attn_v.bias"]
        if full_qk_norm:
            q, k = rms_norm(q, w[p + "attn_q_norm.weight"], eps), rms_norm(k, w[p + "attn_k_norm.weight"], eps)
        q = q.reshape(t, n_head, head_dim)
        k = k.reshape(t, n_kv, head_dim)
        v = v.reshape(t, n_kv, head_dim)
        if p + "attn_q_norm.weight" in w and not full_qk_norm:
            q = rms_norm(q, w[p + "attn_q_norm.weight"], eps)
            k = rms_norm(k, w[p + "attn_k_norm.weight"], eps)
        window, layer_base = 0, base
        if arch == "gemma3" and (il + 1) % 6 != 0:  # Gemma 3: five sliding-window layers, then one global
            window, layer_base = md("attention.sliding_window"), 10000.0
        if (gemma2 or gpt_oss) and il % 2 == 0:
            window = md("attention.sliding_window")
        if not (arch == "smollm3" and (il + 1) % 4 == 0):  # SmolLM3: no RoPE in every fourth layer
            q = rope(q, positions, n_rot, layer_base, neox, freq_scale, rope_factors, yarn, rope_mscale)
            k = rope(k, positions, n_rot, layer_base, neox, freq_scale, rope_factors, yarn, rope_mscale)
        if temperature:  # Llama 4's attention temperature: queries scaled by position
            q = q * (1 + temperature * np.log(np.floor(positions / orig_ctx) + 1))[:, None, None]
        softcap = md("attn_logit_softcapping") if gemma2 else 0.0
        attn = attend(q, k, v, kq_scale, window, softcap, w.get(p + "attn_sinks.weight")).reshape(t, n_head * head_dim)
        o = attn @ w[p + "attn_output.weight"].T + w.get(p + "attn_output.bias", 0.0)
        if gemma or olmo2:
            o = rms_norm(o, w[p + "post_attention_norm.weight"], eps)
        if residual_scale:
            o = o * residual_scale
        x = x + o
        h = x if olmo2 else rms_norm(x, w[p + ("post_attention_norm" if gpt_oss else "ffn_norm") + ".weight"], eps)
        act = gelu_tanh if gemma else silu
        if gpt_oss:
            f = experts_gpt_oss(w, p, h, md("expert_used_count"), route_record, routes[il] if routes is not None else None)
        elif p + "ffn_gate_inp.weight" in w:
            f = experts(w, p, h, md("expert_used_count"), arch in ("qwen3moe", "llama"), route_record,
                        routes[il] if routes is not None else None)
        else:
            f = (act(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
        if gemma or olmo2:
            f = rms_norm(f, w[p + "post_ffw_norm.weight"], eps)
        if residual_scale:
            f = f * residual_scale
        x = x + f
    x = rms_norm(x, w["output_norm.weight"], eps)
    out = w.get("output.weight", w["token_embd.weight"])
    logits = x @ out.T
    if granite:
        logits = logits / md("logit_scale")
    if gemma2:
        cap = md("final_logit_softcapping")
        logits = cap * np.tanh(logits / cap)
    return logits


def experts(w, p, h, k, normalise, record=None, forced=None, act=silu, scores=None):
    """A mixture of experts' feed-forward of h [T, E]: softmax over the router's scores, the k most
    probable experts, their SiLU-gated outputs summed times their probabilities (renormalised over the k
    when `normalise`); plus a shared expert times sigmoid(gate . h) where the layer has one."""
    if scores is None:
        scores = h @ w[p + "ffn_gate_inp.weight"].T  # [T, n_expert]
    if record is not None:
        ranked = np.sort(scores, axis=-1)
        record.append((np.argsort(-scores, axis=-1)[:, :k], ranked[:, -k] - ranked[:, -k - 1], float(scores.std())))
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    if p + "ffn_gate_up_exps.weight" in w:  # [n_expert, 2N, K]: each expert's gate rows, then its up rows
        gate, up = np.split(w[p + "ffn_gate_up_exps.weight"], 2, axis=1)
    else:
        gate, up = w[p + "ffn_gate_exps.weight"], w[p + "ffn_up_exps.weight"]  # [n_expert, N, K]
    down = w[p + "ffn_down_exps.weight"]
    down_scale = w.get(p + "ffn_down_exps.scale")  # one factor per expert's output
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        chosen = np.argsort(-probs[t])[:k] if forced is None else forced[t]
        weights = probs[t, chosen] / (probs[t, chosen].sum() if normalise else 1.0)
        for e, weight in zip(chosen, weights):
            scale = 1.0 if down_scale is None else down_scale[e]
            out[t] += weight * scale * ((act(gate[e] @ h[t]) * (up[e] @ h[t])) @ down[e].T)
    if p + "ffn_gate_inp_shexp.weight" in w:
        shared = (silu(h @ w[p + "ffn_gate_shexp.weight"].T) * (h @ w[p + "ffn_up_shexp.weight"].T)) @ w[p + "ffn_down_shexp.weight"].T
        out += shared / (1.0 + np.exp(-(h @ w[p + "ffn_gate_inp_shexp.weight"])))[:, None]
    return out


def swiglu_oai(g, u):
    """gpt-oss's clamped SwiGLU: g clamped above at 7, u into [-7, 7], g * sigmoid(1.702 g) * (u + 1)."""
    g, u = np.minimum(g, 7.0), np.clip(u, -7.0, 7.0)
    return g / (1.0 + np.exp(-1.702 * g)) * (u + 1.0)


def experts_gpt_oss(w, p, h, k, record=None, forced=None):
    """gpt-oss's experts of h [T, E]: scores with the router's bias, the k highest, weighted by the softmax
    over those k alone; each expert's gate, up and down with their biases, the clamped SwiGLU."""
    scores = h @ w[p + "ffn_gate_inp.weight"].T + w[p + "ffn_gate_inp.bias"]  # [T, n_expert]
    if record is not None:
        ranked = np.sort(scores, axis=-1)
        record.append((np.argsort(-scores, axis=-1)[:, :k], ranked[:, -k] - ranked[:, -k - 1], float(scores.std())))
    gate, up, down = (w[p + f"ffn_{part}_exps.weight"] for part in ("gate", "up", "down"))
    gate_b, up_b, down_b = (w[p + f"ffn_{part}_exps.bias"] for part in ("gate", "up", "down"))  # [n_expert, N]
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        chosen = np.argsort(-scores[t])[:k] if forced is None else forced[t]
        weights = np.exp(scores[t, chosen] - scores[t, chosen].max())
        weights /= weights.sum()
        for e, weight in zip(chosen, weights):
            act = swiglu_oai(gate[e] @ h[t] + gate_b[e], up[e] @ h[t] + up_b[e])
            out[t] += weight * (down[e] @ act + down_b[e])
    return out


def forward_gemma4(md, w, tokens, neox_override=None, route_record=None, routes=None) -> np.ndarray:
    """Gemma 4, from its definition: local and global layers of different head sizes and RoPE,
    the last `shared_kv_layers` layers attending over the keys and values of the last local / global
    layer before them, V RMS-normed without a weight (K's projection where attn_v is absent), unscaled
    scores, per-layer embeddings added after each feed-forward, a per-layer output scale, soft-capped
    logits; in a layer with experts, the experts beside the dense feed-forward, each normed on its own
    way in and out, the router scoring rms_norm(x) / sqrt(n_embd) * ffn_gate_inp.scale."""
    n_layer, n_embd, eps = md("block_count"), md("embedding_length"), md("attention.layer_norm_rms_epsilon")
    n_head, n_kv = md("attention.head_count"), md("attention.head_count_kv")
    local = list(md("attention.sliding_window_pattern"))
    window, n_ple = md("attention.sliding_window"), md("embedding_length_per_layer_input", 0)
    n_kv_layers = n_layer - md("attention.shared_kv_layers", 0)
    neox = True if neox_override is None else neox_override
    tokens = np.asarray(tokens)
    t, positions = len(tokens), np.arange(len(tokens))
    x = w["token_embd.weight"][tokens] * math.sqrt(n_embd)
    if n_ple:
        embedded = w["per_layer_token_embd.weight"][tokens].reshape(t, n_layer, n_ple) * math.sqrt(n_ple)
        projected = (x @ w["per_layer_model_proj.weight"].T / math.sqrt(n_embd)).reshape(t, n_layer, n_ple)
        per_layer = (rms_norm(projected, w["per_layer_proj_norm.weight"], eps) + embedded) / math.sqrt(2.0)
    caches = {}
    for il in range(n_layer):
        p = f"blk.{il}."
        if local[il]:
            head_dim, n_rot = md("attention.key_length_swa"), md("rope.dimension_count_swa")
            base, factors = md("rope.freq_base_swa", 10000.0), None
        else:
            head_dim, n_rot = md("attention.key_length"), md("rope.dimension_count")
            base, factors = md("rope.freq_base"), w.get("rope_freqs.weight")
            factors = None if factors is None else factors[: n_rot // 2]
        h = rms_norm(x, w[p + "attn_norm.weight"], eps)
        q = rms_norm((h @ w[p + "attn_q.weight"].T).reshape(t, n_head, head_dim), w[p + "attn_q_norm.weight"], eps)
        q = rope(q, positions, n_rot, base, neox, factors=factors)
        if il < n_kv_layers:
            k = (h @ w[p + "attn_k.weight"].T).reshape(t, n_kv, head_dim)
            v = (h @ w[p + "attn_v.weight"].T).reshape(t, n_kv, head_dim) if p + "attn_v.weight" in w else k
            v = v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps)
            k = rope(rms_norm(k, w[p + "attn_k_norm.weight"], eps), positions, n_rot, base, neox, factors=factors)
            caches[il] = (k, v)
        else:  # the last local or global layer with its own keys and values
            k, v = caches[n_kv_layers - (2 if local[il] else 1)]
        attn = attend(q, k, v, 1.0, window if local[il] else 0).reshape(t, n_head * head_dim)
        x = x + rms_norm(attn @ w[p + "attn_output.weight"].T, w[p + "post_attention_norm.weight"], eps)
        h = rms_norm(x, w[p + "ffn_norm.weight"], eps)
        f = (gelu_tanh(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
        if p + "ffn_gate_inp.weight" in w:  # experts beside the dense feed-forward, each with its own norms
            router_in = rms_norm(x, 1.0, eps) / math.sqrt(n_embd) * w[p + "ffn_gate_inp.scale"]
            routed = experts(w, p, rms_norm(x, w[p + "pre_ffw_norm_2.weight"], eps), md("expert_used_count"), True,
                             route_record, routes[il] if routes is not None else None, act=gelu_tanh,
                             scores=router_in @ w[p + "ffn_gate_inp.weight"].T)
            f = rms_norm(f, w[p + "post_ffw_norm_1.weight"], eps) + rms_norm(routed, w[p + "post_ffw_norm_2.weight"], eps)
        x = x + rms_norm(f, w[p + "post_ffw_norm.weight"], eps)
        if n_ple:
            g = gelu_tanh(x @ w[p + "inp_gate.weight"].T) * per_layer[:, il]
            x = x + rms_norm(g @ w[p + "proj.weight"].T, w[p + "post_norm.weight"], eps)
        if p + "layer_output_scale.weight" in w:
            x = x * w[p + "layer_output_scale.weight"][0]
    x = rms_norm(x, w["output_norm.weight"], eps)
    logits = x @ w.get("output.weight", w["token_embd.weight"]).T
    cap = md("final_logit_softcapping", 30.0)
    return cap * np.tanh(logits / cap)


def softplus(x):
    return np.log1p(np.exp(x))


def causal_conv(x, weight):
    """x [T, C] from a zero history, weight [C, K]: out[t, c] = sum_i weight[c, i] x[t + i - (K - 1), c]."""
    k = weight.shape[1]
    padded = np.concatenate([np.zeros((k - 1, x.shape[1])), x])
    return sum(padded[i : i + x.shape[0]] * weight[:, i] for i in range(k))


def gated_delta_rule(q, k, v, g, beta, grouped=False):
    """q, k [T, Hk, S] (unit rows), v [T, Hv, S], g and beta [T, Hv]; value head h reads key head h % Hk
    (grouped: h // (Hv / Hk)). Per head a state M [S, S] from zero: M = e^g M, then
    M += beta (v - M k) k^T, out = M q / sqrt(S)."""
    t, n_k, size = q.shape
    n_v = v.shape[1]
    m = np.zeros((n_v, size, size))
    out = np.zeros((t, n_v, size))
    for i in range(t):
        for h in range(n_v):
            hk = h // (n_v // n_k) if grouped else h % n_k
            kt, qt = k[i, hk], q[i, hk]
            m[h] *= np.exp(g[i, h])
            m[h] += beta[i, h] * np.outer(v[i, h] - m[h] @ kt, kt)
            out[i, h] = m[h] @ qt / np.sqrt(size)
    return out


def forward_qwen35(md, w, tokens, neox_override=None, route_record=None, routes=None, grouped=False) -> np.ndarray:
    """Qwen3.5: gated delta nets, and every full_attention_interval-th layer a gated attention (its output
    times sigmoid of a gate that attn_q gives beside each head's queries); RoPE (NeoX pairing) on the
    first rope.dimension_count dims of each head; SwiGLU feed-forwards after post_attention_norm, or
    (qwen35moe) experts renormalised over the chosen ones plus a sigmoid-gated shared expert. Qwen3-Next
    (grouped): a value head reads the key head whose group it is in; its files may hold ssm_in (per key
    head: q, k, its value heads' v, their z) and ssm_ba (per key head: beta rows, alpha rows)."""
    n_layer, n_embd = md("block_count") - md("nextn_predict_layers", 0), md("embedding_length")  # the trunk
    n_head, n_kv = md("attention.head_count"), md("attention.head_count_kv")
    head_dim, n_rot = md("attention.key_length"), md("rope.dimension_count")
    eps, base = md("attention.layer_norm_rms_epsilon"), md("rope.freq_base")
    interval = md("full_attention_interval", 4)
    size, n_k, n_v = md("ssm.state_size"), md("ssm.group_count"), md("ssm.time_step_rank")
    neox = True if neox_override is None else neox_override
    tokens = np.asarray(tokens)
    t = len(tokens)
    positions = np.arange(t)
    x = w["token_embd.weight"][tokens]
    for il in range(n_layer):
        p = f"blk.{il}."
        h = rms_norm(x, w[p + "attn_norm.weight"], eps)
        if (il + 1) % interval:  # a gated delta net
            r = n_v // n_k
            if p + "ssm_in.weight" in w:
                qkvz = (h @ w[p + "ssm_in.weight"].T).reshape(t, n_k, -1)
                parts = np.split(qkvz, [size, 2 * size, 2 * size + size * r], axis=2)  # q, k, v, z per key head
                mixed = np.concatenate([a.reshape(t, -1) for a in parts[:3]], axis=1)
                z = parts[3].reshape(t, -1)
            else:
                mixed, z = h @ w[p + "attn_qkv.weight"].T, h @ w[p + "attn_gate.weight"].T
            if p + "ssm_ba.weight" in w:
                ba = (h @ w[p + "ssm_ba.weight"].T).reshape(t, n_k, 2 * r)
                b_proj, a_proj = ba[..., :r].reshape(t, n_v), ba[..., r:].reshape(t, n_v)
            else:
                b_proj, a_proj = h @ w[p + "ssm_beta.weight"].T, h @ w[p + "ssm_alpha.weight"].T
            qkv = silu(causal_conv(mixed, w[p + "ssm_conv1d.weight"]))
            q, k, v = np.split(qkv, [n_k * size, 2 * n_k * size], axis=1)
            q, k = (a.reshape(t, n_k, size) for a in (q, k))
            q = q / np.sqrt((q * q).sum(-1, keepdims=True) + eps)
            k = k / np.sqrt((k * k).sum(-1, keepdims=True) + eps)
            g = softplus(a_proj + w[p + "ssm_dt.bias"]) * w[p + "ssm_a"]
            beta = 1.0 / (1.0 + np.exp(-b_proj))
            o = gated_delta_rule(q, k, v.reshape(t, n_v, size), g, beta, grouped)
            o = rms_norm(o, w[p + "ssm_norm.weight"], eps).reshape(t, n_v * size)
            o = (o * silu(z)) @ w[p + "ssm_out.weight"].T
        else:  # attention, each head's queries followed by its gate in attn_q
            qg = (h @ w[p + "attn_q.weight"].T).reshape(t, n_head, 2, head_dim)
            q, gate = qg[:, :, 0], qg[:, :, 1]
            k = (h @ w[p + "attn_k.weight"].T).reshape(t, n_kv, head_dim)
            v = (h @ w[p + "attn_v.weight"].T).reshape(t, n_kv, head_dim)
            q = rope(rms_norm(q, w[p + "attn_q_norm.weight"], eps), positions, n_rot, base, neox)
            k = rope(rms_norm(k, w[p + "attn_k_norm.weight"], eps), positions, n_rot, base, neox)
            attn = attend(q, k, v, 1.0 / math.sqrt(head_dim), 0) / (1.0 + np.exp(-gate))
            o = attn.reshape(t, n_head * head_dim) @ w[p + "attn_output.weight"].T
        x = x + o
        h = rms_norm(x, w[p + "post_attention_norm.weight"], eps)
        if p + "ffn_gate_inp.weight" in w:
            x = x + experts(w, p, h, md("expert_used_count"), True, route_record, routes[il] if routes is not None else None)
        else:
            x = x + (silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
    x = rms_norm(x, w["output_norm.weight"], eps)
    return x @ w.get("output.weight", w["token_embd.weight"]).T
