"""The naive engine: the baseline a framework has without a primitives library (Caffe before cuDNN).

Same functions, signatures, argument checks and results as :mod:`minidnn.primitives`, computed the
way BVLC/caffe computed them before cuDNN, so that the benchmark measures what the primitives buy:

* convolution one image at a time, im2col + one GEMM per group into a one-image column buffer,
  im2col recomputed in the backward pass, the 1x1 shortcut (:mod:`.conv`); biases and fully
  connected layers as GEMMs with a vector of ones (:mod:`.linear`);
* one CUDA kernel per layer direction where Caffe had one (caffe_layers.cu): max and average
  pooling (:mod:`.pooling`), ReLU (:mod:`.activation`), LRN (:mod:`.lrn`), and the solvers'
  per-parameter Regularize / SGDUpdate or AdamUpdate / Update passes (:mod:`.optimizer`);
* everything else as plain array expressions, one pass (on the GPU, one CuPy kernel and one
  temporary) per operation: batch norm, softmax and the losses, dropout (:mod:`.plain`), sigmoid,
  tanh, leaky ReLU, SiLU, GELU, layer norm, adaptive and dilated pooling.

Each module names the Caffe file it follows and where it departs from it: always towards PyTorch's
semantics, so that both engines compute the same numbers. Select it with
``minidnn.set_engine("naive")`` or ``with minidnn.use_engine("naive"):``.
"""
from ..primitives import pair
from .activation import (add_relu_forward, gelu_backward, gelu_forward, leaky_relu_backward, leaky_relu_forward,
                         relu_backward, relu_forward, sigmoid_backward, sigmoid_forward, silu_backward, silu_forward,
                         tanh_backward, tanh_forward)
from .conv import conv2d_backward_data, conv2d_backward_filter, conv2d_forward
from .convert import float_to_half, half_to_float
from .linear import bias_add, bias_backward, linear_backward_data, linear_backward_weight, linear_forward
from .lrn import lrn_backward, lrn_forward
from .optimizer import (adam_update, adam_update_multi, sgd_update, sgd_update_multi, unscale_gradients_multi,
                        update_loss_scale)
from .plain import (batch_norm_backward_inference, batch_norm_backward_training, batch_norm_forward_inference,
                    batch_norm_forward_training, cross_entropy_backward, cross_entropy_forward, dropout_backward,
                    dropout_forward, layer_norm_backward, layer_norm_forward, log_softmax_backward, log_softmax_forward, nll_loss_backward, nll_loss_forward,
                    softmax_backward, softmax_forward)
from .pooling import (adaptive_avg_pool2d_backward, adaptive_avg_pool2d_forward, avg_pool2d_backward,
                      avg_pool2d_forward, max_pool2d_backward, max_pool2d_forward)

__all__ = [name for name in dir() if not name.startswith("_") and name not in {
    "activation", "conv", "kernels", "linear", "lrn", "optimizer", "plain", "pooling"}]
