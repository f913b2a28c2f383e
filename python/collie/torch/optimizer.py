# collie.torch.DistributedOptimizer: wraps a torch optimizer so that each gradient is allreduced
# (asynchronously, through python/collie/torch/mpi_ops.py and the engine) as soon as backward has
# accumulated it; step() waits for them all. Also broadcast_parameters / broadcast_optimizer_state.
"""Horovod's DistributedOptimizer, broadcast_parameters and broadcast_optimizer_state."""

import contextlib

import torch

import collie
from . import mpi_ops
from .compression import Compression
from .mpi_ops import Average, global_process_set


class _DistributedOptimizer:
    """Mixed in front of the user's optimizer class (see DistributedOptimizer)."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, groups, process_set):
        super().__init__(params)
        self._compression = compression if compression is not None else Compression.none
        self._op = mpi_ops._op(op, None, "DistributedOptimizer")
        if gradient_predivide_factor != 1.0 and self._op != Average:
            raise ValueError("collie.torch.DistributedOptimizer: gradient_predivide_factor needs op=Average")
        self._predivide = float(gradient_predivide_factor)
        if int(backward_passes_per_step) < 1:
            raise ValueError("collie.torch.DistributedOptimizer: backward_passes_per_step must be >= 1")
        self.backward_passes_per_step = int(backward_passes_per_step)
        self._process_set = process_set
        mpi_ops._sid(process_set, "DistributedOptimizer")

        all_params = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not isinstance(x, tuple) or len(x) != 2 for x in named):
                raise ValueError("collie.torch.DistributedOptimizer: named_parameters must be "
                                 "(name, parameter) pairs, e.g. model.named_parameters()")
            names = [n for n, _ in named]
            dups = sorted({n for n in names if names.count(n) > 1})
            if dups:
                raise ValueError("collie.torch.DistributedOptimizer: parameter names are not unique: %s"
                                 % ", ".join(dups))
            known = {id(p) for _, p in named}
            missing = [p for p in all_params if id(p) not in known]
            if missing:
                raise ValueError("collie.torch.DistributedOptimizer: named_parameters lacks %d of the "
                                 "optimizer's parameters" % len(missing))
            self._names = {id(p): n for n, p in named}
        else:
            self._names = {id(p): "noname.%d" % i for i, p in enumerate(all_params)}

        # Groups: lists of parameters allreduced as one grouped_allreduce once all are ready.
        self._group_of = {}
        if groups is not None:
            if isinstance(groups, int) and not isinstance(groups, bool):
                if groups <= 0:
                    raise ValueError("collie.torch.DistributedOptimizer: groups must be > 0")
                need = [p for p in all_params if p.requires_grad]
                k = min(groups, max(len(need), 1))
                size, extra = divmod(len(need), k)
                lists, at = [], 0
                for i in range(k):
                    take = size + (1 if i < extra else 0)
                    lists.append(need[at:at + take])
                    at += take
            elif isinstance(groups, (list, tuple)):
                lists = [list(g) for g in groups]
                for g in lists:
                    for p in g:
                        if not isinstance(p, torch.Tensor) or id(p) not in self._names:
                            raise ValueError("collie.torch.DistributedOptimizer: groups must hold the "
                                             "optimizer's parameters")
            else:
                raise ValueError("collie.torch.DistributedOptimizer: groups must be a positive int or a "
                                 "list of lists of parameters")
            for gi, g in enumerate(lists):
                if g:
                    group = tuple(g)
                    for p in group:
                        if id(p) in self._group_of:
                            raise ValueError("collie.torch.DistributedOptimizer: a parameter is in "
                                             "two groups")
                        self._group_of[id(p)] = (gi, group)

        self._requires_update = [p for p in all_params if p.requires_grad]
        self._handles = {}       # id(p) -> (handle, compressed tensor, ctx, p)
        self._group_ready = {}   # group index -> parameters whose gradient is ready
        self._delay = {id(p): self.backward_passes_per_step for p in self._requires_update}
        self._synchronized = False
        self._should_synchronize = True
        self._hook_refs = []
        if collie.is_initialized() and self._included():
            self._register_hooks()
        elif not collie.is_initialized():
            raise collie.CollieError(-2, "collie.torch.DistributedOptimizer: call collie.torch.init() first")

    def _included(self):
        ps = self._process_set
        return ps is None or mpi_ops._sid(ps) == 0 or ps.included()

    # ---- hooks

    def _register_hooks(self):
        for p in self._requires_update:
            if hasattr(p, "register_post_accumulate_grad_hook"):  # torch >= 2.1
                self._hook_refs.append(p.register_post_accumulate_grad_hook(self._make_hook(p)))
            else:
                # The gradient accumulator's post hook runs once p.grad holds this pass's sum.
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
                acc.register_hook(self._make_hook(p))
                self._hook_refs.append(acc)  # the accumulator must outlive the hook

    def _make_hook(self, p):
        def hook(*_):
            key = id(p)
            if self._delay[key] <= 0:
                raise AssertionError(
                    "collie.torch.DistributedOptimizer: gradients computed more than "
                    "backward_passes_per_step=%d times before step() or synchronize()"
                    % self.backward_passes_per_step)
            self._delay[key] -= 1
            if self._delay[key] > 0:
                self._handles[key] = (None, None, None, p)
                return
            self._submit(p)
        return hook

    def _scale(self):
        if self._op == Average:
            return 1.0 / self._predivide, self._predivide
        return 1.0, 1.0

    def _submit(self, p):
        key = id(p)
        if p.grad is None:
            # Unused in this pass on this rank: contribute zeros so the ranks still agree.
            p.grad = torch.zeros_like(p)
        pre, post = self._scale()
        g = self._group_of.get(key)
        if g is None:
            t, ctx = self._compression.compress(p.grad)
            h = mpi_ops.allreduce_async_(t, name="DistributedOptimizer." + self._names[key], op=self._op,
                                         prescale_factor=pre, postscale_factor=post,
                                         process_set=self._process_set)
            self._handles[key] = (h, t, ctx, p)
            return
        gi, members = g
        ready = self._group_ready.setdefault(gi, [])
        ready.append(p)
        self._handles[key] = (None, None, None, p)
        if len(ready) < len(members):
            return
        pairs = [self._compression.compress(q.grad if q.grad is not None else torch.zeros_like(q))
                 for q in members]
        tensors = [t for t, _ in pairs]
        h = mpi_ops.grouped_allreduce_async_(tensors, name="DistributedOptimizer.group.%d" % gi, op=self._op,
                                             prescale_factor=pre, postscale_factor=post,
                                             process_set=self._process_set)
        for q, (t, ctx) in zip(members, pairs):
            if q.grad is None:
                q.grad = torch.zeros_like(q)
            self._handles[id(q)] = (h, t, ctx, q)
        del self._group_ready[gi]

    # ---- public

    def synchronize(self):
        """Submits the allreduces of gradients no hook saw (unused parameters) and waits for all;
        the averaged gradients are then in p.grad."""
        if not self._included():
            return
        for p in self._requires_update:
            key = id(p)
            entry = self._handles.get(key)
            if entry is not None and entry[0] is not None:
                continue
            g = self._group_of.get(key)
            if g is not None and any(q is p for q in self._group_ready.get(g[0], ())):
                continue  # waits for the rest of its group, submitted in this loop
            self._submit(p)
        done = set()
        try:
            for key, (h, t, ctx, p) in list(self._handles.items()):
                if h is None:
                    continue
                if id(h) not in done:
                    collie.synchronize(h)
                    done.add(id(h))
                out = self._compression.decompress(t, ctx)
                if out is not p.grad:
                    with torch.no_grad():
                        p.grad.copy_(out)
        finally:
            self._collie_reset_handles()
        self._synchronized = True

    def _collie_reset_handles(self):
        self._handles.clear()
        self._group_ready.clear()
        for key in self._delay:
            self._delay[key] = self.backward_passes_per_step

    def _collie_reset(self):
        """Forgets in-flight allreduces (collie.torch.elastic after the world was rebuilt)."""
        self._collie_reset_handles()
        self._synchronized = False

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Inside this block step() does not synchronize (call synchronize() yourself first)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                pass  # synchronize() was called explicitly since the last step
            else:
                self.synchronize()
        self._synchronized = False
        return super().step(closure)

    def zero_grad(self, *args, **kwargs):
        if any(e[0] is not None for e in self._handles.values()):
            raise AssertionError("collie.torch.DistributedOptimizer: zero_grad() was called after "
                                 "backward() but before step() or synchronize()")
        return super().zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """A copy of `optimizer` (same class, parameter groups and state) whose gradients are averaged
    (op) over the process set's ranks: each is allreduced asynchronously as soon as backward has
    accumulated it backward_passes_per_step times, and step() first waits for them (synchronize).
    groups: an int (that many grouped allreduces) or lists of parameters reduced together.
    The arguments are Horovod's, in Horovod's order."""
    if num_groups:  # Horovod's older name for groups=<int>
        if groups is not None:
            raise ValueError("collie.torch.DistributedOptimizer: give num_groups or groups, not both")
        groups = num_groups
    if sparse_as_dense:
        raise NotImplementedError("collie.torch.DistributedOptimizer: sparse gradients are not supported")
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizer, optimizer.__class__), {})
    opt = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
              gradient_predivide_factor, groups, process_set)
    for p, s in optimizer.state.items():
        opt.state[p] = s
    return opt


def _named_tensors(params, what):
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, (list, tuple)) or hasattr(params, "__iter__"):
        items = list(params)
        if any(not isinstance(x, tuple) or len(x) != 2 for x in items):
            raise ValueError("collie.torch.%s: params must be a dict or (name, tensor) pairs, e.g. "
                             "model.state_dict() or model.named_parameters()" % what)
    else:
        raise ValueError("collie.torch.%s: params must be a dict or (name, tensor) pairs" % what)
    return items


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Overwrites every tensor of params (model.state_dict(), model.named_parameters(), or a dict /
    list of (name, tensor)) with root_rank's, in place: all broadcasts in flight at once."""
    handles = []
    for name, t in _named_tensors(params, "broadcast_parameters"):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise ValueError("collie.torch.broadcast_parameters: %s is a %s, not a tensor"
                             % (name, type(t).__name__))
        handles.append(mpi_ops.broadcast_async_(t.data if isinstance(t, torch.nn.Parameter) else t,
                                                root_rank, name="broadcast_parameters." + name,
                                                process_set=process_set))
    for h in handles:
        collie.synchronize(h)


def broadcast_optimizer_state(optimizer, root_rank, process_set=global_process_set):
    """Makes every rank's optimizer state (per-parameter state and hyperparameters) root_rank's:
    root's state_dict() travels as one pickled object and the others load it."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("collie.torch.broadcast_optimizer_state: LBFGS is not supported")
    sid = mpi_ops._sid(process_set, "broadcast_optimizer_state")
    root = mpi_ops._set_rank(sid) == int(root_rank)
    state = optimizer.state_dict() if root else None
    state = mpi_ops.broadcast_object(state, root_rank, name="broadcast_optimizer_state",
                                     process_set=process_set)
    if not root:
        optimizer.load_state_dict(state)
