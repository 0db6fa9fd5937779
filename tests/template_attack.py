"""Render one chat template given on stdin in a fresh process and print, as JSON, what it cost:
{"error": TemplateError message or null, "cpu_s": CPU seconds of the render, "rss_growth_mb": growth of the
process's peak resident memory during the render, "stderr_lines": not measured here}.

A fresh process, because the peak resident size (ru_maxrss) only ever grows: measured in the test process,
one attack would hide the next. Used by tests/test_templates.py."""

import json
import resource
import sys
import time

from localllm.chat.templates import ChatTemplate
from localllm.errors import TemplateError

MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kB


def _cap_address_space(extra_mb: int) -> None:
    """A regression must fail here, not take the machine's memory: the process may map only `extra_mb`
    more (a MemoryError then, which the sandbox reports as a TemplateError)."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    limit = mapped + (extra_mb << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main() -> None:
    source = sys.stdin.read()
    ChatTemplate("{{ messages[0].content }}", "gguf").apply(MESSAGES)  # warm: jinja2 and the sandbox loaded
    _cap_address_space(1024)
    baseline = _peak_mb()
    started = time.process_time()
    error = None
    try:
        ChatTemplate(source, "gguf").apply(MESSAGES)
    except TemplateError as exc:
        error = str(exc)
    cpu = time.process_time() - started
    print(json.dumps({"error": error, "cpu_s": cpu, "rss_growth_mb": _peak_mb() - baseline}))


if __name__ == "__main__":
    main()
