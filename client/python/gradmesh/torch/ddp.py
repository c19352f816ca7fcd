"""DDP's communication hook through gradmesh.

    ddp.register_comm_hook(gradmesh.torch.HookState(),
                           gradmesh.torch.allreduce_hook)

DDP's process group then only broadcasts the initial parameters; gradients go
through gradmesh, one gradmesh bucket per DDP bucket.
"""

import itertools
import queue
import threading

import torch

import gradmesh

_instances = itertools.count()  # names hook states apart, in creation order


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
            raise gradmesh._error("FAILED_PRECONDITION",
                                  "DDP bucket size changed")
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
