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


def run_steps(governor, clock, n_steps, seconds_for, rows=1):
    """Run n_steps; seconds_for(setting) is how long a step takes on that setting. Returns the settings."""
    used = []
    for _ in range(n_steps):
        setting = governor.begin(rows)
        clock.now += seconds_for(setting)
        governor.end()
        used.append(setting)
    return used


def test_stays_on_all_threads_when_they_are_faster(clock):
    governor = DecodeThreads(2)
    used = run_steps(governor, clock, 600, lambda s: 0.010 if s == 2 else 0.014)
    assert used[:2] == [2, 2]
    assert used.count(1) <= 8  # only the tries: the third step, then ever rarer
    assert used[-100:].count(2) >= 99
    tries = [i for i, s in enumerate(used) if s == 1]
    gaps = np.diff(tries)
    assert list(gaps) == sorted(gaps) and gaps[-1] == DecodeThreads.EXPLORE_MAX  # backing off, capped


def test_falls_back_to_one_thread_under_load_and_returns(clock):
    governor = DecodeThreads(2)
    loaded = {"on": True}

    def seconds(setting):
        if loaded["on"]:
            return 0.080 if setting == 2 else 0.014  # a busy neighbour: every region waits on the worker
        return 0.010 if setting == 2 else 0.014

    used = run_steps(governor, clock, 200, seconds)
    assert used[10:].count(1) >= 185
    assert governor.best() == 1
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
    run_steps(governor, clock, 2, lambda s: 0.010)
    governor.begin(1)  # the step raises: end() is never called
    clock.now += 5.0
    run_steps(governor, clock, 1, lambda s: 0.010)
    assert max(governor._sizes[1].average.values()) < 0.02
