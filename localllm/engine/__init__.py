"""The engine: what turns logits into a sequence's output, for one sequence or many.

- `sequence`: one sequence's output path (Event, Timings, SequenceOutput): from each sampled token to
  the events a caller streams (end of generation, logprobs, detokenized text with stop strings held
  back, the token and context limits). `localllm.generate` (one sequence on its own KV cache) and the
  batching engine both run every token through it.
- `batching`: continuous batching over the paged KV cache (Engine): many sequences per forward pass,
  one engine thread; the HTTP server (localllm.server) is a front end to it.

Import the submodules themselves: this package imports nothing at import (batching brings threads and
asyncio that a plain `generate` does not need).
"""
