"""Training with collie.torch.DistributedOptimizer ends where one process on the whole batch ends:
an MLP and a small CNN on synthetic data (fixed seeds), 20 steps, each rank a 1/size share of
every batch; the same with backward_passes_per_step=2, groups, gradient_predivide_factor,
Compression.fp16 (looser tolerance), a process set, and join with uneven numbers of batches.
Every rank computes the one-process reference itself. Run by N ranks (see conftest.py)."""

import os

import pytest

torch = pytest.importorskip("torch")

import collie.torch as hvd  # noqa: E402

STEPS = 20
BATCH = 48  # 1, 2, 3, 4, 6 and 8 ranks get equal, even shares (backward_passes_per_step=2)
ATOL, RTOL = 1e-5, 1e-4  # float32 rounding: sums taken in another order


def launcher_size():
    for s in ("COLLIE_SIZE", "WORLD_SIZE"):
        if s in os.environ:
            return int(os.environ[s])
    return 1


# Registered at init (Horovod's init(process_sets=[...])): the first and the last rank.
PAIR = hvd.ProcessSet(sorted({0, launcher_size() - 1}))


@pytest.fixture(scope="module", autouse=True)
def engine():
    hvd.init(process_sets=[PAIR])
    yield
    hvd.shutdown()


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(10, 32)
        self.fc2 = torch.nn.Linear(32, 4)
        self.unused = torch.nn.Linear(3, 3)  # never in forward: its gradient stays None

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(4, 8, 3)
        self.fc = torch.nn.Linear(8 * 2 * 2, 4)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.conv(x)), 2)
        x = torch.relu(self.conv2(x))
        return self.fc(x.flatten(1))


def make(kind):
    torch.manual_seed(1234)  # the same initial weights on every rank and in the reference
    model = MLP() if kind == "mlp" else CNN()
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def batch(kind, step):
    """The whole batch of `step`: inputs and class labels."""
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(BATCH, 10, generator=g) if kind == "mlp" else torch.randn(BATCH, 1, 8, 8, generator=g)
    y = torch.randint(0, 4, (BATCH,), generator=g)
    return x, y


def shard(t, rank, size):
    per = BATCH // size
    return t[rank * per:(rank + 1) * per]


def loss_fn(model, x, y):
    return torch.nn.functional.cross_entropy(model(x), y)


def reference(kind, steps=STEPS):
    model, opt = make(kind)
    for s in range(steps):
        x, y = batch(kind, s)
        opt.zero_grad()
        loss_fn(model, x, y).backward()
        opt.step()
    return model


def assert_same_weights(model, ref, atol=ATOL, rtol=RTOL):
    for (name, p), q in zip(model.state_dict().items(), ref.state_dict().values()):
        torch.testing.assert_close(p, q, atol=atol, rtol=rtol, msg=lambda m: "%s: %s" % (name, m))
    # and every rank holds the very same weights
    mine = [p.clone() for p in model.state_dict().values()]
    for other in hvd.allgather_object(mine):
        assert all(torch.equal(a, b) for a, b in zip(mine, other))


def train(kind, **opt_kwargs):
    r, n = hvd.rank(), hvd.size()
    model, opt = make(kind)
    passes = opt_kwargs.get("backward_passes_per_step", 1)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), **opt_kwargs)
    for s in range(STEPS):
        x, y = batch(kind, s)
        x, y = shard(x, r, n), shard(y, r, n)
        opt.zero_grad()
        per = x.shape[0] // passes
        for k in range(passes):  # local accumulation: each pass a share of the local batch
            (loss_fn(model, x[k * per:(k + 1) * per], y[k * per:(k + 1) * per]) / passes).backward()
        opt.step()
    return model, opt


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_distributed_optimizer_matches_one_process(kind):
    model, opt = train(kind)
    assert_same_weights(model, reference(kind))
    assert isinstance(opt, torch.optim.SGD)  # still the user's optimizer class
    if kind == "mlp":
        assert model.unused.weight.grad is not None  # allreduced as zeros: ranks stay in step


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_backward_passes_per_step_2(kind):
    model, _ = train(kind, backward_passes_per_step=2)
    assert_same_weights(model, reference(kind))


def test_groups_and_predivide_factor():
    model, _ = train("mlp", groups=2)
    ref = reference("mlp")
    assert_same_weights(model, ref)
    m2, _ = make("mlp")
    groups = [[m2.fc1.weight, m2.fc2.weight], [m2.fc1.bias]]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m2.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=m2.named_parameters(), groups=groups,
                                   gradient_predivide_factor=2.0)
    r, n = hvd.rank(), hvd.size()
    for s in range(STEPS):
        x, y = batch("mlp", s)
        opt.zero_grad()
        loss_fn(m2, shard(x, r, n), shard(y, r, n)).backward()
        opt.step()
    assert_same_weights(m2, ref)


def test_compression_fp16():
    model, _ = train("mlp", compression=hvd.Compression.fp16)
    # gradients travel as float16 (11-bit mantissa)
    assert_same_weights(model, reference("mlp"), atol=5e-3, rtol=5e-3)


def test_op_sum_and_explicit_synchronize():
    r, n = hvd.rank(), hvd.size()
    model, opt = make("mlp")
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=hvd.Sum)
    ref, ref_opt = make("mlp")
    for s in range(3):
        x, y = batch("mlp", s)
        opt.zero_grad()
        (loss_fn(model, shard(x, r, n), shard(y, r, n)) / n).backward()  # sum of 1/n shares
        opt.synchronize()
        with opt.skip_synchronize():
            opt.step()
        ref_opt.zero_grad()
        loss_fn(ref, x, y).backward()
        ref_opt.step()
    assert_same_weights(model, ref)


def test_misuse_is_reported():
    r, n = hvd.rank(), hvd.size()
    model, opt = make("mlp")
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    x, y = batch("mlp", 0)
    loss_fn(model, shard(x, r, n), shard(y, r, n)).backward()
    # backward's hooks have already started every used gradient's allreduce (step() only waits)
    used = [p for name, p in model.named_parameters() if not name.startswith("unused")]
    assert all(opt._handles.get(id(p), (None,))[0] is not None for p in used)
    assert id(model.unused.weight) not in opt._handles
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()
    with pytest.raises(AssertionError, match="backward_passes_per_step=1"):
        loss_fn(model, shard(x, r, n), shard(y, r, n)).backward()
    opt.synchronize()
    opt.zero_grad()
    with pytest.raises(ValueError, match="not unique"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=[("a", p) for p in model.parameters()])
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Sum,
                                 gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="not both"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), num_groups=2, groups=2)
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum)


def test_process_set():
    r = hvd.rank()
    assert PAIR.process_set_id is not None and PAIR.size() == len(PAIR.ranks)
    if r in PAIR.ranks:
        me, m = PAIR.rank(), PAIR.size()
        model, opt = make("cnn")
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), process_set=PAIR)
        for s in range(STEPS):
            x, y = batch("cnn", s)
            opt.zero_grad()
            loss_fn(model, shard(x, me, m), shard(y, me, m)).backward()
            opt.step()
        ref = reference("cnn")
        for p, q in zip(model.state_dict().values(), ref.state_dict().values()):
            torch.testing.assert_close(p, q, atol=ATOL, rtol=RTOL)
    hvd.barrier()


def test_join_with_uneven_batches():
    """Rank r trains 4 + r steps; a rank that ran out joins, and the others' averages count it as
    zeros (divided by the full size). At the end the last rank's weights are broadcast."""
    r, n = hvd.rank(), hvd.size()
    steps = [4 + k for k in range(n)]
    model, opt = make("mlp")
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    for s in range(steps[r]):
        x, y = batch("mlp", s)
        opt.zero_grad()
        loss_fn(model, shard(x, r, n), shard(y, r, n)).backward()
        opt.step()
    last = hvd.join()
    assert last == n - 1
    hvd.broadcast_parameters(model.state_dict(), root_rank=last)
    # the reference: at step s, the sum of the still active ranks' gradients over n
    ref, ref_opt = make("mlp")
    for s in range(max(steps)):
        x, y = batch("mlp", s)
        grads = [torch.zeros_like(p) for p in ref.parameters()]
        for k in range(n):
            if s < steps[k]:
                ref.zero_grad()
                loss_fn(ref, shard(x, k, n), shard(y, k, n)).backward()
                grads = [g + (p.grad if p.grad is not None else 0) for g, p in zip(grads, ref.parameters())]
        for p, g in zip(ref.parameters(), grads):
            p.grad = g / n
        ref_opt.step()
    assert_same_weights(model, ref)
