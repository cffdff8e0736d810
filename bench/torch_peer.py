#!/usr/bin/env python3
"""PyTorch peer for bench/run.sh: the same model, data, global batch 128 and SGD momentum 0.9 as a
loom recipe, one thread per process (intra-op and BLAS), steady-state training samples/s after 20
warm-up steps. Prints "samples/s X", then "startup S" (process start to the end of
the first step) and "maxrss MiB" of the process running rank 0.

    $(bash bench/torch-venv.sh) bench/torch_peer.py RECIPE STEPS [DDP_PROCESSES]

With DDP_PROCESSES > 0: DistributedDataParallel over gloo on 127.0.0.1, each process one thread
and its slice of every global batch (global batch / processes)."""
import os
import sys

os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"
import socket  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from torch_recipes import model, read_idx  # noqa: E402

BATCH, WARMUP = 128, 20


def setup(recipe):
    d = os.environ.get("LOOM_DATA", "/usr/share/datasets/fashion-mnist")
    x = torch.from_numpy(read_idx(d + "/train-images-idx3-ubyte.gz").astype(np.float32) / 255.0)
    y = torch.from_numpy(read_idx(d + "/train-labels-idx1-ubyte.gz").astype(np.int64))
    if recipe == "fmnist-mlp":
        return x.reshape(-1, 784), y, model(recipe)
    return x.reshape(-1, 1, 28, 28), y, model(recipe)


def proc_start():
    """Wall-clock time at which this process was exec'd (from /proc)."""
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        up = float(f.read().split()[0])
    return time.time() - (up - ticks / os.sysconf("SC_CLK_TCK"))


T_START = proc_start()


def train(rank, world, recipe, steps, port, out):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x, y, net = setup(recipe)
    if world:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        net = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))
    local = BATCH // max(world, 1)
    t0 = None
    for s in range(steps + WARMUP):
        if s == WARMUP:
            if world:
                dist.barrier()
            t0 = time.perf_counter()
        start = (s * BATCH) % (x.shape[0] - BATCH) + rank * local
        i = perm[start:start + local]
        loss = F.cross_entropy(net(x[i]), y[i])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if s == 0:
            first = time.time() - T_START
    if world:
        dist.barrier()
    dt = time.perf_counter() - t0
    if rank == 0:
        import resource
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        with open(out, "w") as f:
            f.write(f"{steps * BATCH / dt:.0f}\nstartup {first:.3f}\nmaxrss {rss:.0f}")
    if world:
        dist.destroy_process_group()


def main():
    recipe, steps = sys.argv[1], int(sys.argv[2])
    world = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    out = f"/tmp/loom-torch-peer.{os.getpid()}"
    if world:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        mp.spawn(train, args=(world, recipe, steps, port, out), nprocs=world, join=True)
    else:
        train(0, 0, recipe, steps, 0, out)
    with open(out) as f:
        print(f"samples/s {f.read()}")
    os.unlink(out)


if __name__ == "__main__":
    main()
