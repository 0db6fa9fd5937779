"""Constrained output: GBNF grammars (llama.cpp's format), JSON Schema compiled to them, and the
per-sequence constraint the sampler applies before choosing a token (grammar/constraint.py).

    text = grammar_text(json_schema={"type": "object", "properties": {"n": {"type": "integer"}}})
    model.generate("...", grammar=text)       # or json_schema=... directly
"""

from __future__ import annotations

from typing import Any, Optional

from .gbnf import Grammar, GrammarError, parse_gbnf

__all__ = ["Grammar", "GrammarError", "grammar_text", "parse_gbnf"]


def grammar_text(grammar: Optional[str] = None, json_schema: Any = None) -> Optional[str]:
    """The GBNF text that output must follow: `grammar` as given, or the one of `json_schema` (a dict,
    a bool, or JSON text); None when neither is given. Both at once is an error."""
    if grammar is not None and json_schema is not None:
        raise GrammarError("give a grammar or a JSON schema, not both")
    if json_schema is not None:
        from .json_schema import json_schema_to_gbnf

        grammar = json_schema_to_gbnf(json_schema)
    if grammar is not None:
        parse_gbnf(grammar)  # refused here, with its line and column, rather than at the first token
    return grammar
