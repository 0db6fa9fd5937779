"""A chat conversation over a loaded model: messages, settings, and one KV cache kept across turns.

This is what `localllm chat` drives (the REPL only reads lines and prints events), and what a library
user can drive too:

    conv = Conversation(localllm.load("gemma-3-270m"), system="Answer briefly.")
    for event in conv.send("Why is the sky blue?"):
        print(event.text, end="")

A reply that is stopped early (the consumer closes the generator, e.g. on Ctrl-C) is kept as far as it
got, so the conversation and its cache stay consistent: the next turn re-renders the messages and the
cache reuses its common prefix with them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Iterator, Optional

from ..errors import LocalLLMError
from ..generate import Event, Timings, common_prefix
from ..sampling_config import SamplingConfig
from .history import drop_oldest_turns

SAVE_FORMAT = "localllm-chat/1"
# Warn once the conversation fills this share of the context (the next turns may not fit).
WARN_SHARE = 0.75


@dataclass
class ChatSettings:
    """The settings `/set` changes; sampling ones go to SamplingConfig unchanged (and start from its
    defaults: a dataclass field's default is its class attribute)."""

    temperature: float = SamplingConfig.temperature
    top_k: int = SamplingConfig.top_k
    top_p: float = SamplingConfig.top_p
    min_p: float = SamplingConfig.min_p
    # None: the model's chat default (Model.chat_repeat_penalty: 1.1 for a base model's transcript, else 1.0)
    repeat_penalty: Optional[float] = None
    seed: Optional[int] = None
    max_tokens: int = 512
    verbose: bool = False
    grammar: Optional[str] = None  # GBNF text every reply follows (chat --grammar/--json-schema); not for /set

    SAMPLING = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed", "grammar")

    def sampling(self, default_repeat_penalty: float = 1.0):
        """The SamplingConfig; `default_repeat_penalty` stands in for a repeat_penalty left unset."""
        values = {name: getattr(self, name) for name in self.SAMPLING}
        if values["repeat_penalty"] is None:
            values["repeat_penalty"] = default_repeat_penalty
        return SamplingConfig(**values)

    def set(self, name: str, text: str) -> None:
        """Parse `text` for setting `name` and apply it if valid; LocalLLMError with the reason if not."""
        kinds = {f.name: f.type for f in fields(self) if f.name != "grammar"}
        if name not in kinds:
            raise LocalLLMError(f"unknown setting '{name}' (settings: {', '.join(kinds)})")
        value = _parse_value(name, text, kinds[name])
        previous = getattr(self, name)
        setattr(self, name, value)
        try:
            self.sampling()  # SamplingConfig validates ranges (temperature >= 0, top_p in [0, 1], ...)
            if self.max_tokens < 1:
                raise ValueError("max_tokens must be an integer >= 1")
        except ValueError as exc:
            setattr(self, name, previous)
            raise LocalLLMError(str(exc)) from None


def _parse_value(name: str, text: str, kind: str):
    text = text.strip()
    try:
        if kind == "bool":
            lowered = text.lower()
            if lowered in ("on", "true", "1", "yes"):
                return True
            if lowered in ("off", "false", "0", "no"):
                return False
            raise ValueError
        if name == "seed" and text.lower() in ("none", "random", "-1"):
            return None
        if kind.startswith("Optional") and text.lower() in ("none", "default"):
            return None
        if kind in ("int", "Optional[int]"):
            return int(text)
        return float(text)
    except ValueError:
        expected = "on or off" if kind == "bool" else "an integer" if "int" in kind else "a number"
        raise LocalLLMError(f"{name} must be {expected}, got '{text}'") from None


@dataclass
class TurnStats:
    timings: Timings
    finish_reason: str
    context_used: int
    n_ctx: int
    dropped_messages: int = 0


class Conversation:
    def __init__(self, model, system: Optional[str] = None, settings: Optional[ChatSettings] = None, speculation=None):
        """`speculation`: a Speculation (localllm/speculative.py) every reply decodes with, or None."""
        self.model = model
        self.speculation = speculation
        self.settings = settings or ChatSettings()
        self.messages: list[dict] = []
        self.session = model.new_session()
        self.last: Optional[TurnStats] = None
        self._prefill_start = 0  # where the last reply's prompt prefill began (what the cache reused)
        if system:
            self.set_system(system)

    # -- the conversation --

    @property
    def system(self) -> Optional[str]:
        if self.messages and self.messages[0]["role"] == "system":
            return self.messages[0]["content"]
        return None

    def set_system(self, text: Optional[str]) -> None:
        if self.system is not None:
            del self.messages[0]
        if text:
            self.messages.insert(0, {"role": "system", "content": text})

    def clear(self) -> None:
        """Forget every turn (the system prompt stays) and the cache."""
        system = self.system
        self.messages = []
        self.set_system(system)
        self.session.reset()
        self.last = None
        self._prefill_start = 0

    def send(self, text: str) -> Iterator[Event]:
        """Add a user message and stream the assistant's reply."""
        if not text.strip():
            raise LocalLLMError("empty message")
        self.messages.append({"role": "user", "content": text})
        return self._reply()

    def regenerate(self) -> Iterator[Event]:
        """Drop the last assistant reply and answer the last user message again."""
        if self.messages and self.messages[-1]["role"] == "assistant":
            self.messages.pop()
        if not self.messages or self.messages[-1]["role"] != "user":
            raise LocalLLMError("nothing to regenerate yet")
        # Recompute the prompt from where the original reply's prefill started, so the same tokens go
        # through the same kernels: a prompt tail prefilled in one batch (BLAS, float activations) and the
        # same tail recomputed one token at a time (quantized activations) give logits that differ in the
        # last bits, and at temperature 0 a near-tie can then pick another token.
        del self.session.tokens[self._prefill_start :]
        return self._reply()

    def _reply(self) -> Iterator[Event]:
        reserve = min(self.settings.max_tokens, self.model.n_ctx // 4)
        prompt, dropped = self._fit(reserve)
        self._prefill_start = min(common_prefix(self.session.tokens, prompt), len(prompt) - 1)
        reply = {"role": "assistant", "content": ""}
        self.messages.append(reply)
        sampling = self.settings.sampling(self.model.chat_repeat_penalty())
        stream = self.model.generate(prompt, max_tokens=self.settings.max_tokens, sampling=sampling,
                                     session=self.session, stop=self.model.chat_stop(), speculation=self.speculation)
        try:
            for event in stream:
                if event.kind == "token":
                    if not reply["content"]:  # "Assistant:" is followed by " Paris.": no leading space shown
                        event.text = event.text.lstrip()
                    reply["content"] += event.text
                else:
                    self.last = TurnStats(event.timings, event.finish_reason, len(self.session.tokens),
                                          self.model.n_ctx, dropped)
                yield event
        finally:
            stream.close()

    def _fit(self, reserve: int) -> tuple[list[int], int]:
        """Drop the oldest turns (chat/history.py: whole turns, never the system prompt or the newest
        message) until the conversation plus `reserve` tokens fits; returns the prompt ids and how many
        messages went. ContextOverflow if even the newest message alone does not fit."""
        prompt, dropped = drop_oldest_turns(self.messages, self.model.render_chat, self.model.n_ctx, reserve,
                                            "this message (with room for the reply)")
        if dropped:
            self.session.reset()  # the cached prefix no longer matches the conversation's start
        return prompt, dropped

    def set_context(self, n_ctx: int) -> None:
        """Use a context of n_ctx tokens from the next turn on; the messages stay (the oldest are dropped at
        the next turn if they no longer fit). A size that cannot be used (too small, a KV cache that would
        not fit in memory) raises before anything changes."""
        self.model.resize_context(n_ctx)
        self.session = self.model.new_session()
        self._prefill_start = 0

    # -- context accounting --

    def context_used(self) -> int:
        """Tokens the conversation takes when rendered (what the next turn prefills, plus what is cached)."""
        return len(self.model.render_chat(self.messages)) if self.messages else 0

    def near_full(self) -> bool:
        return self.context_used() + self.settings.max_tokens >= WARN_SHARE * self.model.n_ctx

    # -- save / load --

    def to_json(self) -> dict:
        return {
            "format": SAVE_FORMAT,
            "model": str(self.model.path),
            "settings": {k: v for k, v in asdict(self.settings).items() if k != "grammar"},
            "messages": self.messages,
        }

    def save(self, path: Path) -> None:
        path = Path(path).expanduser()
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        tmp.replace(path)  # never a half-written conversation under the final name

    def load(self, path: Path) -> None:
        """Replace the conversation with the one saved at `path` (settings included)."""
        path = Path(path).expanduser()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise LocalLLMError(f"{path}: not a saved conversation (invalid JSON: {exc.msg})") from None
        messages = data.get("messages") if isinstance(data, dict) else None
        if not isinstance(messages, list) or not all(_is_message(m) for m in messages):
            raise LocalLLMError(f"{path}: not a saved conversation (no list of role/content messages)")
        settings = ChatSettings(grammar=self.settings.grammar)  # the grammar is the command line's
        for name, value in (data.get("settings") or {}).items():
            if name in {f.name for f in fields(settings)} - {"grammar"}:
                settings.set(name, "none" if value is None else str(value))
        self.messages = [{"role": m["role"], "content": m["content"]} for m in messages]
        self.settings = settings
        self.session.reset()
        self.last = None
        self._prefill_start = 0


def _is_message(message) -> bool:
    return (
        isinstance(message, dict)
        and message.get("role") in ("system", "user", "assistant")
        and isinstance(message.get("content"), str)
    )
