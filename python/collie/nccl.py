"""collie.nccl: the NCCL API of libcollie (include/nccl.h) for numpy arrays.

Host buffers only: every call returns when the collective is done. The unique
ID is 128 plain bytes, so any channel (mpi4py's comm.bcast, a file, a socket)
can carry it from the rank that made it to the others.
"""

import contextlib
import ctypes as _c
import os
import threading

import numpy as np

from . import _lib

__all__ = [
    "NcclError", "Communicator", "get_unique_id", "init_from_env", "group", "group_start",
    "group_end", "SUM", "PROD", "MAX", "MIN", "AVG", "UNIQUE_ID_BYTES",
]

UNIQUE_ID_BYTES = 128

# ncclRedOp_t
SUM, PROD, MAX, MIN, AVG = 0, 1, 2, 3, 4
_OPS = {"sum": SUM, "prod": PROD, "max": MAX, "min": MIN, "avg": AVG}

# ncclResult_t names, for NcclError.name when the library is not asked.
_RESULTS = {0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError",
            3: "ncclInternalError", 4: "ncclInvalidArgument", 5: "ncclInvalidUsage",
            6: "ncclRemoteError", 7: "ncclInProgress"}


class _UniqueId(_c.Structure):
    _fields_ = [("internal", _c.c_char * UNIQUE_ID_BYTES)]


_L = _lib.lib
_comm_t = _c.c_void_p
_ptr = _c.c_void_p
_stream = _c.c_void_p

_L.ncclGetUniqueId.argtypes = [_c.POINTER(_UniqueId)]
_L.ncclCommInitRank.argtypes = [_c.POINTER(_comm_t), _c.c_int, _UniqueId, _c.c_int]
_L.collie_comm_init_from_env.argtypes = [_c.POINTER(_comm_t)]
_L.ncclCommDestroy.argtypes = [_comm_t]
_L.ncclCommAbort.argtypes = [_comm_t]
_L.ncclCommCount.argtypes = [_comm_t, _c.POINTER(_c.c_int)]
_L.ncclCommUserRank.argtypes = [_comm_t, _c.POINTER(_c.c_int)]
_L.ncclCommGetAsyncError.argtypes = [_comm_t, _c.POINTER(_c.c_int)]
_L.ncclAllReduce.argtypes = [_ptr, _ptr, _c.c_size_t, _c.c_int, _c.c_int, _comm_t, _stream]
_L.ncclBroadcast.argtypes = [_ptr, _ptr, _c.c_size_t, _c.c_int, _c.c_int, _comm_t, _stream]
_L.ncclReduce.argtypes = [_ptr, _ptr, _c.c_size_t, _c.c_int, _c.c_int, _c.c_int, _comm_t, _stream]
_L.ncclAllGather.argtypes = [_ptr, _ptr, _c.c_size_t, _c.c_int, _comm_t, _stream]
_L.ncclReduceScatter.argtypes = [_ptr, _ptr, _c.c_size_t, _c.c_int, _c.c_int, _comm_t, _stream]
_L.ncclSend.argtypes = [_ptr, _c.c_size_t, _c.c_int, _c.c_int, _comm_t, _stream]
_L.ncclRecv.argtypes = [_ptr, _c.c_size_t, _c.c_int, _c.c_int, _comm_t, _stream]
_L.ncclAlltoAll.argtypes = [_ptr, _ptr, _c.c_size_t, _c.c_int, _comm_t, _stream]
_L.ncclGather.argtypes = [_ptr, _ptr, _c.c_size_t, _c.c_int, _c.c_int, _comm_t, _stream]
_L.ncclScatter.argtypes = [_ptr, _ptr, _c.c_size_t, _c.c_int, _c.c_int, _comm_t, _stream]
_L.ncclGroupStart.argtypes = []
_L.ncclGroupEnd.argtypes = []


class NcclError(RuntimeError):
    """A libcollie NCCL call failed. `code` is the ncclResult_t, `name` its
    name, and the message carries ncclGetLastError's text."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.name = _RESULTS.get(code, "ncclResult(%d)" % code)


def _check(res, what, comm=None):
    if res != 0:
        detail = _L.ncclGetLastError(comm)
        detail = detail.decode("utf-8", "replace") if detail else ""
        text = _L.ncclGetErrorString(res)
        text = text.decode("utf-8", "replace") if text else "error %d" % res
        raise NcclError(res, "%s: %s%s" % (what, text, ": " + detail if detail else ""))


_env_lock = threading.Lock()


def get_unique_id(own_root=False):
    """A new unique ID (128 bytes) for Communicator(nranks, id, rank).

    Made by one rank and handed to all. When NCCL_COMM_ID is set (collie-run
    sets it) every rank gets the same ID from its own call, naming the job's
    one root address. own_root=True always makes a fresh ID whose root runs in
    this process, as when NCCL_COMM_ID is unset: for a second communicator in
    such a job (two inits on NCCL_COMM_ID's address at once would collide)."""
    uid = _UniqueId()
    if own_root and os.environ.get("NCCL_COMM_ID"):
        # The library reads NCCL_COMM_ID at call time and takes an empty value
        # as unset (src/param.c), so blank it for this one call. Overwriting
        # an existing variable replaces one pointer in environ (setenv keeps
        # old strings), so library threads reading the environment meanwhile
        # see the old or the new value, never a moved array (unsetenv would
        # shift it). The lock keeps this package's own threads apart.
        with _env_lock:
            saved = os.environ["NCCL_COMM_ID"]
            os.environ["NCCL_COMM_ID"] = ""
            try:
                res = _L.ncclGetUniqueId(_c.byref(uid))
            finally:
                os.environ["NCCL_COMM_ID"] = saved
    else:
        res = _L.ncclGetUniqueId(_c.byref(uid))
    _check(res, "ncclGetUniqueId")
    return _c.string_at(_c.addressof(uid), UNIQUE_ID_BYTES)


# Group nesting is per thread, as in NCCL. Arrays passed inside a group are
# only used at the outermost group_end, so they are kept alive until then.
_tls = threading.local()


def _group_keep(*arrays):
    if getattr(_tls, "depth", 0) > 0:
        _tls.keep.extend(a for a in arrays if a is not None)


def group_start():
    """ncclGroupStart: calls until the matching group_end run together."""
    _check(_L.ncclGroupStart(), "ncclGroupStart")
    if getattr(_tls, "depth", 0) == 0:
        _tls.keep = []
    _tls.depth = getattr(_tls, "depth", 0) + 1


def group_end():
    """ncclGroupEnd: runs the grouped calls (host buffers: returns when done)."""
    if getattr(_tls, "depth", 0) == 0:
        raise RuntimeError("collie.nccl.group_end without group_start")
    _tls.depth -= 1
    try:
        _check(_L.ncclGroupEnd(), "ncclGroupEnd")
    finally:
        if _tls.depth == 0:
            _tls.keep = []


@contextlib.contextmanager
def group():
    """with collie.nccl.group(): ... -- e.g. sends and receives that would
    otherwise wait on each other."""
    group_start()
    try:
        yield
    finally:
        group_end()


def _op(op):
    if isinstance(op, str):
        try:
            return _OPS[op.lower()]
        except KeyError:
            raise ValueError("collie.nccl: unknown op %r (one of %s, or an ncclRedOp_t value)"
                             % (op, ", ".join(_OPS))) from None
    if isinstance(op, (int, np.integer)) and not isinstance(op, bool):
        return int(op)
    raise TypeError("collie.nccl: op must be a name (%s) or an int, not %r" % (", ".join(_OPS), op))


def _array(a, what, writeable=False):
    """(pointer, element count, ncclDataType_t) of a contiguous numpy array."""
    if not isinstance(a, np.ndarray):
        raise TypeError("collie.nccl: %s must be a numpy.ndarray, not %s" % (what, type(a).__name__))
    code = _lib.nccl_dtype(a.dtype)
    if not a.flags.c_contiguous:
        raise ValueError("collie.nccl: %s must be C-contiguous (use numpy.ascontiguousarray)" % what)
    if writeable and not a.flags.writeable:
        raise ValueError("collie.nccl: %s is read-only" % what)
    return a.ctypes.data, a.size, code


def _same_dtype(a, b):
    if a.dtype != b.dtype:
        raise TypeError("collie.nccl: send is %s but recv is %s; they must match" % (a.dtype, b.dtype))


class Communicator:
    """An NCCL communicator over host buffers.

    Communicator(nranks, unique_id, rank) joins the ranks that pass the same
    unique_id (from get_unique_id on one of them); it blocks until all nranks
    have joined. Use `with` or call destroy() when done.
    """

    def __init__(self, nranks, unique_id, rank):
        self._comm = None
        if isinstance(unique_id, (bytearray, memoryview)):
            unique_id = bytes(unique_id)
        if not isinstance(unique_id, bytes) or len(unique_id) != UNIQUE_ID_BYTES:
            raise ValueError("collie.nccl: unique_id must be the %d bytes from get_unique_id()"
                             % UNIQUE_ID_BYTES)
        uid = _UniqueId()
        _c.memmove(_c.addressof(uid), unique_id, UNIQUE_ID_BYTES)
        comm = _comm_t()
        _check(_L.ncclCommInitRank(_c.byref(comm), int(nranks), uid, int(rank)), "ncclCommInitRank")
        self._set(comm)

    @classmethod
    def from_env(cls):
        """The world communicator of the launcher that started this process
        (collie-run, Open MPI, PMI, Slurm or torchrun variables; see
        collie_comm_init_from_env in include/collie.h)."""
        self = cls.__new__(cls)
        self._comm = None
        comm = _comm_t()
        _check(_L.collie_comm_init_from_env(_c.byref(comm)), "collie_comm_init_from_env")
        self._set(comm)
        return self

    def _set(self, comm):
        self._comm = comm
        n, r = _c.c_int(), _c.c_int()
        _check(_L.ncclCommCount(comm, _c.byref(n)), "ncclCommCount", comm)
        _check(_L.ncclCommUserRank(comm, _c.byref(r)), "ncclCommUserRank", comm)
        self._size, self._rank = n.value, r.value

    def _h(self):
        if self._comm is None:
            raise ValueError("collie.nccl: the communicator was destroyed")
        return self._comm

    @property
    def rank(self):
        return self._rank

    @property
    def size(self):
        return self._size

    @property
    def handle(self):
        """The ncclComm_t as an integer (for collie.init(comm=...))."""
        return self._h().value

    def __repr__(self):
        state = "destroyed" if self._comm is None else "rank %d of %d" % (self._rank, self._size)
        return "<collie.nccl.Communicator %s>" % state

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._comm is not None:
            self.destroy()

    def destroy(self):
        """ncclCommDestroy; the communicator cannot be used afterwards."""
        comm, self._comm = self._h(), None
        _check(_L.ncclCommDestroy(comm), "ncclCommDestroy")

    def abort(self):
        """ncclCommAbort: frees the communicator without waiting for peers."""
        comm, self._comm = self._h(), None
        _check(_L.ncclCommAbort(comm), "ncclCommAbort")

    def async_error(self):
        """ncclCommGetAsyncError as an ncclResult_t value (0: none)."""
        res = _c.c_int()
        _check(_L.ncclCommGetAsyncError(self._h(), _c.byref(res)), "ncclCommGetAsyncError", self._comm)
        return res.value

    def allreduce(self, send, recv=None, op="sum"):
        """recv = op over ranks of send (recv may be send; None: a new array). Returns recv."""
        if recv is None:
            recv = np.empty_like(send) if isinstance(send, np.ndarray) else None
        sp, n, dt = _array(send, "send")
        rp, rn, _ = _array(recv, "recv", writeable=True)
        _same_dtype(send, recv)
        if rn != n:
            raise ValueError("collie.nccl.allreduce: send has %d elements, recv %d" % (n, rn))
        _group_keep(send, recv)
        _check(_L.ncclAllReduce(sp, rp, n, dt, _op(op), self._h(), None), "ncclAllReduce", self._comm)
        return recv

    def broadcast(self, buf, root):
        """In place: every rank's buf becomes root's. Returns buf."""
        p, n, dt = _array(buf, "buf", writeable=True)
        _group_keep(buf)
        _check(_L.ncclBroadcast(p, p, n, dt, int(root), self._h(), None), "ncclBroadcast", self._comm)
        return buf

    def reduce(self, send, recv, op="sum", root=0):
        """recv on root = op over ranks of send; recv may be None elsewhere."""
        sp, n, dt = _array(send, "send")
        rp = None
        if recv is not None:
            rp, rn, _ = _array(recv, "recv", writeable=True)
            _same_dtype(send, recv)
            if rn != n:
                raise ValueError("collie.nccl.reduce: send has %d elements, recv %d" % (n, rn))
        elif self._rank == root:
            raise ValueError("collie.nccl.reduce: the root needs a recv array")
        _group_keep(send, recv)
        _check(_L.ncclReduce(sp, rp, n, dt, _op(op), int(root), self._h(), None), "ncclReduce", self._comm)
        return recv

    def allgather(self, send, recv):
        """recv (size * send.size elements) = every rank's send in rank order."""
        sp, n, dt = _array(send, "send")
        rp, rn, _ = _array(recv, "recv", writeable=True)
        _same_dtype(send, recv)
        if rn != n * self._size:
            raise ValueError("collie.nccl.allgather: recv needs %d elements (%d ranks x %d), has %d"
                             % (n * self._size, self._size, n, rn))
        _group_keep(send, recv)
        _check(_L.ncclAllGather(sp, rp, n, dt, self._h(), None), "ncclAllGather", self._comm)
        return recv

    def reduce_scatter(self, send, recv, op="sum"):
        """recv = this rank's block of op over ranks of send (send: size * recv.size elements)."""
        sp, n, dt = _array(send, "send")
        rp, rn, _ = _array(recv, "recv", writeable=True)
        _same_dtype(send, recv)
        if n != rn * self._size:
            raise ValueError("collie.nccl.reduce_scatter: send needs %d elements (%d ranks x %d), has %d"
                             % (rn * self._size, self._size, rn, n))
        _group_keep(send, recv)
        _check(_L.ncclReduceScatter(sp, rp, rn, dt, _op(op), self._h(), None), "ncclReduceScatter",
               self._comm)
        return recv

    def send(self, buf, peer):
        """Sends buf to peer (which calls recv with as many elements)."""
        p, n, dt = _array(buf, "buf")
        _group_keep(buf)
        _check(_L.ncclSend(p, n, dt, int(peer), self._h(), None), "ncclSend", self._comm)

    def recv(self, buf, peer):
        """Receives buf.size elements from peer into buf. Returns buf."""
        p, n, dt = _array(buf, "buf", writeable=True)
        _group_keep(buf)
        _check(_L.ncclRecv(p, n, dt, int(peer), self._h(), None), "ncclRecv", self._comm)
        return buf

    # Raw-pointer forms, for buffers that are not numpy arrays (torch tensors:
    # tensor.data_ptr()). `dtype` is an ncclDataType_t value, counts are in
    # elements as in include/nccl.h, and nothing is checked but what the
    # library checks: the caller keeps the memory alive and large enough,
    # until the outermost group_end when called inside a group.

    def allreduce_ptr(self, send, recv, count, dtype, op):
        _check(_L.ncclAllReduce(send, recv, count, dtype, _op(op), self._h(), None), "ncclAllReduce", self._comm)

    def broadcast_ptr(self, send, recv, count, dtype, root):
        _check(_L.ncclBroadcast(send, recv, count, dtype, int(root), self._h(), None), "ncclBroadcast",
               self._comm)

    def reduce_ptr(self, send, recv, count, dtype, op, root):
        _check(_L.ncclReduce(send, recv, count, dtype, _op(op), int(root), self._h(), None), "ncclReduce",
               self._comm)

    def allgather_ptr(self, send, recv, sendcount, dtype):
        _check(_L.ncclAllGather(send, recv, sendcount, dtype, self._h(), None), "ncclAllGather", self._comm)

    def reduce_scatter_ptr(self, send, recv, recvcount, dtype, op):
        _check(_L.ncclReduceScatter(send, recv, recvcount, dtype, _op(op), self._h(), None),
               "ncclReduceScatter", self._comm)

    def alltoall_ptr(self, send, recv, count, dtype):
        """count elements to and from each rank (send and recv: size * count)."""
        _check(_L.ncclAlltoAll(send, recv, count, dtype, self._h(), None), "ncclAlltoAll", self._comm)

    def gather_ptr(self, send, recv, count, dtype, root):
        _check(_L.ncclGather(send, recv, count, dtype, int(root), self._h(), None), "ncclGather", self._comm)

    def scatter_ptr(self, send, recv, count, dtype, root):
        _check(_L.ncclScatter(send, recv, count, dtype, int(root), self._h(), None), "ncclScatter", self._comm)

    def send_ptr(self, buf, count, dtype, peer):
        _check(_L.ncclSend(buf, count, dtype, int(peer), self._h(), None), "ncclSend", self._comm)

    def recv_ptr(self, buf, count, dtype, peer):
        _check(_L.ncclRecv(buf, count, dtype, int(peer), self._h(), None), "ncclRecv", self._comm)


def init_from_env():
    """Communicator.from_env(): the launcher's world communicator."""
    return Communicator.from_env()
