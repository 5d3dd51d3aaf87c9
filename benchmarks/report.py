"""The benchmark's reports: sums over convolution layers, the markdown tables and the PNG chart.

Everything here reads the records the workers wrote (see measure.py), so a report can be rebuilt
from JSON alone (``bench.py --merge``). Records of one model and batch are joined by math mode;
minidnn's per-setting records are each compared with the naive engine's and PyTorch's, which run
once per mode.
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Any

DIRECTIONS = ("forward", "backward_data", "backward_filter")
SHORT = {"forward": "fwd", "backward_data": "bwd-data", "backward_filter": "bwd-filter"}
ENGINE_ORDER = ("minidnn", "minidnn-graph", "naive", "torch")
# Issue 10's targets: the conv sum against cuDNN's, the slowest layer-direction, the whole step; issue 24's
# layer-direction bar in the half types (each at least 0.8x cuDNN's speed).
CONV_SUM_TARGET = {"fp32": 1.1, "tf32": 1.5}
LAYER_SPEED_TARGET = {"fp32": 0.7, "tf32": 0.7, "bf16": 0.8, "fp16": 0.8}
STEP_TARGET = {"fp32": 1.3}


PRECISIONS = ("fp32", "tf32", "bf16", "fp16")  # bench.py's --precision, in the reports' order


def precision_of(record: dict[str, Any]) -> str:
    """A record's precision: its ``precision``, or for a record from before --precision its TF32 switch."""
    return record.get("precision") or ("tf32" if record.get("tf32") else "fp32")



def size_text(size: int) -> str:
    """Bytes as the largest binary unit that divides them: 67108864 -> '64MiB'."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size and size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"


def setting_label(setting: dict[str, Any] | None) -> str:
    """'64MiB off', '8MiB wd powers_of_two', or '-' for engines without convolution settings."""
    if not setting:
        return "-"
    label = f"{size_text(setting['workspace_limit'])} {setting['microbatch']}"
    return label + (f" {setting['batch_policy']}" if setting["microbatch"] != "off" else "")


def conv_sum(rows: list[dict[str, Any]], key: str = "ms") -> float | None:
    """Milliseconds of convolution in one training step: every distinct shape's time in each
    direction (``key``: "ms" wall per call, "gpu_ms" kernel time per call) times the number of
    layers that run that direction (``runs``; the first layer runs no backward-data, so its
    count there is 0). None when some time is missing (no GPU profile)."""
    total = 0.0
    for row in rows:
        for direction, count in row["runs"].items():
            if count:
                value = row["times"][direction].get(key)
                if value is None:
                    return None
                total += count * value
    return total


def _engine_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("kind") == "engine"]


def _find(records: list[dict[str, Any]], model: str, batch: int, engine: str, precision: str,
          needs: str | None = None) -> dict[str, Any] | None:
    """The measured record of an engine that runs once per mode (naive, torch): the first one, or the
    first holding ``needs`` ("layers", "wall_ms"), since merged runs can hold a layers-only record and a
    whole-step one of the same engine."""
    for record in _engine_records(records):
        if (record["model"], record["batch"], record["engine"], precision_of(record)) == (model, batch, engine, precision) \
                and "error" not in record and "skipped" not in record and (needs is None or record.get(needs)):
            return record
    return None


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else numerator / denominator


def _number(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def _check(value: float | None, target: float | None, at_most: bool = True) -> str:
    """The value, marked ✓ or ✗ against its target."""
    if value is None:
        return "-"
    if target is None:
        return f"{value:.2f}"
    return f"{value:.2f} {'✓' if (value <= target if at_most else value >= target) else '✗'}"


def groups(records: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """(model, batch) in the order first measured."""
    seen: list[tuple[str, int]] = []
    for record in records:
        key = (record.get("model"), record.get("batch"))
        if record.get("kind") in ("engine", "agreement") and key not in seen:
            seen.append(key)
    return seen


def conv_comparison(records: list[dict[str, Any]], ours: dict[str, Any]) -> dict[str, Any]:
    """Sums over the layers training runs for one minidnn record, against cuDNN's and the naive
    engine's (wall and kernel time), the slowest layer-direction against cuDNN (by kernel time
    where profiled), the step against PyTorch's, and the step time outside the convolutions."""
    torch = _find(records, ours["model"], ours["batch"], "torch", precision_of(ours), "layers")
    naive = _find(records, ours["model"], ours["batch"], "naive", precision_of(ours), "layers")
    torch_step = _find(records, ours["model"], ours["batch"], "torch", precision_of(ours), "wall_ms")
    result: dict[str, Any] = {}
    for name, record in (("minidnn", ours), ("cudnn", torch), ("naive", naive)):
        if record and record.get("layers"):
            result[f"{name}_ms"] = conv_sum(record["layers"])
            result[f"{name}_gpu_ms"] = conv_sum(record["layers"], "gpu_ms")
    result["ratio"] = _ratio(result["minidnn_ms"], result.get("cudnn_ms"))
    result["gpu_ratio"] = _ratio(result["minidnn_gpu_ms"], result.get("cudnn_gpu_ms"))
    if torch and torch.get("layers"):
        key = "gpu_ms" if result["gpu_ratio"] is not None else "ms"
        theirs = {row["shape"]: row for row in torch["layers"]}
        slowest = None
        for row in ours["layers"]:
            for direction, count in row["runs"].items():
                if count and row["shape"] in theirs:
                    speed = _ratio(theirs[row["shape"]]["times"][direction][key], row["times"][direction][key])
                    if speed is not None and (slowest is None or speed < slowest[0]):
                        slowest = (speed, f"{row['layers'][0]} {SHORT[direction]}")
        if slowest:
            result["slowest_speed"], result["slowest_layer"] = slowest
            result["slowest_basis"] = "GPU" if key == "gpu_ms" else "wall"
    # The step outside its convolutions: wall time, and the GPU's active time (kernel overlaps
    # counted once, as in the layers' GPU times).
    for name, record, conv in (("minidnn", ours, "minidnn"), ("torch", torch_step, "cudnn")):
        if record and record.get("wall_ms") is not None and result.get(f"{conv}_ms") is not None:
            result[f"{name}_outside_wall_ms"] = record["wall_ms"] - result[f"{conv}_ms"]
            if record.get("gpu_active_ms") is not None and result.get(f"{conv}_gpu_ms") is not None:
                result[f"{name}_outside_busy_ms"] = record["gpu_active_ms"] - result[f"{conv}_gpu_ms"]
    if torch_step and ours.get("wall_ms"):
        result["step_ratio"] = ours["wall_ms"] / torch_step["wall_ms"]
    return result


# The kinds a step's kernels are summed by (bench.md's "GPU-busy by kind"), matched in this order on the lower-case
# kernel name: ours and cuDNN's / PyTorch's names alike.
KERNEL_KINDS = (("batch norm", ("batchnorm", "bn_")),
                ("layout changes", ("transpose",)),
                ("adds", ("cupy_add", "functor_add")),
                ("ReLU", ("relu", "threshold", "clamp")),
                ("convolutions and GEMMs", ("gemm", "conv", "winograd", "im2col", "col2im", "fprop", "dgrad", "wgrad",
                                            "nvjet", "init_device_workspace", "filter_gradient",
                                            "filter_to_channels_last", "_sampled")))
OTHER_KERNELS = "other (pooling, loss, optimizer, copies)"


def kernel_kind(name: str) -> str:
    """The kind of kernel ``name`` is (KERNEL_KINDS), or OTHER_KERNELS."""
    lower = name.lower()
    return next((kind for kind, marks in KERNEL_KINDS if any(mark in lower for mark in marks)), OTHER_KERNELS)


def kernels_by_kind(kernel_names: list[list[Any]]) -> dict[str, tuple[float, float]]:
    """A record's ``kernel_names`` ([name, ms a step, kernels a step]) summed by kind: kind -> (ms, kernels)."""
    kinds: dict[str, tuple[float, float]] = {}
    for name, ms, count in kernel_names:
        kind = kernel_kind(name)
        total, kernels = kinds.get(kind, (0.0, 0.0))
        kinds[kind] = (total + ms, kernels + count)
    return kinds


def kind_section(records: list[dict[str, Any]]) -> list[str]:
    """bench.md's "GPU-busy by kind" table of one model and batch: a column per engine record profiled with kernel
    names, a row per kind, and the GPU-busy time of the names beyond those kept."""
    named = [r for r in records if r.get("kernel_names")]
    if not named:
        return []
    sums = [kernels_by_kind(r["kernel_names"]) for r in named]
    kinds = [kind for kind, _ in KERNEL_KINDS] + [OTHER_KERNELS]
    lines = ["", "GPU-busy ms a step by kind of kernel (kernels a step in brackets), from one profiled step's "
             "longest-running kernel names:", "",
             "| kind | " + " | ".join(f"{r['engine']} {precision_of(r)}" for r in named) + " |",
             "|---|" + "---|" * len(named)]
    for kind in kinds:
        cells = [f"{total[kind][0]:.2f} ({total[kind][1]:.0f})" if kind in total else "-" for total in sums]
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    rest = [r["gpu_busy_ms"] - sum(ms for ms, _ in total.values()) for r, total in zip(named, sums)]
    lines.append("| names beyond those kept | " + " | ".join(f"{ms:.2f}" for ms in rest) + " |")
    return lines


def markdown(report: dict[str, Any]) -> str:
    machine = report["machine"]
    records = report["records"]
    lines = [f"# minidnn benchmark, {machine.get('gpu', machine.get('device'))}, {machine.get('date', '')[:10]}", "",
             f"Machine: {machine.get('gpu', 'no GPU')} (driver {machine.get('driver', '-')}), host CPU "
             f"{machine.get('host_cpu', '-')}, CuPy {machine.get('cupy', '-')}, CUDA runtime "
             f"{machine.get('cuda_runtime', '-')}, PyTorch {machine.get('torch', '-')}, cuDNN {machine.get('cudnn', '-')}, "
             f"minidnn {machine.get('minidnn')} ({machine.get('commit') or 'no commit'}), Python {machine.get('python')}.",
             "", "Every engine, math mode and setting ran in its own process (docs/benchmarks.md: method). "
             "wall: median step time on the GPU timeline (CUDA events; perf_counter on the CPU); host: Python's time "
             "to issue the step; GPU-busy: the kernels' summed duration per step (CUPTI), with the time some kernel "
             "ran where kernels overlapped (active); copies: memcpy / memset per step; peak: that engine's own "
             "high-water mark."]
    for note in report.get("notes", []):
        lines += ["", f"Note: {note}"]
    for model, batch in groups(records):
        lines += ["", f"## {model}, batch {batch}", "",
                  "| engine | mode | setting | wall ms | host ms | GPU-busy ms | kernels/step | copies/step | forward ms | "
                  "peak MiB | vs naive (wall) | vs naive (GPU-busy) | / PyTorch (wall) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        mine = [r for r in _engine_records(records) if (r["model"], r["batch"]) == (model, batch)]
        mine.sort(key=lambda r: (PRECISIONS.index(precision_of(r)), ENGINE_ORDER.index(r["engine"])))
        for record in mine:
            mode = precision_of(record)
            engine = record["engine"] + (" (not captured: ran eagerly)" if record.get("captured") is False else "")
            head = f"| {engine} | {mode} | {setting_label(record.get('setting'))} |"
            if "error" in record or "skipped" in record:
                lines.append(f"{head} {record.get('skipped') or 'failed: ' + record['error'].splitlines()[-1]} "
                             + "| " * 9 + "|")
                continue
            if record.get("wall_ms") is None:
                continue  # a layers-only record
            naive = _find(records, model, batch, "naive", precision_of(record), "wall_ms")
            torch = _find(records, model, batch, "torch", precision_of(record), "wall_ms")
            compared = record["engine"] in ("minidnn", "minidnn-graph")
            copies = (f"{record['memcpy_per_step']:.0f} / {record['memset_per_step']:.0f}"
                      if "memcpy_per_step" in record else "-")
            peak = record.get("peak_bytes")
            lines.append(
                f"{head} {record['wall_ms']:.2f} | {record['host_ms']:.2f} | {_busy(record)} | "
                f"{_number(record.get('kernels_per_step'), 0)} | {copies} | {record['forward_ms']:.2f} | "
                f"{'-' if peak is None else f'{peak / 2**20:.0f}'} | "
                f"{_number(_ratio(naive and naive['wall_ms'], record['wall_ms']) if compared else None, 2, 'x')} | "
                f"{_number(_ratio(naive and naive.get('gpu_busy_ms'), record.get('gpu_busy_ms')) if compared else None, 2, 'x')} | "
                f"{_number(_ratio(record['wall_ms'], torch and torch['wall_ms']) if compared else None)} |")
        agreement = [r for r in records if r.get("kind") == "agreement" and (r["model"], r["batch"]) == (model, batch)]
        for record in agreement:
            if "agreement" not in record:
                lines += ["", f"Agreement: {record.get('skipped') or 'failed: ' + record['error'].splitlines()[-1]}"]
                continue
            lines += ["", "Agreement (fp32, dropout off, same weights and batch, its own process): relative "
                      "difference of the loss, and of all gradients together (‖g − g_minidnn‖ / ‖g_minidnn‖).", "",
                      "| engine | loss | loss difference | gradient difference |", "|---|---|---|---|"]
            for engine, values in record["agreement"].items():
                lines.append(f"| {engine} | {values['loss']:.6f} | {_sci(values.get('loss_relative_difference'))} | "
                             f"{_sci(values.get('gradient_relative_difference'))} |")
        lines += kind_section([r for r in mine if r.get("wall_ms") is not None])
        lines += conv_sections(records, model, batch)
    skipped = [r for r in records if "skipped" in r or "error" in r]
    if skipped:
        lines += ["", "## Cells not measured", ""]
        for record in skipped:
            what = " ".join(str(record.get(k)) for k in ("kind", "model", "batch", "engine") if record.get(k) is not None)
            reason = record.get("skipped") or record["error"].strip().splitlines()[-1]
            lines.append(f"* {what} {precision_of(record)} {setting_label(record.get('setting'))}: "
                         f"{reason}")
    return "\n".join(lines) + "\n"


def _busy(record: dict[str, Any]) -> str:
    """GPU-busy ms (kernel durations summed), with the active time where kernels overlapped."""
    busy, active = record.get("gpu_busy_ms"), record.get("gpu_active_ms")
    if busy is None:
        return "-"
    return f"{busy:.2f}" + (f" ({active:.2f} active)" if active is not None and active < 0.98 * busy else "")


def _sci(value: float | None) -> str:
    return "-" if value is None else f"{value:.1e}"


def conv_sections(records: list[dict[str, Any]], model: str, batch: int) -> list[str]:
    """The sums table, then per mode and setting the per-layer table, then per mode the algorithm menu."""
    ours = [r for r in _engine_records(records) if (r["model"], r["batch"], r["engine"]) == (model, batch, "minidnn")
            and r.get("layers")]
    if not ours:
        return []
    lines = ["", f"### Convolutions of {model}, batch {batch}: sums over the layers training runs", "",
             "Each distinct shape alone, per direction: wall ms per call (back-to-back calls, CUDA events) and GPU ms "
             "per call (the time its kernels ran, CUPTI), times the number of layers running that direction in a training "
             "step (no backward-data for the first layer). Targets, on GPU time: conv sum ≤ "
             f"{CONV_SUM_TARGET['fp32']}x cuDNN fp32, ≤ {CONV_SUM_TARGET['tf32']}x TF32; every layer-direction ≥ "
             f"{LAYER_SPEED_TARGET['fp32']}x cuDNN's speed in fp32 and TF32, ≥ {LAYER_SPEED_TARGET['bf16']}x in bf16 "
             f"and fp16; on wall time: step ≤ {STEP_TARGET['fp32']}x PyTorch fp32.", "",
             "| mode | setting | conv GPU ms: minidnn / cuDNN | minidnn / cuDNN (GPU) | conv wall ms: minidnn / cuDNN | "
             "minidnn / cuDNN (wall) | conv naive ms: GPU / wall | slowest layer-direction vs cuDNN (speed) | "
             "step minidnn / PyTorch (wall) | outside convs, wall ms: minidnn / PyTorch | outside convs, GPU-active ms: "
             "minidnn / PyTorch |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for record in sorted(ours, key=lambda r: PRECISIONS.index(precision_of(r))):
        mode = precision_of(record)
        sums = conv_comparison(records, record)
        slowest = (f"{sums['slowest_layer']} "
                   f"{_check(sums['slowest_speed'], LAYER_SPEED_TARGET.get(mode), at_most=False)} "
                   f"({sums['slowest_basis']})" if "slowest_speed" in sums else "-")
        lines.append(f"| {mode} | {setting_label(record.get('setting'))} | "
                     f"{_number(sums['minidnn_gpu_ms'])} / {_number(sums.get('cudnn_gpu_ms'))} | "
                     f"{_check(sums['gpu_ratio'], CONV_SUM_TARGET.get(mode))} | "
                     f"{_number(sums['minidnn_ms'])} / {_number(sums.get('cudnn_ms'))} | {_check(sums['ratio'], None)} | "
                     f"{_number(sums.get('naive_gpu_ms'))} / {_number(sums.get('naive_ms'))} | {slowest} | "
                     f"{_check(sums.get('step_ratio'), STEP_TARGET.get(mode))} | "
                     f"{_number(sums.get('minidnn_outside_wall_ms'))} / {_number(sums.get('torch_outside_wall_ms'))} | "
                     f"{_number(sums.get('minidnn_outside_busy_ms'))} / {_number(sums.get('torch_outside_busy_ms'))} |")
    for record in sorted(ours, key=lambda r: PRECISIONS.index(precision_of(r))):
        mode = precision_of(record)
        torch = _find(records, model, batch, "torch", precision_of(record), "layers")
        naive = _find(records, model, batch, "naive", precision_of(record), "layers")
        theirs = {row["shape"]: row for row in (torch or {}).get("layers") or []}
        naive_rows = {row["shape"]: row for row in (naive or {}).get("layers") or []}
        lines += ["", f"#### {model}, batch {batch}, {mode}, setting {setting_label(record.get('setting'))}: "
                  "ms per call, wall / GPU", "",
                  f"| layers | shape | direction | runs | minidnn {mode} | kernels | plan | naive {mode} | cuDNN {mode} | "
                  "speed vs cuDNN |", "|---|---|---|---|---|---|---|---|---|---|"]
        for row in record["layers"]:
            names = row["layers"][0] + (f" (+{len(row['layers']) - 1})" if len(row["layers"]) > 1 else "")
            for direction in DIRECTIONS:
                if not row["runs"][direction]:
                    continue
                mine = row["times"][direction]
                cudnn = theirs.get(row["shape"], {}).get("times", {}).get(direction, {})
                slow = naive_rows.get(row["shape"], {}).get("times", {}).get(direction, {})
                key = "gpu_ms" if mine.get("gpu_ms") is not None and cudnn.get("gpu_ms") is not None else "ms"
                lines.append(f"| {names} | {row['shape']} | {SHORT[direction]} | {row['runs'][direction]} | "
                             f"{_pair(mine)} | {_number(mine.get('kernels'), 0)} | "
                             f"{'-' if 'plan' not in mine else _plan_text(mine['plan'])} | {_pair(slow)} | {_pair(cudnn)} | "
                             f"{_check(_ratio(cudnn.get(key), mine[key]), LAYER_SPEED_TARGET.get(mode), at_most=False)}"
                             " |")
    for record in sorted(ours, key=lambda r: PRECISIONS.index(precision_of(r))):
        if not any("menu" in row for row in record["layers"]):
            continue
        mode = precision_of(record)
        names = sorted({name for row in record["layers"] for menu in row.get("menu", {}).values() for name in menu})
        lines += ["", f"#### Every algorithm of {model}, batch {batch}, {mode}: ms per call (wall / GPU), "
                  "workspace MiB", "",
                  "| layers | shape | direction | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
        for row in record["layers"]:
            for direction, menu in row.get("menu", {}).items():
                cells = []
                for name in names:
                    entry = menu.get(name, {})
                    cells.append("n/a" if entry.get("skipped") == "unsupported" else
                                 f"> limit ({entry['workspace_bytes'] / 2**20:.0f})" if "skipped" in entry else
                                 f"{_pair(entry)}, {entry['workspace_bytes'] / 2**20:.1f}" if entry else "-")
                lines.append(f"| {row['layers'][0]} | {row['shape']} | {SHORT[direction]} | " + " | ".join(cells) + " |")
    return lines


def _pair(timing: dict[str, Any]) -> str:
    """'0.213 / 0.041': wall / GPU ms per call (GPU '-' where not profiled)."""
    if timing.get("ms") is None:
        return "-"
    return f"{timing['ms']:.3f} / {_number(timing.get('gpu_ms'), 3)}"


def _plan_text(plan: dict[str, Any]) -> str:
    """'2×32 img gemm + 1×8 img gemm, 12.0 MiB' from a plan's segments (runs of equal ones merged)."""
    runs: list[list[Any]] = []
    for images, algorithm in plan["segments"]:
        if runs and runs[-1][1:] == [images, algorithm]:
            runs[-1][0] += 1
        else:
            runs.append([1, images, algorithm])
    parts = [f"{count}×{images} img {algorithm}" for count, images, algorithm in runs]
    return f"{' + '.join(parts)}, {plan['workspace_bytes'] / 2**20:.1f} MiB"


def chart(report: dict[str, Any], path: str) -> bool:
    """Wall step time per engine, mode and setting, with GPU-busy time drawn inside each bar."""
    try:
        import matplotlib  # noqa: PLC0415 - optional

        matplotlib.use("Agg")
        from matplotlib import pyplot  # noqa: PLC0415
    except ImportError:
        return False
    measured = [r for r in _engine_records(report["records"]) if r.get("wall_ms") is not None]
    keys = groups(measured)
    if not keys:
        return False
    labels = sorted({(PRECISIONS.index(precision_of(r)), ENGINE_ORDER.index(r["engine"]), r["engine"], setting_label(r.get("setting")))
                     for r in measured})
    figure, axes = pyplot.subplots(figsize=(max(6.0, 1.2 * len(keys) * max(1, len(labels)) ** 0.5 + 3), 4.5))
    width = 0.8 / len(labels)
    for i, (order, _, engine, setting) in enumerate(labels):
        precision = PRECISIONS[order]
        walls, busies = [], []
        for model, batch in keys:
            record = next((r for r in measured if (r["model"], r["batch"], precision_of(r), r["engine"],
                                                   setting_label(r.get("setting"))) == (model, batch, precision, engine,
                                                                                        setting)), {})
            walls.append(record.get("wall_ms") or 0)
            busies.append(record.get("gpu_busy_ms") or 0)
        positions = [k + i * width for k in range(len(keys))]
        name = f"{engine} {precision}" + ("" if setting == "-" else f" {setting}")
        axes.bar(positions, walls, width, label=name)
        axes.bar(positions, busies, width * 0.4, color="black", alpha=0.5)
    axes.set_xticks([k + width * (len(labels) - 1) / 2 for k in range(len(keys))])
    axes.set_xticklabels([f"{model}\nbatch {batch}" for model, batch in keys])
    axes.set_ylabel("training step ms (bar: wall; inner black bar: GPU-busy)")
    axes.set_yscale("log")
    axes.legend(fontsize=7)
    axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110, format="png")
    pyplot.close(figure)
    return True


def menu_chart(report: dict[str, Any], model: str, batch: int, precision: str, path: str) -> bool:
    """Every algorithm's kernel time (GPU ms per call) on each layer-direction of one model, from the
    algorithm menu of minidnn's record, with cuDNN's time on the same problem as a black bar:
    where each algorithm wins, measured. False when matplotlib or the records are missing."""
    try:
        import matplotlib  # noqa: PLC0415 - optional

        matplotlib.use("Agg")
        from matplotlib import pyplot  # noqa: PLC0415
    except ImportError:
        return False
    records = report["records"]
    ours = next((r for r in _engine_records(records) if (r["model"], r["batch"], r["engine"], precision_of(r))
                 == (model, batch, "minidnn", precision) and any("menu" in row for row in r.get("layers") or [])), None)
    if ours is None:
        return False
    torch = _find(records, model, batch, "torch", precision, "layers")
    theirs = {row["shape"]: row for row in (torch or {}).get("layers") or []}
    names = sorted({name for row in ours["layers"] for menu in row["menu"].values() for name in menu})
    groups_, timings = [], []
    for row in ours["layers"]:
        for direction, menu in row["menu"].items():
            groups_.append(f"{row['layers'][0]}\n{SHORT[direction]}")
            cudnn = theirs.get(row["shape"], {}).get("times", {}).get(direction, {})
            timings.append(({name: menu[name].get("gpu_ms") for name in names if name in menu}, cudnn.get("gpu_ms")))
    width = 0.85 / (len(names) + 1)
    figure, axes = pyplot.subplots(figsize=(min(22.0, 4.0 + 0.55 * len(groups_)), 6.0))
    for index, name in enumerate(names):
        axes.bar([g + index * width for g in range(len(groups_))],
                 [times.get(name) or 0 for times, _ in timings], width, label=name)
    axes.bar([g + len(names) * width for g in range(len(groups_))], [cudnn or 0 for _, cudnn in timings], width,
             color="black", label=f"cuDNN ({precision}, PyTorch's choice)")
    axes.set_xticks([g + width * len(names) / 2 for g in range(len(groups_))])
    axes.set_xticklabels(groups_, fontsize=7, rotation=90)
    axes.set_yscale("log")
    axes.set_ylabel("GPU ms per call (kernel time, log scale)")
    axes.set_xlabel("no bar: the algorithm does not support the problem, or its workspace exceeds the menu's limit",
                    fontsize=8)
    axes.set_title(f"{model}, batch {batch}, {precision}: every convolution algorithm on every layer-direction")
    axes.legend(fontsize=7, ncol=4)
    axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110, format="png")
    pyplot.close(figure)
    return True


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.report REPORT.json MODEL BATCH fp32|tf32 OUT.png``: the algorithm-menu chart."""
    parser = argparse.ArgumentParser(description=menu_chart.__doc__.split("\n\n")[0])
    parser.add_argument("report")
    parser.add_argument("model")
    parser.add_argument("batch", type=int)
    parser.add_argument("mode", choices=("fp32", "tf32"))
    parser.add_argument("out")
    args = parser.parse_args(argv)
    with open(args.report) as file:
        report = json.load(file)
    if not menu_chart(report, args.model, args.batch, args.mode, args.out + ".tmp"):
        parser.error(f"no algorithm menu for {args.model} batch {args.batch} {args.mode} in {args.report} "
                     "(or matplotlib is missing)")
    os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
