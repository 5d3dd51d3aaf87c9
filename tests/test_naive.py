"""The naive engine's contract: every primitive the framework calls, same signature, same argument errors;
whole models and optimizers give the same numbers on both engines.

The layers themselves are tested against float64 references in test_naive_conv.py, test_naive_layers.py
and test_naive_optimizer.py.
"""
import inspect

import numpy as np
import pytest

import minidnn
import minidnn.functional as F
import minidnn.nn as nn
from minidnn import naive
from minidnn import primitives

# Arguments other engineers are adding to the primitives in parallel, which the naive engine already
# has. Once a primitive has one, the signatures must agree exactly.
PENDING: dict[str, list[str]] = {}  # parameters the primitives lack (none now)
PENDING_FUNCTIONS: list[str] = []


def primitive_functions():
    return [name for name in primitives.__all__ if inspect.isfunction(getattr(primitives, name))]


def test_every_primitive_exists_with_its_signature():
    assert len(primitive_functions()) > 35
    for name in primitive_functions():
        assert inspect.isfunction(getattr(naive, name, None)), f"naive lacks {name}"
        theirs, ours = inspect.signature(getattr(primitives, name)), inspect.signature(getattr(naive, name))
        missing = [p for p in PENDING.get(name, []) if p not in theirs.parameters]
        assert list(ours.parameters)[:len(ours.parameters) - len(missing)] == list(theirs.parameters), name
        assert [p for p in ours.parameters if p not in theirs.parameters] == missing, name
        for parameter in theirs.parameters.values():
            mine = ours.parameters[parameter.name]
            assert (mine.kind, mine.default) == (parameter.kind, parameter.default), f"{name}({parameter.name})"
    for name in PENDING_FUNCTIONS:
        assert inspect.isfunction(getattr(naive, name))


# ----------------------------------------------------------------------------------------------
# Argument errors: the same exception type and message from both engines
# ----------------------------------------------------------------------------------------------
def pooled(xp):
    return xp.ones((1, 2, 5, 4))


def pool_grad(xp):
    y, indices = primitives.max_pool2d_forward(np.zeros((1, 2, 5, 4)), 2)
    return xp.asarray(np.ones_like(y)), xp.asarray(indices)


BAD_CALLS = {
    # the fused and in-place forms
    "relu out shape": lambda m, xp: m.relu_forward(xp.ones(3), out=xp.ones(4)),
    "relu out strided": lambda m, xp: m.relu_forward(xp.ones(3), out=xp.ones(6)[::2]),
    "relu out dtype": lambda m, xp: m.relu_forward(xp.ones(3), out=xp.ones(3, dtype=xp.float32)),
    "add_relu shapes": lambda m, xp: m.add_relu_forward(xp.ones(3), xp.ones(4)),
    "add_relu dtypes": lambda m, xp: m.add_relu_forward(xp.ones(3), xp.ones(3, dtype=xp.float32)),
    "add_relu ints": lambda m, xp: m.add_relu_forward(xp.ones(3, dtype=int), xp.ones(3)),
    "add_relu out": lambda m, xp: m.add_relu_forward(xp.ones(3), xp.ones(3), out=xp.ones((3, 1))),
    "bn relu flag": lambda m, xp: m.batch_norm_forward_training(xp.ones((2, 3)), None, None, None, None, relu=1),
    "bn relu_output shape": lambda m, xp: m.batch_norm_backward_training(
        xp.ones((2, 3)), xp.ones((2, 3)), None, xp.ones(3), xp.ones(3), relu_output=xp.ones((3, 2))),
    # convolution
    "conv input rank": lambda m, xp: m.conv2d_forward(xp.ones((2, 3, 8)), xp.ones((4, 3, 3, 3))),
    "conv dtype": lambda m, xp: m.conv2d_forward(xp.ones((1, 1, 3, 3), dtype=xp.int64), xp.ones((1, 1, 1, 1))),
    "conv mixed dtypes": lambda m, xp: m.conv2d_forward(xp.ones((1, 1, 3, 3), dtype=xp.float32), xp.ones((1, 1, 1, 1))),
    "conv channels": lambda m, xp: m.conv2d_forward(xp.ones((2, 3, 8, 8)), xp.ones((4, 2, 3, 3))),
    "conv groups": lambda m, xp: m.conv2d_forward(xp.ones((2, 4, 8, 8)), xp.ones((4, 1, 3, 3)), groups=3),
    "conv stride": lambda m, xp: m.conv2d_forward(xp.ones((2, 3, 8, 8)), xp.ones((4, 3, 3, 3)), stride=1.5),
    "conv dilation": lambda m, xp: m.conv2d_forward(xp.ones((2, 3, 4, 4)), xp.ones((4, 3, 3, 3)), dilation=3),
    "conv out": lambda m, xp: m.conv2d_forward(xp.ones((2, 3, 8, 8)), xp.ones((4, 3, 3, 3)), out=xp.ones((2, 4, 6, 5))),
    "conv algo": lambda m, xp: m.conv2d_forward(xp.ones((2, 3, 8, 8)), xp.ones((4, 3, 3, 3)), algo="winograd9"),
    "conv limit": lambda m, xp: m.conv2d_forward(xp.ones((2, 3, 8, 8)), xp.ones((4, 3, 3, 3)), workspace_limit=-1),
    "conv limit type": lambda m, xp: m.conv2d_backward_data(xp.ones((1, 1, 3, 3)), xp.ones((1, 1, 1, 1)),
                                                            (1, 1, 3, 3), workspace_limit=1.5),
    "conv dy shape": lambda m, xp: m.conv2d_backward_data(xp.ones((1, 1, 2, 2)), xp.ones((1, 1, 1, 1)), (1, 1, 3, 3)),
    "conv weight dtype": lambda m, xp: m.conv2d_backward_data(xp.ones((1, 1, 3, 3)), xp.ones((1, 1, 1, 1), dtype=int),
                                                              (1, 1, 3, 3)),
    "conv dy dtype": lambda m, xp: m.conv2d_backward_filter(xp.ones((1, 1, 3, 3)),
                                                            xp.ones((1, 1, 3, 3), dtype=xp.float32), (1, 1, 1, 1)),
    "conv accumulate": lambda m, xp: m.conv2d_backward_filter(xp.ones((1, 1, 3, 3)), xp.ones((1, 1, 3, 3)),
                                                              (1, 1, 1, 1), accumulate=True),
    "conv accumulate type": lambda m, xp: m.conv2d_backward_filter(
        xp.ones((1, 1, 3, 3)), xp.ones((1, 1, 3, 3)), (1, 1, 1, 1), out=xp.ones((1, 1, 1, 1)), accumulate=1),
    "conv dw out": lambda m, xp: m.conv2d_backward_filter(xp.ones((1, 1, 3, 3)), xp.ones((1, 1, 3, 3)), (1, 1, 1, 1),
                                                          out=xp.ones((2, 1, 1, 1))),
    # linear and bias
    "linear features": lambda m, xp: m.linear_forward(xp.ones((2, 4)), xp.ones((3, 5))),
    "linear weight rank": lambda m, xp: m.linear_forward(xp.ones((2, 5)), xp.ones(5)),
    "linear bias": lambda m, xp: m.linear_forward(xp.ones((2, 5)), xp.ones((3, 5)), xp.ones(4)),
    "linear 0-d": lambda m, xp: m.linear_forward(xp.ones(()), xp.ones((3, 5))),
    "linear dy": lambda m, xp: m.linear_backward_data(xp.ones((2, 4)), xp.ones((3, 5))),
    "linear leading": lambda m, xp: m.linear_backward_weight(xp.ones((2, 5)), xp.ones((3, 3))),
    "bias shape": lambda m, xp: m.bias_add(xp.ones((2, 3, 4)), xp.ones(4)),
    "bias axis": lambda m, xp: m.bias_add(xp.ones((2, 3, 4)), xp.ones(4), axis=3),
    "bias dtype": lambda m, xp: m.bias_add(xp.ones((2, 3)), xp.ones(3, dtype=xp.float32)),
    "bias backward axis": lambda m, xp: m.bias_backward(xp.ones((2, 3, 4)), axis=-4),
    "bias backward 0-d": lambda m, xp: m.bias_backward(xp.ones(())),
    # pooling
    "pool rank": lambda m, xp: m.max_pool2d_forward(xp.ones((2, 5, 4)), 2),
    "pool dtype": lambda m, xp: m.avg_pool2d_forward(xp.ones((1, 2, 5, 4), dtype=xp.int32), 2),
    "pool empty": lambda m, xp: m.adaptive_avg_pool2d_forward(xp.ones((1, 2, 5, 0)), 1),
    "pool kernel": lambda m, xp: m.max_pool2d_forward(pooled(xp), 1.5),
    "pool stride": lambda m, xp: m.avg_pool2d_forward(pooled(xp), 2, (1, 0)),
    "pool padding": lambda m, xp: m.max_pool2d_forward(pooled(xp), 3, padding=2),
    "pool too large": lambda m, xp: m.max_pool2d_forward(pooled(xp), 6),
    "pool dilated": lambda m, xp: m.max_pool2d_forward(pooled(xp), 3, dilation=3),
    "pool empty window": lambda m, xp: m.max_pool2d_forward(xp.ones((1, 2, 1, 1)), 2, 1, 1, 2),
    "pool ceil_mode": lambda m, xp: m.max_pool2d_forward(pooled(xp), 2, ceil_mode="yes"),
    "pool count_include_pad": lambda m, xp: m.avg_pool2d_forward(pooled(xp), 2, count_include_pad=1),
    "pool divisor": lambda m, xp: m.avg_pool2d_forward(pooled(xp), 2, divisor_override=0),
    "adaptive size": lambda m, xp: m.adaptive_avg_pool2d_forward(pooled(xp), (1, 2, 3)),
    "max backward x_shape": lambda m, xp: m.max_pool2d_backward(*pool_grad(xp), (1, 2, 5)),
    "max backward N": lambda m, xp: m.max_pool2d_backward(*pool_grad(xp), (2, 2, 5, 4)),
    "max backward indices dtype": lambda m, xp: m.max_pool2d_backward(pool_grad(xp)[0], pool_grad(xp)[1] * 1.0,
                                                                      (1, 2, 5, 4)),
    "max backward indices shape": lambda m, xp: m.max_pool2d_backward(pool_grad(xp)[0], pool_grad(xp)[1][..., :1],
                                                                      (1, 2, 5, 4)),
    "max backward window": lambda m, xp: m.max_pool2d_backward(*pool_grad(xp), (1, 2, 5, 4), 3),
    "max backward stride only": lambda m, xp: m.max_pool2d_backward(*pool_grad(xp), (1, 2, 5, 4), stride=2),
    "avg backward shape": lambda m, xp: m.avg_pool2d_backward(pool_grad(xp)[0], (1, 2, 7, 4), 2),
    "adaptive backward": lambda m, xp: m.adaptive_avg_pool2d_backward(pool_grad(xp)[0], (2, 2, 5, 4)),
    # activations
    "relu dtype": lambda m, xp: m.relu_forward(xp.arange(4)),
    "relu backward shape": lambda m, xp: m.relu_backward(xp.ones((2, 3)), xp.ones((3, 2))),
    "sigmoid backward dtype": lambda m, xp: m.sigmoid_backward(xp.ones(3, dtype=xp.float32), xp.ones(3)),
    "tanh dtype": lambda m, xp: m.tanh_forward(xp.ones(3, dtype=xp.int32)),
    "leaky_relu slope": lambda m, xp: m.leaky_relu_forward(xp.ones(3), "0.1"),
    "leaky_relu out": lambda m, xp: m.leaky_relu_forward(xp.ones(3), 0.1, out=xp.ones(4)),
    "leaky_relu backward shape": lambda m, xp: m.leaky_relu_backward(xp.ones(3), xp.ones(4), 0.1),
    "silu dtype": lambda m, xp: m.silu_forward(xp.arange(3)),
    "silu backward dtype": lambda m, xp: m.silu_backward(xp.ones(3), xp.ones(3, dtype=xp.float32)),
    "gelu approximate": lambda m, xp: m.gelu_forward(xp.ones(3), "erf"),
    "gelu backward approximate": lambda m, xp: m.gelu_backward(xp.ones(3), xp.ones(3), None),
    # layer norm
    "ln shape": lambda m, xp: m.layer_norm_forward(xp.ones((2, 3)), 4),
    "ln shape type": lambda m, xp: m.layer_norm_forward(xp.ones((2, 3)), 3.0),
    "ln weight": lambda m, xp: m.layer_norm_forward(xp.ones((2, 3)), 3, xp.ones(4)),
    "ln eps": lambda m, xp: m.layer_norm_forward(xp.ones((2, 3)), 3, eps=-1.0),
    "ln mean": lambda m, xp: m.layer_norm_backward(xp.ones((2, 3)), xp.ones((2, 3)), 3, None, xp.ones(3), xp.ones(2)),
    "ln dy": lambda m, xp: m.layer_norm_backward(xp.ones((3, 2)), xp.ones((2, 3)), 3, None, xp.ones(2), xp.ones(2)),
    # LRN
    "lrn size": lambda m, xp: m.lrn_forward(xp.ones((2, 3, 4)), 0),
    "lrn alpha": lambda m, xp: m.lrn_forward(xp.ones((2, 3, 4)), 3, alpha="0.1"),
    "lrn rank": lambda m, xp: m.lrn_forward(xp.ones((2, 3)), 3),
    "lrn dy": lambda m, xp: m.lrn_backward(xp.ones((2, 3, 3)), xp.ones((2, 3, 4)), xp.ones((2, 3, 4)),
                                           xp.ones((2, 3, 4)), 3),
    "lrn scale dtype": lambda m, xp: m.lrn_backward(xp.ones((2, 3, 4)), xp.ones((2, 3, 4)), xp.ones((2, 3, 4)),
                                                    xp.ones((2, 3, 4), dtype=xp.float32), 3),
    # batch norm
    "bn rank": lambda m, xp: m.batch_norm_forward_training(xp.ones(3), None, None, None, None),
    "bn weight": lambda m, xp: m.batch_norm_forward_training(xp.ones((2, 3, 2)), xp.ones(4), None, None, None),
    "bn running pair": lambda m, xp: m.batch_norm_forward_training(xp.ones((2, 3, 2)), None, None, xp.ones(3), None),
    "bn momentum": lambda m, xp: m.batch_norm_forward_training(xp.ones((2, 3, 2)), None, None, None, None,
                                                               momentum=1.5),
    "bn one value": lambda m, xp: m.batch_norm_forward_training(xp.ones((1, 3)), None, None, None, None),
    "bn eps": lambda m, xp: m.batch_norm_forward_inference(xp.ones((2, 3)), None, None, xp.ones(3), xp.ones(3),
                                                           eps=0.0),
    "bn running None": lambda m, xp: m.batch_norm_forward_inference(xp.ones((2, 3)), None, None, None, xp.ones(3)),
    "bn dy": lambda m, xp: m.batch_norm_backward_training(xp.ones((2, 3)), xp.ones((2, 3, 2)), None, xp.ones(3),
                                                          xp.ones(3)),
    "bn invstd": lambda m, xp: m.batch_norm_backward_training(xp.ones((2, 3)), xp.ones((2, 3)), None, xp.ones(3),
                                                              xp.ones(2)),
    "bn empty": lambda m, xp: m.batch_norm_backward_training(xp.ones((0, 3)), xp.ones((0, 3)), None, xp.ones(3),
                                                             xp.ones(3)),
    "bn inference var": lambda m, xp: m.batch_norm_backward_inference(xp.ones((2, 3)), xp.ones((2, 3)), None,
                                                                      xp.ones(3), xp.ones(5)),
    # softmax and losses
    "softmax axis": lambda m, xp: m.softmax_forward(xp.ones((2, 3)), axis=2),
    "log_softmax axis type": lambda m, xp: m.log_softmax_forward(xp.ones((2, 3)), axis=1.0),
    "softmax pair": lambda m, xp: m.softmax_backward(xp.ones((2, 3)), xp.ones((3, 2))),
    "nll reduction": lambda m, xp: m.nll_loss_forward(xp.ones((2, 3)), xp.zeros(2, dtype=int), reduction="avg"),
    "nll target range": lambda m, xp: m.nll_loss_forward(xp.ones((2, 3)), xp.asarray([0, 3])),
    "nll target dtype": lambda m, xp: m.nll_loss_forward(xp.ones((2, 3)), xp.zeros(2)),
    "nll weight": lambda m, xp: m.nll_loss_forward(xp.ones((2, 3)), xp.zeros(2, dtype=int), xp.ones(4)),
    "nll shape": lambda m, xp: m.nll_loss_backward(xp.ones(()), xp.zeros(2, dtype=int), (2, 0)),
    "nll grad_loss": lambda m, xp: m.nll_loss_backward(xp.ones(2), xp.zeros(2, dtype=int), (2, 3)),
    "ce ignore_index": lambda m, xp: m.cross_entropy_forward(xp.ones((2, 3)), xp.zeros(2, dtype=int),
                                                             ignore_index=1.5),
    "ce smoothing": lambda m, xp: m.cross_entropy_forward(xp.ones((2, 3)), xp.zeros(2, dtype=int),
                                                          label_smoothing=1.5),
    "ce target shape": lambda m, xp: m.cross_entropy_forward(xp.ones((2, 3)), xp.zeros(3, dtype=int)),
    "ce backward dtype": lambda m, xp: m.cross_entropy_backward(xp.ones((), dtype=xp.float32), xp.ones((2, 3)),
                                                                xp.zeros(2, dtype=int)),
    # dropout
    "dropout p": lambda m, xp: m.dropout_forward(xp.ones((2, 3)), 1.5, 0),
    "dropout seed": lambda m, xp: m.dropout_forward(xp.ones((2, 3)), 0.5, 1.0),
    "dropout offset": lambda m, xp: m.dropout_forward(xp.ones((2, 3)), 0.5, 0, -2),
    "dropout mask dtype": lambda m, xp: m.dropout_backward(xp.ones((2, 3)), xp.ones((2, 3)), 0.5),
    "dropout mask shape": lambda m, xp: m.dropout_backward(xp.ones((2, 3)), xp.ones((3, 2), dtype=bool), 0.5),
    # optimizer updates
    "sgd lr": lambda m, xp: m.sgd_update(xp.ones(3), xp.ones(3), lr=float("nan")),
    "sgd lr type": lambda m, xp: m.sgd_update(xp.ones(3), xp.ones(3), lr="0.1"),
    "sgd momentum": lambda m, xp: m.sgd_update(xp.ones(3), xp.ones(3), xp.ones(3), lr=0.1, momentum=-0.9),
    "sgd buffer missing": lambda m, xp: m.sgd_update(xp.ones(3), xp.ones(3), lr=0.1, momentum=0.9),
    "sgd buffer shape": lambda m, xp: m.sgd_update(xp.ones(3), xp.ones(3), xp.ones(4), lr=0.1, momentum=0.9),
    "sgd grad dtype": lambda m, xp: m.sgd_update(xp.ones(3), xp.ones(3, dtype=xp.float32), lr=0.1),
    "sgd strided param": lambda m, xp: m.sgd_update(xp.ones(6)[::2], xp.ones(3), lr=0.1),
    "sgd int param": lambda m, xp: m.sgd_update(xp.ones(3, dtype=int), xp.ones(3), lr=0.1),
    "sgd nesterov": lambda m, xp: m.sgd_update(xp.ones(3), xp.ones(3), lr=0.1, nesterov=1),
    "adam step": lambda m, xp: m.adam_update(xp.ones(3), xp.ones(3), xp.ones(3), xp.ones(3), step=0, lr=0.1),
    "adam step type": lambda m, xp: m.adam_update(xp.ones(3), xp.ones(3), xp.ones(3), xp.ones(3), step=1.0, lr=0.1),
    "adam beta": lambda m, xp: m.adam_update(xp.ones(3), xp.ones(3), xp.ones(3), xp.ones(3), step=1, lr=0.1,
                                             beta2=1.0),
    "adam eps": lambda m, xp: m.adam_update(xp.ones(3), xp.ones(3), xp.ones(3), xp.ones(3), step=1, lr=0.1,
                                            eps=float("inf")),
    "adam amsgrad": lambda m, xp: m.adam_update(xp.ones(3), xp.ones(3), xp.ones(3), xp.ones(3), step=1, lr=0.1,
                                                amsgrad=True),
    "adam state shape": lambda m, xp: m.adam_update(xp.ones(3), xp.ones(3), xp.ones(2), xp.ones(3), step=1, lr=0.1),
    "adam state strided": lambda m, xp: m.adam_update(xp.ones(3), xp.ones(3), xp.ones(3), xp.ones(6)[::2], step=1,
                                                      lr=0.1),
}


def raised(call):
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    return type(info.value), str(info.value)


# Checks that read array values: done on NumPy only (on the GPU they would cost a host synchronisation).
NUMPY_ONLY = {"nll target range"}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_arguments_raise_the_primitives_errors(xp, case):
    if case in NUMPY_ONLY and xp is not np:
        pytest.skip("the GPU skips checks that read device memory, in both engines")
    expected = raised(lambda: BAD_CALLS[case](primitives, xp))
    assert raised(lambda: BAD_CALLS[case](naive, xp)) == expected


def test_a_bad_parameter_in_a_list_updates_none(xp):
    params = [xp.ones(3), xp.ones(2)]
    with pytest.raises(TypeError, match="momentum_buffer must be a float32 or float64 array"):
        naive.sgd_update_multi(params, [xp.ones(3), xp.ones(2)], [xp.zeros(3), None], lr=0.1, momentum=0.9,
                               dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False, first_step=True)
    assert float(params[0].sum()) == 3.0


# ----------------------------------------------------------------------------------------------
# Whole models and optimizers on both engines
# ----------------------------------------------------------------------------------------------
def grads_on(engine, model, x, y):
    with minidnn.use_engine(engine):
        model.zero_grad()
        loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        loss.backward()
    return loss.item(), {k: p.grad.numpy() for k, p in model.named_parameters()}


def test_engines_agree_on_a_model_with_every_layer_type(rng):
    minidnn.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 5, stride=2, padding=2), nn.ReLU(), nn.LocalResponseNorm(3, alpha=0.1, k=2.0),
        nn.MaxPool2d(3, 2, ceil_mode=True), nn.Conv2d(8, 8, 3, padding=1, groups=2), nn.BatchNorm2d(8), nn.Tanh(),
        nn.AvgPool2d(2, padding=1, count_include_pad=False), nn.Conv2d(8, 6, 1, bias=False), nn.Sigmoid(),
        nn.AdaptiveAvgPool2d((2, 3)), nn.Flatten(), nn.Dropout(0.3), nn.Linear(36, 5)).double()
    x = minidnn.tensor(rng.standard_normal((3, 3, 17, 15)))
    y = minidnn.tensor(np.array([0, 4, 2]))
    minidnn.manual_seed(1)
    loss, grads = grads_on("minidnn", model, x, y)
    minidnn.manual_seed(1)  # the same dropout mask: both engines draw from the counter-based generator
    naive_loss, naive_grads = grads_on("naive", model, x, y)
    assert naive_loss == pytest.approx(loss, rel=1e-12)
    for name in grads:
        np.testing.assert_allclose(naive_grads[name], grads[name], rtol=1e-9, atol=1e-12, err_msg=name)
    assert minidnn.get_engine() == "minidnn"


def test_set_engine_validates_and_switches_optimizers_too():
    with pytest.raises(ValueError, match="engine must be one of"):
        minidnn.set_engine("cudnn")
    p = minidnn.tensor([1.0, 2.0], requires_grad=True)
    optimizer = minidnn.optim.SGD([p], lr=0.1, momentum=0.9)
    p.grad = minidnn.tensor([1.0, 1.0])
    with minidnn.use_engine("naive"):
        optimizer.step()
        optimizer.step()
    np.testing.assert_allclose(p.numpy(), [1.0 - 0.1 - 0.19, 2.0 - 0.1 - 0.19])
