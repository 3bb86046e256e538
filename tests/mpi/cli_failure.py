"""Run by tests/test_mpi.py under mpirun: asyncopt-lasso (the rest of argv) where
something fails on one rank in the middle of the solve.

    cli_failure.py bug ARGS...     worker rank 2 raises RuntimeError in its first inner loop
    cli_failure.py disk ARGS...    the server's second checkpoint write finds the disk full
"""
import errno
import sys

from mpi4py import MPI

import asyncopt.solvers.ddss as ddss
import asyncopt.solvers.mpi.worker as worker
from asyncopt.cli.lasso import main


def inject(mode, rank):
    if mode == "bug" and rank == 2:
        def broken(*args, **kwargs):
            raise RuntimeError("injected failure on one worker")
        worker.work_epoch = broken
    elif mode == "disk" and rank == 0:
        save, calls = ddss.save_checkpoint, []

        def full(path, **fields):
            calls.append(path)
            if len(calls) > 1:
                raise OSError(errno.ENOSPC, "No space left on device", path)
            return save(path, **fields)
        ddss.save_checkpoint = full


if __name__ == "__main__":
    inject(sys.argv[1], MPI.COMM_WORLD.Get_rank())
    sys.exit(main(sys.argv[2:]))
