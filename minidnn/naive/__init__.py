"""The naive engine: the baseline a framework has without a primitives library (Caffe before cuDNN).

Same functions, signatures and results as :mod:`minidnn.primitives`, computed the old way:
convolution one image at a time with im2col + GEMM into a per-layer column buffer (see
:mod:`.conv`), and everything else as plain array expressions, one pass (and, on the GPU, one
CuPy kernel and one temporary) per operation, without fused kernels (see :mod:`.layers`).
Select it with ``minidnn.set_engine("naive")`` or ``with minidnn.engine("naive"):``; the
benchmark runs the same models on both engines to measure what the primitives buy.
"""
from ..primitives import pair
from .conv import bias_add, bias_backward, conv2d_backward_data, conv2d_backward_filter, conv2d_forward
from .layers import (adam_update, adaptive_avg_pool2d_backward, adaptive_avg_pool2d_forward, avg_pool2d_backward,
                     avg_pool2d_forward, batch_norm_backward_inference, batch_norm_backward_training,
                     batch_norm_forward_inference, batch_norm_forward_training, cross_entropy_backward,
                     cross_entropy_forward, dropout_backward, dropout_forward, linear_backward_data,
                     linear_backward_weight, linear_forward, log_softmax_backward, log_softmax_forward, lrn_backward,
                     lrn_forward, max_pool2d_backward, max_pool2d_forward, nll_loss_backward, nll_loss_forward,
                     relu_backward, relu_forward, sgd_update, sigmoid_backward, sigmoid_forward, softmax_backward,
                     softmax_forward, tanh_backward, tanh_forward)

__all__ = [name for name in dir() if not name.startswith("_")]
