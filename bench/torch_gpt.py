#!/usr/bin/env python3
"""PyTorch peer for bench/gpt.sh: nanoGPT's shakespeare-char CPU run (its model.py's GPT, 4 layers,
4 heads, width 128, context 64, batch 12, dropout 0, AdamW lr 1e-3 betas (0.9, 0.99), weight
decay 0.1 on parameters of >= 2 dims, warm-up 100 steps, cosine to 1e-4 at the last step,
clipping at 1.0) on the project's Tiny Shakespeare, eager. Prints the steps' mean time (after 20
warm-up steps), the exact validation loss at the end (the whole split in non-overlapping windows,
as `loom train shakespeare-gpt` computes it) unless --no-eval, the whole run's time, peak RSS.

    $(bash bench/torch-venv.sh) bench/torch_gpt.py STEPS THREADS [--no-eval] [--compile]

SEED in the environment seeds it (default 1337, nanoGPT's); GPT_SHAPE=CONTEXT,LAYERS,HEADS,WIDTH,BATCH
another size (bench/gpt.sh LARGE=1: 256,6,6,384,8). LOOM_SEED=S draws the batches that
`loom train shakespeare-gpt --seed S` draws (Philox stream (3, step), as src/data/text.c) instead
of torch.randint's, and INIT=FILE starts from the weights of a safetensors file (loom's --save),
so that loom and PyTorch differ only in their arithmetic."""
import gzip
import os
import resource
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from torch_gpt_model import GPT, adamw, val_loss  # noqa: E402
from torch_recipes import get_lr  # noqa: E402

V_CTX, L, H, C, B = (int(v) for v in os.environ.get("GPT_SHAPE", "64,4,4,128,12").split(","))
HERE = os.path.dirname(os.path.abspath(__file__))
M32 = 0xFFFFFFFF


def philox(seed, stream, counter):
    """Philox-4x32-10 as src/core/rng.c: key = seed, counter = (counter, stream) in 32-bit words."""
    c = [counter & M32, counter >> 32, stream & M32, stream >> 32]
    k0, k1 = seed & M32, seed >> 32
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & M32, (p0 >> 32) ^ c[3] ^ k1, p0 & M32]
        k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
    return c


def loom_starts(seed, step, batch, span):
    """The windows' starts of step `step` of `loom train shakespeare-gpt --seed seed`."""
    starts = []
    for r in range(batch):
        w = philox(seed, (3 << 32) | step, r)
        starts.append(((w[0] << 32) | w[1]) % span)
    return torch.tensor(starts)


def main():
    steps, threads = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(threads)
    torch.manual_seed(int(os.environ.get("SEED", "1337")))
    text = gzip.open(os.path.join(HERE, "..", "data", "tinyshakespeare.txt.gz"), "rt").read()
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    data = torch.tensor([stoi[ch] for ch in text], dtype=torch.long)
    n = int(len(data) * 0.9)
    train, val = data[:n], data[n:]
    net = GPT(len(chars), V_CTX, L, H, C)
    if "INIT" in os.environ:
        from safetensors.torch import load_file
        net.load_state_dict(load_file(os.environ["INIT"]), strict=True)
    loom_seed = int(os.environ["LOOM_SEED"]) if "LOOM_SEED" in os.environ else None
    opt, params = adamw(net, 1e-3)
    model = torch.compile(net) if "--compile" in sys.argv else net

    def lr_at(t):
        return get_lr(t, 1e-3, 100, steps, 1e-4)

    t_start = time.perf_counter()
    t0 = None
    for s in range(steps):
        if s == min(20, steps - 1):
            t0 = time.perf_counter()
            s0 = s
        for g in opt.param_groups:
            g["lr"] = lr_at(s)
        if loom_seed is None:
            ix = torch.randint(len(train) - V_CTX, (B,))
        else:
            ix = loom_starts(loom_seed, s, B, len(train) - V_CTX)
        x = torch.stack([train[i:i + V_CTX] for i in ix])
        y = torch.stack([train[i + 1:i + 1 + V_CTX] for i in ix])
        loss = F.cross_entropy(model(x).view(-1, len(chars)), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    ms = 1e3 * (time.perf_counter() - t0) / (steps - s0)
    print(f"ms/step {ms:.2f}")
    if "--no-eval" not in sys.argv:
        print(f"val loss {val_loss(net, val, V_CTX, len(chars)):.4f}")
    print(f"run s {time.perf_counter() - t_start:.1f}")
    print(f"maxrss MiB {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}")


if __name__ == "__main__":
    main()
