"""Issue 26: a base model chats through a plain transcript, and context sizes cannot crash.

Library level first (the base-model rule, the transcript's text, stop string and default penalty, the
context default, the memory check), then the CLI: `run --ctx` in-process, and `localllm chat` in a real
pseudo-terminal (pexpect) on the shipped Gemma 3 270M, which is a base model."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pexpect
import pytest

import localllm
from localllm import api
from localllm.chat.builtin import is_base_model
from localllm.chat.conversation import ChatSettings, Conversation
from localllm.chat.templates import ChatTemplate
from localllm.cli.app import main
from localllm.model.kv_cache import KVCacheTooLarge
from tiny_models import write_tiny_model

GIB = 1024**3
# The shipped file's naming metadata (localllm show / GGUFReader): no template, no fine-tune field.
SHIPPED_GEMMA = {"general.architecture": "gemma3", "general.name": "Gemma 3 270m", "general.basename": "gemma-3",
                 "general.size_label": "270M"}


@pytest.fixture(scope="module")
def gemma(gemma_path):
    model = localllm.load(gemma_path, n_ctx=512, threads=2)
    yield model
    model.close()


def text_of(events) -> str:
    return "".join(e.text for e in events if e.kind == "token")


# ----- which models are base models -----


@pytest.mark.parametrize(
    "meta,file_name,base",
    [
        (SHIPPED_GEMMA, "gemma-3-270m-q4_k_m.gguf", True),
        ({**SHIPPED_GEMMA, "general.finetune": "it"}, "", False),
        ({**SHIPPED_GEMMA, "general.name": "Gemma 3 270m It"}, "", False),
        (SHIPPED_GEMMA, "gemma-3-270m-it-Q8_0.gguf", False),  # the name is only in the file name
        ({"general.architecture": "llama", "general.name": "Llama 3.2 1B Instruct"}, "", False),
        ({"general.architecture": "llama", "general.name": "TinyLlama 1.1B Chat v1.0"}, "", False),
        ({"general.architecture": "qwen2", "general.name": "Qwen2.5 0.5B"}, "qwen2.5-0.5b-q8_0.gguf", True),
        ({"general.architecture": "llama", "general.name": "Italian Llama 7B"}, "", True),  # "it" is a word, not a prefix
        ({**SHIPPED_GEMMA, "tokenizer.chat_template": "{{ messages[0]['content'] }}"}, "", False),  # keeps its own
    ],
)
def test_a_base_model_is_one_without_template_or_chat_tuning_word(meta, file_name, base):
    assert is_base_model(meta, file_name) is base
    template = ChatTemplate.for_model(meta, file_name)
    expected = "transcript" if base else ("gguf" if "tokenizer.chat_template" in meta else "gemma" if "gemma" in meta["general.architecture"] else None)
    if expected is not None:
        assert template.name == expected


def test_the_transcript_text_stop_string_and_penalty():
    template = ChatTemplate.for_model(SHIPPED_GEMMA, "gemma-3-270m-q4_k_m.gguf")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi "},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Who are you?"}]
    text = template.apply(messages)
    # preamble, then the system text, then the examples, then the conversation and the open turn
    assert text.startswith("This is a conversation between a curious user and a helpful, knowledgeable assistant.")
    assert "\nBe brief.\n\nUser: How many days are there in a week?\nAssistant: There are seven days in a week.\n" in text
    assert text.endswith("\nUser: Hi\nAssistant: Hello.\nUser: Who are you?\nAssistant:")
    assert not template.apply(messages, add_generation_prompt=False).endswith("Assistant:")
    assert (template.stop, template.repeat_penalty) == (("\nUser:",), 1.1)
    assert ChatTemplate.for_model({**SHIPPED_GEMMA, "general.finetune": "it"}).stop == ()


# ----- the shipped base model -----


def test_the_shipped_gemma_is_a_base_model_and_answers_through_the_transcript(gemma):
    assert gemma.is_base_model and gemma.chat_template.name == "transcript"
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    events = list(gemma.generate(messages, max_tokens=48, temperature=0))
    assert "Paris" in text_of(events) and events[-1].finish_reason == "stop"


def test_generation_from_messages_stops_at_the_next_user_line_by_itself(gemma):
    messages = [{"role": "user", "content": "What is the capital of Australia?"}]
    prompt = gemma.render_chat(messages)
    # The same prompt and penalty without the stop string: the model goes on to write the next "User:" turn.
    unstopped = text_of(gemma.generate(prompt, max_tokens=80, temperature=0, repeat_penalty=1.1,
                                       session=gemma.new_session()))
    assert "\nUser:" in unstopped
    events = list(gemma.generate(messages, max_tokens=80, temperature=0, session=gemma.new_session()))
    reply = text_of(events)
    assert events[-1].finish_reason == "stop" and "User:" not in reply
    assert reply == unstopped[: unstopped.index("\nUser:")]


def test_the_default_penalty_applies_only_when_none_is_given(gemma):
    messages = [{"role": "user", "content": "Name three rivers in Europe."}]
    prompt = gemma.render_chat(messages)

    def from_ids(penalty):
        return text_of(gemma.generate(prompt, max_tokens=40, temperature=0, repeat_penalty=penalty, stop=["\nUser:"],
                                      session=gemma.new_session()))

    with_default, without = from_ids(1.1), from_ids(1.0)
    assert with_default != without  # the penalty changes this answer, so the comparisons below mean something
    assert text_of(gemma.generate(messages, max_tokens=40, temperature=0, session=gemma.new_session())) == with_default
    assert text_of(gemma.generate(messages, max_tokens=40, temperature=0, repeat_penalty=1.0,
                                  session=gemma.new_session())) == without


def test_a_conversation_uses_the_transcript_and_keeps_replies_clean(gemma):
    conv = Conversation(gemma, settings=ChatSettings(temperature=0.0, max_tokens=48))
    reply = text_of(conv.send("What is the capital of France?"))
    assert "Paris" in reply and reply == reply.strip() and "User:" not in reply
    assert conv.messages[-1] == {"role": "assistant", "content": reply}
    assert conv.settings.sampling(gemma.chat_repeat_penalty()).repeat_penalty == 1.1


# ----- context sizes -----


def test_the_default_context_is_4096_or_the_trained_length_if_shorter(gemma_path, tmp_path):
    assert (api.default_context(32768), api.default_context(4096), api.default_context(2048)) == (4096, 4096, 2048)
    model = localllm.load(gemma_path, threads=1)
    try:
        assert (model.n_ctx, model.trained_ctx, model.session.cache.n_ctx) == (4096, 32768, 4096)
        assert api.estimate_memory(gemma_path).n_ctx == 4096  # what chat's banner reports
    finally:
        model.close()
    tiny = localllm.load(write_tiny_model(tmp_path / "tiny.gguf", "llama", "F32"), threads=1)  # trained on 256
    assert tiny.n_ctx == 256


def test_a_cache_that_does_not_fit_is_refused_before_allocation(gemma_path, monkeypatch):
    from localllm.model import kv_cache

    allocated = []
    monkeypatch.setattr(kv_cache.KVCache, "__init__", lambda self, *a: allocated.append(a))
    monkeypatch.setattr(api, "available_memory", lambda: 2 * GIB)
    per_token = 2 * 18 * 1 * 256 * 2  # K and V, 18 layers, 1 KV head of 256 float16 values
    with pytest.raises(KVCacheTooLarge) as caught:
        localllm.load(gemma_path, n_ctx=1_000_000, threads=1)
    assert not allocated
    error = caught.value
    assert error.needed_bytes == 1_000_000 * per_token  # the cache; the mapped weights can be paged out
    assert error.available_bytes == 2 * GIB
    assert f"needs {error.needed_bytes / GIB:.1f} GiB of memory" in str(error) and "but 2.0 GiB is available" in str(error)


def test_run_with_a_huge_context_is_one_error_line(capsys):
    code = main(["run", "gemma-3-270m", "Hello", "-n", "2", "--ctx", "100000000"])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert re.fullmatch(r"error: a context of 100000000 tokens needs [\d.]+ GiB of memory .* [\d.]+ GiB is available: .*\n", err)


def test_a_context_beyond_the_trained_length_warns_in_one_line():
    # In a subprocess: the warning is a log record of the library, which pytest's own log capture would take.
    command = [sys.executable, "-m", "localllm.cli.app", "run", "gemma-3-270m", "Hello", "-n", "1", "--ctx", "40000",
               "-t", "2", "--temperature", "0"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ("warning: a context of 40000 tokens is longer than the 32768 this model was trained on; "
                           "text past that point may degrade\n")
    quiet = subprocess.run(command[:-6] + ["-t", "2"], capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0 and quiet.stderr == ""  # the default context: no warning


def test_a_context_that_cannot_be_set_leaves_the_conversation_as_it_was(gemma):
    conv = Conversation(gemma, settings=ChatSettings(temperature=0.0, max_tokens=8))
    first = text_of(conv.send("What is the capital of France?"))
    messages, session, n_ctx = [dict(m) for m in conv.messages], conv.session, gemma.n_ctx
    with pytest.raises(KVCacheTooLarge):
        conv.set_context(100_000_000)
    assert (conv.messages, conv.session, gemma.n_ctx, gemma.session.cache.n_ctx) == (messages, session, n_ctx, n_ctx)
    second = text_of(conv.send("And of Italy?"))  # the conversation goes on, on its old cache
    assert first and second and conv.last.timings.cached_tokens > 0
    conv.set_context(256)
    assert (gemma.n_ctx, conv.session.cache.n_ctx) == (256, 256) and len(conv.messages) == 4
    conv.set_context(512)


# ----- `localllm chat` in a pseudo-terminal -----


def test_chat_on_the_base_model_says_so_answers_and_keeps_the_session_on_a_bad_ctx(tmp_path):
    env = dict(os.environ, LOCALLLM_HISTORY=str(tmp_path / "history"), TERM="dumb", NO_COLOR="1", COLUMNS="300")
    env.pop("LOCALLLM_CTX", None)
    child = pexpect.spawn(sys.executable, ["-m", "localllm.cli.app", "chat", "--temperature", "0", "-n", "48"],
                          env=env, encoding="utf-8", timeout=180, cwd=str(tmp_path), dimensions=(24, 300))
    try:
        child.expect(r"KV cache for (\d+) tokens")
        assert child.match.group(1) == "4096"
        child.expect_exact("Gemma 3 270m is a base model, not tuned for chat")
        child.expect_exact("For a real assistant: localllm pull gemma-3-270m-it")
        child.expect_exact(">>> ")
        child.sendline("What is the capital of France?")
        child.expect_exact("France?\r\n")
        child.expect_exact(">>> ")
        assert "Paris" in child.before
        child.sendline("/set ctx 100000000")
        child.expect(r"error: a context of 100000000 tokens needs [\d.]+ GiB")
        child.expect_exact(">>> ")
        child.sendline("/stats")
        child.expect(r"context: (\d+) of (\d+) tokens, (\d+) messages")
        assert child.match.group(2) == "4096" and child.match.group(3) == "2"  # the conversation is still there
        child.expect_exact(">>> ")
        child.sendline("/show")
        child.expect(r"context length\s+4096 \(trained on 32768\)")
        child.expect(r"ctx\s+4096 \(trained on 32768\)")
        child.expect_exact(">>> ")
        child.sendline("/set ctx 2048")
        child.expect_exact("context = 2048 tokens")
        child.expect_exact(">>> ")
        child.sendline("/stats")
        child.expect(r"context: \d+ of 2048 tokens, 2 messages")
        child.expect_exact(">>> ")
        child.sendline("/bye")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


# ----- the server's chat endpoint -----


def test_the_server_chat_endpoint_uses_the_transcript_with_its_stop_and_penalty(gemma):
    import httpx

    from localllm.server import BackgroundServer, ServeOptions

    question = [{"role": "user", "content": "What is the capital of Australia?"}]
    library = text_of(gemma.generate(question, max_tokens=80, temperature=0, session=gemma.new_session()))
    plain = text_of(gemma.generate(question, max_tokens=80, temperature=0, repeat_penalty=1.0,
                                   session=gemma.new_session()))
    with BackgroundServer(gemma, ServeOptions(port=0, parallel=2, cache_mb=16), model_id="base") as server:
        def ask(**extra):
            body = {"messages": question, "max_tokens": 80, "temperature": 0, **extra}
            reply = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=120).json()
            return reply["choices"][0]["message"]["content"], reply["choices"][0]["finish_reason"]

        assert ask() == (library, "stop") and "User:" not in library
        assert ask(repeat_penalty=1.0) == (plain, "stop")  # a penalty the request sets is kept


def test_chat_with_a_huge_context_is_one_error_line_before_anything_else():
    done = subprocess.run([sys.executable, "-m", "localllm.cli.app", "chat", "--ctx", "100000000"],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 1 and done.stdout == ""
    assert re.fullmatch(r"error: a context of 100000000 tokens needs [\d.]+ GiB of memory .* [\d.]+ GiB is available: .*\n",
                        done.stderr), done.stderr


def test_serve_leaves_the_default_context_to_the_library(monkeypatch):
    import localllm.server

    seen = []
    monkeypatch.delenv("LOCALLLM_CTX", raising=False)
    monkeypatch.setattr(localllm.server, "serve", lambda model, options, **kw: seen.append(options.ctx))
    assert main(["serve", "--port", "0"]) == 0
    assert main(["serve", "--port", "0", "--ctx", "1024"]) == 0
    # None: localllm.load picks default_context, as for chat and run (4096 for the shipped Gemma, trained on 32768)
    assert seen == [None, 1024]
