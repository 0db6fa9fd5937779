"""Turning request text into prompt ids without stalling the server.

Rendering a chat template and tokenizing are plain Python: a 4 MB prompt took over a minute to
tokenize (measured: 266k repetitions of `<start_of_turn>`), and on the event loop that minute stalled
every other client, /health included. So the work runs on a few threads of its own (PREPARE_THREADS,
an anyio CapacityLimiter: requests beyond it wait their turn there, and the default thread pool stays
free for everything else), and text that certainly cannot fit is refused before any tokenization.

The bound: every token stands for at most `longest_token_bytes` bytes of text (the tokenizers only
add text: a prefix space, BOS), so a text of B UTF-8 bytes is at least ceil(B / longest) tokens, and
a text of more than (n_ctx - 1) * longest bytes is at least n_ctx tokens: over the context (the
engine refuses a prompt of n_ctx tokens or more). That costs one UTF-8 encode of the text.
"""

from __future__ import annotations

from typing import Callable, Optional

from . import protocol as p

PREPARE_THREADS = 2


def longest_token_bytes(tokenizer) -> int:
    """The most bytes of text one token of the vocabulary stands for (special tokens by their text,
    as they are matched when parsed). A token whose piece cannot be built counts with its stored
    text's length, which is never shorter than its piece (SentencePiece's "▁" is 3 bytes for a space,
    GPT-2's byte characters 1-2 bytes for one byte)."""
    longest = 1
    for token_id, text in enumerate(tokenizer.tokens):
        try:
            size = len(tokenizer.token_to_piece(token_id, special=True))
        except (ValueError, LookupError):
            size = len(text.encode("utf-8", "surrogatepass"))
        longest = max(longest, size)
    return longest


def utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))  # lone surrogates (valid JSON) count as 3 bytes


class PromptPreparer:
    """The byte bound of one server (its context and vocabulary) and the threads that prepare prompts."""

    def __init__(self, tokenizer, n_ctx: int, threads: int = PREPARE_THREADS):
        self.longest_token = longest_token_bytes(tokenizer)
        self.n_ctx = n_ctx
        self.max_bytes = (n_ctx - 1) * self.longest_token  # beyond: at least n_ctx tokens
        self.threads = threads
        self._limiter = None  # created on the event loop, at first use (anyio needs a running loop)

    def check(self, text: str, param: Optional[str], what: str = "the prompt") -> None:
        """413 for text that cannot be tokenized into fewer than n_ctx tokens."""
        if len(text) <= self.max_bytes // 4:
            return  # 4 bytes per character at most: certainly within the bound, no encoding needed
        size = utf8_size(text)
        if size > self.max_bytes:
            at_least = -(-size // self.longest_token)
            raise p.APIError(
                413,
                f"{what} is {size} bytes, so at least {at_least} tokens (no token of this vocabulary is "
                f"longer than {self.longest_token} bytes), but the context holds {self.n_ctx}",
                param=param, code="context_length_exceeded",
            )

    async def run(self, function: Callable, *args):
        """function(*args) on one of this server's preparation threads."""
        import anyio

        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.threads)
        return await anyio.to_thread.run_sync(function, *args, limiter=self._limiter)
