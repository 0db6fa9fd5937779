"""Typed errors: everything a user or a file can get wrong.

Each maps to one line on stderr and exit code 1 in the CLI (see localllm/cli/errors.py).
"""

import errno
import re


def escape_unprintable(text: str, keep: str = "") -> str:
    """`text` with every character that is not printable (ESC, BEL, CR, newlines, other C0/C1 controls,
    bidi overrides...) written as its Python escape (`\\x1b`, `\\r`, `\\u202e`), except those in `keep`."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else ascii(c)[1:-1] for c in text)


def one_line(text: str) -> str:
    """`text` with control characters (newlines, terminal escapes) written as escapes: a message that
    quotes a file's bytes (a key, a tensor name) stays one line and cannot drive the terminal."""
    return escape_unprintable(text)


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
    """Not enough free space on disk for what is about to be written (or was being written)."""


# -- the one wording of file-system failures (used by the CLI's error mapping and by the GGUF writer) --------

_OS_REASONS = {
    errno.ENOENT: "no such file",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EISDIR: "a directory, not a file",
    errno.ENOTDIR: "not a directory",
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "read-only file system",
    errno.EEXIST: "already exists",
    errno.ENAMETOOLONG: "name too long",
    errno.EIO: "input/output error (a failing disk?)",
}
NO_SUCH_DIRECTORY = "No such directory"  # strerror of missing_directory(): ENOENT said of a directory


def missing_directory(path) -> FileNotFoundError:
    """The error for an output whose directory does not exist (outputs never create directories)."""
    return FileNotFoundError(errno.ENOENT, NO_SUCH_DIRECTORY, str(path))


# The writers' temporary names: .NAME.PID.HEX8.partial (gguf/writer.py), .NAME.PID.HEX8.f32.partial
# (quantize of a Hugging Face directory); messages name NAME, the file the user asked for.
_TEMP_NAME = re.compile(r"(^|/)\.([^/]+)\.\d+\.[0-9a-f]{8}(?:\.f32)?\.partial$")


def user_path(path) -> str:
    """`path` as the user knows it: a writer's temporary name becomes the name of the file it stands for."""
    return _TEMP_NAME.sub(r"\1\2", str(path))


def os_error_message(exc: OSError, path=None) -> str:
    """'REASON: PATH' for a file-system failure, in words (no errno number, no temporary name), worded as
    model resolution words a missing model ("no such file: PATH"). `path` overrides the file the exception
    names."""
    if exc.strerror == NO_SUCH_DIRECTORY:
        reason = "no such directory"
    else:
        reason = _OS_REASONS.get(exc.errno) or (exc.strerror or str(exc) or type(exc).__name__).lower()
    where = path if path is not None else exc.filename
    if where is None:
        return one_line(reason if exc.errno is not None else str(exc) or reason)
    return one_line(f"{reason}: {user_path(where)}")


class UnsupportedModelFile(LocalLLMError):
    """A model file localllm cannot take, such as a split GGUF (-00001-of-0000N)."""
