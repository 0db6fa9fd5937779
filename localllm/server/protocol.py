"""OpenAI request bodies -> engine requests, engine events -> OpenAI response objects.

Validation is strict about types (a wrong type is a 400 naming the field, as OpenAI answers) and
lenient about fields we do not use (ignored, as OpenAI ignores unknown fields of older clients).
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Any, Optional

from ..engine.batching import GenerationRequest, QueueFull
from ..errors import ContextOverflow, LocalLLMError
from ..sampling import SamplingConfig

MAX_STOP_STRINGS = 4
# Seconds a client refused with a full queue is told to wait (Retry-After): about a short reply's time.
QUEUE_FULL_RETRY_AFTER = "1"
MAX_TOP_LOGPROBS = 20


class APIError(LocalLLMError):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: Optional[str] = None,
                 code: Optional[str] = None, retry_after: Optional[str] = None):
        super().__init__(message)
        self.status = status
        self.type = type
        self.param = param
        self.code = code
        self.retry_after = retry_after  # seconds, sent as Retry-After (a busy server: 503, 429)

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.type, "param": self.param, "code": self.code}}


def invalid(message: str, param: Optional[str] = None, code: Optional[str] = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def as_api_error(exc: Exception) -> APIError:
    """Any failure of a request as the API error it is answered with (OpenAI's and Ollama's handlers)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ContextOverflow):
        return APIError(413, str(exc), param="messages", code="context_length_exceeded")
    if isinstance(exc, QueueFull):
        return APIError(503, str(exc), type="server_error", code="queue_full", retry_after=QUEUE_FULL_RETRY_AFTER)
    if isinstance(exc, LocalLLMError):
        return invalid(str(exc))
    if isinstance(exc, UnicodeEncodeError):  # JSON may carry lone surrogates ("\ud800"): not text to tokenize
        return invalid(f"the request's text is not valid Unicode: {exc.reason} ({exc.object[exc.start:exc.end]!r})")
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error")


# -- field readers ---------------------------------------------------------------------------------------------

MAX_QUOTED_CHARS = 80


def _quoted(value) -> str:
    """repr(value) for an error message, cut to MAX_QUOTED_CHARS (a wrong field may hold megabytes)."""
    text = repr(value)
    return text if len(text) <= MAX_QUOTED_CHARS else text[: MAX_QUOTED_CHARS - 3] + "..."


def _limit(value) -> str:
    """A bound as a user reads it: 2147483648 and -2, not 2147483648.0 and -2.0."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _out_of_range(name: str, value, low, high) -> APIError:
    return invalid(f"'{name}' must be between {_limit(low)} and {_limit(high)} (got {_quoted(value)})", name)


def _number(body: dict, name: str, default, low: float = -math.inf, high: float = math.inf):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise invalid(f"'{name}' must be a number (got {_quoted(value)})", name)
    if not low <= value <= high:
        raise _out_of_range(name, value, low, high)
    return value


def _integer(body: dict, name: str, default, low: int = -(2**63), high: int = 2**64 - 1):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"'{name}' must be an integer (got {_quoted(value)})", name)
    if not low <= value <= high:
        raise _out_of_range(name, value, low, high)
    return value


def _boolean(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"'{name}' must be a boolean (got {_quoted(value)})", name)
    return value


def _stop(body: dict) -> list:
    value = body.get("stop")
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise invalid("'stop' must be a string or a list of strings", "stop")
    if len(value) > MAX_STOP_STRINGS:
        raise invalid(f"'stop' takes at most {MAX_STOP_STRINGS} strings", "stop")
    return value


def _logit_bias(body: dict) -> Optional[dict]:
    value = body.get("logit_bias")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid("'logit_bias' must be an object {token id: bias}", "logit_bias")
    bias = {}
    for key, b in value.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise invalid(f"'logit_bias' keys must be token ids (got {_quoted(key)})", "logit_bias")
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not -100 <= b <= 100:
            raise invalid(f"'logit_bias' values must be numbers between -100 and 100 (got {_quoted(b)})", "logit_bias")
        bias[int(key)] = float(b)
    return bias


def check_model(body: dict, model_ids: list) -> str:
    """The model a request names: absent means the served one, as does any of its names (model_ids,
    compared ignoring case and surrounding spaces); another name is a 404."""
    name = body.get("model")
    if name is None:
        return model_ids[0]
    if not isinstance(name, str):
        raise invalid("'model' must be a string", "model")
    if name.strip().lower() not in {m.lower() for m in model_ids}:
        raise APIError(404, f"The model {_quoted(name)} does not exist (this server serves {model_ids[0]!r})",
                       param="model", code="model_not_found")
    return model_ids[0]


def sampling_request(body: dict, prompt: list, top_logprobs: Optional[int]) -> GenerationRequest:
    """The fields chat and completions share. Unset sampling options take the engine's defaults
    (SamplingConfig: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, as llama.cpp's server)."""
    n = _integer(body, "n", 1)
    if n != 1:
        raise invalid("only n = 1 is supported", "n")
    defaults = SamplingConfig()
    max_tokens = _integer(body, "max_completion_tokens", None, 0, 2**31)
    max_tokens = _integer(body, "max_tokens", max_tokens, 0, 2**31)
    try:
        sampling = SamplingConfig(
            temperature=float(_number(body, "temperature", defaults.temperature, 0.0, 2.0**31)),
            top_p=float(_number(body, "top_p", defaults.top_p, 0.0, 1.0)),
            top_k=int(_integer(body, "top_k", defaults.top_k, 0, 2**31)),
            min_p=float(_number(body, "min_p", defaults.min_p, 0.0, 1.0)),
            presence_penalty=float(_number(body, "presence_penalty", 0.0, -2.0, 2.0)),
            frequency_penalty=float(_number(body, "frequency_penalty", 0.0, -2.0, 2.0)),
            repeat_penalty=float(_number(body, "repeat_penalty", 1.0, 1e-6, 2.0**31)),
            seed=_integer(body, "seed", None, 0, 2**64 - 1),
            logit_bias=_logit_bias(body),
            grammar=output_grammar(body),
        )
    except ValueError as exc:  # SamplingError
        raise invalid(str(exc)) from None
    return GenerationRequest(prompt=prompt, sampling=sampling, max_tokens=max_tokens, stop=_stop(body),
                             top_logprobs=top_logprobs)


def output_grammar(body: dict) -> Optional[str]:
    """The GBNF text the output must follow, from OpenAI's `response_format` ({"type": "text"},
    {"type": "json_object"}: any JSON object, {"type": "json_schema", "json_schema": {"name", "schema",
    "strict"}}) or llama.cpp's server extensions `grammar` (GBNF text) and `json_schema` (a schema);
    None for plain text. More than one of them is refused."""
    from ..grammar import GrammarError, grammar_text

    given = [k for k in ("response_format", "grammar", "json_schema") if body.get(k) is not None]
    if len(given) > 1:
        raise invalid(f"give only one of {', '.join(given)}", given[1])
    if not given:
        return None
    param = given[0]
    try:
        if param == "grammar":
            if not isinstance(body["grammar"], str):
                raise invalid("'grammar' must be a string (GBNF)", "grammar")
            return grammar_text(grammar=body["grammar"])
        if param == "json_schema":
            return grammar_text(json_schema=_schema_value(body["json_schema"], "json_schema"))
        return _response_format(body["response_format"])
    except GrammarError as exc:
        raise invalid(str(exc), param) from None


def _schema_value(schema, param: str):
    if not isinstance(schema, (dict, bool)):
        raise invalid(f"'{param}' must be a JSON schema (an object)", param)
    return schema


def _response_format(fmt) -> Optional[str]:
    from ..grammar import grammar_text

    param = "response_format"
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise invalid("'response_format' must be an object with a string 'type'", param)
    kind = fmt["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return grammar_text(json_schema={"type": "object"})
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise invalid("response_format 'json_schema' must be an object with the 'schema'", param)
        schema = spec.get("schema", {})  # OpenAI: without a schema, any JSON (object)
        return grammar_text(json_schema=_schema_value(schema, "response_format.json_schema.schema"))
    raise invalid(f"response_format type {_quoted(kind)} is not supported (text, json_object, json_schema)", param)


def chat_messages(body: dict) -> list:
    """messages: [{role, content}] with content a string or a list of {type: 'text', text} parts; an
    assistant message may carry `tool_calls` (its content then may be null), a tool message its
    `tool_call_id` and `name`."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("'messages' must be a non-empty list", "messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise invalid(f"messages[{i}] must be an object with a string 'role'", "messages")
        content = message.get("content")
        if content is None:
            content = ""
        if isinstance(content, list):
            parts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise invalid(f"messages[{i}].content parts must be {{'type': 'text', 'text': ...}}", "messages")
                parts.append(part["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise invalid(f"messages[{i}].content must be a string or a list of text parts", "messages")
        entry = {"role": message["role"], "content": content}
        if message.get("tool_calls") is not None:
            entry["tool_calls"] = _tool_calls(message["tool_calls"], i)
        for key in ("tool_call_id", "name"):
            if isinstance(message.get(key), str):
                entry[key] = message[key]
        out.append(entry)
    return out


def _tool_calls(calls, i: int) -> list:
    """An assistant message's tool_calls: [{id, type: 'function', function: {name, arguments}}]."""
    ok = isinstance(calls, list) and all(
        isinstance(c, dict) and isinstance(c.get("function"), dict) and isinstance(c["function"].get("name"), str)
        and isinstance(c["function"].get("arguments", "{}"), (str, dict)) for c in calls)
    if not ok:
        raise invalid(f"messages[{i}].tool_calls must be a list of {{'id', 'type': 'function', 'function': "
                      "{'name', 'arguments'}}}", "messages")
    return [{"id": c.get("id", ""), "type": "function",
             "function": {"name": c["function"]["name"], "arguments": c["function"].get("arguments", "{}")}}
            for c in calls]


def chat_top_logprobs(body: dict) -> Optional[int]:
    if not _boolean(body, "logprobs", False):
        if body.get("top_logprobs") is not None:
            raise invalid("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        return None
    return _integer(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)


def completion_top_logprobs(body: dict) -> Optional[int]:
    return _integer(body, "logprobs", None, 0, MAX_TOP_LOGPROBS)


def completion_prompt(body: dict):
    """prompt: a string, a list of token ids, or a one-element list of either -> the text (to be
    tokenized) or the ids."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    raise invalid("'prompt' must be a string or a list of token ids (one prompt per request)", "prompt")


def stream_options(body: dict) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise invalid("'stream_options' must be an object", "stream_options")
    return _boolean(options, "include_usage", False)


# -- responses --------------------------------------------------------------------------------------------------

def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(timings, n_prompt: int, n_generated: int) -> dict:
    cached = timings.cached_tokens if timings else 0
    return {
        "prompt_tokens": n_prompt,
        "completion_tokens": n_generated,
        "total_tokens": n_prompt + n_generated,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def token_bytes(tokenizer, token: int) -> list:
    return list(tokenizer.token_to_piece(int(token), special=True))


def token_text(tokenizer, token: int) -> str:
    return tokenizer.token_to_piece(int(token), special=True).decode("utf-8", errors="replace")


def chat_logprob_entry(tokenizer, event) -> dict:
    def one(token, lp):
        return {"token": token_text(tokenizer, token), "logprob": lp, "bytes": token_bytes(tokenizer, token)}

    entry = one(event.token, event.logprob)
    entry["top_logprobs"] = [one(t, lp) for t, lp in (event.top_logprobs or [])]
    return entry


class CompletionLogprobs:
    """The legacy completions `logprobs` object, built token by token."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.tokens, self.token_logprobs, self.top_logprobs, self.text_offset = [], [], [], []
        self._offset = 0

    def add(self, event) -> dict:
        text = token_text(self.tokenizer, event.token)
        part = {
            "tokens": [text],
            "token_logprobs": [event.logprob],
            "top_logprobs": [{token_text(self.tokenizer, t): lp for t, lp in (event.top_logprobs or [])}],
            "text_offset": [self._offset],
        }
        self._offset += len(text)
        for key, value in part.items():
            getattr(self, key).extend(value)
        return part

    def as_dict(self) -> dict:
        return {"tokens": self.tokens, "token_logprobs": self.token_logprobs, "top_logprobs": self.top_logprobs,
                "text_offset": self.text_offset}


def now() -> int:
    return int(time.time())


def require_object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    return body
