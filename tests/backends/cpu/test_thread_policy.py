"""The CPU backend's thread policy (backends/cpu/threads.ThreadPolicy): the Numba thread count each op
runs on and BLAS's count per step, as the backend decided them before the split (CPUBackend._threads_for,
_parallel, _matvec and begin_step), case by case."""

from __future__ import annotations

import numba
import pytest

from localllm.backends.cpu import threads as threads_module
from localllm.backends.cpu.matmul import BLAS_MIN_ROWS
from localllm.backends.cpu.threads import SMALL_ATTENTION_WORK, SMALL_MATVEC_BYTES, SMALL_OP_WORK, BlasThreads, ThreadPolicy


class RecordingBlas:
    def __init__(self):
        self.limits = []

    def limit(self, n: int) -> None:
        self.limits.append(n)


class Governor:
    """Stands for DecodeThreads: the count of the step in progress."""

    def __init__(self, count: int):
        self.count = count

    def now(self) -> int:
        return self.count


@pytest.fixture
def numba_calls(monkeypatch):
    """The counts the policy sets (numba.set_num_threads), with Numba's count as the policy reads it."""
    calls = []
    monkeypatch.setattr(numba, "set_num_threads", calls.append)
    return calls


def make_policy(numba_calls, *, governor=2, now=1, serial=False, blas_matmuls=False) -> ThreadPolicy:
    policy = ThreadPolicy(2, BLAS_MIN_ROWS, blas=RecordingBlas())
    policy.decode = Governor(governor)
    policy.numba_now = lambda: now
    policy.serial = serial
    policy.matmuls_use_blas = blas_matmuls
    numba_calls.clear()
    return policy


# (for_op's arguments, the policy's state) -> the count it sets (Numba reads 1 beforehand: 1 sets nothing)
FOR_OP = [
    (dict(rows=1), {}, 2),  # a decode op: the governor's count
    (dict(rows=1), dict(governor=1), 1),
    (dict(rows=1, work=SMALL_OP_WORK - 1), {}, 1),  # a small op: the calling thread
    (dict(rows=1, work=SMALL_OP_WORK), {}, 2),
    (dict(rows=1, work=SMALL_ATTENTION_WORK - 1, limit=SMALL_ATTENTION_WORK), {}, 1),
    (dict(rows=1, work=SMALL_OP_WORK, limit=SMALL_ATTENTION_WORK), {}, 1),
    (dict(rows=1, work=SMALL_MATVEC_BYTES, limit=SMALL_MATVEC_BYTES), {}, 2),
    (dict(rows=BLAS_MIN_ROWS), dict(blas_matmuls=True), 1),  # a prefill beside BLAS products
    (dict(rows=BLAS_MIN_ROWS - 1), dict(blas_matmuls=True), 2),
    (dict(rows=BLAS_MIN_ROWS), {}, 2),  # a prefill, BLAS on one thread: the governor's count
    (dict(rows=BLAS_MIN_ROWS, blas=False), dict(blas_matmuls=True), 2),  # integer kernels never use BLAS
    (dict(rows=2, blas=True), {}, 1),  # a product through BLAS
    (dict(rows=1), dict(serial=True), 1),  # the basic tier
    (dict(rows=BLAS_MIN_ROWS, blas=False), dict(serial=True), 1),
]


@pytest.mark.parametrize("arguments, state, wanted", FOR_OP)
def test_for_op_sets_the_count_the_backend_set_before(numba_calls, arguments, state, wanted):
    policy = make_policy(numba_calls, **state)
    policy.for_op(**arguments)
    assert numba_calls == ([] if wanted == 1 else [wanted])
    policy.numba_now = lambda: 2  # Numba already on 2 threads: set again only when it differs
    policy.for_op(**arguments)
    assert numba_calls == ([] if wanted == 1 else [wanted]) + ([1] if wanted == 1 else [])


@pytest.mark.parametrize(
    "rows, work, limit, state, parallel, wanted",
    [
        (1, SMALL_OP_WORK - 1, 0, {}, False, None),  # the serial twin, Numba's count untouched
        (1, SMALL_OP_WORK, 0, {}, True, 2),
        (1, SMALL_OP_WORK, 0, dict(governor=1), True, None),  # parallel kernel, on the one thread set
        (1, SMALL_ATTENTION_WORK - 1, SMALL_ATTENTION_WORK, {}, False, None),
        (1, SMALL_ATTENTION_WORK, SMALL_ATTENTION_WORK, {}, True, 2),
        (BLAS_MIN_ROWS, 1 << 20, 0, dict(blas_matmuls=True), True, None),  # beside BLAS: one thread
        (BLAS_MIN_ROWS, 1 << 20, 0, dict(serial=True), False, None),
    ],
)
def test_parallel_says_which_kernel_and_sets_its_count(numba_calls, rows, work, limit, state, parallel, wanted):
    policy = make_policy(numba_calls, **state)
    assert policy.parallel(rows, work, limit) is parallel
    assert numba_calls == ([] if wanted is None else [wanted])


@pytest.mark.parametrize(
    "small, state, wanted",
    [(False, {}, 2), (True, {}, 1), (False, dict(governor=1), 1), (False, dict(serial=True), 1), (True, dict(serial=True), 1)],
)
def test_a_one_row_product_runs_on_the_governors_count_unless_small(numba_calls, small, state, wanted):
    policy = make_policy(numba_calls, **state)
    assert policy.for_matvec(small) == wanted
    assert numba_calls == ([] if wanted == 1 else [wanted])


@pytest.mark.parametrize("blas_matmuls, blas, attention", [(False, 1, 2), (True, 2, 1)])
def test_a_step_gives_blas_the_threads_only_where_products_use_it(numba_calls, blas_matmuls, blas, attention):
    policy = make_policy(numba_calls, blas_matmuls=blas_matmuls)
    policy.decode = threads_module.DecodeThreads(2)
    policy.begin_step(1)
    policy.end_step()
    assert policy._blas.limits == [2, blas]  # all the threads when made, then per step
    assert policy.attention_workers() == attention


def test_the_policy_starts_with_numbas_count_capped_and_blas_on_all_threads(numba_calls):
    blas = RecordingBlas()
    policy = ThreadPolicy(64, BLAS_MIN_ROWS, blas=blas)
    assert numba_calls == [numba.config.NUMBA_NUM_THREADS] and policy.numba_threads == numba.config.NUMBA_NUM_THREADS
    assert blas.limits == [64] and policy.decode.threads == policy.numba_threads
    assert not policy.serial and not policy.matmuls_use_blas
    first = policy.decode
    policy.restart_measurements()
    assert policy.decode is not first and policy.decode.threads == policy.numba_threads


def test_numbas_count_is_read_as_numba_reports_it():
    policy = ThreadPolicy(1, BLAS_MIN_ROWS, blas=RecordingBlas())
    assert policy.numba_now() == numba.get_num_threads() == 1


def test_blas_threads_are_set_only_when_they_change(monkeypatch):
    import threadpoolctl

    calls = []
    monkeypatch.setattr(threadpoolctl, "threadpool_limits", lambda limits, user_api: calls.append((limits, user_api)))
    blas = BlasThreads()
    for n in (2, 2, 1, 1, 2):
        blas.limit(n)
    assert calls == [(2, "blas"), (1, "blas"), (2, "blas")] and blas.count == 2
    assert isinstance(threads_module.BLAS_THREADS, BlasThreads)  # one per process, shared by every backend
