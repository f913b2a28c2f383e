# Gradient compression for collie.torch (Horovod's Compression.none / Compression.fp16), used by
# allreduce(compression=...) in python/collie/torch/mpi_ops.py and DistributedOptimizer
# (python/collie/torch/optimizer.py).
"""Compressors: compress(tensor) -> (tensor, ctx) before the allreduce, decompress(tensor, ctx) after."""

import torch


class Compressor:
    """Interface: compress returns the tensor to send and what decompress needs."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 (half the bytes); others as they are."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class Compression:
    """The compressors, as Horovod names them."""
    none = NoneCompressor
    fp16 = FP16Compressor
