"""/metrics: the engine's counters in Prometheus' text exposition format (version 0.0.4)."""

from __future__ import annotations


def _metric(lines: list, name: str, kind: str, help_text: str, value) -> None:
    lines.append(f"# HELP localllm_{name} {help_text}")
    lines.append(f"# TYPE localllm_{name} {kind}")
    lines.append(f"localllm_{name} {value}")


def render_metrics(engine) -> str:
    s, pool = engine.stats, engine.pool
    lines: list = []
    _metric(lines, "requests_total", "counter", "Requests admitted to the batch.", s.requests)
    _metric(lines, "requests_completed_total", "counter", "Requests that finished generating.", s.completed)
    _metric(lines, "requests_cancelled_total", "counter", "Requests dropped because the client went away.", s.cancelled)
    _metric(lines, "requests_rejected_total", "counter", "Requests refused with 503 (queue full).", s.rejected)
    _metric(lines, "prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", s.prompt_tokens)
    _metric(lines, "prompt_tokens_cached_total", "counter", "Prompt tokens served from the prefix cache.", s.cached_prompt_tokens)
    _metric(lines, "generation_tokens_total", "counter", "Tokens generated.", s.generated_tokens)
    _metric(lines, "generation_tokens_per_second", "gauge", "Tokens generated per second over the last 10 s.",
            round(s.tokens_per_second(), 3))
    _metric(lines, "steps_total", "counter", "Batched forward passes.", s.steps)
    _metric(lines, "step_rows_total", "counter", "Token rows computed by those passes.", s.step_rows)
    _metric(lines, "draft_tokens_total", "counter", "Tokens drafted by speculative decoding (prompt lookup).", s.draft_tokens)
    _metric(lines, "draft_tokens_accepted_total", "counter", "Drafted tokens the model kept.", s.draft_accepted)
    _metric(lines, "queue_length", "gauge", "Requests waiting for a slot.", engine.queue_length)
    _metric(lines, "active_sequences", "gauge", "Sequences in the running batch.", engine.n_active)
    _metric(lines, "kv_blocks_total", "gauge", "KV cache blocks in the pool.", pool.n_blocks)
    _metric(lines, "kv_blocks_used", "gauge", "KV cache blocks referenced by running sequences.", pool.n_used)
    _metric(lines, "kv_blocks_cached", "gauge", "Unreferenced blocks kept for prefix reuse.", pool.n_cached)
    _metric(lines, "prefix_cache_hits_total", "counter", "Prompt blocks found in the prefix cache.", pool.stats.hit_blocks)
    _metric(lines, "prefix_cache_misses_total", "counter", "Prompt blocks looked up and not found.", pool.stats.miss_blocks)
    _metric(lines, "prefix_cache_evictions_total", "counter", "Cached blocks evicted to make room.", pool.stats.evictions)
    return "\n".join(lines) + "\n"
