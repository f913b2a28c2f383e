"""collie.torch, Horovod's torch API: every collective with every dtype torch and collie share,
the in-place and async forms, zero copy, non-contiguous tensors, autograd, process sets, objects,
join, barrier and the error paths. Run by N ranks at once (see conftest.py): under collie-run,
or, with `python3 test_torch_hvd.py --torchrun-env N`, under torchrun's variables (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) set by the small launcher below."""

import gc
import os
import sys

import numpy as np
import pytest


# ---------------------------------------------------------------- torchrun-style launcher

def _free_port():
    """A port P with P and P + 1 free: torchrun's store would take P, and collie's bootstrap
    root listens on MASTER_PORT + 1."""
    from ports import free_ports
    return free_ports(2)


def _launch_torchrun_env(n, args):
    """Runs pytest on this file (or on the .py files among args) as n processes with the variables
    torchrun sets; the first failure stops the others. Exit status: the first non-zero one, else 0."""
    import subprocess
    import time
    port = _free_port()
    procs = []
    for rank in range(n):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(n), GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        for v in ("COLLIE_RANK", "COLLIE_SIZE", "NCCL_COMM_ID", "OMPI_COMM_WORLD_RANK"):
            env.pop(v, None)
        files = [] if any(a.endswith(".py") for a in args) else [os.path.abspath(__file__)]
        procs.append(subprocess.Popen([sys.executable, "-m", "pytest"] + args + files, env=env))
    deadline = time.monotonic() + 500
    rc = 0
    while any(p.poll() is None for p in procs):
        failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
        if (failed or time.monotonic() > deadline) and not rc:
            rc = failed[0] if failed else 124
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.1)
    return rc or next((p.returncode for p in procs if p.returncode), 0)


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "--torchrun-env":
        sys.exit("usage: %s --torchrun-env N [pytest args] [test files]" % sys.argv[0])
    import importlib.util
    if importlib.util.find_spec("torch") is None:
        print("SKIPPED: %s lacks torch (apt-get install python3-torch)" % sys.executable)
        sys.exit(77)
    sys.exit(_launch_torchrun_env(int(sys.argv[2]), sys.argv[3:]))


torch = pytest.importorskip("torch")

import collie.torch as hvd  # noqa: E402
from conftest import contrib, reference  # noqa: E402

DTYPES = ["int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
OPS = ["sum", "avg", "min", "max", "prod"]


def expected_rank_size():
    """(rank, size) as the launcher announced them: collie-run, torchrun-style or alone."""
    for r, s in (("COLLIE_RANK", "COLLIE_SIZE"), ("RANK", "WORLD_SIZE")):
        if r in os.environ:
            return int(os.environ[r]), int(os.environ[s])
    return 0, 1


@pytest.fixture(scope="module", autouse=True)
def engine():
    hvd.init()
    yield
    hvd.shutdown()
    assert not hvd.is_initialized()


def tdt(name):
    return getattr(torch, name)


def as_torch(a, dtype):
    """numpy array a as a torch tensor of dtype name `dtype` (bfloat16 through float32)."""
    if dtype == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


def np_dtype(dtype):
    return np.float32 if dtype == "bfloat16" else np.dtype(dtype)


def hvd_op(op):
    return {"sum": hvd.Sum, "avg": hvd.Average, "min": hvd.Min, "max": hvd.Max, "prod": hvd.Product}[op]


def test_topology():
    r, n = expected_rank_size()
    assert hvd.is_initialized()
    assert (hvd.rank(), hvd.size()) == (r, n)
    assert (hvd.local_rank(), hvd.local_size()) == (r, n)  # one host
    assert (hvd.cross_rank(), hvd.cross_size()) == (0, 1)
    assert not hvd.mpi_enabled() and not hvd.nccl_built() and not hvd.cuda_built()
    hvd.init()  # a second init is a no-op, as in Horovod
    assert hvd.size() == n


def test_shutdown_and_init_again():
    """Horovod allows init after shutdown. A rank whose engine another rank's shutdown already
    stopped must still free it, or its next init finds it in place (seen at 8 ranks)."""
    n = hvd.size()
    # A shutdown stops every rank's engine: not before every rank is past test_topology, which
    # asserts is_initialized() (8 ranks beside a CPU hog: a rank still there saw it false).
    hvd.barrier()
    for k in range(3):
        hvd.shutdown()
        assert not hvd.is_initialized()
        with pytest.raises(hvd.CollieError) as e:
            hvd.allreduce(torch.ones(2))
        assert e.value.status == "COLLIE_ERR_NOT_INITIALIZED"
        hvd.init()
        out = hvd.allreduce(torch.full((3,), float(k)), op=hvd.Sum)
        assert torch.equal(out, torch.full((3,), float(n * k)))


def test_init_after_a_peer_shutdown_is_a_no_op():
    """init decides on this process's own calls alone: while it holds an engine that a peer's
    shutdown stopped, init does nothing (as in Horovod) instead of starting a world the other
    ranks are not starting (the rank that did so lost its next engine to their next shutdown:
    'first allreduce after shutdown + init failed COLLIE_ERR_SHUTDOWN'). Rank 0 shuts down alone;
    the others wait, bounded, for that to stop their engine."""
    import time
    n = hvd.size()
    hvd.barrier()  # every rank is past the earlier tests before rank 0 stops the engines
    if hvd.rank() == 0:
        hvd.shutdown()
    else:
        deadline = time.monotonic() + 120
        while hvd.is_initialized():
            assert time.monotonic() < deadline, "rank 0's shutdown did not stop this engine in 120 s"
            time.sleep(0.01)
        hvd.init()  # the stopped engine is still held: nothing happens
        assert not hvd.is_initialized() and hvd.size() == n
        with pytest.raises(hvd.CollieError) as e:
            hvd.allreduce(torch.ones(2))
        assert e.value.status == "COLLIE_ERR_SHUTDOWN"
        hvd.shutdown()
    hvd.init()
    assert hvd.is_initialized()
    out = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="after_peer_shutdown")
    assert torch.equal(out, torch.full((3,), float(n)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_allreduce_every_op_and_dtype(dtype, op):
    r, n = hvd.rank(), hvd.size()
    for count in (1, 4099):
        ref = as_torch(reference(n, count, np_dtype(dtype), op), dtype)
        x = as_torch(contrib(r, n, count, np_dtype(dtype), op), dtype)
        tag = "%s.%s.%d" % (dtype, op, count)
        out = hvd.allreduce(x, op=hvd_op(op), name="ar." + tag)
        assert out.dtype == tdt(dtype) and out.shape == x.shape and out.data_ptr() != x.data_ptr()
        assert torch.equal(out, ref)
        # async, then in place (zero copy: the result is in x's own memory)
        h = hvd.allreduce_async(x, op=hvd_op(op), name="ara." + tag)
        assert torch.equal(hvd.synchronize(h), ref)
        ptr = x.data_ptr()
        y = hvd.allreduce_(x, op=hvd_op(op), name="ar_." + tag)
        assert y is x and x.data_ptr() == ptr and torch.equal(x, ref)
        x = as_torch(contrib(r, n, count, np_dtype(dtype), op), dtype)
        h = hvd.allreduce_async_(x, op=hvd_op(op), name="ara_." + tag)
        while not hvd.poll(h):
            pass
        assert hvd.synchronize(h) is x and torch.equal(x, ref)


def test_allreduce_default_average_and_deprecated_average_argument():
    r, n = hvd.rank(), hvd.size()
    x = torch.full((5,), float(r))
    assert torch.allclose(hvd.allreduce(x), torch.full((5,), (n - 1) / 2.0))
    assert torch.equal(hvd.allreduce(x, average=False), torch.full((5,), float(sum(range(n)))))
    assert torch.allclose(hvd.allreduce(x, average=True), torch.full((5,), (n - 1) / 2.0))


def test_scale_factors():
    r, n = hvd.rank(), hvd.size()
    x = torch.arange(10, dtype=torch.float64) + r
    out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0)
    want = 4.0 * sum(0.5 * (torch.arange(10, dtype=torch.float64) + k) for k in range(n))
    assert torch.allclose(out, want)
    out = hvd.grouped_allreduce([x, x[:3]], op=hvd.Average, postscale_factor=2.0)
    assert torch.allclose(out[1], 2.0 * sum(torch.arange(3, dtype=torch.float64) + k for k in range(n)) / n)
    with pytest.raises(hvd.CollieError):
        hvd.allreduce(torch.ones(3, dtype=torch.int32), op=hvd.Sum, prescale_factor=2.0)


def test_noncontiguous_tensors():
    r, n = hvd.rank(), hvd.size()
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4) * (r + 1)
    t = base.t()  # not contiguous: a documented copy
    assert not t.is_contiguous()
    want = (torch.arange(12, dtype=torch.float32).reshape(3, 4) * sum(k + 1 for k in range(n))).t()
    assert torch.equal(hvd.allreduce(t, op=hvd.Sum), want)
    hvd.allreduce_(t, op=hvd.Sum)  # copied back into the strided view
    assert torch.equal(t, want) and torch.equal(base, want.t())
    b = torch.full((4, 3), float(r)).t()
    hvd.broadcast_(b, root_rank=n - 1)
    assert torch.equal(b, torch.full((3, 4), float(n - 1)))


def test_async_handles_keep_tensors_alive():
    r, n = hvd.rank(), hvd.size()
    handles = [hvd.allreduce_async(torch.full((1000,), float(r + k)), op=hvd.Sum, name="alive.%d" % k)
               for k in range(8)]
    gc.collect()  # the inputs exist only inside the handles now
    for k, h in enumerate(handles):
        assert torch.equal(hvd.synchronize(h), torch.full((1000,), float(sum(q + k for q in range(n)))))


def test_async_in_a_different_order_on_each_rank():
    r, n = hvd.rank(), hvd.size()
    order = list(range(10))
    np.random.default_rng(50 + r).shuffle(order)
    hs = {k: hvd.allreduce_async(torch.full((10 + k,), k + r, dtype=torch.int64), op=hvd.Sum,
                                 name="order.%d" % k) for k in order}
    for k in range(10):
        want = torch.full((10 + k,), n * k + sum(range(n)), dtype=torch.int64)
        assert torch.equal(hvd.synchronize(hs[k]), want)


@pytest.mark.parametrize("dtype", ["int32", "bfloat16", "float16", "float32"])
def test_grouped_allreduce(dtype):
    r, n = hvd.rank(), hvd.size()
    xs = [torch.full((s,), r + 1, dtype=tdt(dtype)) for s in (1, 7, 300)]
    want = [torch.full((s,), sum(k + 1 for k in range(n)), dtype=tdt(dtype)) for s in (1, 7, 300)]
    outs = hvd.grouped_allreduce(xs, op=hvd.Sum, name="grp." + dtype)
    assert all(torch.equal(o, w) for o, w in zip(outs, want))
    outs = hvd.synchronize(hvd.grouped_allreduce_async(xs, op=hvd.Sum))
    assert all(torch.equal(o, w) for o, w in zip(outs, want))
    ptrs = [x.data_ptr() for x in xs]
    assert hvd.grouped_allreduce_(xs, op=hvd.Sum) == xs
    assert [x.data_ptr() for x in xs] == ptrs and all(torch.equal(x, w) for x, w in zip(xs, want))
    ys = [torch.full((s,), r + 1, dtype=tdt(dtype)) for s in (1, 7, 300)]
    h = hvd.grouped_allreduce_async_(ys, op=hvd.Sum)
    assert hvd.synchronize(h) == ys and all(torch.equal(y, w) for y, w in zip(ys, want))
    with pytest.raises(TypeError, match="one dtype"):
        hvd.grouped_allreduce([torch.ones(2), torch.ones(2, dtype=torch.float64)])


@pytest.mark.parametrize("dtype", DTYPES + ["bool", "int16", "complex64"])
def test_allgather(dtype):
    r, n = hvd.rank(), hvd.size()
    x = (torch.arange((r + 1) * 6).reshape(r + 1, 2, 3) + 10 * r).to(tdt(dtype))
    want = torch.cat([(torch.arange((k + 1) * 6).reshape(k + 1, 2, 3) + 10 * k).to(tdt(dtype))
                      for k in range(n)])
    out = hvd.allgather(x, name="ag." + dtype)
    assert out.dtype == tdt(dtype) and torch.equal(out, want)
    assert torch.equal(hvd.synchronize(hvd.allgather_async(x)), want)
    scalar = hvd.allgather(torch.tensor(float(r)))
    assert torch.equal(scalar, torch.arange(n, dtype=torch.float32))


@pytest.mark.parametrize("dtype", DTYPES + ["bool", "int16"])
def test_broadcast(dtype):
    r, n = hvd.rank(), hvd.size()
    for root in range(n):
        x = (torch.arange(257) * (r + 1) % 100).to(tdt(dtype))
        want = (torch.arange(257) * (root + 1) % 100).to(tdt(dtype))
        out = hvd.broadcast(x, root_rank=root, name="bc.%s.%d" % (dtype, root))
        assert torch.equal(out, want) and out.data_ptr() != x.data_ptr()
        assert torch.equal(x, (torch.arange(257) * (r + 1) % 100).to(tdt(dtype)))  # input untouched
        assert torch.equal(hvd.synchronize(hvd.broadcast_async(x, root)), want)
        ptr = x.data_ptr()
        assert hvd.broadcast_(x, root) is x and x.data_ptr() == ptr and torch.equal(x, want)
        y = torch.zeros(257, dtype=tdt(dtype)) if r != root else want.clone()
        assert hvd.synchronize(hvd.broadcast_async_(y, root)) is y and torch.equal(y, want)


def test_alltoall():
    r, n = hvd.rank(), hvd.size()
    x = torch.arange(n * 2, dtype=torch.float32).reshape(n, 2) + 100 * r
    out = hvd.alltoall(x)  # no splits: one row to each rank, the output alone
    want = torch.stack([torch.tensor([2.0 * r, 2.0 * r + 1]) + 100 * k for k in range(n)])
    assert torch.equal(out, want)
    # rank r sends j + 1 rows to rank j
    splits = [j + 1 for j in range(n)]
    rows = sum(splits)
    x = (torch.arange(rows) + 1000 * r).to(torch.int64).reshape(rows, 1).repeat(1, 3)
    out, got = hvd.alltoall(x, splits=splits, name="a2a.splits")
    assert got.dtype == torch.int32 and got.tolist() == [r + 1] * n
    start = sum(splits[:r])
    want = torch.cat([(torch.arange(start, start + r + 1) + 1000 * k).reshape(-1, 1).repeat(1, 3)
                      for k in range(n)])
    assert torch.equal(out, want)
    out2, got2 = hvd.synchronize(hvd.alltoall_async(x, splits=torch.tensor(splits)))
    assert torch.equal(out2, want) and torch.equal(got2, got)
    bf = hvd.alltoall(torch.full((n,), float(r), dtype=torch.bfloat16))
    assert torch.equal(bf, torch.arange(n, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="splits"):
        hvd.alltoall(torch.ones(n + 1), splits=[1] * (n + 5))


def test_reducescatter():
    r, n = hvd.rank(), hvd.size()
    x = torch.arange(n * 4, dtype=torch.float32) * (r + 1)
    total = torch.arange(n * 4, dtype=torch.float32) * sum(k + 1 for k in range(n))
    assert torch.equal(hvd.reducescatter(x, op=hvd.Sum), total[4 * r:4 * r + 4])
    assert torch.allclose(hvd.reducescatter(x), total[4 * r:4 * r + 4] / n)  # default Average
    # 2-D, rows not divisible by size: the first rows % size ranks get one more row
    rows = 2 * n + 1
    y = torch.ones(rows, 3, dtype=torch.float64) * (r + 1)
    mine = rows // n + (1 if r < rows % n else 0)
    out = hvd.synchronize(hvd.reducescatter_async(y, op=hvd.Max))
    assert torch.equal(out, torch.full((mine, 3), float(n), dtype=torch.float64))
    out = hvd.reducescatter(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    assert torch.allclose(out, 1.5 * total[4 * r:4 * r + 4])
    out = hvd.reducescatter(x, op=hvd.Min, prescale_factor=-1.0)
    assert torch.allclose(out, -torch.arange(n * 4, dtype=torch.float32)[4 * r:4 * r + 4] * n)


def test_autograd():
    r, n = hvd.rank(), hvd.size()
    w = torch.full((4,), float(r + 1), requires_grad=True)
    (hvd.allreduce(w, op=hvd.Sum) * torch.arange(4.0)).sum().backward()
    # d/dw_r of sum_j c_j * sum_k w_k[j] on every rank, summed over ranks
    assert torch.allclose(w.grad, n * torch.arange(4.0))
    v = torch.full((r + 1, 2), 1.0, requires_grad=True)
    g = hvd.allgather(v)
    (g * (torch.arange(g.shape[0], dtype=torch.float32).reshape(-1, 1) + 1)).sum().backward()
    start = sum(k + 1 for k in range(r))
    assert torch.allclose(v.grad, n * (torch.arange(start, start + r + 1, dtype=torch.float32) + 1)
                          .reshape(-1, 1).repeat(1, 2))
    b = torch.full((3,), float(r), requires_grad=True)
    (hvd.broadcast(b, root_rank=0) * 2).sum().backward()
    assert torch.equal(b.grad, torch.full((3,), 2.0 * n if r == 0 else 0.0))


def test_compression_fp16():
    r, n = hvd.rank(), hvd.size()
    x = torch.full((100,), 0.5 * (r + 1), dtype=torch.float32)
    out = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
    assert out.dtype == torch.float32
    assert torch.equal(out, torch.full((100,), 0.5 * sum(k + 1 for k in range(n))))
    t, ctx = hvd.Compression.fp16.compress(x)
    assert t.dtype == torch.float16 and hvd.Compression.fp16.decompress(t, ctx).dtype == torch.float32
    i = torch.ones(3, dtype=torch.int32)
    assert hvd.Compression.fp16.compress(i)[0] is i and hvd.Compression.none.compress(x)[0] is x


def test_process_sets():
    r, n = hvd.rank(), hvd.size()
    members = sorted({0, n - 1})
    ps = hvd.ProcessSet(members)
    with pytest.raises(ValueError, match="not registered"):
        hvd.allreduce(torch.ones(1), process_set=ps)
    assert hvd.add_process_set(ps) is ps and ps.process_set_id > 0
    assert ps.size() == len(members) and ps.included() == (r in members)
    if r in members:
        out = hvd.allreduce(torch.full((4,), r + 1, dtype=torch.int32), op=hvd.Sum, process_set=ps)
        assert torch.equal(out, torch.full((4,), sum(m + 1 for m in members), dtype=torch.int32))
        g = hvd.allgather(torch.tensor([r]), process_set=ps)
        assert g.tolist() == members
        b = hvd.broadcast(torch.tensor([r]), root_rank=ps.size() - 1, process_set=ps)
        assert b.tolist() == [members[-1]]
        assert hvd.broadcast_object({"r": r}, root_rank=0, process_set=ps) == {"r": 0}
        assert hvd.allgather_object(r, process_set=ps) == members
        hvd.barrier(process_set=ps)
    other = hvd.add_process_set(list(range(n)))  # a list works too
    assert isinstance(other, hvd.ProcessSet) and other.size() == n
    assert hvd.remove_process_set(other) and other.process_set_id is None
    assert hvd.remove_process_set(ps)
    assert hvd.global_process_set.size() == n


def test_objects():
    r, n = hvd.rank(), hvd.size()
    obj = {"rank": r, "t": torch.arange(3) * r, "s": "x" * (r * 1000)}
    got = hvd.broadcast_object(obj, root_rank=n - 1)
    assert got["rank"] == n - 1 and torch.equal(got["t"], torch.arange(3) * (n - 1))
    everyone = hvd.allgather_object(obj)
    assert [o["rank"] for o in everyone] == list(range(n))
    assert [len(o["s"]) for o in everyone] == [k * 1000 for k in range(n)]


def test_broadcast_parameters_and_optimizer_state():
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(r)  # different weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (r + 1))
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    mine = [p.detach().clone() for p in model.state_dict().values()]
    everyone = hvd.allgather_object(mine)
    for other in everyone:
        assert all(torch.equal(a, b) for a, b in zip(mine, other))
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01)
    st = opt.state_dict()["state"]
    root = hvd.broadcast_object(st, root_rank=0)
    assert all(torch.equal(st[k]["exp_avg"], root[k]["exp_avg"]) for k in st)
    hvd.broadcast_parameters(list(model.named_parameters()), root_rank=n - 1)
    with pytest.raises(ValueError, match="pairs"):
        hvd.broadcast_parameters([torch.ones(1)], root_rank=0)


def test_join_with_uneven_steps():
    r, n = hvd.rank(), hvd.size()
    for step in range(r + 1):  # rank r runs r + 1 steps
        out = hvd.allreduce(torch.ones(8), op=hvd.Sum, name="join.%d" % step)
        assert torch.equal(out, torch.full((8,), float(n - step)))  # joined ranks add zeros
    assert hvd.join() == n - 1
    hvd.barrier()


def test_errors():
    r, n = hvd.rank(), hvd.size()
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(torch.ones(2), op=hvd.Adasum)
    with pytest.raises(ValueError, match="not both"):
        hvd.allreduce(torch.ones(2), op=hvd.Sum, average=True)
    with pytest.raises(TypeError, match="cannot be reduced"):
        hvd.allreduce(torch.ones(2, dtype=torch.bool))
    with pytest.raises(TypeError, match="torch.Tensor"):
        hvd.allreduce(np.ones(2))
    with pytest.raises(ValueError, match="CPU tensors only"):
        hvd.allreduce(torch.ones(2, device="meta"))
    with pytest.raises(ValueError, match="dense"):
        hvd.allreduce(torch.ones(2, 2).to_sparse())
    with pytest.raises(hvd.CollieError) as e:
        hvd.synchronize(hvd.broadcast_async(torch.ones(2), root_rank=n + 2, name="bad.root"))
    assert e.value.code < 0 and str(e.value)
    if n > 1:
        # A shape mismatch fails on every rank, naming the tensor and the ranks.
        with pytest.raises(hvd.HorovodInternalError) as e:
            hvd.allreduce(torch.ones(4 + r), op=hvd.Sum, name="mismatch.shape")
        assert e.value.code == -3 and "mismatch.shape" in str(e.value) and "rank" in str(e.value)
        with pytest.raises(RuntimeError, match="mismatch.dtype"):
            hvd.allreduce(torch.ones(4, dtype=torch.float32 if r else torch.float64), name="mismatch.dtype")
    # the engine goes on working
    assert torch.equal(hvd.allreduce(torch.ones(3), op=hvd.Sum), torch.full((3,), float(n)))
