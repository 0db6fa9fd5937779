"""The CPU backend's choice of decode thread count (backends/cpu/threads.py), on a simulated clock."""

from __future__ import annotations

import numpy as np
import pytest

from localllm.backends.cpu import threads as threads_module
from localllm.backends.cpu.threads import DecodeThreads


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(threads_module.time, "perf_counter", fake)
    return fake


OPS_PER_STEP = 10


def run_steps(governor, clock, n_steps, seconds_for, rows=1, spent=None):
    """Run n_steps of OPS_PER_STEP ops; seconds_for(setting) is how long a step takes on that setting
    (each op takes a tenth, on the setting governor.now() gives it). Returns each step's setting as
    begin() chose it; `spent`, a list, receives each step's duration."""
    used = []
    for _ in range(n_steps):
        setting = governor.begin(rows)
        started = clock.now
        for _ in range(OPS_PER_STEP):
            clock.now += seconds_for(governor.now()) / OPS_PER_STEP
        governor.end()
        used.append(setting)
        if spent is not None:
            spent.append(clock.now - started)
    return used


def test_stays_on_all_threads_when_they_are_faster(clock):
    governor = DecodeThreads(2)
    used = run_steps(governor, clock, 600, lambda s: 0.010 if s == 2 else 0.014)
    assert used[:3] == [1, 1, 2]  # one thread until all threads have been tried, at the third step
    assert used[3:].count(1) <= 7  # then only the tries, ever rarer
    assert used[-100:].count(2) >= 99
    tries = [i for i, s in enumerate(used) if s == 1 and i >= 3]
    gaps = np.diff(tries)
    assert list(gaps) == sorted(gaps) and gaps[-1] == DecodeThreads.EXPLORE_MAX  # backing off, capped


def test_falls_back_to_one_thread_under_load_and_returns(clock):
    governor = DecodeThreads(2)
    loaded = {"on": True}

    def seconds(setting):
        if loaded["on"]:
            return 0.080 if setting == 2 else 0.014  # a busy neighbour: every region waits on the worker
        return 0.010 if setting == 2 else 0.014

    spent = []
    used = run_steps(governor, clock, 200, seconds, spent=spent)
    assert used.count(1) >= 195
    assert governor.best() == 1
    # every try of all threads under load was cut short: at most the deadline, the op that crossed it and
    # the rest on one thread (uncut, the try would take 0.080)
    assert max(spent) <= DecodeThreads.ABANDON_AFTER * 0.014 + 0.080 / OPS_PER_STEP + 0.014 + 1e-9 < 0.080
    loaded["on"] = False
    used = run_steps(governor, clock, 2 * DecodeThreads.EXPLORE_MAX + 20, seconds)
    assert governor.best() == 2
    assert used[-DecodeThreads.EXPLORE_MAX // 2 :].count(2) >= DecodeThreads.EXPLORE_MAX // 2 - 1


def test_step_sizes_are_judged_separately(clock):
    governor = DecodeThreads(2)
    run_steps(governor, clock, 100, lambda s: 0.010 if s == 2 else 0.014, rows=1)
    run_steps(governor, clock, 100, lambda s: 0.050 if s == 2 else 0.030, rows=4)
    assert governor.best(1) == 2
    assert governor.best(4) == 1


def test_one_thread_backend_never_measures(clock):
    governor = DecodeThreads(1)
    assert run_steps(governor, clock, 50, lambda s: 0.01) == [1] * 50


def test_a_step_that_raised_is_not_recorded(clock):
    governor = DecodeThreads(2)
    run_steps(governor, clock, 3, lambda s: 0.010)
    governor.begin(1)  # the step raises: end() is never called
    clock.now += 5.0
    run_steps(governor, clock, 1, lambda s: 0.010)
    assert max(governor._sizes[1].average.values()) < 0.02


def test_ops_outside_a_step_get_the_last_choice(clock):
    governor = DecodeThreads(2)
    assert governor.now() == 1  # before any step: one thread
    run_steps(governor, clock, 20, lambda s: 0.010 if s == 2 else 0.014)
    assert governor.now() == 2



def test_prompt_sizes_share_their_size_class_and_are_judged_per_row(clock):
    governor = DecodeThreads(2)
    assert [DecodeThreads.size_class(r) for r in (1, 8, 9, 16, 17, 31, 32, 33)] == [1, 8, 16, 16, 32, 32, 32, 64]
    sizes = [17, 30, 23, 19, 28, 31, 20, 25] * 3
    used = [run_steps(governor, clock, 1, lambda s, r=r: r * (0.001 if s == 2 else 0.0015), rows=r)[0] for r in sizes]
    assert used[:2] == [2, 2] and used[2] == 1  # one class, started on all threads; its third step tries one
    assert used[3:].count(2) >= len(used) - 4  # per row, two threads win whatever the sizes
    assert set(governor._sizes) == {32}


def test_large_steps_move_to_one_thread_when_it_is_faster_per_row(clock):
    governor = DecodeThreads(2)
    sizes = [40, 64, 50, 33, 60] * 4
    used = [run_steps(governor, clock, 1, lambda s, r=r: r * (0.004 if s == 2 else 0.002), rows=r)[0] for r in sizes]
    assert used[:3] == [2, 2, 1] and used[3:].count(1) >= len(used) - 5


def _blas_threads() -> int:
    import threadpoolctl

    return min(info["num_threads"] for info in threadpoolctl.threadpool_info() if info["user_api"] == "blas")


@pytest.mark.parametrize("qtype,tiles", [("Q8_0", True), ("F16", False), ("F16", True), ("Q4_1", False), ("Q4_1", True)])
def test_blas_keeps_its_threads_only_for_models_whose_products_use_it(tmp_path, monkeypatch, qtype, tiles):
    """With every matrix on our own kernels, BLAS serves prefill attention only, on one thread (its idle
    workers slowed the two-thread products); a type without multi-row kernels (Q4_1) multiplies a prompt
    through BLAS where its tile kernel is not used (tiles False: as on a target with neither AVX-512 VNNI
    nor AVX2, where legacy_tiles takes Q4_1 from NARROW_MIN_ROWS), and then BLAS keeps the backend's
    threads. Float weights never take BLAS (float_panels, on every target)."""
    import localllm
    from tiny_models import write_tiny_model

    from localllm.backends.cpu import matmul
    from localllm.backends.cpu.quant_kernels.legacy_tiles import narrow_available
    from localllm.backends.cpu.quant_kernels.q4_k_tiles import available

    if not tiles:
        monkeypatch.setattr(matmul, "_tiles_available", lambda: False)
        monkeypatch.setattr(matmul, "_narrow_tiles_available", lambda: False)
    products_use_blas = qtype == "Q4_1" and not (tiles and (available() or narrow_available()))
    model = localllm.load(write_tiny_model(tmp_path / f"{qtype}.gguf", "llama", qtype), n_ctx=64, threads=2)
    model.logits(list(range(2, 42)))  # a prefill through BLAS attention (40 rows)
    assert _blas_threads() == (2 if products_use_blas else 1)


def test_a_one_thread_try_of_a_large_step_is_cut_short_on_a_quiet_machine(clock):
    governor = DecodeThreads(2)
    spent = []
    used = [run_steps(governor, clock, 1, lambda s: 64 * (0.001 if s == 2 else 0.002), rows=64, spent=spent)[0]
            for _ in range(6)]
    assert used[:3] == [2, 2, 1]  # the third step tries one thread ...
    # ... which is behind the last all-thread step at its second op (the first where that step had done
    # MIN_PROGRESS): one op on one thread, nine on two, instead of 0.128 on one thread
    assert spent[2] == pytest.approx(0.0128 + 9 * 0.0064)
    assert governor._sizes[64].average[1] == pytest.approx(0.002)  # its projected time per row, recorded
    assert used[3:] == [2, 2, 2]


def test_a_try_within_the_margin_runs_to_its_end(clock):
    governor = DecodeThreads(2)
    spent = []
    used = [run_steps(governor, clock, 1, lambda s: 64 * (0.001 if s == 2 else 0.00115), rows=64, spent=spent)[0]
            for _ in range(4)]
    assert used[:3] == [2, 2, 1]
    assert spent[2] == pytest.approx(64 * 0.00115)  # 15% slower: under TRY_MARGIN, measured whole
    assert governor._sizes[64].average[1] == pytest.approx(0.00115)


def test_a_try_is_compared_per_row_with_a_step_of_another_size(clock):
    governor = DecodeThreads(2)
    sizes = [40, 64, 33, 50]  # one size class; the try (third step, 33 rows) meets the 64-row reference
    spent = []
    for r in sizes:
        run_steps(governor, clock, 1, lambda s, r=r: r * (0.001 if s == 2 else 0.002), rows=r, spent=spent)
    assert spent[2] == pytest.approx(33 * (0.0002 + 9 * 0.0001))  # cut after its first op, as at equal sizes
    assert governor._sizes[64].average[1] == pytest.approx(0.002)
