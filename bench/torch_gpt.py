#!/usr/bin/env python3
"""PyTorch peer for bench/gpt.sh: nanoGPT's shakespeare-char CPU run (its model.py's GPT, 4 layers,
4 heads, width 128, context 64, batch 12, dropout 0, AdamW lr 1e-3 betas (0.9, 0.99), weight
decay 0.1 on parameters of >= 2 dims, warm-up 100 steps, cosine to 1e-4 at the last step,
clipping at 1.0) on the project's Tiny Shakespeare, eager. Prints the steps' mean time (after 20
warm-up steps), the exact validation loss at the end (the whole split in non-overlapping windows,
as `loom train shakespeare-gpt` computes it) unless --no-eval, the whole run's time, peak RSS.

    $(bash bench/torch-venv.sh) bench/torch_gpt.py STEPS THREADS [--no-eval] [--compile]

SEED in the environment seeds it (default 1337, nanoGPT's)."""
import gzip
import math
import os
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

V_CTX, L, H, C, B = 64, 4, 4, 128, 12
HERE = os.path.dirname(os.path.abspath(__file__))


class LayerNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, None, 1e-5)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = LayerNorm(), LayerNorm()
        self.c_attn = nn.Linear(C, 3 * C, bias=False)
        self.attn_proj = nn.Linear(C, C, bias=False)
        self.c_fc = nn.Linear(C, 4 * C, bias=False)
        self.mlp_proj = nn.Linear(4 * C, C, bias=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (z.view(b, t, H, c // H).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, C), nn.Embedding(V_CTX, C)
        self.h = nn.ModuleList([Block() for _ in range(L)])
        self.ln_f = LayerNorm()
        self.lm_head = nn.Linear(C, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L))
            elif p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.h:
            x = blk(x)
        return self.lm_head(self.ln_f(x))


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
    net = GPT(len(chars))
    params = list(net.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.99), eps=1e-8)
    model = torch.compile(net) if "--compile" in sys.argv else net

    def lr_at(t):
        if t < 100:
            return 1e-3 * (t + 1) / 101
        ratio = (t - 100) / (steps - 100)
        return 1e-4 + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (1e-3 - 1e-4)

    t_start = time.perf_counter()
    t0 = None
    for s in range(steps):
        if s == min(20, steps - 1):
            t0 = time.perf_counter()
            s0 = s
        for g in opt.param_groups:
            g["lr"] = lr_at(s)
        ix = torch.randint(len(train) - V_CTX, (B,))
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
        with torch.no_grad():
            windows = (len(val) - 1) // V_CTX
            total = 0.0
            for w0 in range(0, windows, 64):
                rows = min(64, windows - w0)
                x = torch.stack([val[(w0 + k) * V_CTX:(w0 + k + 1) * V_CTX] for k in range(rows)])
                y = torch.stack([val[(w0 + k) * V_CTX + 1:(w0 + k + 1) * V_CTX + 1]
                                 for k in range(rows)])
                total += F.cross_entropy(net(x).view(-1, len(chars)), y.view(-1)).item() * rows
        print(f"val loss {total / windows:.4f}")
    print(f"run s {time.perf_counter() - t_start:.1f}")
    print(f"maxrss MiB {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}")


if __name__ == "__main__":
    main()
