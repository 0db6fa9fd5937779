"""Sampling settings: the SamplingConfig dataclass, its defaults and the range of every option.

The defaults here are the only ones: `localllm chat`'s settings (chat/conversation.py), the CLI's sampling
options (cli/options.py), the server's request defaults and `localllm show` read them from this class.
It imports no NumPy, so that the CLI can build its options from it without NumPy's ~60 ms import on
commands that never sample (`--help`, `list`, `rm`). The sampling chain itself is localllm/sampling.py.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from .errors import LocalLLMError


class SamplingError(LocalLLMError, ValueError):
    """A sampling option out of range, or logits that cannot be sampled from.

    Also a ValueError, so option parsers that report ValueErrors as bad parameters report these too."""


def require(ok: bool, name: str, allowed: str, value) -> None:
    if not ok:
        raise SamplingError(f"{name} must be {allowed} (got {value!r})")


def _numpy_scalar_types(*names: str) -> tuple[type, ...]:
    """NumPy's scalar base classes of those names (np.integer, np.floating), without importing NumPy:
    a NumPy scalar cannot exist before NumPy is imported, so none when it is not."""
    numpy = sys.modules.get("numpy")
    return tuple(getattr(numpy, name) for name in names) if numpy is not None else ()


def is_number(value) -> bool:
    """An int or float, Python's or NumPy's; never a bool."""
    return isinstance(value, (int, float) + _numpy_scalar_types("integer", "floating")) and not isinstance(value, bool)


def is_int(value) -> bool:
    """An int, Python's or NumPy's; never a bool."""
    return isinstance(value, (int,) + _numpy_scalar_types("integer")) and not isinstance(value, bool)


@dataclass
class SamplingConfig:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    max_tokens: int = 256  # the generation loop's; the Sampler does not read it
    stop: list[str] | None = None
    grammar: str | None = None  # GBNF text (localllm/grammar/): output is constrained to it
    # Output written with control tokens' text (tool-call markers such as [TOOL_CALLS]); a grammar then
    # matches them by that text. Off: control tokens write nothing, and a grammar never allows them.
    special_tokens: bool = False

    def __post_init__(self):
        def number(name: str, low: float, high: float, allowed: str) -> None:
            value = getattr(self, name)
            require(is_number(value) and math.isfinite(value) and low <= value <= high, name, allowed, value)

        number("temperature", 0.0, math.inf, "a number >= 0 (0 = greedy)")
        number("top_p", 0.0, 1.0, "between 0 and 1 (1 = off)")
        number("min_p", 0.0, 1.0, "between 0 and 1 (0 = off)")
        number("typical_p", 0.0, 1.0, "between 0 and 1 (1 = off)")
        number("repeat_penalty", 1e-6, math.inf, "a number > 0 (1 = off)")
        number("frequency_penalty", -2.0, 2.0, "between -2 and 2 (0 = off)")
        number("presence_penalty", -2.0, 2.0, "between -2 and 2 (0 = off)")
        require(is_int(self.top_k) and self.top_k >= 0, "top_k", "an integer >= 0 (0 = off)", self.top_k)
        require(is_int(self.repeat_last_n) and self.repeat_last_n >= -1, "repeat_last_n",
                 "an integer >= -1 (-1 = the whole history, 0 = off)", self.repeat_last_n)
        require(is_int(self.max_tokens) and self.max_tokens >= 0, "max_tokens", "an integer >= 0", self.max_tokens)
        require(self.seed is None or (is_int(self.seed) and 0 <= self.seed < 2**64), "seed",
                 "None or an integer between 0 and 2**64 - 1", self.seed)
        self.logit_bias = self._checked_logit_bias(self.logit_bias)
        self.stop = self._checked_stop(self.stop)
        if self.grammar is not None:
            from .grammar.gbnf import parse_gbnf

            parse_gbnf(self.grammar)  # a GrammarError (a SamplingError) says what is wrong and where

    @staticmethod
    def _checked_logit_bias(bias) -> dict[int, float] | None:
        """{token id: bias}; ids may be given as decimal strings (JSON objects have string keys)."""
        if bias is None:
            return None
        require(isinstance(bias, dict), "logit_bias", "a dict {token id: bias}", bias)
        checked = {}
        for key, value in bias.items():
            token = int(key) if isinstance(key, str) and key.strip().lstrip("-").isdigit() else key
            require(is_int(token) and token >= 0, "logit_bias", "keyed by token ids >= 0", key)
            require(is_number(value) and (math.isfinite(value) or value == -math.inf), "logit_bias",
                     "finite numbers, or -inf to ban a token", value)
            checked[int(token)] = float(value)
        return checked

    @staticmethod
    def _checked_stop(stop) -> list[str] | None:
        if stop is None:
            return None
        if isinstance(stop, str):
            stop = [stop]
        stop = list(stop)
        require(all(isinstance(s, str) for s in stop), "stop", "a list of strings", stop)
        return stop
