"""Generated driver files (backends/cpu/drivers.py): a new version of a family deletes the old ones."""

from __future__ import annotations

import os
import time

from localllm.backends.cpu import drivers


def test_a_new_version_deletes_old_versions_of_its_family_only(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALLLM_KERNEL_DIR", str(tmp_path))
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
    monkeypatch.setenv("LOCALLLM_KERNEL_DIR", str(tmp_path))
    current = tmp_path / "fam_z_fedcba9876543210.py"
    current.write_text("X = 1\n")
    old = tmp_path / "fam_z_0123456789abcdef.py"
    old.write_text("X = 0\n")
    os.utime(old, (0, 0))
    assert drivers._generated("fam_z", "fedcba9876543210", "X = 1\n").X == 1
    assert old.exists()  # only writing a new version prunes
