"""What a DistributedOptimizer does before the selection so that momentum
survives a sparse sum (its momentum_correction option).

A sparse sum sends a value late (it waits in the residual) and then only
once, so an optimizer's momentum applied to the sum keeps pushing with
values that arrived out of their moment. A correction moves the momentum
before the selection: each process turns its own gradient into the update's
direction, the workers sum directions (the residual holds directions), and
the wrapped optimizer applies the sum without momentum of its own.

Each correction keeps per-parameter state on this process (created as zeros,
so every process has the same tensors, which a checkpoint gathers) and
offers:
    transform(p, group, slot, exact)  the direction of p's gradient, in
                               place (`exact`: p is expected to be summed
                               exactly: its bucket's sum is, or p is one
                               of its exact last tensors); a non-finite
                               gradient is left as it is and the state
                               unchanged (the worker refuses the step, a
                               loss scaler skips it);
    sent(p, slot)              after a sparse sum wrote `slot`;
    step(inner_step, exact)    the wrapped optimizer's step on the sums
                               (`exact`: ids of the parameters whose sum
                               was exact, the same on every process);
    tensors()                  [(key, tensor)] of its state, in one order.
"""

import math

import torch

import gradmesh


def _refused(slot):
    """Whether `slot` holds a non-finite value (the worker refuses the
    step); if so only those are left, so that the residual, which keeps a
    refused step's finite values, gets no raw gradient among its
    directions."""
    finite = torch.isfinite(slot)
    if finite.all():
        return False
    slot.masked_fill_(finite, 0.0)
    return True


# The highest plan density at which SGD's correction masks by default.
MASKING_UP_TO = 0.02


class MomentumCorrection:
    """Deep Gradient Compression's momentum correction, for SGD with
    momentum: the direction is the local velocity u = m u + (g + wd p); the
    wrapped SGD steps without momentum and weight decay. In an exact bucket
    that is plain momentum (the sum of velocities is the velocity of the
    sum). With `masking`, the velocity is cleared where a sparse sum has
    values (DGC's momentum factor masking); None: where the plan's density
    is at most MASKING_UP_TO. The sum's values are its top ones, not this
    process's, so masking clears velocity this process may not have sent:
    at 5% it ended 3 points lower, at 2.5% 0.87, at 1% higher after 5
    epochs (docs/benchmarks.md)."""

    def __init__(self, optimizer, named, masking=None):
        if any(g["nesterov"] or g["momentum"] <= 0 or g["dampening"]
               for g in optimizer.param_groups):
            raise gradmesh._invalid("momentum_correction for SGD needs "
                                    "momentum > 0, no dampening, not "
                                    "Nesterov")
        self._optimizer = optimizer
        self._named = named
        if masking is None:
            masking = gradmesh.plan().density <= MASKING_UP_TO
        self._masking = bool(masking)
        self._velocity = {id(p): torch.zeros_like(p, dtype=torch.float32,
                                                  device="cpu")
                          for _, p in named}

    def transform(self, p, group, slot, exact):
        del exact  # the sum of velocities is the velocity of the sum
        if _refused(slot):
            return
        if group["weight_decay"]:
            slot.add_(p.detach().to(slot.device), alpha=group["weight_decay"])
        u = self._velocity[id(p)]
        u.mul_(group["momentum"]).add_(slot)
        slot.copy_(u)

    def sent(self, p, slot):
        if self._masking:
            self._velocity[id(p)].masked_fill_(slot != 0, 0.0)

    def step(self, inner_step, exact):
        del exact
        groups = self._optimizer.param_groups
        saved = [(g["momentum"], g["weight_decay"]) for g in groups]
        for g in groups:
            g["momentum"], g["weight_decay"] = 0.0, 0.0
        try:
            return inner_step()
        finally:
            for g, (momentum, decay) in zip(groups, saved):
                g["momentum"], g["weight_decay"] = momentum, decay

    def tensors(self):
        return [(f"velocity/{name}", self._velocity[id(p)])
                for name, p in self._named]


class AdamCorrection:
    """For Adam and AdamW under a sparse sum: each process keeps Adam's
    moments of its own gradient and hands over Adam's step direction
    m^ / (sqrt(v^) + eps); the sum of directions is applied with the learning
    rate (AdamW's decoupled weight decay first, as torch does). A bucket
    summed exactly hands over the gradient and the wrapped optimizer steps
    on the sum: plain Adam. What a bucket hands over follows the algorithm
    of its previous sum (in the plan's warm-up, exact; the first after it,
    the plan's; the same on every process); how the sum is applied
    follows this one's, so the processes stay identical, and only the step
    after a plan changes between exact and sparse applies values of the
    other kind."""

    def __init__(self, optimizer, named):
        if any(g.get("amsgrad") or g.get("maximize")
               for g in optimizer.param_groups):
            raise gradmesh._invalid("momentum_correction for Adam does not "
                                    "take amsgrad or maximize")
        self._optimizer = optimizer
        self._named = named
        self._decoupled = isinstance(optimizer, torch.optim.AdamW)
        self._moments = {
            id(p): (torch.zeros_like(p, dtype=torch.float32, device="cpu"),
                    torch.zeros_like(p, dtype=torch.float32, device="cpu"),
                    torch.zeros(1))  # m, v, this parameter's steps
            for _, p in named}

    def transform(self, p, group, slot, exact):
        if exact or _refused(slot):
            return  # plain Adam on the exact sum; or a refused step
        beta1, beta2 = group["betas"]
        if group["weight_decay"] and not self._decoupled:
            slot.add_(p.detach().to(slot.device), alpha=group["weight_decay"])
        m, v, steps = self._moments[id(p)]
        steps += 1
        t = float(steps)
        m.mul_(beta1).add_(slot, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(slot, slot, value=1 - beta2)
        denominator = (v.sqrt() / math.sqrt(1 - beta2**t)).add_(group["eps"])
        torch.div(m, denominator, out=slot).div_(1 - beta1**t)

    def sent(self, p, slot):
        pass  # the moments are the process's own, as Adam's are

    def step(self, inner_step, exact):
        directions = [(g, p) for g in self._optimizer.param_groups
                      for p in g["params"]
                      if p.grad is not None and id(p) not in exact]
        grads = [p.grad for _, p in directions]
        for _, p in directions:
            p.grad = None  # Adam's own step skips them
        try:
            result = inner_step()
        finally:
            for (_, p), grad in zip(directions, grads):
                p.grad = grad
        with torch.no_grad():
            for g, p in directions:
                if self._decoupled and g["weight_decay"]:
                    p.mul_(1 - g["lr"] * g["weight_decay"])
                p.add_(p.grad, alpha=-g["lr"])
        return result

    def tensors(self):
        out = []
        for name, p in self._named:
            m, v, steps = self._moments[id(p)]
            out += [(f"adam_m/{name}", m), (f"adam_v/{name}", v),
                    (f"adam_steps/{name}", steps)]
        return out


def correction_for(optimizer, named, enabled, masking=None):
    """The correction for the wrapped `optimizer` (None when not enabled;
    `masking`: SGD's momentum factor masking, None: by the plan's density);
    InvalidArgument for an optimizer that has none."""
    if masking is not None and not (
            enabled and isinstance(optimizer, torch.optim.SGD)):
        raise gradmesh._invalid("momentum_masking is for "
                                "momentum_correction with SGD")
    if not enabled:
        return None
    if isinstance(optimizer, torch.optim.SGD):
        return MomentumCorrection(optimizer, named, masking)
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return AdamCorrection(optimizer, named)
    raise gradmesh._invalid(
        f"momentum_correction takes torch.optim.SGD (with momentum), Adam "
        f"or AdamW, not {type(optimizer).__mro__[1].__name__}")
