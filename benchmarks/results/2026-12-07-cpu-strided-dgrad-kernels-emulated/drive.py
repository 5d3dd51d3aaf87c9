"""Runs run.sh's harness on the in-place cases of tests/test_conv_strided_dgrad.py and two more: the filter pass
against turn_phase_filters' NumPy twin word for word (w C-contiguous and channels-last), and the phase kernel's CTAs:
each phase's tiles 0 ... n - 1 once each, n its forward grid's, with its own sub-filter offset."""
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, '.')  # run from the repository's root
BUILD = sys.argv[1]
from tests.test_conv_strided_dgrad import IN_PLACE_CASES, in_place_problem
from minidnn.primitives.conv import strided_dgrad, implicit_gemm_nhwc, implicit_gemm_wgmma
cases = dict(IN_PLACE_CASES)
cases["groups_4_strides_2_3"] = (2, 32, 13, 14, 64, 3, 5, (2, 3), (1, 2), 4)
cases["stride_4_by_4_5x5"] = (1, 8, 17, 19, 40, 5, 5, (4, 4), (2, 2), 1)
rng = np.random.default_rng(1)
for name, case in cases.items():
    problem = in_place_problem(case, np.float32, "cuda")
    launches, values, _ = strided_dgrad._placed_launches(problem)
    w = rng.standard_normal(problem.w_shape).astype(np.float32)
    want = np.full(values, 7, dtype=np.float32)
    strided_dgrad.turn_phase_filters(w, want, problem)
    K, Cg, R, S = w.shape
    for layout_name, buffer, strides in (
            ("contiguous", w, [s // 4 for s in w.strides]),
            ("channels_last", np.ascontiguousarray(w.transpose(0, 2, 3, 1)), [R * S * Cg, 1, S * Cg, Cg])):
        for index, (turns, phases, grid) in enumerate(launches):
            with open(os.path.join(BUILD, 'in.bin'), 'wb') as f:
                f.write(np.array([K, Cg, R, S, *problem.stride, problem.groups, 4, values], np.int32).tobytes())
                f.write(np.array(strides, np.int64).tobytes())
                f.write(strided_dgrad._phase_offsets(problem).tobytes())
                f.write(buffer.tobytes())
                f.write(phases.tobytes())
            subprocess.run([os.path.join(BUILD, name) for name in ('harness', 'in.bin', 'out.bin', 'visits.txt',
                                                                    'offsets.txt')], check=True)
            got = np.fromfile(os.path.join(BUILD, 'out.bin'), dtype=np.float32)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (name, layout_name)
            visits = [tuple(map(int, line.split())) for line in open(os.path.join(BUILD, 'visits.txt'))]
            offsets = sorted(set(int(x) for x in open(os.path.join(BUILD, 'offsets.txt'))))
            count = int(phases['count'])
            expected = set()
            for i in range(count):
                shape = phases['shape'][i]
                key = int(shape['out_first']) * 1000 + int(shape['R']) * 10 + int(shape['S'])
                n = int(phases['first_tile'][i + 1]) - int(phases['first_tile'][i])
                width = implicit_gemm_wgmma.tile_width(int(shape['K']), 'forward')
                assert n == implicit_gemm_nhwc.forward_grid(shape, width)[0]
                expected |= {(key, t, 1) for t in range(n)}
            assert set(visits) == expected and len(visits) == len(expected), (name, index)
            assert offsets == sorted(int(phases['filter_offset'][i]) for i in range(count)), (name, offsets)
            assert grid[0] == int(phases['first_tile'][count])
    phase_count = sum(len(turns) for turns, _, _ in launches)
    print(f"{name}: {len(launches)} launch(es), {phase_count} phases, {values} filter words: ok")
