"""The Python binding, run by every process of a dense-plan cluster:

    gradmesh run --workers=3 --algo=dense -- python3 -m pytest tests/python/test_sdk.py

Every test is collective (all ranks run it, in the same order), so the dense
plan makes sums exact and the results checkable against plain arithmetic.
"""

import os
import threading
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import gradmesh
import gradmesh.torch


@pytest.fixture(scope="session", autouse=True)
def cluster():
    gradmesh.init(timeout=60)
    yield
    gradmesh.barrier()


def rank_data(rank, shape, seed):
    generator = torch.Generator().manual_seed(seed * 1000 + rank)
    return torch.randn(shape, generator=generator)


def test_rank_and_size_come_from_the_launcher():
    assert gradmesh.rank() == int(os.environ["GRADMESH_RANK"])
    assert gradmesh.size() == int(os.environ["GRADMESH_WORLD_SIZE"])
    assert gradmesh.plan().algorithm == "dense"
    # torchrun's variables, the same numbers.
    assert int(os.environ["RANK"]) == gradmesh.rank()
    assert int(os.environ["LOCAL_RANK"]) == gradmesh.local_rank()
    assert int(os.environ["WORLD_SIZE"]) == gradmesh.size()
    assert int(os.environ["LOCAL_WORLD_SIZE"]) == gradmesh.size()
    assert os.environ["MASTER_ADDR"] == "127.0.0.1"
    assert 0 < int(os.environ["MASTER_PORT"]) < 65536


def test_allreduce_sums_exactly_under_the_dense_plan():
    r, p = gradmesh.rank(), gradmesh.size()
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4) * (r + 1)
    total = gradmesh.allreduce(x, name="exact", op=gradmesh.Sum)
    assert isinstance(total, torch.Tensor) and total.shape == (3, 4)
    expected = torch.arange(12, dtype=torch.float32).reshape(3, 4) * (
        p * (p + 1) // 2)
    assert torch.equal(total, expected)
    assert torch.equal(x, torch.arange(12, dtype=torch.float32).reshape(3, 4)
                       * (r + 1)), "the input is not changed"
    mean = gradmesh.allreduce(np.full(5, float(r), np.float32), name="mean")
    assert isinstance(mean, np.ndarray)
    np.testing.assert_array_equal(mean, np.full(5, (p - 1) / 2, np.float32))


def test_async_handles_finish_in_any_order():
    r = gradmesh.rank()
    handles = [gradmesh.allreduce_async(torch.full((100 + i,), float(r + i)),
                                        name=f"async.{i}", op=gradmesh.Sum)
               for i in range(3)]
    p = gradmesh.size()
    for i in reversed(range(3)):
        result = gradmesh.synchronize(handles[i])
        assert torch.equal(result, torch.full((100 + i,),
                                              float(sum(range(p)) + p * i)))
        assert handles[i].info.algorithm == "dense"
        assert handles[i].info.world_size == p


def test_buffer_from_the_sdk_needs_no_copy():
    r, p = gradmesh.rank(), gradmesh.size()
    buf = gradmesh.buffer("zero-copy", (4, 2))
    for step in range(3):
        buf.fill_(float(r + step))
        out = gradmesh.allreduce(buf, name="zero-copy", op=gradmesh.Sum)
        assert out.data_ptr() == buf.data_ptr()
        assert torch.equal(out, torch.full((4, 2),
                                           float(sum(range(p)) + p * step)))


def test_bad_input_is_refused_before_anything_is_sent():
    with pytest.raises(TypeError, match="float32"):
        gradmesh.allreduce(torch.zeros(3, dtype=torch.float64), name="f64")
    with pytest.raises(ValueError, match="name"):
        gradmesh.allreduce(torch.zeros(3))
    with pytest.raises(TypeError):
        gradmesh.allreduce([1.0, 2.0], name="list")


def test_cluster_errors_carry_the_status_code():
    x = torch.ones(8)
    if gradmesh.rank() == 1:
        x[3] = float("nan")
    with pytest.raises(gradmesh.GradmeshError) as error:
        gradmesh.allreduce(x, name="poisoned")
    assert error.value.code == "INVALID_ARGUMENT"
    # The bucket goes on; the NaN was dropped, the finite values kept in the
    # residual and summed with the next step (dense keeps no residual
    # otherwise: everything is sent).
    again = gradmesh.allreduce(torch.ones(8), name="poisoned",
                               op=gradmesh.Sum)
    p = gradmesh.size()
    expected = torch.full((8,), 2.0 * p)
    expected[3] = 2.0 * p - 1
    assert torch.equal(again, expected)


def test_broadcast_parameters_copies_every_dtype_from_the_root():
    r = gradmesh.rank()
    model = nn.Sequential(nn.Linear(5, 3), nn.BatchNorm1d(3))
    torch.manual_seed(100 + r)  # a different model on every rank
    for p in model.parameters():
        nn.init.normal_(p)
    model.state_dict()["1.num_batches_tracked"].fill_(10 + r)
    root = gradmesh.size() - 1
    gradmesh.broadcast_parameters(model.state_dict(), root_rank=root)
    reference = nn.Sequential(nn.Linear(5, 3), nn.BatchNorm1d(3))
    torch.manual_seed(100 + root)
    for p in reference.parameters():
        nn.init.normal_(p)
    for name, value in model.state_dict().items():
        if name == "1.num_batches_tracked":
            assert int(value) == 10 + root
        else:
            assert torch.equal(value, reference.state_dict()[name]), name


def reference_step(model, lr, batches):
    """One SGD step on the mean of every rank's gradient, in one process."""
    grads = None
    for x, y in batches:
        model.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        g = [p.grad.clone() for p in model.parameters()]
        grads = g if grads is None else [a + b for a, b in zip(grads, g)]
    with torch.no_grad():
        for p, g in zip(model.parameters(), grads):
            p -= lr * g / len(batches)


def make_model():
    torch.manual_seed(5)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))


def all_batches(step):
    return [(rank_data(q, (8, 6), step), rank_data(q, (8, 2), step + 50))
            for q in range(gradmesh.size())]


def assert_identical_on_every_rank(model):
    for name, p in model.named_parameters():
        assert_identical_on_every_rank_tensor(p, name)


def assert_identical_on_every_rank_tensor(tensor, name="tensor"):
    theirs = tensor.detach().clone()
    gradmesh.broadcast_parameters([(name, theirs)], root_rank=0)
    assert torch.equal(theirs, tensor.detach()), name


@pytest.mark.parametrize("num_buckets", [None, 1, 2])
def test_distributed_optimizer_averages_like_one_process(num_buckets):
    r = gradmesh.rank()
    model, reference = make_model(), make_model()
    optimizer = gradmesh.torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(), num_buckets=num_buckets)
    assert isinstance(optimizer, torch.optim.SGD)
    for step in range(3):
        batches = all_batches(step)
        x, y = batches[r]
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        assert len(optimizer.last_infos) == (num_buckets or 1)
        reference_step(reference, 0.1, batches)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert_identical_on_every_rank(model)


def test_buckets_are_sized_as_ddp_s_and_the_first_overlaps_backward():
    # By default one bucket up to 25 MiB (no exact split here, which has
    # tests of its own). With DDP's 1 MiB first bucket, in backward order:
    # the head, then 1.2 MB of body (the first bucket is full), then the
    # stem.
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(20, 1000), nn.ReLU(),
                          nn.Linear(1000, 300), nn.ReLU(), nn.Linear(300, 10))
    one = gradmesh.torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(), exact_tensors_below=0)
    assert len(one._gradmesh_buckets) == 1
    one.close()
    optimizer = gradmesh.torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(), first_bucket_mb=1,
        exact_tensors_below=0)
    buckets = optimizer._gradmesh_buckets
    assert [b.names for b in buckets] == [
        ["4.bias", "4.weight", "2.bias", "2.weight"], ["0.bias", "0.weight"]]
    # The first bucket is on its way while backward still computes the
    # stem's gradient.
    in_flight = []
    model[0].weight.register_hook(
        lambda grad: in_flight.append(buckets[0].pending is not None))
    x = rank_data(gradmesh.rank(), (4, 20), 3)
    optimizer.zero_grad()
    model(x).square().mean().backward()
    assert in_flight == [True]
    optimizer.step()
    assert len(optimizer.last_infos) == 2
    assert_identical_on_every_rank(model)
    optimizer.close()
    # A smaller cap makes more buckets; a tensor past it closes its bucket.
    optimizer = gradmesh.torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(), first_bucket_mb=0.01,
        bucket_cap_mb=0.05, exact_tensors_below=0)
    assert [b.names for b in optimizer._gradmesh_buckets] == [
        ["4.bias", "4.weight"], ["2.bias", "2.weight"],
        ["0.bias", "0.weight"]]
    optimizer.close()


@pytest.mark.parametrize("sizes", [dict(num_buckets=0),
                                   dict(bucket_cap_mb=0),
                                   dict(first_bucket_mb=-1)])
def test_bucket_sizes_that_make_no_bucket_are_refused(sizes):
    model = make_model()
    with pytest.raises(gradmesh.GradmeshError) as error:
        gradmesh.torch.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=model.named_parameters(), **sizes)
    assert error.value.code == "INVALID_ARGUMENT"


def test_a_checkpoint_saved_with_other_buckets_loads_into_these():
    # Saved with one bucket, loaded into two (DDP's small first bucket): the
    # same residuals, cut otherwise.
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(20, 1000), nn.ReLU(),
                          nn.Linear(1000, 300), nn.ReLU(), nn.Linear(300, 10))

    def wrap(**buckets):
        return gradmesh.torch.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=model.named_parameters(), exact_tensors_below=0,
            **buckets)

    one = wrap(num_buckets=1)  # as an earlier version's default
    (bucket,) = one._gradmesh_buckets
    saved = torch.arange(bucket.set.size, dtype=torch.float32) + (
        gradmesh.rank() * 0.5)
    gradmesh._the_client().load_residual(bucket.set, saved.numpy())
    state = one.state_dict()
    one.close()
    two = wrap(first_bucket_mb=1)
    assert len(two._gradmesh_buckets) == 2
    two.load_state_dict(state)
    assert torch.equal(
        torch.cat([t for _, t in two._gradmesh_own_tensors()]), saved)
    # Two buckets cut elsewhere (by count) load too.
    state = two.state_dict()
    two.close()
    other = wrap(num_buckets=2)
    assert [b.set.size for b in other._gradmesh_buckets] != [
        int(n) for n in state["gradmesh"]["sizes"]]
    other.load_state_dict(state)
    assert torch.equal(
        torch.cat([t for _, t in other._gradmesh_own_tensors()]), saved)
    # A cut inside a parameter is another model's: refused.
    table = state["gradmesh"]
    with pytest.raises(gradmesh.GradmeshError, match="does not match"):
        other.load_state_dict(dict(state, gradmesh=dict(
            table, sizes=[table["sizes"][0] - 1, table["sizes"][1] + 1])))
    other.close()


def test_optimizer_checkpoints_carry_every_rank_s_residuals():
    model = make_model()
    optimizer = gradmesh.torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(), num_buckets=2)
    x, y = all_batches(0)[gradmesh.rank()]
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    state = optimizer.state_dict()
    table = state["gradmesh"]
    sizes = [b.set.size for b in optimizer._gradmesh_buckets]
    assert table["keys"] == ["residual/0", "residual/1"]
    assert table["sizes"] == sizes
    assert table["world_size"] == gradmesh.size()
    assert table["rows"].shape == (gradmesh.size(), sum(sizes))
    # Every rank holds the same table, and rank r's row is its residual.
    assert_identical_on_every_rank_tensor(table["rows"])
    mine = torch.cat([torch.from_numpy(b.set.residual().copy())
                      for b in optimizer._gradmesh_buckets])
    assert torch.equal(table["rows"][gradmesh.rank()], mine)
    # What is loaded is what each worker holds from then on: its own row.
    loaded = torch.arange(gradmesh.size() * sum(sizes),
                          dtype=torch.float32).reshape(gradmesh.size(), -1)
    optimizer.load_state_dict(
        dict(state, gradmesh=dict(table, rows=loaded)))
    assert torch.equal(optimizer.state_dict()["gradmesh"]["rows"], loaded)
    bad = loaded.clone()
    bad[0][0] = float("nan")
    with pytest.raises(gradmesh.GradmeshError, match="non-finite"):
        optimizer.load_state_dict(dict(state, gradmesh=dict(table, rows=bad)))
    with pytest.raises(ValueError, match="does not match"):
        optimizer.load_state_dict(
            dict(state, gradmesh=dict(table, sizes=sizes[:1])))


def test_ddp_communication_hook_returns_the_average():
    r, p = gradmesh.rank(), gradmesh.size()
    dist.init_process_group("gloo")  # env://, from gradmesh run's variables
    assert (dist.get_rank(), dist.get_world_size()) == (r, p)
    try:
        model, reference = make_model(), make_model()
        ddp = nn.parallel.DistributedDataParallel(model)
        ddp.register_comm_hook(gradmesh.torch.HookState(),
                               gradmesh.torch.allreduce_hook)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(3):
            batches = all_batches(step + 10)
            x, y = batches[r]
            optimizer.zero_grad()
            nn.functional.mse_loss(ddp(x), y).backward()
            optimizer.step()
            reference_step(reference, 0.1, batches)
        for a, b in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert_identical_on_every_rank(model)
    finally:
        dist.destroy_process_group()


def test_a_name_in_flight_is_not_overwritten_and_names_are_checked():
    pending = gradmesh.allreduce_async(torch.ones(4), name="in-flight")
    with pytest.raises(RuntimeError, match="in flight"):
        gradmesh.allreduce_async(torch.ones(4), name="in-flight")
    gradmesh.synchronize(pending)
    with pytest.raises(ValueError, match="gradmesh's own"):
        gradmesh.allreduce(torch.ones(4), name="gradmesh.optimizer0.0")


def test_broadcast_parameters_handles_bfloat16_and_strided_tensors():
    r = gradmesh.rank()
    half = torch.full((3,), float(r), dtype=torch.bfloat16)
    strided = torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * (r + 1)
    gradmesh.broadcast_parameters({"half": half, "strided": strided,
                                   "step": 5}, root_rank=0)
    assert torch.equal(half, torch.zeros(3, dtype=torch.bfloat16))
    assert torch.equal(strided,
                       torch.arange(12, dtype=torch.float32).reshape(3, 4).t())


def test_synchronize_then_step_applies_the_gradient_once():
    r = gradmesh.rank()
    model, reference = make_model(), make_model()
    optimizer = gradmesh.torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters())
    batches = all_batches(30)
    x, y = batches[r]
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    optimizer.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    optimizer.step()
    reference_step(reference, 0.1, batches)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_under_torchrun_init_finds_the_worker_of_its_local_rank(
        monkeypatch, tmp_path):
    # torchrun sets LOCAL_RANK and MASTER_*, not GRADMESH_WORKER; the node's
    # workers serve at worker-<LOCAL_RANK>.sock in the socket folder.
    real = os.environ["GRADMESH_WORKER"][len("unix:"):]
    local = gradmesh.local_rank()
    for name in ("GRADMESH_WORKER", "GRADMESH_JOB", "GRADMESH_LOCAL_RANK",
                 "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOCAL_RANK", str(local))
    monkeypatch.setenv("GRADMESH_SOCKET_DIR", str(tmp_path))
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert gradmesh.local_rank() == local
    socket = tmp_path / f"worker-{local}.sock"
    # A worker that comes up late is waited for.
    threading.Timer(0.5, os.symlink, (real, socket)).start()
    worker = gradmesh._default_worker(deadline=time.monotonic() + 10)
    assert worker == f"unix:{socket}"
    assert gradmesh._default_job() == "torchrun-10.0.0.1-29500"
    client = gradmesh.Client.connect(worker, "probe", 30.0)
    assert client.plan().world_size == gradmesh.size()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "a/b")
    assert gradmesh._default_job() == "torchrun-a-b"
    monkeypatch.setenv("LOCAL_RANK", "7")
    with pytest.raises(gradmesh.GradmeshError, match="worker-7.sock") as e:
        gradmesh._default_worker(deadline=time.monotonic() + 0.3)
    assert e.value.code == "FAILED_PRECONDITION"
    monkeypatch.setenv("LOCAL_RANK", " 1")
    with pytest.raises(gradmesh.GradmeshError, match="not a number"):
        gradmesh._default_worker()
