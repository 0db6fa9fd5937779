"""Quantize a GGUF file into another: stream tensors one at a time through the plan's writer.

Memory: the input is memory-mapped; each tensor is converted in chunks of rows (dequantized to float32
with the type's NumPy reference, then quantized by the target type's quantizer), into one buffer the size
of that tensor's output bytes, which the streaming writer appends to the temporary file. The peak is one
output tensor plus one float32 chunk, whatever the model's size.

Threads: the K-quant and IQ4 quantizers are Numba kernels parallel over blocks (`prange`); the thread
count is set for the run and restored afterwards.
"""

from __future__ import annotations

import errno
import os
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np

from .. import quant
from ..errors import InsufficientDiskSpace
from ..gguf import GGUFReader
from ..gguf.writer import check_new_output
from .plan import QuantizePlan, TensorPlan, make_plan, resolve_file_type
from .recipes import QuantizeError

CHUNK_VALUES = 1 << 22  # float32 values converted per step (16 MiB): bounds memory, keeps progress moving

# progress(tensor index, tensor plan, fraction of that tensor done)
Progress = Callable[[int, TensorPlan, float], None]


@dataclass
class QuantizeResult:
    plan: QuantizePlan
    path: Path
    seconds: float
    threads: int


def check_output(input_path: Path, output_path: Path, force: bool) -> None:
    """Refuse, before anything is read: an output that is the input, a directory, an existing file without
    `force`, or one in a directory that does not exist (never created: as llama-quantize)."""
    if output_path.exists() and output_path.resolve() == input_path.resolve():
        raise QuantizeError(f"{output_path}: the output would overwrite the input")
    check_new_output(output_path, force, QuantizeError)


def quantize_file(
    input_path,
    output_path,
    file_type: str,
    *,
    output_type: Optional[str] = None,
    token_embedding_type: Optional[str] = None,
    pure: bool = False,
    allow_requantize: bool = False,
    force: bool = False,
    threads: Optional[int] = None,
    progress: Optional[Progress] = None,
    on_plan: Optional[Callable[[QuantizePlan], None]] = None,
) -> QuantizeResult:
    """Write OUTPUT, `file_type`'s mix of INPUT (a GGUF file, or a Hugging Face model directory), under a
    temporary name renamed into place only when complete. `on_plan` sees the plan before any tensor is
    converted (the CLI prints warnings there)."""
    input_path, output_path = Path(input_path), Path(output_path)
    file_type = resolve_file_type(file_type)
    check_output(input_path, output_path, force)
    with _gguf_input(input_path, output_path) as gguf_path, GGUFReader(gguf_path) as reader:
        plan = make_plan(
            reader, output_path, file_type, output_type=output_type, token_embedding_type=token_embedding_type,
            pure=pure, allow_requantize=allow_requantize,
        )
        if on_plan is not None:
            on_plan(plan)
        start = time.perf_counter()
        with _numba_threads(threads) as used:
            with plan.writer.stream() as out:
                for index, tensor in enumerate(plan.tensors):
                    out.write_tensor(tensor.name, convert_tensor(reader, tensor, index, progress))
        return QuantizeResult(plan, output_path, time.perf_counter() - start, used)


def dry_run(input_path, file_type: str, **options) -> QuantizePlan:
    """The plan (types, sizes, output file size) without converting or writing anything."""
    with GGUFReader(input_path) as reader:
        return make_plan(reader, Path(input_path).with_suffix(".dry-run"), file_type, **options)


def convert_tensor(reader: GGUFReader, tensor: TensorPlan, index: int = 0, progress: Optional[Progress] = None) -> np.ndarray:
    """The output bytes of one tensor, uint8[n_rows, dst_row_bytes] (a view of the input when copied)."""
    src = reader.tensor_bytes(tensor.name)  # [n_rows, src_row_bytes]
    if not tensor.converts:
        if progress:
            progress(index, tensor, 1.0)
        return src
    src_q, dst_q = quant.get(tensor.src_type), quant.get(tensor.dst_type)
    n_rows = src.shape[0]
    out = np.empty((n_rows, dst_q.row_bytes(tensor.shape[0])), dtype=np.uint8)
    step = max(1, CHUNK_VALUES // tensor.shape[0])
    for first in range(0, n_rows, step):
        rows = slice(first, min(first + step, n_rows))
        values = np.asarray(src_q.dequantize(src[rows]), dtype=np.float32)
        out[rows] = dst_q.quantize(values).reshape(values.shape[0], -1)
        if progress:
            progress(index, tensor, rows.stop / n_rows)
    return out


@contextmanager
def _numba_threads(threads: Optional[int]) -> Iterator[int]:
    import numba

    before = numba.get_num_threads()
    wanted = min(threads, numba.config.NUMBA_NUM_THREADS) if threads else before
    if wanted != before:
        numba.set_num_threads(wanted)
    try:
        yield wanted
    finally:
        if wanted != before:
            numba.set_num_threads(before)


@contextmanager
def _gguf_input(input_path: Path, output_path: Path) -> Iterator[Path]:
    """INPUT as a GGUF file: itself, or for a Hugging Face model directory a temporary F32 GGUF next to
    the output (written by localllm.convert.hf, removed afterwards)."""
    if not input_path.exists():
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(input_path))
    if not input_path.is_dir():
        yield input_path
        return
    from ..convert.hf import convert_checkpoint  # engineer D's converter; imported only when needed

    tmp = output_path.parent / f".{output_path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.f32.partial"
    try:
        try:
            convert_checkpoint(input_path, tmp, out_type="F32")
        except InsufficientDiskSpace as exc:  # name the output the user gave, not the temporary file
            raise InsufficientDiskSpace(str(exc).replace(str(tmp), str(output_path))) from None
        except OSError as exc:
            if exc.filename is None or Path(exc.filename) != tmp:
                raise
            raise type(exc)(exc.errno, exc.strerror, str(output_path)) from None
        yield tmp
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
