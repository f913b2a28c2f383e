"""Shared pytest fixtures for the collie Python tests.

Each test file runs as a whole in N processes: under collie-run (COLLIE_RANK
set), under mpirun (OMPI_COMM_WORLD_RANK set; the unique ID goes round with
mpi4py's bcast), or alone as a world of one. Every rank runs the same tests in
the same order, so the collectives inside them line up.
"""

import os

import pytest


def launcher():
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        return "mpirun"
    if "COLLIE_RANK" in os.environ:
        return "collie-run"
    return "single"


def world_rank_size():
    """(rank, size) as the launcher announced them."""
    kind = launcher()
    if kind == "mpirun":
        return int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    if kind == "collie-run":
        return int(os.environ["COLLIE_RANK"]), int(os.environ["COLLIE_SIZE"])
    return 0, 1


def contrib(rank, nranks, count, dtype, op):
    """Rank `rank`'s input for op ("sum", "prod", "max", "min" or "avg"):
    small values so that every dtype is exact (the product of 8 ranks stays in
    float16's exact integers, avg divides evenly)."""
    import numpy as np
    i = np.arange(count)
    if op == "prod":
        v = 1 + (i + rank) % 2
    elif op == "avg":
        v = nranks * ((i + 3 * rank) % 2)
    else:
        v = (i * 7 + rank * 3) % 11 + 1
    return v.astype(dtype)


def reference(nranks, count, dtype, op):
    """The reduction of every rank's contrib."""
    import numpy as np
    xs = [contrib(r, nranks, count, dtype, op) for r in range(nranks)]
    if op == "sum":
        return np.sum(xs, axis=0, dtype=dtype)
    if op == "prod":
        return np.prod(xs, axis=0, dtype=dtype)
    if op == "max":
        return np.max(xs, axis=0)
    if op == "min":
        return np.min(xs, axis=0)
    return (np.sum(xs, axis=0, dtype=np.int64) // nranks).astype(dtype)


def mpi_world():
    from mpi4py import MPI
    return MPI.COMM_WORLD


@pytest.fixture(scope="session")
def comm():
    """A collie.nccl.Communicator over all the ranks of the job."""
    import collie.nccl as nccl
    rank, size = world_rank_size()
    kind = launcher()
    if kind == "mpirun":
        # What MPI programs do: one rank makes the ID, MPI carries it.
        world = mpi_world()
        uid = nccl.get_unique_id() if rank == 0 else None
        uid = world.bcast(uid, root=0)
    else:
        # collie-run sets NCCL_COMM_ID: every rank's get_unique_id is the same.
        uid = nccl.get_unique_id()
    c = nccl.Communicator(size, uid, rank)
    yield c
    c.destroy()
