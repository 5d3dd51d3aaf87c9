# Kept as it ran: scratch/probe_opt.py of calls 1, 3 and 4 (the call scripts run it from scratch/, which git ignores).
"""Scratch probe (session 6): host time of an eager step's pieces, R20 b128 fp32 and R18 b64 fp32 on the GPU."""
import cProfile, io, pstats, sys, time
sys.path.insert(0, ".")
import minidnn
from benchmarks import measure
from minidnn.primitives import optimizer as opt_prims
from minidnn import engine as engines

def wrap(owner, name, totals):
    function = getattr(owner, name)
    def wrapper(*a, **k):
        s = time.perf_counter()
        try:
            return function(*a, **k)
        finally:
            e = totals.setdefault(name, [0.0, 0]); e[0] += time.perf_counter() - s; e[1] += 1
    setattr(owner, name, wrapper)
    return function

for arch, batch, image in (("resnet20", 128, 32), ("resnet18", 64, 224)):
    spec = {"engine": "minidnn", "device": "cuda", "architecture": arch, "batch": batch, "image_size": image,
            "num_classes": 10 if image == 32 else 1000, "precision": "fp32"}
    with measure.measurement_state("minidnn", "fp32"):
        e = measure.MinidnnEngine(spec)
        for _ in range(8):
            e.step()
        e.synchronize()
        pieces = {"forward": 0.0, "zero_grad": 0.0, "backward": 0.0, "optimizer": 0.0, "step": 0.0}
        steps = 40
        for _ in range(steps):
            t0 = time.perf_counter()
            loss = e.cross_entropy(e.model(e.x), e.y)
            t1 = time.perf_counter()
            e.optimizer.zero_grad()
            t2 = time.perf_counter()
            loss.backward()
            t3 = time.perf_counter()
            e.optimizer.step()
            t4 = time.perf_counter()
            e.synchronize()
            for k, v in zip(pieces, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0)):
                pieces[k] += v
        print(f"== {arch} b{batch}: host ms/step by phase:", {k: round(v / steps * 1e3, 3) for k, v in pieces.items()})
        totals = {}
        originals = [(opt_prims, n, wrap(opt_prims, n, totals)) for n in ("_check_lists", "_launch_chunks", "_sgd_settings")]
        module = engines.current().module
        originals += [(module, n, wrap(module, n, totals)) for n in engines.CONTRACT]
        for _ in range(steps):
            e.step()
            e.synchronize()
        for owner, n, f in originals:
            setattr(owner, n, f)
        for n, (t, c) in sorted(totals.items(), key=lambda kv: -kv[1][0]):
            print(f"  {n:40s} calls/step {c / steps:5.1f}  µs/step {t / steps * 1e6:8.1f}  µs/call {t / c * 1e6:7.1f}")
        p = cProfile.Profile()
        p.enable()
        for _ in range(20):
            e.optimizer.step()
        p.disable()
        s = io.StringIO(); pstats.Stats(p, stream=s).sort_stats("tottime").print_stats(25); print(s.getvalue()[:6000])
        p = cProfile.Profile()
        loss = e.cross_entropy(e.model(e.x), e.y); e.optimizer.zero_grad()
        p.enable()
        for _ in range(5):
            loss = e.cross_entropy(e.model(e.x), e.y)
            e.optimizer.zero_grad()
            loss.backward()
        p.disable()
        s = io.StringIO(); pstats.Stats(p, stream=s).sort_stats("tottime").print_stats(45); print(s.getvalue()[:9000])
