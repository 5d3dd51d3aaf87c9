"""The engine seam: every operation reaches the engine that was chosen, and only that one.

A training step of CaffeNet and of ResNet-18 runs under each engine while a profiler hook
records every Python function called. The contract functions of the *other* engine must never
run, and the chosen engine must run the same set of operations whichever engine it is.
"""
import sys

import numpy as np
import pytest

import minidnn
import minidnn.functional as F
import models
from minidnn import optim
from minidnn.engine import CONTRACT, ENGINES, Engine


def contract_code(name: str) -> dict:
    """Code object -> contract operation, for every operation of engine ``name``."""
    return {function.__code__: operation for operation, function in ENGINES[name].functions.items()}


def operations_called(step) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """While ``step()`` runs: ({engine: contract operations whose code ran at all},
    {engine: those called from outside that engine's own package, i.e. dispatched to it})."""
    codes = {name: contract_code(name) for name in ENGINES}
    packages = {name: ENGINES[name].module_name for name in ENGINES}
    ran: dict[str, set[str]] = {name: set() for name in ENGINES}
    dispatched: dict[str, set[str]] = {name: set() for name in ENGINES}

    def hook(frame, event, arg):
        if event == "call":
            for name, table in codes.items():
                operation = table.get(frame.f_code)
                if operation is not None:
                    ran[name].add(operation)
                    if not frame.f_back.f_globals.get("__name__", "").startswith(packages[name]):
                        dispatched[name].add(operation)

    sys.setprofile(hook)
    try:
        step()
    finally:
        sys.setprofile(None)
    return ran, dispatched


def training_step(model, x, y):
    optimizer = optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)

    def step():
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        optimizer.step()  # the second step takes the momentum path
    return step


def test_the_engines_implement_the_contract_with_their_own_code():
    minidnn_codes, naive_codes = contract_code("minidnn"), contract_code("naive")
    assert set(minidnn_codes.values()) == set(naive_codes.values()) == set(CONTRACT)
    shared = {minidnn_codes[c] for c in set(minidnn_codes) & set(naive_codes)}
    assert not shared, f"the naive engine reuses the primitives' own {sorted(shared)}"


@pytest.mark.parametrize("architecture, image", [("alexnet_caffe", 227), ("resnet18", 64)])
def test_every_operation_of_a_training_step_reaches_the_chosen_engine_only(architecture, image):
    rng = np.random.default_rng(0)
    x = minidnn.tensor(rng.standard_normal((2, 3, image, image)).astype(np.float32))
    y = minidnn.tensor(np.array([1, 7]))
    reached = {}
    for name in ("minidnn", "naive"):
        minidnn.manual_seed(0)
        model = models.create(architecture, num_classes=10)
        with minidnn.use_engine(name):
            ran, dispatched = operations_called(training_step(model, x, y))
        other = "naive" if name == "minidnn" else "minidnn"
        assert not ran[other], f"under engine {name!r}, {sorted(ran[other])} ran on {other!r}"
        reached[name] = dispatched[name]
    assert reached["minidnn"] == reached["naive"]
    expected = {"conv2d_forward", "conv2d_backward_data", "conv2d_backward_filter", "relu_backward",
                "max_pool2d_forward", "max_pool2d_backward", "cross_entropy_forward", "cross_entropy_backward",
                "linear_forward", "linear_backward_weight", "sgd_update_multi"}
    expected |= {"relu_forward", "lrn_forward", "lrn_backward", "dropout_forward"} if architecture == "alexnet_caffe" \
        else {"batch_norm_forward_training", "batch_norm_backward_training", "add_relu_forward"}
    assert expected <= reached["minidnn"], f"missing {sorted(expected - reached['minidnn'])}"
    assert minidnn.get_engine() == "minidnn"


def test_an_engine_lacking_an_operation_fails_when_chosen(monkeypatch):
    lacking = Engine("lacking", "minidnn.primitives.conv")  # has convolutions, nothing else
    monkeypatch.setitem(ENGINES, "lacking", lacking)
    with pytest.raises(TypeError, match="engine 'lacking' .* lacks bias_add"):
        minidnn.set_engine("lacking")
    assert minidnn.get_engine() == "minidnn"


def test_set_engine_names_the_choices():
    with pytest.raises(ValueError, match=r"engine must be one of \['minidnn', 'naive'\]"):
        minidnn.set_engine("caffe")
