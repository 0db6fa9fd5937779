"""Decode speed with and without a busy neighbour process: how the CPU backend's thread governor copes.

    python scripts/decode_under_load.py [MODEL] [-t 2] [--steps 96] [--runs 4] [--busy]
    OMP_WAIT_POLICY=PASSIVE python scripts/decode_under_load.py --busy   # workers that sleep at once
    python scripts/decode_under_load.py --busy --no-governor             # all threads on every step

--busy starts `python -c "while True: pass"` beside the measurement (one core taken, as another user's
job takes it), and stops it at the end. Prints tok/s of each run of --steps greedy decode steps after a
32-token prompt, and the governor's moving averages (seconds per one-row step, per thread count).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import localllm  # noqa: E402
from localllm.backends.cpu import threads as cpu_threads  # noqa: E402


def always_all_threads() -> None:
    """Disable the governor: every step on all threads (what the backend did before it existed)."""
    cpu_threads._StepStats.next_setting = lambda self, threads, base, most: threads


def decode_rate(model, steps: int) -> float:
    session = model.new_session()
    decoder = model.decoder
    decoder.forward(np.arange(1, 33, dtype=np.int32), 0, session.cache)
    token = np.array([5], dtype=np.int32)
    t0 = time.perf_counter()
    for pos in range(32, 32 + steps):
        logits = decoder.forward(token, pos, session.cache)
        token[0] = int(np.argmax(logits[0]))
    return steps / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=96)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--busy", action="store_true", help="run a busy process alongside")
    parser.add_argument("--no-governor", action="store_true", help="every step on all threads")
    args = parser.parse_args()

    if args.no_governor:
        always_all_threads()
    model = localllm.load(args.model, n_ctx=64 + args.steps, threads=args.threads)
    decode_rate(model, 16)  # warm-up: kernels loaded, pages touched
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    try:
        time.sleep(0.5 if busy else 0)
        rates = [decode_rate(model, args.steps) for _ in range(args.runs)]
    finally:
        if busy:
            busy.kill()
    stats = model.backend.thread_policy.decode._sizes.get(1)
    averages = {k: round(v * 1e3, 2) for k, v in stats.average.items()} if stats else {}
    print(f"{args.threads} threads{', busy neighbour' if busy else ''}{', no governor' if args.no_governor else ''}: "
          + " ".join(f"{r:.1f}" for r in rates) + f" tok/s; ms per step by thread count {averages}")


if __name__ == "__main__":
    main()
