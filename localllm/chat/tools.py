"""Tool calling: tools rendered into the prompt, the output constrained when a call is required, and the
calls parsed back out of the model's text (chat/tool_output.py).

A model's chat template decides the format. Those whose formats are known are recognised by what their
template writes (llama.cpp's common/chat.cpp recognises them the same way):

- `hermes` (Qwen 2.5 and 3, Hermes, SmolLM3): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
- `qwen-xml` (Qwen3.5, Qwen3-Coder): `<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>
  ...</function>\\n</tool_call>`, string values raw, others as JSON
- `llama3` (Llama 3.1, 3.2, 3.3): `{"name": ..., "parameters": {...}}` as the whole reply
- `mistral` (Mistral Nemo): `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`
- `mistral-args` (Mistral Small 3.2, Ministral 3, Devstral): `[TOOL_CALLS]NAME[ARGS]{...}`, repeated
- `gemma4` (Gemma 4): `<|tool_call>call:NAME{key:value,...}<tool_call|>`, repeated; keys bare and sorted,
  strings between `<|"|>` marks; the reply stops at `<|tool_response>` (where the results would go)
- `harmony` (gpt-oss): `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}`, the
  call ended by `<|call|>`; the reply's content is its `final` channel
- `generic`: every other template, the base-model transcript included (Gemma 3, Phi-4, ...). The tools
  and the answer format are described in a system message, and the reply is JSON, always constrained by
  a grammar: `{"tool_calls": [{"name": ..., "arguments": {...}}]}` or `{"response": "..."}` (llama.cpp's
  "generic" format does the same).

tool_choice: `auto` (the model decides; native formats decode freely and their calls are parsed),
`none` (no tools in the prompt, plain text), `required` (at least one call) or a named function (exactly
that one). With `required` or a name, decoding is constrained by a grammar built from the functions'
parameter schemas (grammar/json_schema.py), so the arguments always parse and validate; a required
reply holds 1 to MAX_PARALLEL_CALLS calls (1 with parallel_tool_calls false or a named function).

The markers are control tokens in some vocabularies ([TOOL_CALLS]), so a request with tools is decoded
with control tokens written out (`ToolCalling.special`), and its grammar matches them by their text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import LocalLLMError
from .tool_output import PARSERS, ToolCall, ToolStream, json_or_text

__all__ = ["Tool", "ToolCall", "ToolCalling", "ToolError", "ToolStream", "detect_format", "parse_tool_choice",
           "parse_tools"]

TOOL_CHOICES = ("auto", "none", "required")
# Calls in one reply when a grammar writes them (tool_choice required): a model that repeats itself (a
# base model does) would otherwise write calls until its token budget ends, and none would parse.
MAX_PARALLEL_CALLS = 4


class ToolError(LocalLLMError):
    """Tools or a tool choice that cannot be used (the server answers 400)."""


@dataclass
class Tool:
    name: str
    description: str
    parameters: dict  # JSON schema of the arguments (an object)

    def as_openai(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


def parse_tools(tools: Any) -> list:
    """OpenAI's `tools` ([{"type": "function", "function": {name, description, parameters}}]) checked."""
    if not isinstance(tools, list) or not tools:
        raise ToolError("'tools' must be a non-empty list of {'type': 'function', 'function': {...}}")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(tool.get("function"), dict):
            raise ToolError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}")
        fn = tool["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ToolError(f"tools[{i}].function.name must be 1-64 letters, digits, '_', '.' or '-' (got {name!r})")
        parameters = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise ToolError(f"tools[{i}].function.parameters must be a JSON schema object")
        description = fn.get("description", "")
        if not isinstance(description, str):
            raise ToolError(f"tools[{i}].function.description must be a string")
        if any(t.name == name for t in out):
            raise ToolError(f"two tools are named {name!r}")
        out.append(Tool(name, description, parameters))
    return out


def parse_tool_choice(choice: Any, tools: list) -> Optional[str]:
    """"auto", "none", "required", or the name of the function a named choice asks for."""
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise ToolError(f"tool_choice must be one of {', '.join(TOOL_CHOICES)} or a named function (got {choice!r})")
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if not any(t.name == name for t in tools):
            raise ToolError(f"tool_choice names {name!r}, which is not one of the tools")
        return "function:" + name
    raise ToolError("tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}")


# -- formats --------------------------------------------------------------------------------------------------------


def detect_format(template_source: str) -> str:
    """The tool-call format a chat template writes (module docstring)."""
    if "<tool_call>" in template_source and "<function=" in template_source:
        return "qwen-xml"
    if "<tool_call>" in template_source:
        return "hermes"
    if "[TOOL_CALLS]" in template_source:
        return "mistral-args" if "[ARGS]" in template_source else "mistral"
    if "<|tool_call>" in template_source:
        return "gemma4"
    if "<|channel|>" in template_source and "functions." in template_source:
        return "harmony"
    if "<|start_header_id|>" in template_source and '"parameters": ' in template_source:
        return "llama3"
    return "generic"


def _arguments_schema(tool: Tool) -> dict:
    schema = dict(tool.parameters)
    schema.setdefault("type", "object")
    return schema


class ToolCalling:
    """One request's tools: how its prompt is rendered, what grammar (if any) constrains the reply, and
    how the reply becomes content and tool calls."""

    def __init__(self, template, tools: list, choice: str = "auto", parallel: bool = True):
        self.template = template
        self.tools = tools
        self.choice = choice
        self.parallel = parallel
        self.format = "generic" if template.for_base_model else detect_format(template.source)

    @property
    def active(self) -> bool:
        return self.choice != "none"

    @property
    def stop(self) -> list:
        """Stop strings the format needs: Gemma 4 goes on to write the tool's response itself."""
        return ["<|tool_response>"] if self.active and self.format == "gemma4" else []

    @property
    def special(self) -> bool:
        """Decode with control tokens written out (a native format's markers may be control tokens)."""
        return self.active and self.format != "generic"

    def _called_tools(self) -> list:
        if self.choice.startswith("function:"):
            return [t for t in self.tools if t.name == self.choice.split(":", 1)[1]]
        return self.tools

    # -- the prompt ------------------------------------------------------------------------------------------
    def render(self, messages: list, add_generation_prompt: bool = True) -> str:
        """The prompt text: the template with its `tools` (native formats), or the conversation with the
        tools and the JSON answer format described in a system message (generic)."""
        messages = [_for_template(m, mistral_ids=self.format.startswith("mistral")) for m in messages]
        if not self.active:
            return self.template.apply(_as_plain(messages), add_generation_prompt=add_generation_prompt)
        if self.format != "generic":
            tools = [t.as_openai() for t in self.tools]
            return self.template.apply(messages, add_generation_prompt=add_generation_prompt, tools=tools)
        return self.template.apply(self._generic_messages(messages), add_generation_prompt=add_generation_prompt)

    def _generic_messages(self, messages: list) -> list:
        described = json.dumps([{"name": t.name, "description": t.description, "parameters": t.parameters}
                                for t in self._called_tools()], ensure_ascii=False, indent=2)
        if self.choice == "auto":
            how = ('Answer with one JSON object: {"tool_calls": [{"name": ..., "arguments": {...}}]} to call '
                   'tools, or {"response": "..."} to reply to the user.')
        else:
            how = 'Answer with one JSON object: {"tool_calls": [{"name": ..., "arguments": {...}}]}.'
        text = f"You can call these tools:\n{described}\n\n{how}"
        plain = _as_plain(messages)
        if plain and plain[0]["role"] == "system":
            return [{"role": "system", "content": plain[0]["content"] + "\n\n" + text}] + plain[1:]
        return [{"role": "system", "content": text}] + plain

    # -- the grammar ---------------------------------------------------------------------------------------------
    def grammar(self) -> Optional[str]:
        """GBNF for the reply: always for the generic format, for native ones when a call is required."""
        from ..grammar.json_schema import GrammarBuilder, gbnf_literal

        if not self.active or (self.format != "generic" and self.choice == "auto"):
            return None
        builder = GrammarBuilder("gemma4" if self.format == "gemma4" else "json")
        builder.primitive("space")
        tools = self._called_tools()
        if self.format == "qwen-xml":
            return builder.text(self._qwen_xml_root(builder, tools))
        calls = []
        for tool in tools:
            args = builder.schema(_arguments_schema(tool), f"{tool.name}-args")
            if self.format == "gemma4":
                body = f'{gbnf_literal("<|tool_call>call:" + tool.name)} {args} {gbnf_literal("<tool_call|>")}'
            elif self.format == "harmony":
                body = (f'{gbnf_literal("<|channel|>commentary to=functions." + tool.name)} '
                        f'{gbnf_literal(" <|constrain|>json<|message|>")} {args}')
            elif self.format == "llama3":
                body = f'"{{" space "\\"name\\"" space ":" space {gbnf_literal(json.dumps(tool.name))} space "," space "\\"parameters\\"" space ":" space {args} "}}" space'
            elif self.format == "mistral-args":
                body = f"{gbnf_literal(tool.name)} {gbnf_literal('[ARGS]')} {args}"
            else:
                body = f'"{{" space "\\"name\\"" space ":" space {gbnf_literal(json.dumps(tool.name))} space "," space "\\"arguments\\"" space ":" space {args} "}}" space'
            calls.append(builder.rule(f"{tool.name}-call", body))
        builder.rule("call", " | ".join(calls))
        many = self.parallel and not self.choice.startswith("function:")  # a named choice: that one call
        if self.format == "generic":
            listed = f'"[" space call ("," space call){{0,{MAX_PARALLEL_CALLS - 1}}} "]" space' if many else '"[" space call "]" space'
            body = f'"{{" space "\\"tool_calls\\"" space ":" space {listed} "}}" space'
            if self.choice == "auto":
                builder.primitive("string")
                body = f'( {body} | "{{" space "\\"response\\"" space ":" space string "}}" space )'
            return builder.text(body)
        if self.format == "gemma4":
            return builder.text(f"call{{1,{MAX_PARALLEL_CALLS}}}" if many else "call")
        if self.format == "hermes":
            one = '"<tool_call>" space call "</tool_call>" space'
            return builder.text(f"( {one} ){{1,{MAX_PARALLEL_CALLS}}}" if many else one)
        if self.format in ("llama3", "harmony"):  # one call a reply (a harmony call ends the message)
            return builder.text("call")
        if self.format == "mistral":
            return builder.text(f'"[TOOL_CALLS]" "[" space call ("," space call){{0,{MAX_PARALLEL_CALLS - 1}}} "]" space' if many else
                                '"[TOOL_CALLS]" "[" space call "]" space')
        if self.format == "mistral-args":
            return builder.text(f'( "[TOOL_CALLS]" call ){{1,{MAX_PARALLEL_CALLS}}}' if many else '"[TOOL_CALLS]" call')
        raise ToolError(f"no grammar for tool format {self.format!r}")

    def _qwen_xml_root(self, builder, tools: list) -> str:
        """<tool_call>\\n<function=NAME>\\n(<parameter=KEY>\\nVALUE\\n</parameter>\\n)*</function>\\n</tool_call>"""
        from ..grammar.json_schema import gbnf_literal

        calls = []
        for tool in tools:
            schema = _arguments_schema(tool)
            properties = schema.get("properties") or {}
            required = set(schema.get("required") or [])
            parts = []
            for key, sub in properties.items():
                if isinstance(sub, dict) and sub.get("type") == "string":
                    # written raw, without quotes; no '<' (it could begin the closing tag)
                    low, high = sub.get("minLength", 0), sub.get("maxLength")
                    value = builder.rule(f"{tool.name}-{key}-raw", f"[^<]{{{low},{'' if high is None else high}}}")
                else:
                    value = builder.schema(sub, f"{tool.name}-{key}")
                param = builder.rule(f"{tool.name}-{key}-param",
                                     f'{gbnf_literal(f"<parameter={key}>")} "\\n" {value} "\\n" "</parameter>" "\\n"')
                parts.append(param if key in required else f"{param}?")
            body = f'{gbnf_literal(f"<function={tool.name}>")} "\\n" {" ".join(parts)} "</function>"'
            calls.append(builder.rule(f"{tool.name}-call", body))
        builder.rule("call", " | ".join(calls))
        one = '"<tool_call>" "\\n" call "\\n" "</tool_call>" space'
        many = self.parallel and not self.choice.startswith("function:")
        return f"( {one} ){{1,{MAX_PARALLEL_CALLS}}}" if many else one

    # -- the reply ---------------------------------------------------------------------------------------------------
    def parse(self, text: str) -> tuple:
        """(content, [ToolCall]) of a complete reply. Text that is not a well-formed call of a known
        tool stays content (the model chose to answer, or wrote something else)."""
        if not self.active:
            return text, []
        try:
            parsed = PARSERS[self.format](text, self.tools)
        except (ValueError, KeyError, TypeError, AttributeError):
            return text, []
        content, calls = parsed
        known = {t.name for t in self.tools}
        if any(c.name not in known for c in calls):
            return text, []
        return content, calls

    # -- streaming --------------------------------------------------------------------------------------------------
    def stream(self) -> "ToolStream":
        return ToolStream(self)


def _for_template(message: dict, mistral_ids: bool = False) -> dict:
    """A message as chat templates read it: tool call arguments as objects (templates write them with
    tojson), content a string; with `mistral_ids`, call ids as the 9 letters and digits Mistral's
    templates require (another client's ids mapped to such, the same way for a call and its result)."""
    out = dict(message)
    if out.get("content") is None:
        out["content"] = ""
    calls = out.get("tool_calls")
    if calls:
        converted = []
        for call in calls:
            fn = dict(call.get("function") or {})
            if isinstance(fn.get("arguments"), str):
                fn["arguments"] = json_or_text(fn["arguments"])
            converted.append({**call, "function": fn})
            if mistral_ids:
                converted[-1]["id"] = _nine_characters(str(call.get("id") or ""))
        out["tool_calls"] = converted
    if mistral_ids and isinstance(out.get("tool_call_id"), str):
        out["tool_call_id"] = _nine_characters(out["tool_call_id"])
    return out


def _nine_characters(call_id: str) -> str:
    if re.fullmatch(r"[A-Za-z0-9]{9}", call_id):
        return call_id
    import hashlib

    return hashlib.sha256(call_id.encode()).hexdigest()[:9]


def _as_plain(messages: list) -> list:
    """Messages for a template that knows no tools: an assistant's calls written as the generic format's
    JSON, tool results as a user message (merged with a following one: some templates need roles to
    alternate)."""
    out: list = []
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if role == "assistant" and message.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": c["function"].get("arguments", {})}
                     for c in message["tool_calls"]]
            content = json.dumps({"tool_calls": calls}, ensure_ascii=False)
        elif role == "tool":
            name = message.get("name") or message.get("tool_call_id") or "tool"
            role, content = "user", json.dumps({"tool_response": {"name": name, "content": content}}, ensure_ascii=False)
        if out and out[-1]["role"] == role == "user":
            out[-1] = {"role": "user", "content": out[-1]["content"] + "\n" + content}
        else:
            out.append({"role": role, "content": content})
    return out
