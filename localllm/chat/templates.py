"""Chat templates: a conversation (list of {"role", "content"} messages) -> the prompt text a model expects.

A GGUF file usually carries its model's template as `tokenizer.chat_template`, the Jinja text of the HF
tokenizer_config.json's `chat_template`. It is rendered the way HF transformers renders it, so the
prompt is the one the model was trained on:
- jinja2 `ImmutableSandboxedEnvironment` with `trim_blocks=True, lstrip_blocks=True` and the
  loop-controls extension (`{% break %}`, `{% continue %}`); `{% generation %}` blocks (HF's assistant
  mask markers) render their body;
- globals `raise_exception(message)` and `strftime_now(format)`; the `tojson` filter is HF's
  (`json.dumps` with ensure_ascii=False, optional indent / separators / sort_keys);
- variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, and `tools` (None unless
  given), plus any extra keyword variables the caller passes (e.g. `enable_thinking`).

Files without a template get a built-in one (localllm/chat/builtin.py: choose_builtin), chosen from
the architecture and from hints in the vocabulary (`<start_of_turn>`, `<|turn>`, `<|im_start|>`, `<|im_sep|>`,
`<|start_header_id|>`, `<|start_of_role|>`, `[SYSTEM_PROMPT]`, `[INST]`...);
a base model, which was never tuned on any of those, gets a plain transcript instead (ChatTemplate.for_model).

A template in a downloaded file is untrusted input: it renders in localllm/chat/sandbox.py, which bounds
its output size and wall time; every failure is a `localllm.errors.TemplateError` with a one-line message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..errors import TemplateError
from .builtin import ALL_TEMPLATES, BuiltinTemplate, choose_builtin, is_base_model
from .sandbox import compile_template, render, text_size

# A role is a plain word: it is pasted between special tokens, so it must not smuggle any in.
_ROLE_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]{0,31}")


# -- messages -----------------------------------------------------------------------------------------------


def _validated_messages(messages: Any) -> list[dict]:
    """Copies of the messages after checking each is {"role": word, "content": str, ...}."""
    if not isinstance(messages, (list, tuple)):
        raise TemplateError(f"messages must be a list of {{'role', 'content'}} dicts, got {type(messages).__name__}")
    if not messages:
        raise TemplateError("messages is empty: a conversation needs at least one message")
    checked = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TemplateError(f"message {index}: expected a dict with 'role' and 'content', got {type(message).__name__}")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not _ROLE_PATTERN.fullmatch(role):
            raise TemplateError(f"message {index}: 'role' must be a word such as 'system', 'user' or 'assistant', got {role!r:.60}")
        if not isinstance(content, str):
            raise TemplateError(f"message {index}: 'content' must be a string, got {type(content).__name__}")
        checked.append(dict(message))
    return checked



def _token_text(meta: Mapping[str, Any], which: str) -> str:
    """The text of the file's BOS or EOS token ('' when the metadata does not say)."""
    token_id = meta.get(f"tokenizer.ggml.{which}_token_id")
    tokens = meta.get("tokenizer.ggml.tokens")
    if isinstance(token_id, int) and not isinstance(token_id, bool) and tokens is not None:
        try:
            text = tokens[token_id] if 0 <= token_id < len(tokens) else None
        except (TypeError, IndexError):
            text = None
        if isinstance(text, str):
            return text
    return ""


# -- the template --------------------------------------------------------------------------------------------


class ChatTemplate:
    """A compiled chat template. `name` is "gguf" for the file's own template, else the built-in's name;
    `source` is the Jinja text. `stop`: strings that end a reply (besides the model's end-of-turn tokens);
    `repeat_penalty`: the one to use when the caller sets none (None: the sampler's default)."""

    def __init__(self, source: str, name: str, bos_token: str = "", eos_token: str = "",
                 stop: tuple[str, ...] = (), repeat_penalty: float | None = None):
        self.name = name
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.stop = tuple(stop)
        self.repeat_penalty = repeat_penalty
        self._template = compile_template(source, name)

    @property
    def for_base_model(self) -> bool:
        return self.name == "transcript"

    @classmethod
    def for_model(cls, meta: Mapping[str, Any], file_name: str = "", bos_token: str = "", eos_token: str = "") -> ChatTemplate:
        """The template chat uses for this file: the transcript for a base model (builtin.is_base_model:
        no template of its own, no chat-tuning word in its names or `file_name`), else from_metadata."""
        if is_base_model(meta, file_name):
            return cls.builtin("transcript", bos_token, eos_token)
        return cls.from_metadata(meta, bos_token, eos_token)

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any], bos_token: str = "", eos_token: str = "") -> ChatTemplate:
        """The file's `tokenizer.chat_template` when it has one, else a built-in (see choose_builtin).

        Empty `bos_token` / `eos_token` mean "not given": they are then read from the file's vocabulary
        (tokenizer.ggml.bos_token_id / eos_token_id), and for a built-in fall back to its family's usual
        token text."""
        bos_token = bos_token or _token_text(meta, "bos")
        eos_token = eos_token or _token_text(meta, "eos")
        source = meta.get("tokenizer.chat_template")
        if source is not None:
            return cls(source, "gguf", bos_token, eos_token)
        return cls.builtin(choose_builtin(meta), bos_token, eos_token)

    @classmethod
    def builtin(cls, name: str, bos_token: str = "", eos_token: str = "") -> ChatTemplate:
        """A built-in template by name: gemma, gemma4, chatml, llama3, llama2, mistral, mistral-v7-tekken, phi3,
        phi4, phi4-mini, granite, tulu, zephyr or transcript."""
        spec: BuiltinTemplate | None = ALL_TEMPLATES.get(name)
        if spec is None:
            raise TemplateError(f"no built-in chat template '{name}' (known: {', '.join(sorted(ALL_TEMPLATES))})")
        return cls(spec.source, spec.name, bos_token or spec.default_bos, eos_token or spec.default_eos,
                   spec.stop, spec.repeat_penalty)

    def apply(self, messages: list[dict], add_generation_prompt: bool = True, *, tools: list | None = None, **variables) -> str:
        """Render the conversation. Extra keyword `variables` are passed to the template as they are."""
        context = {
            **variables,
            "messages": _validated_messages(messages),
            "add_generation_prompt": bool(add_generation_prompt),
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "tools": tools,
        }
        # Room for the conversation itself (a template may repeat it, e.g. once per turn in a summary),
        # on top of the fixed allowance for what the template adds.
        room = 2 * (text_size(context["messages"]) + text_size(tools))
        return render(self._template, self.name, context, room)

    def __repr__(self) -> str:
        return f"ChatTemplate(name={self.name!r}, {len(self.source)} chars)"
