"""A short DDP job over the "collie" backend, run 50 times (2 ranks, two jobs
at a time, under collie-run and under torchrun's variables, with and without
destroy_process_group): every run must exit 0 with no abort, crash or fatal
error on its way out. A design that completed futures from a background
Python thread aborted torch 1.13 at interpreter exit in 3 of 6 runs; the
collie backend (python/collie/torch/_dist_pg.py) starts no Python thread."""

import concurrent.futures
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch.distributed")

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = int(os.environ.get("COLLIE_EXIT_RUNS", "50"))
BAD = ("terminate called", "Aborted", "core dumped", "Fatal Python error", "Segmentation fault",
       "pure virtual", "Traceback")

JOB = r"""
import sys, torch, torch.distributed as dist
import collie.torch.distributed
dist.init_process_group("collie")
torch.manual_seed(dist.get_rank())
m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
ddp = torch.nn.parallel.DistributedDataParallel(m)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    ddp(torch.randn(4, 8)).sum().backward()
    opt.step()
w = dist.all_reduce(torch.ones(1), async_op=True)
fut = w.get_future().then(lambda f: f.value()[0] + 1)
assert fut.wait().item() == dist.get_world_size() + 1
if sys.argv[1] == "destroy":
    dist.destroy_process_group()
print("job ok")
"""


def one_run(i):
    mode = "collie-run" if i % 2 == 0 else "env"
    end = "destroy" if (i // 2) % 2 == 0 else "keep"
    cmd = [sys.executable, os.path.join(HERE, "torch_dist_launch.py"), mode, "2", "--timeout", "150", "--",
           sys.executable, "-c", JOB, end]
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=200)
    except subprocess.TimeoutExpired as e:
        return i, mode, end, -1, (e.output or b"").decode("utf-8", "replace") + "\n(timed out)"
    return i, mode, end, p.returncode, p.stdout.decode("utf-8", "replace")


def test_ddp_job_exits_cleanly_every_time():
    assert os.environ.get("COLLIE_RUN"), "COLLIE_RUN must name collie-run"
    failures = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for i, mode, end, rc, out in pool.map(one_run, range(RUNS)):
            bad = [b for b in BAD if b in out]
            if rc != 0 or bad or out.count("job ok") != 2:
                failures.append("run %d (%s, %s): rc %d, %s\n%s" % (i, mode, end, rc, bad, out[-3000:]))
    assert not failures, "%d of %d runs failed:\n%s" % (len(failures), RUNS, "\n".join(failures[:3]))
