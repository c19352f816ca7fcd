"""A DistributedOptimizer's per-process state in a checkpoint.

The residuals (in the workers) and a momentum correction's state are each
process's own. state_dict() gathers every process's into one table, the
same on every process, so that rank 0 alone can save the checkpoint; and
load_state_dict() gives each process its own row back. Restored in a job
of another size, each process gets what keeps the next sum unchanged: under
op Average the mean of the saved rows, under Sum their sum divided by the
new size; a correction's own state (Adam's moments) takes the mean.

    "gradmesh": {"world_size": P, "keys": [key, ...],
                 "sizes": [values, ...], "rows": float32 tensor (P, total)}
"""

import numpy as np
import torch

import gradmesh

# Values a gather sends at once, for all processes together (16 MiB).
_CHUNK_VALUES = 1 << 22
# Keys whose rows enter the sum (kept in their total), by prefix.
_SUMMED = ("residual/", "velocity/")


def _gather_rows(name, flat):
    """Every process's float32 vector `flat` (equal sizes), as rows in rank
    order: in chunks, each process writes its part into zeros and an exact
    sum joins them (one bucket of at most _CHUNK_VALUES, reused)."""
    p, r = gradmesh.size(), gradmesh.rank()
    total = flat.size
    chunk = max(1, min(total, _CHUNK_VALUES // p))
    rows = np.empty((p, total), np.float32)
    padded = np.zeros((p, chunk), np.float32)
    for start in range(0, total, chunk):
        part = flat[start:start + chunk]
        padded[r, :] = 0.0
        padded[r, :part.size] = part
        summed = gradmesh._exact_sum(name, padded).reshape(p, chunk)
        rows[:, start:start + part.size] = summed[:, :part.size]
    return rows


def gather(name, tensors):
    """The table of every process's `tensors` ([(key, tensor)], the same
    keys and sizes on every process). Collective: every process calls it at
    the same point."""
    flat = np.concatenate(
        [t.detach().to("cpu", torch.float32).reshape(-1).numpy()
         for _, t in tensors] or [np.zeros(0, np.float32)])
    try:
        rows = _gather_rows(name, flat) if flat.size else np.zeros(
            (gradmesh.size(), 0), np.float32)
    except gradmesh.GradmeshError as e:
        raise gradmesh._error(
            e.code, "state_dict() gathers every process's residuals: call it "
            "on every process at the same point (then save on one); " +
            str(e)) from e
    return {"world_size": gradmesh.size(),
            "keys": [key for key, _ in tensors],
            "sizes": [t.numel() for _, t in tensors],
            "rows": torch.from_numpy(rows)}


def mine(table, tensors, op):
    """This process's part of `table` (what gather() returned), as one
    float32 array per tensor of `tensors`; checked against them first
    (InvalidArgument, nothing changed)."""
    keys = [key for key, _ in tensors]
    sizes = [t.numel() for _, t in tensors]
    if table.get("keys") != keys or table.get("sizes") != sizes:
        raise gradmesh._invalid(
            "the checkpoint's per-process state does not match this "
            "optimizer (other parameters, buckets or correction)")
    rows = table["rows"].detach().to(torch.float32).numpy()
    if rows.ndim != 2 or rows.shape[1] != sum(sizes) or (
            rows.shape[0] != table.get("world_size")):
        raise gradmesh._invalid("the checkpoint's table of rows is malformed")
    if not np.isfinite(rows).all():
        raise gradmesh._invalid("the checkpoint holds non-finite residuals")
    ends = np.cumsum(sizes)
    return [_row_for(rows[:, end - size:end], key, op)
            for key, size, end in zip(keys, sizes, ends)]


def _row_for(columns, key, op):
    """This process's values of one tensor from every saved process's."""
    if columns.shape[0] == gradmesh.size():
        return columns[gradmesh.rank()].copy()
    if key.startswith(_SUMMED) and op == gradmesh.Sum:
        return (columns.sum(0, dtype=np.float64) /
                gradmesh.size()).astype(np.float32)
    return columns.mean(0, dtype=np.float64).astype(np.float32)
