"""loom's built-in recipes as PyTorch writes them, and Fashion-MNIST's IDX reader: one copy for the
scripts that run PyTorch beside loom (tests/golden/make_golden.py, tests/interop/interop.py,
bench/torch_peer.py). The layer order is src/nn/recipes.c's, so state_dict names match loom's."""
import gzip
import math
import struct

import numpy as np


def read_idx(path):
    """A gzip'd IDX file as a uint8 array of its dims."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    nd = raw[3]
    dims = struct.unpack(">" + "I" * nd, raw[4:4 + 4 * nd])
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * nd).reshape(dims)


def get_lr(t, lr, warmup, decay, min_lr):
    """nanoGPT's learning rate at step t (0-based): linear warm-up, cosine to min_lr at decay."""
    if t < warmup:
        return lr * (t + 1) / (warmup + 1)
    if t > decay:
        return min_lr
    ratio = (t - warmup) / (decay - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def model(recipe):
    """The recipe's torch.nn.Sequential, initialised by PyTorch's default (the global RNG)."""
    import torch.nn as nn
    if recipe == "fmnist-mlp":
        return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                             nn.Linear(256, 10))
    return nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(1600, 128), nn.ReLU(), nn.Linear(128, 10))
