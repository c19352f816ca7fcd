"""Training scripts as people write them, run by every process of a cluster:

    gradmesh run --workers=3 --algo=dense -- \\
        python3 -m pytest tests/python/test_training.py
    gradmesh run --workers=4 --algo=spardl --density=0.05 --exact_below=64 \\
        -- python3 -m pytest tests/python/test_training.py

Under the dense plan every result is checked against one process training
on all the ranks' batches (equal to float tolerance). Under a sparse plan
the checks are what must hold whatever is selected: identical parameters on
every rank, and the conservation of gradient mass (what the ranks put in =
what was applied + what the residuals hold).
"""

import os
import pickle
import shutil
import tempfile

import numpy as np
import pytest
import torch
import torch.nn as nn

import gradmesh
import gradmesh.torch

LR = 0.1


@pytest.fixture(scope="session", autouse=True)
def cluster():
    gradmesh.init(timeout=60)
    yield
    gradmesh.barrier()


def dense():
    return gradmesh.plan().algorithm == "dense"


def batch(rank, step):
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return (torch.randn(8, 6, generator=generator),
            torch.randn(8, 2, generator=generator))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.first = nn.Linear(6, 16)
        self.second = nn.Linear(16, 2)

    def forward(self, x):
        return self.second(torch.tanh(self.first(x)))


def loss_of(model, step, rank):
    x, y = batch(rank, step)
    return nn.functional.mse_loss(model(x), y)


def mean_gradient(model, step, passes=1):
    """The gradient of one process holding every rank's batches: the mean
    over ranks of each rank's sum over its `passes` backward passes."""
    model.zero_grad()
    for q in range(gradmesh.size()):
        for k in range(passes):
            (loss_of(model, passes * step + k, q) / gradmesh.size()).backward()
    return [None if p.grad is None else p.grad.clone()
            for p in model.parameters()]


def assert_identical_on_every_rank(model):
    for name, p in model.named_parameters():
        root = p.detach().clone()
        gradmesh.broadcast_parameters([(name, root)], root_rank=0)
        assert torch.equal(root, p.detach()), name


def assert_same(model, reference):
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def finish(optimizer, model, reference=None):
    """How every test ends: equal to the one-process reference (dense
    plan), identical on every rank; the optimizer closed."""
    if reference is not None and dense():
        assert_same(model, reference)
    assert_identical_on_every_rank(model)
    optimizer.close()


def descend(model, grads=None):
    """One plain SGD step of `model` on `grads` (default: its .grad)."""
    params = list(model.parameters())
    with torch.no_grad():
        for p, g in zip(params, grads or [q.grad for q in params]):
            if g is not None:
                p -= LR * g


def wrap(model, optimizer=None, **kwargs):
    """Two buckets of the model, none exact unless exact_tensors_below says
    (the default split has a test of its own)."""
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=LR)
    kwargs.setdefault("exact_tensors_below", 0)
    return gradmesh.torch.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), num_buckets=2,
        **kwargs)


def residual_total(optimizer):
    """The sum over ranks of this optimizer's residuals (state_dict()
    gathers every rank's; the residuals come first)."""
    table = optimizer.state_dict()["gradmesh"]
    width = sum(size for key, size in zip(table["keys"], table["sizes"])
                if key.startswith("residual/"))
    return table["rows"][:, :width].double().sum(0).numpy()


def test_backward_passes_per_step_sums_the_passes_and_reduces_once():
    r, passes = gradmesh.rank(), 3
    model, reference = Net(), Net()
    optimizer = wrap(model, backward_passes_per_step=passes)
    for step in range(2):
        optimizer.zero_grad()
        for k in range(passes):
            loss_of(model, passes * step + k, r).backward()
        optimizer.step()
        assert len(optimizer.last_infos) == 2
        if dense():
            descend(reference, mean_gradient(reference, step, passes))
    if dense():
        assert_same(model, reference)
    assert_identical_on_every_rank(model)
    optimizer.zero_grad()
    with pytest.raises(gradmesh.GradmeshError, match="more often") as error:
        for k in range(passes + 1):
            loss_of(model, k, r).backward()
    assert error.value.code == "FAILED_PRECONDITION"
    optimizer.close()


def test_clipping_after_backward_names_the_recipe_and_applies_nothing():
    r = gradmesh.rank()
    model = Net()
    optimizer = wrap(model)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.zero_grad()
    loss_of(model, 0, r).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
    with pytest.raises(gradmesh.GradmeshError, match="skip_synchronize") as e:
        optimizer.step()
    assert e.value.code == "FAILED_PRECONDITION"
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p, b)
    with pytest.raises(gradmesh.GradmeshError, match="failed synchronize"):
        optimizer.step()
    # A .grad replaced by another tensor is a change as well.
    optimizer.zero_grad(set_to_none=True)
    loss_of(model, 1, r).backward()
    model.first.weight.grad = model.first.weight.grad.clamp(-1e-3, 1e-3)
    with pytest.raises(gradmesh.GradmeshError, match="skip_synchronize"):
        optimizer.step()
    with pytest.raises(gradmesh.GradmeshError, match="add_param_group"):
        optimizer.add_param_group({"params": [nn.Parameter(torch.ones(1))]})
    optimizer.close()


def test_clipping_recipe_applies_the_clipped_reduced_gradient():
    r, max_norm = gradmesh.rank(), 0.05
    model, reference = Net(), Net()
    optimizer = wrap(model)
    for step in range(2):
        optimizer.zero_grad()
        loss_of(model, step, r).backward()
        optimizer.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        norm = torch.norm(torch.stack([p.grad.norm()
                                       for p in model.parameters()]))
        assert norm <= max_norm * 1.0001
        with optimizer.skip_synchronize():
            optimizer.step()
        if dense():
            mean_gradient(reference, step)
            torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm)
            descend(reference)
    finish(optimizer, model, reference)


class HalvingScaler:
    """A loss scaler whose scale changes every step (GradScaler's
    interface: get_scale, and unscale_ in place)."""

    def __init__(self):
        self.scale = 1024.0

    def get_scale(self):
        return self.scale

    def unscale_(self, optimizer):
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.div_(self.scale)

    def update(self):
        self.scale /= 2


def test_loss_scaling_hands_the_workers_true_units_while_the_scale_changes():
    r = gradmesh.rank()
    model, reference = Net(), Net()
    scaler = HalvingScaler()
    optimizer = wrap(model, grad_scaler=scaler)
    for step in range(3):
        optimizer.zero_grad()
        (loss_of(model, step, r) * scaler.get_scale()).backward()
        if step == 1:  # the recipe: synchronize, unscale, step
            optimizer.synchronize()
            scaler.unscale_(optimizer)
            with optimizer.skip_synchronize():
                optimizer.step()
        else:  # as GradScaler.step does: unscale, then step
            scaler.unscale_(optimizer)
            optimizer.step()
        scaler.update()
        if dense():
            descend(reference, mean_gradient(reference, step))
    if dense():
        assert_same(model, reference)
    else:  # residuals in true units: no larger than the gradients
        assert float(np.abs(residual_total(optimizer)).max()) < 10
    finish(optimizer, model)


def test_frozen_layers_stay_and_unfrozen_ones_are_reduced():
    r = gradmesh.rank()
    model, reference = Net(), Net()
    for p in list(model.first.parameters()) + list(
            reference.first.parameters()):
        p.requires_grad_(False)
    optimizer = wrap(model)
    frozen = [p.detach().clone() for p in model.first.parameters()]
    for step in range(4):
        if step == 2:
            for p in list(model.first.parameters()) + list(
                    reference.first.parameters()):
                p.requires_grad_(True)
        optimizer.zero_grad()
        loss_of(model, step, r).backward()
        optimizer.step()
        if step < 2:
            for p, f in zip(model.first.parameters(), frozen):
                assert torch.equal(p, f) and p.grad is None
        if dense():
            descend(reference, mean_gradient(reference, step))
    assert not all(torch.equal(p, f)
                   for p, f in zip(model.first.parameters(), frozen))
    finish(optimizer, model, reference)


def test_a_second_optimizer_on_the_same_model_works():
    r = gradmesh.rank()
    model = Net()
    first = wrap(model)
    for step in range(2):
        first.zero_grad()
        loss_of(model, step, r).backward()
        first.step()
    first.close()
    second = wrap(model, torch.optim.Adam(model.parameters(), lr=1e-3))
    for step in range(3):
        second.zero_grad()
        loss_of(model, step, r).backward()
        second.step()
    assert_identical_on_every_rank(model)
    second.close()
    # Without close(), dropping the optimizer removes its hooks as well.
    third = wrap(model)
    del third
    fourth = wrap(model)
    fourth.zero_grad()
    loss_of(model, 0, r).backward()
    fourth.step()
    fourth.close()


def test_a_failed_bucket_applies_nothing_and_loses_nothing():
    r = gradmesh.rank()
    model = Net()
    optimizer = wrap(model)  # two buckets: the second layer, the first
    before = [p.detach().clone() for p in model.parameters()]
    put_in = residual_total(optimizer)
    if r == 0:  # an Inf in the first layer's bucket on one rank
        model.first.bias.register_hook(
            lambda g: g.index_fill(0, torch.tensor([0]), float("inf")))
    optimizer.zero_grad()
    loss_of(model, 0, r).backward()
    grads = [p.grad.clone() for _, p in reversed(list(
        model.named_parameters()))]
    with pytest.raises(gradmesh.GradmeshError) as error:
        optimizer.step()
    assert error.value.code == "INVALID_ARGUMENT"
    with pytest.raises(gradmesh.GradmeshError, match="failed synchronize"):
        optimizer.step()
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p, b), "nothing is applied"
    # Conservation: every finite value the ranks put in is in a residual
    # (buckets in backward order: the residuals' order).
    flat = torch.cat([g.reshape(-1) for g in grads]).numpy()
    flat = np.where(np.isfinite(flat), flat, 0).astype(np.float32)
    total_in = gradmesh.allreduce(flat, name="put-in", op=gradmesh.Sum,
                                  exact=True)
    np.testing.assert_allclose(residual_total(optimizer) - put_in, total_in,
                               rtol=1e-5, atol=1e-5)
    optimizer.close()


def test_small_tensors_are_exact_under_any_plan():
    r, p = gradmesh.rank(), gradmesh.size()
    metric = np.array([r + 0.25, -r, 3.0], np.float32)
    total = gradmesh.allreduce(metric, name="metric", op=gradmesh.Sum)
    np.testing.assert_array_equal(
        total, np.array([sum(range(p)) + 0.25 * p, -sum(range(p)), 3.0 * p],
                        np.float32))
    big = np.arange(100_000, dtype=np.float32) * (r + 1)
    handle = gradmesh.allreduce_async(big, name="big-exact", op=gradmesh.Sum,
                                      exact=True)
    out = gradmesh.synchronize(handle)
    assert handle.info.algorithm == "dense"
    np.testing.assert_array_equal(
        out, np.arange(100_000, dtype=np.float32) * (p * (p + 1) // 2))
    for op, expected in ((gradmesh.Min, 0.0), (gradmesh.Max, float(p - 1))):
        got = gradmesh.allreduce(torch.full((2, 2), float(r)), name="mm",
                                 op=op)
        assert torch.equal(got, torch.full((2, 2), expected))


def test_allgather_joins_every_rank_in_rank_order():
    r, p = gradmesh.rank(), gradmesh.size()
    mine = torch.full((r + 1, 3), float(r))
    rows = gradmesh.allgather(mine, name="rows")
    expected = torch.cat([torch.full((q + 1, 3), float(q)) for q in range(p)])
    assert torch.equal(rows, expected)
    with pytest.raises(gradmesh.GradmeshError, match="differ"):
        gradmesh.allgather(torch.zeros(2, r + 1), name="ragged")


def test_broadcast_object_and_optimizer_state():
    r = gradmesh.rank()
    config = {"lr": 0.5, "layers": [r, "x" * (r * 7)], "rank": r}
    got = gradmesh.broadcast_object(config if r == 1 else None, root_rank=1)
    assert got == {"lr": 0.5, "layers": [1, "x" * 7], "rank": 1}
    assert pickle.dumps(got) == pickle.dumps(
        {"lr": 0.5, "layers": [1, "x" * 7], "rank": 1})
    model = Net()
    optimizer = wrap(model, torch.optim.Adam(model.parameters(), lr=1e-3))
    optimizer.zero_grad()
    loss_of(model, 0, r).backward()
    optimizer.step()
    for state in optimizer.state.values():  # make every rank's differ
        state["exp_avg"].add_(r)
    gradmesh.torch.broadcast_optimizer_state(optimizer, root_rank=0)
    for state in optimizer.state.values():
        root = state["exp_avg"].clone()
        gradmesh.broadcast_parameters([("m", root)], root_rank=0)
        assert torch.equal(root, state["exp_avg"])
    optimizer.close()


def test_module_errors_carry_a_code():
    with pytest.raises(ValueError) as error:
        gradmesh.allreduce(np.zeros(3, np.float32))
    assert isinstance(error.value, gradmesh.GradmeshError)
    assert error.value.code == "INVALID_ARGUMENT"
    with pytest.raises(TypeError) as error:
        gradmesh.allreduce(np.zeros(3), name="f64")
    assert error.value.code == "INVALID_ARGUMENT"
    with pytest.raises(gradmesh.GradmeshError, match="allreduce_async"):
        gradmesh.allreduce_async(np.zeros(3, np.float32), name="m",
                                 op=gradmesh.Max)


def test_momentum_correction_is_momentum_where_the_sum_is_exact():
    r = gradmesh.rank()
    model, reference = Net(), Net()
    sgd = dict(lr=LR, momentum=0.9, weight_decay=0.01)
    optimizer = wrap(model, torch.optim.SGD(model.parameters(), **sgd),
                     momentum_correction=True)
    plain = torch.optim.SGD(reference.parameters(), **sgd)
    for step in range(4):
        optimizer.zero_grad()
        loss_of(model, step, r).backward()
        optimizer.step()
        assert optimizer.param_groups[0]["momentum"] == 0.9
        if dense():
            mean_gradient(reference, step)
            plain.step()
    if dense():  # every bucket exact: the velocity sums to SGD's momentum
        assert_same(model, reference)
    finish(optimizer, model)
    with pytest.raises(ValueError, match="momentum"):
        wrap(model, torch.optim.RMSprop(model.parameters()),
             momentum_correction=True)
    with pytest.raises(ValueError, match="momentum_masking"):
        wrap(model, torch.optim.Adam(model.parameters()),
             momentum_correction=True, momentum_masking=True)


def test_a_parameter_used_in_fewer_passes_is_still_reduced():
    r, passes = gradmesh.rank(), 2
    model, reference = Net(), Net()
    optimizer = wrap(model, backward_passes_per_step=passes)

    def second_only(net, q):  # a pass that leaves the first layer out
        x, _ = batch(q, 99)
        return net.second(torch.tanh(x @ torch.ones(6, 16))).pow(2).mean()

    optimizer.zero_grad()
    loss_of(model, 0, r).backward()
    second_only(model, r).backward()
    optimizer.step()
    if dense():
        reference.zero_grad()
        for q in range(gradmesh.size()):
            (loss_of(reference, 0, q) / gradmesh.size()).backward()
            (second_only(reference, q) / gradmesh.size()).backward()
        descend(reference)
        assert_same(model, reference)
    finish(optimizer, model)


def test_a_step_skipped_on_one_rank_loses_nothing_and_hangs_nobody():
    r = gradmesh.rank()
    model = Net()
    optimizer = wrap(model)
    before = [p.detach().clone() for p in model.parameters()]
    put_in = residual_total(optimizer)
    optimizer.zero_grad()
    loss_of(model, 0, r).backward()
    grads = [p.grad.clone() for _, p in reversed(list(
        model.named_parameters()))]
    if r != 0:
        optimizer.synchronize()  # then skips step(), as rank 0 does
    optimizer.zero_grad()  # rank 0 abandons the step here
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p, b)
    flat = torch.cat([g.reshape(-1) for g in grads]).numpy()
    total_in = gradmesh.allreduce(flat, name="skipped-in", op=gradmesh.Sum,
                                  exact=True)
    np.testing.assert_allclose(residual_total(optimizer) - put_in, total_in,
                               rtol=1e-5, atol=1e-5)
    optimizer.zero_grad()  # and the next step runs everywhere
    loss_of(model, 1, r).backward()
    optimizer.step()
    finish(optimizer, model)


def test_an_overflow_is_the_loss_scalers_to_skip():
    r = gradmesh.rank()
    model = Net()
    optimizer = wrap(model, grad_scaler=HalvingScaler())
    before = [p.detach().clone() for p in model.parameters()]
    if r == 0:
        model.second.bias.register_hook(
            lambda g: g.index_fill(0, torch.tensor([0]), float("inf")))
    optimizer.zero_grad()
    loss_of(model, 0, r).backward()
    optimizer.synchronize()  # does not raise: Inf everywhere, for unscale_
    for p in model.parameters():
        assert torch.isinf(p.grad).all()
    with pytest.raises(gradmesh.GradmeshError, match="failed synchronize"):
        optimizer.step()
    # step() straight away (GradScaler.step on a rank whose own gradient
    # was finite) skips the step too, instead of applying the Inf.
    optimizer.zero_grad()
    loss_of(model, 1, r).backward()
    assert optimizer.step() is None
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p, b)
    optimizer.close()


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_an_overflow_does_not_poison_the_correction(kind):
    r = gradmesh.rank()
    model = Net()
    optimizer = corrected(model, kind, grad_scaler=HalvingScaler())
    overflow = [r == 0]
    model.first.weight.register_hook(  # a sparse bucket under SparDL
        lambda g: g.index_fill(0, torch.tensor([0]), float("inf"))
        if overflow[0] else g)
    train(model, optimizer, [0])  # refused on every rank: skipped
    overflow[0] = False
    for step in range(1, 3):
        before = [p.detach().clone() for p in model.parameters()]
        train(model, optimizer, [step])
        assert not all(torch.equal(p, b)
                       for p, b in zip(model.parameters(), before)), step
    for key, t in optimizer._gradmesh_correction.tensors():
        assert torch.isfinite(t).all(), key
    finish(optimizer, model)


def test_allgather_of_a_name_whose_size_changes():
    r, p = gradmesh.rank(), gradmesh.size()
    for rows in (1, 3, 2):
        got = gradmesh.allgather(np.full((rows, 2), r, np.float32),
                                 name="resized")
        assert got.shape == (rows * p, 2)
        np.testing.assert_array_equal(got[::rows, 0], np.arange(p))


def corrected(model, kind, **kwargs):
    """SGD's correction ("sgd"; "sgd-masked": momentum_masking=True) or
    Adam's ("adam")."""
    if kind == "sgd-masked":
        kwargs["momentum_masking"] = True
    inner = (torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
             if kind.startswith("sgd") else
             torch.optim.Adam(model.parameters(), lr=0.01))
    return wrap(model, inner, momentum_correction=True, **kwargs)


def train(model, optimizer, steps):
    for step in steps:
        optimizer.zero_grad()
        loss_of(model, step, gradmesh.rank()).backward()
        optimizer.step()


@pytest.mark.parametrize("kind", ["sgd", "sgd-masked", "adam"])
def test_a_checkpoint_saved_on_rank_0_resumes_as_if_uninterrupted(kind):
    uninterrupted = Net()
    optimizer = corrected(uninterrupted, kind)
    train(uninterrupted, optimizer, range(4))
    optimizer.close()

    model = Net()
    optimizer = corrected(model, kind)
    train(model, optimizer, range(2))
    state = {"model": model.state_dict(),
             "optimizer": optimizer.state_dict()}  # on every rank: gathers
    folder = gradmesh.broadcast_object(
        tempfile.mkdtemp() if gradmesh.rank() == 0 else None)
    path = os.path.join(folder, "checkpoint.pt")
    if gradmesh.rank() == 0:
        torch.save(state, path)
    gradmesh.barrier()
    optimizer.close()
    state = torch.load(path)  # every rank loads rank 0's file
    gradmesh.barrier()
    if gradmesh.rank() == 0:
        shutil.rmtree(folder)
    resumed = Net()
    resumed.load_state_dict(state["model"])
    optimizer = corrected(resumed, kind)
    optimizer.load_state_dict(state["optimizer"])
    train(resumed, optimizer, range(2, 4))
    assert_same(resumed, uninterrupted)  # under every plan
    finish(optimizer, resumed)


@pytest.mark.parametrize("op", [gradmesh.Average, gradmesh.Sum])
def test_a_checkpoint_of_another_job_size_keeps_the_next_sum(op):
    model = Net()  # residuals and velocities: both enter the sum
    optimizer = corrected(model, "sgd", op=op)
    train(model, optimizer, range(1))
    state = optimizer.state_dict()
    table = state["gradmesh"]
    saved = gradmesh.size() + 1
    rows = torch.randn(saved, table["rows"].shape[1],
                       generator=torch.Generator().manual_seed(3))
    optimizer.load_state_dict(
        dict(state, gradmesh=dict(table, world_size=saved, rows=rows)))
    now = optimizer.state_dict()["gradmesh"]["rows"].double()
    # What the next reduction adds from the residuals is unchanged.
    if op == gradmesh.Average:
        torch.testing.assert_close(now.mean(0), rows.double().mean(0))
    else:
        torch.testing.assert_close(now.sum(0), rows.double().sum(0))
    assert torch.equal(now[0], now[-1])  # the same share for every rank
    finish(optimizer, model)


def test_a_malformed_checkpoint_is_refused_and_changes_nothing():
    model = Net()
    optimizer = corrected(model, "adam")
    train(model, optimizer, range(2))
    state = optimizer.state_dict()
    table = state["gradmesh"]
    rows = table["rows"]
    plain = wrap(Net()).state_dict()["gradmesh"]  # no correction's keys
    bad = [dict(table, world_size=0, rows=rows[:0]),
           dict(table, world_size=float(rows.shape[0])),
           dict(table, rows=rows.double()),
           dict(table, rows=rows.numpy()),
           dict(table, sizes=table["sizes"][:-1]),
           plain,
           "rows"]
    for entry in bad:
        with pytest.raises(ValueError):
            optimizer.load_state_dict(dict(state, gradmesh=entry))
        again = optimizer.state_dict()
        assert torch.equal(again["gradmesh"]["rows"], rows)
    # A parameter order that names no parameters (only "params" is wrong).
    for params in (7, None, "ab", {}, [1, 2, 3, 4]):
        with pytest.raises(gradmesh.GradmeshError,
                           match="not a list of parameter names") as refused:
            optimizer.load_state_dict(
                dict(state, gradmesh=dict(table, params=params)))
        assert refused.value.code == "INVALID_ARGUMENT"
        assert torch.equal(optimizer.state_dict()["gradmesh"]["rows"], rows)
    finish(optimizer, model)


def test_state_dict_between_backward_and_step_is_refused():
    model = Net()
    optimizer = wrap(model)
    optimizer.zero_grad()
    loss_of(model, 0, gradmesh.rank()).backward()
    with pytest.raises(gradmesh.GradmeshError, match="in flight"):
        optimizer.state_dict()  # refused here, before anything is sent
    optimizer.step()
    finish(optimizer, model)


def test_a_checkpoint_of_one_process_in_the_earlier_format_loads():
    model = Net()
    optimizer = corrected(model, "sgd")
    train(model, optimizer, range(1))
    state = optimizer.state_dict()
    table = state.pop("gradmesh")
    width = sum(table["sizes"])
    mine = torch.arange(width, dtype=torch.float32) + gradmesh.rank()
    pieces = list(torch.split(mine, table["sizes"]))
    buckets = len(optimizer._gradmesh_buckets)
    names = [key.split("/", 1)[1] for key in table["keys"][buckets:]]
    state["gradmesh_residuals"] = pieces[:buckets]
    state["gradmesh_velocity"] = dict(zip(names, pieces[buckets:]))
    optimizer.load_state_dict(state)
    rows = optimizer.state_dict()["gradmesh"]["rows"]
    assert torch.equal(rows[gradmesh.rank()], mine)
    finish(optimizer, model)


@pytest.mark.parametrize("kind", [torch.optim.Adam, torch.optim.AdamW])
def test_adam_correction_is_adam_where_the_sum_is_exact(kind):
    model, reference = Net(), Net()
    adam = dict(lr=0.01, weight_decay=0.05)
    optimizer = wrap(model, kind(model.parameters(), **adam),
                     momentum_correction=True)
    plain = kind(reference.parameters(), **adam)
    for step in range(4):
        train(model, optimizer, [step])
        mean_gradient(reference, step)
        plain.step()
    # Under SparDL the small bucket is exact here and the other is not.
    finish(optimizer, model, reference)


@pytest.mark.parametrize("kind", [torch.optim.Adam, torch.optim.AdamW])
def test_adam_directions_of_one_process_are_adam(kind):
    """The direction a process hands over (its own moments), applied by
    the correction's step: for one process that is torch's Adam itself."""
    model, reference = Net(), Net()
    adam = dict(lr=0.01, weight_decay=0.05)
    inner = kind(model.parameters(), **adam)
    named = list(model.named_parameters())
    correction = gradmesh.torch.corrections.correction_for(inner, named, True)
    plain = kind(reference.parameters(), **adam)
    for step in range(4):
        for m in (model, reference):
            m.zero_grad()
            loss_of(m, step, 0).backward()
        for _, p in named:
            slot = p.grad.clone()
            correction.transform(p, inner.param_groups[0], slot, exact=False)
            p.grad = slot
        correction.step(inner.step, exact=set())
        plain.step()
    assert_same(model, reference)


@pytest.mark.parametrize("masking", [False, True, None])
def test_momentum_masking_clears_the_velocity_only_when_asked(masking):
    """Where a sparse sum has values the velocity is cleared with
    momentum_masking only (None: at the plan's density up to 2%);
    elsewhere, and without it, the next direction is m u + g."""
    model = Net()
    inner = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    named = list(model.named_parameters())
    correction = gradmesh.torch.corrections.correction_for(
        inner, named, True, masking)
    p, group = named[0][1], inner.param_groups[0]
    gradient = torch.ones_like(p)
    slot = gradient.clone()
    correction.transform(p, group, slot, exact=False)  # u = g
    summed = torch.zeros_like(p)
    summed.view(-1)[0] = 1.0  # the sum has a value at 0 only
    correction.sent(p, summed)
    slot = gradient.clone()
    correction.transform(p, group, slot, exact=False)
    expected = torch.full_like(p, 1.9)
    if masking is None:
        masking = gradmesh.plan().density <= 0.02
    if masking:
        expected.view(-1)[0] = 1.0  # u was cleared there: u = g
    assert torch.allclose(slot, expected, rtol=0, atol=1e-6)


def assert_biases_follow_the_mean(model, optimizer, steps, momentum=0.0):
    """Trains a Net for `steps` steps: after each, its biases have moved as
    SGD with `momentum` on the exact mean gradient moves them (taken on a
    copy of the model made before the step)."""
    reference, velocity = Net(), {}
    for step in range(steps):
        reference.load_state_dict(model.state_dict())
        mean_gradient(reference, step)
        train(model, optimizer, [step])
        for name in ("first.bias", "second.bias"):
            p, q = (dict(m.named_parameters())[name]
                    for m in (model, reference))
            velocity[name] = momentum * velocity.get(name, 0) + q.grad
            torch.testing.assert_close(p, q - LR * velocity[name], rtol=1e-5,
                                       atol=1e-6)


def test_exact_tensors_below_sums_small_tensors_exactly_under_any_plan():
    """exact_tensors_below: the smaller parameters (here the biases) go at
    the end of the last bucket, summed exactly in its own operation; the
    weights follow the plan (num_buckets=2): every step moves the biases
    by the exact mean gradient. With the whole model below it (one bucket
    of 146 values, over the sparse test plan's exact_below), SGD with
    momentum corrected is the one-process optimizer at every step, on every
    plan. A checkpoint moves only between optimizers of the same order."""
    model = Net()
    optimizer = wrap(model, exact_tensors_below=20)
    kinds = [(b.names, b.exact, b.exact_count)
             for b in optimizer._gradmesh_buckets]
    assert kinds == [(["second.weight"], False, 0),
                     (["first.weight", "second.bias", "first.bias"], False,
                      2)]
    assert_biases_follow_the_mean(model, optimizer,
                                  2 + gradmesh.plan().warmup_steps)
    algorithms = [b.last_algorithm for b in optimizer._gradmesh_buckets]
    assert algorithms[1] == gradmesh.plan().algorithm  # 114 values: the plan
    saved = optimizer.state_dict()
    assert saved["gradmesh"]["params"] == [
        "second.weight", "first.weight", "second.bias", "first.bias"]
    finish(optimizer, model)
    other = wrap(Net())
    with pytest.raises(gradmesh.GradmeshError) as refused:
        other.load_state_dict(saved)
    assert refused.value.code == "INVALID_ARGUMENT"
    assert "another parameter order" in str(refused.value)
    other.close()

    model, reference = Net(), Net()
    optimizer = corrected(model, "sgd", exact_tensors_below=1000)
    [bucket] = optimizer._gradmesh_buckets
    assert bucket.exact and (dense() or
                             bucket.set.size >= gradmesh.plan().exact_below)
    plain = torch.optim.SGD(reference.parameters(), lr=LR, momentum=0.9)
    for step in range(3):
        train(model, optimizer, [step])
        assert bucket.last_algorithm == "dense"
        mean_gradient(reference, step)
        plain.step()
        assert_same(model, reference)
    finish(optimizer, model)
    for bad in (-1, True, 2.5):
        with pytest.raises(gradmesh.GradmeshError) as refused:
            wrap(Net(), exact_tensors_below=bad)
        assert refused.value.code == "INVALID_ARGUMENT"


def test_an_exact_tail_keeps_plain_momentum_under_masking():
    """The exact last parameters of a sparse bucket (here the biases) are
    summed exactly: with the momentum correction and its masking on, each
    step moves them as SGD with momentum on the mean gradient does (masking
    is for sparse sums; on an exact one it would clear every velocity)."""
    model = Net()
    optimizer = corrected(model, "sgd-masked", exact_tensors_below=20)
    assert optimizer._gradmesh_buckets[-1].exact_count == 2
    assert_biases_follow_the_mean(model, optimizer,
                                  3 + gradmesh.plan().warmup_steps,
                                  momentum=0.9)
    finish(optimizer, model)


def test_by_default_the_tensors_with_small_quotas_are_summed_exactly():
    """exact_tensors_below=None: the parameters whose quota at the plan's
    density is under EXACT_QUOTA_BELOW values, if they are at most
    EXACT_SHARE of the model: here all but the first layer's 60,000
    weights (3,002 of 63,002 values), in a bucket summed exactly. None at
    density 1 or under exact_below, nor for Net, made of small layers
    only."""
    from gradmesh.torch import optimizer as module
    plan = gradmesh.plan()
    assert 2000 < module.EXACT_QUOTA_BELOW / plan.density <= 60000
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(60, 1000), nn.Tanh(), nn.Linear(1000, 2))
    optimizer = wrap(model, exact_tensors_below=None)
    exact = [b.names[len(b.names) - b.exact_count:]
             for b in optimizer._gradmesh_buckets if b.exact_count]
    if plan.density >= 1 or plan.exact_below > 63002:
        assert exact == []
    else:
        assert exact == [["2.bias", "2.weight", "0.bias"]]
    generator = torch.Generator().manual_seed(gradmesh.rank())
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.randn(8, 60, generator=generator)).square().mean(
        ).backward()
        optimizer.step()
    finish(optimizer, model)
    small = wrap(Net(), exact_tensors_below=None)
    assert not any(b.exact or b.exact_count for b in small._gradmesh_buckets)
    small.close()


def test_the_default_exact_split_follows_the_quota_and_the_share():
    """_default_exact: every parameter under the quota's bound (256 /
    density values) if they make at most a tenth of the values, else none;
    none at density 1 or when the model is under exact_below. The
    algorithm plays no part (it changes under `auto`; a late process must
    split as the others did)."""
    from types import SimpleNamespace
    from gradmesh.torch.optimizer import _default_exact

    def chosen(sizes, density, exact_below=16384):
        params = [(name, torch.empty(n)) for name, n in sizes.items()]
        # No algorithm: reading it fails the test.
        plan = SimpleNamespace(density=density, exact_below=exact_below)
        return _default_exact(params, plan)

    mlp = {"w1": 1605632, "w2": 4194304, "w3": 20480, "b1": 2048, "b2": 2048,
           "b3": 10}
    assert chosen(mlp, 0.01) == {"w3", "b1", "b2", "b3"}  # under 25,600
    assert chosen(mlp, 0.05) == {"b1", "b2", "b3"}  # under 5,120
    assert chosen(mlp, 1.0) == set()  # nothing is left out
    # The whole model against exact_below: under it, one exact bucket; at
    # it, the split (the rest, under it too, is then exact on its own).
    total = sum(mlp.values())
    assert chosen(mlp, 0.01, exact_below=total + 1) == set()
    assert chosen(mlp, 0.01, exact_below=total) == {"w3", "b1", "b2", "b3"}
    # The share: 10,000 of 110,000 values, then 12,000 of 112,000.
    assert chosen({"w": 100000, "a": 5000, "b": 5000}, 0.01, 0) == {"a", "b"}
    assert chosen({"w": 100000, "a": 6000, "b": 6000}, 0.01, 0) == set()


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_the_warmup_is_the_exact_sum_and_each_step_is_as_expected(kind):
    """The plan's warm-up (`--warmup_steps`): its steps are the one-process
    optimizer on the mean gradient, and the optimizer expects each sum's
    kind before handing the gradient over (exact in the warm-up, the plan's
    after), which the momentum correction depends on."""
    warmup = gradmesh.plan().warmup_steps
    if warmup == 0:
        pytest.skip("the plan has no warm-up (run with --warmup_steps)")
    model, reference = Net(), Net()
    optimizer = corrected(model, kind)
    plain = (torch.optim.SGD(reference.parameters(), lr=LR, momentum=0.9)
             if kind == "sgd" else
             torch.optim.Adam(reference.parameters(), lr=0.01))
    buckets = optimizer._gradmesh_buckets
    for step in range(warmup + 2):
        expected = [optimizer._gradmesh_exact(b) for b in buckets]
        train(model, optimizer, [step])
        assert [b.last_algorithm == "dense" for b in buckets] == expected
        if step < warmup:
            assert all(expected)
            mean_gradient(reference, step)
            plain.step()
            assert_same(model, reference)
    assert not all(expected)  # the plan's sparse sums after the warm-up
    finish(optimizer, model)
