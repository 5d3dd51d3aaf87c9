# Kept as it ran: scratch/probe_calls.py of call 2 (before/call2.sh runs it from scratch/, which git ignores).
"""Scratch probe (session 6): host µs per call of the one-call layers, batch norm's kept calls and the optimizer
step at ResNet-20 b128's shapes, with each call's own-time by function (cProfile, µs per call)."""
import cProfile, pstats, statistics, sys, time
sys.path.insert(0, ".")
import numpy as np
import minidnn, models
from minidnn import backend
from minidnn import primitives as P
from minidnn.primitives import optimizer as O, _cuda, blas

cupy = backend.cupy()
rng = np.random.default_rng(0)
def g(*shape, dtype=np.float32):
    return cupy.asarray(rng.standard_normal(shape).astype(dtype))

def per_call_us(call, repeats=2000, loops=5):
    for _ in range(100):
        call()
    samples = []
    for _ in range(loops):
        cupy.cuda.Device().synchronize()
        s = time.perf_counter()
        for _ in range(repeats):
            call()
        samples.append((time.perf_counter() - s) / repeats * 1e6)
        cupy.cuda.Device().synchronize()
    return statistics.median(samples)

def profile(call, calls=2000, rows=14):
    p = cProfile.Profile()
    p.enable()
    for _ in range(calls):
        call()
    p.disable()
    cupy.cuda.Device().synchronize()
    st = pstats.Stats(p).stats
    out = sorted(((v[2] / calls * 1e6, v[3] / calls * 1e6, v[1] / calls, f"{k[0].split('/')[-1]}:{k[1]}({k[2]})") for k, v in st.items()), reverse=True)
    return "\n".join(f"      own {o:6.2f}  cum {c:6.2f}  calls {n:4.1f}  {name}" for o, c, n, name in out[:rows])

logits, target = g(128, 10), cupy.asarray(rng.integers(0, 10, 128))
feature, weight, bias = g(128, 64), g(10, 64), g(10)
pooled_in = g(128, 64, 8, 8)
log_probs = P.cross_entropy_forward(logits, target)[1]
loss_grad = cupy.ones((), dtype=np.float32)
dy = g(128, 10)
x, w, b = g(128, 16, 32, 32), g(16), g(16)
rm, rv, nbt = g(16), cupy.abs(g(16)), cupy.zeros(1, dtype=np.int64)
y, mean, invstd = P.batch_norm_forward_training(x, w, b, rm, rv, 0.1, 1e-5, True, nbt)
dyb = g(128, 16, 32, 32)
net = models.create("resnet20", num_classes=10).to("cuda")
params = [p.data for p in net.parameters()]
grads = [cupy.ones_like(p) for p in params]
bufs = [cupy.zeros_like(p) for p in params]
lr = cupy.full(1, 0.001, dtype=np.float64)
row = cupy.empty((2, 16), dtype=np.float32)
calls = {
  "linear_forward": lambda: P.linear_forward(feature, weight, bias),
  "linear_backward_data": lambda: P.linear_backward_data(dy, weight),
  "linear_backward_weight": lambda: P.linear_backward_weight(feature, dy),
  "bias_backward": lambda: P.bias_backward(dy, -1),
  "cross_entropy_forward": lambda: P.cross_entropy_forward(logits, target),
  "cross_entropy_backward": lambda: P.cross_entropy_backward(loss_grad, log_probs, target),
  "adaptive_avg_pool2d_forward": lambda: P.adaptive_avg_pool2d_forward(pooled_in, 1),
  "adaptive_avg_pool2d_backward": lambda: P.adaptive_avg_pool2d_backward(dy.reshape(128, 10, 1, 1), (128, 10, 8, 8)),
  "batch_norm_forward_training (kept)": lambda: P.batch_norm_forward_training(x, w, b, rm, rv, 0.1, 1e-5, True, nbt),
  "batch_norm_backward_training (kept)": lambda: P.batch_norm_backward_training(dyb, x, w, mean, invstd, y),
  "sgd_update_multi (resnet20's 65 params)": lambda: P.sgd_update_multi(params, grads, bufs, lr=lr, momentum=0.9, weight_decay=5e-4),
  "O._check_lists (3 lists)": lambda: O._check_lists(O._multi_names, [("param", params), ("grad", grads), ("momentum_buffer", bufs)]),
  "blas.gemm (128,64)x(64,10)": lambda: blas.gemm(feature, weight.T),
  "raw gemmEx via _Cublas.gemm": None,
  "cupy.empty((2,16)) + unpack rows": lambda: tuple(cupy.empty((2, 16), dtype=np.float32)),
  "two cupy.empty(16)": lambda: (cupy.empty(16, dtype=np.float32), cupy.empty(16, dtype=np.float32)),
  "steady_key 6 arrays": lambda: _cuda.steady_key("f", x, w, b, rm, rv, nbt),
  "x.flags.c_contiguous": lambda: x.flags.c_contiguous,
  "x.shape": lambda: x.shape,
  "x.strides": lambda: x.strides,
  "x.dtype": lambda: x.dtype,
  "x.reshape(128*16, 1024)": lambda: x.reshape(2048, 1024),
  "weight.T": lambda: weight.T,
  "cupy.cuda.get_current_stream()": lambda: cupy.cuda.get_current_stream(),
}
out = blas.gemm(feature, weight.T)
cb = blas._cublas()
calls["raw gemmEx via _Cublas.gemm"] = lambda: cb.gemm(True, False, 10, 128, 64, 1.0, weight, 64, 0, feature, 64, 0, 0.0, out, 10, 0, 1)
for name, call in calls.items():
    print(f"{name}: {per_call_us(call):.2f} us", flush=True)
for name in list(calls)[:12]:
    print(f"== {name}\n{profile(calls[name])}", flush=True)
