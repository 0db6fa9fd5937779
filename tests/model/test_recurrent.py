"""Recurrent layers (Qwen3.5's gated delta nets, model/recurrent.py): the state a session carries across
prompts, its checkpoints, and the chunked prompt against token-by-token decoding, on the tiny hybrid.

The reference in each test is a fresh session prefilling the same prompt: what a session that reused
part of its cache must reproduce. The two differ only where the prompt is split into other forward
passes (the delta rule's chunks start elsewhere): within float32 rounding (SAME below), far under the
differences a wrong state makes (the tests check that too)."""

from __future__ import annotations


import numpy as np
import pytest

import localllm
from localllm.generate import prefill
from localllm.model.recurrent import MAX_CHECKPOINTS

from chat_checks import chat_replies
from server_checks import concurrent_equals_alone
from tiny_models import write_tiny_model

PROMPT = [2, 300, 17, 281, 299, 5, 260, 310, 333, 290, 301, 7, 270, 275, 12, 318, 263, 297, 40, 311]
SAME = 1e-4  # relative to the largest |logit|: rounding of other forward passes (measured: 6e-7 for a turn
# continued from the state, 2e-5 for a whole prompt token by token, whose products take other kernels)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("hybrid") / "qwen35.gguf", "qwen35", "F32", seed=3)
    return localllm.load(path, n_ctx=64, threads=2)


def run(model, session, prompt):
    """prefill's (logits, reused), the logits copied (the decoder reuses its logits buffer)."""
    logits, reused = prefill(model.decoder, session, list(prompt), model.n_ctx)
    return logits.copy(), reused


def fresh(model, prompt):
    return run(model, model.new_session(), prompt)[0]


def close(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_the_cache_holds_states_only_for_the_delta_net_layers(model):
    cache = model.new_session().cache
    recurrent = model.decoder.dn.recurrent
    assert recurrent == (True, False, True, False)
    assert [k is None for k in cache.k] == list(recurrent)
    assert sorted(cache.states.layers) == [0, 2]


def test_a_prompt_in_chunks_equals_token_by_token_decoding(model):
    """The chunked delta rule (a prompt) against the one-token form (decode), through the whole model."""
    session = model.new_session()
    together = model.decoder.forward(np.array(PROMPT, np.int32), 0, session.cache, all_logits=True).copy()
    session = model.new_session()
    one_by_one = np.stack([model.decoder.forward(np.array([t], np.int32), i, session.cache)[0].copy()
                           for i, t in enumerate(PROMPT)])
    assert close(one_by_one, together) < SAME


def test_a_next_turn_continues_from_the_state(model):
    """A prompt that extends what the session holds runs only the new tokens, from the state as it is."""
    session = model.new_session()
    prefill(model.decoder, session, PROMPT[:12], model.n_ctx)
    logits, reused = run(model, session, PROMPT)
    assert reused == 12
    assert close(logits, fresh(model, PROMPT)) < SAME


def test_a_diverging_prompt_resumes_from_the_checkpoint_at_or_before_it(model):
    """The session holds PROMPT (a checkpoint one token before its end); a prompt sharing all but the
    last two tokens resumes from the start (no checkpoint that early), one sharing all but the last
    resumes from the checkpoint. Both equal a fresh prefill; the state as it was would not."""
    session = model.new_session()
    prefill(model.decoder, session, PROMPT, model.n_ctx)
    assert [p for p, _ in session.cache.states.checkpoints] == [len(PROMPT) - 1]
    edited = PROMPT[:-1] + [5]
    logits, reused = run(model, session, edited)
    assert reused == len(PROMPT) - 1
    assert close(logits, fresh(model, edited)) < SAME
    earlier = PROMPT[:-2] + [7, 9]
    logits, reused = run(model, session, earlier)
    assert reused == 0
    assert close(logits, fresh(model, earlier)) < SAME


def test_the_state_as_it_was_would_be_wrong(model):
    """Negative control for the test above: keeping PROMPT's state and running only the edited last token
    (what a KV cache would do) gives other logits."""
    session = model.new_session()
    prefill(model.decoder, session, PROMPT, model.n_ctx)
    stale = model.decoder.forward(np.array([5], np.int32), len(PROMPT) - 1, session.cache)[0].copy()
    assert close(stale, fresh(model, PROMPT[:-1] + [5])) > 100 * SAME


def test_a_stopped_forward_pass_is_not_continued(model):
    """A forward pass that raises part way (after the first delta net updated its state) leaves the state
    unknown: the next prompt resumes from the checkpoint, not from the half-updated state."""
    session = model.new_session()
    prefill(model.decoder, session, PROMPT, model.n_ctx)
    original = model.decoder.feed_forward

    def stop(il, b, x=None):
        raise KeyboardInterrupt

    model.decoder.feed_forward = stop
    try:
        with pytest.raises(KeyboardInterrupt):
            model.decoder.forward(np.array([9], np.int32), len(PROMPT), session.cache)
    finally:
        model.decoder.feed_forward = original
    longer = PROMPT + [9, 11]
    logits, reused = run(model, session, longer)
    assert reused == len(PROMPT) - 1
    assert close(logits, fresh(model, longer)) < SAME


def test_checkpoints_are_bounded_and_the_oldest_go_first(model):
    session = model.new_session()
    prompt = list(PROMPT)
    for extra in range(MAX_CHECKPOINTS + 2):
        prompt = prompt + [260 + extra, 270 + extra]
        prefill(model.decoder, session, prompt, model.n_ctx)
    positions = [p for p, _ in session.cache.states.checkpoints]
    assert len(positions) == MAX_CHECKPOINTS
    assert positions == sorted(positions) and positions[-1] == len(prompt) - 1


def test_chat_turns_through_generate_reuse_the_state(model):
    """Model.generate over a growing conversation (each prompt the last one, its reply and more) equals
    fresh sessions token for token, greedy."""
    first = list(model.generate(PROMPT[:10], max_tokens=6, temperature=0.0))
    reply = [e.token for e in first if e.kind == "token"]
    follow = PROMPT[:10] + reply + [311, 7]
    second = [e.token for e in model.generate(follow, max_tokens=6, temperature=0.0) if e.kind == "token"]
    alone = localllm.load(model.path, n_ctx=64, threads=2)
    assert second == [e.token for e in alone.generate(follow, max_tokens=6, temperature=0.0) if e.kind == "token"]


def test_concurrent_requests_each_equal_the_request_alone(tmp_path):
    """The server's batched steps, each sequence with its own recurrent state slot, give each request the
    greedy tokens Model.generate gives it alone; twice, so that the second round runs in slots the first
    gave back (zeroed as they are taken), with the same prompts (no prefix reuse for recurrent layers)."""
    path = write_tiny_model(tmp_path / "tiny-qwen35.gguf", "qwen35", "Q4_K", seed=4)
    concurrent_equals_alone(path, [[2, *range(300 + 7 * i, 305 + 7 * i + i)] for i in range(4)], rounds=2)


def test_chat_keeps_the_state_across_turns_and_regenerates(tmp_path):
    """`localllm chat` on the tiny hybrid: a reply, a second turn on top of it, and /regen at temperature
    0 twice giving the same reply (each /regen resumes from the checkpoint before the reply)."""
    path = write_tiny_model(tmp_path / "tiny-qwen35.gguf", "qwen35", "Q8_0", seed=3)
    replies = chat_replies(path, ("▁ab▁cd▁ef", "▁gh▁ij", "/regen", "/regen"), tmp_path)
    assert replies[0].strip() and replies[1].strip() and replies[2] == replies[3] == replies[1]
