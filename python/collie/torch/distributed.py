# torch.distributed backend "collie": importing this module registers it, so
# dist.init_process_group("collie") runs collectives through libcollie. The
# process group itself is _dist_pg.py; communicators come from collie/nccl.py.
"""torch.distributed process-group backend backed by collie.

    import collie.torch.distributed          # (import collie.torch does it too)
    dist.init_process_group("collie")        # env:// (torchrun or collie-run)
    dist.init_process_group("collie", store=store, rank=r, world_size=n)

Each group's communicator is built from a 128-byte unique ID that the group's
rank 0 makes and puts in the group's c10d store; the others read it from
there. Under collie-run (COLLIE_RANK set, MASTER_ADDR not) env:// needs no
MASTER_ADDR/MASTER_PORT: the ranks build the world communicator from
collie-run's NCCL_COMM_ID, rank 0 opens a TCPStore on a free port and
broadcasts the port over that communicator, and the world group adopts it.
"""

import atexit
import datetime
import inspect
import os
import sys
import weakref

import numpy as np
import torch
import torch.distributed as dist

from .. import nccl
from ._dist_pg import CollieBackendError, ProcessGroupCollie

__all__ = ["ProcessGroupCollie", "CollieBackendError", "BACKEND", "communicator", "is_registered"]

BACKEND = "collie"
_STORE_KEY = "collie_unique_id"

# The world communicator made by the collie-run rendezvous, until the world
# group takes it: (rank, size, Communicator).
_env_comm = None
# Every live group, so their communicators are freed at exit.
_groups = weakref.WeakSet()


def _comm_through_store(store, rank, size):
    """Rank 0 makes the unique ID and sets it in the (group's prefix) store; the
    others get it, which waits for it up to the store's timeout."""
    if rank == 0:
        # A fresh root in this process even under NCCL_COMM_ID: the world may
        # already have used that address, and several groups may init at once.
        uid = nccl.get_unique_id(own_root=True)
        store.set(_STORE_KEY, uid)
    else:
        uid = store.get(_STORE_KEY)
        if isinstance(uid, str):
            uid = uid.encode("latin-1")
    if len(uid) != nccl.UNIQUE_ID_BYTES:
        raise CollieBackendError("collie backend: the store holds a %d-byte unique ID under %r, not %d bytes"
                                 % (len(uid), _STORE_KEY, nccl.UNIQUE_ID_BYTES))
    return nccl.Communicator(size, uid, rank)


def _create(store, rank, size, timeout):
    """torch's creator function: a ProcessGroupCollie of `size` ranks."""
    global _env_comm
    comm = None
    if _env_comm is not None and _env_comm[:2] == (rank, size):
        comm = _env_comm[2]
        _env_comm = None
    if comm is None:
        comm = _comm_through_store(store, rank, size)
    try:
        pg = ProcessGroupCollie(comm, rank, size, timeout)
    except BaseException:
        comm.destroy()
        raise
    _groups.add(pg)
    return pg


def _free_all():
    for pg in list(_groups):
        try:
            pg.destroy()
        except Exception:  # at exit there is nobody left to tell
            pass
    if _env_comm is not None and _env_comm[2]._comm is not None:
        _env_comm[2].destroy()


atexit.register(_free_all)


def communicator(group=None):
    """The collie.nccl.Communicator behind a "collie" group (None: the world)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, ProcessGroupCollie):
        raise CollieBackendError("collie backend: %r is not a collie process group" % (pg,))
    return pg.communicator


# ---------------------------------------------------------------- collie-run env://

def _under_collie_run():
    return "COLLIE_RANK" in os.environ and "MASTER_ADDR" not in os.environ


def _root_host():
    """The host part of NCCL_COMM_ID (collie-run's rank 0 address)."""
    cid = os.environ.get("NCCL_COMM_ID", "")
    if cid.startswith("["):
        return cid[1:cid.index("]")]
    return cid.rsplit(":", 1)[0] if ":" in cid else "127.0.0.1"


def _collie_run_rendezvous(url, timeout=datetime.timedelta(minutes=30), **kwargs):
    global _env_comm
    rank, size = int(os.environ["COLLIE_RANK"]), int(os.environ["COLLIE_SIZE"])
    query = dict(p.split("=", 1) for p in url.partition("?")[2].split("&") if "=" in p)
    for key, mine in (("rank", rank), ("world_size", size)):
        if key in query and int(query[key]) != mine:
            raise CollieBackendError("collie backend: init_process_group(%s=%s) but collie-run started this process "
                                     "as %s %d" % (key, query[key], key, mine))
    comm = nccl.Communicator.from_env()
    try:
        host = _root_host()
        port = np.zeros(1, dtype=np.int64)
        if rank == 0:
            store = dist.TCPStore(host, 0, size, True, timeout=timeout, wait_for_workers=False)
            port[0] = store.port
        comm.broadcast(port, 0)
        if rank != 0:
            store = dist.TCPStore(host, int(port[0]), size, False, timeout=timeout)
    except BaseException:
        comm.destroy()
        raise
    if _env_comm is not None and _env_comm[2]._comm is not None:
        _env_comm[2].destroy()
    _env_comm = (rank, size, comm)
    yield store, rank, size
    raise RuntimeError("collie backend: the collie-run rendezvous cannot be retried")


def _install_rendezvous():
    """env:// under collie-run: wraps torch's env handler (it is kept for
    every other case). False when this torch keeps its handlers elsewhere;
    then collie-run users set MASTER_ADDR/MASTER_PORT themselves."""
    rdzv = sys.modules.get("torch.distributed.rendezvous")
    handlers = getattr(rdzv, "_rendezvous_handlers", None)
    if not isinstance(handlers, dict) or "env" not in handlers:
        return False
    orig = handlers["env"]
    if getattr(orig, "_collie_wrapped", False):
        return True

    def env_handler(url, *args, **kwargs):
        if _under_collie_run():
            return _collie_run_rendezvous(url, *args, **kwargs)
        return orig(url, *args, **kwargs)
    env_handler._collie_wrapped = True
    env_handler.__doc__ = orig.__doc__
    handlers["env"] = env_handler
    return True


# ---------------------------------------------------------------- registration

def is_registered():
    """True when torch.distributed knows the "collie" backend."""
    return BACKEND.upper() in getattr(dist.Backend, "_plugins", {}) or hasattr(dist.Backend, BACKEND.upper())


def _register():
    if not dist.is_available():
        raise ImportError("collie.torch.distributed: this torch has no torch.distributed")
    if is_registered():
        return
    params = inspect.signature(dist.Backend.register_backend).parameters
    if "devices" in params:
        # torch >= 2.1: say it is a CPU backend, so torch routes CPU tensors here.
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
    else:
        dist.Backend.register_backend(BACKEND, _create)


_register()
_install_rendezvous()
