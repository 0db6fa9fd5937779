"""Generated driver files (backends/cpu/drivers.py): a new version of a family deletes the old ones; the
drivers take their kernels from the one kernel table; the Numba configuration and the one kernel-source hash."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from localllm.backends.cpu import drivers


def _kernel_folder(monkeypatch, folder):
    """Generated drivers go to `folder` (the process's folder is fixed by its first CPUBackend, which an
    earlier test in the session has made)."""
    chosen = drivers._KernelFolder()
    chosen.use(folder)
    monkeypatch.setattr(drivers, "KERNEL_FOLDER", chosen)


def test_a_new_version_deletes_old_versions_of_its_family_only(tmp_path, monkeypatch):
    _kernel_folder(monkeypatch, tmp_path)
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    old_time = time.time() - drivers.SUPERSEDED_KEEP_SECONDS - 60
    files = {
        "old": tmp_path / "fam_x_0123456789abcdef.py",  # an old version of the family: goes
        "recent": tmp_path / "fam_x_1111111111111111.py",  # another version, but recent: stays
        "other": tmp_path / "fam_x_y_2222222222222222.py",  # family fam_x_y, not fam_x: stays
        "foreign": tmp_path / "fam_x_notes.py",  # not a version name: stays
    }
    for key, path in files.items():
        path.write_text("X = 0\n")
        if key != "recent":
            os.utime(path, (old_time, old_time))
    old_cache = cache / "fam_x_0123456789abcdef.kernel-3.py311.nbi"
    kept_cache = cache / "fam_x_y_2222222222222222.kernel-3.py311.nbi"
    old_cache.write_bytes(b"")
    kept_cache.write_bytes(b"")

    mod = drivers._generated("fam_x", "fedcba9876543210", "X = 42\n")

    assert mod.X == 42 and (tmp_path / "fam_x_fedcba9876543210.py").exists()
    assert not files["old"].exists() and not old_cache.exists()
    assert files["recent"].exists() and files["other"].exists() and files["foreign"].exists() and kept_cache.exists()


def test_an_existing_version_deletes_nothing(tmp_path, monkeypatch):
    _kernel_folder(monkeypatch, tmp_path)
    current = tmp_path / "fam_z_fedcba9876543210.py"
    current.write_text("X = 1\n")
    old = tmp_path / "fam_z_0123456789abcdef.py"
    old.write_text("X = 0\n")
    os.utime(old, (0, 0))
    assert drivers._generated("fam_z", "fedcba9876543210", "X = 1\n").X == 1
    assert old.exists()  # only writing a new version prunes


def test_importing_localllm_configures_nothing_until_configure_numba_runs():
    # Design rule 7: no import-time effects. Numba's SLP setting and cache locators change only when
    # configure_numba runs (the kernel table, quant.get or CPUBackend call it), and it is idempotent.
    code = (
        "import numba; from numba.core import caching\n"
        "before = numba.config.SLP_VECTORIZE\n"
        "import localllm, localllm.jit, localllm.quant, localllm.backends.cpu, localllm.backends.cpu.drivers\n"
        "def ours(): return sum(c.__name__.startswith('KernelSources') for c in caching.CacheImpl._locator_classes)\n"
        "print(numba.config.SLP_VECTORIZE == before, ours())\n"
        "localllm.jit.configure_numba(); localllm.jit.configure_numba()\n"
        "print(numba.config.SLP_VECTORIZE, ours())\n"
    )
    env = {**os.environ, "NUMBA_SLP_VECTORIZE": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == ["True", "0", "1", "3"]


@pytest.mark.parametrize("entry", [
    "from localllm.backends.cpu import CPUBackend; CPUBackend(threads=1)",
    "from localllm import quant; quant.get('Q4_K')",
    "from localllm.backends.cpu.quant_kernels import kernel_record; kernel_record('Q4_K')",
])
def test_every_entry_to_the_kernels_configures_numba_first(entry):
    # The tests' session fixture configures Numba for the whole suite, so a path that lost its call
    # (the CPU backend did once, in a merge) shows only in a process of its own.
    code = (
        "import numba; from numba.core import caching\n"
        f"{entry}\n"
        "ours = sum(c.__name__.startswith('KernelSources') for c in caching.CacheImpl._locator_classes)\n"
        "print(numba.config.SLP_VECTORIZE, ours)\n"
    )
    env = {**os.environ, "NUMBA_SLP_VECTORIZE": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == ["1", "3"]


def test_the_drivers_are_written_where_the_backends_settings_say(tmp_path):
    # The tier marker and the background compile use runtime.kernel_dir; the drivers must be generated
    # and imported from the same folder, also when the runtime is given rather than read from the
    # environment (else the parent would find the child's compiled drivers missing).
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from localllm import quant\n"
        "from localllm.runtime import Runtime\n"
        "from localllm.backends.cpu import CPUBackend, drivers\n"
        "runtime = Runtime.resolve(environ={'LOCALLLM_KERNEL_DIR': sys.argv[1]})\n"
        "CPUBackend(threads=1, runtime=runtime)\n"
        "print(Path(drivers.drivers(quant.get('Q8_0')).__file__).parent)\n"
    )
    env = {**os.environ, "LOCALLLM_KERNEL_DIR": str(tmp_path / "from-environment")}
    folder = tmp_path / "from-runtime"
    out = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, env=env,
                         check=True).stdout
    assert out.strip() == str(folder)
    assert not (tmp_path / "from-environment").exists()


def test_the_kernel_cache_stamp_carries_the_sources_hash_and_the_slp_setting():
    # A kernel compiled without the SLP vectorizer (or from other sources) is never served to a
    # configured process: both are in the stamp Numba compares before loading a cached kernel.
    import numba
    from numba.core import caching

    from localllm import jit
    from localllm.quant import q8_0

    jit.configure_numba()
    locators = [c for c in caching.CacheImpl._locator_classes if c.__name__.startswith("KernelSources")]
    py_func = q8_0.dequantize_row.py_func
    found = [c.from_function(py_func, py_func.__code__.co_filename) for c in locators]
    locator = next(found_one for found_one in found if found_one is not None)
    stamp = locator.get_source_stamp()
    assert stamp[1:] == (jit.kernel_sources_hash(), numba.config.SLP_VECTORIZE) and stamp[2] == 1


def test_every_type_has_one_kernel_record_and_its_drivers_call_the_records_kernels():
    from localllm import quant
    from localllm.backends.cpu.quant_kernels import kernel_record, kernel_records

    assert [record.name for record in kernel_records()] == quant.supported_names()
    for record in kernel_records():
        assert kernel_record(record.qt) is record and record.act == quant.get(record.name).act
        module = drivers.drivers(record.qt)
        assert (module.vec_dot, module.dequantize_row) == (record.vec_dot, record.dequantize_row)
        assert record.multirow in ("pairs", "rows", "grid", "one")
        assert record.has_multirow_kernels == (record.pairs is not None or record.rows is not None)


def test_every_kernel_source_and_template_is_in_the_one_hash():
    # The hash names the generated drivers and stamps Numba's cache: a file a kernel can inline that is
    # not in it could leave stale compiled code behind.
    from pathlib import Path

    from localllm import jit

    package = Path(jit.__file__).resolve().parent
    covered = {p.resolve() for folder in jit._KERNEL_DIRS for p in folder.glob("*.py*")} | set(jit._KERNEL_FILES)
    wanted = set((package / "quant").glob("*.py")) | set((package / "backends/cpu").glob("*.py"))
    wanted |= set((package / "backends/cpu/quant_kernels").glob("*.py")) | set((package / "backends/cpu/templates").glob("*.tmpl"))
    wanted.add(package / "jit.py")
    assert {p.resolve() for p in wanted} <= covered
