"""Elastic training: a job that goes on when a member leaves or returns.

    state = gradmesh.torch.elastic.TorchState(model, optimizer, epoch=0)

    @gradmesh.torch.elastic.run(state)
    def train(state):
        while state.epoch < epochs:
            for x, y in loader:
                ...                       # forward, backward, step
            state.epoch += 1
            state.commit()                # every process, at the same point

    train()

When a member's trainer stalls (the workers' --step_join_timeout_s), a
worker restarts, or a step's outcome is lost, the steps of the job fail
alike on every process with FAILED_PRECONDITION or DATA_LOSS. run() then,
on every process, surviving or returning: restores the last commit,
registers the optimizer's buckets again, takes the state of the process
with the newest commit (the lowest rank among them) and calls train(state)
again, which goes on from the restored counters (so a commit comes after
the counters say where to go on from). The steps since the last commit are
done again (Horovod's elastic mode does the same).

The residuals follow the optimizer's checkpoint rules
(gradmesh/torch/checkpoint.py): commit() gathers every process's with
optimizer.state_dict(), and restore() gives each process its own back (in a
group of another size, the mean). A process that starts without a commit
(a restarted one) starts with none.
"""

import copy
import functools
import re
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
        for name in counters:
            _check_counter(name)
        self.__dict__.update(model=model, optimizer=optimizer,
                             _counters=dict(counters), _saved=None,
                             commits=0)

    def __getattr__(self, name):
        counters = self.__dict__.get("_counters", {})
        if name in counters:
            return counters[name]
        raise AttributeError(name)

    def __setattr__(self, name, value):
        _check_counter(name)
        self._counters[name] = value

    def _snapshot(self):
        """The model, the optimizer (residuals gathered: collective) and
        the counters, copied."""
        return {
            "model": copy.deepcopy(self.model.state_dict()),
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "counters": copy.deepcopy(self._counters),
        }

    def commit(self):
        """Saves the model, the optimizer (residuals gathered: collective,
        every process at the same point) and the counters in memory."""
        self.__dict__["_saved"] = self._snapshot()
        self.__dict__["commits"] += 1

    def restore(self):
        """Back to the last commit (or the last sync()); the optimizer's
        buckets are registered again first (collective)."""
        self.optimizer.register_again()
        saved = self._saved
        if saved is None:
            return
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self._counters.clear()
        self._counters.update(copy.deepcopy(saved["counters"]))

    def sync(self, clear_from=None):
        """Every process takes the parameters, the optimizer's state (not
        the residuals) and the counters of the process with the most
        commits (the lowest rank among them), and saves them as its last
        commit. Collective. `clear_from`: a rank whose replica is whole, to
        broadcast from first (after DATA_LOSS, which refuses other calls
        until then)."""
        if clear_from is not None:
            gradmesh.broadcast_parameters(self.model.state_dict(),
                                          root_rank=clear_from)
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
        self.__dict__["_saved"] = self._snapshot()


def _check_counter(name):
    if name.startswith("_") or hasattr(TorchState, name) or name in (
            "model", "optimizer", "commits"):
        raise gradmesh._invalid(f"{name!r} cannot be a TorchState counter")


def _recoverable(error):
    """Whether the job can go on from the last commit after `error`: one
    of RECOVERABLE from a worker (not this package's own checks), and not
    this process's worker gone."""
    return (not isinstance(error, gradmesh.WorkerGoneError)
            and not getattr(error, "local", False)
            and getattr(error, "code", "") in RECOVERABLE)


def _whole_rank(error):
    """The rank a DATA_LOSS names as whole (0 when none is: any root)."""
    if getattr(error, "code", "") != "DATA_LOSS":
        return None
    found = re.search(r"replica is whole \(rank (\d+)\)", str(error))
    return int(found.group(1)) if found else 0


def run(state, max_resets=100, log=print):
    """Decorates train(state, ...): synchronizes the state first, then
    calls it, and after a recoverable error (RECOVERABLE, from a worker)
    restores the last commit, registers again, synchronizes and calls it
    again, up to `max_resets` times between two commits. Other errors
    (WorkerGoneError too), and the one past the limit, are raised."""

    def decorate(train):
        @functools.wraps(train)
        def wrapper(*args, **kwargs):
            resets, commits = 0, None
            _reset(state, log, restore=False)
            while True:
                error = None
                try:
                    return train(state, *args, **kwargs)
                except gradmesh.GradmeshError as e:
                    if not _recoverable(e):
                        raise
                    # Not its frames: they hold the old registrations.
                    error = e.with_traceback(None)
                if state.commits != commits:
                    resets, commits = 0, state.commits
                if resets >= max_resets:
                    raise error
                resets += 1
                log(f"gradmesh.elastic: reset {resets} after {error.code}: "
                    f"{error}")
                # Outside the except block: the failed call's frames (and
                # the old registrations they hold) are freed first.
                _reset(state, log, clear_from=_whole_rank(error))

        return wrapper

    return decorate


def _reset(state, log, restore=True, clear_from=None):
    """restore() (unless not `restore`) and sync(), again while the
    membership keeps changing."""
    for attempt in range(20):
        error = None
        try:
            if restore:
                gradmesh._forget_buckets()
                state.restore()
            state.sync(clear_from)
            return
        except gradmesh.GradmeshError as e:
            if not _recoverable(e):
                raise
            error = e.with_traceback(None)
        log(f"gradmesh.elastic: the group is still changing ({error}); "
            "again")
        restore, clear_from = True, _whole_rank(error)
        time.sleep(min(2.0, 0.2 * (attempt + 1)))
    raise gradmesh._error("UNAVAILABLE",
                          "elastic: the group did not settle in 20 tries "
                          "(are the others gone?)")
