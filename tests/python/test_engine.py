"""The Horovod-style engine through the collie package: every op and dtype,
async handles submitted in a different order on each rank, allgather with a
different first dimension per rank, broadcast, alltoall with splits,
reducescatter, grouped allreduce, join, barrier, process sets, timeline and
mismatch errors. Run by N ranks at once (see conftest.py)."""

import json
import os
import threading

import numpy as np
import pytest

import collie
from conftest import contrib, reference, world_rank_size

assert collie.engine_available(), "libcollie lacks the engine symbols (collie_allreduce_async ...)"

DTYPES = [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64, np.float16, np.float32,
          np.float64]
# Keyed by conftest.contrib's op names.
OPS = {"sum": collie.Sum, "avg": collie.Average, "min": collie.Min, "max": collie.Max,
       "prod": collie.Product}


@pytest.fixture(scope="module", autouse=True)
def engine():
    collie.init()
    yield
    collie.shutdown()


def test_topology():
    rank, size = world_rank_size()
    assert collie.is_initialized()
    assert (collie.rank(), collie.size()) == (rank, size)
    # One host: every rank is local.
    assert (collie.local_rank(), collie.local_size()) == (rank, size)
    assert (collie.cross_rank(), collie.cross_size()) == (0, 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", list(OPS))
def test_allreduce_every_op_and_dtype(dtype, op):
    r, n = collie.rank(), collie.size()
    for count in (1, 1000, 66000):
        x = contrib(r, n, count, dtype, op)
        if count % 2 == 0:
            x = x.reshape(-1, 2)  # shapes are kept
        out = collie.allreduce(x, op=OPS[op], name="ar.%s.%s.%d" % (np.dtype(dtype).name, op, count))
        assert out.shape == x.shape and out.dtype == x.dtype and out is not x
        np.testing.assert_array_equal(out.reshape(-1), reference(n, count, dtype, op))


def test_allreduce_scale_factors():
    r, n = collie.rank(), collie.size()
    x = np.arange(100, dtype=np.float64) + r
    out = collie.allreduce(x, op=collie.Sum, name="scaled", prescale_factor=0.5, postscale_factor=4.0)
    want = 4.0 * sum(0.5 * (np.arange(100) + k) for k in range(n))
    np.testing.assert_allclose(out, want, rtol=1e-12)
    avg = collie.allreduce(np.full(10, float(r), np.float32))  # default op: Average
    np.testing.assert_allclose(avg, np.full(10, (n - 1) / 2.0), rtol=1e-6)


def test_unnamed_operations_agree_across_ranks():
    n = collie.size()
    for _ in range(5):
        out = collie.allreduce(np.ones(7, np.int32), op=collie.Sum)
        np.testing.assert_array_equal(out, np.full(7, n, np.int32))


def test_async_in_a_different_order_on_each_rank():
    r, n = collie.rank(), collie.size()
    names = ["async.%d" % k for k in range(12)]
    order = list(range(12))
    np.random.default_rng(1000 + r).shuffle(order)  # each rank its own order
    handles = {}
    for k in order:
        handles[k] = collie.allreduce_async(np.full(100 + k, k + r, np.float32), op=collie.Sum,
                                            name=names[k])
    pending = dict(handles)
    while pending:
        for k, h in list(pending.items()):
            if collie.poll(h):
                del pending[k]
    for k, h in handles.items():
        out = collie.synchronize(h)
        np.testing.assert_array_equal(out, np.full(100 + k, n * k + n * (n - 1) / 2, np.float32))


def test_threads_submit_in_their_own_order():
    r, n = collie.rank(), collie.size()
    results, errors = {}, []

    def worker(t):
        try:
            ks = list(range(t, 24, 3))
            if (r + t) % 2:
                ks.reverse()
            # Submitted without waiting: a thread that blocked on each call in
            # a rank-dependent order would wait for a peer waiting on it.
            hs = {k: collie.allreduce_async(np.full(50, k, np.int64), op=collie.Sum, name="thr.%d" % k)
                  for k in ks}
            for k, h in hs.items():
                results[k] = collie.synchronize(h)
        except Exception as e:  # reported below, on the main thread
            errors.append(e)
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for k in range(24):
        np.testing.assert_array_equal(results[k], np.full(50, n * k, np.int64))


def test_allgather_different_first_dims():
    r, n = collie.rank(), collie.size()
    x = np.full((r + 1, 3), r, dtype=np.float32)
    out = collie.allgather(x, name="ag.2d")
    assert out.shape == (n * (n + 1) // 2, 3)
    np.testing.assert_array_equal(out, np.concatenate([np.full((k + 1, 3), k, np.float32) for k in range(n)]))
    out1 = collie.allgather(np.arange(r, dtype=np.int64), name="ag.1d")  # rank 0 gives nothing
    np.testing.assert_array_equal(out1, np.concatenate([np.arange(k, dtype=np.int64) for k in range(n)]))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_broadcast(dtype):
    r, n = collie.rank(), collie.size()
    for root in range(n):
        x = (np.arange(300) % 100).astype(dtype) if r == root else np.zeros(300, dtype)
        out = collie.broadcast(x, root_rank=root, name="bc.%s.%d" % (np.dtype(dtype).name, root))
        np.testing.assert_array_equal(out, (np.arange(300) % 100).astype(dtype))
    buf = np.full(5, r, np.int32)
    assert collie.broadcast_(buf, 0, name="bc.inplace") is buf
    np.testing.assert_array_equal(buf, np.zeros(5, np.int32))


def test_alltoall_with_splits():
    r, n = collie.rank(), collie.size()
    # Rank r sends j + 1 rows of value 100 r + j to rank j.
    splits = [j + 1 for j in range(n)]
    x = np.concatenate([np.full((j + 1, 2), 100 * r + j, np.int32) for j in range(n)])
    out, got = collie.alltoall(x, splits=splits, name="a2a.splits")
    np.testing.assert_array_equal(got, [r + 1] * n)
    np.testing.assert_array_equal(out, np.concatenate([np.full((r + 1, 2), 100 * i + r, np.int32)
                                                       for i in range(n)]))
    even = collie.alltoall(np.repeat(np.arange(n, dtype=np.float64) + 10 * r, 3), name="a2a.even")
    np.testing.assert_array_equal(even, np.repeat(10.0 * np.arange(n) + r, 3))


def test_reducescatter():
    r, n = collie.rank(), collie.size()
    for rows in (n * 3, n * 3 + 1):  # Horovod's split: the first rows % n ranks get one more
        mine = rows // n + (1 if r < rows % n else 0)
        start = r * (rows // n) + min(r, rows % n)
        x = np.arange(rows, dtype=np.float32) + r
        out = collie.reducescatter(x, op=collie.Sum, name="rs.1d.%d" % rows)
        want = sum(np.arange(rows, dtype=np.float32) + k for k in range(n))
        np.testing.assert_array_equal(out, want[start:start + mine])
        x2 = np.tile(np.arange(rows, dtype=np.int64)[:, None], (1, 4)) * (r + 1)
        out2 = collie.reducescatter(x2, op=collie.Max, name="rs.2d.%d" % rows)
        assert out2.shape == (mine, 4)
        np.testing.assert_array_equal(out2, np.tile(np.arange(rows)[:, None], (1, 4))[start:start + mine] * n)


def test_grouped_allreduce():
    r, n = collie.rank(), collie.size()
    arrays = [np.full(k * 10 + 1, r + k, np.float64) for k in range(6)]
    outs = collie.grouped_allreduce(arrays, op=collie.Sum, name="grp")
    assert len(outs) == 6
    for k, o in enumerate(outs):
        np.testing.assert_array_equal(o, np.full(k * 10 + 1, n * k + n * (n - 1) / 2))
    with pytest.raises(TypeError, match="one dtype"):
        collie.grouped_allreduce([np.zeros(2, np.float32), np.zeros(2, np.float64)])


def test_barrier():
    collie.barrier()
    collie.barrier(collie.global_process_set)


def test_join_with_unequal_steps():
    r, n = collie.rank(), collie.size()
    for step in range(r + 1):  # rank r runs r + 1 steps
        out = collie.allreduce(np.ones(8, np.float32), op=collie.Sum, name="join.step.%d" % step)
        # Ranks that have joined contribute zeros.
        np.testing.assert_array_equal(out, np.full(8, n - step, np.float32))
    assert collie.join() == n - 1


def test_process_sets():
    r, n = collie.rank(), collie.size()
    assert collie.global_process_set.size() == n
    first = collie.add_process_set([0, n - 1] if n > 1 else [0])
    members = sorted({0, n - 1})
    assert first.process_set_id > 0 and first.size() == len(members)
    assert first.included() == (r in members)
    if r in members:
        assert first.rank() == members.index(r)
        out = collie.allreduce(np.full(4, r + 1, np.int32), op=collie.Sum, process_set=first)
        np.testing.assert_array_equal(out, np.full(4, sum(m + 1 for m in members), np.int32))
        g = collie.allgather(np.full((1,), r, np.int64), process_set=first)
        np.testing.assert_array_equal(g, members)
    # A second set that overlaps the first (rank n - 1 is in both when n > 2).
    second_ranks = list(range(1, n)) if n > 2 else [0]
    second = collie.add_process_set(second_ranks)
    assert second.process_set_id != first.process_set_id
    if r in second_ranks:
        out = collie.allreduce(np.full(3, 2.0), op=collie.Product, name="ps2", process_set=second)
        np.testing.assert_array_equal(out, np.full(3, 2.0 ** len(second_ranks)))
        b = collie.broadcast(np.full(2, r), root_rank=0, process_set=second)
        np.testing.assert_array_equal(b, np.full(2, second_ranks[0]))
    # The world is unaffected by unnamed calls made only inside the sets.
    out = collie.allreduce(np.ones(2, np.int32), op=collie.Sum)
    np.testing.assert_array_equal(out, np.full(2, n, np.int32))
    collie.remove_process_set(second)
    collie.remove_process_set(first)
    with pytest.raises(collie.CollieError):
        first.size()


def test_timeline_is_valid_json(tmp_path):
    r = collie.rank()
    path = str(tmp_path / "timeline.json")
    collie.start_timeline(path, mark_cycles=True)
    for k in range(3):
        collie.allreduce(np.ones(1000, np.float32), op=collie.Sum, name="timeline.tensor.%d" % k)
    collie.stop_timeline()
    collie.barrier()
    if r == 0:  # only rank 0 writes the timeline
        with open(path) as f:
            doc = json.load(f)
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
        assert isinstance(events, list) and events
        assert "timeline.tensor.0" in json.dumps(events)
    else:
        assert not os.path.exists(path)


def test_mismatch_fails_on_every_rank():
    r, n = collie.rank(), collie.size()
    if n < 2:
        pytest.skip("needs 2 ranks")
    dtype = np.float32 if r == 0 else np.float64
    with pytest.raises(collie.CollieError) as e:
        collie.allreduce(np.ones(4, dtype), op=collie.Sum, name="mismatch.dtype")
    assert e.value.code == -3 and "mismatch.dtype" in str(e.value)
    with pytest.raises(collie.CollieError) as e:
        collie.allreduce(np.ones(4 + r, np.float32), op=collie.Sum, name="mismatch.shape")
    assert e.value.code == -3 and "mismatch.shape" in str(e.value)
    # The engine goes on working.
    out = collie.allreduce(np.ones(3, np.float32), op=collie.Sum, name="after.mismatch")
    np.testing.assert_array_equal(out, np.full(3, n, np.float32))


def test_argument_errors():
    with pytest.raises(ValueError, match="op"):
        collie.allreduce(np.ones(2), op=2)  # Adasum is not offered
    with pytest.raises(TypeError, match="not supported"):
        collie.allreduce(np.ones(2, np.complex128))
    with pytest.raises(ValueError, match="splits"):
        collie.alltoall(np.ones(collie.size() + 1), splits=[1] * (collie.size() + 5))
    with pytest.raises(collie.CollieError) as e:
        collie.synchronize(collie.broadcast_async(np.ones(2), root_rank=collie.size() + 2, name="bad.root"))
    assert e.value.code < 0 and str(e.value)
