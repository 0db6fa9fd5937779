"""What the K-quants share beyond the block checks: Q4_K's and Q5_K's packing of eight 6-bit scales and
mins into 12 bytes, and llama.cpp's fitting search for scales and mins (make_qkx2_quants and the
per-sub-block fit around it), which the Q2_K, Q4_K and Q5_K quantizers use; the symmetric searches of
Q3_K (make_q3_quants) and Q6_K (make_qx_quants).

Q4_K and Q5_K start their blocks alike: d (float16) at byte 0, dmin (float16) at byte 2, the 12 packed
scale/min bytes at byte 4; eight sub-blocks of 32 elements.
"""

from __future__ import annotations

import numpy as np

from ..jit import exact_kernel, f16_to_f32, f32_to_f16_bits
from .blocks import QK_K, nearest_int

SUB = 32  # elements per sub-block
N_SUB = QK_K // SUB
_D, _DMIN, _SCALES = 0, 2, 4  # byte offsets of d, dmin and the packed scales in a Q4_K / Q5_K block
GROUP_MAX_EPS = np.float32(1e-15)  # ggml: below this a group (or block) counts as all zero


def unpack_scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """uint8[blocks, 12] -> (scales, mins), each uint8[blocks, 8] (6-bit values)."""
    low, mid, high = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = np.concatenate([low & 63, (high & 15) | ((low >> 6) << 4)], axis=1)
    mins = np.concatenate([mid & 63, (high >> 4) | ((mid >> 6) << 4)], axis=1)
    return scales, mins


@exact_kernel
def scale_min(w, offset, k):
    """(scale, min) of sub-block k from the 12 packed bytes at w[offset:offset+12], as int32."""
    if k < 4:
        return np.int32(w[offset + k] & 63), np.int32(w[offset + k + 4] & 63)
    packed = w[offset + k + 4]
    sc = (packed & 15) | ((w[offset + k - 4] >> 6) << 4)
    mn = (packed >> 4) | ((w[offset + k] >> 6) << 4)
    return np.int32(sc), np.int32(mn)


@exact_kernel
def pack_scales_mins(scales, mins, out, offset):
    """Inverse of scale_min: 8 six-bit scales and mins (uint8[8] each) -> out[offset:offset+12]."""
    for k in range(4):
        out[offset + k] = scales[k]
        out[offset + k + 4] = mins[k]
    for k in range(4, 8):
        out[offset + k + 4] = (scales[k] & 15) | ((mins[k] & 15) << 4)
        out[offset + k - 4] |= (scales[k] >> 4) << 6
        out[offset + k] |= (mins[k] >> 4) << 6


@exact_kernel
def fit_error(diff, use_mad):
    """ggml's error measure: |diff| (use_mad, Q2_K) or diff^2."""
    return abs(diff) if use_mad else diff * diff


@exact_kernel
def make_qkx2_quants(nmax, x, weights, levels, scratch, rmin, rdelta, nstep, use_mad):
    """ggml's make_qkx2_quants: fit x ~ scale*L - min (min >= 0), L in 0..nmax.

    Starts from the plain min/max fit, then tries nstep+1 stretched grids (iscale from
    (rmin + rdelta*is + nmax)/(max - min)), each refined by a weighted least-squares (scale, min), and
    keeps the one of least weighted error (squared, or absolute with use_mad). Writes levels (uint8)
    and returns (scale, min). Every operation is float32 in ggml's order so the chosen levels match
    llama.cpp's.
    """
    n = x.shape[0]
    lo = x[0]
    hi = x[0]
    sum_w = weights[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        if x[i] < lo:
            lo = x[i]
        if x[i] > hi:
            hi = x[i]
        sum_w += weights[i]
        sum_x += weights[i] * x[i]
    if lo > np.float32(0.0):
        lo = np.float32(0.0)
    if hi == lo:
        for i in range(n):
            levels[i] = 0
        return np.float32(0.0), -lo
    fmax = np.float32(nmax)
    iscale = fmax / (hi - lo)
    scale = np.float32(1.0) / iscale
    best_error = np.float32(0.0)
    for i in range(n):
        level = min(max(nearest_int(iscale * (x[i] - lo)), 0), nmax)
        levels[i] = level
        diff = scale * np.float32(level) + lo - x[i]
        best_error += weights[i] * fit_error(diff, use_mad)
    if nstep < 1:
        return scale, -lo
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * np.float32(step) + fmax) / (hi - lo)
        sum_l = np.float32(0.0)
        sum_l2 = np.float32(0.0)
        sum_xl = np.float32(0.0)
        for i in range(n):
            level = min(max(nearest_int(iscale * (x[i] - lo)), 0), nmax)
            scratch[i] = level
            fl = np.float32(level)
            wl = weights[i] * fl
            sum_l += wl
            sum_l2 += wl * fl
            sum_xl += wl * x[i]
        det = sum_w * sum_l2 - sum_l * sum_l
        if det > np.float32(0.0):
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
            if this_min > np.float32(0.0):
                this_min = np.float32(0.0)
                this_scale = sum_xl / sum_l2
            error = np.float32(0.0)
            for i in range(n):
                diff = this_scale * np.float32(scratch[i]) + this_min - x[i]
                error += weights[i] * fit_error(diff, use_mad)
            if error < best_error:
                for i in range(n):
                    levels[i] = scratch[i]
                best_error = error
                scale = this_scale
                lo = this_min
    return scale, -lo


@exact_kernel
def quantize_scales_mins(sub_scales, sub_mins, block):
    """Shared by Q4_K/Q5_K: stores d, dmin and the packed 6-bit scale/min codes of the per-sub-block
    fits into block; returns d and dmin as stored (rounded through float16), as float32."""
    max_scale = np.float32(0.0)
    max_min = np.float32(0.0)
    for k in range(N_SUB):
        if sub_scales[k] > max_scale:
            max_scale = sub_scales[k]
        if sub_mins[k] > max_min:
            max_min = sub_mins[k]
    inv_scale = np.float32(63.0) / max_scale if max_scale > np.float32(0.0) else np.float32(0.0)
    inv_min = np.float32(63.0) / max_min if max_min > np.float32(0.0) else np.float32(0.0)
    scale_codes = np.empty(N_SUB, dtype=np.uint8)
    min_codes = np.empty(N_SUB, dtype=np.uint8)
    for k in range(N_SUB):
        # ggml stores nearest_int's result in a uint8_t before clamping to 63.
        scale_codes[k] = min(63, nearest_int(inv_scale * sub_scales[k]) & 255)
        min_codes[k] = min(63, nearest_int(inv_min * sub_mins[k]) & 255)
    d_bits = f32_to_f16_bits(max_scale / np.float32(63.0))
    dmin_bits = f32_to_f16_bits(max_min / np.float32(63.0))
    block[_D] = d_bits & 255
    block[_D + 1] = d_bits >> 8
    block[_DMIN] = dmin_bits & 255
    block[_DMIN + 1] = dmin_bits >> 8
    for i in range(_SCALES, _SCALES + 12):
        block[i] = 0
    pack_scales_mins(scale_codes, min_codes, block, _SCALES)
    return f16_to_f32(d_bits), f16_to_f32(dmin_bits)


@exact_kernel
def requantize_with_codes(x, block, d, dmin, levels, nmax):
    """Final levels for the stored (rounded) scales: round((x + dmin*min_k) / (d*scale_k)) in 0..nmax.

    Sub-blocks whose stored scale is zero keep the levels of their fit, as in ggml.
    """
    for k in range(N_SUB):
        sc, mn = scale_min(block, _SCALES, k)
        step = d * np.float32(sc)
        if step == np.float32(0.0):
            continue
        offset = dmin * np.float32(mn)
        for i in range(SUB * k, SUB * k + SUB):
            levels[i] = min(max(nearest_int((x[i] + offset) / step), 0), nmax)


@exact_kernel
def fit_sub_blocks(x, levels, sub_scales, sub_mins, nmax, rmin, rdelta, nstep):
    """Per 32-element sub-block: weights av_x + |x| (av_x = RMS of the sub-block), then make_qkx2_quants."""
    weights = np.empty(SUB, dtype=np.float32)
    scratch = np.empty(SUB, dtype=np.uint8)
    for k in range(N_SUB):
        xs = x[SUB * k : SUB * k + SUB]
        sum_x2 = np.float32(0.0)
        for i in range(SUB):
            sum_x2 += xs[i] * xs[i]
        av_x = np.sqrt(sum_x2 / np.float32(SUB))
        for i in range(SUB):
            weights[i] = av_x + abs(xs[i])
        sub_scales[k], sub_mins[k] = make_qkx2_quants(
            nmax,
            xs,
            weights,
            levels[SUB * k : SUB * k + SUB],
            scratch,
            rmin,
            rdelta,
            nstep,
            False,
        )


@exact_kernel
def make_q3_quants(nmax, x, levels):
    """ggml's make_q3_quants with do_rmse: symmetric fit x ~ scale*(L - nmax), L in 0..2*nmax-1.

    Starts from iscale = -nmax/max (max = the value of largest magnitude), then up to 5 passes that move
    single levels wherever that raises sumlx^2/suml2 (weights x^2). Returns the float32 scale.
    """
    n = x.shape[0]
    amax = np.float32(0.0)
    vmax = np.float32(0.0)
    for i in range(n):
        if abs(x[i]) > amax:
            amax = abs(x[i])
            vmax = x[i]
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            levels[i] = 0
        return np.float32(0.0)
    iscale = -np.float32(nmax) / vmax
    sumlx = np.float32(0.0)
    suml2 = np.float32(0.0)
    for i in range(n):
        level = min(max(nearest_int(iscale * x[i]), -nmax), nmax - 1)
        levels[i] = level
        w = x[i] * x[i]
        sumlx += w * x[i] * np.float32(level)
        suml2 += w * np.float32(level) * np.float32(level)
    for _ in range(5):
        changed = 0
        for i in range(n):
            w = x[i] * x[i]
            fl = np.float32(levels[i])
            slx = sumlx - w * x[i] * fl
            if slx > np.float32(0.0):
                sl2 = suml2 - w * fl * fl
                new_level = min(max(nearest_int(x[i] * sl2 / slx), -nmax), nmax - 1)
                if new_level != levels[i]:
                    fnew = np.float32(new_level)
                    slx += w * x[i] * fnew
                    sl2 += w * fnew * fnew
                    if sl2 > np.float32(0.0) and slx * slx * suml2 > sumlx * sumlx * sl2:
                        levels[i] = new_level
                        sumlx = slx
                        suml2 = sl2
                        changed += 1
        if changed == 0:
            break
    for i in range(n):
        levels[i] += nmax
    return sumlx / suml2 if suml2 > np.float32(0.0) else np.float32(0.0)


@exact_kernel
def make_qx_quants(nmax, x, levels):
    """ggml's make_qx_quants with rmse_type=1 and no importance: symmetric fit x ~ scale*(L - nmax).

    Weights x^2. Starts from iscale = -nmax/max (max = the value of largest magnitude), takes the
    least-squares scale for those levels, then tries 18 nearby grids -(nmax + 0.1*is)/max and keeps
    whichever maximises sumlx^2/suml2. Writes levels L in 0..2*nmax-1; returns the float32 scale.
    """
    n = x.shape[0]
    amax = np.float32(0.0)
    vmax = np.float32(0.0)
    for i in range(n):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            vmax = x[i]
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            levels[i] = 0
        return np.float32(0.0)
    fmax = np.float32(nmax)
    iscale = -fmax / vmax
    sumlx = np.float32(0.0)
    suml2 = np.float32(0.0)
    for i in range(n):
        level = min(max(nearest_int(iscale * x[i]), -nmax), nmax - 1)
        levels[i] = level + nmax
        fl = np.float32(level)
        w = x[i] * x[i]
        sumlx += w * x[i] * fl
        suml2 += w * fl * fl
    scale = sumlx / suml2 if suml2 != np.float32(0.0) else np.float32(0.0)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(fmax + np.float32(0.1) * np.float32(step)) / vmax
        sumlx = np.float32(0.0)
        suml2 = np.float32(0.0)
        for i in range(n):
            fl = np.float32(min(max(nearest_int(iscale * x[i]), -nmax), nmax - 1))
            w = x[i] * x[i]
            sumlx += w * x[i] * fl
            suml2 += w * fl * fl
        if suml2 > np.float32(0.0) and sumlx * sumlx > best * suml2:
            for i in range(n):
                levels[i] = min(max(nearest_int(iscale * x[i]), -nmax), nmax - 1) + nmax
            scale = sumlx / suml2
            best = scale * sumlx
    return scale
