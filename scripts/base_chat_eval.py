"""Base-model chat, before and after: each everyday question answered at temperature 0 through the Gemma
turn template (what `localllm chat` did with the base Gemma 3 270M before issue 26) and through the
transcript template it uses now (stop at "\\nUser:", repetition penalty 1.1), printing the first sentence
of each answer for judging by hand.

    python scripts/base_chat_eval.py [MODEL] [--questions tests/data/everyday_questions.txt] [-n 64]

Output: one block per question (Q, before, after) and a TSV copy with --tsv FILE.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import localllm
from localllm.chat.templates import ChatTemplate

QUESTIONS = Path(__file__).resolve().parent.parent / "tests" / "data" / "everyday_questions.txt"


def first_sentence(text: str, limit: int = 160) -> str:
    """Up to the first sentence end (. ! ? followed by a space or the end) or line break, at most `limit`
    characters; newlines shown as ⏎ so a looping answer stays visible on one line."""
    text = text.strip()
    match = re.search(r"[.!?](\s|$)|\n", text)
    sentence = text[: match.end()].strip() if match else text
    return sentence[:limit].replace("\n", "⏎") + ("…" if len(sentence) > limit else "")


def answer(model, prompt_ids, max_tokens: int, repeat_penalty: float, stop: list[str]) -> str:
    events = model.generate(prompt_ids, max_tokens=max_tokens, temperature=0.0, repeat_penalty=repeat_penalty,
                            stop=stop, session=model.new_session())
    return "".join(e.text for e in events if e.kind == "token")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--questions", type=Path, default=QUESTIONS)
    parser.add_argument("-n", "--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--tsv", type=Path, default=None)
    args = parser.parse_args()
    model = localllm.load(args.model, n_ctx=1024, threads=args.threads)
    tok = model.tokenizer
    gemma = ChatTemplate.builtin("gemma", tok.tokens[tok.bos_id], tok.tokens[tok.eos_id])
    print(f"model {model.path.name}: chat template now '{model.chat_template.name}'")
    rows = []
    for question in [q.strip() for q in args.questions.read_text().splitlines() if q.strip()]:
        messages = [{"role": "user", "content": question}]
        before_ids = tok.encode(gemma.apply(messages), add_bos=False, parse_special=True)
        before = answer(model, before_ids, args.max_tokens, 1.0, [])
        after = answer(model, model.render_chat(messages), args.max_tokens, model.chat_repeat_penalty(),
                       model.chat_stop())
        rows.append((question, first_sentence(before), first_sentence(after)))
        print(f"Q: {question}\n  before: {rows[-1][1]}\n  after:  {rows[-1][2]}", flush=True)
    if args.tsv:
        args.tsv.write_text("".join("\t".join(row) + "\n" for row in rows), encoding="utf-8")


if __name__ == "__main__":
    main()
