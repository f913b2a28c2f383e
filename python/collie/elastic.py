"""Elastic training, as Horovod users know it: ``collie.elastic.run`` and
``State`` objects with ``commit`` / ``restore`` / ``sync``.

Workers are started by ``collie-run --elastic --min N --max M`` or by any
launcher next to a ``collie-rendezvous`` store (COLLIE_RENDEZVOUS and
COLLIE_RENDEZVOUS_SECRET in the environment), or with the job's state in an
etcd cluster (COLLIE_RENDEZVOUS=etcd://host:port,.../job; docs/ELASTIC.md),
for jobs across machines. This module drives the C API of
include/collie.h (``collie_elastic_*``, src/elastic) through ctypes; the
collectives inside the training function are the ordinary ``collie.*`` ones::

    import collie, collie.elastic

    state = collie.elastic.ObjectState(step=0, weights=np.zeros(10))

    @collie.elastic.run
    def train(state):
        while state.step < 100:
            state.weights += collie.allreduce(grad(state.step), name="grad")
            state.step += 1
            state.commit()          # saves, then checks for new or lost workers

    collie.elastic.init()
    train(state)
    collie.elastic.shutdown()

A peer that dies makes a collective raise ``collie.CollieError``; a worker that
joins makes ``commit()`` raise ``HostsUpdatedInterrupt``. Either way ``run``
rebuilds the world (the oldest surviving worker becomes rank 0), restores the
last commit where needed, broadcasts rank 0's state to everyone and calls the
function again. After the reset limit the job fails and ``run`` raises.
"""

import copy
import ctypes as _c
import functools
import pickle

import numpy as np

import collie
from collie import CollieError
from collie import _lib

__all__ = ["init", "shutdown", "run", "State", "ObjectState", "HostsUpdatedInterrupt",
           "broadcast_object", "worker_id", "epoch", "resets", "is_initialized"]

# collie_status_t values (include/collie.h).
_ERR_COMMUNICATION = -4
_ERR_STALLED = -5
_ERR_SHUTDOWN = -6
_ERR_MEMBERSHIP = -8
# Errors after which the world is rebuilt rather than the job failed.
_RESET_CODES = (_ERR_COMMUNICATION, _ERR_STALLED, _ERR_SHUTDOWN, _ERR_MEMBERSHIP)

_SIGNATURES = {
    "collie_elastic_init": (_c.c_int, []),
    "collie_elastic_shutdown": (_c.c_int, []),
    "collie_elastic_check": (_c.c_int, []),
    "collie_elastic_reset": (_c.c_int, []),
    "collie_elastic_state_sync": (_c.c_int, []),
    "collie_elastic_worker_id": (_c.c_int, []),
    "collie_elastic_epoch": (_c.c_int, []),
    "collie_elastic_resets": (_c.c_int, []),
}
_bound = {}
_initialized = False


class HostsUpdatedInterrupt(RuntimeError):
    """Workers joined or left: the world must be rebuilt (raised by commit())."""

    def __init__(self, skip_sync=False):
        super().__init__("collie.elastic: the set of workers changed")
        self.skip_sync = skip_sync


def _fn(name):
    f = _bound.get(name)
    if f is None:
        if not _lib.has_symbol(name):
            raise CollieError(-7, "collie: %s has no %s: it was built without the elastic layer"
                              % (_lib.path, name))
        f = getattr(_lib.lib, name)
        f.restype, f.argtypes = _SIGNATURES[name]
        _bound[name] = f
    return f


def _message():
    # Elastic calls record their text for ncclGetLastError (and for
    # collie_last_error when the engine forwards it).
    t = _lib.lib.ncclGetLastError(None)
    return t.decode("utf-8", "replace") if t else ""


def _call(name):
    rc = _fn(name)()
    if rc < 0:
        raise CollieError(rc, "%s: %s" % (name, _message()))
    return rc


def init():
    """Joins the elastic job and starts the engine on the first epoch's world.
    Does nothing when already initialised."""
    global _initialized
    if not _initialized:
        _call("collie_elastic_init")
        _initialized = True
        # The C state sync has no buffers from Python, but it is collective:
        # the survivors that take this worker in run it inside their reset.
        _call("collie_elastic_state_sync")


def shutdown():
    """Leaves the job cleanly (not counted as a failure)."""
    global _initialized
    if _initialized:
        _call("collie_elastic_shutdown")
        _initialized = False


def is_initialized():
    return _initialized


def worker_id():
    """This worker's id in the store (registration order, from 1)."""
    return _call("collie_elastic_worker_id")


def epoch():
    """The current membership epoch (1 for the first world)."""
    return _call("collie_elastic_epoch")


def resets():
    """Resets the job has gone through, as of this worker's last rendezvous."""
    return _call("collie_elastic_resets")


def broadcast_object(obj, root_rank=0, name="collie.elastic.object"):
    """Pickles `obj` on root_rank and returns the unpickled copy on every rank
    (two engine broadcasts: the length, then the bytes)."""
    if collie.rank() == root_rank:
        payload = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
        length = np.array([payload.size], dtype=np.int64)
    else:
        payload = None
        length = np.zeros(1, dtype=np.int64)
    collie.broadcast_(length, root_rank, name=name + ".len")
    n = int(length[0])
    buf = np.array(payload, copy=True) if payload is not None else np.zeros(n, dtype=np.uint8)
    if n:
        collie.broadcast_(buf, root_rank, name=name + ".data")
    return pickle.loads(buf.tobytes()) if collie.rank() != root_rank else obj


class State:
    """What a training function keeps across resets. Subclasses implement
    save(), restore() and sync(); commit() saves and then looks for workers
    that joined or left (collectively: every rank must commit at the same step)."""

    def __init__(self):
        self._reset_callbacks = []
        #: why the last reset happened: "lost a peer" or "membership changed"
        self.last_reset_reason = None

    def register_reset_callbacks(self, callbacks):
        """Functions called (without arguments) after every reset."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for cb in self._reset_callbacks:
            cb()

    def commit(self):
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt when the membership changed, CollieError
        when the agreement itself failed (a peer was lost)."""
        rc = _fn("collie_elastic_check")()
        if rc == _ERR_MEMBERSHIP:
            raise HostsUpdatedInterrupt(False)
        if rc < 0:
            raise CollieError(rc, "collie_elastic_check: %s" % (collie._last_error() or _message()))

    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError

    def sync(self):
        raise NotImplementedError


class ObjectState(State):
    """State made of picklable attributes (numbers, numpy arrays, lists ...),
    given as keyword arguments: ``ObjectState(step=0, weights=w)``. sync()
    broadcasts rank 0's last commit (pickled) and restores it everywhere."""

    def __init__(self, bcast_object=broadcast_object, **kwargs):
        super().__init__()
        self._bcast_object = bcast_object
        self._keys = list(kwargs)
        for k, v in kwargs.items():
            setattr(self, k, v)
        self._saved_state = {}
        self.save()

    def save(self):
        self._saved_state = {k: copy.deepcopy(getattr(self, k)) for k in self._keys}

    def restore(self):
        for k, v in self._saved_state.items():
            setattr(self, k, copy.deepcopy(v))

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state, 0)
            self.restore()


def run(func):
    """Decorator: ``func(state, ...)`` runs until it returns; when a worker is
    lost (CollieError from a collective) or workers join or leave
    (HostsUpdatedInterrupt from state.commit()), the world is rebuilt and
    ``func`` is called again from rank 0's last commit. Errors that are not
    about membership, and a reset that fails (reset limit reached, worker
    excluded, store gone), propagate."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        init()
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HostsUpdatedInterrupt as e:
                # Committed at the same step everywhere: nothing to undo.
                skip_sync = e.skip_sync
                state.last_reset_reason = "membership changed"
            except CollieError as e:
                if e.code not in _RESET_CODES:
                    raise
                # Part of a step may have run: go back to the last commit.
                state.restore()
                skip_sync = False
                state.last_reset_reason = ("membership changed" if e.code == _ERR_MEMBERSHIP
                                           else "lost a peer")
            _call("collie_elastic_reset")
            collie._engine_restarted()
            state.on_reset()

    return wrapper
