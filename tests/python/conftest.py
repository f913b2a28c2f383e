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
