"""`localllm chat [MODEL]`: an interactive conversation, streamed, with slash commands.

The conversation itself (messages, settings, the KV cache kept across turns, save/load) is
localllm.chat.conversation.Conversation; this module reads lines and prints events.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from ..errors import LocalLLMError, os_error_message
from . import options as opt
from . import ui

PROMPT = ">>> "
CONTINUATION = "... "
MULTILINE = '"""'

HELP = """\
Commands:
  /set                 show the settings
  /set NAME VALUE      temperature, top_k, top_p, min_p, repeat_penalty (none = the model's default),
                       seed (none = random), max_tokens, ctx (a new KV cache; the conversation stays),
                       system (the rest of the line), verbose on|off
  /show                the model and the current settings
  /stats               timings of the last reply and how full the context is
  /clear               forget the conversation (the system prompt stays)
  /regen               answer the last message again
  /save FILE           save the conversation as JSON
  /load FILE           load a conversation saved with /save
  /bye                 exit (Ctrl-D works too)
Start and end a multi-line message with \"\"\". Ctrl-C stops a reply; the conversation goes on."""


def chat(
    model: Optional[str] = opt.Model,
    system: Optional[str] = typer.Option(None, "--system", help="System prompt.", envvar="LOCALLLM_SYSTEM"),
    max_tokens: int = typer.Option(512, "--max-tokens", "-n", help="Longest reply, in tokens."),
    temperature: float = opt.Temperature,
    top_k: int = opt.TopK,
    top_p: float = opt.TopP,
    min_p: float = opt.MinP,
    repeat_penalty: Optional[float] = opt.RepeatPenalty,
    seed: Optional[int] = opt.Seed,
    grammar: Optional[str] = opt.GrammarFile,
    json_schema: Optional[str] = opt.JsonSchema,
    lookup: bool = opt.Lookup,
    draft: Optional[str] = opt.Draft,
    draft_max: int = opt.DraftMax,
    ctx: Optional[int] = opt.Ctx,
    threads: Optional[int] = opt.Threads,
    backend: str = opt.Backend,
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Print time to first token and speeds after each reply."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Download the model without asking if it is not local."),
) -> None:
    """Chat with a model (default: the built-in Gemma 3 270M)."""
    from ..chat.conversation import ChatSettings, Conversation

    settings = ChatSettings(
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
        seed=seed, max_tokens=max_tokens, verbose=verbose, grammar=opt.grammar_option(grammar, json_schema),
    )
    try:
        settings.sampling()
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if max_tokens < 1:
        raise typer.BadParameter("--max-tokens must be >= 1")
    from ..remote.config import Remote

    target = opt.target(model, yes)
    if isinstance(target, Remote):
        llm = opt.remote_model(target, ctx=ctx, draft=draft)
        settings.grammar, schema = opt.remote_constraint(grammar, json_schema)
        ui.err_console.print(f"[dim]{ui.markup_safe(llm.model_name)} on {ui.markup_safe(llm.remote.url)} "
                             f"({ui.markup_safe(llm.engine)})[/dim]", soft_wrap=True)
        from ..remote.conversation import RemoteConversation

        Repl(RemoteConversation(llm, system=system, settings=settings, json_schema=schema), threads).run()
        return
    llm = load_with_status(target, ctx, threads, yes, backend)
    llm.check_generates()
    speculation = opt.speculation(llm, lookup, draft, draft_max, threads, backend, yes)
    if llm.is_base_model:
        ui.console.print(f"[yellow]{base_model_note(llm)}[/yellow]", soft_wrap=True)
    conversation = Conversation(llm, system=system, settings=settings, speculation=speculation)
    Repl(conversation, threads).run()


# Suggested when the registry has no chat-tuned model of the base model's family: small, and quick to pull.
FALLBACK_TUNED_MODEL = "gemma-3-270m-it"


def base_model_note(llm) -> str:
    """The banner's one line for a base model: what chat does with it and which tuned model to pull."""
    name = llm.reader.metadata.get("general.name") or Path(llm.path).stem
    return (f"{name} is a base model, not tuned for chat: it answers through a plain User/Assistant transcript. "
            f"For a real assistant: localllm pull {tuned_suggestion(llm.reader.metadata)}")


def tuned_suggestion(meta) -> str:
    """A registry entry tuned for chat: the same family and size as the base model when there is one
    (general.basename "gemma-3" + size_label "270M" -> gemma-3-270m-it), else one of its family, else the
    small Gemma 3 one."""
    from ..chat.builtin import looks_instruction_tuned
    from ..hub.registry import default_registry

    family = str(meta.get("general.basename") or "").lower()
    size = str(meta.get("general.size_label") or "").lower()
    tuned = [e for e in default_registry().entries if e.supported and looks_instruction_tuned({}, e.name)]
    same_family = [e for e in tuned if e.family == family]
    for entry in [e for e in same_family if e.params == size] + same_family:
        return entry.name
    return FALLBACK_TUNED_MODEL



def load_with_status(path: Path, ctx: Optional[int], threads: Optional[int], yes: bool = False, backend: str = "cpu"):
    """Say what the model at `path` will take in memory, then load it with a spinner."""
    from ..api import estimate_memory, load_path

    memory = estimate_memory(path, ctx, check=True)  # a context that cannot fit: one error line, nothing else
    ui.err_console.print(
        f"[dim]{Path(path).name}: {ui.human_bytes(memory.weights_bytes)} of weights + "
        f"{ui.human_bytes(memory.kv_bytes)} KV cache for {memory.n_ctx} tokens[/dim]", soft_wrap=True
    )
    with ui.err_console.status(f"loading {Path(path).name}"):
        llm = load_path(path, n_ctx=ctx, threads=threads, backend=backend)  # checks the cache fits first
    with ui.err_console.status("preparing the kernels (on a first run, the faster ones then compile in the background)"):
        llm.warm_up()
    return llm


class Repl:
    def __init__(self, conversation, threads: Optional[int]):
        self.conversation = conversation
        self.threads = threads
        self.history_file = _history_path()

    # -- the loop --

    def run(self) -> None:
        self._setup_readline()
        ui.console.print("[dim]Type a message, /help for commands, /bye or Ctrl-D to exit.[/dim]")
        while True:
            try:
                line = self._read_message()
            except EOFError:
                sys.stdout.write("\n")
                return
            except KeyboardInterrupt:
                sys.stdout.write("\n")
                ui.console.print("[dim](Ctrl-D or /bye to exit)[/dim]")
                continue
            if line is None or not line.strip():
                continue
            if line.startswith("/"):
                if self._command(line.strip()) == "bye":
                    return
                continue
            self._stream(lambda: self.conversation.send(line))

    def _read_message(self) -> Optional[str]:
        line = input(PROMPT)
        if not line.lstrip().startswith(MULTILINE):
            return line
        text = line.lstrip()[len(MULTILINE):]
        lines = []
        while True:
            if text.rstrip().endswith(MULTILINE):
                lines.append(text.rstrip()[: -len(MULTILINE)])
                return "\n".join(lines)
            lines.append(text)
            text = input(CONTINUATION)

    def _stream(self, start) -> None:
        """Print a reply as it is generated; Ctrl-C stops it and keeps the conversation."""
        conversation = self.conversation
        try:
            stream = start()
        except LocalLLMError as exc:
            ui.err_console.print(f"error: {ui.markup_safe(exc)}")
            return
        try:
            for event in stream:
                if event.kind == "token":
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
        except KeyboardInterrupt:
            stream.close()
            sys.stdout.write("\n")
            ui.console.print("[dim](stopped)[/dim]")
            return
        except LocalLLMError as exc:
            sys.stdout.write("\n")
            ui.err_console.print(f"error: {ui.markup_safe(exc)}")
            return
        sys.stdout.write("\n")
        last = conversation.last
        if last and last.dropped_messages:
            ui.console.print(f"[yellow]The conversation was longer than the context ({last.n_ctx} tokens): the "
                             f"{last.dropped_messages} oldest message(s) were left out of it.[/yellow]")
        if conversation.settings.verbose and last:
            ui.console.print(f"[dim]{ui.timing_summary(last.timings, last.context_used, last.n_ctx)}[/dim]")
        if conversation.near_full():
            used, n_ctx = conversation.context_used(), conversation.model.n_ctx
            ui.console.print(f"[yellow]Context {used}/{n_ctx} tokens: the oldest messages will be dropped soon "
                             "(/clear starts over, /set ctx N makes room).[/yellow]")

    # -- slash commands --

    def _command(self, line: str) -> Optional[str]:
        name, _, rest = line.partition(" ")
        rest = rest.strip()
        handlers = {
            "/bye": lambda: "bye", "/exit": lambda: "bye", "/quit": lambda: "bye",
            "/help": self._help, "/?": self._help,
            "/set": lambda: self._set(rest),
            "/show": self._show,
            "/stats": self._stats,
            "/clear": self._clear,
            "/regen": lambda: self._stream(self.conversation.regenerate),
            "/save": lambda: self._save(rest),
            "/load": lambda: self._load(rest),
        }
        handler = handlers.get(name)
        if handler is None:
            ui.err_console.print(f"unknown command {ui.markup_safe(name)} (/help lists them)")
            return None
        try:
            return handler()
        except LocalLLMError as exc:
            ui.err_console.print(f"error: {ui.markup_safe(exc)}")
        except OSError as exc:
            ui.err_console.print(f"error: {ui.markup_safe(os_error_message(exc))}")
        return None

    def _help(self) -> None:
        ui.console.print(HELP, markup=False)

    def _set(self, rest: str) -> None:
        conversation = self.conversation
        if not rest:
            self._print_settings()
            return
        name, _, value = rest.partition(" ")
        if name == "system":
            conversation.set_system(value.strip() or None)
            ui.console.print("[dim]system prompt " + ("set" if value.strip() else "cleared") + "[/dim]")
            return
        if name == "ctx":
            self._reload_with_ctx(value)
            return
        if not value.strip():
            raise LocalLLMError(f"/set {name} needs a value")
        conversation.settings.set(name, value)
        ui.console.print(f"[dim]{name} = {getattr(conversation.settings, name)}[/dim]")

    def _reload_with_ctx(self, value: str) -> None:
        """A new KV cache of that size for the same model and conversation; a size that cannot be used
        (not an integer, under 16, a cache that would not fit in memory) changes nothing."""
        try:
            n_ctx = int(value)
        except ValueError:
            raise LocalLLMError(f"ctx must be an integer, got '{value.strip()}'") from None
        self.conversation.set_context(n_ctx)
        ui.console.print(f"[dim]context = {self.conversation.model.n_ctx} tokens[/dim]")

    def _print_settings(self) -> None:
        conversation = self.conversation
        model = conversation.model
        remote = getattr(model, "is_remote", False)
        for key, value in vars(conversation.settings).items():
            if key == "repeat_penalty" and value is None:  # a remote model: not sent, the engine's own applies
                value = "the engine's default" if remote else f"{model.chat_repeat_penalty()} (the model's default)"
            if key == "grammar" and value is not None:  # the whole GBNF text would flood the screen
                value = f"{value.count(chr(10)) + 1} lines of GBNF (--grammar / --json-schema)"
            ui.console.print(f"  {key:<15} {value}", markup=False)
        if remote:  # what the remote says of itself (its model list), in place of the file's context and template
            for key, value in model.describe().items():
                ui.console.print(f"  {key:<15} {value if value is not None else 'not reported'}", markup=False)
        else:
            ui.console.print(f"  {'ctx':<15} {model.n_ctx} (trained on {model.trained_ctx})")
            ui.console.print(f"  {'template':<15} {model.chat_template.name}"
                             + (" (base model: a plain transcript)" if model.is_base_model else ""))
        ui.console.print(f"  {'system':<15} {conversation.system!r}")

    def _show(self) -> None:
        from ..model.info import describe

        model = self.conversation.model
        if getattr(model, "is_remote", False):  # no file to describe
            self._print_settings()
            return
        info = describe(model.reader)
        # the context in use, as the banner and /stats give it, beside the trained length describe() reads
        info["context_length"] = f"{model.n_ctx} (trained on {model.trained_ctx})"
        ui.print_model_summary(info)
        ui.console.print("[bold]settings[/bold]")
        self._print_settings()

    def _stats(self) -> None:
        conversation = self.conversation
        if conversation.last:
            last = conversation.last
            ui.console.print(ui.timing_summary(last.timings, last.context_used, last.n_ctx))
        else:
            ui.console.print("no reply yet")
        n_ctx = conversation.model.n_ctx  # None: a remote that does not say
        ui.console.print(f"context: {conversation.context_used()}" + (f" of {n_ctx}" if n_ctx else "") + " tokens, "
                         f"{len(conversation.messages)} messages")

    def _clear(self) -> None:
        self.conversation.clear()
        ui.console.print("[dim]conversation cleared[/dim]")

    def _save(self, rest: str) -> None:
        if not rest:
            raise LocalLLMError("/save needs a file name")
        self.conversation.save(Path(rest))
        ui.console.print(f"[dim]saved {len(self.conversation.messages)} messages to {ui.markup_safe(rest)}[/dim]")

    def _load(self, rest: str) -> None:
        if not rest:
            raise LocalLLMError("/load needs a file name")
        self.conversation.load(Path(rest))
        messages = self.conversation.messages
        ui.console.print(f"[dim]loaded {len(messages)} messages from {ui.markup_safe(rest)}[/dim]")
        for message in messages:
            if message["role"] != "system":
                ui.console.print(f"[bold]{ui.markup_safe(message['role'])}:[/bold] {ui.markup_safe(message['content'], keep_newlines=True)}")

    # -- readline --

    def _setup_readline(self) -> None:
        try:
            import readline
        except ImportError:  # pragma: no cover - Windows without pyreadline
            return
        try:
            self.history_file.parent.mkdir(parents=True, exist_ok=True)
            if self.history_file.exists():
                readline.read_history_file(self.history_file)
            readline.set_history_length(1000)
        except OSError:
            return
        import atexit

        atexit.register(_save_history, readline, self.history_file)


def _save_history(readline, path: Path) -> None:
    try:
        readline.write_history_file(path)
    except OSError:
        pass


def _history_path() -> Path:
    from ..runtime import history_path

    return history_path()
