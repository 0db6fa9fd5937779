"""Per-type driver kernels (matvec, batched matvec, tile dequantization, row gather), generated as real
source files from the templates in backends/cpu/templates/.

Each driver calls one quant type's kernels, taken from its record (quant_kernels.kernel_record), which
Numba inlines, so there is one compiled driver per type. Written as closures they were never served from
Numba's on-disk cache (its key for a closure includes the pickled callee, which differs from process to
process), so every start recompiled them: 2.6 s before the first token of Gemma 3 270M, measured.
Generated modules are plain files, which Numba caches like any other; the file name carries the hash of
every kernel source and template (jit.kernel_sources_hash), so a change to any kernel produces a new file
(and no stale cached code). Files live in <user cache>/localllm/kernels (XDG_CACHE_HOME respected;
LOCALLLM_KERNEL_DIR overrides).

The modules, by the record's multi-row strategy:
- drivers_<type>: matvec (grid types: four rows at a time with dot_4x1), matvec_rows for the grid and pair
  types (dot_1x4, or the pair kernels), dequant_rows and gather_rows;
- rowsk_<type>: the K-quants' matvec_rows on their row kernels (rows_16/8/4/2);
- rows_<type>: the other types' matvec_rows, one vec_dot per weight and activation row.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import uuid
from functools import lru_cache
from importlib import resources
from pathlib import Path

from ...jit import kernel_sources_hash
from ...runtime import kernel_dir
from .quant_kernels import KernelRecord, kernel_record
from .quant_kernels.pairs import pair_kernel_names


@lru_cache(maxsize=None)
def template(name: str) -> str:
    """The text of backends/cpu/templates/<name>.py.tmpl (str.format placeholders in braces)."""
    return resources.files(__package__).joinpath("templates", f"{name}.py.tmpl").read_text()


def _header(record: KernelRecord, bindings: list[str], imports: list[str] = ()) -> str:
    return template("header").format(
        name=record.name, imports="".join(f"{line}\n" for line in imports), bindings="\n".join(bindings)
    )


def _activation_args(record: KernelRecord) -> tuple[str, str]:
    """The pairing format's arguments in a one-row call and in row t of a batched call."""
    if record.act == "f32":
        return "x", "x[t]"
    return "qs, d, s", "qs[t], d[t], s[t]"


def _pair_calls(kernel: str, first_pair: str, first_row: str, width: int) -> str:
    return template("pair_calls").format(kernel=kernel, first_pair=first_pair, first_row=first_row, width=width).rstrip("\n")


def _pairs_rows_source() -> str:
    """pairs_rows with its six runs of pair-kernel calls: 8, 4 and 2 activation rows a call, on the
    spread or the compact pair layout."""
    runs = {"8": ("4 * g", "8 * g"), "4": ("4 * eights", "8 * eights"), "2": ("pairs - 1", "2 * pairs - 2")}
    calls = {}
    for width, (first_pair, first_row) in runs.items():
        for layout in ("spread", "pairs"):
            calls[f"{layout}_{width}"] = _pair_calls(f"dot_{layout}_4x{width}", first_pair, first_row, int(width))
    return template("pairs_rows").format(**calls)


# grid_matvec's path for the matrices from apart_min_bytes: row i of each quarter a step (dot_apart), the
# last N % 4 rows one by one.
_APART_PATH = """    if weights.size >= {min_bytes}:
        q = weights.shape[0] // 4
        for i in prange(q):
            out[i], out[q + i], out[2 * q + i], out[3 * q + i] = dot_apart(weights, i, q, qs, d, s, d.shape[0])
        for r in range(4 * q, weights.shape[0]):
            out[r] = vec_dot(weights[r], qs, d, s)
        return
"""


def _grid_matvec_source(grid) -> str:
    """grid_matvec, with the path of matrices from apart_min_bytes where the type has dot_apart."""
    if grid.dot_apart is None:
        return template("grid_matvec").format(apart="", apart_doc="")
    doc = f"; a matrix of at least {grid.apart_min_bytes}\n    bytes four rows a quarter of the matrix apart a step (dot_apart)"
    return template("grid_matvec").format(apart=_APART_PATH.format(min_bytes=grid.apart_min_bytes), apart_doc=doc)


def _drivers_source(record: KernelRecord) -> str:
    args, _ = _activation_args(record)
    bindings = ["vec_dot = kernels.vec_dot", "dequantize_row = kernels.dequantize_row"]
    if record.grid is None:
        return _header(record, bindings) + template("matvec").format(args=args) + template("row_helpers")
    bindings += ["dot_4x1 = kernels.grid.dot_4x1", "dot_1x4 = kernels.grid.dot_1x4"]
    source = _grid_matvec_source(record.grid)
    if record.grid.dot_apart is not None:
        bindings.append("dot_apart = kernels.grid.dot_apart")
    if record.pairs is None:
        return _header(record, bindings) + source + template("grid_rows") + template("row_helpers")
    imports = [
        "from localllm.backends.cpu.quant_kernels.pairs import CHUNK_ROWS, PAIR_ROWS, SPREAD_BLOCK_BYTES, "
        "SPREAD_MAX_BYTES, aligned_rows, pair_activations, store_dots"
    ]
    bindings += ["ZERO_POINT = kernels.pairs.zero_point", "QUAD_ZERO = kernels.pairs.quad_zero"]
    bindings += [f"{name} = kernels.pairs.kernels[{name!r}]" for name in pair_kernel_names()]
    return _header(record, bindings, imports) + source + _pairs_rows_source() + template("row_helpers")


def _kquant_rows_source(record: KernelRecord) -> str:
    imports = ["from localllm.backends.cpu.quant_kernels.vector import PREFETCH_BYTES"]
    bindings = ["vec_dot = kernels.vec_dot"] + [
        f"{name} = kernels.rows.{name}" for name in ("pack", "rows_2", "rows_4", "rows_8", "rows_16")
    ]
    return _header(record, bindings, imports) + template("kquant_rows").format(
        out16=", ".join(f"out[t + {i}, r]" for i in range(16)),
        acc16=", ".join(f"a[t + {i}]" for i in range(16)),
    )


def _rows_source(record: KernelRecord) -> str:
    args, row_args = _activation_args(record)
    return _header(record, ["vec_dot = kernels.vec_dot"]) + template("rows").format(args=args, row_args=row_args)


@lru_cache(maxsize=None)
def drivers(qt):
    """The generated driver module for a QuantType (written on first use, then imported)."""
    record = kernel_record(qt)
    return _generated(f"drivers_{record.name.lower()}", kernel_sources_hash(), _drivers_source(record))


@lru_cache(maxsize=None)
def row_drivers(qt):
    """The generated multi-row matvec module for a QuantType (the main driver module where it has
    grid kernels)."""
    record = kernel_record(qt)
    if record.grid is not None:
        return drivers(qt)
    if record.rows is not None:
        return _generated(f"rowsk_{record.name.lower()}", kernel_sources_hash(), _kquant_rows_source(record))
    return _generated(f"rows_{record.name.lower()}", kernel_sources_hash(), _rows_source(record))


# A generated file superseded by a new version of its family (other kernel sources) is deleted, with
# Numba's cache files for it, once it is this old: a process of the other localllm version may still
# be running from it (a second checkout, an upgrade under a running server). Without this, every edit of
# the kernel sources left its files behind (a developer's folder: 1,230 files and 5,058 cache files,
# 202 MB).
SUPERSEDED_KEEP_SECONDS = 3600
_VERSION = re.compile(r"[0-9a-f]{16}(_[0-9a-f]{8})?")  # kernel_sources_hash() (and the template tag of older rows_ files)


class _KernelFolder:
    """Where this process writes and imports its generated drivers: the folder of the first CPUBackend's
    settings (runtime.kernel_dir, the folder its tier marker and background compile use too); before any
    backend, the one the environment names. One per process: a generated module is imported once, under
    a name that does not carry the folder."""

    def __init__(self):
        self.chosen: Path | None = None

    def use(self, folder: Path) -> None:
        if self.chosen is None:
            self.chosen = Path(folder)

    def path(self) -> Path:
        return self.chosen if self.chosen is not None else kernel_dir()


KERNEL_FOLDER = _KernelFolder()


def _generated(family: str, version: str, source: str):
    """Write `source` as <kernel_dir>/<family>_<version>.py (once) and import it; writing a new version
    deletes the family's old ones (SUPERSEDED_KEEP_SECONDS)."""
    stem = f"{family}_{version}"
    folder = KERNEL_FOLDER.path()
    path = folder / f"{stem}.py"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "w") as fh:
            fh.write(source)
        os.replace(tmp, path)  # atomic: a concurrent process sees the whole file or none
        _delete_superseded(folder, family, stem)
    name = f"localllm_kernels_{stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    # Registered before it runs: Numba's cache records the module of each kernel's environment and
    # imports it by name when loading (an unregistered module is recorded as '<dynamic>' and fails).
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _delete_superseded(folder: Path, family: str, current: str) -> None:
    """Delete the other versions of `family` (and their Numba cache files) not modified for
    SUPERSEDED_KEEP_SECONDS. Best effort: a file another process removes first is skipped."""
    import time

    cutoff = time.time() - SUPERSEDED_KEEP_SECONDS
    for old in folder.glob(f"{family}_*.py"):
        if old.stem == current or not _VERSION.fullmatch(old.stem[len(family) + 1 :]):
            continue  # not a version of this family (a name that merely starts like it)
        try:
            if old.stat().st_mtime > cutoff:
                continue
            old.unlink()
            for cached in (folder / "__pycache__").glob(f"{old.stem}.*"):
                cached.unlink()
        except OSError:
            continue
