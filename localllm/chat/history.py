"""Fitting a conversation into the context: the oldest turns go first, whole.

One rule, used by `Conversation` (what `localllm chat` drives) and by `Model.generate(messages,
context_shift=True)` (the library): a *turn* is a message and the replies after it (assistant and tool
messages) up to the next user or system message; it normally starts with a user message. While the
rendered conversation plus the room kept for the reply does not fit, the oldest turn after the system
prompt is dropped, whole. The system prompt and the newest turn always stay; when they alone do not fit,
ContextOverflow.

Whole turns, never single messages: chat templates expect user/assistant alternation after the system
prompt (the built-in gemma, llama2 and mistral templates raise on anything else, as their official forms
do), and a reply without the question it answers misleads the model. Ollama (server/prompt.go) likewise
keeps the system prompt and the newest message and leaves out the oldest messages first.
"""

from __future__ import annotations

from typing import Callable

from ..errors import ContextOverflow


def oldest_turn_end(messages: list[dict], first: int) -> int:
    """Index just past the turn that starts at `first`: the next user or system message after it, else len."""
    end = first + 1
    while end < len(messages) and messages[end].get("role") not in ("user", "system"):
        end += 1
    return end


def newest_turn_start(messages: list[dict]) -> int:
    """Index of the last user message (where the newest turn starts); the last message if none is a user's."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "user":
            return index
    return len(messages) - 1


def drop_oldest_turns(
    messages: list[dict], render: Callable[[list[dict]], list[int]], n_ctx: int, reserve: int, what: str
) -> tuple[list[int], int]:
    """Drop whole oldest turns from `messages`, in place, until its rendering plus `reserve` tokens is
    shorter than `n_ctx`; returns (the rendered prompt ids, how many messages went).

    `render` turns messages into prompt token ids (Model.render_chat). ContextOverflow (naming `what`)
    when only the system prompt and the newest turn are left and they still do not fit; the older turns
    are gone by then."""
    dropped = 0
    while True:
        ids = render(messages)
        if len(ids) + reserve < n_ctx:
            return ids, dropped
        first = 1 if messages and messages[0].get("role") == "system" else 0
        end = min(oldest_turn_end(messages, first), newest_turn_start(messages))
        if end <= first:
            raise ContextOverflow(len(ids) + reserve, n_ctx, what)
        del messages[first:end]
        dropped += end - first
