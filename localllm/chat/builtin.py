"""Built-in chat templates, for GGUF files that carry no `tokenizer.chat_template`.

Each is a Jinja template written for localllm that renders the same text as the family's official
template (the `chat_template` of the models' tokenizer_config.json on Hugging Face) for conversations
of plain-text system/user/assistant messages; tests/chat/test_templates.py checks that against the official
texts kept in tests/data/chat_templates/. They are rendered by the same sandbox as a file's own
template, with the variables HF passes (messages, add_generation_prompt, bos_token, eos_token).

Formats, for a conversation [system S, user U1, assistant A1, user U2] with a generation prompt
(`\n` is a newline):

    gemma    <bos><start_of_turn>user\nS\n\nU1<end_of_turn>\n<start_of_turn>model\nA1<end_of_turn>\n
             <start_of_turn>user\nU2<end_of_turn>\n<start_of_turn>model\n
             (Gemma 2/3: no system role, the system text opens the first user turn; contents trimmed)
    chatml   <|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n ... <|im_start|>assistant\n
    llama3   <|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|> ...
             <|start_header_id|>assistant<|end_header_id|>\n\n     (contents trimmed)
    llama2   <s>[INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST] A1 </s><s>[INST] U2 [/INST]   (trimmed)
    mistral  <s> [INST] S\n\nU1 [/INST] A1</s> [INST] U2 [/INST]     (Mistral tokenizer "v1")
    phi3     <|system|>\nS<|end|>\n<|user|>\nU1<|end|>\n<|assistant|>\nA1<|end|>\n ... <|assistant|>\n
    zephyr   <|system|>\nS</s>\n<|user|>\nU1</s>\n<|assistant|>\nA1</s>\n ... <|assistant|>\n
    gemma4   <bos><|turn>system\nS<turn|>\n<|turn>user\nU1<turn|>\n<|turn>model\nA1<turn|>\n ...
             <|turn>model\n<|channel>thought\n<channel|>      (Gemma 4; thinking off: an empty thought; trimmed)
    phi4     <|im_start|>system<|im_sep|>S<|im_end|><|im_start|>user<|im_sep|>U1<|im_end|> ...
             <|im_start|>assistant<|im_sep|>                   (Phi-4 14B)
    phi4-mini  <|system|>S<|end|><|user|>U1<|end|><|assistant|>A1<|end|> ... <|assistant|>   (Phi-4-mini)
    granite  <|start_of_role|>system<|end_of_role|>S<|end_of_text|>\n ... <|start_of_role|>assistant<|end_of_role|>
    mistral-v7-tekken  <s>[SYSTEM_PROMPT]S[/SYSTEM_PROMPT][INST]U1[/INST]A1</s>[INST]U2[/INST]
             (Mistral Small 3.x, Ministral 3: tokenizer "v7" with the Tekken vocabulary, no spaces)
    tulu     <|endoftext|><|system|>\nS\n<|user|>\nU1\n<|assistant|>\nA1<|endoftext|>\n ... <|assistant|>\n
             (OLMo 2 Instruct, Tulu 3: the EOS text closes each assistant turn)

llama2, mistral and mistral-v7-tekken end with "[/INST]" whether or not a generation prompt is asked for
(that is their prompt); phi3 and phi4-mini end with EOS when none is asked for, as their official templates
do. Where an official template adds a default system prompt when none is given (Granite 3.x, Mistral
Small 3.2, Ministral 3), the built-in adds none: it renders what the conversation holds. Templates whose
official form insists on alternating user/assistant turns raise (via raise_exception) when they do not.

A base model (no template, no chat-tuning word in its names: is_base_model) gets none of those but
TRANSCRIPT, localllm's own plain-text format, with the stop string and repetition penalty it needs:

    transcript  <preamble>\nS\n\nUser: <example>\nAssistant: <example>\n ... User: U1\nAssistant: A1\n
                User: U2\nAssistant:          (stop at "\nUser:"; repeat penalty 1.1 unless set)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BuiltinTemplate:
    name: str
    source: str
    # Used when neither the caller nor the file's metadata names the BOS/EOS token text.
    default_bos: str
    default_eos: str
    # Stop strings every generation from this template honours (the end of a turn that no special token marks).
    stop: tuple[str, ...] = ()
    # The repetition penalty used when the caller sets none (None: the sampler's own default, 1.0 = off).
    repeat_penalty: float | None = None


# Shared piece: split a leading system message off, leaving `turns` to loop over.
_SPLIT_SYSTEM = """\
{%- if messages[0]['role'] == 'system' -%}
    {%- set system_text = messages[0]['content'] -%}
    {%- set turns = messages[1:] -%}
{%- else -%}
    {%- set system_text = none -%}
    {%- set turns = messages -%}
{%- endif -%}
"""

# After the optional system message, user turns at even positions and assistant turns at odd ones.
_REQUIRE_ALTERNATION = """\
    {%- if (message['role'] == 'user') != (loop.index0 is even) -%}
        {{- raise_exception('roles must alternate user/assistant/user/... after an optional first system message') -}}
    {%- endif -%}
"""

GEMMA = BuiltinTemplate(
    name="gemma",
    default_bos="<bos>",
    default_eos="<eos>",
    source="{{- bos_token -}}\n"
    + _SPLIT_SYSTEM
    + """\
{%- for message in turns -%}
"""
    + _REQUIRE_ALTERNATION
    + """\
    {%- set speaker = 'model' if message['role'] == 'assistant' else message['role'] -%}
    {{- '<start_of_turn>' + speaker + '\\n' -}}
    {%- if loop.first and system_text is not none -%}{{- system_text + '\\n\\n' -}}{%- endif -%}
    {{- message['content'] | trim -}}
    {{- '<end_of_turn>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<start_of_turn>model\\n' -}}
{%- endif -%}
""",
)

CHATML = BuiltinTemplate(
    name="chatml",
    default_bos="",
    default_eos="<|im_end|>",
    source="""\
{%- for message in messages -%}
    {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\\n' -}}
{%- endif -%}
""",
)

LLAMA3 = BuiltinTemplate(
    name="llama3",
    default_bos="<|begin_of_text|>",
    default_eos="<|eot_id|>",
    source="""\
{{- bos_token -}}
{%- for message in messages -%}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' -}}
    {{- message['content'] | trim -}}
    {{- '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
{%- endif -%}
""",
)

LLAMA2 = BuiltinTemplate(
    name="llama2",
    default_bos="<s>",
    default_eos="</s>",
    source=_SPLIT_SYSTEM
    + """\
{%- for message in turns -%}
"""
    + _REQUIRE_ALTERNATION
    + """\
    {%- set text = message['content'] -%}
    {%- if loop.first and system_text is not none -%}
        {%- set text = '<<SYS>>\\n' + system_text + '\\n<</SYS>>\\n\\n' + text -%}
    {%- endif -%}
    {%- if message['role'] == 'user' -%}
        {{- bos_token + '[INST] ' + (text | trim) + ' [/INST]' -}}
    {%- elif message['role'] == 'assistant' -%}
        {{- ' ' + (text | trim) + ' ' + eos_token -}}
    {%- endif -%}
{%- endfor -%}
""",
)

MISTRAL = BuiltinTemplate(
    name="mistral",
    default_bos="<s>",
    default_eos="</s>",
    source=_SPLIT_SYSTEM
    + """\
{{- bos_token -}}
{%- for message in turns -%}
"""
    + _REQUIRE_ALTERNATION
    + """\
    {%- if message['role'] == 'user' -%}
        {{- ' [INST] ' -}}
        {%- if loop.first and system_text is not none -%}{{- system_text + '\\n\\n' -}}{%- endif -%}
        {{- message['content'] + ' [/INST]' -}}
    {%- elif message['role'] == 'assistant' -%}
        {{- ' ' + message['content'] + eos_token -}}
    {%- else -%}
        {{- raise_exception('only user and assistant turns may follow the optional first system message') -}}
    {%- endif -%}
{%- endfor -%}
""",
)

PHI3 = BuiltinTemplate(
    name="phi3",
    default_bos="<s>",
    default_eos="<|endoftext|>",
    source="""\
{%- for message in messages -%}
    {%- if message['role'] in ('system', 'user', 'assistant') -%}
        {{- '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|assistant|>\\n' -}}
{%- else -%}
    {{- eos_token -}}
{%- endif -%}
""",
)

ZEPHYR = BuiltinTemplate(
    name="zephyr",
    default_bos="<s>",
    default_eos="</s>",
    source="""\
{%- for message in messages -%}
    {%- if message['role'] in ('system', 'user', 'assistant') -%}
        {{- '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|assistant|>\\n' -}}
{%- endif -%}
""",
)

GEMMA4 = BuiltinTemplate(
    name="gemma4",
    default_bos="<bos>",
    default_eos="<eos>",
    source="{{- bos_token -}}\n"
    + _SPLIT_SYSTEM
    + """\
{%- if system_text is not none -%}
    {{- '<|turn>system\\n' + (system_text | trim) + '<turn|>\\n' -}}
{%- endif -%}
{%- for message in turns -%}
    {%- set speaker = 'model' if message['role'] == 'assistant' else message['role'] -%}
    {{- '<|turn>' + speaker + '\\n' + (message['content'] | trim) + '<turn|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|turn>model\\n<|channel>thought\\n<channel|>' -}}
{%- endif -%}
""",
)

PHI4 = BuiltinTemplate(
    name="phi4",
    default_bos="<|endoftext|>",
    default_eos="<|im_end|>",
    source="""\
{%- for message in messages -%}
    {%- if message['role'] in ('system', 'user', 'assistant') -%}
        {{- '<|im_start|>' + message['role'] + '<|im_sep|>' + message['content'] + '<|im_end|>' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant<|im_sep|>' -}}
{%- endif -%}
""",
)

PHI4_MINI = BuiltinTemplate(
    name="phi4-mini",
    default_bos="<|endoftext|>",
    default_eos="<|endoftext|>",
    source="""\
{%- for message in messages -%}
    {{- '<|' + message['role'] + '|>' + message['content'] + '<|end|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|assistant|>' -}}
{%- else -%}
    {{- eos_token -}}
{%- endif -%}
""",
)

GRANITE = BuiltinTemplate(
    name="granite",
    default_bos="<|end_of_text|>",
    default_eos="<|end_of_text|>",
    source="""\
{%- for message in messages -%}
    {{- '<|start_of_role|>' + message['role'] + '<|end_of_role|>' + message['content'] + '<|end_of_text|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|start_of_role|>assistant<|end_of_role|>' -}}
{%- endif -%}
""",
)

MISTRAL_V7_TEKKEN = BuiltinTemplate(
    name="mistral-v7-tekken",
    default_bos="<s>",
    default_eos="</s>",
    source=_SPLIT_SYSTEM
    + """\
{{- bos_token -}}
{%- if system_text is not none -%}{{- '[SYSTEM_PROMPT]' + system_text + '[/SYSTEM_PROMPT]' -}}{%- endif -%}
{%- for message in turns -%}
"""
    + _REQUIRE_ALTERNATION
    + """\
    {%- if message['role'] == 'user' -%}
        {{- '[INST]' + message['content'] + '[/INST]' -}}
    {%- elif message['role'] == 'assistant' -%}
        {{- message['content'] + eos_token -}}
    {%- endif -%}
{%- endfor -%}
""",
)

TULU = BuiltinTemplate(
    name="tulu",
    default_bos="<|endoftext|>",
    default_eos="<|endoftext|>",
    source="""\
{{- bos_token -}}
{%- for message in messages -%}
    {%- if message['role'] == 'assistant' -%}
        {{- '<|assistant|>\\n' + message['content'] + eos_token + ('' if loop.last else '\\n') -}}
    {%- elif message['role'] in ('system', 'user') -%}
        {{- '<|' + message['role'] + '|>\\n' + message['content'] + '\\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|assistant|>\\n' -}}
{%- endif -%}
""",
)

# For a base (pretrained, not instruction-tuned) model, which never saw any turn markers: a plain-text
# transcript it can continue, the way such models were prompted before chat fine-tuning. A preamble says what
# the text is, two short exchanges show the length and tone of an answer, and the conversation follows as
# "User: ...\nAssistant: ...". The prompt ends with "Assistant:" (no trailing space: SentencePiece and BPE
# vocabularies fold the space into the next word's token), and the reply ends where the model starts writing
# the next "\nUser:" line. A system message joins the preamble. Base models drift into loops more easily than
# tuned ones, hence a mild repetition penalty unless the caller sets one.
TRANSCRIPT = BuiltinTemplate(
    name="transcript",
    default_bos="",
    default_eos="",
    stop=("\nUser:",),
    repeat_penalty=1.1,
    source=_SPLIT_SYSTEM
    + """\
{{- 'This is a conversation between a curious user and a helpful, knowledgeable assistant. '
    'The assistant answers each question correctly, clearly and briefly.\\n' -}}
{%- if system_text is not none -%}{{- (system_text | trim) + '\\n' -}}{%- endif -%}
{{- '\\nUser: How many days are there in a week?\\n' -}}
{{- 'Assistant: There are seven days in a week.\\n' -}}
{{- 'User: What colour do you get by mixing blue and yellow?\\n' -}}
{{- 'Assistant: Mixing blue and yellow gives green.\\n' -}}
{%- for message in turns -%}
    {%- if message['role'] == 'user' -%}
        {{- 'User: ' + (message['content'] | trim) + '\\n' -}}
    {%- elif message['role'] == 'assistant' -%}
        {{- 'Assistant: ' + (message['content'] | trim) + '\\n' -}}
    {%- else -%}
        {{- (message['content'] | trim) + '\\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- 'Assistant:' -}}
{%- endif -%}
""",
)

# The families' formats, each checked against its official template (tests/chat/test_templates.py) ...
BUILTINS: dict[str, BuiltinTemplate] = {
    t.name: t
    for t in (GEMMA, CHATML, LLAMA3, LLAMA2, MISTRAL, PHI3, ZEPHYR, GEMMA4, PHI4, PHI4_MINI, GRANITE, MISTRAL_V7_TEKKEN, TULU)
}
# ... and every template that can be asked for by name: those, plus localllm's own transcript for base models.
ALL_TEMPLATES: dict[str, BuiltinTemplate] = {**BUILTINS, TRANSCRIPT.name: TRANSCRIPT}


# -- choosing a built-in -------------------------------------------------------------------------------------

_HINT_TOKENS = (
    "<start_of_turn>", "<|im_start|>", "<|start_header_id|>", "[INST]", "<|user|>", "<|end|>",
    "<|turn>", "<|im_sep|>", "<|tool|>", "<|start_of_role|>", "[SYSTEM_PROMPT]",
)


def _vocabulary_hints(meta: Mapping[str, Any]) -> set[str]:
    """Which of the telltale special tokens the file's vocabulary has (one pass over it)."""
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is None or isinstance(tokens, (str, bytes)):
        return set()
    try:
        return set(_HINT_TOKENS).intersection(tokens)
    except TypeError:  # unhashable elements: not a token list
        return set()


def _named_tulu_style(meta: Mapping[str, Any]) -> bool:
    """OLMo 2 Instruct and Tulu 3, whose format no special token gives away (their `<|user|>` is plain
    text, and the OLMo 2 vocabulary has an unused `<|im_start|>`): known by name, as zephyr is."""
    words = [w for key in _NAME_FIELDS for w in _words(str(meta.get(key) or ""))]
    pairs = set(zip(words, words[1:]))
    return "tulu" in words or "olmo2" in words or ("olmo", "2") in pairs


def choose_builtin(meta: Mapping[str, Any]) -> str:
    """The built-in template for a file without its own: by vocabulary hints first where a family's turn
    tokens are its own, then by architecture, then by the other hints.

    `<|turn>` -> gemma4; gemma/gemma2/gemma3 -> gemma; qwen2/qwen3 -> chatml; `<|im_sep|>` -> phi4 and
    `<|tool|>` with `<|end|>` -> phi4-mini (both are architecture phi3); phi3 -> phi3; `<|start_of_role|>`
    -> granite; OLMo 2 / Tulu by name -> tulu; llama -> llama3 when the vocabulary has
    <|start_header_id|>, chatml when it has <|im_start|>, mistral-v7-tekken when it has [SYSTEM_PROMPT],
    mistral when it has [INST], zephyr for a model named so, else llama2. Unknown architectures go by the
    same token hints; chatml is the last resort (as in llama.cpp)."""
    arch = str(meta.get("general.architecture") or "").lower()
    model_name = str(meta.get("general.name") or "").lower()
    pre = str(meta.get("tokenizer.ggml.pre") or "").lower()
    hints = _vocabulary_hints(meta)
    if "<|turn>" in hints:
        return "gemma4"
    if arch.startswith("gemma"):
        return "gemma"
    if arch.startswith("qwen"):
        return "chatml"
    if "<|im_sep|>" in hints:
        return "phi4"
    if {"<|tool|>", "<|end|>"} <= hints:
        return "phi4-mini"
    if arch.startswith("phi3"):
        return "phi3"
    if "<start_of_turn>" in hints:
        return "gemma"
    if "<|start_of_role|>" in hints:
        return "granite"
    if _named_tulu_style(meta):
        return "tulu"
    if "<|start_header_id|>" in hints or pre in ("llama-bpe", "llama3"):
        return "llama3"
    if "<|im_start|>" in hints or pre.startswith("qwen"):
        return "chatml"
    if {"<|user|>", "<|end|>"} <= hints:
        return "phi3"
    if "[SYSTEM_PROMPT]" in hints:
        return "mistral-v7-tekken"
    if "[INST]" in hints or arch == "mistral":
        return "mistral"
    if "zephyr" in model_name:
        return "zephyr"
    if arch == "llama":
        return "llama2"
    return "chatml"



# -- base or instruction-tuned -------------------------------------------------------------------------------

# Words that mark a fine-tune for conversation in a model's name ("gemma-3-270m-it", "Llama-3.2-1B-Instruct",
# "TinyLlama-1.1B-Chat-v1.0", "Qwen2.5-7B-Instruct") or in general.finetune, which convert_hf_to_gguf.py
# fills from the same name ("it", "instruct", "chat").
_TUNED_WORDS = frozenset({"it", "instruct", "instruction", "chat", "sft", "dpo", "rlhf", "orpo", "zephyr", "hermes"})
_NAME_FIELDS = ("general.name", "general.finetune", "general.basename")


def _words(text: str) -> list[str]:
    """Lower-case words: 'Gemma 3 270m-it.Q4_K_M' -> ['gemma', '3', '270m', 'it', 'q4', 'k', 'm']."""
    return [w for w in re.split(r"[^a-z0-9]+", text.lower()) if w]


def looks_instruction_tuned(meta: Mapping[str, Any], file_name: str = "") -> bool:
    """Whether the model's name, fine-tune or base name fields, or its file name, carry a chat-tuning word.

    A word, not a substring: "it" must stand alone ("gemma-3-270m-it", not "italian"); "instruct" and
    "chat" may start a word ("Instruct2", "chatml")."""
    texts = [str(meta.get(key) or "") for key in _NAME_FIELDS] + [file_name]
    for word in (w for text in texts for w in _words(text)):
        if word in _TUNED_WORDS or word.startswith(("instruct", "chat")):
            return True
    return False


def is_base_model(meta: Mapping[str, Any], file_name: str = "") -> bool:
    """A pretrained model that was never taught a chat format, so it gets the TRANSCRIPT template.

    The rule: the file carries no `tokenizer.chat_template` AND neither its metadata names (general.name,
    general.finetune, general.basename) nor its file name say it was tuned (looks_instruction_tuned).
    A file with a template keeps it: whoever converted it knew the model's format. The architecture and the
    vocabulary do not decide: a base Gemma 3 has `<start_of_turn>` in its vocabulary (shared with the "it"
    model) without ever having been trained on it, so with the Gemma turn template it loops ("What is the
    capital of Australia? bertanya" x57); the shipped gemma-3-270m file is such a file (general.name
    "Gemma 3 270m", no finetune field, no template)."""
    if meta.get("tokenizer.chat_template") is not None:
        return False
    return not looks_instruction_tuned(meta, file_name)
