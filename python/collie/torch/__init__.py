# collie.torch: Horovod's torch API (import collie.torch as hvd) on CPU tensors, zero copy,
# over the engine bindings in python/collie/__init__.py (collectives in mpi_ops.py, the optimizer
# in optimizer.py); importing it also registers the torch.distributed backend "collie" (distributed.py).
"""Horovod-compatible PyTorch API backed by collie's engine: ``import collie.torch as hvd``.

Lifecycle and topology (init, shutdown, rank, size, local_rank ...), the collectives of
mpi_ops.py, process sets, DistributedOptimizer, broadcast_parameters / broadcast_optimizer_state,
broadcast_object / allgather_object, Compression, and collie.torch.elastic. See python/README.md.
"""

import os

import collie
import collie.elastic
from collie import CollieError
from collie import (cross_rank, cross_size, is_initialized, local_rank, local_size, rank, size,
                    start_timeline, stop_timeline)

from . import elastic, mpi_ops
from .compression import Compression
from .mpi_ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allgather_async,
                      allgather_object, allreduce, allreduce_, allreduce_async, allreduce_async_,
                      alltoall, alltoall_async, barrier, broadcast, broadcast_, broadcast_async,
                      broadcast_async_, broadcast_object, grouped_allreduce, grouped_allreduce_,
                      grouped_allreduce_async, grouped_allreduce_async_, join, poll, reducescatter,
                      reducescatter_async, synchronize)
from .optimizer import DistributedOptimizer, broadcast_optimizer_state, broadcast_parameters

# Horovod's name for an engine failure; collie raises collie.CollieError (a RuntimeError).
HorovodInternalError = CollieError
global_process_set = collie.global_process_set


class ProcessSet(collie.ProcessSet):
    """A set of world ranks with its own communicator, as Horovod's hvd.ProcessSet([0, 2]):
    register it with init(process_sets=[...]) or add_process_set(ps) (collective over the world),
    then pass it as process_set= to collectives."""

    def __init__(self, ranks):
        if isinstance(ranks, collie.ProcessSet):
            ranks = ranks.ranks
        if not isinstance(ranks, (list, tuple, range)):
            raise TypeError("collie.torch.ProcessSet: ranks must be a list of world ranks (mpi4py "
                            "communicators are not supported), not %s" % type(ranks).__name__)
        super().__init__(None, ranks)

    def _registered(self, what):
        if self.process_set_id is None:
            raise ValueError("collie.torch.ProcessSet.%s: %r is not registered yet" % (what, self))
        return self.process_set_id

    def rank(self):
        self._registered("rank")
        return super().rank()

    def size(self):
        self._registered("size")
        return super().size()

    def included(self):
        self._registered("included")
        return super().included()

    def __repr__(self):
        sid = "unregistered" if self.process_set_id is None else "process_set_id=%d" % self.process_set_id
        return "ProcessSet(%s, ranks=%s)" % (sid, self.ranks)


def add_process_set(process_set):
    """Registers a ProcessSet (or a list of world ranks, for which one is made) with the engine;
    collective over the world, every rank with the same ranks. Returns the ProcessSet."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise ValueError("collie.torch.add_process_set: %r is already registered" % ps)
    ps.process_set_id = collie.add_process_set(ps.ranks).process_set_id
    return ps


def remove_process_set(process_set):
    """Unregisters a ProcessSet (collective over the world)."""
    collie.remove_process_set(mpi_ops._sid(process_set, "remove_process_set"))
    if isinstance(process_set, collie.ProcessSet):
        process_set.process_set_id = None
    return True


_elastic = False  # init() joined an elastic job (collie-run --elastic / collie-rendezvous)


def init(comm=None, process_sets=None):
    """Starts collie (collective): the world from the launcher's environment (collie-run, torchrun,
    Open MPI, Slurm), an elastic job's first epoch when COLLIE_RENDEZVOUS is set, or a world of one.
    process_sets: ProcessSet objects to register now ("dynamic" is accepted: sets can always be
    added later). comm as collie.init. Does nothing while this process holds an engine it has not
    shut down, as in Horovod: also when another rank's shutdown has stopped that engine (its
    operations then fail with COLLIE_ERR_SHUTDOWN; shutdown() then init() starts a new one)."""
    global _elastic
    # Whether init is a no-op must depend on this process's own calls only: init is collective,
    # and "has a peer's shutdown reached my engine yet" differs from rank to rank. A rank that
    # re-initialised here because the engine had just stopped under it started a world its peers
    # were not starting, and their next shutdown stopped it: its first allreduce after
    # shutdown() + init() failed with COLLIE_ERR_SHUTDOWN.
    if collie._engine_held():
        return
    if comm is None and os.environ.get("COLLIE_RENDEZVOUS"):
        collie.elastic.init()
        _elastic = True
    else:
        collie.init(comm)
    if process_sets is not None and process_sets != "dynamic":
        for ps in process_sets:
            add_process_set(ps)


def shutdown():
    """Stops collie (collective); pending operations fail."""
    global _elastic
    if _elastic:
        _elastic = False
        collie.elastic.shutdown()
    else:
        # Always: when another rank shut down first, this engine has stopped already
        # (is_initialized() is false) but is freed only by collie_shutdown.
        collie.shutdown()


def mpi_threads_supported():
    return False


def _false():
    return False


# Horovod's build queries: collie.torch runs on CPU tensors without MPI, Gloo, CUDA or ROCm.
mpi_built = mpi_enabled = gloo_built = gloo_enabled = nccl_built = ddl_built = ccl_built = _false
cuda_built = rocm_built = _false

from . import distributed as _distributed  # noqa: E402,F401  registers the torch.distributed backend "collie"

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
    "cross_size", "Average", "Sum", "Min", "Max", "Product", "Adasum", "allreduce", "allreduce_",
    "allreduce_async", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "allgather", "allgather_async", "broadcast",
    "broadcast_", "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async", "reducescatter",
    "reducescatter_async", "poll", "synchronize", "join", "barrier", "broadcast_object",
    "allgather_object", "broadcast_parameters", "broadcast_optimizer_state", "DistributedOptimizer",
    "Compression", "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "CollieError", "HorovodInternalError", "elastic", "start_timeline", "stop_timeline",
    "mpi_threads_supported",
]
