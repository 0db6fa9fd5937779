"""Load measurements of `localllm serve` (figures for docs/performance.md, "Server").

Starts the server in-process on 127.0.0.1 (a free port) and drives it over HTTP with the openai client:
  1. throughput: aggregate generated tokens/s with 1 client, then with 8 concurrent clients;
  2. prefix cache: time to first token with a ~1,000-token shared system prompt, miss vs hit;
  3. soak: 32 concurrent clients for --soak-seconds (default 120), each checking its own greedy
     answer against the one expected for its prompt (cross-talk would change it); no error allowed;
     resident memory sampled, KV pool bounded by --cache-mb.

    python scripts/bench_server.py [--model PATH] [--soak-seconds 120] [--tokens 32] [--rounds 6] [--throughput-only]

With --lookup, instead: speculative decoding by prompt lookup (serve --lookup) against none, a server of
each in turn: aggregate tokens/s of --lookup-clients concurrent greedy completions that copy a ~300-token
code snippet back, and of --chat-clients of the 8 short chat prompts above (text that repeats little),
median of --lookup-runs runs, each answer checked against the other server's.

    python scripts/bench_server.py --lookup [--lookup-clients 4] [--chat-clients 8] [--lookup-runs 3] [--draft-max 8]
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import localllm
from localllm.server import BackgroundServer, ServeOptions

PROMPTS = [
    "Name a fruit.", "Count to five.", "What is the sky's color?", "Say hello in French.",
    "Give me a short poem.", "Why do cats purr?", "Describe rain in one line.", "Who wrote Hamlet?",
]


def client_for(server):
    import openai

    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=600)


def ask(client, model_id, content, max_tokens, system=None, stream=False):
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    return client.chat.completions.create(model=model_id, messages=messages, max_tokens=max_tokens, temperature=0,
                                          stream=stream)


def throughput(server, n_clients: int, max_tokens: int, rounds: int = 2) -> float:
    """Aggregate generated tokens per second with n_clients concurrent clients, each sending `rounds`
    requests one after the other."""
    client = client_for(server)

    def one(i):
        total = 0
        for r in range(rounds):
            reply = ask(client, server.model_id, f"{PROMPTS[i % len(PROMPTS)]} ({r})", max_tokens)
            total += reply.usage.completion_tokens
        return total

    t0 = time.perf_counter()
    with ThreadPoolExecutor(n_clients) as pool:
        tokens = sum(pool.map(one, range(n_clients)))
    return tokens / (time.perf_counter() - t0)


CODE = '''import json
from dataclasses import dataclass, field


@dataclass
class Item:
    name: str
    price: float
    quantity: int = 1
    tags: list = field(default_factory=list)

    def total(self) -> float:
        return self.price * self.quantity


class Cart:
    def __init__(self):
        self.items = []

    def add(self, item: Item) -> None:
        for existing in self.items:
            if existing.name == item.name:
                existing.quantity += item.quantity
                return
        self.items.append(item)

    def remove(self, name: str) -> None:
        self.items = [item for item in self.items if item.name != name]

    def total(self) -> float:
        return sum(item.total() for item in self.items)

    def to_json(self) -> str:
        return json.dumps([{"name": i.name, "price": i.price, "quantity": i.quantity} for i in self.items])


def main():
    cart = Cart()
    cart.add(Item("apple", 0.5, 6))
    cart.add(Item("bread", 2.25))
    cart.add(Item("apple", 0.5, 2))
    cart.remove("bread")
    print(cart.total(), cart.to_json())
'''


def copy_prompt(i: int) -> str:
    """A completion prompt whose answer copies the code (each client's differs in its first line, so no
    prefix is shared)."""
    code = f"# version {i}\n" + CODE
    return f"Original:\n```python\n{code}```\n\nCopy:\n```python\n# version {i}\n"


def lookup_throughput(server, prompts: list, max_tokens: int, chat: bool) -> tuple[float, list]:
    """Aggregate generated tokens/s of the prompts sent at once (greedy), and the answers."""
    client = client_for(server)

    def one(prompt):
        if chat:
            reply = ask(client, server.model_id, prompt, max_tokens)
            return reply.usage.completion_tokens, reply.choices[0].message.content
        reply = client.completions.create(model=server.model_id, prompt=prompt, max_tokens=max_tokens, temperature=0)
        return reply.usage.completion_tokens, reply.choices[0].text

    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(one, prompts))
    return sum(n for n, _ in results) / (time.perf_counter() - t0), [text for _, text in results]


def lookup_comparison(model, args) -> int:
    """Both servers up at once (an idle engine only waits), driven in turn, run after run, so that a
    machine whose speed drifts weighs on both alike; the medians, and the median of the per-run ratios."""
    copying = [copy_prompt(i) for i in range(args.lookup_clients)]
    workloads = {"copy": (copying, False, args.lookup_tokens), "chat": (PROMPTS[: args.chat_clients], True, args.tokens)}
    with contextlib.ExitStack() as stack:
        servers = {}
        for lookup in (False, True):
            options = ServeOptions(host="127.0.0.1", port=0, parallel=8, cache_mb=args.cache_mb, max_queue=64,
                                   lookup=lookup, draft_max=args.draft_max)
            servers[lookup] = stack.enter_context(BackgroundServer(model, options))
            ask(client_for(servers[lookup]), servers[lookup].model_id, "warm up", 4)
        rates = {(lookup, name): [] for lookup in servers for name in workloads}
        same = True
        for _ in range(args.lookup_runs):
            for name, (prompts, chat, n) in workloads.items():
                answers = []
                for lookup, server in servers.items():
                    rate, texts = lookup_throughput(server, prompts, n, chat)
                    rates[lookup, name].append(rate)
                    answers.append(texts)
                # the same run on both: the same prefix-cache hits (a hit can change an answer at a near-tie)
                same &= answers[0] == answers[1]
        stats = {lookup: (s.engine.stats.draft_tokens, s.engine.stats.draft_accepted) for lookup, s in servers.items()}
    for name, (prompts, _, n) in workloads.items():
        off, on = rates[False, name], rates[True, name]
        ratios = [b / a for a, b in zip(off, on)]
        print(f"{name} ({len(prompts)} clients x {n} tokens): no lookup {statistics.median(off):.1f} tok/s, "
              f"lookup {statistics.median(on):.1f} tok/s; per-run ratio median {statistics.median(ratios):.2f}x "
              f"(runs: {', '.join(f'{r:.2f}' for r in ratios)})")
    print(f"lookup server: drafted {stats[True][0]}, kept {stats[True][1]}")
    print("answers identical with and without lookup" if same else "ANSWERS DIFFER with lookup")
    return 0 if same else 1


def ttft(server, system: str, question: str) -> float:
    client = client_for(server)
    t0 = time.perf_counter()
    stream = ask(client, server.model_id, question, 2, system=system, stream=True)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - t0
            break
    for _ in stream:
        pass
    return first


def prefix_cache(server, model) -> tuple[float, float, int]:
    sentence = "The assistant answers questions about the solar system carefully and briefly. "
    system = sentence
    while len(model.tokenize(system)) < 1000:
        system += sentence
    n_tokens = len(model.render_chat([{"role": "system", "content": system}, {"role": "user", "content": "x"}]))
    misses, hits = [], []
    for i in range(3):
        unique = f"Session {i}. " + system  # a new first block: nothing cached
        misses.append(ttft(server, unique, "What is Mars?"))
        hits.append(ttft(server, unique, "What is Venus?"))  # same system prompt: cached
    return statistics.median(misses), statistics.median(hits), n_tokens


def soak(server, model, seconds: float, n_clients: int, max_tokens: int) -> dict:
    expected = {}
    for p in PROMPTS:
        ids = model.render_chat([{"role": "user", "content": p}])
        events = model.generate(ids, max_tokens=max_tokens, temperature=0, session=model.new_session())
        expected[p] = "".join(e.text for e in events if e.kind == "token")
    deadline = time.monotonic() + seconds
    client = client_for(server)
    rss = []

    def worker(i):
        done = errors = mismatches = 0
        while time.monotonic() < deadline:
            prompt = PROMPTS[(i + done) % len(PROMPTS)]
            try:
                text = ask(client, server.model_id, prompt, max_tokens).choices[0].message.content
            except Exception as exc:  # noqa: BLE001 - counted and reported
                errors += 1
                print(f"client {i}: {exc}", file=sys.stderr)
                continue
            done += 1
            mismatches += text != expected[prompt]
        return done, errors, mismatches

    with ThreadPoolExecutor(n_clients + 1) as pool:
        futures = [pool.submit(worker, i) for i in range(n_clients)]
        while not all(f.done() for f in futures):
            rss.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
            time.sleep(1)
        results = [f.result() for f in futures]
    pool_stats = server.engine.pool
    return {
        "requests": sum(r[0] for r in results),
        "errors": sum(r[1] for r in results),
        "mismatches": sum(r[2] for r in results),
        "max_rss_mb": max(rss) if rss else 0,
        "kv_blocks": pool_stats.n_blocks,
        "kv_mb": pool_stats.n_blocks * server.engine.cache.k[0][0].nbytes * 2 * len(server.engine.cache.k) / 2**20,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--tokens", type=int, default=32, help="tokens per request (throughput, soak)")
    parser.add_argument("--rounds", type=int, default=6,
                        help="requests per client in the throughput test (with 2, the clients' ragged ends and "
                             "the thread governor's first steps weigh on the ratio: 2.1-3.6x between runs)")
    parser.add_argument("--soak-seconds", type=float, default=120.0)
    parser.add_argument("--soak-clients", type=int, default=32)
    parser.add_argument("--cache-mb", type=float, default=256)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--throughput-only", action="store_true", help="stop after the 1 vs 8 client throughput")
    parser.add_argument("--lookup", action="store_true", help="compare speculative decoding by prompt lookup with none")
    parser.add_argument("--lookup-clients", type=int, default=4)
    parser.add_argument("--lookup-runs", type=int, default=3)
    parser.add_argument("--chat-clients", type=int, default=8, help="concurrent chat prompts (of the 8 above)")
    parser.add_argument("--lookup-tokens", type=int, default=200, help="tokens per copying request")
    parser.add_argument("--draft-max", type=int, default=8)
    args = parser.parse_args()

    model = localllm.load(args.model, n_ctx=2048, threads=args.threads)
    if args.lookup:
        return lookup_comparison(model, args)
    options = ServeOptions(host="127.0.0.1", port=0, parallel=8, cache_mb=args.cache_mb, max_queue=64)
    with BackgroundServer(model, options) as server:  # the engine warms up as `localllm serve`'s does
        ask(client_for(server), server.model_id, "warm up", 4)
        one = throughput(server, 1, args.tokens, args.rounds)
        eight = throughput(server, 8, args.tokens, args.rounds)
        print(f"throughput: 1 client {one:.1f} tok/s, 8 clients {eight:.1f} tok/s aggregate, ratio {eight / one:.2f}x")
        if args.throughput_only:
            return 0
        miss, hit, n_sys = prefix_cache(server, model)
        print(f"prefix cache: {n_sys}-token prompt, TTFT miss {miss * 1000:.0f} ms, hit {hit * 1000:.0f} ms, "
              f"ratio {hit / miss:.3f}")
        if args.soak_seconds > 0:
            res = soak(server, model, args.soak_seconds, args.soak_clients, min(args.tokens, 16))
            print(f"soak: {args.soak_clients} clients x {args.soak_seconds:.0f} s: {res['requests']} requests, "
                  f"{res['errors']} errors, {res['mismatches']} answers differing from the request alone; "
                  f"max RSS {res['max_rss_mb']:.0f} MB, KV pool {res['kv_blocks']} blocks = {res['kv_mb']:.0f} MB "
                  f"(--cache-mb {args.cache_mb:g})")
            if res["errors"] or res["mismatches"]:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
