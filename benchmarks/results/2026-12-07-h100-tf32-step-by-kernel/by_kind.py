# Reads bench.json's kernel_names (one profiled step) and sums them by kind: python3 by_kind.py RUN_DIR...
import json, sys
def category(name):
    l = name.lower()
    if 'batchnorm' in l or l.startswith('bn_'): return 'batch norm'
    if 'transpose' in l: return 'layout changes (transpose_*)'
    if 'cupy_add' in l or 'functor_add' in l: return 'adds'
    if 'relu' in l or 'threshold' in l or 'clamp' in l: return 'relu'
    if any(k in l for k in ('wgmma', 'implicit_gemm', 'winograd', 'col2im', 'im2col', 'gemm', 'fprop', 'dgrad', 'wgrad',
                            'nvjet', 'conv', 'init_device_workspace', 'filter_gradient', 'filter_to_channels_last')):
        return 'convolutions and linear (GEMMs, transforms, finishes)'
    return 'other (pooling, loss, optimizer, copies)'
for path in sys.argv[1:]:
    r = [x for x in json.load(open(path + '/bench.json'))['records'] if x.get('kind') == 'engine'][0]
    cats = {}
    for name, ms, n in r['kernel_names']:
        a = cats.setdefault(category(name), [0, 0]); a[0] += ms; a[1] += n
    print(path.split('/')[-1], round(r['gpu_busy_ms'], 2), 'listed', round(sum(v[0] for v in cats.values()), 2))
    for k, v in sorted(cats.items(), key=lambda kv: -kv[1][0]): print(f"   {k:55s} {v[0]:6.2f} ms {int(v[1]):4d}")
