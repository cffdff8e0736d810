#!/usr/bin/env python3
"""Where a matrix model's step goes: `LOOM_PROFILE=1 build/bench_matrix MODEL DEVICES STEPS`, its
training program's kernels (the medians of their last runs) summed by family, and the products'
rate against the FMA peak of the cores (`build/bench_peak`). Issue 30 asks, for each model under
its target, where the rest of the step goes; this prints it. Not a test.

    python3 bench/breakdown.py [--devices D] [MODEL ...]     (default: every model, 1 device)

D may be 1x2 (one device of 2 cores). Per device: with D devices each runs its shard."""
import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
BIN = os.path.join(ROOT, "build")
FAMILY = {"MATMUL": "products", "POOLMAX": "pooling", "POOLGRAD": "pooling",
          "UNFOLD": "windows", "FOLD": "windows", "PAD": "windows", "CROP": "windows",
          "SYNC": "all-reduce", "ATTENTION": "rows", "ATTENTIONGRAD": "rows", "LNORM": "rows",
          "LNORMGRAD": "rows", "SOFTMAX": "rows", "GELU": "rows", "GELUD": "rows"}
ORDER = ["products", "pooling", "windows", "elementwise", "rows", "all-reduce", "other"]
LINE = re.compile(r"median ([0-9.]+)\)\s+#\d+\s+node \d+ (\w+) \(.*\)\s+(\w+)")
HEAD = re.compile(r"profile: program \w+, (\d+) runs")


def run(*args, env=None):
    return subprocess.run([os.path.join(BIN, args[0]), *args[1:]], check=True,
                          capture_output=True, text=True, env=env)


def profile(model, devices, steps):
    env = dict(os.environ, LOOM_PROFILE="1")
    err = run("bench_matrix", model, devices, str(steps), env=env).stderr
    blocks, runs = [], []
    for line in err.splitlines():
        h = HEAD.search(line)
        if h:
            blocks.append([])
            runs.append(int(h.group(1)))
        elif blocks and (m := LINE.search(line)):
            blocks[-1].append((m.group(2), m.group(3), float(m.group(1))))
    return blocks[runs.index(max(runs))]  # the training program: the one run most


def main():
    args = sys.argv[1:]
    devices = "1"
    if args[:1] == ["--devices"]:
        devices, args = args[1], args[2:]
    listing = {f.split()[0]: f.split() for f in run("bench_matrix", "--list").stdout.splitlines()}
    models = args or list(listing)
    peak = float(run("bench_peak").stdout.split()[0])
    cores = 2 if devices in ("2", "1x2") else 1
    shards = 2 if devices == "2" else 1
    print(f"per device, {devices} device(s); FMA peak {peak:.1f} GFLOP/s a core")
    print(f"{'model':15s} {'step ms':>8s} {'products':>9s} {'of peak':>8s}  the rest (ms)")
    for m in models:
        batch, flop = int(listing[m][1]), float(listing[m][3])
        steps = max(20, min(2000, int(2e9 / (flop * batch) * 60)))
        by = dict.fromkeys(ORDER, 0.0)
        for op, how, ms in profile(m, devices, steps):
            fam = FAMILY.get(op, "elementwise" if how == "generated" else "other")
            by[fam] += ms
        step = sum(by.values())
        rate = flop * batch / shards / (by["products"] * 1e-3) / 1e9 if by["products"] else 0
        share = rate / (peak * (cores // shards))
        rest = ", ".join(f"{k} {v:.2f}" for k, v in by.items() if k != "products" and v >= 0.01)
        print(f"{m:15s} {step:8.2f} {100 * by['products'] / step:8.1f}% {100 * share:7.1f}%  {rest}")


if __name__ == "__main__":
    main()
