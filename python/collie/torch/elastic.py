# collie.torch.elastic: Horovod's hvd.elastic for torch (run, TorchState) on top of
# python/collie/elastic.py; TorchState saves, restores and broadcasts a model and an optimizer
# with python/collie/torch/optimizer.py's broadcast_parameters / broadcast_optimizer_state.
"""Elastic training with torch models: ``@collie.torch.elastic.run`` and ``TorchState``::

    import collie.torch as hvd
    hvd.init()                                   # joins the elastic job (COLLIE_RENDEZVOUS set)
    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        while state.batch < steps:
            ...; optimizer.step(); state.batch += 1
            state.commit()                       # saves, then checks for new or lost workers
    train(state)

A lost worker makes a collective raise collie.CollieError; run() then rebuilds the world, every
worker goes back to the last commit, rank 0's state is broadcast and train() is called again.
"""

import copy

import collie.elastic as _elastic
from collie.elastic import HostsUpdatedInterrupt, ObjectState, State  # noqa: F401

from . import optimizer as _opt
from .mpi_ops import broadcast_object

__all__ = ["run", "State", "ObjectState", "TorchState", "HostsUpdatedInterrupt"]


def run(func):
    """Decorator: runs func(state, ...) until it returns, rebuilding the world and resuming from
    the last commit whenever workers are lost or join (collie.elastic.run)."""
    return _elastic.run(func)


class TorchState(ObjectState):
    """A model, an optimizer and other picklable values (keyword arguments, as ObjectState)
    kept consistent across resets: commit() saves copies of the model's and optimizer's
    state_dict(), restore() loads them back, sync() broadcasts rank 0's to every worker."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        self.model = model
        self.optimizer = optimizer
        self._saved_model = None
        self._saved_optimizer = None
        super().__init__(bcast_object=broadcast_object, **kwargs)

    def save(self):
        if self.model is not None:
            self._saved_model = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            self._saved_optimizer = copy.deepcopy(self.optimizer.state_dict())
        super().save()

    def _forget_inflight(self):
        reset = getattr(self.optimizer, "_collie_reset", None)
        if reset is not None:
            reset()  # its allreduces belonged to the old world

    def restore(self):
        self._forget_inflight()
        if self.model is not None and self._saved_model is not None:
            self.model.load_state_dict(self._saved_model)
        if self.optimizer is not None and self._saved_optimizer is not None:
            self.optimizer.load_state_dict(self._saved_optimizer)
            self.optimizer.zero_grad()
        super().restore()

    def sync(self):
        self._forget_inflight()
        if self.model is not None:
            _opt.broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            _opt.broadcast_optimizer_state(self.optimizer, root_rank=0)
        # ObjectState.sync ends with self.restore(): it must find rank 0's model and optimizer
        # (just received), not this worker's older copies (a new worker's are its initial ones).
        self._saved_model = copy.deepcopy(self.model.state_dict()) if self.model is not None else None
        self._saved_optimizer = (copy.deepcopy(self.optimizer.state_dict())
                                 if self.optimizer is not None else None)
        super().sync()
        self.save()
