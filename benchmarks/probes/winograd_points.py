# Justifies winograd.WEIGHT_GRADIENT_POINTS, the interpolation points of F(7x7, 5x5) (minidnn/primitives/conv/winograd.py).
"""Which interpolation points for backward-filter's large Winograd tiles on CaffeNet's conv2 (5x5, 27², groups 2):
the float32 weight-gradient error against float64 of F(m×m, 5×5) built by winograd.cook_toom, on the CPU.

First a quick search: every symmetric set of small fractions (0, then pairs ±p, then one more point where α − 1 is
odd) ranked by a proxy, the error of Σ over 300 random tiles of Gᵀ[(A e Aᵀ) ⊙ (Bᵀ d B)]G for one channel pair;
then the best proxies and a few hand-picked sets run through the whole weight gradient (the NumPy twin, batch 4,
two seeds). CPU only, about ten minutes (the search builds every set's matrices in exact fractions):

    PYTHONPATH=. python benchmarks/probes/winograd_points.py > OUT.txt
"""
import itertools
from fractions import Fraction

import numpy as np

from minidnn.primitives.conv import api, winograd
from minidnn.primitives.conv.problem import ConvProblem

R = 5
POOL = [Fraction(p) for p in ("1", "2", "1/2", "3", "1/3", "3/2", "2/3", "4", "1/4", "3/4", "4/3", "5/4", "4/5")]


def proxy(t, m, tiles=300, seed=0):
    rng = np.random.default_rng(seed)
    alpha = m + R - 1
    d, e = rng.standard_normal((tiles, alpha, alpha)), rng.standard_normal((tiles, m, m))

    def run(dtype):
        BT, AT, G = (t[k].astype(dtype) for k in ("input", "output", "filter"))
        products = (BT @ d.astype(dtype) @ BT.T) * (AT.T @ e.astype(dtype) @ AT)
        return G.T @ np.add.reduce(products, axis=0) @ G

    exact, got = run(np.float64), run(np.float32)
    return np.linalg.norm(got - exact) / np.linalg.norm(exact)


def weight_gradient_error(m, points, N=4, seed=1):
    winograd.TRANSFORMS[m, R] = winograd.cook_toom(m, R, points)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, 96, 27, 27)).astype(np.float32)
    dy = rng.standard_normal((N, 256, 27, 27)).astype(np.float32)
    want = api.conv2d_backward_filter(x.astype(np.float64), dy.astype(np.float64), (256, 48, 5, 5), 1, 2, 1, 2,
                                      algo="reference")
    problem = ConvProblem(N, 96, 27, 27, 256, R, R, (1, 1), (2, 2), (1, 1), 2, np.dtype(np.float32), "cpu")
    algorithm = winograd.Winograd(m, R)  # the NumPy twin takes any (m, r) that TRANSFORMS holds
    out = np.zeros((256, 48, 5, 5), np.float32)
    workspace = np.empty(algorithm.workspace_bytes(problem, "backward_filter"), np.uint8)
    algorithm.backward_filter(x, dy, problem, out, False, workspace)
    return float(np.linalg.norm(out - want) / np.linalg.norm(want))


def symmetric_sets(finite):
    pairs, extra = divmod(finite - 1, 2)
    for combo in itertools.combinations(POOL, pairs):
        base = [Fraction(0)] + [sign * p for p in combo for sign in (1, -1)]
        for last in ([q] for q in POOL if q not in combo) if extra else [[]]:
            yield base + last


def show(points):
    return " ".join(str(p) for p in points)


saved = dict(winograd.TRANSFORMS)
for m in (7,):
    ranked = sorted((proxy(winograd.cook_toom(m, R, points), m), show(points))
                    for points in symmetric_sets(m + R - 2))
    print(f"F({m}x{m}, 5x5): {len(ranked)} point sets by proxy, the best eight:")
    for error, points in ranked[:8]:
        print(f"  proxy {error:.2e}  {points}")
HAND_PICKED = {
    4: ["0 1 -1 2 -2 1/2 -1/2"],
    7: ["0 1 -1 2 -2 1/2 -1/2 3 -3 1/3", "0 1 -1 2 -2 1/2 -1/2 3/2 -3/2 2/3"],
    9: ["0 1 -1 2 -2 1/2 -1/2 3 -3 1/3 -1/3 4", "0 1 -1 2 -2 1/2 -1/2 3/2 -3/2 2/3 -2/3 3",
        "0 1 -1 2 -2 1/2 -1/2 1/4 -1/4 4 -4 3/2", "0 1 -1 2 -2 1/2 -1/2 3/2 -3/2 2/3 -2/3 3/4"],
}
candidates = {m: list(sets) for m, sets in HAND_PICKED.items()}
candidates[7] = [points for _, points in ranked[:8]] + candidates[7]
print("\nWhole weight gradient, float32 against float64, batch 4 (seeds 1 and 5):")
for m, sets in candidates.items():
    for points in sets:
        parsed = [Fraction(p) for p in points.split()]
        errors = [weight_gradient_error(m, parsed, seed=seed) for seed in (1, 5)]
        print(f"  F({m}x{m}, 5x5)  {points:<45} {errors[0]:.2e} {errors[1]:.2e}")
winograd.TRANSFORMS.clear()
winograd.TRANSFORMS.update(saved)
