"""The generation API on a tiny model: events, KV reuse across turns, clean close, context limits."""

from __future__ import annotations

import numpy as np
import pytest

import localllm
from localllm.errors import ContextOverflow

from tiny_models import write_tiny_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    # "instruct" in the file name: chat prompts use the ChatML built-in (a base model's transcript, with its
    # preamble and examples, would not fit the 96-token context the tests below need)
    path = write_tiny_model(tmp_path_factory.mktemp("gen") / "tiny-qwen3-instruct.gguf", "qwen3", "Q8_0", seed=7)
    return localllm.load(path, n_ctx=96, threads=1)


def run(model, prompt, **options):
    tokens, text, done = [], [], None
    for event in model.generate(prompt, **options):
        if event.kind == "token":
            if event.token is not None:
                tokens.append(event.token)
            text.append(event.text)
        else:
            done = event
    return tokens, "".join(text), done


def test_greedy_tokens_are_the_argmax_of_recomputed_logits(model):
    prompt = model.tokenize("▁ab▁cd▁ef")
    tokens, text, done = run(model, prompt, max_tokens=5, temperature=0, session=model.new_session())
    assert done.finish_reason in ("length", "stop") and done.timings.prompt_tokens == len(prompt)
    context = list(prompt)
    for token in tokens:  # each greedy token is the argmax of a from-scratch evaluation of its context
        assert token == int(np.argmax(model.logits(context)[-1]))
        context.append(token)
    assert text == model.detokenize(tokens)


def test_same_seed_same_tokens_different_seed_differs(model):
    prompt = model.tokenize("▁ab")
    a = run(model, prompt, max_tokens=12, temperature=100.0, top_k=0, top_p=1.0, min_p=0.0, seed=11, session=model.new_session())[0]
    b = run(model, prompt, max_tokens=12, temperature=100.0, top_k=0, top_p=1.0, min_p=0.0, seed=11, session=model.new_session())[0]
    c = run(model, prompt, max_tokens=12, temperature=100.0, top_k=0, top_p=1.0, min_p=0.0, seed=12, session=model.new_session())[0]
    assert a == b and a != c


def test_a_new_turn_reuses_the_cache(model):
    session = model.new_session()
    first = model.tokenize("▁ab▁cd")
    tokens, _, done = run(model, first, max_tokens=4, temperature=0, session=session)
    assert done.timings.cached_tokens == 0
    second = first + tokens + model.tokenize("▁ef▁gh", add_bos=False)
    _, _, done = run(model, second, max_tokens=3, temperature=0, session=session)
    # everything the first turn put in the cache (its prompt and the tokens fed back) is reused
    assert done.timings.cached_tokens == len(first) + len(tokens) - 1


def test_closing_the_generator_keeps_the_session_consistent(model):
    session = model.new_session()
    prompt = model.tokenize("▁ab▁cd")
    gen = model.generate(prompt, max_tokens=20, temperature=0, session=session)
    taken = [next(gen) for _ in range(3)]
    gen.close()
    assert all(e.kind == "token" for e in taken)
    fed = [e.token for e in taken]
    # closed at the third token's event: the first two were fed back into the cache, the third not
    assert session.tokens == prompt + fed[:2]
    _, _, done = run(model, prompt + fed, max_tokens=1, temperature=0, session=session)
    assert done.timings.cached_tokens == len(prompt) + 2


def test_prompt_over_context_raises_and_context_shift_drops_old_turns(model):
    long_turn = "▁ab " * 30
    messages = [{"role": "system", "content": "▁zz"}]
    for _ in range(3):
        messages += [{"role": "user", "content": long_turn}, {"role": "assistant", "content": long_turn}]
    messages.append({"role": "user", "content": "▁cd"})
    with pytest.raises(ContextOverflow) as err:
        run(model, messages, max_tokens=4, temperature=0, session=model.new_session())
    assert err.value.n_ctx == 96
    kept = model.fit_conversation(messages, reserve=4, shift=True)
    assert len(kept) + 4 < 96
    # whole old messages went; the system prompt and the newest turn stayed
    dropped = [k for k in range(2, len(messages)) if model.render_chat([messages[0]] + messages[k:]) == kept]
    assert dropped and messages[dropped[0]:][-1]["content"] == "▁cd"
    tokens, _, done = run(model, messages, max_tokens=4, temperature=0, session=model.new_session(), context_shift=True)
    assert done.finish_reason in ("length", "stop")


def test_stop_string_ends_generation_and_is_not_emitted(model):
    prompt = model.tokenize("▁ab")
    tokens, text, _ = run(model, prompt, max_tokens=16, temperature=0, session=model.new_session())
    full = model.detokenize(tokens)
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    if not stop.strip():
        pytest.fail(f"greedy text too short to pick a stop string from: {full!r}")
    _, stopped_text, done = run(model, prompt, max_tokens=16, temperature=0, stop=[stop], session=model.new_session())
    assert done.finish_reason == "stop"
    assert stopped_text == full[: full.index(stop)]


def test_warm_up_leaves_the_model_as_it_was(model, tmp_path):
    prompt = [2, 300, 17, 281, 299, 5]
    before = model.logits(prompt)
    list(model.generate(prompt, max_tokens=3, temperature=0))  # the default session holds a conversation
    session_tokens = list(model.session.tokens)
    model.warm_up()
    assert model.session.tokens == session_tokens
    np.testing.assert_array_equal(model.logits(prompt), before)
    small = localllm.load(write_tiny_model(tmp_path / "small.gguf", "llama", "F32"), n_ctx=16, threads=1)
    small.warm_up()  # a context shorter than the warm-up prompt
