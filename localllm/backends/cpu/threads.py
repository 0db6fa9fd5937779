"""How the CPU backend's decode steps use threads.

Two settings work together:

1. How OpenMP's idle workers wait (Numba's threading layer here is OpenMP; libgomp reads the variables
   once, when Numba's pool first starts, which is after this import). A decode step of Gemma 3 270M
   starts ~130 parallel regions tens of microseconds apart. A worker that sleeps between them
   (OMP_WAIT_POLICY=PASSIVE) takes ~7 us to wake each time, so only the largest matrices were worth
   a second thread; one that spins a while first (GOMP_SPINCOUNT) is there in ~1.5 us, and every
   per-layer matrix gains from two. Measured on the project's 2-core machine, 2 threads, quiet: 79-87
   tok/s with PASSIVE (matrices under 1 MiB on one thread), 100-104 spinning with every matrix over
   64 KiB on both (figures in __init__.py, SMALL_MATVEC_BYTES).

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

import os
import time

# Spins before an idle worker sleeps. libgomp's own default (300,000, when the variables are unset) keeps
# a worker spinning far longer than the gaps inside a decode step need, taking CPU from other
# processes between steps; 30,000 covered the gaps about as well (100-104 tok/s against 110-112 in the
# same runs; 3,000 did not: 57-101).
DEFAULT_SPINCOUNT = "30000"


def configure_openmp_waiting() -> None:
    """Bounded spinning for OpenMP workers, unless the user chose a policy."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = DEFAULT_SPINCOUNT


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
        regions; a prefill on one thread by default would be twice as slow on a quiet machine)."""
        return 1 if rows <= self.EXACT_MAX_ROWS else self.threads

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
