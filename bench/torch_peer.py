#!/usr/bin/python3
"""PyTorch peer for bench/run.sh: the same model, data, batch and optimizer as a loom recipe,
one thread (intra-op and BLAS), steady-state training samples/s after a warm-up. Prints one line
"samples/s X". Run with Debian's python3-torch: /usr/bin/python3 bench/torch_peer.py RECIPE STEPS."""
import os
import sys

os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"
import gzip  # noqa: E402
import struct  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def read_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    nd = raw[3]
    dims = struct.unpack(">" + "I" * nd, raw[4:4 + 4 * nd])
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * nd).reshape(dims)


def main():
    recipe, steps = sys.argv[1], int(sys.argv[2])
    batch, warmup = 128, 20
    torch.set_num_threads(1)
    d = os.environ.get("LOOM_DATA", "/usr/share/datasets/fashion-mnist")
    x = torch.from_numpy(read_idx(d + "/train-images-idx3-ubyte.gz").astype(np.float32) / 255.0)
    y = torch.from_numpy(read_idx(d + "/train-labels-idx1-ubyte.gz").astype(np.int64))
    if recipe == "fmnist-mlp":
        x = x.reshape(-1, 784)
        net = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                            nn.Linear(256, 10))
    else:
        x = x.reshape(-1, 1, 28, 28)
        net = nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3),
                            nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(1600, 128),
                            nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))
    t0 = None
    for s in range(steps + warmup):
        if s == warmup:
            t0 = time.perf_counter()
        i = perm[(s * batch) % (x.shape[0] - batch):][:batch]
        loss = F.cross_entropy(net(x[i]), y[i])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    dt = time.perf_counter() - t0
    print(f"samples/s {steps * batch / dt:.0f}")


if __name__ == "__main__":
    main()
