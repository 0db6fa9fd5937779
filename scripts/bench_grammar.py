"""Constrained decoding's cost: decode tok/s with a JSON-schema grammar against without, for localllm and
for llama.cpp (llama-cpp-python's completion with the same GBNF text), on the same model, in paired rounds.

The figure the issue asks for is the ratio constrained / unconstrained on each engine (1.0: the grammar
costs nothing). Greedy decoding on both by default, so the unconstrained runs are the same work each round;
`--temperature T` samples instead (seed 0, each engine's default top-k, top-p and min-p).
localllm caches each grammar's masks (grammar/constraint.py): "grammar" runs the same text again (a
server answering one schema many times), "new grammar" a text never seen (a comment line makes it new),
which pays for every mask the answer needs. llama.cpp keeps no masks: its one figure covers both.

    PYTHONPATH=/tmp/llsrc/llama_cpp_python-0.3.36 LLAMA_CPP_LIB_PATH=.../vendor/llama.cpp/build-noamx/bin \\
        python scripts/bench_grammar.py [MODEL.gguf] [--rounds 5] [--threads 2]

Without MODEL: the built-in Gemma 3 270M (its vocabulary: 262,144 tokens). --no-llama-cpp: ours only.
"""

from __future__ import annotations

import argparse
import statistics
import time

# Output of about 150 tokens: eight records, each with a name, a number and a flag.
SCHEMA = {
    "type": "array",
    "minItems": 8,
    "maxItems": 8,
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "city": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "member": {"type": "boolean"},
        },
        "required": ["name", "city", "age", "member"],
    },
}
PROMPT = "A list of eight people as JSON, with their name, city, age and whether they are members:\n"


def ours(model, grammar, max_tokens: int, temperature: float = 0.0) -> tuple[float, int]:
    """(decode tok/s, tokens) of one generation on a fresh session (greedy at temperature 0; else the
    default top-k, top-p and min-p, seed 0)."""
    done = None
    for event in model.generate(PROMPT, max_tokens=max_tokens, temperature=temperature, seed=0, grammar=grammar,
                                session=model.new_session()):
        if event.kind == "done":
            done = event.timings
    return done.generation_tps, done.generated_tokens


def theirs(llm, grammar, max_tokens: int, temperature: float = 0.0) -> tuple[float, int]:
    """(decode tok/s, tokens) of llama-cpp-python's streamed completion (as ours): from the first
    token's arrival to the last's."""
    stamps = []
    llm.reset()
    for _ in llm.create_completion(PROMPT, max_tokens=max_tokens, temperature=temperature, seed=0, grammar=grammar,
                                   stream=True):
        stamps.append(time.perf_counter())
    n = len(stamps)
    return (n - 1) / (stamps[-1] - stamps[0]), n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--no-llama-cpp", action="store_true")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="0: greedy (the default); above: sampled, with each engine's default top-k, top-p, min-p")
    args = parser.parse_args()

    import localllm
    from localllm.grammar import grammar_text
    from localllm.hub.default_model import default_model_path

    path = args.model or str(default_model_path())
    gbnf = grammar_text(json_schema=SCHEMA)
    model = localllm.load(path, n_ctx=1024, threads=args.threads)
    model.warm_up()
    fresh = iter(range(10**6))
    temp = args.temperature
    engines = {"localllm": (lambda g: ours(model, g, args.max_tokens, temp), gbnf),
               "localllm-new": (lambda g: ours(model, g and f"{g}# run {next(fresh)}\n", args.max_tokens, temp), gbnf)}
    if not args.no_llama_cpp:
        import llama_cpp

        llm = llama_cpp.Llama(path, n_ctx=1024, n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
        engines["llama.cpp"] = (lambda g: theirs(llm, g, args.max_tokens, temp), llama_cpp.LlamaGrammar.from_string(gbnf, verbose=False))
    for run, grammar in engines.values():  # warm-up: compile, the trie, first masks
        run(None)
        run(grammar)
    ratios = {name: [] for name in engines}
    rates = {name: {"free": [], "grammar": []} for name in engines}
    for r in range(args.rounds):
        for name, (run, grammar) in engines.items():
            free, n_free = run(None)
            constrained, n_constrained = run(grammar)
            ratios[name].append(constrained / free)
            rates[name]["free"].append(free)
            rates[name]["grammar"].append(constrained)
            print(f"round {r + 1} {name:12s} free {free:7.1f} tok/s ({n_free} tokens)   "
                  f"grammar {constrained:7.1f} tok/s ({n_constrained} tokens)   ratio {constrained / free:.3f}", flush=True)
    print()
    for name in engines:
        rs = ratios[name]
        print(f"{name:12s} free {statistics.median(rates[name]['free']):7.1f}  grammar "
              f"{statistics.median(rates[name]['grammar']):7.1f} tok/s   constrained/free median {statistics.median(rs):.3f} "
              f"(range {min(rs):.3f}-{max(rs):.3f})")


if __name__ == "__main__":
    main()
