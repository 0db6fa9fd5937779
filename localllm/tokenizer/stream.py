"""Streaming detokenization that never emits half a UTF-8 character."""

from __future__ import annotations


def _complete_prefix_length(data: bytes) -> int:
    """Length of the longest prefix of `data` that does not end inside an unfinished UTF-8 sequence
    (at most the last 3 bytes can belong to one; invalid bytes count as complete, to become U+FFFD)."""
    n = len(data)
    for back in range(1, min(3, n) + 1):
        byte = data[n - back]
        if byte & 0xC0 == 0x80:  # continuation byte: keep looking for the lead
            continue
        if byte & 0xE0 == 0xC0:
            need = 2
        elif byte & 0xF0 == 0xE0:
            need = 3
        elif byte & 0xF8 == 0xF0:
            need = 4
        else:
            return n  # ASCII or invalid lead: nothing pending
        return n if back >= need else n - back
    return n


class StreamDecoder:
    """feed(token) returns the text that is complete so far; flush() returns the rest."""

    def __init__(self, tokenizer, special: bool = False):
        self.tokenizer = tokenizer
        self.special = special
        self._pending = b""

    def feed(self, token_id: int) -> str:
        data = self._pending + self.tokenizer.token_to_piece(int(token_id), special=self.special)
        cut = _complete_prefix_length(data)
        self._pending = data[cut:]
        return data[:cut].decode("utf-8", errors="replace")

    def flush(self) -> str:
        data, self._pending = self._pending, b""
        return data.decode("utf-8", errors="replace")
