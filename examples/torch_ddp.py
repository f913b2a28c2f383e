#!/usr/bin/python3
# DistributedDataParallel over collie's torch.distributed backend: importing
# collie.torch.distributed registers "collie" (python/collie/torch/distributed.py);
# everything else is plain torch. Synthetic data, CPU tensors.
"""Trains a small CNN with DDP over the "collie" backend.

    COLLIE_LIBRARY=build/libcollie.so PYTHONPATH=python build/collie-run -n 4 /usr/bin/python3 examples/torch_ddp.py
    COLLIE_LIBRARY=build/libcollie.so PYTHONPATH=python torchrun --nproc_per_node 4 examples/torch_ddp.py

Each rank trains on its own slice of every batch; DDP averages the gradients
with all_reduce over collie, so the ranks' weights stay identical (checked at
the end).
"""

import argparse

import torch
import torch.distributed as dist

import collie.torch.distributed  # noqa: F401  (registers the "collie" backend)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    args = ap.parse_args()

    dist.init_process_group("collie")  # env://: collie-run's or torchrun's variables
    rank, size = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts rank 0's)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4),
        torch.nn.Flatten(), torch.nn.Linear(16 * 4 * 4, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)

    # A fixed random "dataset": 10 classes, each a noisy copy of its own pattern.
    g = torch.Generator().manual_seed(1)
    patterns = torch.randn(10, 1, 16, 16, generator=g)
    for step in range(args.steps):
        labels = torch.randint(0, 10, (args.batch * size,), generator=g)
        images = patterns[labels] + 0.5 * torch.randn(args.batch * size, 1, 16, 16, generator=g)
        mine = slice(rank * args.batch, (rank + 1) * args.batch)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(images[mine]), labels[mine])
        loss.backward()
        opt.step()
        avg = loss.detach().clone()
        dist.all_reduce(avg, dist.ReduceOp.AVG)
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print("step %3d  loss %.4f" % (step, avg.item()), flush=True)

    # Every rank ends with the same weights.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    lo, hi = flat.clone(), flat.clone()
    dist.all_reduce(lo, dist.ReduceOp.MIN)
    dist.all_reduce(hi, dist.ReduceOp.MAX)
    if rank == 0:
        print("ranks: %d, weights identical on every rank: %s" % (size, bool(torch.equal(lo, hi))))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
