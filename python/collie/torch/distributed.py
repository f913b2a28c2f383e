# torch.distributed backend "collie": importing this module registers it, so
# dist.init_process_group("collie") runs collectives through libcollie (python/collie/nccl.py).
# Skeleton: the ProcessGroup is filled in by the following commits.
"""torch.distributed process-group backend backed by collie."""
