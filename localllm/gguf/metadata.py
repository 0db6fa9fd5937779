"""Checked access to GGUF metadata: one accessor per kind of value, each raising GGUFError naming the key.

The reader stores values as the file typed them (ints, floats, bools, str; numeric arrays as numpy
arrays; string arrays as list[str]; arrays of arrays as lists). A valid-looking file can still hold a
string where a count belongs, a zero head count or a NaN epsilon; every value the engine uses goes
through these accessors so that such a file is refused at load with the key named, never with a
ValueError, TypeError or ZeroDivisionError later.

    meta.get_int("llama.block_count", min=1, max=MAX_LAYERS)
    meta.get_float("llama.rope.freq_base", default=10000.0, above=0.0)
    meta.get_str("tokenizer.ggml.pre", default=None)
    meta.get_array("tokenizer.ggml.scores", "float", default=None)
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

import numpy as np

from ..errors import GGUFError

REQUIRED: Any = object()  # default of an accessor: the key must be present
_KINDS = {"int": "integers", "float": "numbers", "str": "strings", "bool": "booleans"}


def describe(value) -> str:
    """A short one-line description of a metadata value for an error message."""
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:40] + "..."
        return f"the string {text!r}"
    if isinstance(value, bool):
        return f"the boolean {value}"
    if isinstance(value, (int, float, np.number)):
        return f"the {type(value).__name__} {value!r}"
    if isinstance(value, np.ndarray):
        return f"an array of {value.size} {value.dtype}"
    if isinstance(value, list):
        inner = "arrays" if value and isinstance(value[0], list) else "strings"
        return f"an array of {len(value)} {inner}"
    return f"a {type(value).__name__}"


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_float(value) -> bool:
    return isinstance(value, (float, np.floating))


class Metadata(dict):
    """key -> value as read from a GGUF file (a dict), with checked accessors. `path` names the file in
    errors ("metadata" when the values did not come from a file)."""

    def __init__(self, values: Optional[Mapping[str, Any]] = None, path=None):
        super().__init__(values or {})
        self.path = "metadata" if path is None else str(path)

    @classmethod
    def of(cls, values: Mapping[str, Any], path=None) -> "Metadata":
        """`values` itself when it is already a Metadata, else a checked copy of the mapping."""
        return values if isinstance(values, Metadata) else cls(values, path)

    def fail(self, key: str, problem: str):
        raise GGUFError(self.path, f"metadata key '{key}'", None, problem)

    def _lookup(self, key: str, default):
        """(present, value): the default when absent and one is given; GGUFError when it is required."""
        if key in self:
            return True, self[key]
        if default is REQUIRED:
            self.fail(key, "is missing")
        return False, default

    # -- scalars ----------------------------------------------------------------------------------------
    def get_int(self, key: str, default=REQUIRED, *, min: Optional[int] = None, max: Optional[int] = None,
                per_layer: bool = False):
        """An integer in [min, max]. With `per_layer`, a non-empty integer array (some files store head
        counts per layer) is accepted too, each entry in range, and its largest entry returned."""
        present, value = self._lookup(key, default)
        if not present:
            return value
        if per_layer and isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "iu":
            if value.size == 0:
                self.fail(key, "is an empty per-layer array")
            for entry in (int(value.min()), int(value.max())):
                self._check_range(key, entry, min, max)
            return int(value.max())
        if not _is_int(value):
            self.fail(key, f"must be an integer, found {describe(value)}")
        value = int(value)
        self._check_range(key, value, min, max)
        return value

    def get_float(self, key: str, default=REQUIRED, *, min: Optional[float] = None, max: Optional[float] = None,
                  above: Optional[float] = None, below: Optional[float] = None):
        """A finite number (an integer is accepted) in [min, max] and in (above, below)."""
        present, value = self._lookup(key, default)
        if not present:
            return value
        if not (_is_int(value) or _is_float(value)):
            self.fail(key, f"must be a number, found {describe(value)}")
        value = float(value)
        if not math.isfinite(value):
            self.fail(key, f"must be finite, found {value}")
        self._check_range(key, value, min, max)
        if above is not None and not value > above:
            self.fail(key, f"must be greater than {above}, found {value}")
        if below is not None and not value < below:
            self.fail(key, f"must be less than {below}, found {value}")
        return value

    def get_str(self, key: str, default=REQUIRED, *, choices=None):
        """A string; with `choices`, one of them."""
        present, value = self._lookup(key, default)
        if not present:
            return value
        if not isinstance(value, str):
            self.fail(key, f"must be a string, found {describe(value)}")
        if choices is not None and value not in choices:
            self.fail(key, f"must be one of {', '.join(choices)}, found {describe(value)}")
        return value

    def get_bool(self, key: str, default=REQUIRED):
        """A boolean (an integer 0 or 1 is accepted: some converters store flags as integers)."""
        present, value = self._lookup(key, default)
        if not present:
            return value
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        if _is_int(value) and value in (0, 1):
            return bool(value)
        self.fail(key, f"must be a boolean, found {describe(value)}")

    # -- arrays -----------------------------------------------------------------------------------------
    def get_array(self, key: str, of: str, default=REQUIRED, *, length: Optional[int] = None,
                  min: Optional[float] = None, max: Optional[float] = None):
        """An array of `of` ("int", "float", "str"): numeric arrays as 1-D numpy arrays (int64 or
        float64; an integer array is accepted as floats), string arrays as list[str]. `length` fixes the
        number of entries; `min`/`max` bound every numeric entry (floats must also not be NaN)."""
        present, value = self._lookup(key, default)
        if not present:
            return value
        if of == "str":
            if not isinstance(value, list) or (value and not isinstance(value[0], str)):
                self.fail(key, f"must be an array of strings, found {describe(value)}")
        else:
            if isinstance(value, (list, tuple)) and all(_is_int(v) or _is_float(v) for v in value):
                value = np.array(value)  # a plain mapping's list of numbers (the reader gives arrays)
            kinds = "iu" if of == "int" else "iuf"
            if not isinstance(value, np.ndarray) or value.ndim != 1 or (value.size and value.dtype.kind not in kinds):
                self.fail(key, f"must be an array of {_KINDS[of]}, found {describe(value)}")
            value = value.astype(np.int64 if of == "int" else np.float64)
        if length is not None and len(value) != length:
            self.fail(key, f"has {len(value)} entries, expected {length}")
        if of != "str" and len(value):
            if of == "float" and np.isnan(value).any():
                self.fail(key, f"entry {int(np.argmax(np.isnan(value)))} is NaN")
            low, high = value.min(), value.max()
            if min is not None and low < min:
                self.fail(key, f"entry {int(np.argmin(value))} is {low}, below the minimum {min}")
            if max is not None and high > max:
                self.fail(key, f"entry {int(np.argmax(value))} is {high}, above the maximum {max}")
        return value

    def _check_range(self, key: str, value, min, max) -> None:
        if min is not None and value < min:
            self.fail(key, f"must be at least {min}, found {value}")
        if max is not None and value > max:
            self.fail(key, f"must be at most {max}, found {value}")
