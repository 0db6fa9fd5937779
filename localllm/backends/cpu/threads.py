"""How the CPU backend uses threads: the policy (ThreadPolicy: how many threads each op runs on, and
BLAS's count) and the decode-step governor it consults (DecodeThreads).

Two settings work together:

1. How OpenMP's idle workers wait (Numba's threading layer here is OpenMP; libgomp reads the variables
   once, when Numba's pool first starts: configure_openmp_waiting, called by the first CPUBackend before
   it sets Numba's thread count). A decode step of Gemma 3 270M
   starts ~130 parallel regions tens of microseconds apart. A worker that sleeps between them
   (OMP_WAIT_POLICY=PASSIVE) takes ~7 us to wake each time, so only the largest matrices were worth
   a second thread; one that spins a while first (GOMP_SPINCOUNT) is there in ~1.5 us, and every
   per-layer matrix gains from two. Measured on the project's 2-core machine, 2 threads, quiet: 79-87
   tok/s with PASSIVE (matrices under 1 MiB on one thread), 100-104 spinning with every matrix over
   64 KiB on both (figures below, SMALL_MATVEC_BYTES).

2. Whether a decode step uses the worker at all (DecodeThreads). Spinning has a price on a machine whose
   cores other processes want: with one busy process beside it, the same 2-thread decode fell to 11-40
   tok/s (a spinning or descheduled worker holds up every region's barrier), where one thread still
   makes ~65. So the backend measures: it runs decode steps with all its threads, now and then tries
   the other setting, keeps a moving average of the step time of each, and uses whichever is
   faster; each try that confirms the choice doubles the wait before the next (up to EXPLORE_MAX steps),
   and a try that falls behind the setting in use (op by op) is cut short. On a quiet machine that is
   all threads from the third step on; under load, one thread, and the idle worker stops spinning.

The results do not depend on the thread count (every kernel computes each output the same way on any
number of threads), so switching never changes a token.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

import numba

from ... import host

# Ops smaller than this many elements, and matrix-vector products over fewer weight bytes, run on one
# thread (see ThreadPolicy.for_op): waking a worker costs more than they take. Gemma 3 270M decode,
# 2 threads, quiet machine, one process per setting of the OpenMP workers, alternating thresholds
# (tok/s, two passes): with the workers spinning briefly between regions (GOMP_SPINCOUNT=30000, see
# above) 94/91 with matrices over 1 MiB on both threads (all its per-layer matrices but
# ffn_down on one), 108/97 over 256 KiB, 104/100 over 64 KiB; with sleeping workers
# (OMP_WAIT_POLICY=PASSIVE) the order reverses: 79-87 over 1 MiB, 74-75 over 256 KiB, 66-68 over 64 KiB.
SMALL_OP_WORK = 1 << 16
SMALL_MATVEC_BYTES = 1 << 16
SMALL_ATTENTION_WORK = 1 << 18


def configure_openmp_waiting(spincount: Optional[str]) -> None:
    """Bounded spinning for OpenMP workers (runtime.DEFAULT_SPINCOUNT), unless the user chose a policy
    (spincount None). Must run before Numba's pool starts; idempotent (a value already there stays)."""
    if spincount is not None:
        host.export_default("GOMP_SPINCOUNT", spincount)


def numba_threads_reader() -> Callable[[], int]:
    """A function returning numba.get_num_threads() without its lock: that function first makes sure
    the thread pool is launched (taking a lock, ~4 us), then reads a thread-local through the threading
    layer. Once the pool is up (this launches it) the read alone is what we need; Numba's public
    function is the fallback if its internals move."""
    numba.get_num_threads()  # launches the pool, which sets the reader up
    from numba.np.ufunc import parallel

    reader = getattr(parallel, "_get_num_threads", None)
    if reader is None:
        return numba.get_num_threads
    try:
        if int(reader()) == numba.get_num_threads():
            return reader
    except Exception:  # pragma: no cover - depends on Numba internals
        pass
    return numba.get_num_threads


class BlasThreads:
    """BLAS's thread count, process-wide (set only when it changes: threadpoolctl takes ~1 ms). One
    instance per process (BLAS_THREADS): every backend of the process shares the one BLAS library.

    A model whose matrix products all run on the integer kernels uses BLAS only for prefill attention,
    and there OpenBLAS's second thread costs more than it brings: its idle workers keep polling, and
    the two-thread Numba products next to them slow down (Gemma 3 270M pp512, 2 threads: 680-720
    tok/s with 2 BLAS threads, 1170-1230 with 1; with 1 Numba thread 920-940 against 840-890)."""

    def __init__(self):
        self.count: Optional[int] = None  # the count last set, None before the first

    def limit(self, n: int) -> None:
        if n != self.count:
            import threadpoolctl

            threadpoolctl.threadpool_limits(limits=n, user_api="blas")
            self.count = n


BLAS_THREADS = BlasThreads()


class ThreadPolicy:
    """How many threads each op of one CPUBackend runs on: Numba's count (set before the op, per calling
    thread) and BLAS's (per step). Made by the backend after configure_openmp_waiting.

    serial: the basic tier's rule (tiers.py): our kernels on one thread, small ops on their serial twins.
    matmuls_use_blas: the model has matrices whose prefill products run in BLAS (types without multi-row
    kernels; set by the backend's upload)."""

    def __init__(self, threads: int, prefill_rows: int, blas: BlasThreads = BLAS_THREADS):
        self.threads = threads
        self.prefill_rows = prefill_rows  # matmul.BLAS_MIN_ROWS
        self.numba_threads = min(threads, numba.config.NUMBA_NUM_THREADS)
        numba.set_num_threads(self.numba_threads)
        self.numba_now = numba_threads_reader()  # Numba's count on the calling thread, read without a lock
        self.decode = DecodeThreads(self.numba_threads)  # the thread count of each decode step
        self.serial = False
        self.matmuls_use_blas = False
        self._blas = blas
        # BLAS (prefill of types without multi-row kernels, prefill attention) gets the same thread count
        # as our kernels, or one once the model's weights show it is used for attention only (begin_step).
        blas.limit(threads)

    def begin_step(self, rows: int) -> None:
        # Every step is measured, keyed by its row count: in a prefill only the one-row ops (the output
        # projection of the last row) take this count, in the server's batched steps every decode row.
        self.decode.begin(rows)
        self._blas.limit(self.blas_threads())

    def end_step(self) -> None:
        self.decode.end()

    def blas_threads(self) -> int:
        return self.threads if self.matmuls_use_blas else 1

    def attention_workers(self) -> int:
        """Threads of prefill attention's BLAS products (attention_blas.BlasAttention.workers)."""
        return 1 if self.matmuls_use_blas else self.threads

    def restart_measurements(self) -> None:
        """Forget the decode steps measured so far (they were one-thread steps of the basic tier)."""
        self.decode = DecodeThreads(self.numba_threads)

    def for_op(self, rows: int, work: int | None = None, limit: int = 0, blas: bool | None = None) -> None:
        """Numba's thread count for an op over `rows` rows. Batches of prefill_rows rows or more are a
        prefill; where the model has matrices whose prefill products run in BLAS (types without
        multi-row kernels), BLAS has all the backend's threads and its workers spin between calls, so
        parallel Numba kernels in between would fight them for the cores (measured on Gemma 3 270M
        pp512, 2 threads, when its products went through BLAS: 272 tok/s with 2-thread kernels, 546
        with 1-thread ones): those run on one thread. Without such matrices BLAS has one thread (begin_step)
        and the norms, RoPE and activations of a prefill get the governor's count (Gemma 3 270M pp512,
        2 threads, seven alternating runs: median +4%).

        work: the op's size in elements, for the small ops of a decode step (a norm or activation of one
        row, attention over a short context): under `limit` (default SMALL_OP_WORK) they run on the
        calling thread alone (the norms, RoPE, activations and attention through their serial twins
        without coming here: parallel()); a matrix-vector product passes its weight bytes and
        SMALL_MATVEC_BYTES.
        Waking the pool costs more than such an op: measured, rms_norm of 1x640 took 7-70 us on 2 threads
        (the second thread's wake-up, and worse when another process holds that core) against 1.6 us
        on one, and a decode step of Gemma 3 270M runs ~200 of them. Same kernel either way: the
        results do not depend on the thread count.

        blas: whether the op hands its work to BLAS (default: a batch of prefill_rows rows or more);
        a matrix product of a type with multi-row integer kernels never does (matmul.blas_min_rows), and
        gets the governor's count at any size."""
        small = work is not None and work < (limit or SMALL_OP_WORK)
        if blas is None:
            blas = rows >= self.prefill_rows and self.matmuls_use_blas
        wanted = 1 if blas or small or self.serial else self.decode.now()
        # The setting is per calling thread (and others may change it), so it is read back rather than
        # remembered here; both calls cost microseconds with Numba's locking, and a token runs ~300 ops.
        if self.numba_now() != wanted:
            numba.set_num_threads(wanted)

    def for_matvec(self, small: bool) -> int:
        """Set and return the thread count of a one-row matrix product (`small`: under SMALL_MATVEC_BYTES
        of weights): for_op's rule for one row, without its arguments (~130 of these a decode step)."""
        wanted = 1 if small or self.serial else self.decode.now()
        if self.numba_now() != wanted:
            numba.set_num_threads(wanted)
        return wanted

    def parallel(self, rows: int, work: int, limit: int = 0) -> bool:
        """Whether an op runs its parallel kernel (on the thread count for_op sets) rather than its
        serial twin on the calling thread, which a small op (for_op's `work` under `limit`) does
        without touching the thread count (kernels.rms_norm_serial)."""
        if work < (limit or SMALL_OP_WORK) or self.serial:
            return False
        self.for_op(rows, work, limit)
        return True


class DecodeThreads:
    """Chooses the thread count of each decode step: `threads` or 1, whichever measured faster.

    begin(rows) returns the count for a step of `rows` activation rows about to run; end() records its
    duration; the backend asks now() before each op, because a try is cut short (the rest of the step
    on the setting in use) once it falls behind (TRY_MARGIN) or has taken ABANDON_AFTER times a step
    of the setting in use: on a loaded machine one all-thread step took 0.2-0.6 s instead of 0.01,
    measured. Step times are compared per number of rows (the server's steps vary in size) through
    exponential moving averages: a step's time grows
    slowly with the context, and both averages are refreshed at every try, so they stay comparable.
    Decode-sized steps start on one thread, larger ones on all (_start); the first try of the other
    setting is the third step. Times are kept per row, under the step's size class (size_class)."""

    # Steps of more rows than this (prompt chunks, server steps carrying one) are measured by size class
    # (9-16, 17-32, ... rows) and per row: a prompt's exact size rarely repeats, and judged per size most
    # of them ran on a new size's first, one-thread steps. Unmeasured all-thread steps were no answer: a
    # 16-token prompt took 280 ms on 2 threads beside a busy process, 24-50 ms on one.
    EXACT_MAX_ROWS = 8
    EXPLORE_EVERY = 16  # steps of a size between two tries of the setting not in use ...
    EXPLORE_MAX = 256  # ... doubling each time a try confirms the choice, up to this
    SMOOTHING = 0.3  # weight of the newest step in a moving average
    ABANDON_AFTER = 1.5  # a try of all threads ends when it has run this many one-thread steps
    # A try of one thread, in a step over EXACT_MAX_ROWS rows, ends (the rest of the step on all threads)
    # when it has run this many all-thread steps: on a quiet machine such a try is a whole prompt at
    # half speed (a Llama-3-8B-shaped pp512 rep: 18 against 34 tok/s).
    ABANDON_ONE_AFTER = 1.25
    # A try of a step over EXACT_MAX_ROWS rows also ends as soon as it is clearly losing: at each op it
    # is compared with the last step of its size class on the setting in use (the time at which that
    # step reached the same op, per row). Once the reference had done MIN_PROGRESS of its step, a try
    # more than TRY_MARGIN behind it ends, and its projected duration (elapsed / fraction done) is
    # recorded. On a quiet machine a one-thread try of a big prompt then costs a few percent of a step
    # instead of a quarter or more (the 8B-shaped pp512 rep with the try: 20.8 tok/s against 31-33).
    # Not for decode-sized steps: their ops last microseconds and the first ops of an all-thread try
    # include waking the worker, a poor sample to judge on; the deadline above serves them as before.
    MIN_PROGRESS = 0.05
    TRY_MARGIN = 1.2

    def __init__(self, threads: int):
        self.threads = threads
        self.current = 1
        self._sizes: dict[int, _StepStats] = {}  # size class -> its statistics (seconds per row)
        self._running = None  # (stats, setting, start time, rows) of the step in progress
        self._deadline = None  # when the try in progress is abandoned ...
        self._fallback = None  # ... for this setting
        self._marks: list[float] = []  # seconds from the step's start to each now() call
        self._reference = None  # (marks, duration) of the step a try is compared with, scaled to its rows

    def best(self, rows: int = 1) -> int:
        stats = self._sizes.get(self.size_class(rows))
        return stats.best(self.threads) if stats else self._start(rows)

    def _start(self, rows: int) -> int:
        """The setting before any measurement: one thread for decode-sized steps (each op is short: a
        worker costs more than it brings unless the machine is quiet), all for larger ones (long
        regions; a prefill on one thread by default would be twice as slow on a quiet machine). A step
        of 2..EXACT_MAX_ROWS rows (a speculative verification, a server step) starts on what one-row
        steps chose once they have measured both settings (_inherits): its ops are the same, a little
        longer. (Its own tries start as any size's do, at its third step: an inherited choice can be
        wrong, and a wrong one should not wait long to be found out.)"""
        if rows <= self.EXACT_MAX_ROWS:
            return self._sizes[1].best(self.threads) if self._inherits(rows) else 1
        return self.threads

    def _inherits(self, rows: int) -> bool:
        decode = self._sizes.get(1)
        return 1 < rows <= self.EXACT_MAX_ROWS and decode is not None and len(decode.average) == 2

    def begin(self, rows: int = 1) -> int:
        if self.threads == 1:
            return 1
        key = self.size_class(rows)
        stats = self._sizes.get(key)
        if stats is None:
            stats = self._sizes[key] = _StepStats(self.EXPLORE_EVERY, self._start(rows))
        self.current = stats.next_setting(self.threads, self.EXPLORE_EVERY, self.EXPLORE_MAX)
        started = time.perf_counter()
        self._running = (stats, self.current, started, rows)
        self._marks = []
        one, many = stats.average.get(1), stats.average.get(self.threads)
        self._deadline = self._fallback = self._reference = None
        if stats.trying is not None:
            self._fallback = 1 if stats.trying == self.threads else self.threads
            if rows > self.EXACT_MAX_ROWS:
                self._reference = stats.reference(self._fallback, rows)
        if stats.trying == self.threads and one is not None:
            self._deadline = started + self.ABANDON_AFTER * one * rows
        elif stats.trying == 1 and many is not None and rows > self.EXACT_MAX_ROWS:
            self._deadline = started + self.ABANDON_ONE_AFTER * many * rows
        return self.current

    @classmethod
    def size_class(cls, rows: int) -> int:
        """The key a step's statistics are kept under: its row count up to EXACT_MAX_ROWS, else the next
        power of two."""
        return rows if rows <= cls.EXACT_MAX_ROWS else 1 << (rows - 1).bit_length()

    def now(self) -> int:
        """The thread count for the next op of the step in progress."""
        if self._running is None:
            return self.current
        stats, setting, started, rows = self._running
        clock = time.perf_counter()
        elapsed = clock - started
        if self._reference is not None:
            marks, duration = self._reference
            op = len(self._marks)
            if op < len(marks) and marks[op] >= self.MIN_PROGRESS * duration and elapsed > self.TRY_MARGIN * marks[op]:
                self._abandon(elapsed * duration / marks[op] / rows)  # the try's projected duration
                return self.current
        if self._deadline is not None and clock > self._deadline:
            self._abandon(elapsed / rows)  # a lower bound, and above the setting in use's: enough
            return self.current
        self._marks.append(elapsed)
        return self.current

    def _abandon(self, seconds_per_row: float) -> None:
        """End the try in progress: record it, and run the rest of the step on the setting in use."""
        stats, setting, _, _ = self._running
        stats.record(setting, seconds_per_row, self.SMOOTHING)
        self._running = self._deadline = self._reference = None
        self.current = self._fallback

    def end(self) -> None:
        self._deadline = self._reference = None
        if self._running is None:
            return
        stats, setting, started, rows = self._running
        self._running = None
        duration = time.perf_counter() - started
        if stats.steps > 1:  # a size's first step carries one-time costs: no reference
            stats.profiles[setting] = (rows, self._marks, duration)
        stats.record(setting, duration / rows, self.SMOOTHING)


class _StepStats:
    """Moving averages of one step size's duration per setting, and when to try the other setting."""

    def __init__(self, interval: int, start: int = 1):
        self.average: dict[int, float] = {}
        self.start = start  # the setting until both have been measured
        self.steps = 0
        self.next_try = 3  # the first try of the other setting, after two steps on the start one
        self.interval = interval
        self.tried_best = None  # the best setting when the last try was made
        self.trying = None  # the setting of the step in progress, when it is a try
        self.profiles: dict[int, tuple] = {}  # setting -> (rows, marks, duration) of its last whole step

    def reference(self, setting: int, rows: int):
        """The last whole step on `setting`, its times scaled to `rows` rows: (marks, duration), or None."""
        profile = self.profiles.get(setting)
        if profile is None:
            return None
        ref_rows, marks, duration = profile
        scale = rows / ref_rows
        return [m * scale for m in marks], duration * scale

    def best(self, threads: int) -> int:
        many, one = self.average.get(threads), self.average.get(1)
        if many is None or one is None:
            return self.start
        return threads if many <= one else 1

    def next_setting(self, threads: int, base_interval: int, max_interval: int) -> int:
        self.steps += 1
        self.trying = None
        best = self.best(threads)
        if self.steps < self.next_try:
            return best
        # A try: if the previous one left the choice as it was, wait twice as long for the next.
        self.interval = min(2 * self.interval, max_interval) if best == self.tried_best else base_interval
        self.tried_best = best
        self.next_try = self.steps + self.interval
        self.trying = 1 if best == threads else threads
        return self.trying

    def record(self, setting: int, seconds: float, smoothing: float) -> None:
        """A try's step replaces its setting's average (which is as old as the previous try: the
        machine may have changed since); the setting in use is smoothed step by step."""
        previous = self.average.get(setting)
        tried, self.trying = self.trying == setting, None
        if self.steps == 1:
            return  # a size's first step carries one-time costs (compiling, first touches): not a measure
        if previous is None or tried:
            self.average[setting] = seconds
        else:
            self.average[setting] = previous + smoothing * (seconds - previous)
