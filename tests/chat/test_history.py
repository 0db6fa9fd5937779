"""Fitting a conversation into the context (localllm/chat/history.py): whole oldest turns go first, the
system prompt and the newest turn stay; `localllm chat` (Conversation) and Model.generate(messages,
context_shift=True) share the rule."""

from types import SimpleNamespace

import pytest

from localllm.api import Model
from localllm.chat.conversation import Conversation
from localllm.chat.history import drop_oldest_turns
from localllm.errors import ContextOverflow

WHAT = "conversation (with room for the reply)"


def render(messages):
    """Ten tokens per message: sizes worked out by hand below."""
    return [0] * (10 * len(messages))


def msg(role, content):
    return {"role": role, "content": content}


S, U1, A1, U2, A2, U3 = (msg("system", "S"), msg("user", "u1"), msg("assistant", "a1"), msg("user", "u2"),
                         msg("assistant", "a2"), msg("user", "u3"))


def test_a_conversation_that_fits_is_left_alone():
    messages = [S, U1, A1, U2]
    ids, dropped = drop_oldest_turns(messages, render, n_ctx=41, reserve=0, what=WHAT)
    assert (len(ids), dropped, messages) == (40, 0, [S, U1, A1, U2])


def test_the_oldest_turn_goes_whole_and_the_system_prompt_stays():
    # 6 messages = 60 tokens; + reserve 5 must stay under 50: one turn (u1, a1) leaves 40 + 5 < 50
    messages = [S, U1, A1, U2, A2, U3]
    ids, dropped = drop_oldest_turns(messages, render, n_ctx=50, reserve=5, what=WHAT)
    assert (len(ids), dropped, messages) == (40, 2, [S, U2, A2, U3])


def test_no_reply_is_left_without_its_user_message():
    # the rule that went (api.py's, one message at a time) would have tried [S, a1, u2, a2, u3] first
    seen = []

    def recording(messages):
        seen.append([m["content"] for m in messages])
        return render(messages)

    messages = [S, U1, A1, U2, A2, U3]
    drop_oldest_turns(messages, recording, n_ctx=30, reserve=0, what=WHAT)
    assert seen == [["S", "u1", "a1", "u2", "a2", "u3"], ["S", "u2", "a2", "u3"], ["S", "u3"]]
    assert messages == [S, U3]


def test_the_newest_turn_keeps_its_reply_and_overflows_whole():
    # a conversation that ends with an assistant message (a reply to continue): u2 and a2 stay together
    messages = [S, U1, A1, U2, A2]
    with pytest.raises(ContextOverflow) as err:
        drop_oldest_turns(messages, render, n_ctx=30, reserve=2, what=WHAT)
    assert (err.value.n_tokens, err.value.n_ctx) == (32, 30)
    assert WHAT in str(err.value)
    assert messages == [S, U2, A2]  # the older turns are gone by then


def test_without_a_system_prompt_the_first_turn_goes():
    messages = [U1, A1, U2, A2, U3]
    ids, dropped = drop_oldest_turns(messages, render, n_ctx=31, reserve=0, what=WHAT)
    assert (len(ids), dropped, messages) == (30, 2, [U2, A2, U3])


def test_tool_results_go_with_their_turn_and_a_later_system_message_starts_one():
    tool = msg("tool", "t1")
    note = msg("system", "note")
    messages = [S, U1, A1, tool, note, U2, A2, U3]
    _, dropped = drop_oldest_turns(messages, render, n_ctx=51, reserve=0, what=WHAT)
    assert (dropped, messages) == (3, [S, note, U2, A2, U3])


class _Stub:
    """The part of a Model the two callers use: render_chat, n_ctx, a session with reset()."""

    n_ctx = 50

    def render_chat(self, messages):
        return render(messages)

    def new_session(self):
        return SimpleNamespace(tokens=[], reset=lambda: None)


def test_chat_and_generate_drop_the_same_turns():
    stub = _Stub()
    ids = Model.fit_conversation(stub, [S, U1, A1, U2, A2, U3], reserve=5, shift=True)
    conversation = Conversation(stub)
    conversation.messages = [S, U1, A1, U2, A2, U3]
    prompt, dropped = conversation._fit(reserve=5)
    assert ids == prompt and len(ids) == 40
    assert (dropped, conversation.messages) == (2, [S, U2, A2, U3])


def test_generate_without_shift_refuses_and_drops_nothing():
    stub = _Stub()
    messages = [S, U1, A1, U2, A2, U3]
    with pytest.raises(ContextOverflow) as err:
        Model.fit_conversation(stub, messages, reserve=5)
    assert (err.value.n_tokens, err.value.n_ctx) == (65, 50)
    assert len(messages) == 6
