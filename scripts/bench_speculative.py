#!/usr/bin/env python3
"""Speculative decoding's speed, against plain decoding of the same prompt in paired rounds (each round
runs both back to back; this machine's memory speed drifts, so ratios are taken per round).

    # prompt lookup on an editing task: a ~400-token code file, "the same code with one change", greedy
    python scripts/bench_speculative.py lookup [--model GEMMA] --rounds 5
    # the machinery at its ceiling: every draft is the model's own greedy continuation (acceptance 100%),
    # k fixed; what verifying k tokens in one pass costs, with no drafting cost
    python scripts/bench_speculative.py ceiling --model /tmp/bench-8b.gguf --k 4 -n 32 --rounds 3
    # a draft model (greedy drafts), e.g. Gemma 3 270M Q4_K_M drafting for its own Q8_0
    python scripts/bench_speculative.py draft --model gemma-q8_0.gguf --draft gemma-q4_k_m.gguf --rounds 3

Each prints per round plain and speculative tokens/s, the ratio, the drafted and accepted counts, then the
median and range of the ratios; `--costs` adds the step costs (one decode step, a verification of k + 1
rows, a draft model's step) and the speed-up they predict: tokens per step / (verify + k draft steps),
in units of one decode step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import localllm  # noqa: E402

ACCEPTANCE = 0.0
ANSWER: list = []
from localllm.speculative import Replay, Speculation  # noqa: E402

# The editing task's file: ~400 tokens of ordinary Python.
CODE = '''import argparse
import json
import sys
from pathlib import Path


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Summarise a folder of JSON reports.")
    parser.add_argument("folder", type=Path, help="where the reports are")
    parser.add_argument("--field", default="duration", help="the numeric field to summarise")
    return parser.parse_args(argv)


def load_reports(folder):
    reports = []
    for path in sorted(folder.glob("*.json")):
        with open(path) as handle:
            data = json.load(handle)
        data["name"] = path.stem
        reports.append(data)
    return reports


def summarise(reports, field):
    values = [r[field] for r in reports if field in r]
    if not values:
        return None
    values.sort()
    middle = len(values) // 2
    median = values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2
    return {"count": len(values), "min": values[0], "max": values[-1], "median": median}


def main(argv=None):
    args = parse_args(argv)
    reports = load_reports(args.folder)
    summary = summarise(reports, args.field)
    if summary is None:
        print(f"no report has the field {args.field!r}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''
# The framing the 270M base model copies most faithfully of those tried (the answer is 63% similar to the
# file before it stops; "Original code: ... The same code, with ...": 18%, looping on argparse lines).
EDIT_PROMPT = ("Before:\n```python\n" + CODE + "```\n\n"
               "After (parse_args renamed to read_arguments, nothing else changed):\n```python\n")


def generate(model, ids, n, spec):
    """(tokens, Timings) of a greedy generation from a fresh session."""
    tokens, timings = [], None
    for event in model.generate(ids, max_tokens=n, temperature=0, speculation=spec, session=model.new_session()):
        if event.kind == "token" and event.token is not None:
            tokens.append(event.token)
        elif event.kind == "done":
            timings = event.timings
    return tokens, timings


def paired_rounds(model, ids, n, make_spec, rounds):
    """The per-round ratios; also sets ACCEPTANCE, the last round's drafts kept / drafted, and ANSWER,
    the plain run's tokens (step_costs runs them)."""
    global ACCEPTANCE, ANSWER
    ratios = []
    for r in range(rounds):
        plain, tp = generate(model, ids, n, None)
        ANSWER = plain
        spec = make_spec(plain)
        got, ts = generate(model, ids, n, spec)
        assert got == plain, "speculative greedy output differs from plain decoding"
        ratio = ts.generation_tps / tp.generation_tps
        ratios.append(ratio)
        ACCEPTANCE = ts.draft_accepted / ts.draft_tokens if ts.draft_tokens else 0.0
        print(f"round {r + 1}: plain {tp.generation_tps:.2f} tok/s, speculative {ts.generation_tps:.2f} tok/s, "
              f"ratio {ratio:.2f}; {len(got)} tokens, drafts {ts.draft_accepted}/{ts.draft_tokens} accepted", flush=True)
    print(f"ratio median {statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}] over {rounds} rounds")
    return ratios


def step_costs(model, ids, answer, k, reps=10, draft=None):
    """Median ms of one decode step, of verifying k + 1 rows, and of the draft model's decode step, after
    the prompt `ids`, on the tokens of its plain answer (the activations of the runs measured above:
    with random weights, some made-up tokens' products ran twice as long)."""
    def timed(decoder, rows, start, cache, verify):
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            (decoder.verify if verify else decoder.forward)(rows, start, cache)
            times.append(time.perf_counter() - t)
        return 1000 * statistics.median(times)

    prompt, rows = np.array(ids, np.int32), np.array(answer[: k + 1], np.int32)
    session = model.new_session()
    model.decoder.forward(prompt, 0, session.cache)
    one = timed(model.decoder, rows[:1], len(ids), session.cache, False)
    many = timed(model.decoder, rows, len(ids), session.cache, True)
    small = None
    if draft is not None:
        ds = draft.new_session()
        draft.decoder.forward(prompt, 0, ds.cache)
        small = timed(draft.decoder, rows[:1], len(ids), ds.cache, False)
    return one, many, small


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("lookup", "ceiling", "draft"))
    ap.add_argument("--model", default=None, help="the target model (default: the built-in Gemma 3 270M)")
    ap.add_argument("--draft", default=None, help="the draft model (mode draft)")
    ap.add_argument("-n", type=int, default=None, help="tokens to generate (default: 400 lookup, 32 ceiling, 128 draft)")
    ap.add_argument("--k", type=int, default=None, help="draft length: fixed for ceiling (default 4), the maximum otherwise")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--costs", action="store_true", help="also measure the step costs and the speed-up they predict")
    args = ap.parse_args()

    model = localllm.load(args.model, n_ctx=2048, threads=args.threads)
    model.backend.wait_for_kernels()
    draft = localllm.load(args.draft, n_ctx=2048, threads=args.threads) if args.draft else None
    if draft is not None:
        draft.backend.wait_for_kernels()
    if args.mode == "lookup":
        ids, n, k = model.tokenize(EDIT_PROMPT), args.n or 400, args.k or 8
        print(f"editing task: {len(model.tokenize(CODE, add_bos=False))}-token file, prompt {len(ids)} tokens")
        paired_rounds(model, ids, n, lambda plain: Speculation(lookup=True, max_draft=k), args.rounds)
    elif args.mode == "ceiling":
        rng = np.random.default_rng(0)
        ids = [int(t) for t in rng.integers(1000, 20000, 16)]
        n, k = args.n or 32, args.k or 4
        paired_rounds(model, ids, n, lambda plain: Speculation(lookup=False, drafter=Replay(len(ids), plain), max_draft=k),
                      args.rounds)
    else:
        if draft is None:
            ap.error("mode draft needs --draft")
        ids, n, k = model.tokenize(EDIT_PROMPT), args.n or 128, args.k or 8
        # token_cost 0: draft up to k every step, whatever the draft costs (DraftLength would stop a draft
        # model about as large as the model: it cannot pay); what is measured is acceptance and step costs
        spec = Speculation(lookup=False, draft=draft, max_draft=k, token_cost=0.0)
        paired_rounds(model, ids, n, lambda plain: spec, args.rounds)
    if args.costs:
        k = args.k or (4 if args.mode == "ceiling" else 8)
        one, many, small = step_costs(model, ids, ANSWER, k, draft=draft)
        print(f"step costs: decode {one:.1f} ms, verify {k + 1} rows {many:.1f} ms ({many / one:.2f} steps)"
              + (f", draft step {small:.1f} ms ({small / one:.2f} steps)" if small else ""))
        drafting = k * small if small else 0.0
        print(f"all {k} drafts kept: {k + 1} tokens per {(many + drafting) / one:.2f} steps = "
              f"{(k + 1) * one / (many + drafting):.2f}x plain at most")
        a = ACCEPTANCE
        expected = 1 + sum(a**i for i in range(1, k + 1))  # each draft kept with probability a until a refusal
        print(f"at the measured acceptance {a:.2f} (kept / drafted): {expected:.2f} tokens per step, "
              f"{expected * one / (many + drafting):.2f}x plain predicted")


if __name__ == "__main__":
    main()
