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
closed by size as DDP's (bucket_cap_mb) or by tensor count (num_buckets),
over the parameters in reverse registration order, the order backward
produces them, so every process has the same tensor-to-bucket map; and by default each top-k selection gives every tensor
its own quota (fusion="per_tensor"), so no tensor goes missing from the sum.
fusion="after_fusion" selects over the fused bucket instead, for comparison.
Error feedback stays in the worker daemons.

CUDA parameters go through host memory: each gradient is copied into its
bucket as backward produces it (a copy that waits for the GPU) and the result
back; the selection then runs in the worker daemon. Not yet run with a
PyTorch that has CUDA.
"""

from gradmesh.torch import elastic
from gradmesh.torch.ddp import HookState, allreduce_hook
from gradmesh.torch.optimizer import (DistributedOptimizer,
                                      broadcast_optimizer_state)

__all__ = ["DistributedOptimizer", "HookState", "allreduce_hook",
           "broadcast_optimizer_state", "elastic"]
