"""A DistributedOptimizer's per-process state in a checkpoint.

The residuals (in the workers) and a momentum correction's state are each
process's own. state_dict() gathers every process's into one table, the
same on every process, so that rank 0 alone can save the checkpoint; and
load_state_dict() gives each process its own row back. Restored in a job
of another size, each process gets what keeps the next sum unchanged: under
op Average the mean of the saved rows, under Sum their sum divided by the
new size; a correction's own state (Adam's moments) takes the mean.

    "gradmesh": {"world_size": P, "keys": [key, ...],
                 "sizes": [values, ...], "rows": float32 tensor (P, total),
                 "params": [the parameters' names, in the residuals' order]}

The gather runs through one bucket per optimizer (Gather), registered with
the optimizer, so that a failed gather leaves every process's registrations
paired, and unregistered with it: up to 2^22 values (16 MiB) per process.
"""

import reprlib
import zlib

import numpy as np
import torch

import gradmesh

# Values a gather sends at once, for all processes together (16 MiB).
_CHUNK_VALUES = 1 << 22
# Keys whose rows enter the sum (kept in their total), by prefix.
_SUMMED = ("residual/", "velocity/")
# Each row starts with its length (low and high 24 bits) and a checksum of
# its keys, so that processes with different state fail alike.
_HEADER = 3


def _chunk(total):
    return max(1, min(total + _HEADER, _CHUNK_VALUES // gradmesh.size()))


class Gather:
    """The bucket through which an optimizer's state is gathered, registered
    once, on construction (on every process at the same point), for `total`
    values per process; a job grown or shrunk since sends smaller or larger
    chunks through it."""

    def __init__(self, name, total):
        size = gradmesh.size() * _chunk(total)
        self.bucket = gradmesh._Bucket(
            gradmesh.register(name, [(name, size)], exact=True), exact=True)


def _header(tensors):
    total = sum(t.numel() for _, t in tensors)
    layout = ";".join(f"{key}:{t.numel()}" for key, t in tensors)
    check = zlib.crc32(layout.encode()) & 0xFFFFFF  # exact in float32
    return np.array([total & 0xFFFFFF, total >> 24, check], np.float32)


def _gather_rows(bucket, flat):
    """Every process's float32 vector `flat`, as rows in rank order: in
    chunks, each process writes its part into zeros and an exact sum joins
    them. `flat` starts with the header: different headers raise alike on
    every process after the first chunk. ABORTED if the job's membership
    changes meanwhile."""
    p, r = gradmesh.size(), gradmesh.rank()
    chunk = bucket.set.size // p
    if chunk == 0:
        raise gradmesh._error("FAILED_PRECONDITION", "state_dict(): the job "
                              "outgrew the optimizer's gather bucket")
    total = flat.size
    rows = np.empty((p, total), np.float32)
    padded = np.zeros(bucket.set.size, np.float32)
    mine = padded[r * chunk:(r + 1) * chunk]
    for start in range(0, total, chunk):
        part = flat[start:start + chunk]
        mine[:] = 0.0
        mine[:part.size] = part
        summed = gradmesh._sum_exactly(bucket, padded)[:p * chunk]
        if (gradmesh.size(), gradmesh.rank()) != (p, r):
            raise gradmesh._error(
                "ABORTED", "state_dict(): the job's membership changed "
                "during the gather; call it again", local=False)
        rows[:, start:start + part.size] = summed.reshape(p, chunk)[
            :, :part.size]
        if start == 0 and not (rows[:, :_HEADER] == rows[0, :_HEADER]).all():
            raise gradmesh._invalid(
                "state_dict(): the processes' optimizers hold different "
                "state (other parameters, buckets or correction)")
    return rows[:, _HEADER:]


def gather(through, tensors):
    """The table of every process's `tensors` ([(key, tensor)], the same
    keys and sizes on every process), through Gather `through`. Collective:
    every process calls it at the same point."""
    p = gradmesh.size()
    flat = np.concatenate(
        [_header(tensors)] +
        [t.detach().to("cpu", torch.float32).reshape(-1).numpy()
         for _, t in tensors])
    try:
        rows = _gather_rows(through.bucket, flat)
    except gradmesh.GradmeshError as e:
        if e.code == "DEADLINE_EXCEEDED":
            e.add_note("state_dict() gathers every process's residuals: "
                       "call it on every process at the same point (then "
                       "save on one)")
        raise
    return {"world_size": p, "keys": [key for key, _ in tensors],
            "sizes": [t.numel() for _, t in tensors],
            "rows": torch.from_numpy(rows)}


def _checked_rows(table, keys, sizes):
    """The table's rows as a float32 array, once the table is well formed
    and matches `keys` and `sizes` (InvalidArgument otherwise)."""
    if not isinstance(table, dict) or not isinstance(
            table.get("rows"), torch.Tensor):
        raise gradmesh._invalid("the checkpoint's 'gradmesh' entry is not a "
                                "table of rows")
    try:
        same = list(table.get("keys", ())) == keys and [
            int(n) for n in table.get("sizes", ())] == sizes
    except (TypeError, ValueError):
        same = False
    if not same:
        raise gradmesh._invalid(
            "the checkpoint's per-process state does not match this "
            "optimizer (other parameters, buckets or correction)")
    world = table.get("world_size")
    rows = table["rows"].detach()
    if (type(world) is not int or world < 1 or rows.dtype != torch.float32
            or tuple(rows.shape) != (world, sum(sizes))):
        raise gradmesh._invalid("the checkpoint's table of rows is malformed "
                                f"(world_size {world!r}, rows "
                                f"{tuple(rows.shape)} of {rows.dtype})")
    rows = rows.to("cpu").numpy()
    if not np.isfinite(rows).all():
        raise gradmesh._invalid("the checkpoint holds non-finite residuals")
    return rows


def check_order(table, order, canonical):
    """InvalidArgument unless `table` lays the residuals out in the
    parameter order `order` (its "params", a list of names; a table without
    them, in `canonical`, the only order before exact_tensors_below): a
    checkpoint saved with another exact_tensors_below holds the same values
    in another order, which rebucketing cannot tell."""
    if not isinstance(table, dict):
        return  # _checked_rows says what is wrong
    saved = table.get("params", canonical)
    if not isinstance(saved, (list, tuple)) or not all(
            isinstance(name, str) for name in saved):
        raise gradmesh._invalid(
            "the checkpoint's 'params' is not a list of parameter names: "
            + reprlib.repr(saved))
    if list(saved) != list(order):
        raise gradmesh._invalid(
            "the checkpoint's residuals are laid out in another parameter "
            "order (saved with another exact_tensors_below, or with its "
            "default under another --density or --exact_below of the plan, "
            "or from another model): load it with the options it was saved "
            "with (exact_tensors_below=0: nothing summed apart, as in "
            "checkpoints of an earlier gradmesh)")


def _residual_count(keys):
    """How many keys lead with residual/0, residual/1, ... in order."""
    count = 0
    while count < len(keys) and keys[count] == f"residual/{count}":
        count += 1
    return count


def rebucketed(keys, sizes, saved_keys, saved_sizes, boundaries):
    """Whether state saved as (saved_keys, saved_sizes) holds the same
    columns as (keys, sizes) under other buckets: every optimizer cuts one
    parameter list, in one order, into consecutive buckets, so the residuals
    of a checkpoint saved with other buckets (num_buckets, or an earlier
    default) are the same values in the same order, named otherwise, with
    every saved bucket ending where a parameter ends (`boundaries`: the
    running sums of this optimizer's parameter sizes, in bucket order)."""
    mine, theirs = _residual_count(keys), _residual_count(saved_keys)
    ends = set(boundaries)
    return (keys[mine:] == saved_keys[theirs:]
            and sizes[mine:] == saved_sizes[theirs:]
            and sum(sizes[:mine]) == sum(saved_sizes[:theirs])
            and all(int(end) in ends
                    for end in np.cumsum(saved_sizes[:theirs])))


def _named_as(table, keys, sizes, boundaries):
    """`table`, its residual columns named as (keys, sizes) where only the
    buckets differ (rebucketed)."""
    try:
        saved_keys = list(table.get("keys", ()))
        saved_sizes = [int(n) for n in table.get("sizes", ())]
    except (AttributeError, TypeError, ValueError):
        return table  # _checked_rows says what is wrong
    if (len(saved_keys) != len(saved_sizes)
            or (saved_keys, saved_sizes) == (keys, sizes) or not rebucketed(
                keys, sizes, saved_keys, saved_sizes, boundaries)):
        return table
    return dict(table, keys=keys, sizes=sizes)


def mine(table, tensors, op, boundaries=()):
    """This process's part of `table` (what gather() returned), as one
    float32 array per tensor of `tensors`; checked against them first
    (InvalidArgument, nothing changed). A table saved with other buckets
    is read as this optimizer's (rebucketed, `boundaries`)."""
    keys = [key for key, _ in tensors]
    sizes = [t.numel() for _, t in tensors]
    rows = _checked_rows(_named_as(table, keys, sizes, boundaries), keys,
                         sizes)
    ends = np.cumsum(sizes, dtype=np.int64)
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


def own_table(tensors, values):
    """A table holding this process's `values` (one array per tensor) as its
    row: how an earlier per-process checkpoint is loaded."""
    rows = torch.zeros(gradmesh.size(), sum(t.numel() for _, t in tensors),
                       dtype=torch.float32)
    rows[gradmesh.rank()] = torch.cat(
        [torch.as_tensor(v, dtype=torch.float32).reshape(-1) for v in values])
    return {"world_size": gradmesh.size(), "keys": [k for k, _ in tensors],
            "sizes": [t.numel() for _, t in tensors], "rows": rows}
