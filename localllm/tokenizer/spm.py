"""SentencePiece-style tokenization (`tokenizer.ggml.model = "llama"`: Llama 2, Gemma), as llama.cpp does it.

Spaces become U+2581 ("▁"); the text is split into UTF-8 characters; then, repeatedly, the adjacent pair
whose concatenation is a vocabulary token with the highest score is merged (ties: leftmost first).
Pieces that end up outside the vocabulary fall back to byte tokens `<0xXX>`, or the unknown token.
"""

from __future__ import annotations

import heapq

SPACE = "\u2581"


def spm_encode(text: str, token_to_id: dict, scores, byte_ids: list, unk_id) -> list[int]:
    """Token ids of one raw-text fragment (already space-escaped)."""
    if not text:
        return []
    pieces = list(text)  # one symbol per character; merged symbols keep their text here
    n = len(pieces)
    prev = list(range(-1, n - 1))
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    heap: list = []
    merged_from: dict = {}

    def push(left: int, right: int) -> None:
        if left < 0 or right < 0:
            return
        joined = pieces[left] + pieces[right]
        token = token_to_id.get(joined)
        if token is None:
            return
        heapq.heappush(heap, (-scores[token], left, right, len(joined)))
        merged_from[joined] = (left, right)

    for i in range(1, n):
        push(i - 1, i)
    while heap:
        _, left, right, size = heapq.heappop(heap)
        if not pieces[left] or not pieces[right] or len(pieces[left]) + len(pieces[right]) != size:
            continue  # one side was merged elsewhere since this pair was queued
        pieces[left] += pieces[right]
        pieces[right] = ""
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prev[nxt[right]] = left
        push(prev[left], left)
        push(left, nxt[left])

    out: list[int] = []
    i = 0
    while i != -1:
        _resegment(pieces[i], token_to_id, byte_ids, unk_id, out)
        i = nxt[i]
    return out


def _resegment(piece: str, token_to_id: dict, byte_ids: list, unk_id, out: list) -> None:
    token = token_to_id.get(piece)
    if token is not None:
        out.append(token)
        return
    for byte in piece.encode("utf-8"):
        token = byte_ids[byte]
        if token is None:
            if unk_id is None:
                from .vocab import TokenizerError  # here, not at the top: vocab imports this module

                raise TokenizerError(f"the vocabulary has no token for byte 0x{byte:02X} and no unknown token")
            token = unk_id
        out.append(token)
