"""Where the time of a forward pass goes, op by op.

    python scripts/profile_ops.py [MODEL] [-t THREADS] [--decode N] [--prefill N] [--batch S]

Wraps every op of the loaded model's backend in a timer (perf_counter_ns around each call; matrix
products are labelled by tensor name, the layer index dropped) and runs N decode steps (after a short
prompt, so attention sees a cache) and one prefill of N tokens. Prints, per label, ms per token (decode)
or per pass (prefill), the share of the total, calls per token, and the weight bytes streamed per second
for matrix products. "(outside ops)" is the wall time not spent inside any op: Python in the decoder,
the timers themselves included (~0.3 us a call). With --batch S, the decode steps are the server's:
S sequences in a paged cache, each step one forward_batch with one row per sequence (times per step).
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import localllm  # noqa: E402

OPS = ("matmul", "matmul_rows", "embed", "rms_norm", "rope", "kv_store", "attention", "kv_store_paged", "attention_paged",
       "gated_act", "add", "scale", "softcap", "take_rows", "matmul_experts", "combine_experts", "short_conv", "delta_net")


class OpTimer:
    def __init__(self, backend, names: dict[int, str]):
        self.totals = collections.defaultdict(int)
        self.calls = collections.defaultdict(int)
        self.bytes = collections.defaultdict(int)
        self.names = names  # id(weight data) -> tensor label
        for op in OPS:
            setattr(backend, op, self._wrap(op, getattr(backend, op)))

    def _wrap(self, op, fn):
        def timed(*args, **kwargs):
            label, nbytes = op, 0
            if op.startswith("matmul"):
                weight = args[0]
                label = self.names.get(id(weight.data), "matmul ?")
                nbytes = weight.data.nbytes
            t0 = time.perf_counter_ns()
            fn(*args, **kwargs)
            self.totals[label] += time.perf_counter_ns() - t0
            self.calls[label] += 1
            self.bytes[label] += nbytes

        return timed

    def reset(self):
        self.totals.clear()
        self.calls.clear()
        self.bytes.clear()


def weight_labels(decoder) -> dict[int, str]:
    labels = {}
    for name in decoder.w._entries:
        weight = decoder.w.get(name)
        if weight is None or not hasattr(weight, "qtype"):
            continue
        short = re.sub(r"^blk\.\d+\.", "", name).removesuffix(".weight")
        labels[id(weight.data)] = f"{short} ({weight.qtype})"
    return labels


def report(timer: OpTimer, wall_ns: int, per: int, unit: str):
    inside = sum(timer.totals.values())
    rows = sorted(timer.totals.items(), key=lambda kv: -kv[1])
    rows.append(("(outside ops)", wall_ns - inside))
    print(f"{'op':34} {'ms/' + unit:>10} {'share':>7} {'calls/' + unit:>10} {'GB/s':>7}")
    for label, ns in rows:
        calls = timer.calls.get(label, 0) / per
        gbs = timer.bytes.get(label, 0) / ns if timer.bytes.get(label) else float("nan")
        print(f"{label:34} {ns / per / 1e6:10.3f} {100 * ns / wall_ns:6.1f}% {calls:10.1f} {gbs:7.1f}")
    rate = {"token": "tok/s", "step": "steps/s"}.get(unit, "")
    print(f"{'total':34} {wall_ns / per / 1e6:10.3f}   ({per * 1e9 / wall_ns:.1f} {rate})")


def batched_decode(model, timer, n_seqs: int, steps: int, rng) -> None:
    """The server's decode step: n_seqs sequences (32-token random prompts) in a paged cache, one row each."""
    from localllm.model.kv_paged import LayoutBuilder, PagedKVCache, SequenceBlocks

    decoder, bs = model.decoder, 16
    n_pos = 40 + steps + 8
    cache = PagedKVCache(model.backend, decoder.hp, n_seqs * (-(-n_pos // bs)) + 2, bs)
    builder = LayoutBuilder(bs, max_rows=64, max_seqs=n_seqs)
    seqs = []
    for _ in range(n_seqs):
        blocks = SequenceBlocks()
        blocks.reserved = -(-n_pos // bs)
        cache.pool.reserve(blocks.reserved)
        blocks.ensure(cache.pool, n_pos)
        prompt = rng.integers(0, decoder.hp.n_vocab, 32).astype(np.int32)
        decoder.forward_batch(cache, builder.build([(blocks, prompt, 0)], 0), np.array([31], np.int32))
        seqs.append(blocks)
    tokens = np.zeros(n_seqs, np.int32)
    rows = np.arange(n_seqs, dtype=np.int32)

    def step(pos):
        layout = builder.build([(b, tokens[i : i + 1], pos) for i, b in enumerate(seqs)], n_rowwise=n_seqs)
        logits = decoder.forward_batch(cache, layout, rows)
        tokens[:] = logits.argmax(axis=1)

    for pos in range(32, 40):  # warm-up
        step(pos)
    timer.reset()
    t0 = time.perf_counter_ns()
    for pos in range(40, 40 + steps):
        step(pos)
    wall = time.perf_counter_ns() - t0
    print(f"\nbatched decode, {n_seqs} sequences, {steps} steps at positions 40..{39 + steps}")
    report(timer, wall, steps, "step")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("-t", "--threads", type=int, default=None)
    parser.add_argument("--decode", type=int, default=64)
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--batch", type=int, default=0, help="decode S sequences per step (the server's batched step)")
    args = parser.parse_args()

    model = localllm.load(args.model, n_ctx=max(args.prefill, 64 + args.decode) + 16, threads=args.threads)
    decoder = model.decoder
    rng = np.random.default_rng(0)
    timer = OpTimer(model.backend, weight_labels(decoder))
    print(f"{model.path.name}, {model.backend.threads} thread(s)")

    if args.decode and args.batch:
        batched_decode(model, timer, args.batch, args.decode, rng)
    elif args.decode:
        session = model.new_session()
        prompt = rng.integers(0, decoder.hp.n_vocab, 32).astype(np.int32)
        decoder.forward(prompt, 0, session.cache)
        token = prompt[-1:].copy()
        for pos in range(32, 40):  # warm-up
            decoder.forward(token, pos, session.cache)
        timer.reset()
        t0 = time.perf_counter_ns()
        for pos in range(40, 40 + args.decode):
            logits = decoder.forward(token, pos, session.cache)
            token[0] = int(np.argmax(logits[0]))
        wall = time.perf_counter_ns() - t0
        print(f"\ndecode, {args.decode} steps at positions 40..{39 + args.decode}")
        report(timer, wall, args.decode, "token")

    if args.prefill:
        tokens = rng.integers(0, decoder.hp.n_vocab, args.prefill).astype(np.int32)
        decoder.forward(tokens, 0, model.new_session().cache)  # warm-up
        session = model.new_session()
        timer.reset()
        t0 = time.perf_counter_ns()
        decoder.forward(tokens, 0, session.cache)
        wall = time.perf_counter_ns() - t0
        print(f"\nprefill, one pass of {args.prefill} tokens")
        report(timer, wall, args.prefill, "token")


if __name__ == "__main__":
    main()
