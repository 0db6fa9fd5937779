"""Tool calls read back from a model's reply, one parser per format (chat/tools.py says which model writes
which), and the streaming of a reply's content up to where a call begins.

Each parser takes the reply's text (control tokens written out) and the request's tools, and returns
(content, [ToolCall]); it raises ValueError (or KeyError, TypeError) on a reply it cannot read, which
ToolCalling.parse turns into plain content.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field


@dataclass
class ToolCall:
    name: str
    arguments: dict
    # 9 letters and digits: Mistral's templates refuse other ids when the call comes back in the history
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:9])

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)}}


def parse_generic(text: str, tools: list):
    value = json.loads(text)
    if "response" in value:
        return str(value["response"]), []
    calls = value.get("tool_calls")
    if calls is None and "tool_call" in value:
        calls = [value["tool_call"]]
    return "", [ToolCall(c["name"], _arguments(c.get("arguments", {}))) for c in calls]

def parse_hermes(text: str, tools: list):
    start = text.find("<tool_call>")
    if start < 0:
        return text, []
    calls, decoder, pos = [], json.JSONDecoder(), start
    while True:
        pos = text.find("<tool_call>", pos)
        if pos < 0:
            break
        body_start = len(text) - len(text[pos + len("<tool_call>"):].lstrip())
        value, end = decoder.raw_decode(text, body_start)
        calls.append(ToolCall(value["name"], _arguments(value.get("arguments", value.get("parameters", {})))))
        pos = text.index("</tool_call>", end) + len("</tool_call>")
    return text[:start], calls

def parse_qwen_xml(text: str, tools: list):
    start = text.find("<tool_call>")
    if start < 0:
        return text, []
    schemas = {t.name: t.parameters.get("properties") or {} for t in tools}
    calls = []
    for block in re.finditer(r"<tool_call>\s*<function=([^>\n]+)>(.*?)</function>\s*</tool_call>", text, re.DOTALL):
        name = block.group(1).strip()
        arguments = {}
        for param in re.finditer(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", block.group(2), re.DOTALL):
            key, raw = param.group(1).strip(), param.group(2)
            sub = schemas.get(name, {}).get(key, {})
            arguments[key] = raw if isinstance(sub, dict) and sub.get("type") == "string" else json_or_text(raw)
        calls.append(ToolCall(name, arguments))
    if not calls:
        return text, []
    return text[:start], calls

def parse_llama3(text: str, tools: list):
    body = text.strip()
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>"):].strip()
    if not body.startswith("{"):
        return text, []
    value = json.loads(body)
    return "", [ToolCall(value["name"], _arguments(value.get("parameters", value.get("arguments", {}))))]

def parse_gemma4(text: str, tools: list):
    start = text.find("<|tool_call>call:")
    if start < 0:
        return text, []
    calls, pos = [], start
    while True:
        pos = text.find("<|tool_call>call:", pos)
        if pos < 0:
            break
        brace = text.index("{", pos)
        name = text[pos + len("<|tool_call>call:"):brace]
        arguments, pos = _gemma4_value(text, brace)
        if not text.startswith("<tool_call|>", pos):
            raise ValueError("a Gemma 4 call ends with <tool_call|>")
        calls.append(ToolCall(name.strip(), _arguments(arguments)))
    return text[:start], calls

def parse_harmony(text: str, tools: list):
    final = re.search(r"<\|channel\|>final<\|message\|>(.*?)(?:<\|end\|>|<\|return\|>|$)", text, re.DOTALL)
    calls, decoder = [], json.JSONDecoder()
    for found in re.finditer(r"to=functions\.([A-Za-z0-9_.\-]+)", text):
        start = text.index("<|message|>", found.end()) + len("<|message|>")
        calls.append(ToolCall(found.group(1), _arguments(decoder.raw_decode(text, start)[0])))
    if final is not None:
        return final.group(1), calls
    return ("", calls) if calls else (text, [])

def parse_mistral(text: str, tools: list):
    start = text.find("[TOOL_CALLS]")
    if start < 0:
        return text, []
    rest = text[start + len("[TOOL_CALLS]"):].strip()
    values = json.JSONDecoder().raw_decode(rest)[0]
    values = values if isinstance(values, list) else [values]
    return text[:start].strip(), [ToolCall(v["name"], _arguments(v.get("arguments", {}))) for v in values]

def parse_mistral_args(text: str, tools: list):
    start = text.find("[TOOL_CALLS]")
    if start < 0:
        return text, []
    calls, decoder = [], json.JSONDecoder()
    for piece in text[start:].split("[TOOL_CALLS]")[1:]:
        name, _, args = piece.partition("[ARGS]")
        name = name.split("[CALL_ID]")[0]  # (Mistral Small 3.2 writes an id there in its history)
        calls.append(ToolCall(name.strip(), _arguments(decoder.raw_decode(args.strip())[0])))
    return text[:start], calls


PARSERS = {"generic": parse_generic, "hermes": parse_hermes, "qwen-xml": parse_qwen_xml, "llama3": parse_llama3,
           "gemma4": parse_gemma4, "harmony": parse_harmony, "mistral": parse_mistral,
           "mistral-args": parse_mistral_args}


class ToolStream:
    """Content as it streams, held back from where a tool call may begin; calls at the end.

    feed(text) -> content safe to send now; finish() -> (the rest of the content, [ToolCall])."""

    MARKERS = {"hermes": "<tool_call>", "qwen-xml": "<tool_call>", "mistral": "[TOOL_CALLS]",
               "mistral-args": "[TOOL_CALLS]", "gemma4": "<|tool_call>"}

    def __init__(self, calling: ToolCalling):
        self.calling = calling
        self.text = ""
        self.sent = 0  # characters of self.text already sent as content

    def feed(self, piece: str) -> str:
        self.text += piece
        calling = self.calling
        if not calling.active:
            out, self.sent = self.text[self.sent:], len(self.text)
            return out
        if calling.format in ("generic", "harmony"):
            return ""  # JSON, or channels: the content is known once the reply has been parsed
        if calling.format == "llama3":
            stripped = self.text.lstrip()
            if not stripped or stripped[0] in "{<":
                return ""  # a call, if it is one, is the whole reply
        marker = self.MARKERS.get(calling.format)
        if marker is not None:
            found = self.text.find(marker)
            limit = found if found >= 0 else len(self.text) - _partial_suffix(self.text, marker)
        else:
            limit = len(self.text)
        limit = max(limit, self.sent)
        out, self.sent = self.text[self.sent:limit], limit
        return out

    def finish(self) -> tuple:
        """(the content not sent yet, [ToolCall]): the content is the text before the first call, or,
        for the generic format, the JSON's "response"."""
        content, calls = self.calling.parse(self.text)
        rest = content[self.sent:] if content[: self.sent] == self.text[: self.sent] else ""
        return rest, calls


def _partial_suffix(text: str, marker: str) -> int:
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


def _arguments(value) -> dict:
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, dict):
        raise ValueError("arguments must be an object")
    return value


_GEMMA4_QUOTE = '<|"|>'


def _gemma4_value(text: str, pos: int):
    """(the value written at text[pos:] in Gemma 4's argument syntax, the position after it)."""
    if text.startswith(_GEMMA4_QUOTE, pos):
        end = text.index(_GEMMA4_QUOTE, pos + len(_GEMMA4_QUOTE))
        return text[pos + len(_GEMMA4_QUOTE):end], end + len(_GEMMA4_QUOTE)
    if text[pos] in "{[":
        closing, out = ("}", {}) if text[pos] == "{" else ("]", [])
        pos += 1
        while text[pos] != closing:
            if isinstance(out, dict):
                colon = text.index(":", pos)
                key = text[pos:colon].strip()
                if key.startswith(_GEMMA4_QUOTE) and key.endswith(_GEMMA4_QUOTE):
                    key = key[len(_GEMMA4_QUOTE):-len(_GEMMA4_QUOTE)]
                out[key], pos = _gemma4_value(text, colon + 1)
            else:
                item, pos = _gemma4_value(text, pos)
                out.append(item)
            if text[pos] == ",":
                pos += 1
            elif text[pos] != closing:
                raise ValueError(f"unexpected {text[pos]!r} in Gemma 4 arguments")
        return out, pos + 1
    end = pos
    while end < len(text) and text[end] not in ",}]":
        end += 1
    word = text[pos:end].strip()
    words = {"true": True, "false": False, "null": None, "None": None}
    return (words[word] if word in words else json.loads(word)), end


def json_or_text(raw: str):
    try:
        return json.loads(raw)
    except ValueError:
        return raw


