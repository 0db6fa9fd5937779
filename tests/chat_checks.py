"""`localllm chat` driven through a pseudo-terminal on a tiny model (shared by the family tests)."""

from __future__ import annotations

import os
import sys

import pexpect


def chat_replies(path: str, lines, workdir) -> list[str]:
    """Send each of `lines` to `localllm chat PATH` (greedy, 12 tokens a reply, history under workdir) and
    return the text printed after each, up to the next prompt; then /bye, which must exit 0."""
    env = dict(os.environ, LOCALLLM_HISTORY=str(workdir / "history"), TERM="dumb", NO_COLOR="1", COLUMNS="200")
    command = [sys.executable, "-m", "localllm.cli.app", "chat", path, "--ctx", "256", "-n", "12", "--temperature", "0"]
    child = pexpect.spawn(command[0], command[1:], env=env, encoding="utf-8", timeout=120, cwd=str(workdir))
    try:
        child.expect_exact(">>> ")
        replies = []
        for line in lines:
            child.sendline(line)
            child.expect_exact(">>> ")
            replies.append(child.before.replace("\r\n", "\n").split("\n", 1)[1])
        child.sendline("/bye")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    return replies
