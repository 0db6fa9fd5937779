"""One reader of the `<arch>.*` hyperparameters (localllm/model/hparams.py): load (HParams), the quantize
plan (model_shape) and `localllm show` (model/info.describe) read the same keys; load and quantize refuse
what is out of range, show still describes it."""

from __future__ import annotations

import numpy as np
import pytest

from localllm.errors import GGUFError
from localllm.gguf import GGUFReader, GGUFWriter
from localllm.model.hparams import COUNT_KEYS, HParams, read_count
from localllm.model.info import describe
from localllm.quantize.plan import model_shape
from tiny_models import TINY_ARCHS, write_tiny_model


def write(tmp_path, arch="llama", drop=(), **metadata) -> str:
    """A tiny model of `arch` without the keys in `drop`, with `metadata` set over what it writes ('__' in a
    key: '.', 'ARCH': the architecture)."""
    original = GGUFWriter.write

    def patched(self):
        for key in drop:
            del self._kv[key.replace("ARCH", arch)]
        for key, value in metadata.items():
            self.add(key.replace("__", ".").replace("ARCH", arch), value)
        return original(self)

    GGUFWriter.write = patched
    try:
        return write_tiny_model(tmp_path / f"{arch}.gguf", arch, "F32", seed=1)
    finally:
        GGUFWriter.write = original


@pytest.mark.parametrize("arch", sorted(TINY_ARCHS))
def test_show_load_and_quantize_read_the_same_hyperparameters(tmp_path, arch):
    with GGUFReader(write(tmp_path, arch)) as reader:
        shown, hp, shape = describe(reader), HParams.from_reader(reader, n_vocab=1), model_shape(reader)
    # block_count for show and quantize; load runs the trunk, without a multi-token-prediction block (Qwen3.5)
    trunk = shown["n_layers"] - TINY_ARCHS[arch].mtp
    assert (trunk, shown["n_head"], shown["n_head_kv"]) == (hp.n_layer, hp.n_head, hp.n_head_kv)
    assert (shape.n_layer - TINY_ARCHS[arch].mtp, shape.n_head, shape.n_head_kv, shape.n_expert) == (
        hp.n_layer, hp.n_head, hp.n_head_kv, TINY_ARCHS[arch].n_expert)
    assert (shown["n_embd"], shown["n_ff"], shown["head_dim"], shown["context_length"]) == (
        hp.n_embd, hp.n_ff, hp.head_dim, hp.context_length)
    assert shown["rope_freq_base"] == hp.rope_base


def test_per_layer_head_counts_count_as_their_largest_entry_everywhere(tmp_path):
    path = write(tmp_path, ARCH__attention__head_count=np.array([4, 4], dtype=np.int32),
                 ARCH__attention__head_count_kv=np.array([1, 2], dtype=np.int32))
    with GGUFReader(path) as reader:
        shown, hp, shape = describe(reader), HParams.from_reader(reader, n_vocab=1), model_shape(reader)
    assert (shown["n_head"], shown["n_head_kv"]) == (hp.n_head, hp.n_head_kv) == (4, 2)
    assert (shape.n_head, shape.n_head_kv) == (4, 2)


def test_out_of_range_values_are_refused_by_load_and_quantize_and_shown_by_show(tmp_path):
    path = write(tmp_path, ARCH__attention__head_count=10**7)
    with GGUFReader(path) as reader:
        assert describe(reader)["n_head"] == 10**7
        for read in (lambda: HParams.from_reader(reader, n_vocab=1), lambda: model_shape(reader)):
            with pytest.raises(GGUFError, match=r"'llama\.attention\.head_count': must be at most 4096"):
                read()


def test_a_missing_key_is_null_in_show_and_named_by_load(tmp_path):
    path = write(tmp_path, drop=["ARCH.block_count"])
    with GGUFReader(path) as reader:
        assert describe(reader)["n_layers"] is None
        for read in (lambda: HParams.from_reader(reader, n_vocab=1), lambda: model_shape(reader)):
            with pytest.raises(GGUFError, match=r"'llama\.block_count': is missing"):
                read()


@pytest.mark.parametrize("name", sorted(COUNT_KEYS))
def test_every_count_key_is_checked_against_its_range(tmp_path, name):
    spec = COUNT_KEYS[name]
    path = write(tmp_path, **{f"ARCH.{spec.suffix}".replace(".", "__"): spec.low - 1})
    with GGUFReader(path) as reader:
        with pytest.raises(GGUFError, match=f"must be at least {spec.low}"):
            read_count(reader, name)
