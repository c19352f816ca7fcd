"""DistributedOptimizer: a torch optimizer whose step() applies gradients
summed across the job's processes (see gradmesh.torch for its use).

Backward's hooks hand each gradient to its bucket's slot in the worker's
shared memory; a bucket is all-reduced as soon as all its gradients are in.
step() waits for the buckets, writes the sums into .grad and runs the wrapped
optimizer. Per-process state beyond the residuals lives in corrections.py;
checkpoints in checkpoint.py.
"""

import contextlib
import itertools
import math
import operator
import weakref

import numpy as np
import torch

import gradmesh
from gradmesh.torch import checkpoint
from gradmesh.torch.corrections import correction_for

_MIB = 1024 * 1024
_instances = itertools.count()  # names buckets apart, in creation order


def _bucket_plan(params, num_buckets, bucket_cap_mb=25.0,
                 first_bucket_mb=None):
    """Splits params (in backward order) into runs: the same map on every
    process. With num_buckets = M, M runs of ceil(L / M) tensors. Without,
    by size as DDP does: a run closes once its float32 gradients reach
    first_bucket_mb (the first run, at most bucket_cap_mb; None: the cap)
    or bucket_cap_mb (the others); a tensor past the cap closes the run it
    joins. A small first bucket (DDP's 1 MiB) is all-reduced early in the
    backward pass, while the rest of backward runs."""
    count = len(params)
    if count == 0:
        return []
    if num_buckets is not None:
        num_buckets = max(1, min(int(num_buckets), count))
        per_bucket = math.ceil(count / num_buckets)
        return [params[i:i + per_bucket] for i in range(0, count, per_bucket)]
    runs, run, size = [], [], 0
    for named in params:
        run.append(named)
        size += named[1].numel() * 4
        cap = bucket_cap_mb
        if not runs and first_bucket_mb is not None:
            cap = min(first_bucket_mb, bucket_cap_mb)
        if size >= cap * _MIB:
            runs.append(run)
            run, size = [], 0
    return runs + ([run] if run else [])


# By default the parameters whose quota at the plan's density would keep
# fewer values a step than this (at 1%: those under 25,600 values) are
# summed exactly, if together they make at most EXACT_SHARE of the model's
# values (docs/python.md, "Small layers summed exactly").
EXACT_QUOTA_BELOW = 256
EXACT_SHARE = 0.10


def _default_exact(params, plan):
    """The names of the parameters summed exactly by default: from the
    plan's density and exact_below alone, which stay as configured for the
    whole job (its algorithm does not: `auto` and its trials change it), so
    that a process that starts late splits as the others did. None at
    density 1 (nothing is left out), for a model under exact_below (its one
    bucket is summed exactly anyway), or when the small parameters are more
    than EXACT_SHARE of the model (their exact sum then cost more than it
    gained)."""
    total = sum(p.numel() for _, p in params)
    if plan.density >= 1 or total < plan.exact_below:
        return set()
    below = math.ceil(EXACT_QUOTA_BELOW / plan.density)
    small = {name: p.numel() for name, p in params if p.numel() < below}
    return set(small) if sum(small.values()) <= EXACT_SHARE * total else set()


def _exact_apart(params, buckets, exact_tensors_below):
    """[(run, exact_count)]: the runs of _bucket_plan(params, *buckets) over
    the parameters of exact_tensors_below values or more, the smaller ones
    appended to the last run as its exact_count last tensors, summed
    exactly in that bucket's own operation. Without larger ones, the runs
    of the smaller by size alone (usually one), wholly exact.
    exact_tensors_below None: by the plan (_default_exact); 0: none."""
    if exact_tensors_below is None:
        exact = _default_exact(params, gradmesh.plan())
    else:
        exact = {name for name, p in params if p.numel() < exact_tensors_below}
    small = [named for named in params if named[0] in exact]
    large = [named for named in params if named[0] not in exact]
    runs = [(run, 0) for run in _bucket_plan(large, *buckets)]
    if not runs:
        return [(run, len(run))
                for run in _bucket_plan(small, None, buckets[1])]
    if small:
        runs[-1] = (runs[-1][0] + small, len(small))
    return runs


class _Bucket:
    """One fused bucket of the optimizer: its parameters, their slots in the
    worker's shared memory, and this step's state."""

    def __init__(self, bucket_name, named_params, fusion, exact_count=0):
        self.names = [name for name, _ in named_params]
        self.params = [p for _, p in named_params]
        specs = [(name, p.numel()) for name, p in named_params]
        # registered exact: summed exactly, any plan; else its exact_count
        # last parameters are, in its own operation
        self.exact = exact_count == len(specs)
        self.exact_count = 0 if self.exact else exact_count
        self.set = gradmesh.register(bucket_name, specs, fusion, self.exact,
                                     self.exact_count)
        values = torch.from_numpy(self.set.values())
        self.slots = []
        for i, p in enumerate(self.params):
            offset = self.set.offset(i)
            self.slots.append(values[offset:offset + p.numel()].view_as(p))
        self.step = 0
        plan = gradmesh.plan()  # the algorithm expected of the first sums
        self.warmup_steps = plan.warmup_steps  # its first steps are exact
        self.last_algorithm = self.planned_algorithm(plan)
        self.hooked = 0  # parameters with a gradient hook
        self.clear()

    def in_exact_tail(self, i):
        """Whether parameter i is one of the exact_count last, summed
        exactly in the bucket's own operation whatever its algorithm."""
        return i >= len(self.params) - self.exact_count

    def planned_algorithm(self, plan):
        """The algorithm `plan` sums this bucket with, after any warm-up."""
        dense = (self.exact or self.set.size < plan.exact_below
                 or self.set.size in plan.dense_sizes)
        return "dense" if dense else plan.algorithm

    def clear(self):
        self.passes = {}  # parameter index -> backward passes this step
        # parameter index -> (.grad's version, the loss scale and the true
        # gradient's norm) when handed to the worker
        self.handed = {}
        self.pending = None
        self.info = None  # this step's ReduceInfo
        self.reduced = False  # this step's all-reduce succeeded
        self.done = False  # reduced and written into .grad


class _DistributedOptimizer(torch.optim.Optimizer):
    """Methods mixed into a subclass of the wrapped optimizer's class."""

    def __init__(self, params, named_parameters, op, buckets, fusion,
                 backward_passes_per_step, grad_scaler, correction,
                 exact_tensors_below):
        super(self.__class__, self).__init__(params)
        if int(backward_passes_per_step) < 1:
            raise gradmesh._invalid("backward_passes_per_step must be >= 1")
        num_buckets, bucket_cap_mb, first_bucket_mb = buckets
        if num_buckets is not None and int(num_buckets) < 1:
            raise gradmesh._invalid("num_buckets must be >= 1 (or None: by "
                                    "size)")
        if not (bucket_cap_mb > 0 and (first_bucket_mb is None or
                                       first_bucket_mb > 0)):
            raise gradmesh._invalid("bucket_cap_mb and first_bucket_mb must "
                                    "be > 0")
        if grad_scaler is not None and not hasattr(grad_scaler, "get_scale"):
            raise gradmesh._invalid("grad_scaler needs get_scale() (a "
                                    "torch.cuda.amp.GradScaler)")
        self._gradmesh_op = op
        self._gradmesh_passes = int(backward_passes_per_step)
        self._gradmesh_scaler = grad_scaler
        self._gradmesh_group_of = (None, {})  # (first group, id -> group)
        named = self._gradmesh_named(named_parameters)
        self._gradmesh_correction = correction_for(self, named, *correction)
        self._gradmesh_name = (f"{gradmesh._RESERVED}optimizer"
                               f"{next(_instances)}")
        self._gradmesh_runs = _exact_apart(list(reversed(named)), buckets,
                                           exact_tensors_below)
        # The order of every checkpoint without "params" (see check_order).
        self._gradmesh_canonical = [name for name, _ in reversed(named)]
        self._gradmesh_fusion = fusion
        self._gradmesh_hooks = {}  # id(p) -> (accumulator, hook handle)
        self._gradmesh_register()
        self._gradmesh_step_scale = None  # this step's loss scale, once read
        self._gradmesh_closed = False
        self._gradmesh_skip = False  # inside skip_synchronize()
        self._gradmesh_failed = False  # the last synchronize() failed
        self.last_infos = []  # each bucket's ReduceInfo of the last step
        self._gradmesh_hook_trainable()

    def _gradmesh_register(self):
        """Registers the buckets and the checkpoint's gather bucket with the
        worker (every process at the same point)."""
        self._gradmesh_buckets = [
            _Bucket(f"{self._gradmesh_name}.{i}", run, self._gradmesh_fusion,
                    exact_count)
            for i, (run, exact_count) in enumerate(self._gradmesh_runs)
        ]
        correction = self._gradmesh_correction
        self._gradmesh_gather = checkpoint.Gather(
            f"{self._gradmesh_name}.checkpoint",
            sum(b.set.size for b in self._gradmesh_buckets) + (
                0 if correction is None else
                sum(t.numel() for _, t in correction.tensors())))
        self._gradmesh_where = {}
        for b in self._gradmesh_buckets:
            b.hooked = sum(id(p) in self._gradmesh_hooks for p in b.params)
            for i, p in enumerate(b.params):
                self._gradmesh_where[id(p)] = (b, i)

    def register_again(self):
        """Registers every bucket again, empty: what a new membership asks
        for (FAILED_PRECONDITION "register ... again", after a member
        restarted or rejoined). Every process calls it at the same point;
        the step in flight and the residuals are dropped (load_state_dict()
        brings committed ones back). gradmesh.torch.elastic calls it."""
        self._gradmesh_check_open()
        for b in self._gradmesh_buckets:
            if b.pending is not None:
                try:  # the worker owns the memory until the call ends
                    b.pending.wait()
                except gradmesh.GradmeshError:
                    pass
                b.pending = None
        # The old registrations go first: a TensorSet unregisters its
        # bucket's name when it is freed, the new one's too if that came
        # first.
        self._gradmesh_buckets, self._gradmesh_where = [], {}
        self._gradmesh_gather = None
        self._gradmesh_register()
        self._gradmesh_new_step()
        self._gradmesh_failed = False

    def _gradmesh_named(self, named_parameters):
        """Every parameter of the optimizer with its name, frozen ones too
        (they may be unfrozen later)."""
        named = list(named_parameters)
        names = [name for name, _ in named]
        if len(set(names)) != len(names):
            raise gradmesh._invalid("named_parameters has repeated names")
        in_groups = {id(p) for g in self.param_groups for p in g["params"]}
        unnamed = in_groups - {id(p) for _, p in named}
        if unnamed:
            raise gradmesh._invalid(
                f"{len(unnamed)} parameters of the optimizer are not in "
                "named_parameters; they would not be all-reduced")
        return [(name, p) for name, p in named if id(p) in in_groups]

    def _gradmesh_hook_trainable(self):
        """Hooks every parameter that takes gradients and has no hook yet:
        frozen ones get theirs once unfrozen (at the next step)."""
        me = weakref.ref(self)  # the hooks do not keep the optimizer alive
        for b in self._gradmesh_buckets:
            for p in b.params:
                if not p.requires_grad or id(p) in self._gradmesh_hooks:
                    continue
                # The gradient accumulator fires once p.grad holds this
                # backward's gradient (torch 1.13: no post-accumulate hook).
                accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
                handle = accumulator.register_hook(
                    lambda *_, p=p: me() is not None and me()._gradmesh_ready(
                        p))
                self._gradmesh_hooks[id(p)] = (accumulator, handle)
                b.hooked += 1

    def add_param_group(self, param_group):
        # Torch's constructor adds the groups before the buckets exist.
        if hasattr(self, "_gradmesh_buckets"):
            raise gradmesh._error(
                "FAILED_PRECONDITION",
                "add_param_group() after wrapping: the new parameters would "
                "not be all-reduced; close() the optimizer and wrap one that "
                "has them all (frozen ones included)")
        return super(self.__class__, self).add_param_group(param_group)

    def close(self):
        """Removes this optimizer's hooks and unregisters its buckets (their
        residuals are dropped): another optimizer may then wrap the model.
        Garbage collection does the same."""
        for _, handle in self._gradmesh_hooks.values():
            handle.remove()
        self._gradmesh_hooks = {}
        for b in self._gradmesh_buckets:
            if b.pending is not None:
                try:  # the worker owns the memory until the call ends
                    b.pending.wait()
                except gradmesh.GradmeshError:
                    pass  # its gradient stays in the residual, dropped next
        self._gradmesh_buckets = []
        self._gradmesh_gather = None
        self._gradmesh_where = {}
        self._gradmesh_closed = True

    def __del__(self):
        for _, handle in getattr(self, "_gradmesh_hooks", {}).values():
            handle.remove()

    def _gradmesh_scale(self):
        """The loss scale of this step, read once (get_scale() may wait for
        the device)."""
        if self._gradmesh_step_scale is None:
            scaler = self._gradmesh_scaler
            self._gradmesh_step_scale = (1.0 if scaler is None else
                                         float(scaler.get_scale()))
        return self._gradmesh_step_scale

    def _gradmesh_ready(self, p):
        bucket, i = self._gradmesh_where[id(p)]
        if bucket.pending is not None or bucket.done or i in bucket.handed:
            raise gradmesh._error(
                "FAILED_PRECONDITION",
                "a gradient was computed more often than "
                f"backward_passes_per_step={self._gradmesh_passes} before "
                "step(); call step() (or zero_grad()) between steps")
        bucket.passes[i] = bucket.passes.get(i, 0) + 1
        if bucket.passes[i] < self._gradmesh_passes:
            return  # torch sums the passes into .grad; hand over the last
        self._gradmesh_hand(bucket, i)
        if len(bucket.handed) == bucket.hooked:
            self._gradmesh_submit(bucket)

    def _gradmesh_hand(self, bucket, i, scale=None):
        """Copies parameter i's gradient into its slot, in true units (the
        loss scale, or `scale`, divided out), and notes which .grad it was
        and its version."""
        grad = bucket.params[i].grad
        slot = bucket.slots[i]
        slot.copy_(grad)
        scale, norm = scale or self._gradmesh_scale(), 0.0
        if scale != 1.0:
            slot.div_(scale)
            norm = float(slot.norm())
        bucket.handed[i] = (grad, grad._version, scale, norm)
        if self._gradmesh_correction is not None:
            p = bucket.params[i]
            self._gradmesh_correction.transform(
                p, self._gradmesh_group(p), slot,
                bucket.in_exact_tail(i) or self._gradmesh_exact(bucket))

    @staticmethod
    def _gradmesh_exact(bucket):
        """Whether `bucket` is expected to be summed exactly (its exact last
        parameters always are): in the plan's warm-up, yes; else as its last
        sum was (the plan now for the first sum, and for the first after the
        warm-up)."""
        if bucket.step < bucket.warmup_steps:
            return True
        if bucket.step == bucket.warmup_steps > 0:
            return bucket.planned_algorithm(gradmesh.plan()) == "dense"
        return bucket.last_algorithm == "dense"

    def _gradmesh_group(self, p):
        """p's parameter group (load_state_dict replaces the groups)."""
        groups = self.param_groups
        if self._gradmesh_group_of[0] is not groups[0]:
            self._gradmesh_group_of = (groups[0], {
                id(q): g for g in groups for q in g["params"]})
        return self._gradmesh_group_of[1][id(p)]

    def _gradmesh_submit(self, bucket):
        for i, p in enumerate(bucket.params):
            if i in bucket.handed:
                continue
            # Fewer backward passes than backward_passes_per_step, or
            # unfrozen since the hooks were set: hand over what .grad holds.
            late = bucket.passes.get(i, 0) > 0 or (
                id(p) not in self._gradmesh_hooks)
            if late and p.requires_grad and p.grad is not None:
                # In the units .grad holds now (a scaler may have unscaled).
                self._gradmesh_hand(bucket, i, self._gradmesh_units())
            else:
                bucket.slots[i].zero_()  # no gradient this step
        client = gradmesh._the_client()
        bucket.pending = client.allreduce_async(bucket.set, bucket.step,
                                                self._gradmesh_op)
        bucket.step += 1

    def synchronize(self):
        """Waits for every bucket of this step and writes the averaged
        gradients into the parameters' .grad (those that take gradients).
        A no-op when it already ran since the last backward, so that
        synchronize(), clipping, then `with skip_synchronize(): step()`
        works.

        All or nothing: if a bucket fails, or a .grad was changed after
        backward handed it over (step() would overwrite the change), no
        .grad is written, every bucket's values go back to the workers'
        residuals (the failed ones' are there already; the reduced ones are
        handed back, each process taking 1/P of the sum), so nothing is
        lost, and it raises the GradmeshError; step() then raises too, until
        zero_grad() and the next backward.
        """
        self._gradmesh_check_open()
        buckets = self._gradmesh_buckets
        if buckets and all(b.done for b in buckets):
            return
        for bucket in buckets:
            if bucket.pending is None and not bucket.reduced:
                self._gradmesh_submit(bucket)
        infos, error = self._gradmesh_wait()
        error = error or self._gradmesh_changed()
        if error is not None:
            self._gradmesh_failed = True
            self._gradmesh_hand_back()
            if self._gradmesh_overflowed(error):
                return
            raise error
        scale = self._gradmesh_units()
        for bucket in buckets:
            self._gradmesh_write(bucket, scale)
            bucket.done = True
        self.last_infos = infos
        self._gradmesh_hook_trainable()

    def _gradmesh_check_open(self):
        if self._gradmesh_closed:
            raise gradmesh._error("FAILED_PRECONDITION",
                                  "the optimizer was closed")

    def _gradmesh_overflowed(self, error):
        """With a loss scaler, a step refused for Inf or NaN (on any
        process: every one is refused alike) is the scaler's to skip: Inf
        into every .grad, so that its unscale_ sees it and backs off."""
        if (self._gradmesh_scaler is None or error.code != "INVALID_ARGUMENT"
                or "non-finite" not in str(error)):
            return False
        for bucket in self._gradmesh_buckets:
            for p in bucket.params:
                if p.requires_grad:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    p.grad.fill_(float("inf"))
        return True

    def _gradmesh_units(self):
        """The units .grad holds now: loss-scaled, unless the scaler has
        unscaled it since backward handed it over (one answer per step)."""
        if self._gradmesh_scaler is None:
            return 1.0
        for bucket in self._gradmesh_buckets:
            for i in bucket.handed:
                if self._gradmesh_touched(bucket, i):
                    return 1.0
        return self._gradmesh_scale()

    @staticmethod
    def _gradmesh_touched(bucket, i):
        """Whether parameter i's .grad was changed or replaced since it was
        handed over."""
        grad, version, _, _ = bucket.handed[i]
        now = bucket.params[i].grad
        return now is not grad or now._version != version

    def _gradmesh_wait(self):
        """Waits for every bucket in flight: their infos and the first
        GradmeshError."""
        infos, error = [], None
        for bucket in self._gradmesh_buckets:
            if bucket.pending is None:
                continue
            try:
                bucket.info = bucket.pending.wait()
                bucket.last_algorithm = bucket.info.algorithm
                infos.append(bucket.info)
                bucket.reduced = True
            except gradmesh.GradmeshError as e:
                error = error or e
            finally:
                bucket.pending = None
        return infos, error

    def _gradmesh_changed(self):
        """The error that names the recipe when a handed .grad was changed
        since (a loss scaler's unscaling alone excepted)."""
        for bucket in self._gradmesh_buckets:
            for i, (_, _, scale, norm) in bucket.handed.items():
                grad = bucket.params[i].grad
                if not self._gradmesh_touched(bucket, i):
                    continue
                if grad is not None and scale != 1.0 and (
                        abs(float(grad.detach().float().norm()) - norm)
                        <= 1e-4 * norm):
                    continue  # the scaler's unscale_ alone
                return gradmesh._error(
                    "FAILED_PRECONDITION",
                    f"the gradient of '{bucket.names[i]}' changed after "
                    "backward handed it to gradmesh, and step() would "
                    "overwrite the change with the reduced gradient. To clip "
                    "or unscale: optimizer.synchronize(), change the "
                    "gradients, then `with optimizer.skip_synchronize(): "
                    "optimizer.step()`. Nothing was applied; the gradients "
                    "are back in the residuals")
        return None

    def _gradmesh_write(self, bucket, scale):
        """The reduced values into .grad, times `scale` (the units .grad
        holds)."""
        correction = self._gradmesh_correction
        sparse = correction is not None and bucket.info.algorithm != "dense"
        for i, (p, slot) in enumerate(zip(bucket.params, bucket.slots)):
            if not p.requires_grad:
                continue  # frozen: does not move
            if sparse and not bucket.in_exact_tail(i):
                correction.sent(p, slot)
            if p.grad is None:
                p.grad = (slot * scale).to(p.device, p.dtype)
            else:
                p.grad.copy_(slot)
                if scale != 1.0:
                    p.grad.mul_(scale)

    def _gradmesh_hand_back(self):
        """Every reduced bucket of this step back into the residuals: each
        process takes 1/P of the sum, so the processes' residuals together
        gain what the reduction took out of them. Then a fresh step."""
        client = gradmesh._the_client()
        share = 1.0 if self._gradmesh_op == gradmesh.Average else (
            1.0 / gradmesh.size())
        error = None
        for bucket in self._gradmesh_buckets:
            if not bucket.reduced:
                continue
            try:
                client.save_residual(bucket.set)
                residual = bucket.set.residual().copy()
                residual += np.float32(share) * bucket.set.values()
                client.load_residual(bucket.set, residual)
            except gradmesh.GradmeshError as e:  # the others still go back
                error = error or e
        self._gradmesh_new_step()
        if error is not None:
            raise error

    def _gradmesh_new_step(self):
        for bucket in self._gradmesh_buckets:
            bucket.clear()
        self._gradmesh_step_scale = None

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside applies the gradients a synchronize() already wrote
        (and that you may have changed), without synchronizing again."""
        self._gradmesh_skip = True
        try:
            yield
        finally:
            self._gradmesh_skip = False

    def step(self, closure=None):
        if closure is not None:
            raise gradmesh._invalid("DistributedOptimizer.step() takes no "
                                    "closure (backward must run before it)")
        self._gradmesh_check_open()
        if self._gradmesh_failed:
            raise gradmesh._error(
                "FAILED_PRECONDITION",
                "step() after a failed synchronize(): nothing of that step "
                "is applied (its gradients are back in the residuals); call "
                "zero_grad() and go on with the next batch")
        if not self._gradmesh_skip:
            self.synchronize()
            if self._gradmesh_failed:
                return None  # an overflow: skipped, as the scaler would
        elif not all(b.done for b in self._gradmesh_buckets):
            raise gradmesh._error(
                "FAILED_PRECONDITION",
                "step() inside skip_synchronize() needs a synchronize() "
                "after the last backward")
        result = self._gradmesh_inner_step()
        self._gradmesh_new_step()
        return result

    def _gradmesh_inner_step(self):
        """The wrapped optimizer's step, or the correction's on the sum."""
        inner = super(self.__class__, self).step
        if self._gradmesh_correction is None:
            return inner()
        exact = {id(p) for b in self._gradmesh_buckets if b.info is not None
                 for i, p in enumerate(b.params)
                 if b.info.algorithm == "dense" or b.in_exact_tail(i)}
        return self._gradmesh_correction.step(inner, exact)

    def _gradmesh_own_tensors(self):
        """This process's own state, [(key, tensor)] in one order on every
        process: each bucket's residual (read from the worker) and the
        correction's."""
        client = gradmesh._the_client()
        tensors = []
        for i, b in enumerate(self._gradmesh_buckets):
            client.save_residual(b.set)
            tensors.append((f"residual/{i}",
                            torch.from_numpy(b.set.residual().copy())))
        if self._gradmesh_correction is not None:
            tensors += self._gradmesh_correction.tensors()
        return tensors

    def _gradmesh_check_idle(self, what):
        """FAILED_PRECONDITION unless between step() and the next
        backward."""
        self._gradmesh_check_open()
        if any(b.pending is not None or b.passes or b.handed or b.reduced
               for b in self._gradmesh_buckets):
            raise gradmesh._error(
                "FAILED_PRECONDITION",
                f"{what} between backward and step(): a step is in flight")

    def state_dict(self):
        """The wrapped optimizer's state, and under "gradmesh" every
        process's residuals (error feedback: gradients pushed but not yet
        sent) and correction state, gathered: the same on every process, so
        that rank 0 can save it alone. Collective: every process calls it at
        the same point, between step() and the next backward. A call on one
        process alone fails at the timeout (DEADLINE_EXCEEDED), and the
        others' steps with it: the job must start again."""
        self._gradmesh_check_idle("state_dict()")
        state = super(self.__class__, self).state_dict()
        state["gradmesh"] = checkpoint.gather(self._gradmesh_gather,
                                              self._gradmesh_own_tensors())
        state["gradmesh"]["params"] = self._gradmesh_order()
        return state

    def load_state_dict(self, state_dict):
        """Loads what state_dict() returned, on every process: each takes
        its own residuals and correction state back (in a job of another
        size, see gradmesh/torch/checkpoint.py). Call it before the first
        step of the new run. All or nothing: checked first, and undone if
        a worker fails it. A plain optimizer's state (no "gradmesh" entry)
        leaves them as they are."""
        self._gradmesh_check_idle("load_state_dict()")
        state = dict(state_dict)
        table = state.pop("gradmesh", None)
        if table is None and "gradmesh_residuals" not in state:
            return super(self.__class__, self).load_state_dict(state)
        tensors = self._gradmesh_own_tensors()
        if "gradmesh_residuals" in state:  # an earlier per-process format
            table = self._gradmesh_own_table(state, tensors,
                                             self._gradmesh_boundaries())
        checkpoint.check_order(table, self._gradmesh_order(),
                               self._gradmesh_canonical)
        values = checkpoint.mine(table, tensors, self._gradmesh_op,
                                 self._gradmesh_boundaries())
        before = super(self.__class__, self).state_dict()
        super(self.__class__, self).load_state_dict(state)
        try:
            self._gradmesh_load_residuals(tensors, values)
        except gradmesh.GradmeshError:
            super(self.__class__, self).load_state_dict(before)
            raise
        for (key, tensor), value in zip(tensors, values):
            if not key.startswith("residual/"):
                tensor.copy_(torch.from_numpy(value).view_as(tensor))

    def _gradmesh_load_residuals(self, tensors, values):
        """The residuals of `values` into the workers; on an error the ones
        loaded get their earlier values (`tensors`) back."""
        client = gradmesh._the_client()
        loaded = []
        try:
            for (key, earlier), value in zip(tensors, values):
                if key.startswith("residual/"):
                    bucket = self._gradmesh_buckets[int(key.split("/")[1])]
                    client.load_residual(bucket.set, value)
                    loaded.append((bucket, earlier))
        except gradmesh.GradmeshError:
            for bucket, earlier in loaded:
                client.load_residual(bucket.set, earlier.numpy())
            raise

    def _gradmesh_order(self):
        """The parameters' names in the order their residuals are laid end
        to end (the buckets'): reversed(named_parameters), unless
        exact_tensors_below (or its default) moved the small ones after the
        others."""
        return [name for b in self._gradmesh_buckets for name in b.names]

    def _gradmesh_boundaries(self):
        """Where each parameter ends in the buckets' residuals, laid end to
        end: what a checkpoint saved with other buckets must cut at."""
        sizes = [p.numel() for b in self._gradmesh_buckets for p in b.params]
        return list(itertools.accumulate(sizes))

    @staticmethod
    def _gradmesh_own_table(state, tensors, boundaries):
        """A checkpoint of one process's residuals (and velocities, by
        parameter name), the format before state_dict() gathered them: a
        table with this process's row."""
        residuals = [torch.as_tensor(r).reshape(-1)
                     for r in state.pop("gradmesh_residuals")]
        sizes = [t.numel() for key, t in tensors
                 if key.startswith("residual/")]
        saved = [r.numel() for r in residuals]
        if residuals and saved != sizes and sum(saved) == sum(sizes) and set(
                itertools.accumulate(saved)) <= set(boundaries):
            # Saved with other buckets: the same values, cut otherwise
            # (checkpoint.rebucketed).
            residuals = list(torch.cat(residuals).split(sizes))
        velocity = state.pop("gradmesh_velocity", {})
        values = []
        for key, t in tensors:
            kind, name = key.split("/", 1)
            if kind == "residual" and int(name) < len(residuals):
                values.append(residuals[int(name)])
            elif kind == "velocity" and name in velocity:
                values.append(velocity[name])
            else:
                values.append(torch.zeros(t.numel()))
        if [torch.as_tensor(v).numel() for v in values] != [
                t.numel() for _, t in tensors] or len(residuals) != sum(
                    key.startswith("residual/") for key, _ in tensors):
            raise gradmesh._invalid(
                "the checkpoint's residuals do not match this optimizer's "
                "buckets")
        return checkpoint.own_table(tensors, values)

    def zero_grad(self, set_to_none=False):
        """Clears the gradients. A step abandoned halfway (a batch skipped,
        or a step the loss scaler skipped) loses nothing: its buckets are
        waited for and handed back to the residuals."""
        if any(b.pending is not None or b.passes or b.handed or b.reduced
               for b in self._gradmesh_buckets):
            self._gradmesh_abandon()
        self._gradmesh_new_step()
        self._gradmesh_failed = False
        self._gradmesh_hook_trainable()
        return super(self.__class__, self).zero_grad(set_to_none)

    def _gradmesh_abandon(self):
        """A step left before step(): its buckets run as synchronize() would
        run them (the other processes may be synchronizing), then every
        reduced one goes back to the residuals."""
        for bucket in self._gradmesh_buckets:
            if bucket.pending is None and not bucket.reduced:
                self._gradmesh_submit(bucket)
        _, error = self._gradmesh_wait()
        self._gradmesh_hand_back()
        if isinstance(error, gradmesh.WorkerGoneError):
            raise error


def DistributedOptimizer(optimizer, named_parameters, op=gradmesh.Average,
                         num_buckets=None, fusion="per_tensor",
                         backward_passes_per_step=1, grad_scaler=None,
                         momentum_correction=False, bucket_cap_mb=25.0,
                         first_bucket_mb=None, momentum_masking=None,
                         exact_tensors_below=None):
    """Wraps `optimizer` so that step() uses gradients summed across workers.

    named_parameters: model.named_parameters() (the names must match on
    every process). op: gradmesh.Average (Horovod's default) or
    gradmesh.Sum. Buckets, by size as DDP makes them: the parameters in
    reverse order, a bucket closed once its gradients reach bucket_cap_mb
    (MiB of float32 gradient), the first at first_bucket_mb if given:
    first_bucket_mb=1 is DDP's small first bucket, whose all-reduce starts
    early in backward (one more operation a step, which on hosts without a
    spare core costs more than it hides: docs/benchmarks.md). num_buckets =
    M instead (the caps then unused) fuses them into M buckets of
    ceil(L / M) tensors each (the exact parameters, below, then join the
    last). A checkpoint saved with other buckets loads as
    it is (not one of another exact_tensors_below split). fusion:
    "per_tensor" (SAFusion's quotas) or "after_fusion".
    backward_passes_per_step: N
    backward passes are summed locally (in .grad, as torch does) and reduced
    once, at the Nth. grad_scaler: a loss scaler (anything with
    get_scale(), such as torch.cuda.amp.GradScaler): the workers get
    gradients in true units, so the residuals do not depend on the scale.
    momentum_correction: momentum before the selection, for a sparse plan
    (gradmesh/torch/corrections.py). With SGD (momentum > 0), Deep Gradient
    Compression's: each process's velocity is summed instead of its
    gradient; in exact buckets plain momentum. momentum_masking: whether
    the velocity is also cleared where a sparse sum has values (DGC's
    momentum factor masking); None: where the plan's density is at most 2%
    (it helped at 1% and cost 0.87 points at 2.5%, 3 at 5%,
    docs/benchmarks.md). exact_tensors_below: the parameters of fewer
    values are summed exactly whatever the plan, as Deep Gradient
    Compression leaves small layers uncompressed: at the end of the last
    bucket, in its own operation (without larger parameters, in buckets of
    their own); 0: every bucket follows the plan; None (the
    default): the parameters whose quota at the plan's density is under
    EXACT_QUOTA_BELOW values a step (at 1%: those under 25,600 values), if
    they are at most EXACT_SHARE of the values; none at density 1 or for a
    model under the plan's exact_below. On the 824k CNN at 1% that is its
    convolutions, biases and last layer (2.6% of the values): one epoch
    ended at or above dense in each of 3 seeds instead of 1.14 points below
    on average (docs/benchmarks.md).
    With Adam or AdamW: in sparse buckets each process's Adam step
    direction is summed and applied with the learning rate; on exact sums
    plain Adam. Each bucket is all-reduced as soon as backward has produced
    all of its gradients, while backward goes on. After step(), .last_infos
    holds each bucket's gradmesh.ReduceInfo. state_dict() is collective (it
    gathers every process's residuals). close() (or garbage collection)
    removes the hooks and unregisters the buckets. Requires
    gradmesh.init(); every process must create its distributed optimizers
    and hook states in the same order (their buckets are named by it).
    """
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    try:
        caps = (float(bucket_cap_mb), None if first_bucket_mb is None else
                float(first_bucket_mb))
    except (TypeError, ValueError):
        raise gradmesh._invalid("bucket_cap_mb and first_bucket_mb must be "
                                "numbers of MiB") from None
    if exact_tensors_below is not None:
        try:
            if isinstance(exact_tensors_below, bool):
                raise TypeError
            exact_tensors_below = operator.index(exact_tensors_below)
        except TypeError:
            exact_tensors_below = -1
        if exact_tensors_below < 0:
            raise gradmesh._invalid("exact_tensors_below must be a whole "
                                    "number of values >= 0 (0: none; None: "
                                    "by the plan's density)")
    return cls(optimizer.param_groups, list(named_parameters), op,
               (num_buckets, *caps),
               fusion, backward_passes_per_step, grad_scaler,
               (momentum_correction, momentum_masking), exact_tensors_below)


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Overwrites `optimizer`'s state (momentum buffers, Adam's moments,
    hyperparameters) on every process with root_rank's. Of a
    DistributedOptimizer, the residuals stay each process's own."""
    plain = torch.optim.Optimizer  # without a DistributedOptimizer's residuals
    state = gradmesh.broadcast_object(plain.state_dict(optimizer), root_rank)
    if gradmesh.rank() != root_rank:
        plain.load_state_dict(optimizer, state)
