"""torch.distributed over the "collie" backend (python/collie/torch/distributed.py):
every collective and dtype torch and collie share, async forms, groups,
point-to-point, errors, and DDP over collie against DDP over gloo. Run by N
ranks at once through torch_dist_launch.py (collie-run, torchrun's variables,
an explicit store, or torchrun itself); every rank checks its results against
values it computes for every rank itself."""

import datetime
import os

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import collie.torch.distributed as cdist  # noqa: E402  (registers "collie")

R = dist.ReduceOp
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed._", "ignore:torch.distributed.all_reduce_coalesced")
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int32,
          torch.int64, torch.uint8]
OPS = {"sum": R.SUM, "prod": R.PRODUCT, "min": R.MIN, "max": R.MAX, "avg": R.AVG}
COUNTS = [0, 1, 1001]


@pytest.fixture(scope="module")
def world():
    """The default group, made the way this run's launcher asks."""
    if os.environ.get("COLLIE_TEST_INIT") == "store":
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), size, rank == 0,
                              timeout=datetime.timedelta(seconds=300))
        dist.init_process_group("collie", store=store, rank=rank, world_size=size)
    else:
        dist.init_process_group("collie")
    yield dist.distributed_c10d._get_default_group()
    dist.destroy_process_group()


def contrib(rank, n, count, dtype, op):
    """Rank `rank`'s input: small values, exact in every dtype (products of 8
    ranks stay below 256, averages divide evenly)."""
    i = torch.arange(count, dtype=torch.int64)
    if op == "prod":
        v = 1 + (i + rank) % 2
    elif op == "avg":
        v = n * ((i + 3 * rank) % 2)
    else:
        v = (i * 7 + rank * 3) % 11 + 1
    return v.to(dtype)


def reference(n, count, dtype, op):
    xs = torch.stack([contrib(r, n, count, torch.int64, op) for r in range(n)])
    if op == "sum":
        out = xs.sum(0)
    elif op == "prod":
        out = xs.prod(0)
    elif op == "min":
        out = xs.min(0).values
    elif op == "max":
        out = xs.max(0).values
    else:
        out = xs.sum(0) // n
    return out.to(dtype)


def test_world_is_collie(world):
    assert dist.get_backend() == "collie"
    assert isinstance(world, cdist.ProcessGroupCollie)
    want = os.environ.get("COLLIE_SIZE") or os.environ.get("WORLD_SIZE")
    assert dist.get_world_size() == int(want)
    want = os.environ.get("COLLIE_RANK") or os.environ.get("RANK")
    assert dist.get_rank() == int(want)
    assert cdist.communicator().size == dist.get_world_size()
    import collie.torch  # noqa: F401  (the Horovod API's import registers it too)
    assert cdist.is_registered() and dist.Backend("collie") == "collie"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", list(OPS))
def test_all_reduce_every_dtype_and_op(world, dtype, op):
    r, n = dist.get_rank(), dist.get_world_size()
    for count in COUNTS:
        t = contrib(r, n, count, dtype, op)
        dist.all_reduce(t, OPS[op])
        assert torch.equal(t, reference(n, count, dtype, op)), "%s %s count %d" % (dtype, op, count)


def test_all_reduce_bool_and_complex(world):
    r, n = dist.get_rank(), dist.get_world_size()
    b = torch.tensor([r == 0, True, False, r % 2 == 1])
    for op, want in ((R.SUM, [True, True, False, n > 1]), (R.MAX, [True, True, False, n > 1]),
                     (R.BOR, [True, True, False, n > 1]), (R.PRODUCT, [n == 1, True, False, False]),
                     (R.MIN, [n == 1, True, False, False]), (R.BAND, [n == 1, True, False, False])):
        t = b.clone()
        dist.all_reduce(t, op)
        assert t.tolist() == want, op
    c = torch.tensor([1 + 2j, r * 1j], dtype=torch.complex64)
    dist.all_reduce(c)
    assert torch.equal(c, torch.tensor([n + 2j * n, 1j * n * (n - 1) / 2], dtype=torch.complex64))


def test_all_reduce_coalesced(world):
    n = dist.get_world_size()
    a, b = torch.ones(3), torch.full((2, 2), 2.0)
    dist.all_reduce_coalesced([a, b], R.SUM)
    assert torch.equal(a, torch.full((3,), float(n))) and torch.equal(b, torch.full((2, 2), 2.0 * n))


def test_all_reduce_shapes_in_place(world):
    n = dist.get_world_size()
    t = torch.ones(4, 5, 6, dtype=torch.float64)
    view = t[1]  # a contiguous view: the reduction lands in t
    dist.all_reduce(view)
    assert torch.equal(t[1], torch.full((5, 6), float(n), dtype=torch.float64))
    assert torch.equal(t[0], torch.ones(5, 6, dtype=torch.float64))


@pytest.mark.parametrize("dtype", DTYPES + [torch.bool], ids=str)
def test_broadcast_from_every_root(world, dtype):
    r, n = dist.get_rank(), dist.get_world_size()
    for root in range(n):
        for count in (1, 3000):
            want = (torch.arange(count) % 7 + root).to(dtype)
            t = want.clone() if r == root else torch.zeros(count, dtype=dtype)
            dist.broadcast(t, root)
            assert torch.equal(t, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_all_gather_forms(world, dtype):
    r, n = dist.get_rank(), dist.get_world_size()
    mine = (torch.arange(6).reshape(2, 3) + 10 * r).to(dtype)
    want = [(torch.arange(6).reshape(2, 3) + 10 * i).to(dtype) for i in range(n)]
    outs = [torch.zeros(2, 3, dtype=dtype) for _ in range(n)]
    dist.all_gather(outs, mine)
    assert all(torch.equal(a, b) for a, b in zip(outs, want))
    flat = torch.zeros(2 * n, 3, dtype=dtype)
    dist.all_gather_into_tensor(flat, mine)
    assert torch.equal(flat, torch.cat(want))
    flat2 = torch.zeros(n * 6, dtype=dtype)
    dist._all_gather_base(flat2, mine)
    assert torch.equal(flat2, torch.cat(want).reshape(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.complex64], ids=str)
def test_all_gather_reduce_scatter_chunks_of_one_tensor(world, dtype):
    """The list forms over chunks of one tensor (gathered into / reduced from it
    directly), in place, in another order and with an overlapping input (both
    staged): the same results every way."""
    r, n = dist.get_rank(), dist.get_world_size()
    piece = [(torch.arange(6) + 10 * i).to(dtype) for i in range(n)]
    big = torch.zeros(6 * n, dtype=dtype)
    dist.all_gather(list(big.chunk(n)), piece[r])
    assert torch.equal(big, torch.cat(piece))
    big = torch.zeros(6 * n, dtype=dtype)
    chunks = list(big.chunk(n))
    chunks[r].copy_(piece[r])
    dist.all_gather(chunks, chunks[r])  # in place
    assert torch.equal(big, torch.cat(piece))
    big = torch.zeros(6 * n, dtype=dtype)
    dist.all_gather(list(big.chunk(n))[::-1], piece[r])  # rank i into the (n-1-i)th chunk
    assert torch.equal(big, torch.cat(piece[::-1]))
    big = torch.zeros(6 * n, dtype=dtype)
    chunks = list(big.chunk(n))
    other = chunks[(r + 1) % n]
    other.copy_(piece[r])
    dist.all_gather(chunks, other)  # the input is another rank's piece of the output
    assert torch.equal(big, torch.cat(piece))

    full = torch.cat([(torch.arange(4) + k + r).to(dtype) for k in range(n)])
    want = (n * torch.arange(4) + n * r + n * (n - 1) // 2).to(dtype)
    out = torch.zeros(4, dtype=dtype)
    dist.reduce_scatter(out, list(full.chunk(n)))
    assert torch.equal(out, want)
    out = torch.zeros(4, dtype=dtype)
    dist.reduce_scatter(out, list(full.chunk(n))[::-1])  # chunk n-1-k goes to rank k
    assert torch.equal(out, (n * torch.arange(4) + n * (n - 1 - r) + n * (n - 1) // 2).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reduce_scatter_forms(world, dtype):
    r, n = dist.get_rank(), dist.get_world_size()
    count = 5
    full = contrib(r, n, n * count, dtype, "sum")
    want = reference(n, n * count, dtype, "sum")[r * count:(r + 1) * count]
    out = torch.zeros(count, dtype=dtype)
    dist.reduce_scatter(out, list(full.split(count)))
    assert torch.equal(out, want)
    out = torch.zeros(count, dtype=dtype)
    dist.reduce_scatter_tensor(out, full.clone())
    assert torch.equal(out, want)
    out = torch.zeros(count, dtype=dtype)
    dist._reduce_scatter_base(out, full.clone(), R.MAX)
    assert torch.equal(out, reference(n, n * count, dtype, "max")[r * count:(r + 1) * count])


def test_all_to_all_forms(world):
    r, n = dist.get_rank(), dist.get_world_size()
    # Equal parts: block j of rank i holds 100 * i + j.
    inp = torch.tensor([100 * r + j for j in range(n) for _ in range(3)], dtype=torch.int64)
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp)
    assert out.tolist() == [100 * i + r for i in range(n) for _ in range(3)]
    # Split sizes: rank i sends i + j + 1 rows (of 2 elements) to rank j.
    ins = [r + j + 1 for j in range(n)]
    outs = [i + r + 1 for i in range(n)]
    inp = torch.cat([torch.full((s, 2), float(10 * r + j)) for j, s in enumerate(ins)])
    out = torch.zeros(sum(outs), 2)
    dist.all_to_all_single(out, inp, outs, ins)
    assert torch.equal(out, torch.cat([torch.full((s, 2), float(10 * i + r)) for i, s in enumerate(outs)]))
    # Lists of tensors of different sizes.
    inputs = [torch.full((j + 1,), r, dtype=torch.int32) for j in range(n)]
    outputs = [torch.zeros(r + 1, dtype=torch.int32) for _ in range(n)]
    dist.all_to_all(outputs, inputs)
    assert [o.tolist() for o in outputs] == [[i] * (r + 1) for i in range(n)]


def test_reduce_gather_scatter_every_root(world):
    r, n = dist.get_rank(), dist.get_world_size()
    for root in range(n):
        t = contrib(r, n, 77, torch.float32, "sum")
        dist.reduce(t, root)
        if r == root:
            assert torch.equal(t, reference(n, 77, torch.float32, "sum"))
        mine = torch.full((2, 2), float(r))
        gl = [torch.zeros(2, 2) for _ in range(n)] if r == root else None
        dist.gather(mine, gl, dst=root)
        if r == root:
            assert all(torch.equal(g, torch.full((2, 2), float(i))) for i, g in enumerate(gl))
        sl = [torch.full((3,), float(10 * root + i)) for i in range(n)] if r == root else None
        out = torch.zeros(3)
        dist.scatter(out, sl, src=root)
        assert torch.equal(out, torch.full((3,), float(10 * root + r)))


def test_send_recv(world):
    r, n = dist.get_rank(), dist.get_world_size()
    if n < 2:
        pytest.skip("needs two ranks")
    nxt, prv = (r + 1) % n, (r - 1) % n
    # Blocking, ordered so that it cannot wait on itself: even ranks send first.
    got = torch.zeros(4, dtype=torch.float64)
    if r % 2 == 0:
        dist.send(torch.full((4,), float(r), dtype=torch.float64), nxt)
        dist.recv(got, prv)
    else:
        dist.recv(got, prv)
        dist.send(torch.full((4,), float(r), dtype=torch.float64), nxt)
    assert torch.equal(got, torch.full((4,), float(prv), dtype=torch.float64))
    # isend/irecv in any order: they run together at the first wait.
    got = torch.zeros(3, dtype=torch.int64)
    s = dist.isend(torch.full((3,), r, dtype=torch.int64), nxt)
    q = dist.irecv(got, prv)
    assert not s.is_completed()
    assert q.wait() and s.wait()
    assert s.is_completed() and got.tolist() == [prv] * 3
    assert q.get_future().wait()[0] is got
    # batch_isend_irecv.
    got = torch.zeros(2)
    ops = [dist.P2POp(dist.irecv, got, prv), dist.P2POp(dist.isend, torch.full((2,), float(r)), nxt)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert torch.equal(got, torch.full((2,), float(prv)))


def test_async_work_and_futures(world):
    r, n = dist.get_rank(), dist.get_world_size()
    t = torch.ones(10)
    w = dist.all_reduce(t, async_op=True)
    assert w.wait() is True and w.is_completed() and w.is_success()
    assert torch.equal(t, torch.full((10,), float(n)))
    fut = dist.all_reduce(t, async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2)
    assert torch.equal(doubled.wait(), torch.full((10,), 2.0 * n * n))
    b = torch.full((3,), float(r))
    dist.broadcast(b, 0, async_op=True).wait()
    assert torch.equal(b, torch.zeros(3))
    outs = [torch.zeros(1) for _ in range(n)]
    dist.all_gather(outs, torch.tensor([float(r)]), async_op=True).wait()
    assert [o.item() for o in outs] == list(range(n))
    dist.barrier(async_op=True).wait()
    dist.barrier()


def test_object_collectives(world):
    r, n = dist.get_rank(), dist.get_world_size()
    got = [None] * n
    dist.all_gather_object(got, {"rank": r, "pad": "x" * (100 * r)})
    assert got == [{"rank": i, "pad": "x" * (100 * i)} for i in range(n)]
    objs = [("root", [1, 2, 3]), None] if r == n - 1 else [None, None]
    dist.broadcast_object_list(objs, src=n - 1)
    assert objs == [("root", [1, 2, 3]), None]
    out = [None]
    dist.scatter_object_list(out, [i * 11 for i in range(n)] if r == 0 else None, src=0)
    assert out == [r * 11]


def test_new_group(world):
    r, n = dist.get_rank(), dist.get_world_size()
    # Ranks 1.. : group rank 0 is world rank 1 (who then makes the unique ID).
    members = list(range(1, n)) if n > 1 else [0]
    g = dist.new_group(members)
    if r in members:
        assert dist.get_backend(g) == "collie"
        t = torch.tensor([float(r)])
        dist.all_reduce(t, group=g)
        assert t.item() == sum(members)
        b = torch.tensor([r])
        dist.broadcast(b, members[-1], group=g)  # the root is a world rank
        assert b.item() == members[-1]
    else:
        assert g == dist.GroupMember.NON_GROUP_MEMBER
    # The world still works after (and around) the subgroup.
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == n
    # A group of everyone, made twice: each has its own communicator.
    g1, g2 = dist.new_group(list(range(n))), dist.new_group(list(range(n)))
    assert cdist.communicator(g1) is not cdist.communicator(g2)
    for g in (g1, g2):
        t = torch.ones(2, dtype=torch.int64)
        dist.all_reduce(t, R.SUM, group=g)
        assert t.tolist() == [n, n]


def test_destroyed_group(world):
    r, n = dist.get_rank(), dist.get_world_size()
    if n < 2:
        pytest.skip("needs two ranks")
    g = dist.new_group(list(range(n)))
    w = dist.isend(torch.ones(1), (r + 1) % n, group=g)  # never waited for
    g.destroy()
    with pytest.raises(RuntimeError, match="destroyed before"):
        w.wait()
    with pytest.raises(RuntimeError, match="destroyed"):
        dist.all_reduce(torch.ones(1), group=g)


def test_errors_are_clear(world):
    # Every rank makes the same bad call, caught before anything is sent.
    with pytest.raises(RuntimeError, match="BXOR is not supported"):
        dist.all_reduce(torch.ones(2, dtype=torch.int32), R.BXOR)
    with pytest.raises(RuntimeError, match="BAND is not supported"):
        dist.all_reduce(torch.ones(2, dtype=torch.int32), R.BAND)
    with pytest.raises(RuntimeError, match="not contiguous"):
        dist.all_reduce(torch.ones(4, 4).t())
    with pytest.raises(RuntimeError, match="int16"):
        dist.all_reduce(torch.ones(2, dtype=torch.int16))
    with pytest.raises(RuntimeError, match="complex"):
        dist.all_reduce(torch.ones(2, dtype=torch.complex64), R.MAX)
    with pytest.raises(RuntimeError, match="needs"):
        dist.all_gather_into_tensor(torch.zeros(1), torch.zeros(2))
    with pytest.raises(RuntimeError, match="must match"):
        dist.all_gather_into_tensor(torch.zeros(2 * dist.get_world_size()), torch.zeros(2, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="split sizes|split_sizes"):
        dist.all_to_all_single(torch.zeros(3), torch.zeros(3), [4] + [0] * (dist.get_world_size() - 1), None)
    with pytest.raises(RuntimeError, match="not another rank"):
        dist.send(torch.ones(1), dist.get_rank())
    with pytest.raises(RuntimeError, match="monitored_barrier"):
        world.monitored_barrier()
    # After all of that the group still works.
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == dist.get_world_size()


def _train(model, group, steps, rank, n, hook=None, accumulate=1, **ddp_args):
    """20 steps of SGD under DDP on `group`; rank r takes its share of one batch.
    accumulate=k: k-1 of every k backward passes run under no_sync()."""
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.01, **ddp_args)
    if hook is not None:
        ddp.register_comm_hook(group if group is not None else dist.group.WORLD, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1234)
    for step in range(steps):
        x = torch.randn(6 * n, *model.in_shape, generator=g)
        y = torch.randn(6 * n, model.out, generator=g)
        if step % accumulate == 0:
            opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x[rank * 6:(rank + 1) * 6]), y[rank * 6:(rank + 1) * 6])
        if (step + 1) % accumulate:
            with ddp.no_sync():
                loss.backward()
        else:
            loss.backward()
            opt.step()
    return [p.detach().clone() for p in model.parameters()] + [b.clone() for b in model.buffers()]


class MLP(torch.nn.Sequential):
    in_shape, out = (12,), 3

    def __init__(self):
        super().__init__(torch.nn.Linear(12, 32), torch.nn.Tanh(), torch.nn.Linear(32, 16), torch.nn.ReLU(),
                         torch.nn.Linear(16, 3))


class CNN(torch.nn.Sequential):
    in_shape, out = (1, 10, 10), 4

    def __init__(self):
        super().__init__(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Conv2d(4, 8, 3), torch.nn.ReLU(),
                         torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4))


@pytest.mark.parametrize("make", [MLP, CNN], ids=["mlp", "cnn"])
def test_ddp_matches_gloo(world, make):
    r, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    torch.manual_seed(7)
    a = make()
    torch.manual_seed(7)
    b = make()
    wa = _train(a, None, 20, r, n)  # the default group: collie
    wb = _train(b, gloo, 20, r, n)
    assert len(wa) == len(wb)
    for pa, pb in zip(wa, wb):
        assert torch.allclose(pa, pb, rtol=1e-5, atol=1e-6), (pa - pb).abs().max()
    # And every rank holds the same weights.
    for p in wa:
        lo, hi = p.clone(), p.clone()
        dist.all_reduce(lo, R.MIN)
        dist.all_reduce(hi, R.MAX)
        assert torch.equal(lo, hi)
    # Training moved the weights (the comparison above is not of two inits).
    torch.manual_seed(7)
    assert any(not torch.equal(p, q) for p, q in zip(wa, make().parameters()))


class BNNet(torch.nn.Module):
    """Batch norm (its buffers are broadcast before every forward) and a
    branch that is used only on some steps (find_unused_parameters)."""
    in_shape, out = (1, 8, 8), 2

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.head = torch.nn.Linear(4 * 6 * 6, 2)
        self.spare = torch.nn.Linear(4 * 6 * 6, 2)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        h = torch.relu(self.bn(self.conv(x))).flatten(1)
        return self.head(h) + (self.spare(h) if self.calls % 3 == 0 else 0)


def test_ddp_options_match_gloo(world):
    """DDP's other paths over collie: buffers broadcast every step, unused
    parameters, gradients as bucket views, no_sync accumulation, and the
    fp16-compression comm hook (a future chain on an async all_reduce)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    r, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    opts = dict(find_unused_parameters=True, gradient_as_bucket_view=True, broadcast_buffers=True)
    # float16 sums round at 1e-3 and the two backends add in different orders:
    # the hook's tolerance is float16's (a lost rank would be off by far more).
    for hook, acc, tol in ((None, 2, (1e-4, 1e-5)), (default_hooks.fp16_compress_hook, 1, (1e-2, 2e-3))):
        torch.manual_seed(3)
        a = BNNet()
        torch.manual_seed(3)
        b = BNNet()
        wa = _train(a, None, 12, r, n, hook, acc, **opts)
        wb = _train(b, gloo, 12, r, n, hook, acc, **opts)
        for pa, pb in zip(wa, wb):
            assert torch.allclose(pa.float(), pb.float(), rtol=tol[0], atol=tol[1]), (hook, (pa - pb).abs().max())
