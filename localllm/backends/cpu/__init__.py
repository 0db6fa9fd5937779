"""The Numba CPU backend, the default.

backend.py    CPUBackend: the ops, each dispatched to its kernel
threads.py    ThreadPolicy: how many threads each op runs on (Numba's and BLAS's counts, OpenMP's waiting),
              and DecodeThreads, the decode-step governor it consults
layouts.py    WeightLayouts: what the matrix products read for each weight (re-laid rows, one-row plans)
tiers.py      the cold start's basic tier and the background compile; precompile.py, that process
matmul.py, drivers.py, kernels.py, attention_decode.py, attention_blas.py: the kernels and their drivers

Importing this package has no effect (no environment change, no thread): the first CPUBackend configures
the process (threads.configure_openmp_waiting) before it starts Numba's thread pool.
"""

from .backend import CPUBackend

__all__ = ["CPUBackend"]
