"""Elastic training: a job that goes on when a member leaves or returns.

    state = gradmesh.torch.elastic.TorchState(model, optimizer, epoch=0)

    @gradmesh.torch.elastic.run(state)
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for x, y in loader:
                ...                       # forward, backward, step
            state.commit()                # every process, at the same point

    train()

When a member's trainer stalls (the workers' --step-join-timeout), a worker
restarts, or a step's outcome is lost, the steps of the job fail alike on
every process with FAILED_PRECONDITION or DATA_LOSS. run() then, on every
process, surviving or returning: restores the last commit, registers the
optimizer's buckets again, takes the state of the process with the newest
commit (the lowest rank among them) and calls train(state) again, which
goes on from the restored counters. The steps since the last commit are done
again (Horovod's elastic mode does the same).

The residuals follow the optimizer's checkpoint rules
(gradmesh/torch/checkpoint.py): commit() gathers every process's with
optimizer.state_dict(), and restore() gives each process its own back (in a
group of another size, the mean). A process that starts without a commit
(a restarted one) starts with none.
"""

import copy
import functools
import time

import numpy as np

import gradmesh

# Errors after which the job can go on from the last commit: a membership
# change, a replica behind, or a step cut by a member that went away.
RECOVERABLE = ("FAILED_PRECONDITION", "DATA_LOSS", "ABORTED", "UNAVAILABLE",
               "DEADLINE_EXCEEDED")


class TorchState:
    """The model, its DistributedOptimizer and counters (epoch=0, batch=0,
    ...), read and written as attributes, that run() restores and
    synchronizes."""

    def __init__(self, model, optimizer, **counters):
        if not hasattr(optimizer, "register_again"):
            raise gradmesh._wrong_type(
                "TorchState needs a gradmesh.torch.DistributedOptimizer")
        self.__dict__["_fixed"] = {"model": model, "optimizer": optimizer}
        self.__dict__["_counters"] = dict(counters)
        self.__dict__["_saved"] = None
        self.__dict__["commits"] = 0

    def __getattr__(self, name):
        if name in self._fixed:
            return self._fixed[name]
        if name in self._counters:
            return self._counters[name]
        raise AttributeError(name)

    def __setattr__(self, name, value):
        if name in self._fixed or name == "commits":
            raise AttributeError(f"{name} is not a counter")
        self._counters[name] = value

    def commit(self):
        """Saves the model, the optimizer (residuals gathered: collective,
        every process at the same point) and the counters in memory."""
        self.__dict__["_saved"] = {
            "model": copy.deepcopy(self.model.state_dict()),
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "counters": copy.deepcopy(self._counters),
        }
        self.__dict__["commits"] += 1

    def restore(self):
        """Back to the last commit (nothing, before the first); the
        optimizer's buckets are registered again first (collective)."""
        self.optimizer.register_again()
        saved = self._saved
        if saved is None:
            return
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self._counters.clear()
        self._counters.update(copy.deepcopy(saved["counters"]))

    def sync(self):
        """Every process takes the parameters, the optimizer's state (not
        the residuals) and the counters of the process with the most
        commits (the lowest rank among them). Collective."""
        commits = gradmesh.allgather(np.array([self.commits], np.float32),
                                     name="gradmesh-elastic.commits")
        root = int(np.argmax(commits))
        gradmesh.broadcast_parameters(self.model.state_dict(), root_rank=root)
        from gradmesh.torch.optimizer import broadcast_optimizer_state
        broadcast_optimizer_state(self.optimizer, root_rank=root)
        counters, count = gradmesh.broadcast_object(
            (dict(self._counters), int(commits[root])), root_rank=root)
        self._counters.clear()
        self._counters.update(counters)
        self.__dict__["commits"] = count


def run(state, max_resets=100, log=print):
    """Decorates train(state, ...): synchronizes the state first, then
    calls it, and after a recoverable error (RECOVERABLE) restores the last
    commit, registers again, synchronizes and calls it again, up to
    `max_resets` times. Other errors, and the one past the limit, are
    raised."""

    def decorate(train):
        @functools.wraps(train)
        def wrapper(*args, **kwargs):
            resets = 0
            _sync_retrying(state, log)
            while True:
                try:
                    return train(state, *args, **kwargs)
                except gradmesh.GradmeshError as error:
                    code = getattr(error, "code", "")
                    if code not in RECOVERABLE or resets >= max_resets:
                        raise
                    resets += 1
                    log(f"gradmesh.elastic: reset {resets} after {code}: "
                        f"{error}")
                    _reset(state, log)

        return wrapper

    return decorate


def _reset(state, log):
    """restore() and sync(), again while the membership keeps changing."""
    for attempt in range(20):
        try:
            gradmesh._forget_buckets()
            state.restore()
            state.sync()
            return
        except gradmesh.GradmeshError as error:
            if getattr(error, "code", "") not in RECOVERABLE:
                raise
            log(f"gradmesh.elastic: the group is still changing "
                f"({error}); again")
            time.sleep(min(2.0, 0.2 * (attempt + 1)))
    raise gradmesh._error("UNAVAILABLE",
                          "elastic: the group did not settle in 20 tries")


def _sync_retrying(state, log):
    try:
        state.sync()
    except gradmesh.GradmeshError as error:
        if getattr(error, "code", "") not in RECOVERABLE:
            raise
        _reset(state, log)
