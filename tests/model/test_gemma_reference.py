"""The real model against llama.cpp (../shared/reference/gemma-3-270m, produced by llama.cpp itself).

Method as in the reference: the prompt evaluated in one batch, then llama.cpp's 32 greedy tokens fed back
one at a time (teacher forcing), so every step compares the same context. Bars (from the engine issue):
- prompt token ids identical;
- our argmax equals llama.cpp's wherever llama.cpp's top-1 minus top-2 logit is >= 1.0;
- our top-5 shares >= 4 ids with llama.cpp's at >= 95% of the steps;
- KL(llama.cpp || ours) at the last prompt position over 50 prompts: median and 90th percentile no worse
  than those of llama.cpp's own token-by-token and flash-attention paths against the same base.
llama.cpp's own batched and token-by-token paths differ by up to KL 0.009 and 1.2 in a logit, which is
why the bars are not bit equality. The last bar replaced a per-prompt "KL <= 0.01" on the three prompts
here, which llama.cpp's own paths miss on 16-24% of prompts (its flash-attention path on p3: 0.0112), so
that passing it depended on float order by luck (docs/accuracy.md, scripts/kl_spread.py).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import REFERENCE_DIR

REFERENCE = REFERENCE_DIR / "gemma-3-270m"
ROOT = Path(__file__).resolve().parents[2]
# llama.cpp's last-position distributions on 50 prompts and the spread of its own paths, made by
#   PYTHONPATH=<llama-cpp-python 0.3.36 sdist> LLAMA_CPP_LIB_PATH=<sdist>/vendor/llama.cpp/build/bin \
#       python scripts/kl_spread.py --reference tests/data/kl_spread/gemma-3-270m-q4_k_m.npz
SPREAD = ROOT / "tests" / "data" / "kl_spread" / "gemma-3-270m-q4_k_m.npz"
RESAMPLES = 2000


def _reference():
    return json.loads((REFERENCE / "reference.json").read_text())


PROMPTS = sorted(_reference()["prompts"])


@pytest.fixture(scope="module")
def gemma():
    import localllm

    return localllm.load(n_ctx=1024)


@pytest.fixture(scope="module")
def reference():
    return _reference()


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


def teacher_forced_logits(model, prompt_ids, forced_ids):
    """Logits of the last prompt position (batched prefill), then of each forced token fed back singly."""
    session = model.new_session()
    decoder = model.decoder
    rows = [decoder.forward(np.array(prompt_ids, dtype=np.int32), 0, session.cache)[-1].copy()]
    pos = len(prompt_ids)
    for token in forced_ids:
        rows.append(decoder.forward(np.array([token], dtype=np.int32), pos, session.cache)[0].copy())
        pos += 1
    return rows


@pytest.mark.parametrize("name", PROMPTS)
def test_prompt_token_ids_equal_llama_cpp(gemma, reference, name):
    case = reference["prompts"][name]
    assert gemma.tokenize(case["prompt"], add_bos=case["add_bos"]) == case["prompt_ids"]


@pytest.mark.parametrize("name", PROMPTS)
def test_teacher_forced_steps_agree_with_llama_cpp(gemma, reference, name):
    case = reference["prompts"][name]
    steps = case["steps"]
    rows = teacher_forced_logits(gemma, case["prompt_ids"], case["greedy_ids"][: len(steps) - 1])
    clear_disagreements, top5_ok = [], 0
    for i, (step, logits) in enumerate(zip(steps, rows)):
        ref_top = step["top5_logits"]
        ours_top5 = set(np.argsort(-logits)[:5].tolist())
        top5_ok += len(ours_top5 & set(step["top5_ids"])) >= 4
        if ref_top[0] - ref_top[1] >= 1.0 and int(np.argmax(logits)) != step["argmax"]:
            clear_disagreements.append(i)
    assert clear_disagreements == [], f"argmax differs at clear steps {clear_disagreements}"
    assert top5_ok >= 0.95 * len(steps), f"top-5 overlap >= 4 at only {top5_ok}/{len(steps)} steps"


def _kl_spread_script():
    spec = importlib.util.spec_from_file_location("kl_spread", ROOT / "scripts" / "kl_spread.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _worse_by(ours: np.ndarray, theirs: np.ndarray, statistic, rng) -> np.ndarray:
    """statistic(ours) - max over llama.cpp's paths of statistic(theirs[path]), on RESAMPLES resamples of
    the prompts (the same prompts for both sides: the comparison is paired)."""
    picks = rng.integers(0, ours.shape[0], (RESAMPLES, ours.shape[0]))
    return np.array([statistic(ours[idx]) - max(statistic(path[idx]) for path in theirs) for idx in picks])


def test_last_position_kl_over_50_prompts_within_llama_cpp_own_spread(gemma):
    """KL(llama.cpp || ours) at the last position of 50 prompts (4-500 tokens), each prompt in one batch,
    against what llama.cpp's own token-by-token and flash-attention paths give against the same base: our
    median and 90th percentile no worse than the larger of theirs (the spread of llama.cpp itself).

    "No worse" is read as "not shown worse": 95% of paired resamples of the prompts may not all put us
    above. A 90th percentile of 50 prompts is the mean of their 5th and 6th largest values, so comparing
    the two point estimates would again pass or fail by which prompts happen to flip an int8 rounding
    (the flaw of the per-prompt bound this replaced); the point estimates are in the failure message."""
    script = _kl_spread_script()
    ref = np.load(SPREAD)
    assert str(ref["model"]) == "gemma-3-270m-q4_k_m.gguf" and len(ref["names"]) == 50
    offsets = ref["offsets"]
    ours = np.array([
        script.top_k_kl(ref["top_ids"][i], ref["top_logp"][i], gemma.logits(ref["tokens"][offsets[i] : offsets[i + 1]].tolist())[-1])
        for i in range(len(ref["names"]))
    ])
    theirs = ref["spread_kl"]  # [path, prompt]
    p90 = lambda x: np.quantile(x, 0.9)  # noqa: E731
    summary = (f"ours median {np.median(ours):.5f} p90 {p90(ours):.5f}; llama.cpp's {[str(x) for x in ref['spread_paths']]}: "
               f"medians {[round(float(np.median(x)), 5) for x in theirs]}, p90s {[round(float(p90(x)), 5) for x in theirs]}")
    rng = np.random.default_rng(0)
    for name, statistic in (("median", np.median), ("p90", p90)):
        worse = _worse_by(ours, theirs, statistic, rng)
        assert np.quantile(worse, 0.05) <= 0.0, f"{name} worse than llama.cpp's spread in 95% of resamples: {summary}"
    assert np.all(ours < 0.1), summary  # no prompt far off (a broken layer gives KL of order 1)


def test_greedy_generation_through_the_api_matches_llama_cpp_start(gemma, reference):
    """Free-running greedy text through model.generate: the first tokens, where margins are clear."""
    case = reference["prompts"]["p2_fibonacci"]
    events = list(gemma.generate(case["prompt"], max_tokens=8, temperature=0.0, session=gemma.new_session()))
    tokens = [e.token for e in events if e.kind == "token" and e.token is not None]
    assert tokens == case["greedy_ids"][:8]
    assert events[-1].kind == "done" and events[-1].finish_reason == "length"
