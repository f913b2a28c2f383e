"""collie.nccl on numpy arrays: every dtype and op, broadcast, reduce,
allgather, reduce_scatter, send/recv, and the errors. Run by N ranks at once
(see conftest.py); each rank checks its result against values it computes for
every rank itself."""

import pickle

import numpy as np
import pytest

import collie.nccl as nccl
from conftest import contrib, launcher, reference, world_rank_size

DTYPES = [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64, np.float16, np.float32,
          np.float64]
OPS = ["sum", "prod", "max", "min", "avg"]
COUNTS = [0, 1, 1001, 70000]


def test_launcher_rank_and_size(comm):
    rank, size = world_rank_size()
    assert (comm.rank, comm.size) == (rank, size)


def test_unique_id_is_128_picklable_bytes(comm):
    uid = nccl.get_unique_id()
    assert isinstance(uid, bytes) and len(uid) == nccl.UNIQUE_ID_BYTES == 128
    assert pickle.loads(pickle.dumps(uid)) == uid
    # Under collie-run NCCL_COMM_ID makes every rank's ID the same; compare them.
    if launcher() == "collie-run":
        mine = np.frombuffer(uid, dtype=np.uint8)
        every = comm.allgather(mine, np.empty(128 * comm.size, np.uint8)).reshape(comm.size, 128)
        assert (every == mine).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", OPS)
def test_allreduce_every_dtype_and_op(comm, dtype, op):
    for count in COUNTS:
        send = contrib(comm.rank, comm.size, count, dtype, op)
        recv = np.full(count, 99, dtype=dtype)
        out = comm.allreduce(send, recv, op)
        assert out is recv
        np.testing.assert_array_equal(recv, reference(comm.size, count, dtype, op),
                                      err_msg="%s %s count %d" % (np.dtype(dtype).name, op, count))
        # The input is left alone.
        np.testing.assert_array_equal(send, contrib(comm.rank, comm.size, count, dtype, op))


def test_allreduce_in_place_new_array_and_op_constants(comm):
    want = reference(comm.size, 513, np.float32, "sum")
    a = contrib(comm.rank, comm.size, 513, np.float32, "sum")
    assert comm.allreduce(a, a, nccl.SUM) is a
    np.testing.assert_array_equal(a, want)
    b = comm.allreduce(contrib(comm.rank, comm.size, 513, np.int32, "max"), op=nccl.MAX)
    np.testing.assert_array_equal(b, reference(comm.size, 513, np.int32, "max"))
    # Shapes may differ as long as the element counts agree.
    c = np.zeros((3, 171), dtype=np.int64)
    comm.allreduce(contrib(comm.rank, comm.size, 513, np.int64, "min"), c, "MIN")
    np.testing.assert_array_equal(c.reshape(-1), reference(comm.size, 513, np.int64, "min"))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_broadcast_from_every_root(comm, dtype):
    for root in range(comm.size):
        for count in (1, 3000):
            buf = np.arange(count).astype(dtype) if comm.rank == root else np.zeros(count, dtype)
            assert comm.broadcast(buf, root) is buf
            np.testing.assert_array_equal(buf, np.arange(count).astype(dtype))


def test_reduce_to_each_root(comm):
    for root in range(comm.size):
        send = contrib(comm.rank, comm.size, 777, np.float64, "sum")
        recv = np.zeros(777) if comm.rank == root else None
        comm.reduce(send, recv, "sum", root)
        if comm.rank == root:
            np.testing.assert_array_equal(recv, reference(comm.size, 777, np.float64, "sum"))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_allgather(comm, dtype):
    for count in (0, 1, 4097):
        send = ((np.arange(count) + comm.rank * 13) % 100).astype(dtype)
        recv = np.empty((comm.size, count), dtype=dtype)
        comm.allgather(send, recv)
        for r in range(comm.size):
            np.testing.assert_array_equal(recv[r], ((np.arange(count) + r * 13) % 100).astype(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", OPS)
def test_reduce_scatter(comm, dtype, op):
    for block in (1, 2049):
        total = block * comm.size
        send = contrib(comm.rank, comm.size, total, dtype, op)
        recv = np.zeros(block, dtype=dtype)
        comm.reduce_scatter(send, recv, op)
        want = reference(comm.size, total, dtype, op)[comm.rank * block:(comm.rank + 1) * block]
        np.testing.assert_array_equal(recv, want)


def test_send_recv_ring_in_a_group(comm):
    nxt, prv = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    got = np.zeros(10000, dtype=np.float32)
    with nccl.group():
        # A temporary: the group keeps it alive until the group ends.
        comm.send(np.full(10000, comm.rank, dtype=np.float32), nxt)
        comm.recv(got, prv)
    np.testing.assert_array_equal(got, np.full(10000, prv, dtype=np.float32))


def test_send_recv_pairs(comm):
    if comm.size < 2:
        pytest.skip("needs 2 ranks")
    # Pairs (0,1), (2,3)...; the odd one out (odd sizes) sits this one out.
    peer = comm.rank ^ 1
    if peer >= comm.size:
        return
    out = np.arange(5, dtype=np.uint64) + 100 * comm.rank
    got = np.zeros(5, dtype=np.uint64)
    if comm.rank % 2 == 0:
        comm.send(out, peer)
        comm.recv(got, peer)
    else:
        comm.recv(got, peer)
        comm.send(out, peer)
    np.testing.assert_array_equal(got, np.arange(5, dtype=np.uint64) + 100 * peer)


def test_errors_are_python_exceptions(comm):
    a = np.zeros(8, dtype=np.float32)
    with pytest.raises(TypeError, match="bool"):
        comm.allreduce(np.zeros(8, dtype=bool), np.zeros(8, dtype=bool))
    with pytest.raises(TypeError, match="complex"):
        comm.broadcast(np.zeros(8, dtype=np.complex64), 0)
    with pytest.raises(TypeError, match="not supported"):
        comm.allreduce(a.astype(">f4"), a)
    with pytest.raises(TypeError, match="numpy.ndarray"):
        comm.allreduce([1.0, 2.0], a)
    with pytest.raises(ValueError, match="contiguous"):
        comm.allreduce(np.zeros(16, dtype=np.float32)[::2], a)
    with pytest.raises(ValueError, match="elements"):
        comm.allreduce(a, np.zeros(9, dtype=np.float32))
    with pytest.raises(TypeError, match="must match"):
        comm.allreduce(a, np.zeros(8, dtype=np.float64))
    ro = np.zeros(8, dtype=np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        comm.allreduce(a, ro)
    with pytest.raises(ValueError, match="unknown op"):
        comm.allreduce(a, a, "mean")
    with pytest.raises(ValueError, match="recv needs"):
        comm.allgather(a, np.zeros(8 * comm.size + 1, dtype=np.float32))
    with pytest.raises(ValueError, match="send needs"):
        comm.reduce_scatter(np.zeros(8 * comm.size + 1, np.float32), a)


def test_library_errors_carry_its_message(comm):
    a = np.zeros(8, dtype=np.float32)
    # Checked by the library on every rank before any communication.
    with pytest.raises(nccl.NcclError) as e:
        comm.broadcast(a, comm.size + 3)
    assert e.value.code == 4 and e.value.name == "ncclInvalidArgument"
    assert "ncclBroadcast" in str(e.value) and "root" in str(e.value)
    with pytest.raises(nccl.NcclError) as e:
        comm.send(a, -1)
    assert e.value.code == 4 and "peer" in str(e.value)
    with pytest.raises(nccl.NcclError) as e:
        comm.allreduce(a, a, 77)
    assert e.value.code == 4
    # The communicator still works afterwards.
    b = np.ones(4)
    comm.allreduce(b, b, "sum")
    np.testing.assert_array_equal(b, np.full(4, comm.size, dtype=np.float64))


def test_bad_unique_id():
    with pytest.raises(ValueError, match="128 bytes"):
        nccl.Communicator(2, b"short", 0)
    with pytest.raises(nccl.NcclError) as e:
        nccl.Communicator(1, bytes(128), 0)
    assert e.value.code == 4 and "ncclUniqueId" in str(e.value)
