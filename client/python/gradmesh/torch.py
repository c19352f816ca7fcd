"""PyTorch integration: a distributed optimizer and a DDP communication hook.

    import gradmesh, gradmesh.torch
    gradmesh.init()
    gradmesh.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = gradmesh.torch.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters())
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()   # buckets all-reduce as grads appear
        optimizer.step()                  # waits for them, then steps

or, with torch.nn.parallel.DistributedDataParallel (its process group only
broadcasts the initial parameters; gradients go through gradmesh):

    ddp.register_comm_hook(gradmesh.torch.HookState(),
                           gradmesh.torch.allreduce_hook)

Tensor fusion follows SAFusion (paper 002): the optimizer's buckets are
closed by tensor count (parameters in reverse registration order, the order
backward produces them, ceil(L/M) per bucket), so every process has the same
tensor-to-bucket map; and by default each top-k selection gives every tensor
its own quota (fusion="per_tensor"), so no tensor goes missing from the sum.
fusion="after_fusion" selects over the fused bucket instead, for comparison.
Error feedback stays in the worker daemons.

CUDA parameters go through host memory: each gradient is copied into its
bucket as backward produces it (a copy that waits for the GPU) and the result
back; the selection then runs in the worker daemon. Not yet run with a
PyTorch that has CUDA.
"""

import itertools
import math
import queue
import threading

import numpy as np
import torch

import gradmesh

_DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024  # as DDP's bucket_cap_mb
_instances = itertools.count()  # names buckets apart, in creation order


def _bucket_plan(params, num_buckets):
    """Splits params (in backward order) into num_buckets runs of
    ceil(L / M) tensors: the same map on every process."""
    count = len(params)
    if count == 0:
        return []
    if num_buckets is None:
        total = sum(p.numel() * 4 for _, p in params)
        num_buckets = math.ceil(total / _DEFAULT_BUCKET_BYTES)
    num_buckets = max(1, min(int(num_buckets), count))
    per_bucket = math.ceil(count / num_buckets)
    return [params[i:i + per_bucket] for i in range(0, count, per_bucket)]


class _Bucket:
    """One fused bucket of the optimizer: its parameters and their slots."""

    def __init__(self, bucket_name, named_params, fusion):
        self.params = [p for _, p in named_params]
        specs = [(name, p.numel()) for name, p in named_params]
        self.set = gradmesh.register(bucket_name, specs, fusion)
        values = torch.from_numpy(self.set.values())
        self.slots = []
        for i, p in enumerate(self.params):
            offset = self.set.offset(i)
            self.slots.append(values[offset:offset + p.numel()].view_as(p))
        self.ready = set()
        self.pending = None
        self.step = 0


class _DistributedOptimizer(torch.optim.Optimizer):
    """Methods mixed into a subclass of the wrapped optimizer's class."""

    def __init__(self, params, named_parameters, op, num_buckets, fusion):
        super(self.__class__, self).__init__(params)
        named = [(name, p) for name, p in named_parameters if p.requires_grad]
        names = [name for name, _ in named]
        if len(set(names)) != len(names):
            raise ValueError("gradmesh: named_parameters has repeated names")
        in_groups = {id(p) for g in self.param_groups for p in g["params"]
                     if p.requires_grad}
        unnamed = in_groups - {id(p) for _, p in named}
        if unnamed:
            raise ValueError(f"gradmesh: {len(unnamed)} parameters of the "
                             "optimizer are not in named_parameters; they "
                             "would not be all-reduced")
        named = [(name, p) for name, p in named if id(p) in in_groups]
        self._gradmesh_op = op
        instance = next(_instances)
        self._gradmesh_buckets = [
            _Bucket(f"{gradmesh._RESERVED}optimizer{instance}.{i}", run,
                    fusion)
            for i, run in enumerate(_bucket_plan(list(reversed(named)),
                                                 num_buckets))
        ]
        self._gradmesh_where = {}
        for b in self._gradmesh_buckets:
            for i, p in enumerate(b.params):
                self._gradmesh_where[id(p)] = (b, i)
        self._gradmesh_accumulators = []
        self._gradmesh_synchronized = False  # since the last backward
        self.last_infos = []  # each bucket's ReduceInfo of the last step
        for b in self._gradmesh_buckets:
            for p in b.params:
                self._gradmesh_hook(p)

    def _gradmesh_hook(self, p):
        # The gradient accumulator fires once p.grad holds this backward's
        # gradient (torch 1.13 has no post-accumulate hook on tensors).
        accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
        accumulator.register_hook(lambda *_: self._gradmesh_ready(p))
        self._gradmesh_accumulators.append(accumulator)

    def _gradmesh_ready(self, p):
        bucket, i = self._gradmesh_where[id(p)]
        if bucket.pending is not None:
            raise RuntimeError(
                "gradmesh: a gradient was computed twice before step(); "
                "call step() (or synchronize()) between backward passes")
        bucket.slots[i].copy_(p.grad)
        bucket.ready.add(i)
        self._gradmesh_synchronized = False
        if len(bucket.ready) == len(bucket.params):
            self._gradmesh_submit(bucket)

    def _gradmesh_submit(self, bucket):
        for i, p in enumerate(bucket.params):
            if i not in bucket.ready:  # no gradient this step: zeros
                bucket.slots[i].zero_()
        client = gradmesh._the_client()
        bucket.pending = client.allreduce_async(bucket.set, bucket.step,
                                                self._gradmesh_op)
        bucket.step += 1

    def synchronize(self):
        """Waits for every bucket of this step and writes the averaged
        gradients into the parameters' .grad. Raises the first GradmeshError
        after all buckets have ended (failed steps keep their gradients in
        the workers' residuals). A no-op when nothing was computed since the
        last call, so that synchronize(), clipping, then step() works."""
        if self._gradmesh_synchronized:
            return
        self._gradmesh_synchronized = True
        for bucket in self._gradmesh_buckets:
            if bucket.pending is None:
                self._gradmesh_submit(bucket)
        error = None
        self.last_infos = []
        for bucket in self._gradmesh_buckets:
            try:
                self.last_infos.append(bucket.pending.wait())
                for p, slot in zip(bucket.params, bucket.slots):
                    if p.grad is None:
                        p.grad = slot.to(p.device, copy=True)
                    else:
                        p.grad.copy_(slot)
            except gradmesh.GradmeshError as e:
                error = error or e
            finally:
                bucket.pending = None
                bucket.ready.clear()
        if error is not None:
            raise error

    def step(self, closure=None):
        if closure is not None:
            raise ValueError("gradmesh: DistributedOptimizer.step() takes no "
                             "closure (backward must run before step)")
        self.synchronize()
        return super(self.__class__, self).step()

    def state_dict(self):
        """The wrapped optimizer's state, and each bucket's residual on this
        process's worker (error feedback), so that a checkpoint loses no
        gradient that was pushed but not yet sent."""
        state = super(self.__class__, self).state_dict()
        if any(b.pending is not None for b in self._gradmesh_buckets):
            raise RuntimeError("gradmesh: step() or synchronize() before "
                               "state_dict(): all-reduces are in flight")
        client = gradmesh._the_client()
        residuals = []
        for b in self._gradmesh_buckets:
            client.save_residual(b.set)
            residuals.append(torch.from_numpy(b.set.residual().copy()))
        state["gradmesh_residuals"] = residuals
        return state

    def load_state_dict(self, state_dict):
        """Loads what state_dict() returned: the residuals go back to this
        process's worker (call it before the first step of the new run)."""
        state = dict(state_dict)
        residuals = state.pop("gradmesh_residuals", None)
        super(self.__class__, self).load_state_dict(state)
        if residuals is None:
            return
        if len(residuals) != len(self._gradmesh_buckets):
            raise ValueError(f"gradmesh: {len(residuals)} residuals for "
                             f"{len(self._gradmesh_buckets)} buckets")
        client = gradmesh._the_client()
        for b, r in zip(self._gradmesh_buckets, residuals):
            client.load_residual(b.set, r.detach().to(torch.float32).numpy())

    def zero_grad(self, set_to_none=False):
        # A step abandoned halfway (a skipped batch) must not leave buckets
        # in flight: finish them, then clear.
        if any(b.pending is not None or b.ready
               for b in self._gradmesh_buckets):
            self.synchronize()
        return super(self.__class__, self).zero_grad(set_to_none)


def DistributedOptimizer(optimizer, named_parameters, op=gradmesh.Average,
                         num_buckets=None, fusion="per_tensor"):
    """Wraps `optimizer` so that step() uses gradients summed across workers.

    named_parameters: model.named_parameters() (the names must match on
    every process). op: gradmesh.Average (Horovod's default) or
    gradmesh.Sum. num_buckets: M, the buckets the parameters are fused into,
    ceil(L / M) tensors each (default: one per 25 MiB). fusion: "per_tensor"
    (SAFusion's quotas) or "after_fusion". Each bucket is all-reduced as soon
    as backward has produced all of its gradients, while backward goes on.
    After step(), .last_infos holds each bucket's gradmesh.ReduceInfo.
    Requires gradmesh.init(); every process must create its distributed
    optimizers and hook states in the same order (their buckets are named
    by it).
    """
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, list(named_parameters), op,
               num_buckets, fusion)


class HookState:
    """State of allreduce_hook: one gradmesh bucket per DDP bucket layout,
    and a thread that completes the futures as the worker finishes."""

    def __init__(self, op=gradmesh.Average, fusion="per_tensor"):
        self.op = op
        self.fusion = fusion
        self._name = f"{gradmesh._RESERVED}ddp{next(_instances)}"
        self._buckets = {}  # tuple of parameter ids -> gradmesh._Bucket
        self._queue = queue.Queue()
        self._thread = threading.Thread(target=self._complete, daemon=True)
        self._thread.start()

    def bucket_for(self, ddp_bucket):
        params = ddp_bucket.parameters()
        key = tuple(id(p) for p in params)
        bucket = self._buckets.get(key)
        if bucket is None:
            # DDP launches its buckets in index order on every rank, so the
            # registrations pair up across processes.
            specs = [(f"t{i}", p.numel()) for i, p in enumerate(params)]
            name = f"{self._name}.{len(self._buckets)}"
            bucket = gradmesh._Bucket(gradmesh.register(name, specs,
                                                        self.fusion))
            self._buckets[key] = bucket
        return bucket

    def submit(self, ddp_bucket):
        buf = ddp_bucket.buffer()
        bucket = self.bucket_for(ddp_bucket)
        values = torch.from_numpy(bucket.values)
        if values.numel() != buf.numel():
            raise RuntimeError("gradmesh: DDP bucket size changed")
        values.copy_(buf.view(-1))
        handle = gradmesh._the_client().allreduce_async(
            bucket.set, bucket.next_step(), self.op)
        future = torch.futures.Future()
        self._queue.put((handle, values, buf, future))
        return future

    def _complete(self):
        while True:
            handle, values, buf, future = self._queue.get()
            try:
                handle.wait()
                buf.view(-1).copy_(values)
                future.set_result(buf)
            except Exception as e:  # noqa: BLE001 (handed to the trainer)
                future.set_exception(e)


_default_state = None


def allreduce_hook(state, bucket):
    """DDP communication hook: averages the bucket's gradients through
    gradmesh and returns a torch.futures.Future of the bucket's tensor.
    state: a HookState (None: one shared by the process)."""
    global _default_state
    if state is None:
        if _default_state is None:
            _default_state = HookState()
        state = _default_state
    return state.submit(bucket)
