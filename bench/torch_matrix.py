#!/usr/bin/env python3
"""PyTorch peer for bench/matrix.sh: a model of loom's matrix (bench/matrix.h, read from
`build/bench_matrix --list`), built as the same torch.nn.Sequential, trained on synthetic data of
Fashion-MNIST's shape with SGD lr 0.01 momentum 0.9 at the model's batch; steady-state training
samples/s over STEPS steps after 20 warm-up steps. Prints "samples/s X".

    $(bash bench/torch-venv.sh) bench/torch_matrix.py MODEL MODE STEPS

MODE: eager1 / eager2 (eager on 1 or 2 threads), compile1 / compile2 (torch.compile, the same),
ddp2 (DistributedDataParallel over gloo, 2 processes x 1 thread, each its half of every batch)."""
import os
import socket
import subprocess
import sys
import time

os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

WARMUP = 20
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def spec(name):
    out = subprocess.run([os.path.join(ROOT, "build", "bench_matrix"), "--list"], check=True,
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        f = line.split()
        if f[0] == name:
            return int(f[1]), f[2] == "1", f[4:]
    sys.exit(f"unknown model {name}")


def build(layers):
    mods = []
    for t in layers:
        p = t.split(":")
        if p[0] == "linear":
            mods.append(nn.Linear(int(p[1]), int(p[2])))
        elif p[0] == "conv":
            i, o, k, s, pad = map(int, p[1:])
            mods.append(nn.Conv2d(i, o, k, stride=s, padding=pad))
        elif p[0] == "pool":
            k, s, pad = map(int, p[1:])
            mods.append(nn.MaxPool2d(k, stride=s, padding=pad))
        elif p[0] == "relu":
            mods.append(nn.ReLU())
        elif p[0] == "flatten":
            mods.append(nn.Flatten())
    return nn.Sequential(*mods)


def train(rank, world, name, mode, steps, port, out):
    torch.set_num_threads(2 if mode in ("eager2", "compile2") else 1)
    torch.manual_seed(0)
    batch, flat, layers = spec(name)
    net = build(layers)
    n = 8 * batch
    x = torch.rand(n, 784) if flat else torch.rand(n, 1, 28, 28)
    y = torch.arange(n) * 7 % 10
    if world:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        net = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    model = torch.compile(net) if mode.startswith("compile") else net
    local = batch // max(world, 1)
    t0 = None
    for s in range(steps + WARMUP):
        if s == WARMUP:
            if world:
                dist.barrier()
            t0 = time.perf_counter()
        start = (s % 8) * batch + rank * local
        loss = F.cross_entropy(model(x[start:start + local]), y[start:start + local])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    if world:
        dist.barrier()
    dt = time.perf_counter() - t0
    if rank == 0:
        with open(out, "w") as f:
            f.write(f"{steps * batch / dt:.0f}")
    if world:
        dist.destroy_process_group()


def main():
    name, mode, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    out = f"/tmp/loom-torch-matrix.{os.getpid()}"
    if mode == "ddp2":
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        mp.spawn(train, args=(2, name, mode, steps, port, out), nprocs=2, join=True)
    else:
        train(0, 0, name, mode, steps, 0, out)
    with open(out) as f:
        print(f"samples/s {f.read()}")
    os.unlink(out)


if __name__ == "__main__":
    main()
