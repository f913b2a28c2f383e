# collie.torch's collectives on CPU tensors (Horovod's torch names and arguments): each call
# hands tensor.data_ptr() to the engine functions bound in python/collie/__init__.py and returns
# a collie.Handle (synchronize/poll there) that keeps the tensors alive until it completes.
"""Horovod-style collectives on torch CPU tensors, zero copy for contiguous inputs.

Inputs are read where they lie (``tensor.data_ptr()``); allreduce and broadcast write straight
into the output (or, for the ``_`` forms, into the tensor itself). A non-contiguous tensor is first
copied into a contiguous one (and, for in-place forms, copied back at synchronize). The results of
allgather, alltoall and reducescatter are allocated by the engine (their size is known only once
every rank has submitted) and copied once into a new tensor.
"""

import ctypes as _c
import pickle

import numpy as np
import torch

import collie
from collie import Average, CollieError, Max, Min, Product, Sum, global_process_set

Adasum = 2  # Horovod's value; collie does not implement Adasum (a clear error below)

# ncclDataType_t of every dtype torch and collie share; others move as bytes where no
# arithmetic is needed (broadcast, allgather, alltoall).
_NCCL_DTYPE = {
    torch.int8: 0, torch.uint8: 1, torch.int32: 2, torch.int64: 4,
    torch.float16: 6, torch.float32: 7, torch.float64: 8, torch.bfloat16: 9,
}
_BYTES = 1  # ncclUint8, for the byte-moving path


def _check_tensor(tensor, what):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("collie.torch.%s: expected a torch.Tensor, got %s" % (what, type(tensor).__name__))
    if tensor.device.type != "cpu":
        raise ValueError("collie.torch.%s: tensor is on %s; collie.torch handles CPU tensors only"
                         % (what, tensor.device))
    if tensor.layout != torch.strided:
        raise ValueError("collie.torch.%s: %s tensors are not supported (dense tensors only)"
                         % (what, tensor.layout))


def _reduce_dtype(tensor, what):
    code = _NCCL_DTYPE.get(tensor.dtype)
    if code is None:
        raise TypeError("collie.torch.%s: dtype %s cannot be reduced; collie reduces %s"
                        % (what, tensor.dtype, ", ".join(str(d).replace("torch.", "")
                                                          for d in _NCCL_DTYPE)))
    return code


def _contig(tensor):
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def _op(op, average, what):
    """Horovod's op / deprecated average arguments to a collie_op_t."""
    if op is not None and average is not None:
        raise ValueError("collie.torch.%s: give op or average, not both" % what)
    if op is None:
        op = Sum if average is not None and not average else Average
    if op == Adasum:
        raise NotImplementedError("collie.torch.%s: op=Adasum is not supported by collie; use Average "
                                  "or Sum" % what)
    if op not in (Average, Sum, Min, Max, Product):
        raise ValueError("collie.torch.%s: op must be Average, Sum, Min, Max or Product, not %r" % (what, op))
    return int(op)


def _sid(process_set, what="collective"):
    if process_set is None:
        return 0
    if isinstance(process_set, collie.ProcessSet) and process_set.process_set_id is None:
        raise ValueError("collie.torch.%s: %r is not registered: pass it to init(process_sets=[...]) "
                         "or add_process_set() first" % (what, process_set))
    return collie._set_id(process_set)


def _submit(what, rc):
    return collie._check(rc, what)


def _engine_result(hid):
    """(address, element count) of a finished handle's engine-allocated output."""
    buf, count = _c.c_void_p(), _c.c_size_t()
    collie._check(collie._fn("collie_result")(hid, _c.byref(buf), _c.byref(count)), "collie_result")
    return buf.value, count.value


def _result_counts(hid, n):
    arr = (_c.c_size_t * max(n, 1))()
    collie._check(collie._fn("collie_result_counts")(hid, arr), "collie_result_counts")
    return [int(arr[i]) for i in range(n)]


def _copy_out(hid, out):
    """Copies the engine's output of handle hid into the contiguous tensor out."""
    addr, _ = _engine_result(hid)
    nbytes = out.numel() * out.element_size()
    if nbytes:
        _c.memmove(out.data_ptr(), addr, nbytes)
    return out


def _set_size(sid):
    return collie._set_size(sid)


def _set_rank(sid):
    return collie._check(collie._fn("collie_process_set_rank")(sid), "collie_process_set_rank")


# ---------------------------------------------------------------- allreduce

def _allreduce_submit(tensor, inplace, name, op, prescale_factor, postscale_factor, process_set, what):
    _check_tensor(tensor, what)
    code = _reduce_dtype(tensor, what)
    sid = _sid(process_set, what)
    name = collie._auto_name("allreduce", sid, name)
    src = _contig(tensor)
    if inplace:
        dst = src
        if src is tensor:
            finish = lambda h: tensor  # noqa: E731
        else:
            def finish(h):
                with torch.no_grad():
                    tensor.copy_(src)
                return tensor
    else:
        dst = torch.empty_like(src, memory_format=torch.contiguous_format)
        finish = lambda h: dst  # noqa: E731
    hid = _submit("collie_allreduce_async(%s)" % name, collie._fn("collie_allreduce_async")(
        name.encode(), src.data_ptr(), dst.data_ptr(), src.numel(), code, op,
        float(prescale_factor), float(postscale_factor), sid))
    return collie.Handle(hid, name, finish, (tensor, src, dst))


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set):
    """Starts an allreduce; synchronize(handle) returns a new tensor:
    postscale * op(prescale * tensor over the set's ranks)."""
    return _allreduce_submit(tensor, False, name, _op(op, average, "allreduce_async"), prescale_factor,
                             postscale_factor, process_set, "allreduce_async")


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set):
    """Starts an in-place allreduce; synchronize(handle) returns `tensor`."""
    return _allreduce_submit(tensor, True, name, _op(op, average, "allreduce_async_"), prescale_factor,
                             postscale_factor, process_set, "allreduce_async_")


class _AllreduceFn(torch.autograd.Function):
    """Differentiable allreduce: the gradient is the same allreduce of the output's gradient."""

    @staticmethod
    def forward(ctx, tensor, name, op, pre, post, process_set):
        ctx.args = (op, pre, post, process_set)
        return collie.synchronize(_allreduce_submit(tensor, False, name, op, pre, post, process_set,
                                                    "allreduce"))

    @staticmethod
    def backward(ctx, grad):
        op, pre, post, process_set = ctx.args
        if op not in (Average, Sum):
            raise NotImplementedError("collie.torch.allreduce: no gradient for op %s"
                                      % collie._OP_NAMES[op])
        g = collie.synchronize(_allreduce_submit(grad, False, None, op, pre, post, process_set,
                                                 "allreduce(backward)"))
        return g, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set):
    """A new tensor: postscale * op(prescale * tensor) over the set's ranks (differentiable).
    compression (Compression.fp16 ...) compresses before and decompresses after."""
    op = _op(op, average, "allreduce")
    ctx = None
    if compression is not None:
        tensor, ctx = compression.compress(tensor)
    if torch.is_grad_enabled() and isinstance(tensor, torch.Tensor) and tensor.requires_grad:
        out = _AllreduceFn.apply(tensor, name, op, prescale_factor, postscale_factor, process_set)
    else:
        out = collie.synchronize(_allreduce_submit(tensor, False, name, op, prescale_factor,
                                                   postscale_factor, process_set, "allreduce"))
    return compression.decompress(out, ctx) if compression is not None else out


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    """In-place allreduce of `tensor`; returns it."""
    return collie.synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                               postscale_factor, process_set))


# ---------------------------------------------------------------- grouped allreduce

def _grouped_submit(tensors, inplace, name, op, prescale_factor, postscale_factor, process_set, what):
    tensors = list(tensors)
    if not tensors:
        raise ValueError("collie.torch.%s: no tensors" % what)
    for t in tensors:
        _check_tensor(t, what)
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1:
        raise TypeError("collie.torch.%s: all tensors must have one dtype, got %s"
                        % (what, ", ".join(sorted(str(d) for d in dtypes))))
    code = _reduce_dtype(tensors[0], what)
    sid = _sid(process_set, what)
    base = collie._auto_name("grouped_allreduce", sid, name)
    n = len(tensors)
    srcs = [_contig(t) for t in tensors]
    dsts = srcs if inplace else [torch.empty_like(s, memory_format=torch.contiguous_format) for s in srcs]
    names = (_c.c_char_p * n)(*[("%s.%d" % (base, i)).encode() for i in range(n)])
    sends = (_c.c_void_p * n)(*[s.data_ptr() for s in srcs])
    recvs = (_c.c_void_p * n)(*[d.data_ptr() for d in dsts])
    counts = (_c.c_size_t * n)(*[s.numel() for s in srcs])

    def finish(h):
        if not inplace:
            return dsts
        with torch.no_grad():
            for t, s in zip(tensors, srcs):
                if s is not t:
                    t.copy_(s)
        return tensors
    hid = _submit("collie_grouped_allreduce_async(%s)" % base,
                  collie._fn("collie_grouped_allreduce_async")(
                      n, names, sends, recvs, counts, code, op, float(prescale_factor),
                      float(postscale_factor), sid))
    return collie.Handle(hid, base, finish, (tensors, srcs, dsts, names))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Starts allreduces of several tensors (one dtype) negotiated and run together;
    synchronize() returns the list of new tensors."""
    return _grouped_submit(tensors, False, name, _op(op, average, "grouped_allreduce_async"),
                           prescale_factor, postscale_factor, process_set, "grouped_allreduce_async")


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """In-place form of grouped_allreduce_async; synchronize() returns the tensors."""
    return _grouped_submit(tensors, True, name, _op(op, average, "grouped_allreduce_async_"),
                           prescale_factor, postscale_factor, process_set, "grouped_allreduce_async_")


def grouped_allreduce(tensors, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set):
    """Allreduce of each tensor, negotiated as one group; returns a list of new tensors."""
    ctxs = None
    if compression is not None:
        pairs = [compression.compress(t) for t in tensors]
        tensors, ctxs = [p[0] for p in pairs], [p[1] for p in pairs]
    outs = collie.synchronize(grouped_allreduce_async(tensors, average, name, op, prescale_factor,
                                                      postscale_factor, process_set))
    if compression is not None:
        outs = [compression.decompress(o, c) for o, c in zip(outs, ctxs)]
    return outs


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    """In-place grouped allreduce; returns the tensors."""
    return collie.synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                       postscale_factor, process_set))


# ---------------------------------------------------------------- allgather

def _byte_view_shape(src):
    """(dtype code, shape handed to the engine, bytes per engine element) for src: its own
    dtype when collie has it, else raw bytes with the last dimension widened."""
    code = _NCCL_DTYPE.get(src.dtype)
    shape = tuple(src.shape)
    if code is not None:
        return code, shape, src.element_size()
    return _BYTES, shape[:-1] + (shape[-1] * src.element_size(),), 1


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts an allgather along the first dimension (it may differ per rank, the others must
    agree); synchronize() returns the concatenation in rank order."""
    _check_tensor(tensor, "allgather_async")
    sid = _sid(process_set, "allgather_async")
    name = collie._auto_name("allgather", sid, name)
    src = _contig(tensor)
    if src.dim() == 0:
        src = src.reshape(1)
    code, shape, _ = _byte_view_shape(src)
    c_shape = (_c.c_int64 * len(shape))(*shape)
    inner = tuple(src.shape[1:])
    row_bytes = int(np.prod(inner, dtype=np.int64)) * src.element_size()
    n = _set_size(sid)

    def finish(h):
        _, count = _engine_result(h)
        esize = 1 if code == _BYTES else src.element_size()
        rows = count * esize // row_bytes if row_bytes else 0
        out = _copy_out(h, torch.empty((rows,) + inner, dtype=src.dtype))
        counts = _result_counts(h, n)
        handle.rows = [c * esize // row_bytes if row_bytes else 0 for c in counts]
        return out
    hid = _submit("collie_allgather_nd_async(%s)" % name, collie._fn("collie_allgather_nd_async")(
        name.encode(), src.data_ptr(), len(shape), c_shape, code, sid))
    handle = collie.Handle(hid, name, finish, (tensor, src))
    return handle


class _AllgatherFn(torch.autograd.Function):
    """Differentiable allgather: this rank's rows of the sum of every rank's output gradient."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        h = allgather_async(tensor, name, process_set)
        out = collie.synchronize(h)
        me = _set_rank(_sid(process_set))
        ctx.span = (sum(h.rows[:me]), h.rows[me])
        ctx.process_set = process_set
        ctx.scalar = tensor.dim() == 0
        return out

    @staticmethod
    def backward(ctx, grad):
        total = collie.synchronize(_allreduce_submit(grad, False, None, Sum, 1.0, 1.0, ctx.process_set,
                                                     "allgather(backward)"))
        start, rows = ctx.span
        g = total[start:start + rows]
        return (g.reshape(()) if ctx.scalar else g), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenation of every rank's tensor along the first dimension, in rank order (differentiable)."""
    if torch.is_grad_enabled() and isinstance(tensor, torch.Tensor) and tensor.requires_grad:
        return _AllgatherFn.apply(tensor, name, process_set)
    return collie.synchronize(allgather_async(tensor, name, process_set))


# ---------------------------------------------------------------- broadcast

def _broadcast_submit(tensor, root_rank, inplace, name, process_set, what):
    _check_tensor(tensor, what)
    sid = _sid(process_set, what)
    name = collie._auto_name("broadcast", sid, name)
    if inplace:
        buf = _contig(tensor)
    else:
        buf = tensor.detach().clone(memory_format=torch.contiguous_format)
    code = _NCCL_DTYPE.get(buf.dtype)
    count = buf.numel()
    if code is None:
        code, count = _BYTES, buf.numel() * buf.element_size()

    def finish(h):
        if inplace and buf is not tensor:
            with torch.no_grad():
                tensor.copy_(buf)
        return tensor if inplace else buf
    hid = _submit("collie_broadcast_async(%s)" % name, collie._fn("collie_broadcast_async")(
        name.encode(), buf.data_ptr(), count, code, int(root_rank), sid))
    return collie.Handle(hid, name, finish, (tensor, buf))


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts a broadcast from root_rank (rank in the set); synchronize() returns a new tensor."""
    return _broadcast_submit(tensor, root_rank, False, name, process_set, "broadcast_async")


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts an in-place broadcast into `tensor`; synchronize() returns it."""
    return _broadcast_submit(tensor, root_rank, True, name, process_set, "broadcast_async_")


class _BroadcastFn(torch.autograd.Function):
    """Differentiable broadcast: root's gradient is the sum of every rank's; the others get zeros."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.args = (root_rank, process_set)
        return collie.synchronize(_broadcast_submit(tensor, root_rank, False, name, process_set, "broadcast"))

    @staticmethod
    def backward(ctx, grad):
        root_rank, process_set = ctx.args
        g = collie.synchronize(_allreduce_submit(grad, False, None, Sum, 1.0, 1.0, process_set,
                                                 "broadcast(backward)"))
        if _set_rank(_sid(process_set)) != root_rank:
            g.zero_()
        return g, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """A new tensor holding root_rank's `tensor` on every rank (differentiable)."""
    if torch.is_grad_enabled() and isinstance(tensor, torch.Tensor) and tensor.requires_grad:
        return _BroadcastFn.apply(tensor, root_rank, name, process_set)
    return collie.synchronize(broadcast_async(tensor, root_rank, name, process_set))


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place broadcast into `tensor`; returns it."""
    return collie.synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ---------------------------------------------------------------- alltoall

def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts an all-to-all along the first dimension: splits[j] rows go to rank j of the set
    (None: equal parts). synchronize() returns the received tensor, and with splits also the
    rows received from each rank (an int32 tensor), as Horovod."""
    _check_tensor(tensor, "alltoall_async")
    sid = _sid(process_set, "alltoall_async")
    src = _contig(tensor)
    if src.dim() == 0:
        src = src.reshape(1)
    n = _set_size(sid)
    rows = src.shape[0]
    if splits is None:
        if rows % n:
            raise ValueError("collie.torch.alltoall: first dimension %d is not divisible by %d ranks; "
                             "pass splits" % (rows, n))
        split_list = [rows // n] * n
    else:
        if isinstance(splits, torch.Tensor):
            splits = splits.tolist()
        split_list = [int(s) for s in np.asarray(splits).reshape(-1)]
        if len(split_list) != n or any(s < 0 for s in split_list) or sum(split_list) != rows:
            raise ValueError("collie.torch.alltoall: splits %s must be %d non-negative numbers adding up "
                             "to the first dimension %d" % (split_list, n, rows))
    code, _, _ = _byte_view_shape(src)
    inner = tuple(src.shape[1:])
    row_elems = int(np.prod(inner, dtype=np.int64)) * (src.element_size() if code == _BYTES else 1)
    name = collie._auto_name("alltoall", sid, name)
    counts = (_c.c_size_t * n)(*[s * row_elems for s in split_list])

    def finish(h):
        got = [c // row_elems if row_elems else 0 for c in _result_counts(h, n)]
        out = _copy_out(h, torch.empty((sum(got),) + inner, dtype=src.dtype))
        return out if splits is None else (out, torch.tensor(got, dtype=torch.int32))
    hid = _submit("collie_alltoall_async(%s)" % name, collie._fn("collie_alltoall_async")(
        name.encode(), src.data_ptr(), counts, code, sid))
    return collie.Handle(hid, name, finish, (tensor, src, counts))


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """All-to-all along the first dimension; returns the received tensor, or
    (tensor, received_splits) when splits is given."""
    return collie.synchronize(alltoall_async(tensor, splits, name, process_set))


# ---------------------------------------------------------------- reducescatter

def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts a reduce-scatter along the first dimension: rank r of the set gets rows/size rows,
    one more if r < rows % size. The engine has no scale factors for it: prescale multiplies a
    copy of the input (no copy for Sum/Average, where it folds into postscale), postscale the
    output."""
    what = "reducescatter_async"
    _check_tensor(tensor, what)
    code = _reduce_dtype(tensor, what)
    op = _op(op, None, what)
    sid = _sid(process_set, what)
    pre, post = float(prescale_factor), float(postscale_factor)
    if (pre != 1.0 or post != 1.0) and not tensor.dtype.is_floating_point:
        raise ValueError("collie.torch.%s: scale factors apply to floating-point tensors only, not %s"
                         % (what, tensor.dtype))
    src = _contig(tensor)
    if src.dim() == 0:
        src = src.reshape(1)
    if pre != 1.0 and op in (Sum, Average):
        post, pre = post * pre, 1.0
    if pre != 1.0:
        src = src * pre
    n = _set_size(sid)
    rows, inner = src.shape[0], tuple(src.shape[1:])
    if src.dim() > 1 and rows % n:
        # The engine splits elements, not rows: reduce all and keep this rank's rows.
        me = _set_rank(sid)
        start = me * (rows // n) + min(me, rows % n)
        mine = rows // n + (1 if me < rows % n else 0)
        h = _allreduce_submit(src, False, collie._auto_name("reducescatter", sid, name), op, 1.0, post,
                              sid, what)
        full = h._finish
        h._finish = lambda hid: full(hid)[start:start + mine].clone()
        h._keep = (h._keep, tensor)
        return h
    name = collie._auto_name("reducescatter", sid, name)
    per_row = int(np.prod(inner, dtype=np.int64))

    def finish(h):
        _, count = _engine_result(h)
        out = _copy_out(h, torch.empty(((count // per_row) if per_row else 0,) + inner, dtype=src.dtype))
        if post != 1.0:
            out.mul_(post)
        return out
    hid = _submit("collie_reducescatter_async(%s)" % name, collie._fn("collie_reducescatter_async")(
        name.encode(), src.data_ptr(), src.numel(), code, op, sid))
    return collie.Handle(hid, name, finish, (tensor, src))


def reducescatter(tensor, name=None, compression=None, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """This rank's block (along the first dimension) of op over the ranks' tensors."""
    ctx = None
    if compression is not None:
        tensor, ctx = compression.compress(tensor)
    out = collie.synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                                 postscale_factor))
    return compression.decompress(out, ctx) if compression is not None else out


# ---------------------------------------------------------------- control

def poll(handle):
    """True when the operation of `handle` has finished (successfully or not)."""
    return collie.poll(handle)


def synchronize(handle):
    """Waits for `handle` and returns its result; raises collie.CollieError (a RuntimeError) with
    the engine's message if it failed."""
    return collie.synchronize(handle)


def join(device=-1):
    """Declares this rank done (uneven data); meanwhile it takes part in the other ranks'
    collectives with neutral values. Returns the last rank to join. `device` is accepted for
    Horovod compatibility (CPU only)."""
    return collie.join()


def barrier(process_set=global_process_set):
    """Blocks until every rank of the set reaches it."""
    collie.barrier(_sid(process_set, "barrier"))


# ---------------------------------------------------------------- objects

def _bytes_tensor(data):
    return np.frombuffer(data, dtype=np.uint8)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Pickles `obj` on root_rank (rank in the set) and returns an unpickled copy on every rank."""
    sid = _sid(process_set, "broadcast_object")
    name = name or collie._auto_name("broadcast_object", sid, None)
    root = _set_rank(sid) == int(root_rank)
    if root:
        payload = np.array(_bytes_tensor(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)))
        length = np.array([payload.size], dtype=np.int64)
    else:
        length = np.zeros(1, dtype=np.int64)
    collie.broadcast_(length, root_rank, name=name + ".len", process_set=sid)
    if not root:
        payload = np.zeros(int(length[0]), dtype=np.uint8)
    if payload.size:
        collie.broadcast_(payload, root_rank, name=name + ".data", process_set=sid)
    return obj if root else pickle.loads(payload.tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """The list of every rank's `obj` (pickled, gathered, unpickled), in rank order."""
    sid = _sid(process_set, "allgather_object")
    name = name or collie._auto_name("allgather_object", sid, None)
    payload = _bytes_tensor(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    sizes = collie.allgather(np.array([payload.size], dtype=np.int64), name=name + ".len", process_set=sid)
    data = collie.allgather(payload, name=name + ".data", process_set=sid)
    out, off = [], 0
    for s in sizes.tolist():
        out.append(pickle.loads(data[off:off + s].tobytes()))
        off += s
    return out


__all__ = [
    "Adasum", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "allgather",
    "allgather_async", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "alltoall",
    "alltoall_async", "reducescatter", "reducescatter_async", "poll", "synchronize", "join", "barrier",
    "broadcast_object", "allgather_object", "CollieError",
]
