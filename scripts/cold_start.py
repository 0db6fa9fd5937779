"""Cold and warm start of the default model, as a new user meets them (the figures of docs/performance.md).

Each round, on empty kernel caches (a fresh NUMBA_CACHE_DIR and LOCALLLM_KERNEL_DIR: every kernel
compiles, as on a machine that never ran localllm):
- cold run: `localllm run gemma-3-270m "Hello" -n 8`, start to exit;
- cold chat: `localllm chat` in a pseudo-terminal, start to its ">>> " prompt, then the first reply;
- background: start of the cold run to the marker of its background compile (tiers.py);
then on the caches those left:
- warm first token: `localllm run gemma-3-270m "The capital of France is" -n 1 --temperature 0`, start to
  exit (the median of --warm-runs).
Prints every sample, the medians and the load average around the run.

    python scripts/cold_start.py --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOCALLLM = [sys.executable, "-m", "localllm.cli.app"]


def fresh_env(root: Path) -> dict:
    env = dict(os.environ)
    env.pop("LOCALLLM_COMPILE", None)
    env["NUMBA_CACHE_DIR"] = str(root / "numba")
    env["LOCALLLM_KERNEL_DIR"] = str(root / "kernels")
    return env


def timed_run(args: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(LOCALLLM + args, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def wait_for_background(env: dict, timeout: float = 600.0) -> float:
    """Seconds until the background compile's marker for the default model exists (from now)."""
    code = ("from localllm.backends.cpu.tiers import marker_path; from localllm.hub.default_model import "
            "default_model_path; print(marker_path(default_model_path(), True))")
    marker = Path(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.strip())
    start = time.perf_counter()
    while not marker.exists():
        if time.perf_counter() - start > timeout:
            raise SystemExit(f"no marker after {timeout:.0f} s: {marker}")
        time.sleep(0.2)
    return time.perf_counter() - start


def chat_times(env: dict) -> tuple[float, float]:
    """(start to the prompt, question sent to the reply's end) of `localllm chat` in a pseudo-terminal."""
    import pexpect

    start = time.perf_counter()
    child = pexpect.spawn(LOCALLLM[0], LOCALLLM[1:] + ["chat", "-n", "32"], env=env, encoding="utf-8", timeout=300,
                          dimensions=(40, 200))
    child.expect_exact(">>> ")
    ready = time.perf_counter() - start
    asked = time.perf_counter()
    child.sendline("What is the capital of France?")
    child.expect_exact(">>> ")
    reply = time.perf_counter() - asked
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    return ready, reply


def median(values):
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm-runs", type=int, default=3, help="warm starts per round (their median is the round's)")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}", flush=True)
    samples: dict[str, list[float]] = {}
    for rnd in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="localllm-cold-") as root:
            env = fresh_env(Path(root))
            run = timed_run(["run", "gemma-3-270m", "Hello", "-n", "8"], env)
            background = run + wait_for_background(env)
            warm = statistics.median(
                timed_run(["run", "gemma-3-270m", "The capital of France is", "-n", "1", "--temperature", "0"], env)
                for _ in range(args.warm_runs)
            )
        with tempfile.TemporaryDirectory(prefix="localllm-cold-") as root:
            env = fresh_env(Path(root))
            ready, reply = chat_times(env)
            wait_for_background(env)
        row = {"cold run -n 8": run, "cold chat to prompt": ready, "cold chat first reply": reply,
               "background compile": background, "warm first token": warm}
        for key, value in row.items():
            samples.setdefault(key, []).append(value)
        print(f"round {rnd + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in row.items()), flush=True)
    print(f"load average after: {os.getloadavg()}")
    for key, values in samples.items():
        print(f"{key:>24}: median {median(values):.2f} s [{min(values):.2f}-{max(values):.2f}]")


if __name__ == "__main__":
    main()
