"""The end-to-end benchmark: minidnn vs a naive Caffe-style engine vs PyTorch + cuDNN.

    python benchmarks/bench.py                                   # every model, on the GPU
    python benchmarks/bench.py --models resnet20 --batch 32      # a subset, another batch
    python benchmarks/bench.py --device cpu --quick              # a small CPU smoke run

For each model and batch it measures, per engine (minidnn's primitives, the naive engine, PyTorch
with cuDNN when importable) and per math mode (fp32; TF32 on the GPU): the median training-step
time over the timed steps (device events), images per second, the forward-only (inference) time
and the peak device memory. Engines take turns in rounds within one process, so slow drifts of
the machine hit them alike. It also checks that the engines agree (same weights, same batch: the
loss and every gradient within float32 tolerance), and times every convolution layer's three
directions with minidnn, the naive engine and cuDNN, with the algorithm and workspace minidnn
chose. Results: JSON, a markdown table and a PNG chart under --out.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import minidnn  # noqa: E402
import minidnn.functional as F  # noqa: E402
import models  # noqa: E402
from minidnn import backend, optim  # noqa: E402
from minidnn.engine import current as current_engine  # noqa: E402
from minidnn.primitives.conv.problem import make_problem  # noqa: E402

# name: (model in models.MODELS, image side, batches), as the cuDNN and μ-cuDNN papers measured
SUITE = {
    "caffenet": ("alexnet_caffe", 227, (128, 256)),
    "resnet18": ("resnet18", 224, (64,)),
    "resnet50": ("resnet50", 224, (64,)),
    "resnet20": ("resnet20", 32, (128,)),
}
QUICK = {"resnet20": ("resnet20", 32, (8,)), "tiny": ("tiny_cnn", 32, (8,))}


# ----------------------------------------------------------------------------------------------
# Timing and memory on one device
# ----------------------------------------------------------------------------------------------
class Clock:
    """Times callables: CUDA events on the GPU (CuPy's or PyTorch's), perf_counter on the CPU."""

    def __init__(self, device: str) -> None:
        self.gpu = device.startswith("cuda")

    def time(self, function: Callable[[], Any], repeats: int, torch_events: bool = False) -> list[float]:
        """Milliseconds of each of ``repeats`` calls."""
        times = []
        for _ in range(repeats):
            if not self.gpu:
                start = time.perf_counter()
                function()
                times.append(1000 * (time.perf_counter() - start))
                continue
            if torch_events:
                import torch  # noqa: PLC0415

                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                function()
                end.record()
                end.synchronize()
                times.append(begin.elapsed_time(end))
            else:
                cupy = backend.cupy()
                begin, end = cupy.cuda.Event(), cupy.cuda.Event()
                begin.record()
                function()
                end.record()
                end.synchronize()
                times.append(cupy.cuda.get_elapsed_time(begin, end))
        return times


# ----------------------------------------------------------------------------------------------
# Engines: a training step and a forward pass each
# ----------------------------------------------------------------------------------------------
class Engine:
    """A model, a batch and an SGD optimizer on one library; subclasses supply the library's pieces:
    ``cross_entropy``, ``no_grad``, ``gradients()``, ``use(tf32)``, ``reset_peak()`` and ``peak()``."""

    name = "engine"
    uses_torch_events = False

    def step(self) -> Any:
        loss = self.cross_entropy(self.model(self.x), self.y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss

    def forward(self) -> Any:
        self.model.eval()
        with self.no_grad():
            out = self.model(self.x)
        self.model.train()
        return out

    def loss_and_gradients(self) -> tuple[float, dict[str, np.ndarray]]:
        self.model.zero_grad()
        loss = self.cross_entropy(self.model(self.x), self.y)
        loss.backward()
        return loss.item(), self.gradients()

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")


class MinidnnEngine(Engine):
    """minidnn's model on the primitives library (``engine="minidnn"``) or on the naive engine."""

    cross_entropy, no_grad = staticmethod(F.cross_entropy), staticmethod(minidnn.no_grad)

    def __init__(self, name: str, model: Any, x: Any, y: Any, device: str) -> None:
        self.name, self.model, self.x, self.y, self.device = name, model, x, y, device
        self.optimizer = optim.SGD(model.parameters(), lr=0.001, momentum=0.9, weight_decay=5e-4)

    def use(self, tf32: bool) -> None:
        minidnn.set_engine(self.name)
        backend.set_allow_tf32(tf32)

    def gradients(self) -> dict[str, np.ndarray]:
        return {k: p.grad.numpy() for k, p in self.model.named_parameters()}

    def reset_peak(self) -> None:
        if self.on_gpu:
            backend.reset_peak_memory_stats()

    def peak(self) -> int | None:
        return backend.max_memory_allocated() if self.on_gpu else None


class TorchEngine(Engine):
    """The same model in PyTorch (cuDNN with ``cudnn.benchmark`` on), the reference."""

    name = "torch"
    uses_torch_events = True

    def __init__(self, model_name: str, model: Any, x: Any, y: Any, device: str) -> None:
        import torch  # noqa: PLC0415

        from benchmarks.torch_twins import torch_twin  # noqa: PLC0415

        self.torch, self.device = torch, device
        self.cross_entropy, self.no_grad = torch.nn.functional.cross_entropy, torch.no_grad
        torch.backends.cudnn.benchmark = True
        self.model = torch_twin(model_name, model).to(device)
        self.x = torch.from_numpy(x.numpy()).to(device)
        self.y = torch.from_numpy(y.numpy()).to(device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.001, momentum=0.9, weight_decay=5e-4)

    def use(self, tf32: bool) -> None:
        self.torch.backends.cuda.matmul.allow_tf32 = tf32
        self.torch.backends.cudnn.allow_tf32 = tf32

    def gradients(self) -> dict[str, np.ndarray]:
        return {k: p.grad.detach().cpu().numpy() for k, p in self.model.named_parameters()}

    def reset_peak(self) -> None:
        if self.on_gpu:
            self.torch.cuda.reset_peak_memory_stats()

    def peak(self) -> int | None:
        return self.torch.cuda.max_memory_allocated() if self.on_gpu else None


def torch_available(device: str) -> bool:
    try:
        import torch  # noqa: PLC0415, F401
        import torchvision  # noqa: PLC0415, F401
    except ImportError:
        return False
    return not device.startswith("cuda") or torch.cuda.is_available()


# ----------------------------------------------------------------------------------------------
# Agreement: same weights, same batch, same loss and gradients
# ----------------------------------------------------------------------------------------------
def set_dropout(model: Any, p: float) -> list[float]:
    """Set every dropout probability (minidnn or torch modules) to p; returns the old ones."""
    old = []
    for module in model.modules():
        if type(module).__name__ == "Dropout":
            old.append(module.p)
            module.p = p
    return old


def agreement(engines: list[Any]) -> dict[str, Any]:
    """Loss and gradient differences of each engine against minidnn's (dropout off: RNGs differ)."""
    results: dict[str, Any] = {}
    saved = [set_dropout(e.model, 0.0) for e in engines]
    reference = None
    for engine in engines:
        engine.use(tf32=False)
        loss, grads = engine.loss_and_gradients()
        if reference is None:
            reference = (loss, grads)
            results[engine.name] = {"loss": loss}
            continue
        # One relative difference over all gradients together: a per-parameter ratio would blow up
        # for parameters whose gradient nearly cancels (float32 rounding against a tiny norm).
        difference = np.sqrt(sum(float(np.sum((grads[k] - reference[1][k]) ** 2)) for k in reference[1]))
        size = np.sqrt(sum(float(np.sum(reference[1][k] ** 2)) for k in reference[1]))
        results[engine.name] = {"loss": loss, "loss_relative_difference": abs(loss - reference[0]) / abs(reference[0]),
                                "gradient_relative_difference": difference / max(size, 1e-30)}
    for engine, old in zip(engines, saved):
        it = iter(old)
        for module in engine.model.modules():
            if type(module).__name__ == "Dropout":
                module.p = next(it)
    return results


# ----------------------------------------------------------------------------------------------
# One model at one batch size
# ----------------------------------------------------------------------------------------------
def measure_model(key: str, model_name: str, image: int, batch: int, args: argparse.Namespace,
                  clock: Clock) -> dict[str, Any]:
    minidnn.manual_seed(0)
    model = models.create(model_name, num_classes=1000 if image > 32 else 10).to(args.device)
    rng = np.random.default_rng(0)
    x = minidnn.tensor(rng.standard_normal((batch, 3, image, image)).astype(np.float32), device=args.device)
    y = minidnn.tensor(rng.integers(0, 1000 if image > 32 else 10, batch), device=args.device)
    engines: list[Any] = [MinidnnEngine(name, model, x, y, args.device) for name in args.engines if name != "torch"]
    if "torch" in args.engines and torch_available(args.device):
        engines.append(TorchEngine(model_name, model, x, y, args.device))
    modes = [False, True] if args.device.startswith("cuda") and args.tf32 == "both" else [args.tf32 == "on"]
    record: dict[str, Any] = {"model": key, "architecture": model_name, "batch": batch, "image_size": image,
                              "agreement": agreement(engines), "engines": {}}
    runs = [(engine, tf32) for tf32 in modes for engine in engines]
    times: dict[str, list[float]] = {}
    forward: dict[str, list[float]] = {}
    for engine, tf32 in runs:  # warm up (kernels compile, cuDNN autotunes), then the isolated peak
        label = f"{engine.name}/{'tf32' if tf32 else 'fp32'}"
        engine.use(tf32)
        clock.time(engine.step, args.warmup, engine.uses_torch_events)
        clock.time(engine.forward, 1, engine.uses_torch_events)
        gc.collect()
        engine.reset_peak()
        clock.time(engine.step, 1, engine.uses_torch_events)
        record["engines"][label] = {"peak_bytes": engine.peak()}
        times[label], forward[label] = [], []
    for _ in range(args.rounds):  # engines take turns, so a slow spell of the machine hits all alike
        for engine, tf32 in runs:
            label = f"{engine.name}/{'tf32' if tf32 else 'fp32'}"
            engine.use(tf32)
            times[label] += clock.time(engine.step, args.steps, engine.uses_torch_events)
            forward[label] += clock.time(engine.forward, max(1, args.steps // 2), engine.uses_torch_events)
    for label in times:
        step_ms = statistics.median(times[label])
        record["engines"][label].update(step_ms=step_ms, images_per_second=batch / step_ms * 1000,
                                        forward_ms=statistics.median(forward[label]), steps_timed=len(times[label]))
    for mode in ("fp32", "tf32"):
        ours = record["engines"].get(f"minidnn/{mode}")
        for other in ("naive", "torch"):
            theirs = record["engines"].get(f"{other}/{mode}")
            if ours and theirs:
                record[f"speedup_vs_{other}_{mode}"] = theirs["step_ms"] / ours["step_ms"]
                record[f"minidnn_over_{other}_{mode}"] = ours["step_ms"] / theirs["step_ms"]
    if not args.no_layers:
        record["layers"] = layer_table(model, x, engines, args, clock)
    minidnn.set_engine("minidnn")
    backend.set_allow_tf32(False)
    return record


# ----------------------------------------------------------------------------------------------
# Per-layer convolution table
# ----------------------------------------------------------------------------------------------
def conv_layers(model: Any, x: Any) -> list[tuple[str, Any, Any]]:
    """(name, layer, input shape) of every Conv2d, in forward order, from one forward pass."""
    found: list[tuple[str, Any, Any]] = []
    names = {id(m): n for n, m in model.named_modules()}
    original = minidnn.nn.Conv2d.forward

    def recording(self, inputs):
        found.append((names.get(id(self), "?"), self, inputs.shape))
        return original(self, inputs)

    minidnn.nn.Conv2d.forward = recording
    try:
        with minidnn.no_grad():
            model(x)
    finally:
        minidnn.nn.Conv2d.forward = original
    return found


def layer_table(model: Any, x: Any, engines: list[Any], args: argparse.Namespace, clock: Clock) -> list[dict]:
    from minidnn.primitives.conv import api  # noqa: PLC0415

    xp = backend.get_array_module(x.data)
    rows, seen = [], {}
    torch_engine = next((e for e in engines if e.name == "torch"), None)
    for name, layer, x_shape in conv_layers(model, x):
        key = (tuple(x_shape), tuple(layer.weight.shape), layer.stride, layer.padding, layer.dilation, layer.groups)
        if key in seen:
            seen[key]["layers"].append(name)
            continue
        problem = make_problem(x_shape, layer.weight.shape, layer.stride, layer.padding, layer.dilation, layer.groups,
                               np.dtype(np.float32), "cuda" if xp is not np else "cpu")
        data = xp.asarray(np.random.default_rng(1).standard_normal(x_shape).astype(np.float32))
        weight = layer.weight.data
        dy = xp.asarray(np.random.default_rng(2).standard_normal(problem.y_shape).astype(np.float32))
        args_ = (layer.stride, layer.padding, layer.dilation, layer.groups)
        row = {"layers": [name], "shape": problem.describe(), "gflop_per_direction": problem.flops() / 1e9}
        chosen = {}
        api.call_observer = lambda direction, p, plan: chosen.setdefault(
            direction, {"algorithm": "+".join(sorted(set(plan.algorithms))), "micro_batch": plan.segments[0][0],
                        "workspace_bytes": plan.workspace_bytes})
        for engine_name in [e for e in args.engines if e != "torch"]:
            minidnn.set_engine(engine_name)
            P = current_engine()
            calls = {
                "forward": lambda: P.conv2d_forward(data, weight, *args_),
                "backward_data": lambda: P.conv2d_backward_data(dy, weight, x_shape, *args_),
                "backward_filter": lambda: P.conv2d_backward_filter(data, dy, weight.shape, *args_),
            }
            for direction, call in calls.items():
                clock.time(call, 1)
                row[f"{engine_name}_{direction}_ms"] = statistics.median(clock.time(call, args.layer_repeats))
        api.call_observer = None
        minidnn.set_engine("minidnn")
        row["minidnn_algorithms"] = chosen
        if torch_engine is not None:
            row.update(torch_layer_times(torch_engine.torch, problem, args_, args, clock))
        seen[key] = row
        rows.append(row)
    return rows


def torch_layer_times(torch: Any, problem: Any, conv_args: tuple, args: argparse.Namespace, clock: Clock) -> dict:
    device = args.device
    x = torch.randn(problem.x_shape, device=device, requires_grad=False)
    w = torch.randn(problem.w_shape, device=device)
    dy = torch.randn(problem.y_shape, device=device)
    stride, padding, dilation, groups = conv_args
    calls = {
        "forward": lambda: torch.nn.functional.conv2d(x, w, None, stride, padding, dilation, groups),
        "backward_data": lambda: torch.nn.grad.conv2d_input(problem.x_shape, w, dy, stride, padding, dilation, groups),
        "backward_filter": lambda: torch.nn.grad.conv2d_weight(x, problem.w_shape, dy, stride, padding, dilation, groups),
    }
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    out = {}
    for direction, call in calls.items():
        clock.time(call, 2, torch_events=True)
        out[f"torch_{direction}_ms"] = statistics.median(clock.time(call, args.layer_repeats, torch_events=True))
    return out


# ----------------------------------------------------------------------------------------------
# Reports
# ----------------------------------------------------------------------------------------------
def machine(device: str) -> dict[str, Any]:
    info = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "python": platform.python_version(),
            "numpy": np.__version__, "platform": platform.platform(), "device": device,
            "minidnn": minidnn.__version__}
    if device.startswith("cuda"):
        cupy = backend.cupy()
        properties = cupy.cuda.runtime.getDeviceProperties(0)
        info.update(gpu=properties["name"].decode(), cupy=cupy.__version__,
                    cuda_runtime=cupy.cuda.runtime.runtimeGetVersion())
    try:
        import torch  # noqa: PLC0415

        info.update(torch=torch.__version__, cudnn=torch.backends.cudnn.version())
    except ImportError:
        pass
    return info


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# minidnn benchmark, {report['machine'].get('gpu', report['machine']['device'])}, "
             f"{report['machine']['date'][:10]}", "",
             "| model | batch | engine | mode | step ms | images/s | forward ms | peak MiB |",
             "|---|---|---|---|---|---|---|---|"]
    for record in report["results"]:
        for label, values in record["engines"].items():
            engine, mode = label.split("/")
            peak = values["peak_bytes"]
            lines.append(f"| {record['model']} | {record['batch']} | {engine} | {mode} | {values['step_ms']:.2f} | "
                         f"{values['images_per_second']:.0f} | {values['forward_ms']:.2f} | "
                         f"{'-' if peak is None else f'{peak / 2**20:.0f}'} |")
    lines += ["", "| model | batch | mode | minidnn speed-up over naive | minidnn / torch step time |", "|---|---|---|---|---|"]
    for record in report["results"]:
        for mode in ("fp32", "tf32"):
            if f"speedup_vs_naive_{mode}" in record or f"minidnn_over_torch_{mode}" in record:
                naive = record.get(f"speedup_vs_naive_{mode}")
                torch_ratio = record.get(f"minidnn_over_torch_{mode}")
                lines.append(f"| {record['model']} | {record['batch']} | {mode} | "
                             f"{'-' if naive is None else f'{naive:.2f}x'} | "
                             f"{'-' if torch_ratio is None else f'{torch_ratio:.2f}'} |")
    lines += ["", "Agreement (fp32, dropout off): relative difference of the loss, and of all gradients together "
              "(‖g − g_minidnn‖ / ‖g_minidnn‖), against minidnn's primitives.", "",
              "| model | batch | engine | loss | gradients |",
              "|---|---|---|---|---|"]
    for record in report["results"]:
        for engine, values in record["agreement"].items():
            if "loss_relative_difference" in values:
                lines.append(f"| {record['model']} | {record['batch']} | {engine} | "
                             f"{values['loss_relative_difference']:.1e} | "
                             f"{values['gradient_relative_difference']:.1e} |")
    for record in report["results"]:
        if not record.get("layers"):
            continue
        lines += ["", f"## Convolution layers of {record['model']}, batch {record['batch']} (fp32, ms)", "",
                  "| layers | shape | fwd minidnn | fwd naive | fwd cuDNN | bwd-data minidnn | bwd-data naive | "
                  "bwd-data cuDNN | bwd-filter minidnn | bwd-filter naive | bwd-filter cuDNN | algorithm, workspace |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for row in record["layers"]:
            cells = []
            for direction in ("forward", "backward_data", "backward_filter"):
                for engine in ("minidnn", "naive", "torch"):
                    value = row.get(f"{engine}_{direction}_ms")
                    cells.append("-" if value is None else f"{value:.3f}")
            short = {"forward": "fwd", "backward_data": "bwd-data", "backward_filter": "bwd-filter"}
            algorithms = ", ".join(f"{short[d]} {v['algorithm']} {v['workspace_bytes'] / 2**20:.1f} MiB "
                                   f"(micro-batch {v['micro_batch']})" for d, v in row["minidnn_algorithms"].items())
            names = row["layers"][0] + (f" (+{len(row['layers']) - 1})" if len(row["layers"]) > 1 else "")
            lines.append(f"| {names} | {row['shape']} | " + " | ".join(cells) + f" | {algorithms} |")
    return "\n".join(lines) + "\n"


def chart(report: dict[str, Any], path: str) -> bool:
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        from matplotlib import pyplot  # noqa: PLC0415
    except ImportError:
        return False
    records = report["results"]
    labels = sorted({label for r in records for label in r["engines"]})
    figure, axes = pyplot.subplots(figsize=(max(6, 2.2 * len(records)), 4))
    width = 0.8 / max(len(labels), 1)
    for i, label in enumerate(labels):
        values = [r["engines"].get(label, {}).get("step_ms", 0) for r in records]
        axes.bar(np.arange(len(records)) + i * width, values, width, label=label)
    axes.set_xticks(np.arange(len(records)) + width * (len(labels) - 1) / 2)
    axes.set_xticklabels([f"{r['model']}\nbatch {r['batch']}" for r in records])
    axes.set_ylabel("training step (ms, lower is better)")
    axes.set_yscale("log")
    axes.legend(fontsize=8)
    axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
    return True


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--models", default=None, help=f"comma-separated subset of {', '.join(SUITE)}")
    parser.add_argument("--batch", type=int, default=None, help="override every model's batch size")
    parser.add_argument("--image-size", type=int, default=None, help="override every model's input side")
    parser.add_argument("--engines", default="minidnn,naive,torch", help="comma-separated: minidnn, naive, torch")
    parser.add_argument("--tf32", default="both", choices=["off", "on", "both"], help="math modes to time (GPU)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4, help="turns each engine takes")
    parser.add_argument("--steps", type=int, default=6, help="timed steps per engine per round")
    parser.add_argument("--layer-repeats", type=int, default=5)
    parser.add_argument("--no-layers", action="store_true", help="skip the per-layer convolution table")
    parser.add_argument("--quick", action="store_true", help="tiny models and batches (a CPU smoke run)")
    parser.add_argument("--out", default="benchmarks/results", help="directory for bench.json, bench.md, bench.png")
    parser.add_argument("--name", default="bench", help="file name stem of the outputs")
    parser.add_argument("--merge", nargs="+", metavar="JSON", help="combine earlier runs' JSON files into one "
                        "report (no measuring)")
    args = parser.parse_args(argv)
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = set(args.engines) - {"minidnn", "naive", "torch"}
    if unknown:
        parser.error(f"unknown engines {sorted(unknown)}; choose from minidnn, naive, torch")
    suite = QUICK if args.quick else SUITE
    chosen = suite if args.models is None else {m: suite[m] for m in args.models.split(",") if m in suite}
    if args.models and len(chosen) != len(args.models.split(",")):
        parser.error(f"--models must be a subset of {', '.join(suite)}")
    args.suite = chosen
    return args


def write_report(report: dict[str, Any], out: str, name: str) -> str:
    """bench.json, bench.md and bench.png (each written to a temporary file, then renamed)."""
    os.makedirs(out, exist_ok=True)
    stem = os.path.join(out, name)
    text = markdown(report)
    for suffix, content in ((".json", json.dumps(report, indent=1)), (".md", text)):
        with open(stem + suffix + ".tmp", "w") as file:
            file.write(content)
        os.replace(stem + suffix + ".tmp", stem + suffix)
    chart(report, stem + ".png")
    return text


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.merge:
        parts = []
        for path in args.merge:
            with open(path) as file:
                parts.append(json.load(file))
        report = {"machine": parts[0]["machine"], "settings": [p["settings"] for p in parts],
                  "results": [record for part in parts for record in part["results"]]}
        print(write_report(report, args.out, args.name))
        return report
    if args.device.startswith("cuda") and not minidnn.cuda.is_available():
        raise SystemExit("bench.py: error: --device cuda but CUDA is not available (use --device cpu --quick)")
    clock = Clock(args.device)
    report: dict[str, Any] = {"machine": machine(args.device), "settings": {k: v for k, v in vars(args).items()
                                                                             if k != "suite"}, "results": []}
    for key, (model_name, image, batches) in args.suite.items():
        for batch in ([args.batch] if args.batch else batches):
            print(f"{key}, batch {batch}...", flush=True)
            record = measure_model(key, model_name, args.image_size or image, batch, args, clock)
            report["results"].append(record)
            summary = ", ".join(f"{label} {v['step_ms']:.2f} ms" for label, v in record["engines"].items())
            print(f"  {summary}", flush=True)
    print(write_report(report, args.out, args.name))
    return report


if __name__ == "__main__":
    main()
