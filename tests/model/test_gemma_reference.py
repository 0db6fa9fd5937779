"""The real model against llama.cpp (../shared/reference/gemma-3-270m, produced by llama.cpp itself).

Method as in the reference: the prompt evaluated in one batch, then llama.cpp's 32 greedy tokens fed back
one at a time (teacher forcing), so every step compares the same context. Bars (from the engine issue):
- prompt token ids identical;
- our argmax equals llama.cpp's wherever llama.cpp's top-1 minus top-2 logit is >= 1.0;
- our top-5 shares >= 4 ids with llama.cpp's at >= 95% of the steps;
- KL(llama.cpp || ours) <= 0.01 at the last prompt position, over the full 262,144 logits.
llama.cpp's own batched and token-by-token paths differ by up to KL 0.009 and 1.2 in a logit, which is
why the bars are not bit equality. Over 50 prompts they differ by more than 0.01 on 16% of them (its
flash-attention path on 24%, and on p3 here: 0.0112): the KL bound is within rounding noise
(docs/accuracy.md, scripts/kl_spread.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import REFERENCE_DIR

REFERENCE = REFERENCE_DIR / "gemma-3-270m"


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


@pytest.mark.parametrize("name", PROMPTS)
def test_last_prompt_position_kl_within_bound(gemma, reference, name):
    case = reference["prompts"][name]
    theirs = np.load(REFERENCE / case["last_logits_file"])
    ours = gemma.logits(case["prompt_ids"])[-1]
    p_log, q_log = log_softmax(theirs), log_softmax(ours)
    kl = float(np.sum(np.exp(p_log) * (p_log - q_log)))
    assert kl <= 0.01, f"KL(llama.cpp || ours) = {kl:.5f}"


def test_greedy_generation_through_the_api_matches_llama_cpp_start(gemma, reference):
    """Free-running greedy text through model.generate: the first tokens, where margins are clear."""
    case = reference["prompts"]["p2_fibonacci"]
    events = list(gemma.generate(case["prompt"], max_tokens=8, temperature=0.0, session=gemma.new_session()))
    tokens = [e.token for e in events if e.kind == "token" and e.token is not None]
    assert tokens == case["greedy_ids"][:8]
    assert events[-1].kind == "done" and events[-1].finish_reason == "length"
