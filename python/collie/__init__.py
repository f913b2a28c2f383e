"""collie: Horovod-style named, asynchronous collectives on numpy arrays.

A ctypes binding of the engine API in include/collie.h (src/engine): a
background thread negotiates which named tensors every rank has submitted and
runs them in one order, fusing small allreduces. The names and argument order
follow Horovod (hvd.init, hvd.allreduce, ...). The plain NCCL API is in
collie.nccl. The library is found as described in python/README.md.
"""

import atexit
import ctypes as _c
import itertools
import os
import threading

import numpy as np

from . import _lib
from . import nccl

__all__ = [
    "CollieError", "Handle", "ProcessSet", "global_process_set", "Average", "Sum", "Min", "Max",
    "Product", "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "allreduce", "allreduce_async", "grouped_allreduce",
    "grouped_allreduce_async", "allgather", "allgather_async", "broadcast", "broadcast_",
    "broadcast_async", "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "synchronize", "poll", "join", "barrier", "add_process_set", "remove_process_set",
    "start_timeline", "stop_timeline", "engine_available", "library_path", "version", "nccl",
]

# collie_op_t (Horovod's ReduceOp values).
Average, Sum, Min, Max, Product = 0, 1, 3, 4, 5
_OP_NAMES = {Average: "Average", Sum: "Sum", Min: "Min", Max: "Max", Product: "Product"}

# collie_status_t
_STATUS = {-1: "COLLIE_ERR_INVALID_ARGUMENT", -2: "COLLIE_ERR_NOT_INITIALIZED",
           -3: "COLLIE_ERR_MISMATCH", -4: "COLLIE_ERR_COMMUNICATION", -5: "COLLIE_ERR_STALLED",
           -6: "COLLIE_ERR_SHUTDOWN", -7: "COLLIE_ERR_INTERNAL", -8: "COLLIE_ERR_MEMBERSHIP"}

library_path = _lib.path
version = _lib.version

_L = _lib.lib
_ENGINE_SYMBOLS = (
    "collie_init", "collie_init_comm", "collie_shutdown", "collie_allreduce_async",
    "collie_allgather_nd_async", "collie_wait", "collie_result", "collie_release",
)


def engine_available():
    """True when the loaded libcollie has the engine API (include/collie.h)."""
    return all(_lib.has_symbol(s) for s in _ENGINE_SYMBOLS)


class CollieError(RuntimeError):
    """An engine call failed. `code` is the negative collie_status_t, `status`
    its name; the message is collie_last_error() or collie_handle_error()."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.status = _STATUS.get(code, "collie_status(%d)" % code)


_bound = {}
_sizep = _c.POINTER(_c.c_size_t)
_SIGNATURES = {
    "collie_last_error": (_c.c_char_p, []),
    "collie_init": (_c.c_int, []),
    "collie_init_comm": (_c.c_int, [_c.c_void_p]),
    "collie_shutdown": (_c.c_int, []),
    "collie_is_initialized": (_c.c_int, []),
    "collie_rank": (_c.c_int, []),
    "collie_size": (_c.c_int, []),
    "collie_local_rank": (_c.c_int, []),
    "collie_local_size": (_c.c_int, []),
    "collie_cross_rank": (_c.c_int, []),
    "collie_cross_size": (_c.c_int, []),
    "collie_allreduce_async": (_c.c_int, [_c.c_char_p, _c.c_void_p, _c.c_void_p, _c.c_size_t, _c.c_int,
                                          _c.c_int, _c.c_double, _c.c_double, _c.c_int]),
    "collie_grouped_allreduce_async": (_c.c_int, [_c.c_int, _c.POINTER(_c.c_char_p),
                                                  _c.POINTER(_c.c_void_p), _c.POINTER(_c.c_void_p),
                                                  _sizep, _c.c_int, _c.c_int, _c.c_double,
                                                  _c.c_double, _c.c_int]),
    "collie_allgather_async": (_c.c_int, [_c.c_char_p, _c.c_void_p, _c.c_size_t, _c.c_int, _c.c_int]),
    "collie_allgather_nd_async": (_c.c_int, [_c.c_char_p, _c.c_void_p, _c.c_int,
                                             _c.POINTER(_c.c_int64), _c.c_int, _c.c_int]),
    "collie_broadcast_async": (_c.c_int, [_c.c_char_p, _c.c_void_p, _c.c_size_t, _c.c_int, _c.c_int,
                                          _c.c_int]),
    "collie_alltoall_async": (_c.c_int, [_c.c_char_p, _c.c_void_p, _sizep, _c.c_int, _c.c_int]),
    "collie_reducescatter_async": (_c.c_int, [_c.c_char_p, _c.c_void_p, _c.c_size_t, _c.c_int,
                                              _c.c_int, _c.c_int]),
    "collie_join": (_c.c_int, []),
    "collie_barrier": (_c.c_int, [_c.c_int]),
    "collie_poll": (_c.c_int, [_c.c_int]),
    "collie_wait": (_c.c_int, [_c.c_int]),
    "collie_result": (_c.c_int, [_c.c_int, _c.POINTER(_c.c_void_p), _sizep]),
    "collie_result_counts": (_c.c_int, [_c.c_int, _sizep]),
    "collie_handle_error": (_c.c_char_p, [_c.c_int]),
    "collie_release": (_c.c_int, [_c.c_int]),
    "collie_add_process_set": (_c.c_int, [_c.POINTER(_c.c_int), _c.c_int]),
    "collie_remove_process_set": (_c.c_int, [_c.c_int]),
    "collie_process_set_rank": (_c.c_int, [_c.c_int]),
    "collie_process_set_size": (_c.c_int, [_c.c_int]),
    "collie_process_set_included": (_c.c_int, [_c.c_int]),
    "collie_start_timeline": (_c.c_int, [_c.c_char_p, _c.c_int]),
    "collie_stop_timeline": (_c.c_int, []),
}


def _fn(name):
    """The engine function `name`, bound on first use so that collie.nccl and
    this module import even from a library built without the engine."""
    f = _bound.get(name)
    if f is None:
        if not _lib.has_symbol(name):
            raise CollieError(-7, "collie: %s has no %s: it was built without the engine"
                              % (_lib.path, name))
        f = getattr(_L, name)
        f.restype, f.argtypes = _SIGNATURES[name]
        _bound[name] = f
    return f


def _last_error():
    t = _fn("collie_last_error")()
    return t.decode("utf-8", "replace") if t else ""


def _check(rc, what):
    if rc < 0:
        msg = _last_error()
        raise CollieError(rc, "%s: %s%s" % (what, _STATUS.get(rc, "error %d" % rc),
                                            ": " + msg if msg else ""))
    return rc


# ---------------------------------------------------------------- lifecycle

_state_lock = threading.RLock()
_owned_comm = None  # a communicator init() made itself and destroys at shutdown
_pending = {}  # handle id -> Handle: keeps the numpy buffers alive until done
_name_counters = {}  # process set id -> counter for unnamed operations

# Variables of the launchers collie_comm_init_from_env understands; with none
# of them the process is a world of one, as with Horovod.
_LAUNCHER_VARS = ("COLLIE_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK")


def _mpi_comm_world():
    """mpi4py's COMM_WORLD under mpirun when no root address is set (the
    unique ID then travels over MPI), else None."""
    if "OMPI_COMM_WORLD_RANK" not in os.environ and "PMI_RANK" not in os.environ:
        return None
    if os.environ.get("NCCL_COMM_ID") or os.environ.get("MASTER_ADDR"):
        return None
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI.COMM_WORLD


def _comm_over_mpi(mpi_comm):
    uid = nccl.get_unique_id() if mpi_comm.Get_rank() == 0 else None
    uid = mpi_comm.bcast(uid, root=0)
    return nccl.Communicator(mpi_comm.Get_size(), uid, mpi_comm.Get_rank())


def init(comm=None):
    """Starts the engine (collective).

    comm=None: the world from the launcher's environment (collie-run, Open
    MPI, Slurm, torchrun...; see collie_comm_init_from_env). Under mpirun
    without NCCL_COMM_ID/MASTER_ADDR the unique ID is broadcast with mpi4py.
    With no launcher at all the world is this process alone.
    comm may also be a collie.nccl.Communicator (the engine uses it until
    shutdown; the caller destroys it afterwards) or an mpi4py communicator.
    """
    global _owned_comm
    with _state_lock:
        # Refused before any communicator is built: building one is collective, and a rank
        # that holds an engine (even one a peer's shutdown stopped) must not join a peer's init.
        if _engine_held():
            raise CollieError(-1, "collie.init: the engine is already initialised%s (call "
                              "collie.shutdown() first)"
                              % ("" if is_initialized() else " and was stopped by a shutdown"))
        if comm is None:
            mpi = _mpi_comm_world()
            if mpi is not None:
                comm = mpi
            elif not any(v in os.environ for v in _LAUNCHER_VARS):
                comm = _own(nccl.Communicator(1, nccl.get_unique_id(), 0))
            else:
                _check(_fn("collie_init")(), "collie_init")
                _name_counters.clear()
                return
        if not isinstance(comm, nccl.Communicator):
            if not (hasattr(comm, "bcast") and hasattr(comm, "Get_rank")):
                raise TypeError("collie.init: comm must be None, a collie.nccl.Communicator or an "
                                "mpi4py communicator, not %s" % type(comm).__name__)
            comm = _own(_comm_over_mpi(comm))
        try:
            _check(_fn("collie_init_comm")(comm.handle), "collie_init_comm")
        except BaseException:
            if comm is _owned_comm:
                _owned_comm = None
                comm.destroy()
            raise
        _name_counters.clear()


def _own(comm):
    global _owned_comm
    _owned_comm = comm
    return comm


def shutdown():
    """Stops the engine (collective): pending operations fail."""
    global _owned_comm
    with _state_lock:
        rc = _fn("collie_shutdown")()
        for h in list(_pending.values()):
            h._drop()
        _pending.clear()
        comm, _owned_comm = _owned_comm, None
        if comm is not None:
            comm.destroy()
        _check(rc, "collie_shutdown")


def _engine_held():
    """This process started the engine and has not called shutdown() since, whether or not the
    engine still runs (another rank's shutdown stops it; is_initialized() is then false). A
    local fact, unlike is_initialized(), which a peer's shutdown changes at a moment of its own."""
    if not _lib.has_symbol("collie_rank"):
        return False
    # collie_rank answers from the engine state whenever the engine is initialised, running or not.
    if _fn("collie_is_initialized")() == 1:
        return True
    return _fn("collie_rank")() >= 0


def _shutdown_at_exit():
    # As Horovod does: an interpreter that ends with the engine running stops
    # it, so peers see an orderly shutdown rather than a vanished rank; one
    # that a peer's shutdown stopped is freed (local: its thread has ended).
    try:
        if _engine_held():
            shutdown()
    except Exception:
        pass


atexit.register(_shutdown_at_exit)


def _engine_restarted():
    """The engine was stopped and started again underneath this module (collie.elastic's reset
    rebuilds the world in C): handles of the old engine can never finish, and unnamed operations
    count from 0 again on every rank, new workers included."""
    with _state_lock:
        for h in list(_pending.values()):
            h._drop()
        _pending.clear()
        _name_counters.clear()


def is_initialized():
    return _lib.has_symbol("collie_is_initialized") and _fn("collie_is_initialized")() == 1


def _query(name):
    return _check(_fn(name)(), name)


def rank():
    """Rank of this process in the world."""
    return _query("collie_rank")


def size():
    """Number of ranks in the world."""
    return _query("collie_size")


def local_rank():
    """Rank among the ranks on this host."""
    return _query("collie_local_rank")


def local_size():
    """Number of ranks on this host."""
    return _query("collie_local_size")


def cross_rank():
    """Index of this host."""
    return _query("collie_cross_rank")


def cross_size():
    """Number of hosts."""
    return _query("collie_cross_size")


# ---------------------------------------------------------------- process sets

class ProcessSet:
    """A group of world ranks with its own communicator (add_process_set)."""

    def __init__(self, process_set_id, ranks=None):
        self.process_set_id = process_set_id
        self.ranks = None if ranks is None else sorted(int(r) for r in ranks)

    def rank(self):
        """This process's rank in the set (error if not a member)."""
        return _check(_fn("collie_process_set_rank")(self.process_set_id), "collie_process_set_rank")

    def size(self):
        return _check(_fn("collie_process_set_size")(self.process_set_id), "collie_process_set_size")

    def included(self):
        """True if this process is a member."""
        return _check(_fn("collie_process_set_included")(self.process_set_id),
                      "collie_process_set_included") == 1

    def __repr__(self):
        who = "world" if self.process_set_id == 0 else "ranks=%s" % self.ranks
        return "ProcessSet(process_set_id=%d, %s)" % (self.process_set_id, who)


global_process_set = ProcessSet(0)


def add_process_set(ranks):
    """Registers a set of world ranks (collective over the world: every rank
    calls it with the same list). Returns its ProcessSet."""
    if isinstance(ranks, ProcessSet):
        ranks = ranks.ranks
    ranks = [int(r) for r in ranks]
    arr = (_c.c_int * len(ranks))(*ranks)
    sid = _check(_fn("collie_add_process_set")(arr, len(ranks)), "collie_add_process_set")
    return ProcessSet(sid, ranks)


def remove_process_set(process_set):
    """Unregisters a set (collective over the world)."""
    sid = _set_id(process_set)
    if sid == 0:
        raise ValueError("collie.remove_process_set: the global process set cannot be removed")
    _check(_fn("collie_remove_process_set")(sid), "collie_remove_process_set")
    _name_counters.pop(sid, None)
    return True


def _set_id(process_set):
    if isinstance(process_set, ProcessSet):
        return process_set.process_set_id
    if isinstance(process_set, (int, np.integer)) and not isinstance(process_set, bool):
        return int(process_set)
    raise TypeError("collie: process_set must be a ProcessSet, not %r" % (process_set,))


# ---------------------------------------------------------------- handles

def _auto_name(kind, sid, name):
    """Unnamed operations get a name from a per-set counter: the same on every
    rank as long as the ranks of the set make their calls in the same order
    (as in Horovod). Per set, so that calls on a set the rank is not in do not
    shift the world's names."""
    if name is not None:
        return str(name)
    with _state_lock:
        counter = _name_counters.setdefault(sid, itertools.count())
        n = next(counter)
    return "%s.noname.%d" % (kind, n) if sid == 0 else "%s.noname.ps%d.%d" % (kind, sid, n)


class Handle:
    """An operation in flight: pass it to synchronize() or poll()."""

    def __init__(self, hid, name, finish, keep):
        self.handle = hid
        self.name = name
        self._finish = finish  # builds the result from the finished handle
        self._keep = keep      # numpy arrays the engine reads or writes
        self._done = False
        self._result = None
        self._error = None
        _pending[hid] = self

    def _drop(self):
        self._done = True
        self._keep = None
        if self._error is None and self._finish is not None:
            self._error = CollieError(-6, "%s: the engine shut down before it finished" % self.name)

    def __repr__(self):
        return "<collie.Handle %d %r%s>" % (self.handle, self.name, " done" if self._done else "")


def poll(handle):
    """True when the operation has finished (successfully or not)."""
    if handle._done:
        return True
    return _check(_fn("collie_poll")(handle.handle), "collie_poll") == 1


def synchronize(handle):
    """Waits for the operation and returns its result (raises its error)."""
    if not handle._done:
        h = handle.handle
        rc = _fn("collie_wait")(h)
        try:
            if rc < 0:
                text = _fn("collie_handle_error")(h)
                text = text.decode("utf-8", "replace") if text else _last_error()
                handle._error = CollieError(rc, "%s: %s%s" % (handle.name, _STATUS.get(rc, rc),
                                                              ": " + text if text else ""))
            else:
                handle._result = handle._finish(h)
        except CollieError as e:
            handle._error = e
        finally:
            handle._done = True
            handle._finish = None
            handle._keep = None
            _pending.pop(h, None)
            _fn("collie_release")(h)
    if handle._error is not None:
        raise handle._error
    return handle._result


def _input(array, what):
    """A C-contiguous numpy array of a supported dtype (a copy when needed)."""
    a = np.ascontiguousarray(array)
    try:
        _lib.nccl_dtype(a.dtype)
    except TypeError as e:
        raise TypeError("collie.%s: %s" % (what, str(e).replace("collie: ", "", 1))) from None
    return a


def _op(op, what):
    if op not in _OP_NAMES:
        raise ValueError("collie.%s: op must be collie.Average, Sum, Min, Max or Product, not %r"
                         % (what, op))
    return int(op)


def _engine_output(h, dtype, set_size=None):
    """The engine-allocated result of handle h as a new array (and per-rank counts)."""
    buf, count = _c.c_void_p(), _c.c_size_t()
    _check(_fn("collie_result")(h, _c.byref(buf), _c.byref(count)), "collie_result")
    out = np.empty(count.value, dtype=dtype)
    if count.value:
        _c.memmove(out.ctypes.data, buf.value, count.value * out.itemsize)
    counts = None
    if set_size is not None:
        arr = (_c.c_size_t * max(set_size, 1))()
        _check(_fn("collie_result_counts")(h, arr), "collie_result_counts")
        counts = [int(arr[i]) for i in range(set_size)]
    return out, counts


def _set_size(sid):
    return _check(_fn("collie_process_set_size")(sid), "collie_process_set_size")


# ---------------------------------------------------------------- collectives

def allreduce_async(array, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set):
    """Starts an allreduce of `array`; synchronize() returns a new array of the
    same shape: postscale * op(prescale * array over the set's ranks)."""
    a = _input(array, "allreduce")
    sid = _set_id(process_set)
    name = _auto_name("allreduce", sid, name)
    out = np.empty_like(a)
    hid = _check(_fn("collie_allreduce_async")(name.encode(), a.ctypes.data, out.ctypes.data, a.size,
                                               _lib.nccl_dtype(a.dtype), _op(op, "allreduce"),
                                               float(prescale_factor), float(postscale_factor), sid),
                 "collie_allreduce_async(%s)" % name)
    return Handle(hid, name, lambda h: out, (a, out))


def allreduce(array, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
              process_set=global_process_set):
    """Allreduce of `array` over the set's ranks; returns a new array."""
    return synchronize(allreduce_async(array, op, name, prescale_factor, postscale_factor, process_set))


def grouped_allreduce_async(arrays, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
                            process_set=global_process_set):
    """Starts allreduces of several arrays (one dtype) negotiated and run
    together; synchronize() returns the list of new arrays."""
    arrs = [_input(x, "grouped_allreduce") for x in arrays]
    if not arrs:
        raise ValueError("collie.grouped_allreduce: no arrays")
    dts = {a.dtype for a in arrs}
    if len(dts) != 1:
        raise TypeError("collie.grouped_allreduce: all arrays must have one dtype, got %s"
                        % ", ".join(sorted(str(d) for d in dts)))
    sid = _set_id(process_set)
    base = _auto_name("grouped_allreduce", sid, name)
    names = ["%s.%d" % (base, i) for i in range(len(arrs))]
    outs = [np.empty_like(a) for a in arrs]
    n = len(arrs)
    c_names = (_c.c_char_p * n)(*[s.encode() for s in names])
    c_send = (_c.c_void_p * n)(*[a.ctypes.data for a in arrs])
    c_recv = (_c.c_void_p * n)(*[o.ctypes.data for o in outs])
    c_counts = (_c.c_size_t * n)(*[a.size for a in arrs])
    hid = _check(_fn("collie_grouped_allreduce_async")(n, c_names, c_send, c_recv, c_counts,
                                                       _lib.nccl_dtype(arrs[0].dtype),
                                                       _op(op, "grouped_allreduce"),
                                                       float(prescale_factor), float(postscale_factor),
                                                       sid),
                 "collie_grouped_allreduce_async(%s)" % base)
    return Handle(hid, base, lambda h: outs, (arrs, outs, c_names))


def grouped_allreduce(arrays, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set):
    """Allreduce of each array, negotiated as one group; returns a list of new arrays."""
    return synchronize(grouped_allreduce_async(arrays, op, name, prescale_factor, postscale_factor,
                                               process_set))


def allgather_async(array, name=None, process_set=global_process_set):
    """Starts an allgather along the first dimension (which may differ per
    rank; the others must agree); synchronize() returns the concatenation."""
    a = _input(array, "allgather")
    if a.ndim == 0:
        a = a.reshape(1)
    sid = _set_id(process_set)
    name = _auto_name("allgather", sid, name)
    shape = (_c.c_int64 * a.ndim)(*a.shape)
    hid = _check(_fn("collie_allgather_nd_async")(name.encode(), a.ctypes.data, a.ndim, shape,
                                                  _lib.nccl_dtype(a.dtype), sid),
                 "collie_allgather_nd_async(%s)" % name)
    inner = a.shape[1:]

    def finish(h):
        out, _ = _engine_output(h, a.dtype)
        per_row = int(np.prod(inner, dtype=np.int64))
        rows = out.size // per_row if per_row else 0
        return out.reshape((rows,) + inner)
    return Handle(hid, name, finish, (a,))


def allgather(array, name=None, process_set=global_process_set):
    """Concatenation of every rank's array along the first dimension, in rank order."""
    return synchronize(allgather_async(array, name, process_set))


def broadcast_async(array, root_rank, name=None, process_set=global_process_set):
    """Starts a broadcast from root_rank (rank in the set); synchronize()
    returns a new array with root's values."""
    sid = _set_id(process_set)
    out = np.array(_input(array, "broadcast"), copy=True, order="C")
    return _broadcast_into(out, root_rank, name, sid)


def _broadcast_into(buf, root_rank, name, sid):
    name = _auto_name("broadcast", sid, name)
    hid = _check(_fn("collie_broadcast_async")(name.encode(), buf.ctypes.data, buf.size,
                                               _lib.nccl_dtype(buf.dtype), int(root_rank), sid),
                 "collie_broadcast_async(%s)" % name)
    return Handle(hid, name, lambda h: buf, (buf,))


def broadcast(array, root_rank, name=None, process_set=global_process_set):
    """A new array holding root_rank's `array` on every rank."""
    return synchronize(broadcast_async(array, root_rank, name, process_set))


def broadcast_(array, root_rank, name=None, process_set=global_process_set):
    """In-place broadcast into `array` (C-contiguous, writeable); returns it."""
    if not isinstance(array, np.ndarray) or not array.flags.c_contiguous or not array.flags.writeable:
        raise ValueError("collie.broadcast_: array must be a writeable C-contiguous numpy array")
    _lib.nccl_dtype(array.dtype)
    return synchronize(_broadcast_into(array, root_rank, name, _set_id(process_set)))


def alltoall_async(array, splits=None, name=None, process_set=global_process_set):
    """Starts an all-to-all along the first dimension: splits[j] rows go to
    rank j of the set (None: equal parts). synchronize() returns the received
    rows, and the rows received from each rank when splits was given."""
    a = _input(array, "alltoall")
    if a.ndim == 0:
        a = a.reshape(1)
    sid = _set_id(process_set)
    n = _set_size(sid)
    rows = a.shape[0]
    if splits is None:
        if rows % n:
            raise ValueError("collie.alltoall: first dimension %d is not divisible by %d ranks; "
                             "pass splits" % (rows, n))
        split_list = [rows // n] * n
    else:
        split_list = [int(s) for s in np.asarray(splits).reshape(-1)]
        if len(split_list) != n or any(s < 0 for s in split_list) or sum(split_list) != rows:
            raise ValueError("collie.alltoall: splits %s must be %d non-negative numbers adding up to "
                             "the first dimension %d" % (split_list, n, rows))
    inner = a.shape[1:]
    per_row = int(np.prod(inner, dtype=np.int64))
    name = _auto_name("alltoall", sid, name)
    counts = (_c.c_size_t * n)(*[s * per_row for s in split_list])
    hid = _check(_fn("collie_alltoall_async")(name.encode(), a.ctypes.data, counts,
                                              _lib.nccl_dtype(a.dtype), sid),
                 "collie_alltoall_async(%s)" % name)

    def finish(h):
        out, recv_counts = _engine_output(h, a.dtype, n)
        got = [c // per_row if per_row else 0 for c in recv_counts]
        out = out.reshape((sum(got),) + inner) if per_row else out.reshape((0,) + inner)
        return out if splits is None else (out, np.array(got, dtype=np.int32))
    return Handle(hid, name, finish, (a, counts))


def alltoall(array, splits=None, name=None, process_set=global_process_set):
    """All-to-all along the first dimension. Returns the received array, or
    (array, received_splits) when splits is given (as Horovod)."""
    return synchronize(alltoall_async(array, splits, name, process_set))


def reducescatter_async(array, op=Average, name=None, process_set=global_process_set):
    """Starts a reduce-scatter along the first dimension: rank r of the set
    gets rows/size rows, one more if r < rows % size (Horovod's split), of
    op over the ranks' arrays. synchronize() returns that block."""
    a = _input(array, "reducescatter")
    if a.ndim == 0:
        a = a.reshape(1)
    sid = _set_id(process_set)
    op = _op(op, "reducescatter")
    n = _set_size(sid)
    rows, inner = a.shape[0], a.shape[1:]
    if a.ndim > 1 and rows % n:
        # The engine splits elements, not rows: with rows % size != 0 the
        # element split would cut rows. Reduce all and keep this rank's rows.
        me = _check(_fn("collie_process_set_rank")(sid), "collie_process_set_rank")
        start = me * (rows // n) + min(me, rows % n)
        mine = rows // n + (1 if me < rows % n else 0)
        h = allreduce_async(a, op, _auto_name("reducescatter", sid, name), process_set=sid)
        full_finish = h._finish
        h._finish = lambda hid: full_finish(hid)[start:start + mine].copy()
        return h
    name = _auto_name("reducescatter", sid, name)
    hid = _check(_fn("collie_reducescatter_async")(name.encode(), a.ctypes.data, a.size,
                                                   _lib.nccl_dtype(a.dtype), op, sid),
                 "collie_reducescatter_async(%s)" % name)

    def finish(h):
        out, _ = _engine_output(h, a.dtype)
        per_row = int(np.prod(inner, dtype=np.int64))
        return out.reshape(((out.size // per_row) if per_row else 0,) + inner)
    return Handle(hid, name, finish, (a,))


def reducescatter(array, op=Average, name=None, process_set=global_process_set):
    """This rank's block (along the first dimension) of op over the ranks' arrays."""
    return synchronize(reducescatter_async(array, op, name, process_set))


def join():
    """Declares this rank done for the epoch; blocks until every rank has
    joined (meanwhile it takes part in the others' collectives). Returns the
    last rank to join."""
    return _check(_fn("collie_join")(), "collie_join")


def barrier(process_set=global_process_set):
    """Blocks until every rank of the set reaches it."""
    _check(_fn("collie_barrier")(_set_id(process_set)), "collie_barrier")


def start_timeline(file_path, mark_cycles=False):
    """Writes a Chrome-trace JSON timeline to file_path (on rank 0)."""
    _check(_fn("collie_start_timeline")(os.fsencode(file_path), 1 if mark_cycles else 0),
           "collie_start_timeline")


def stop_timeline():
    """Stops the timeline and closes the file as valid JSON."""
    _check(_fn("collie_stop_timeline")(), "collie_stop_timeline")
