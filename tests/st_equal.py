"""st_equal.py A B [TOL [norm]] - whether B holds A's tensors (B may hold more: a checkpoint's
optimizer state beside the weights): bitwise (no TOL), or each element within TOL of A's relative
to the tensor's largest magnitude, or with "norm" each tensor within TOL normwise (||A - B|| /
||A||: AdamW moves an element whose gradient is rounding noise, summed in another order, by up to
a share of lr, which the elementwise bound takes for a difference of the whole). One line
either way (naming the first tensor that differs and by how much); exit 0 when they match.
Reads the format itself (8-byte header length, JSON header, data), so it needs no package."""
import json
import struct
import sys


def read(path):
    raw = open(path, 'rb').read()
    n = struct.unpack('<Q', raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop('__metadata__', None)
    base = 8 + n
    return {k: raw[base + v['data_offsets'][0]:base + v['data_offsets'][1]] for k, v in header.items()}


a, b = read(sys.argv[1]), read(sys.argv[2])
tol = float(sys.argv[3]) if len(sys.argv) > 3 else None
norm = len(sys.argv) > 4 and sys.argv[4] == 'norm'
missing = sorted(a.keys() - b.keys())
if missing:
    print('differ: %s lacks %s' % (sys.argv[2], missing[:3]))
    sys.exit(1)
worst = 0.0
for k in sorted(a):
    if a[k] == b[k]:
        continue
    if tol is None:
        print('differ: %s is not bitwise the same' % k)
        sys.exit(1)
    x = struct.unpack('<%df' % (len(a[k]) // 4), a[k])
    y = struct.unpack('<%df' % (len(b[k]) // 4), b[k])
    if norm:
        scale = max(sum(v * v for v in x) ** 0.5, 1e-30)
        d = sum((p - q) ** 2 for p, q in zip(x, y)) ** 0.5 / scale
    else:
        scale = max(max(abs(v) for v in x), 1e-30)
        d = max(abs(p - q) for p, q in zip(x, y)) / scale
    worst = max(worst, d)
    if d > tol:
        print('differ: %s by %.3g of its %s (tolerance %g)' %
              (k, d, 'norm' if norm else 'largest magnitude', tol))
        sys.exit(1)
print('equal: %d tensors%s' % (len(a), '' if tol is None else ', within %.3g' % worst))
