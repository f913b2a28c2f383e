"""collie.torch.elastic: a DistributedOptimizer training loop under `collie-run --elastic` loses a
worker (SIGKILL in the middle of a step, its allreduces in flight); the survivors go back to the
last commit and go on with 2 ranks, collie-run restarts the slot, the new worker joins and gets
the model and optimizer state from rank 0, and all 3 end with the weights of one process on the
whole batch for the same 20 steps (float32 rounding apart), identical on every worker.

The pytest test (run alone; COLLIE_RUN names collie-run) starts the job; the workers are this
file run as `python3 test_torch_hvd_elastic.py worker`."""

import hashlib
import os
import re
import signal
import subprocess
import sys
import time

import pytest

STEPS = 20
BATCH = 24  # divisible by 2 and 3 ranks
KILL_SLOT, KILL_STEP = "1", 8


def make(torch):
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def batch(torch, step):
    g = torch.Generator().manual_seed(500 + step)
    return torch.randn(BATCH, 10, generator=g), torch.randint(0, 3, (BATCH,), generator=g)


def loss_fn(torch, model, x, y):
    return torch.nn.functional.cross_entropy(model(x), y)


def worker():
    import torch
    import collie.elastic
    import collie.torch as hvd

    hvd.init()  # COLLIE_RENDEZVOUS is set: joins the elastic job
    me = collie.elastic.worker_id()
    model, opt = make(torch)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, step=0)
    doomed = (os.environ.get("COLLIE_ELASTIC_SLOT") == KILL_SLOT
              and os.environ.get("COLLIE_ELASTIC_RESTARTS", "0") == "0")

    def on_reset():
        print("worker %d: %s at step %d; now rank %d of %d" % (me, state.last_reset_reason, state.step,
                                                               hvd.rank(), hvd.size()), flush=True)
    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        while state.step < STEPS:
            if state.step == STEPS - 1 and hvd.size() < 3:
                # Wait for the restarted worker, so that all three finish together.
                time.sleep(0.05)
                state.check_host_updates()
                continue
            r, n = hvd.rank(), hvd.size()
            x, y = batch(torch, state.step)
            per = BATCH // n
            opt.zero_grad()
            loss_fn(torch, model, x[r * per:(r + 1) * per], y[r * per:(r + 1) * per]).backward()
            if doomed and state.step == KILL_STEP:
                time.sleep(0.01)  # the gradients' allreduces are on their way
                os.kill(os.getpid(), signal.SIGKILL)
            opt.step()
            state.step += 1
            time.sleep(0.02)
            state.commit()

    train(state)
    ref, ref_opt = make(torch)
    for s in range(STEPS):
        x, y = batch(torch, s)
        ref_opt.zero_grad()
        loss_fn(torch, ref, x, y).backward()
        ref_opt.step()
    ok = all(torch.allclose(p, q, atol=1e-5, rtol=1e-4)
             for p, q in zip(model.state_dict().values(), ref.state_dict().values()))
    digest = hashlib.sha1(b"".join(p.numpy().tobytes() for p in model.state_dict().values())).hexdigest()
    print("worker %d: final step=%d size=%d hash=%s %s" % (me, state.step, hvd.size(), digest,
                                                           "OK" if ok else "WRONG"), flush=True)
    hvd.shutdown()
    return 0 if ok else 1


def test_worker_killed_mid_training_rejoins_and_training_ends_as_without_failure():
    pytest.importorskip("torch")
    run = os.environ.get("COLLIE_RUN")
    if not run:
        pytest.skip("COLLIE_RUN (the collie-run program) is not set")
    env = dict(os.environ, NCCL_SOCKET_IFNAME="lo",
               COLLIE_PEER_TIMEOUT=os.environ.get("COLLIE_PEER_TIMEOUT", "3"))
    cmd = [run, "--elastic", "--min", "2", "--max", "3", "-n", "3", "--tag-output", "--timeout", "240",
           sys.executable, os.path.abspath(__file__), "worker"]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    out = p.stdout.decode("utf-8", "replace")
    tail = out[-6000:]
    assert p.returncode == 0, "collie-run failed (%d):\n%s" % (p.returncode, tail)
    assert re.search(r"slot 1 .*killed by signal 9.*restarting the slot", out), tail
    assert "lost a peer at step" in out, tail  # a survivor went back to its last commit
    assert "exited with status" not in out, tail  # no worker failed (and was restarted)
    finals = re.findall(r"final step=(\d+) size=(\d+) hash=(\w+) (\w+)", out)
    assert len(finals) == 3, tail
    assert all(f[0] == str(STEPS) and f[1] == "3" and f[3] == "OK" for f in finals), tail
    assert len({f[2] for f in finals}) == 1, "workers ended with different weights:\n" + tail


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        sys.exit(worker())
    sys.exit("usage: %s worker (started by collie-run --elastic; see the test)" % sys.argv[0])
