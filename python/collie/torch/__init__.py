# collie.torch: Horovod's torch API (import collie.torch as hvd) on CPU tensors, zero copy,
# over the engine bindings in python/collie/__init__.py; importing it also registers the
# torch.distributed backend "collie" (python/collie/torch/distributed.py).
"""Horovod-compatible PyTorch API backed by collie's engine (skeleton, filled in next)."""

import torch  # noqa: F401  (collie.torch needs torch; fail here with torch's own ImportError)

from . import distributed as _distributed  # registers the torch.distributed backend "collie"
