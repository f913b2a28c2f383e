#!/usr/bin/python3
# A Horovod training script run on collie: `import collie.torch as hvd` in place of
# `import horovod.torch as hvd` (python/collie/torch); everything else is plain torch and
# Horovod's usual calls. Synthetic data, CPU tensors.
"""Trains a small CNN with collie.torch.DistributedOptimizer (Horovod's API).

    COLLIE_LIBRARY=build/libcollie.so PYTHONPATH=python build/collie-run -n 4 /usr/bin/python3 examples/torch_horovod.py
    COLLIE_LIBRARY=build/libcollie.so PYTHONPATH=python torchrun --nproc_per_node 4 examples/torch_horovod.py

Each rank trains on its own slice of every batch; the optimizer averages the gradients over the
ranks (asynchronous allreduces started by gradient hooks during backward, awaited in step()), so
the ranks' weights stay identical (checked at the end).
"""

import argparse

import torch

import collie.torch as hvd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--fp16", action="store_true", help="allreduce the gradients as float16")
    args = ap.parse_args()

    hvd.init()  # collie-run's or torchrun's variables; alone: a world of one
    rank, size = hvd.rank(), hvd.size()

    torch.manual_seed(rank)  # different initial weights: broadcast_parameters makes them rank 0's
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4),
        torch.nn.Flatten(), torch.nn.Linear(16 * 4 * 4, 10))
    # Horovod's convention: scale the learning rate with the number of ranks.
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * size, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.fp16 if args.fp16 else hvd.Compression.none)

    # A fixed random "dataset": 10 classes, each a noisy copy of its own pattern.
    g = torch.Generator().manual_seed(1)
    patterns = torch.randn(10, 1, 16, 16, generator=g)
    for step in range(args.steps):
        labels = torch.randint(0, 10, (args.batch * size,), generator=g)
        images = patterns[labels] + 0.5 * torch.randn(args.batch * size, 1, 16, 16, generator=g)
        mine = slice(rank * args.batch, (rank + 1) * args.batch)  # this rank's share
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(images[mine]), labels[mine])
        loss.backward()
        opt.step()
        avg = hvd.allreduce(loss.detach(), name="loss")  # op=Average by default
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print("step %3d  loss %.4f (average over %d ranks)" % (step, avg.item(), size), flush=True)

    # Every rank must hold the same weights.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    lo = hvd.allreduce(flat, op=hvd.Min, name="check.min")
    hi = hvd.allreduce(flat, op=hvd.Max, name="check.max")
    same = torch.equal(lo, hi)
    if rank == 0:
        print("weights identical on all %d ranks: %s" % (size, same), flush=True)
    hvd.shutdown()
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
