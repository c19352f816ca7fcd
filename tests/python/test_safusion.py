"""SAFusion's per-tensor quotas, run by every process of a SparDL cluster at
1% density:

    gradmesh run --workers=4 --algo=spardl --density=0.01 -- \\
        python3 -m pytest tests/python/test_safusion.py

A model with a small layer beside a large one, the small layer's gradients a
thousandth of the large one's: fused into one bucket and sparsified after
fusion, the small layer never makes the top 1% (it goes missing from every
step's sum); with a quota per tensor it is in every step's sum.
"""

import pytest
import torch
import torch.nn as nn

import gradmesh
import gradmesh.torch


@pytest.fixture(scope="session", autouse=True)
def cluster():
    gradmesh.init(timeout=60)
    yield
    gradmesh.barrier()


class SmallBesideLarge(nn.Module):
    def __init__(self):
        super().__init__()
        self.large = nn.Linear(512, 8)
        self.small = nn.Linear(512, 1)

    def forward(self, x):
        return self.large(x).sum(1, keepdim=True) + 1e-3 * self.small(x)


def missing_per_step(fusion, steps=4):
    torch.manual_seed(3)
    model = SmallBesideLarge()
    optimizer = gradmesh.torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01),
        named_parameters=model.named_parameters(), num_buckets=1,
        fusion=fusion, exact_tensors_below=0)  # the small layer sparse too
    generator = torch.Generator().manual_seed(gradmesh.rank())
    missing = []
    for _ in range(steps):
        x = torch.randn(16, 512, generator=generator)
        y = torch.randn(16, 1, generator=generator)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        (info,) = optimizer.last_infos
        assert info.tensors == 4 and info.algorithm == "spardl"
        missing.append(info.tensors_missing)
    return missing


def test_per_tensor_quotas_leave_no_tensor_missing():
    assert missing_per_step("per_tensor") == [0, 0, 0, 0]


def test_sparsify_after_fusion_misses_the_small_layer():
    missing = missing_per_step("after_fusion")
    assert all(m >= 1 for m in missing), missing
