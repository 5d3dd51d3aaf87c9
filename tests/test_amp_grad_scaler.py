"""Dynamic loss scaling (minidnn/amp/grad_scaler.py, the unscale and scale-update primitives of
minidnn/primitives/optimizer.py and SGD's skip on a device flag): against PyTorch's GradScaler and its unscale and
update kernels, a scaled float32 run equal to an unscaled one bit for bit, overflows that skip the step and back
off, growth, no host read in a step with SGD, state in a checkpoint, a captured fp16 step on the GPU, the errors."""
import numpy as np
import pytest

import minidnn
import minidnn.functional as F
from minidnn import amp, backend, naive, nn, optim, primitives
from minidnn.amp import grad_scaler
from minidnn.primitives import sgd_update_multi, unscale_gradients_multi, update_loss_scale

ENGINES = {"minidnn": primitives, "naive": naive}


def random_gradients(rng, dtype):
    return [rng.standard_normal(shape).astype(dtype) * 1e3 for shape in ((7, 5), (13,), (3, 1, 4))]


# ----------------------------------------------------------------------------------------------
# The primitive
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("poison", [None, np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("factor_on_device", [False, True])
def test_unscaling_matches_pytorchs_kernel_bit_for_bit(xp, rng, engine, dtype, poison, factor_on_device):
    torch = pytest.importorskip("torch")
    grads = random_gradients(rng, dtype)
    if poison is not None:
        grads[1][4] = poison
    inv_scale = 1.0 / 3.0  # not a power of two: the float32 rounding of the factor shows
    expected = [torch.from_numpy(g.copy()) for g in grads]
    torch_found = torch.zeros(1)
    torch._amp_foreach_non_finite_check_and_unscale_(expected, torch_found, torch.tensor([inv_scale]))
    on_device = [xp.asarray(g) for g in grads]
    found = xp.zeros(1, dtype=np.int32)
    factor = xp.asarray(np.float32(inv_scale)) if factor_on_device else inv_scale  # a float32 array of shape ()
    ENGINES[engine].unscale_gradients_multi(on_device, factor, found)
    for got, want in zip(on_device, expected):
        got, want = backend.to_device(got, "cpu"), want.numpy()
        nan = np.isnan(want)  # a NaN stays a NaN; its payload is the device's (the GPU writes its canonical NaN)
        np.testing.assert_array_equal(np.isnan(got), nan)
        np.testing.assert_array_equal(got[~nan].view(np.uint8), want[~nan].view(np.uint8))
    assert int(backend.to_device(found, "cpu")[0]) == int(torch_found.item()) == (poison is not None)


@pytest.mark.parametrize("engine", ENGINES)
def test_unscaling_leaves_a_set_flag_set_and_takes_no_gradients(rng, engine):
    found = np.ones(1, np.int32)
    ENGINES[engine].unscale_gradients_multi([rng.standard_normal(4).astype(np.float32)], 0.5, found)
    assert found[0] == 1
    ENGINES[engine].unscale_gradients_multi([], 0.5, found)


@pytest.mark.parametrize("call, error, match", [
    (lambda g, f: unscale_gradients_multi(g[0], 0.5, f), TypeError, "grads must be a list or tuple"),
    (lambda g, f: unscale_gradients_multi(g, 0.0, f), ValueError, "inv_scale must be a finite number > 0"),
    (lambda g, f: unscale_gradients_multi(g, float("nan"), f), ValueError, "inv_scale must be"),
    (lambda g, f: unscale_gradients_multi(g, 0.5, np.zeros(1, np.float32)), TypeError, "found_inf must be an int32"),
    (lambda g, f: unscale_gradients_multi(g, 0.5, np.zeros(2, np.int32)), TypeError, "found_inf must be an int32"),
    (lambda g, f: unscale_gradients_multi(g, np.ones(1, np.float64), f), TypeError, "inv_scale must be a float32"),
    (lambda g, f: unscale_gradients_multi([g[0], g[1].astype(np.float64)], 0.5, f), TypeError, r"grads\[1\] must have"),
    (lambda g, f: unscale_gradients_multi([g[0], g[1][::2]], 0.5, f), ValueError, r"grads\[1\]"),
])
def test_unscaling_bad_arguments_are_clear_errors(rng, call, error, match):
    grads = [rng.standard_normal(6).astype(np.float32) for _ in range(2)]
    with pytest.raises(error, match=match):
        call(grads, np.zeros(1, np.int32))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("found, tracker, interval", [(0, 0, 3), (0, 2, 3), (1, 2, 3), (1, 0, 1), (0, 0, 1)])
@pytest.mark.parametrize("start, growth, backoff", [(2.0**10, 2.0, 0.5), (3.7, 1.3, 0.3), (2.0**127, 2.0, 0.5)])
def test_the_scale_update_matches_pytorchs_kernel(xp, engine, found, tracker, interval, start, growth, backoff):
    torch = pytest.importorskip("torch")
    want_scale, want_tracker = torch.tensor([start], dtype=torch.float32), torch.tensor([tracker], dtype=torch.int32)
    torch._amp_update_scale_(want_scale, want_tracker, torch.tensor([float(found)]), growth, backoff, interval)
    scale, counter = xp.asarray(np.float32(start)), xp.asarray(np.array([tracker], np.int32))
    ENGINES[engine].update_loss_scale(scale, counter, xp.asarray(np.array([found], np.int32)), growth, backoff,
                                      interval)
    assert backend.to_device(scale, "cpu").view(np.uint32) == want_scale.numpy().view(np.uint32)[0]
    assert int(backend.to_device(counter, "cpu")[0]) == int(want_tracker[0])


@pytest.mark.parametrize("call, error, match", [
    (lambda s, t, f: update_loss_scale(s.astype(np.float64), t, f, 2.0, 0.5, 2), TypeError, "scale must be a float32"),
    (lambda s, t, f: update_loss_scale(s, t.astype(np.int64), f, 2.0, 0.5, 2), TypeError, "growth_tracker must be"),
    (lambda s, t, f: update_loss_scale(s, t, np.zeros(3, np.int32), 2.0, 0.5, 2), TypeError, "found_inf must be"),
    (lambda s, t, f: update_loss_scale(s, t, f, 1.0, 0.5, 2), ValueError, "growth_factor must be a finite number > 1"),
    (lambda s, t, f: update_loss_scale(s, t, f, 2.0, 1.0, 2), ValueError, r"backoff_factor must be a number in \(0, 1\)"),
    (lambda s, t, f: update_loss_scale(s, t, f, 2.0, 0.5, 0), ValueError, "growth_interval must be an int >= 1"),
    (lambda s, t, f: update_loss_scale(s, t, f, 2.0, 0.5, True), ValueError, "growth_interval must be an int"),
])
def test_the_scale_update_bad_arguments_are_clear_errors(call, error, match):
    with pytest.raises(error, match=match):
        call(np.ones((), np.float32), np.zeros((), np.int32), np.zeros(1, np.int32))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("flag", [None, 0, 1])
def test_sgd_skips_its_update_when_the_device_flag_is_set(xp, rng, engine, flag):
    params = [xp.asarray(rng.standard_normal(shape).astype(np.float32)) for shape in ((5, 3), (7,))]
    grads = [xp.asarray(rng.standard_normal(p.shape).astype(np.float32)) for p in params]
    buffers = [xp.asarray(rng.standard_normal(p.shape).astype(np.float32)) for p in params]
    before = [backend.to_device(p, "cpu").copy() for p in params]
    found = None if flag is None else xp.asarray(np.array([flag], np.int32))
    ENGINES[engine].sgd_update_multi(params, grads, buffers, lr=0.1, momentum=0.9, weight_decay=0.01,
                                     found_inf=found)
    for p, b, old in zip(params, buffers, before):
        moved = not np.array_equal(backend.to_device(p, "cpu"), old)
        assert moved == (flag != 1)
    with pytest.raises(TypeError, match="found_inf must be an int32"):
        ENGINES[engine].sgd_update_multi(params, grads, buffers, lr=0.1, momentum=0.9,
                                         found_inf=xp.zeros(1, dtype=np.float32))


# ----------------------------------------------------------------------------------------------
# The scaler in a training loop
# ----------------------------------------------------------------------------------------------
def make_run(device, seed=0, scaler=None, lr=0.1):
    minidnn.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 9), nn.ReLU(), nn.Linear(9, 4)).to(device)
    optimizer = optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    rng = np.random.default_rng(seed)
    batches = [(minidnn.tensor(rng.standard_normal((5, 6)).astype(np.float32), device=device),
                minidnn.tensor(rng.integers(0, 4, 5), device=device)) for _ in range(8)]
    return model, optimizer, batches


def train(device, scaler, poisoned_steps=(), steps=8):
    """Scales after each update, steps skipped (the weights did not move), and the final weights."""
    model, optimizer, batches = make_run(device)
    scales, skipped = [], []
    for index, (x, y) in enumerate(batches[:steps]):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        (scaler.scale(loss) if scaler else loss).backward()
        if index in poisoned_steps:
            model[0].weight.grad.data[0, 0] = np.inf
        if scaler:
            before = model[2].bias.numpy().copy()
            scaler.step(optimizer)
            skipped.append(bool(np.array_equal(model[2].bias.numpy(), before)))
            scaler.update()
            scales.append(scaler.get_scale())
        else:
            optimizer.step()
    return scales, skipped, {k: v.numpy() for k, v in model.state_dict().items()}


def test_a_power_of_two_scale_trains_float32_bit_for_bit_as_no_scale_and_grows():
    _, _, plain = train("cpu", None)
    scales, skipped, scaled = train("cpu", amp.GradScaler("cpu", init_scale=2.0**-20, growth_interval=3))
    assert not any(skipped)
    assert scales == [2.0**-20, 2.0**-20, 2.0**-19, 2.0**-19, 2.0**-19, 2.0**-18, 2.0**-18, 2.0**-18]
    for key in plain:
        np.testing.assert_array_equal(scaled[key], plain[key], err_msg=key)


def test_an_overflow_skips_the_step_and_backs_off(rng):
    scaler = amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
    scales, skipped, weights = train("cpu", scaler, poisoned_steps=(0, 3))
    assert skipped == [True, False, False, True, False, False, False, False]
    assert scales == [2.0**9, 2.0**9, 2.0**10, 2.0**9, 2.0**9, 2.0**10, 2.0**10, 2.0**11]
    _, _, untouched = train("cpu", amp.GradScaler("cpu"), poisoned_steps=range(8))
    initial = {k: v.numpy() for k, v in make_run("cpu")[0].state_dict().items()}
    for key in initial:  # every step skipped: the weights never moved
        np.testing.assert_array_equal(untouched[key], initial[key], err_msg=key)
    assert all(np.isfinite(w).all() for w in weights.values())


def test_the_scale_grows_only_while_float32_can_hold_it():
    scaler = amp.GradScaler("cpu", init_scale=2.0**127, growth_interval=1)
    scales, skipped, _ = train("cpu", scaler, poisoned_steps=(0,), steps=3)
    assert skipped == [True, False, False] and scales == [2.0**126, 2.0**127, 2.0**127]


def test_the_naive_engine_scales_and_skips_as_minidnn():
    want = train("cpu", amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2), poisoned_steps=(0, 3))
    with minidnn.use_engine("naive"):
        got = train("cpu", amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2), poisoned_steps=(0, 3))
    assert got[:2] == want[:2]


def test_the_scaler_agrees_with_pytorchs_on_scales_and_skips():
    torch = pytest.importorskip("torch")
    minidnn_scaler = amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    scales, skipped, _ = train("cpu", minidnn_scaler, poisoned_steps=(1, 2, 6))
    model = torch.nn.Linear(6, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    torch_scales, torch_skipped = [], []
    for index in range(8):
        optimizer.zero_grad()
        reference.scale(model(torch.ones(5, 6)).square().mean()).backward()
        if index in (1, 2, 6):
            model.weight.grad[0, 0] = float("inf")
        before = model.weight.detach().clone()
        reference.step(optimizer)
        torch_skipped.append(bool(torch.equal(before, model.weight.detach())))
        reference.update()
        torch_scales.append(reference.get_scale())
    assert scales == torch_scales and skipped == torch_skipped
    assert minidnn_scaler.state_dict() == reference.state_dict()


def test_unscale_before_clipping_then_step_does_not_unscale_twice():
    scaler = amp.GradScaler("cpu", init_scale=4.0)
    model, optimizer, batches = make_run("cpu")
    x, y = batches[0]
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    scaled = model[0].weight.grad.numpy().copy()
    scaler.unscale_(optimizer)
    np.testing.assert_array_equal(model[0].weight.grad.numpy(), scaled / 4)
    nn.utils.clip_grad_norm_(model.parameters(), 1e6)
    scaler.step(optimizer)
    scaler.update()
    np.testing.assert_array_equal(model[0].weight.grad.numpy(), scaled / 4)


def test_a_step_with_sgd_reads_nothing_back_and_another_optimizer_decides_on_the_host(monkeypatch):
    """With SGD the overflow flag decides on the device; Adam's step is decided after one host read, and a
    skipped Adam step leaves its weights and step count as they were."""
    reads = []
    real = grad_scaler._host_value
    monkeypatch.setattr(grad_scaler, "_host_value", lambda array, kind: reads.append(kind) or real(array, kind))
    scaler = amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
    model, optimizer, batches = make_run("cpu")
    for index, (x, y) in enumerate(batches[:4]):
        optimizer.zero_grad()
        scaler.scale(F.cross_entropy(model(x), y)).backward()
        if index == 1:
            model[0].weight.grad.data[0, 0] = np.nan
        scaler.step(optimizer)
        scaler.update()
    assert reads == []
    assert scaler.get_scale() == 2.0**10 and scaler.state_dict()["_growth_tracker"] == 0  # 2^10, 2^9, 2^9, 2^10
    reads.clear()  # (those two read the device, as PyTorch's do)
    adam_model = nn.Linear(6, 4)
    adam = optim.Adam(adam_model.parameters(), lr=0.1)
    x = minidnn.tensor(np.ones((5, 6), np.float32))
    for poisoned in (False, True):
        adam.zero_grad()
        scaler.scale((adam_model(x) ** 2).mean()).backward()
        if poisoned:
            adam_model.weight.grad.data[0, 0] = np.inf
        before = adam_model.weight.numpy().copy()
        assert (scaler.step(adam) is None) and np.array_equal(adam_model.weight.numpy(), before) == poisoned
        scaler.update()
    assert reads == [int, int] and adam.state[adam_model.weight]["step"] == 1


def test_one_scaler_over_two_optimizers_backs_off_when_either_overflowed():
    """As PyTorch's: each optimizer skips on its own flag, and update() backs off if any optimizer's was set."""
    scaler = amp.GradScaler("cpu", init_scale=2.0**6, growth_interval=1)
    first, second = nn.Linear(6, 4), nn.Linear(6, 4)
    optimizers = [optim.SGD(first.parameters(), lr=0.1), optim.SGD(second.parameters(), lr=0.1)]
    x = minidnn.tensor(np.ones((5, 6), np.float32))
    for poisoned, want_scale in ((False, 2.0**7), (True, 2.0**6)):
        for optimizer in optimizers:
            optimizer.zero_grad()
        scaler.scale(((first(x) + second(x)) ** 2).mean()).backward()
        if poisoned:
            second.weight.grad.data[0, 0] = np.inf
        before = [first.weight.numpy().copy(), second.weight.numpy().copy()]
        for optimizer in optimizers:
            scaler.step(optimizer)
        scaler.update()
        assert not np.array_equal(first.weight.numpy(), before[0])  # its own gradients were finite
        assert np.array_equal(second.weight.numpy(), before[1]) == poisoned
        assert scaler.get_scale() == want_scale


def test_loading_a_state_writes_the_scalers_arrays_in_place():
    """A captured step reads the scale's array: load_state_dict and update(new_scale) write into it."""
    scaler = amp.GradScaler("cpu", init_scale=2.0**4)
    scaler.scale(minidnn.tensor(1.0))
    scale, tracker = scaler._scale, scaler._growth_tracker
    scaler.load_state_dict({"scale": 2.0**7, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 9,
                            "_growth_tracker": 5})
    assert scaler._scale is scale and scaler._growth_tracker is tracker
    assert float(scale) == 2.0**7 and int(tracker) == 5 and scaler.scale(minidnn.tensor(1.0)).item() == 2.0**7
    scaler.update(new_scale=2.0**3)
    assert scaler._scale is scale and float(scale) == 2.0**3


def test_the_state_goes_through_a_checkpoint_file(tmp_path):
    scaler = amp.GradScaler("cpu", init_scale=2.0**5, growth_factor=4.0, backoff_factor=0.25, growth_interval=3)
    train("cpu", scaler, poisoned_steps=(0,), steps=3)
    path = tmp_path / "scaler.pt"
    minidnn.save({"scaler": scaler.state_dict()}, path)
    restored = amp.GradScaler("cpu")
    restored.load_state_dict(minidnn.load(path)["scaler"])
    assert restored.state_dict() == scaler.state_dict() == {
        "scale": 2.0**3, "growth_factor": 4.0, "backoff_factor": 0.25, "growth_interval": 3, "_growth_tracker": 2}


def test_a_disabled_scaler_passes_everything_through():
    scaler = amp.GradScaler("cpu", enabled=False)
    model, optimizer, batches = make_run("cpu")
    loss = F.cross_entropy(model(batches[0][0]), batches[0][1])
    assert scaler.scale(loss) is loss and scaler.get_scale() == 1.0 and scaler.state_dict() == {}
    loss.backward()
    before = model[0].weight.numpy().copy()
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
    assert not np.array_equal(model[0].weight.numpy(), before)


def test_scale_takes_tensors_and_nested_sequences():
    scaler = amp.GradScaler("cpu", init_scale=8.0)
    a, b = minidnn.tensor([1.0, 2.0]), minidnn.tensor([3.0])
    first, (second,) = scaler.scale([a, (b,)])
    assert first.tolist() == [8.0, 16.0] and second.tolist() == [24.0]
    with pytest.raises(TypeError, match="outputs must be a Tensor"):
        scaler.scale(3.0)


@pytest.mark.parametrize("options, match", [
    (dict(init_scale=0.0), "init_scale must be a finite number > 0"),
    (dict(init_scale=float("inf")), "init_scale must be"),
    (dict(init_scale=2.0**128), "init_scale must be at most float32's largest value"),
    (dict(growth_factor=1.0), "growth_factor must be > 1"),
    (dict(backoff_factor=1.0), "backoff_factor must be < 1"),
    (dict(growth_interval=0), "growth_interval must be an int >= 1"),
    (dict(growth_interval=2.5), "growth_interval must be an int"),
    (dict(device="tpu"), "device must be 'cuda' or 'cpu'"),
])
def test_bad_settings_are_clear_errors(options, match):
    with pytest.raises(ValueError, match=match):
        amp.GradScaler(**options)


def test_calls_out_of_order_are_clear_errors():
    scaler = amp.GradScaler("cpu")
    model, optimizer, batches = make_run("cpu")
    with pytest.raises(RuntimeError, match="no optimizer was unscaled or stepped"):
        scaler.update()
    with pytest.raises(RuntimeError, match="no gradients to check"):
        scaler.step(optimizer)
    scaler.update(new_scale=16.0)
    scaler.scale(F.cross_entropy(model(batches[0][0]), batches[0][1])).backward()
    scaler.unscale_(optimizer)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(optimizer)
    with pytest.raises(RuntimeError, match="closure is not supported"):
        scaler.step(optimizer, closure=lambda: None)
    scaler.step(optimizer)
    with pytest.raises(RuntimeError, match="after step"):
        scaler.unscale_(optimizer)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(optimizer)
    with pytest.raises(TypeError, match="must be a minidnn optimizer"):
        scaler.step(object())
    with pytest.raises(ValueError, match="lacks"):
        scaler.load_state_dict({"scale": 2.0})
    with pytest.raises(ValueError, match="new_scale must be"):
        scaler.update(new_scale=-1.0)


@pytest.mark.gpu
def test_the_gpu_run_scales_and_skips_as_the_cpu_run():
    cpu = train("cpu", amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2), poisoned_steps=(0, 3))
    gpu = train("cuda", amp.GradScaler("cuda", init_scale=2.0**10, growth_interval=2), poisoned_steps=(0, 3))
    assert gpu[0] == cpu[0] and gpu[1] == cpu[1]
    for key in cpu[2]:
        np.testing.assert_allclose(gpu[2][key], cpu[2][key], rtol=1e-5, atol=1e-6, err_msg=key)


def fp16_run(capture):
    """Eight fp16 steps of a small network with SGD and a GradScaler, batch 3 overflowing float16 (its inputs
    are 10^5, past float16's 65504): the scale after each step and the final weights, eager or replayed from
    one captured step (captured after the eager first step)."""
    from minidnn.cuda import graphs  # noqa: PLC0415 - the GPU's

    minidnn.manual_seed(3)
    model = nn.Sequential(nn.Linear(24, 40), nn.ReLU(), nn.Linear(40, 8)).to("cuda")
    optimizer = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = amp.GradScaler("cuda", init_scale=2.0**10, growth_interval=2)
    rng = np.random.default_rng(5)
    batches = [(minidnn.tensor(rng.standard_normal((16, 24)).astype(np.float32) * (1e5 if index == 3 else 1.0),
                               device="cuda"), minidnn.tensor(rng.integers(0, 8, 16), device="cuda"))
               for index in range(8)]

    def step(x, y):
        with minidnn.autocast("cuda", dtype=minidnn.float16):
            loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss

    scales = []
    replay = None
    for index, batch in enumerate(batches):
        if capture and index == 0:
            replay = graphs.capture(step, batch, warmup=1)
            assert isinstance(replay, graphs.CapturedStep), getattr(replay, "reason", "")
        else:
            (replay or step)(*batch)
        scales.append(scaler.get_scale())
    return scales, {k: v.numpy() for k, v in model.state_dict().items()}


@pytest.mark.gpu
def test_a_captured_fp16_step_skips_backs_off_and_grows_as_the_eager_step():
    eager_scales, eager_weights = fp16_run(capture=False)
    captured_scales, captured_weights = fp16_run(capture=True)
    assert eager_scales == [2.0**10, 2.0**11, 2.0**11, 2.0**10, 2.0**10, 2.0**11, 2.0**11, 2.0**12]
    assert captured_scales == eager_scales
    for key, value in eager_weights.items():
        assert np.isfinite(value).all(), key
        np.testing.assert_allclose(captured_weights[key], value, rtol=1e-6, atol=1e-7, err_msg=key)
