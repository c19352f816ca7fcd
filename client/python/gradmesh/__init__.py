"""gradmesh for Python: sum gradients across workers through the node's daemon.

Horovod's conventions, over gradmesh's C++ SDK (the extension _gradmesh):

    import gradmesh
    gradmesh.init()                      # from the env `gradmesh run` sets
    print(gradmesh.rank(), gradmesh.size())
    total = gradmesh.allreduce(tensor, name="grad", op=gradmesh.Sum)
    h = gradmesh.allreduce_async(tensor, name="other")
    ...
    mean = gradmesh.synchronize(h)
    loss = gradmesh.allreduce(loss, name="loss", exact=True)
    rows = gradmesh.allgather(tensor, name="rows")
    config = gradmesh.broadcast_object(config, root_rank=0)
    gradmesh.broadcast_parameters(model.state_dict(), root_rank=0)

For PyTorch training, gradmesh.torch has DistributedOptimizer and a DDP
communication hook.

Tensors are float32 numpy arrays or CPU torch tensors. Each named tensor is
a bucket of the job in shared memory with the worker: the values go in with
one copy and the result comes back with one (none for a tensor from
gradmesh.buffer(), which already lives there). The sum is of the values the
cluster's algorithm selects (SparDL at 1% by default); what is not selected
stays in the worker's residual and joins a later step (error feedback), so
nothing is lost. Tensors smaller than the plan's exact_below (16384 values
by default: metrics, biases, norms), and any all-reduce with exact=True, are
summed exactly instead: every value, the same bits on every process.

Every error this package raises is a GradmeshError, whose .code is the
status code's name: "ABORTED" (membership changed: go on with the next
step), "UNAVAILABLE", "DEADLINE_EXCEEDED", "INVALID_ARGUMENT" (bad input,
buckets that differ between processes, NaN or Inf in a gradient; also a
ValueError or TypeError), "FAILED_PRECONDITION" (a call out of order),
"DATA_LOSS" (a replica may differ from the others, as after a member was out
of the group and came back: on every process at the same step, naming a
rank to broadcast the parameters from; a process whose
own step ended in it alone goes on, and meets it at the next step). When
this process's own worker is gone, the error is a WorkerGoneError (a
GradmeshError): stop; the other processes go on without this one, and
`gradmesh run` lets them.
"""

import os
import pickle
import re
import threading
import time

import numpy as np

from gradmesh._gradmesh import (  # noqa: F401  (re-exported)
    Client,
    GradmeshError,
    Handle,
    Plan,
    ReduceInfo,
    TensorSet,
    WorkerGoneError,
)

Sum = "sum"
Average = "mean"
Min = "min"  # exact: through allgather
Max = "max"


class GradmeshValueError(GradmeshError, ValueError):
    """Bad input (code "INVALID_ARGUMENT")."""


class GradmeshTypeError(GradmeshError, TypeError):
    """An argument of the wrong type (code "INVALID_ARGUMENT")."""


def _error(code, message, kind=GradmeshError, local=True):
    """A GradmeshError (or `kind`, a subclass) with .code set; `local`
    (.local): one of this package's own checks, not the group's state."""
    error = kind(f"gradmesh: {message}")
    error.code = code
    error.local = local
    return error


def _invalid(message):
    return _error("INVALID_ARGUMENT", message, GradmeshValueError)


def _wrong_type(message):
    return _error("INVALID_ARGUMENT", message, GradmeshTypeError)

_lock = threading.Lock()
_client = None
_buckets = {}  # name -> _Bucket
_broadcasts = 0


# Buckets gradmesh itself registers (broadcasts, optimizers, DDP hooks) are
# named under this prefix, which user tensor names may not use.
_RESERVED = "gradmesh."


class _Bucket:
    """A registered tensor set, the next step number of its name and the
    operation in flight on it (its memory is the worker's until waited)."""

    def __init__(self, tensor_set, exact=False):
        self.set = tensor_set
        self.exact = exact
        self.values = tensor_set.values()
        self.step = 0
        self.pending = None

    def next_step(self):
        step = self.step
        self.step += 1
        return step


# Where a node's workers serve the SDK when nothing names one: torchrun
# sets LOCAL_RANK, and its copy r talks to worker-r.sock; a pod with one
# worker (deploy/k8s) has worker.sock.
SOCKET_DIR = "/run/gradmesh"


def _default_job():
    """$GRADMESH_JOB, else under torchrun a name of its run, the same in
    every process: TORCHELASTIC_RUN_ID (--rdzv_id), else MASTER_ADDR and
    MASTER_PORT."""
    job = os.environ.get("GRADMESH_JOB", "")
    if job or "MASTER_ADDR" not in os.environ:
        return job
    run = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    name = (f"torchrun-{run}" if run != "none" else
            f"torchrun-{os.environ['MASTER_ADDR']}-"
            f"{os.environ.get('MASTER_PORT', '')}")
    return name.replace("/", "-")


def _default_worker(deadline=None):
    """$GRADMESH_WORKER, else the socket of $LOCAL_RANK in
    $GRADMESH_SOCKET_DIR (default SOCKET_DIR): worker-<LOCAL_RANK>.sock, or
    worker.sock where LOCAL_RANK is unset. Waits for it to appear until
    `deadline` (time.monotonic(); None: looks once)."""
    worker = os.environ.get("GRADMESH_WORKER", "")
    if worker:
        return worker
    folder = os.environ.get("GRADMESH_SOCKET_DIR") or SOCKET_DIR
    local = os.environ.get("LOCAL_RANK")
    if local is not None and not re.fullmatch(r"[0-9]+", local):
        raise _error("FAILED_PRECONDITION",
                     f"LOCAL_RANK={local!r} is not a number")
    path = os.path.join(folder, "worker.sock" if local is None else
                        f"worker-{int(local)}.sock")
    while not os.path.exists(path):
        if deadline is None or time.monotonic() >= deadline:
            raise _error(
                "FAILED_PRECONDITION",
                f"init() found no worker: no {path} (start this node's "
                f"workers with --sdk_socket={path}, as the user running "
                "this), no $GRADMESH_WORKER, not under `gradmesh run`; or "
                "pass worker= ('unix:/path' or 'host:port')")
        time.sleep(0.1)
    return f"unix:{path}"


def init(worker=None, job=None, timeout=300.0):
    """Connects to this node's worker and waits until it is in a view.

    worker and job default to $GRADMESH_WORKER and $GRADMESH_JOB, which
    `gradmesh run` sets; under torchrun (no $GRADMESH_WORKER) to the socket
    of $LOCAL_RANK in /run/gradmesh (worker-<LOCAL_RANK>.sock; worker.sock
    without LOCAL_RANK), waited for within `timeout`, and a job named after
    torchrun's run. A worker reached over TCP (host:port) wants its SDK
    token in $GRADMESH_TOKEN. Calling init again is a no-op.
    """
    global _client
    if _client is not None:
        return _client
    start = time.monotonic()
    worker = worker or _default_worker(deadline=start + timeout)
    job = job or _default_job()
    timeout = max(1.0, timeout - (time.monotonic() - start))
    with _lock:
        if _client is None:
            _client = Client.connect(worker, job, timeout)
    return _client


def shutdown():
    """Forgets every bucket (their residuals too) and disconnects."""
    global _client
    with _lock:
        _buckets.clear()
        _client = None


def _forget_buckets():
    """Forgets the buckets of allreduce and allgather by name and numbers
    broadcasts from 0 again: after a new membership, every process
    registers them again, alike (gradmesh.torch.elastic)."""
    global _broadcasts
    with _lock:
        _buckets.clear()
        _broadcasts = 0


def _the_client():
    if _client is None:
        raise _error("FAILED_PRECONDITION",
                     "gradmesh.init() has not been called")
    return _client


def is_initialized():
    return _client is not None


def rank():
    """This process's rank in the worker group (as of the latest call)."""
    return _the_client().rank


def size():
    """The number of workers."""
    return _the_client().size


def local_rank():
    """The rank among this node's processes ($GRADMESH_LOCAL_RANK, else
    torchrun's $LOCAL_RANK)."""
    return int(os.environ.get("GRADMESH_LOCAL_RANK",
                              os.environ.get("LOCAL_RANK", "0")))


def plan():
    """The worker's current view and plan (algorithm, density, d, ...)."""
    return _the_client().plan()


def barrier():
    """Returns when every process has called barrier()."""
    _the_client().barrier()


def register(name, tensors, fusion="per_tensor", exact=False,
             exact_tensors=0):
    """Registers bucket `name` of [(tensor_name, size), ...] float32 tensors.

    fusion: "per_tensor" (each top-k selection gives every tensor its own
    quota, so none goes missing) or "after_fusion" (one top-k over the fused
    bucket). exact: always summed exactly (dense), whatever the plan.
    exact_tensors: the last this many tensors are summed exactly, the rest
    by the plan, in one operation a step. Every process registers the same
    buckets in the same order. Returns the TensorSet; gradmesh.torch uses
    this directly.
    """
    return _the_client().register(name, list(tensors), fusion, exact,
                                  exact_tensors)


def _as_array(tensor):
    """A float32 numpy view of a numpy array or CPU torch tensor."""
    if isinstance(tensor, np.ndarray):
        array = tensor
    elif hasattr(tensor, "numpy") and hasattr(tensor, "is_cuda"):
        if tensor.is_cuda:
            raise _wrong_type("a CUDA tensor cannot be shared with the worker "
                              "in place; pass tensor.cpu() (the optimizer "
                              "and hook copy CUDA gradients for you)")
        array = tensor.detach().numpy()
    else:
        raise _wrong_type("expected a numpy array or a torch tensor, not "
                          f"{type(tensor).__name__}")
    if array.dtype != np.float32:
        raise _wrong_type(f"tensors must be float32, not {array.dtype}")
    return array


def _check_name(name):
    if not name:
        raise _invalid("every tensor needs a name=, the same on every process")
    if name.startswith(_RESERVED):
        raise _invalid(f"names starting with '{_RESERVED}' are gradmesh's own")


def _bucket_for(name, size, exact=False, resize=False):
    """The bucket of `name` (registered on first use). A bucket of gradmesh's
    own may change size (`resize`: registered again, on every process
    alike); a user's may not."""
    with _lock:  # held through registration: one bucket per name
        bucket = _buckets.get(name)
        if resize and bucket is not None and bucket.set.size != size:
            # Unregistered (the set's last reference) before the new one
            # registers: the worker knows buckets by name.
            del _buckets[name]
            bucket = None
        if bucket is None:
            bucket = _Bucket(register(name, [(name, size)], exact=exact),
                             exact)
            _buckets[name] = bucket
    if bucket.set.size != size:
        raise _invalid(f"tensor '{name}' had {bucket.set.size} values, now "
                       f"{size}")
    if bucket.exact != exact:
        raise _invalid(f"tensor '{name}' was all-reduced with exact="
                       f"{bucket.exact}, now exact={exact}")
    return bucket


def buffer(name, shape):
    """A torch tensor (or numpy array without torch) in the shared memory of
    bucket `name`: write a gradient into it and allreduce it with no copy."""
    _check_name(name)
    count = int(np.prod(shape))
    values = _bucket_for(name, count).values.reshape(shape)
    try:
        import torch
        return torch.from_numpy(values)
    except ImportError:
        return values


class _Pending:
    """What synchronize() needs: the handle, the bucket and the output."""

    def __init__(self, handle, bucket, output):
        self.handle = handle
        self.bucket = bucket
        self.output = output
        self.info = None  # the ReduceInfo, once synchronized


def allreduce_async(tensor, name=None, op=Average, exact=False):
    """Starts summing (op=gradmesh.Sum) or averaging `tensor` across the
    workers under `name`; returns a handle for synchronize(). The tensor is
    read now; it is not changed. exact=True sums every value exactly,
    whatever the plan (as for any tensor below the plan's exact_below); a
    name is always exact or never. Min and Max are allreduce()'s alone."""
    if op not in (Sum, Average):
        raise _invalid(f"allreduce_async takes op=gradmesh.Sum or "
                       f"gradmesh.Average, not {op!r} (Min and Max: "
                       "allreduce())")
    array = _as_array(tensor)
    _check_name(name)
    bucket = _bucket_for(name, array.size, exact=exact)
    if bucket.pending is not None:
        raise _error("FAILED_PRECONDITION", f"an allreduce of '{name}' is "
                     "still in flight; synchronize() it first")
    flat = bucket.values
    if not np.shares_memory(array, flat):
        np.copyto(flat, array.reshape(-1))
    handle = _the_client().allreduce_async(bucket.set, bucket.next_step(), op)
    bucket.pending = _Pending(handle, bucket, tensor)
    return bucket.pending


def synchronize(pending):
    """Waits for an allreduce_async and returns the result, a new tensor of
    the input's type and shape (the shared buffer itself for a tensor from
    gradmesh.buffer()); the handle's .info then holds the ReduceInfo (bytes,
    algorithm, ...). Raises GradmeshError if the step failed."""
    try:
        pending.info = pending.handle.wait()
    finally:
        pending.bucket.pending = None
    flat = pending.bucket.values
    array = _as_array(pending.output)
    if np.shares_memory(array, flat):
        return pending.output
    return _like(pending.output, flat.reshape(array.shape).copy())


def _like(tensor, array):
    """`array` as the type of `tensor` (a numpy array or a torch tensor)."""
    if isinstance(tensor, np.ndarray):
        return array
    import torch
    return torch.from_numpy(array)


def allreduce(tensor, name=None, op=Average, exact=False):
    """allreduce_async + synchronize; op may also be gradmesh.Min or
    gradmesh.Max (exact, through allgather)."""
    if op in (Min, Max):
        array = _as_array(tensor)
        _check_name(name)
        rows = _gather(f"{op}.{name}", array.reshape(1, -1))
        reduce = np.min if op == Min else np.max
        return _like(tensor, reduce(rows, axis=0).reshape(array.shape))
    return synchronize(allreduce_async(tensor, name=name, op=op, exact=exact))


def _exact_sum(key, values):
    """The exact sum of float32 `values` across processes, through bucket
    `key` (gradmesh's own; registered again when the size changes)."""
    return _sum_exactly(_bucket_for(key, values.size, exact=True,
                                    resize=True), values)


def _sum_exactly(bucket, values):
    """The exact sum of float32 `values` across processes, through the
    exact `bucket` of their size."""
    np.copyto(bucket.values, values.reshape(-1))
    client = _the_client()
    bucket.pending = client.allreduce_async(bucket.set, bucket.next_step(),
                                            Sum)
    try:
        bucket.pending.wait()
    except GradmeshError:
        # A failed step keeps its values for the next; these are not sums
        # to carry (row counts, padded rows): drop them.
        client.load_residual(bucket.set, np.zeros(values.size, np.float32))
        raise
    finally:
        bucket.pending = None
    return bucket.values.copy()


def _gather(key, array):
    """Every process's `array` (rows of equal width), concatenated in rank
    order: each writes its rows into zeros and an exact sum joins them."""
    p, r = size(), rank()
    width = int(np.prod(array.shape[1:]))
    shapes = np.zeros(2 * p, np.float32)  # exact below 2^24
    shapes[2 * r:2 * r + 2] = min(array.shape[0], 1 << 24), min(width, 1 << 24)
    shapes = _exact_sum(f"{_RESERVED}shape.{key}", shapes).astype(np.int64)
    rows, widths = shapes[0::2], shapes[1::2]
    # Every process raises alike: the checks read the exchanged shapes.
    if np.any(widths != widths[0]):
        raise _invalid(f"allgather: the rows differ in size between "
                       f"processes ({widths.tolist()})")
    if np.any(rows >= 1 << 24) or np.any(widths >= 1 << 24):
        raise _invalid("allgather takes fewer than 2^24 rows of fewer than "
                       "2^24 values")
    total, first = int(rows.sum()), int(rows[:r].sum())
    if total == 0:
        return np.zeros((0,) + array.shape[1:], np.float32)
    padded = np.zeros(total * width, np.float32)
    padded[first * width:(first + array.shape[0]) * width] = array.reshape(-1)
    joined = _exact_sum(f"{_RESERVED}{key}", padded)
    return joined.reshape((total,) + array.shape[1:])


def allgather(tensor, name=None):
    """Every process's `tensor` concatenated along the first dimension, in
    rank order (first dimensions may differ, the others must match), of the
    input's type; exact. A zero's sign is not kept; NaN and Inf are refused
    as in allreduce."""
    array = _as_array(tensor)
    _check_name(name)
    if array.ndim == 0:
        array = array.reshape(1)
    return _like(tensor, _gather(f"gather.{name}", array))


def broadcast_object(obj, root_rank=0):
    """root_rank's `obj` on every process (pickled: only for a job's own
    processes, which trust each other). The root gets `obj` itself."""
    mine = rank() == root_rank
    payload, failure = b"", None
    if mine:
        try:
            payload = pickle.dumps(obj)
        except Exception as e:  # noqa: BLE001 (every process raises it)
            failure = e
    length = np.array([-1 if failure else len(payload)], np.int64)
    _broadcast_bytes([length.view(np.uint8)], root_rank)
    if length[0] < 0:
        raise _invalid(f"broadcast_object: the root could not pickle the "
                       f"object: {failure or 'see the root'}")
    data = (np.frombuffer(payload, np.uint8).copy() if mine
            else np.empty(int(length[0]), np.uint8))
    _broadcast_bytes([data], root_rank)
    return obj if mine else pickle.loads(data.tobytes())


def _broadcast_bytes(views, root_rank):
    """Copies the uint8 arrays `views` from root_rank to every process, in
    place, through one float32 bucket (a broadcast copies bits)."""
    global _broadcasts
    client = _the_client()
    total = sum(v.size for v in views)
    if total == 0:
        return
    with _lock:
        number = _broadcasts
        _broadcasts += 1
    words = (total + 3) // 4
    tensor_set = client.register(f"{_RESERVED}broadcast.{number}",
                                 [("bytes", words)], "per_tensor")
    raw = tensor_set.values().view(np.uint8)
    offset = 0
    for v in views:
        raw[offset:offset + v.size] = v
        offset += v.size
    client.broadcast(tensor_set, root_rank)
    offset = 0
    for v in views:
        v[:] = raw[offset:offset + v.size]
        offset += v.size


def broadcast_parameters(params, root_rank=0):
    """Overwrites `params` (a state_dict, or (name, tensor) pairs such as
    model.named_parameters()) with root_rank's values, in place: torch
    tensors of any dtype and layout (CUDA ones through a host copy) and numpy
    arrays; other entries (not tensors) are left alone. Call it on every
    process, with the same names."""
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = sorted(list(params), key=lambda item: item[0])
    views, write_back = [], []
    for _, p in items:
        if isinstance(p, np.ndarray):
            if not p.flags["C_CONTIGUOUS"]:
                raise _invalid("broadcast_parameters needs contiguous numpy "
                               "arrays")
            views.append(p.reshape(-1).view(np.uint8))
        elif hasattr(p, "is_cuda") and hasattr(p, "contiguous"):
            import torch
            data = p.detach()
            # CUDA tensors go through a host copy, written back afterwards.
            flat = data.contiguous().reshape(-1).cpu()
            views.append(flat.view(torch.uint8).numpy())
            if flat.data_ptr() != data.data_ptr() or not data.is_contiguous():
                write_back.append((data, flat))
    _broadcast_bytes(views, root_rank)
    for data, flat in write_back:
        data.copy_(flat.view(data.shape))
