"""Render one chat template given on stdin in a fresh process and print, as JSON, what it cost:
{"error": TemplateError message or null, "cpu_s": CPU seconds of the render, "compile_s": CPU seconds of
compiling the source before it (jinja's parse and Python's compile, bounded apart: 1-2 s for the 44 kB
namespace_5000 on a slow machine), "rss_growth_mb": growth of the process's
peak resident memory during compile and render}.

A fresh process, because the peak resident size (ru_maxrss) only ever grows: measured in the test process,
one attack would hide the next. Used by tests/chat/test_templates.py."""

import json
import resource
import sys
import time

from localllm.chat.templates import ChatTemplate
from localllm.errors import TemplateError

MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def conversation(kilobytes: int) -> list[dict]:
    """The two messages, the user's `kilobytes` kB of short lines when asked (python template_attack.py KB):
    the room a caller gives a render grows with the conversation, so attacks must hold with a long one."""
    if not kilobytes:
        return MESSAGES
    line = "a line of the user's text\n"
    return [{"role": "user", "content": line * (kilobytes * 1024 // len(line))}, MESSAGES[1]]


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
    messages = conversation(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    ChatTemplate("{{ messages[0].content }}", "gguf").apply(MESSAGES)  # warm: jinja2 and the sandbox loaded
    _cap_address_space(1024)
    baseline = _peak_mb()
    error = None
    started = time.process_time()
    try:
        template = ChatTemplate(source, "gguf")
    except TemplateError as exc:
        template, error = None, str(exc)
    compiled = time.process_time()
    if template is not None:
        try:
            template.apply(messages)
        except TemplateError as exc:
            error = str(exc)
    rendered = time.process_time()
    print(json.dumps({"error": error, "cpu_s": rendered - compiled, "compile_s": compiled - started,
                      "rss_growth_mb": _peak_mb() - baseline}))


if __name__ == "__main__":
    main()
