# ProcessGroupCollie: torch.distributed's ProcessGroup for CPU tensors over a
# collie.nccl.Communicator (python/collie/nccl.py, raw data_ptr() calls).
# Created by python/collie/torch/distributed.py, which registers the backend.
"""The "collie" torch.distributed process group.

Every collective runs on the calling thread and is complete when the method
returns (collie's host collectives finish before the call returns), so each
returns a Work whose future is already completed: there are no background
Python threads to complete futures at interpreter exit. Sends and receives
posted with isend/irecv are the exception: they are queued and run together,
in one ncclGroupStart/End, at the first wait() or the next other call on the
group, so that two ranks that isend to each other do not block each other.
"""

import datetime

import torch
import torch.distributed as dist

from .. import nccl

try:
    _c10d = torch._C._distributed_c10d
except AttributeError:  # pragma: no cover - torch built without distributed
    _c10d = None

# ncclDataType_t of each torch dtype collie shares. bool travels as uint8;
# complex as pairs of its real type (only where the op works per component).
_DTYPES = {
    torch.int8: 0, torch.uint8: 1, torch.int32: 2, torch.int64: 4,
    torch.float16: 6, torch.float32: 7, torch.float64: 8, torch.bfloat16: 9,
    torch.bool: 1,
}
_COMPLEX = {torch.complex64: 7, torch.complex128: 8}

_R = dist.ReduceOp
# (torch op, ncclRedOp_t, its name for messages)
_OPS = [(_R.SUM, nccl.SUM, "SUM"), (_R.PRODUCT, nccl.PROD, "PRODUCT"), (_R.MIN, nccl.MIN, "MIN"),
        (_R.MAX, nccl.MAX, "MAX")]
if hasattr(_R, "AVG"):
    _OPS.append((_R.AVG, nccl.AVG, "AVG"))
_UNSUPPORTED = [(getattr(_R, n), n) for n in ("BAND", "BOR", "BXOR", "PREMUL_SUM") if hasattr(_R, n)]
# On bool (0/1 in a byte) OR is MAX and AND is MIN; SUM and PRODUCT act as
# OR and AND, as in torch's NCCL backend.
_BOOL_OPS = {nccl.SUM: nccl.MAX, nccl.PROD: nccl.MIN, nccl.MAX: nccl.MAX, nccl.MIN: nccl.MIN}


class CollieBackendError(RuntimeError):
    """A call the collie backend cannot do (dtype, op, device, layout)."""


def _op_name(op):
    for t, _, name in _OPS:
        if op == t:
            return name
    for t, name in _UNSUPPORTED:
        if op == t:
            return name
    return repr(op)


def _op_codes():
    """ReduceOp -> ncclRedOp_t by hash where this torch's ReduceOp hashes as
    it compares (1.13 does); the loop in _nccl_op covers the rest."""
    table = {}
    try:
        for t, c, _ in _OPS:
            table[t] = c
        for t, c, _ in _OPS:
            if table.get(t) != c:
                return {}
    except TypeError:
        return {}
    return table


_OP_CODES = _op_codes()


def _nccl_op(op, dtype, what):
    try:
        code = _OP_CODES.get(op)
    except TypeError:  # an unhashable op object
        code = None
    if code is None:
        for t, c, _ in _OPS:
            if op == t:
                code = c
                break
    if code is None:
        name = _op_name(op)
        if dtype == torch.bool and name in ("BAND", "BOR"):
            return nccl.MIN if name == "BAND" else nccl.MAX
        raise CollieBackendError("collie backend: %s: ReduceOp.%s is not supported (SUM, PRODUCT, MIN, MAX "
                                 "and AVG are%s)" % (what, name, "; BAND and BOR on bool" if name != "BXOR" else ""))
    if dtype == torch.bool:
        if code == nccl.AVG:
            raise CollieBackendError("collie backend: %s: ReduceOp.AVG on bool tensors is undefined" % what)
        return _BOOL_OPS[code]
    if dtype in _COMPLEX and code not in (nccl.SUM, nccl.AVG):
        raise CollieBackendError("collie backend: %s: ReduceOp.%s on %s: only SUM and AVG work on complex "
                                 "numbers" % (what, _op_name(op), dtype))
    return code


def _buf(t, what):
    """(data pointer, element count, ncclDataType_t) of a contiguous CPU tensor."""
    if not isinstance(t, torch.Tensor):
        raise TypeError("collie backend: %s must be a torch.Tensor, not %s" % (what, type(t).__name__))
    if t.device.type != "cpu":
        raise CollieBackendError("collie backend: %s is on %s; the collie backend takes CPU tensors" % (what, t.device))
    if t.is_sparse:
        raise CollieBackendError("collie backend: %s is sparse; only dense tensors are supported" % what)
    if not t.is_contiguous():
        raise CollieBackendError("collie backend: %s is not contiguous (call .contiguous() first)" % what)
    n = t.numel()
    code = _DTYPES.get(t.dtype)
    if code is None:
        code = _COMPLEX.get(t.dtype)
        if code is None:
            raise CollieBackendError("collie backend: %s has dtype %s, which collie does not carry (float16/32/64, "
                                     "bfloat16, int8/32/64, uint8, bool, complex64/128)" % (what, t.dtype))
        n *= 2
    return (t.data_ptr() or None), n, code


def _same(a, b, what):
    if a.dtype != b.dtype:
        raise CollieBackendError("collie backend: %s: tensors of %s and %s; they must match" % (what, a.dtype, b.dtype))


def _one(tensors, what):
    if len(tensors) != 1:
        raise CollieBackendError("collie backend: %s takes one tensor per process, got %d" % (what, len(tensors)))
    return tensors[0]


def _consecutive(tensors):
    """The data pointer of the first of `tensors` when they are contiguous and
    lie back to back in memory in list order (as torch.chunk/split of one
    contiguous tensor gives), so one buffer call can fill or read them all;
    else None."""
    if not tensors:
        return None
    first = tensors[0]
    if first.layout != torch.strided:
        return None
    base = first.data_ptr()
    step = first.numel() * first.element_size()
    if not base or not step:
        return None
    for i, t in enumerate(tensors):
        if t.layout != torch.strided or not t.is_contiguous() or t.dtype != first.dtype:
            return None
        if t.numel() * t.element_size() != step or t.data_ptr() != base + i * step:
            return None
    return base


def _overlaps(t, base, nbytes):
    p = t.data_ptr()
    return p < base + nbytes and base < p + t.numel() * t.element_size()


def _done_future(value):
    fut = torch.futures.Future()
    fut.set_result(value)
    return fut


if _c10d is not None and hasattr(_c10d, "_create_work_from_future"):
    def _done_work(value):
        return _c10d._create_work_from_future(_done_future(value))
else:  # pragma: no cover - torch versions without it
    def _done_work(value):
        return _CompletedWork(value)


_WorkBase = _c10d.Work


class _CompletedWork(_WorkBase):
    """A finished operation (for torch versions without _create_work_from_future)."""

    def __init__(self, value):
        super().__init__()
        self._fut = _done_future(value)
        self._value = value

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def exception(self):
        return None

    def wait(self, timeout=None):
        return True

    def result(self):
        return self._value

    def get_future(self):
        return self._fut


class _P2PWork(_WorkBase):
    """An isend/irecv: queued until the first wait() (or the group's next
    call), then run with every other queued one in one group."""

    def __init__(self, pg, tensors):
        super().__init__()
        self._pg = pg
        self._tensors = tensors
        self._fut = torch.futures.Future()
        self._error = None

    def _finish(self, error):
        self._error = error
        if error is None:
            self._fut.set_result(self._tensors)
        else:
            self._fut.set_exception(error)

    def is_completed(self):
        return self._fut.done()

    def is_success(self):
        return self._fut.done() and self._error is None

    def exception(self):
        return self._error

    def wait(self, timeout=None):
        if not self._fut.done():
            self._pg._flush()
        if self._error is not None:
            raise self._error
        return True

    def result(self):
        self.wait()
        return self._tensors

    def get_future(self):
        return self._fut

    def source_rank(self):
        return self._src

    def _source_rank(self):
        return self._src


class ProcessGroupCollie(dist.ProcessGroup):
    """torch.distributed ProcessGroup backed by a collie communicator."""

    def __init__(self, comm, rank, size, timeout=None):
        super().__init__(rank, size)
        if comm.rank != rank or comm.size != size:
            raise CollieBackendError("collie backend: communicator is rank %d of %d but torch asked for rank %d of %d"
                                     % (comm.rank, comm.size, rank, size))
        self._comm = comm
        self._timeout = timeout if timeout is not None else datetime.timedelta(minutes=30)
        self._pending = []  # (is_send, tensor, count, dtype, peer, work)

    # ------------------------------------------------------------ identity

    def getBackendName(self):
        return "collie"

    def name(self):
        return "collie"

    def _get_backend_name(self):
        return "collie"

    @property
    def communicator(self):
        """The collie.nccl.Communicator this group runs on."""
        return self._comm

    def destroy(self):
        """Frees the communicator (destroy_process_group does not tell backends).
        isend/irecv never waited for are dropped with an error, not run: their
        peers may be gone, and this runs at interpreter exit too."""
        pending, self._pending = self._pending, []
        for *_, work in pending:
            work._finish(CollieBackendError("collie backend: the process group was destroyed before this "
                                            "send/recv was waited for"))
        if self._comm is not None and self._comm._comm is not None:
            self._comm.destroy()

    def __repr__(self):
        return "<ProcessGroupCollie rank %d of %d>" % (self.rank(), self.size())

    # ------------------------------------------------------------ helpers

    def _c(self):
        if self._pending:
            self._flush()
        if self._comm is None or self._comm._comm is None:
            raise CollieBackendError("collie backend: the process group was destroyed")
        return self._comm

    def _root(self, root, what):
        if not 0 <= root < self.size():
            raise CollieBackendError("collie backend: %s: root %d is not a rank of this group (0..%d)"
                                     % (what, root, self.size() - 1))
        return root

    def _flush(self):
        """Runs the queued isend/irecv as one group (then they are all done)."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        error = None
        try:
            with nccl.group():
                for is_send, t, n, dt, peer, _ in pending:
                    if is_send:
                        self._comm.send_ptr(t.data_ptr() or None, n, dt, peer)
                    else:
                        self._comm.recv_ptr(t.data_ptr() or None, n, dt, peer)
        except Exception as e:  # every queued work reports the group's failure
            error = e
        for *_, work in pending:
            work._finish(error)
        if error is not None:
            raise error

    # ------------------------------------------------------------ collectives

    def allreduce(self, tensors, opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        op = opts if isinstance(opts, type(_R.SUM)) else getattr(opts, "reduceOp", _R.SUM)
        t = _one(tensors, "allreduce")
        p, n, dt = _buf(t, "allreduce tensor")
        self._c().allreduce_ptr(p, p, n, dt, _nccl_op(op, t.dtype, "allreduce"))
        return _done_work(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        op = getattr(opts, "reduceOp", _R.SUM)
        comm = self._c()
        bufs = [(_buf(t, "allreduce_coalesced tensor"), t.dtype) for t in tensors]
        with nccl.group():
            for (p, n, dt), dtype in bufs:
                comm.allreduce_ptr(p, p, n, dt, _nccl_op(op, dtype, "allreduce_coalesced"))
        return _done_work(tensors)

    def broadcast(self, tensors, opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        root = self._root(getattr(opts, "rootRank", 0), "broadcast")
        comm = self._c()
        # torch's C++ _broadcast_coalesced may pass several tensors: one group.
        bufs = [_buf(t, "broadcast tensor") for t in tensors]
        if len(bufs) == 1:  # dist.broadcast: one call, no group to open and close
            p, n, dt = bufs[0]
            comm.broadcast_ptr(p, p, n, dt, root)
            return _done_work(tensors)
        with nccl.group():
            for p, n, dt in bufs:
                comm.broadcast_ptr(p, p, n, dt, root)
        return _done_work(tensors)

    def reduce(self, tensors, opts=None):
        op = getattr(opts, "reduceOp", _R.SUM)
        root = self._root(getattr(opts, "rootRank", 0), "reduce")
        t = _one(tensors, "reduce")
        p, n, dt = _buf(t, "reduce tensor")
        self._c().reduce_ptr(p, p, n, dt, _nccl_op(op, t.dtype, "reduce"), root)
        return _done_work(tensors)

    def _allgather_base(self, output, input, opts=None):
        _same(output, input, "all_gather_into_tensor")
        ip, n, dt = _buf(input, "all_gather_into_tensor input")
        op_, on, _ = _buf(output, "all_gather_into_tensor output")
        if on != n * self.size():
            raise CollieBackendError("collie backend: all_gather_into_tensor: output has %d elements, needs %d "
                                     "(%d ranks x %d)" % (output.numel(), input.numel() * self.size(), self.size(),
                                                          input.numel()))
        self._c().allgather_ptr(ip, op_, n, dt)
        return _done_work([output])

    def allgather(self, output_tensors, input_tensors, opts=None):
        inp = _one(input_tensors, "all_gather")
        outs = _one(output_tensors, "all_gather")
        if len(outs) != self.size():
            raise CollieBackendError("collie backend: all_gather: %d output tensors for %d ranks"
                                     % (len(outs), self.size()))
        for o in outs:
            _same(o, inp, "all_gather")
            if o.numel() != inp.numel():
                raise CollieBackendError("collie backend: all_gather: an output has %d elements, the input %d"
                                         % (o.numel(), inp.numel()))
        base = _consecutive(outs) if inp.layout == torch.strided and inp.is_contiguous() else None
        if base is not None:
            # Outputs back to back in one buffer (dist.all_gather into chunks of
            # one tensor): gather straight into them, no staging copy. An input
            # that overlaps them must be this rank's own piece (in place).
            _buf(outs[0], "all_gather output")  # device, layout and dtype checks
            step = inp.numel() * inp.element_size()
            if not _overlaps(inp, base, step * len(outs)) or inp.data_ptr() == base + self.rank() * step:
                ip, n, dt = _buf(inp, "all_gather input")
                self._c().allgather_ptr(ip, base, n, dt)
                return _done_work(outs)
        src = inp.contiguous()
        flat = torch.empty((self.size(),) + tuple(src.shape), dtype=src.dtype)
        self._allgather_base(flat, src)
        for i, o in enumerate(outs):
            o.copy_(flat[i].view(o.shape))
        return _done_work(outs)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        for outs, inp in zip(output_lists, input_list):
            self.allgather([outs], [inp], opts)
        return _done_work([t for outs in output_lists for t in outs])

    def _reduce_scatter_base(self, output, input, opts=None):
        op = getattr(opts, "reduceOp", _R.SUM)
        _same(output, input, "reduce_scatter_tensor")
        ip, n, dt = _buf(input, "reduce_scatter_tensor input")
        op_, on, _ = _buf(output, "reduce_scatter_tensor output")
        if n != on * self.size():
            raise CollieBackendError("collie backend: reduce_scatter_tensor: input has %d elements, needs %d "
                                     "(%d ranks x %d)" % (input.numel(), output.numel() * self.size(), self.size(),
                                                          output.numel()))
        self._c().reduce_scatter_ptr(ip, op_, on, dt, _nccl_op(op, output.dtype, "reduce_scatter"))
        return _done_work([output])

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        out = _one(output_tensors, "reduce_scatter")
        ins = _one(input_tensors, "reduce_scatter")
        if len(ins) != self.size():
            raise CollieBackendError("collie backend: reduce_scatter: %d input tensors for %d ranks"
                                     % (len(ins), self.size()))
        for t in ins:
            _same(out, t, "reduce_scatter")
            if t.numel() != out.numel():
                raise CollieBackendError("collie backend: reduce_scatter: an input has %d elements, the output %d"
                                         % (t.numel(), out.numel()))
        base = _consecutive(ins)
        if base is not None and (out.layout != torch.strided or not out.is_contiguous()
                                 or _overlaps(out, base, out.numel() * out.element_size() * len(ins))):
            base = None
        if base is not None:
            # Inputs back to back in one buffer (chunks of one tensor): reduce
            # from it directly, without concatenating them first.
            _buf(ins[0], "reduce_scatter input")  # device, layout and dtype checks
            op = getattr(opts, "reduceOp", _R.SUM)
            op_, on, dt = _buf(out, "reduce_scatter output")
            self._c().reduce_scatter_ptr(base, op_, on, dt, _nccl_op(op, out.dtype, "reduce_scatter"))
            return _done_work([out])
        flat = torch.cat([t.reshape(-1) for t in ins])
        res = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
        self._reduce_scatter_base(res, flat, opts)
        if res is not out:
            out.copy_(res)
        return _done_work([out])

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        _same(output, input, "all_to_all_single")
        ip, n, dt = _buf(input, "all_to_all_single input")
        op_, on, _ = _buf(output, "all_to_all_single output")
        size = self.size()
        comm = self._c()
        if not output_split_sizes and not input_split_sizes:
            if n % size or on != n:
                raise CollieBackendError("collie backend: all_to_all_single: %d input and %d output elements do not "
                                         "split evenly over %d ranks; pass split sizes" % (input.numel(),
                                                                                          output.numel(), size))
            comm.alltoall_ptr(ip, op_, n // size, dt)
            return _done_work([output])
        rows_in, rows_out = input.shape[0] if input.dim() else 1, output.shape[0] if output.dim() else 1
        ins = self._splits(input_split_sizes, rows_in, "input")
        outs = self._splits(output_split_sizes, rows_out, "output")
        per_in = n // rows_in if rows_in else 0
        per_out = on // rows_out if rows_out else 0
        if per_in != per_out:
            raise CollieBackendError("collie backend: all_to_all_single: input and output rows differ in size")
        esize = (input.element_size() * input.numel() // n) if n else input.element_size()
        with nccl.group():
            off = 0
            for peer, rows in enumerate(ins):
                if rows * per_in:
                    comm.send_ptr(ip + off * per_in * esize, rows * per_in, dt, peer)
                off += rows
            off = 0
            for peer, rows in enumerate(outs):
                if rows * per_out:
                    comm.recv_ptr(op_ + off * per_out * esize, rows * per_out, dt, peer)
                off += rows
        return _done_work([output])

    def _splits(self, sizes, rows, what):
        size = self.size()
        if not sizes:
            if rows % size:
                raise CollieBackendError("collie backend: all_to_all_single: %s first dimension %d is not divisible "
                                         "by %d ranks; pass %s_split_sizes" % (what, rows, size, what))
            return [rows // size] * size
        sizes = [int(s) for s in sizes]
        if len(sizes) != size or any(s < 0 for s in sizes) or sum(sizes) != rows:
            raise CollieBackendError("collie backend: all_to_all_single: %s_split_sizes %s must be %d non-negative "
                                     "numbers adding up to the first dimension %d" % (what, sizes, size, rows))
        return sizes

    def alltoall(self, output_tensors, input_tensors, opts=None):
        size = self.size()
        if len(output_tensors) != size or len(input_tensors) != size:
            raise CollieBackendError("collie backend: all_to_all: needs %d input and %d output tensors, got %d and %d"
                                     % (size, size, len(input_tensors), len(output_tensors)))
        ins = [_buf(t, "all_to_all input") for t in input_tensors]
        outs = [_buf(t, "all_to_all output") for t in output_tensors]
        for i, o in zip(input_tensors, output_tensors):
            _same(i, o, "all_to_all")
        comm = self._c()
        with nccl.group():
            for peer, (p, n, dt) in enumerate(ins):
                if n:
                    comm.send_ptr(p, n, dt, peer)
            for peer, (p, n, dt) in enumerate(outs):
                if n:
                    comm.recv_ptr(p, n, dt, peer)
        return _done_work(output_tensors)

    def gather(self, output_tensors, input_tensors, opts=None):
        root = self._root(getattr(opts, "rootRank", 0), "gather")
        inp = _one(input_tensors, "gather")
        ip, n, dt = _buf(inp, "gather input")
        comm = self._c()
        if self.rank() != root:
            comm.gather_ptr(ip, None, n, dt, root)
            return _done_work([])
        outs = _one(output_tensors, "gather")
        if len(outs) != self.size():
            raise CollieBackendError("collie backend: gather: %d output tensors for %d ranks" % (len(outs), self.size()))
        for o in outs:
            _same(o, inp, "gather")
            if o.numel() != inp.numel():
                raise CollieBackendError("collie backend: gather: an output has %d elements, the input %d"
                                         % (o.numel(), inp.numel()))
        flat = torch.empty((self.size(),) + tuple(inp.shape), dtype=inp.dtype)
        fp, _, _ = _buf(flat, "gather buffer")
        comm.gather_ptr(ip, fp, n, dt, root)
        for i, o in enumerate(outs):
            o.copy_(flat[i].view(o.shape))
        return _done_work(outs)

    def scatter(self, output_tensors, input_tensors, opts=None):
        root = self._root(getattr(opts, "rootRank", 0), "scatter")
        out = _one(output_tensors, "scatter")
        op_, n, dt = _buf(out, "scatter output")
        comm = self._c()
        if self.rank() != root:
            comm.scatter_ptr(None, op_, n, dt, root)
            return _done_work([out])
        ins = _one(input_tensors, "scatter")
        if len(ins) != self.size():
            raise CollieBackendError("collie backend: scatter: %d input tensors for %d ranks" % (len(ins), self.size()))
        for t in ins:
            _same(out, t, "scatter")
            if t.numel() != out.numel():
                raise CollieBackendError("collie backend: scatter: an input has %d elements, the output %d"
                                         % (t.numel(), out.numel()))
        flat = torch.cat([t.reshape(-1) for t in ins])
        fp, _, _ = _buf(flat, "scatter buffer")
        comm.scatter_ptr(fp, op_, n, dt, root)
        return _done_work([out])

    def barrier(self, opts=None):
        # A one-byte allreduce: returns once every rank of the group is here.
        t = torch.zeros(1, dtype=torch.uint8)
        self._c().allreduce_ptr(t.data_ptr(), t.data_ptr(), 1, 1, nccl.SUM)
        return _done_work([t])

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        raise CollieBackendError("collie backend: monitored_barrier is gloo's; use barrier() (collie reports a "
                                 "missing rank as an error on its own)")

    # ------------------------------------------------------------ point to point

    def _p2p(self, tensors, peer, is_send, what):
        t = _one(tensors, what)
        if not 0 <= peer < self.size() or peer == self.rank():
            raise CollieBackendError("collie backend: %s: peer %d is not another rank of this group (0..%d, not %d)"
                                     % (what, peer, self.size() - 1, self.rank()))
        _, n, dt = _buf(t, what + " tensor")
        work = _P2PWork(self, tensors)
        work._src = peer
        self._pending.append((is_send, t, n, dt, peer, work))
        return work

    def send(self, tensors, dstRank, tag=0):
        return self._p2p(tensors, dstRank, True, "send")

    def recv(self, tensors, srcRank, tag=0):
        return self._p2p(tensors, srcRank, False, "recv")

    def recv_anysource(self, tensors, tag=0):
        raise CollieBackendError("collie backend: recv from any source is not supported; name the source rank")
