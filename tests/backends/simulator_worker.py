"""A child process that runs conformance_runs' op calls on the CUDA backend under numba's CUDA simulator.

NUMBA_ENABLE_CUDASIM=1 must be set before numba.cuda is first imported, and must not reach the test
process, whose CPU kernels JIT normally: test_conformance.py starts this script with the variable set
in the child's environment only. Protocol, one request at a time: the parent writes a pickled
(run name, keyword arguments) to our stdin; we answer with a pickled ("ok", result) or ("error",
traceback text) on the stdout we were started with. Anything else printed goes to stderr.
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback


def serve(requests, replies) -> None:
    import conformance_runs
    from localllm.backends import create_backend

    if os.environ.get("LOCALLLM_CUDA_SIGNATURES"):  # scripts/cuda_signatures.py: note every launch's types
        from localllm.backends.cuda.ptx_check import record_launches

        record_launches(os.environ["LOCALLLM_CUDA_SIGNATURES"])
    backend = create_backend("cuda")
    while True:
        try:
            name, kwargs = pickle.load(requests)
        except EOFError:  # the parent closed our stdin: done
            return
        try:
            reply = ("ok", conformance_runs.RUNS[name](backend, **kwargs))
        except Exception:  # reported to the parent's test, which fails with it
            reply = ("error", traceback.format_exc())
        pickle.dump(reply, replies, protocol=pickle.HIGHEST_PROTOCOL)
        replies.flush()


def main() -> None:
    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        raise SystemExit("simulator_worker.py runs under NUMBA_ENABLE_CUDASIM=1 (test_conformance.py starts it)")
    replies = os.fdopen(os.dup(1), "wb")  # the protocol's channel ...
    os.dup2(2, 1)  # ... and fd 1 now stderr, so that prints cannot corrupt it
    serve(sys.stdin.buffer, replies)


if __name__ == "__main__":
    main()
