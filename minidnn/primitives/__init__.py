"""minidnn's primitives library: cuDNN-like functions on NumPy and CuPy arrays, no autograd.

Layout NCHW, or channels-last (an NCHW view of an NHWC buffer: layout.py), weights (K, C/groups, R, S). Every function takes and returns plain arrays; the
array's type (numpy.ndarray or cupy.ndarray) selects the implementation. Forward functions
return what their backward needs (argmax indices, saved statistics); backward functions take it.
"""
from ._checks import pair
from .activation import (add_relu_forward, gelu_backward, gelu_forward, leaky_relu_backward, leaky_relu_forward,
                         relu_backward, relu_forward, sigmoid_backward, sigmoid_forward, silu_backward, silu_forward,
                         tanh_backward, tanh_forward)
from .batchnorm import (batch_norm_backward_inference, batch_norm_backward_training, batch_norm_forward_inference,
                        batch_norm_forward_training)
from .conv import conv2d_backward_data, conv2d_backward_filter, conv2d_forward
from .convert import float_to_half, half_to_float
from .dropout import dropout_backward, dropout_forward
from .layernorm import layer_norm_backward, layer_norm_forward
from .linear import bias_add, bias_backward, linear_backward_data, linear_backward_weight, linear_forward
from .lrn import lrn_backward, lrn_forward
from .optimizer import (adam_update, adam_update_multi, sgd_update, sgd_update_multi, unscale_gradients_multi,
                        update_loss_scale)
from .pooling import (adaptive_avg_pool2d_backward, adaptive_avg_pool2d_forward, avg_pool2d_backward,
                      avg_pool2d_forward, max_pool2d_backward, max_pool2d_forward)
from .softmax import (cross_entropy_backward, cross_entropy_forward, log_softmax_backward, log_softmax_forward,
                      nll_loss_backward, nll_loss_forward, softmax_backward, softmax_forward)

__all__ = [name for name in dir() if not name.startswith("_")]
