"""Typed errors: everything a user or a file can get wrong.

Each maps to one line on stderr and exit code 1 in the CLI (see localllm/cli/errors.py).
"""


def one_line(text: str) -> str:
    """`text` with control characters (newlines, terminal escapes) written as escapes: a message that
    quotes a file's bytes (a key, a tensor name) stays one line and cannot drive the terminal."""
    return "".join(c if c.isprintable() or c == " " else ascii(c)[1:-1] for c in text)


class LocalLLMError(Exception):
    """Base class of every error localllm raises on purpose."""


class GGUFError(LocalLLMError):
    """A GGUF file is malformed, truncated, hostile or unsupported.

    The message names the file, the field and the byte offset.
    """

    def __init__(self, path, field: str, offset: int | None, problem: str):
        self.path = str(path)
        self.field = field
        self.offset = offset
        self.problem = problem
        where = f" at byte {offset}" if offset is not None else ""
        super().__init__(one_line(f"{self.path}: {field}{where}: {problem}"))


class UnsupportedQuantType(LocalLLMError):
    """A tensor type that localllm cannot compute with."""


class UnsupportedArchitecture(LocalLLMError):
    """A model architecture that has no module in localllm/model/archs."""


class ModelNotFound(LocalLLMError):
    """A model name or path that resolves to nothing."""


class ChecksumMismatch(LocalLLMError):
    """A file whose SHA-256 differs from the one it must have."""


class TemplateError(LocalLLMError):
    """A chat template that fails to render, or tries to escape its sandbox."""


class ContextOverflow(LocalLLMError):
    """A prompt or conversation longer than the context window."""

    def __init__(self, n_tokens: int, n_ctx: int, what: str = "prompt"):
        self.n_tokens = n_tokens
        self.n_ctx = n_ctx
        super().__init__(
            f"{what} needs {n_tokens} tokens but the context holds {n_ctx}"
            " (raise it with --ctx, or shorten the input)"
        )


class TensorError(LocalLLMError):
    """A model tensor that is missing, mis-shaped or of the wrong type."""


class Unauthorized(LocalLLMError):
    """The Hub refused a download: a gated or private repository, or a token without access (see HF_TOKEN)."""


class NetworkError(LocalLLMError):
    """The Hub could not be reached, or a transfer broke off (a pull resumes when run again)."""


class InsufficientDiskSpace(LocalLLMError):
    """Not enough free space on disk for what is about to be written."""


class UnsupportedModelFile(LocalLLMError):
    """A model file localllm cannot take, such as a split GGUF (-00001-of-0000N)."""
