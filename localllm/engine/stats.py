"""The engine's counters, read by the server's /metrics (localllm/server/metrics.py): requests, tokens,
steps and speculation, written by the engine thread only, and the generation rate over a sliding window."""

from __future__ import annotations

import time
from collections import deque

RATE_WINDOW_S = 10.0


class EngineStats:
    """Counters read by /metrics (written by the engine thread only)."""

    def __init__(self):
        self.requests = 0
        self.completed = 0
        self.cancelled = 0
        self.rejected = 0
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
        self.generated_tokens = 0
        self.steps = 0
        self.step_rows = 0
        self.draft_tokens = 0  # speculation: tokens drafted, and those the model kept
        self.draft_accepted = 0
        self.forward_seconds = 0.0
        self._recent: deque[tuple[float, int]] = deque()  # (time, tokens generated) for the rate

    def admitted(self, prompt_tokens: int, cached: int) -> None:
        self.requests += 1
        self.prompt_tokens += prompt_tokens
        self.cached_prompt_tokens += cached

    def step(self, seconds: float, rows: int) -> None:
        self.steps += 1
        self.step_rows += rows
        self.forward_seconds += seconds

    def drafted(self, drafts: int, accepted: int) -> None:
        self.draft_tokens += drafts
        self.draft_accepted += accepted

    def generated(self, n: int) -> None:
        self.generated_tokens += n
        now = time.monotonic()
        self._recent.append((now, n))
        while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
            self._recent.popleft()

    def tokens_per_second(self) -> float:
        """Generated tokens per second over the last RATE_WINDOW_S seconds."""
        now = time.monotonic()
        recent = [n for t, n in list(self._recent) if t >= now - RATE_WINDOW_S]
        return sum(recent) / RATE_WINDOW_S
