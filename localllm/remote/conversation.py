"""A chat with a remote model: the Conversation `localllm chat` drives, with the remote keeping the cache.

Each turn sends the whole conversation (the remote's engine applies its chat template and reuses its cached
prefix, as vLLM's and llama-server's prefix caching do). A reply stopped early (Ctrl-C closes the stream,
which closes the connection: the remote cancels the request) is kept as far as it got, as a local one is.
The context's fill is the remote's count of the last turn's tokens (its usage).
"""

from __future__ import annotations

from typing import Iterator, Optional

from ..chat.conversation import ChatSettings, Conversation, TurnStats
from ..errors import LocalLLMError
from ..generate import Event


class _NoSession:
    """Stands in for the local KV cache's session: the remote keeps its own (no tokens are ever held)."""

    def __init__(self) -> None:
        self.tokens: list = []

    def reset(self) -> None:
        pass


class RemoteConversation(Conversation):
    def __init__(self, model, system: Optional[str] = None, settings: Optional[ChatSettings] = None,
                 json_schema=None):
        """`model`: a RemoteModel; `json_schema`: a schema every reply follows (sent as response_format)."""
        self.model = model
        self.speculation = None
        self.json_schema = json_schema
        self.settings = settings or ChatSettings()
        self.messages: list = []
        self.session = _NoSession()
        self.last: Optional[TurnStats] = None
        self._prefill_start = 0
        if system:
            self.set_system(system)

    def _reply(self) -> Iterator[Event]:
        settings = self.settings
        stream = self.model.generate(list(self.messages), max_tokens=settings.max_tokens,
                                     sampling=settings.sampling(), json_schema=self.json_schema)
        reply = {"role": "assistant", "content": ""}
        self.messages.append(reply)
        return self._collect(stream, reply)

    def _collect(self, stream, reply: dict) -> Iterator[Event]:
        try:
            for event in stream:
                if event.kind == "token":
                    reply["content"] += event.text
                else:
                    used = event.timings.prompt_tokens + event.timings.generated_tokens
                    self.last = TurnStats(event.timings, event.finish_reason, used, self.model.n_ctx or 0)
                yield event
        finally:
            stream.close()

    def set_context(self, n_ctx: int) -> None:
        raise LocalLLMError(f"the context size of {self.model.label} is set by the engine serving it")

    def context_used(self) -> int:
        """Tokens of the last turn as the remote counted them (0 before the first reply)."""
        return self.last.context_used if self.last else 0

    def near_full(self) -> bool:
        n_ctx = self.model.n_ctx
        return bool(n_ctx) and self.context_used() + self.settings.max_tokens >= 0.75 * n_ctx
