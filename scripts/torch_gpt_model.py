"""The GPT as nanoGPT's model.py writes it (bias-free LayerNorm and Linear, GELU MLP, lm_head tied
to wte, nanoGPT's init and state_dict names), in PyTorch: one copy for the scripts that run it
beside loom's src/nn/gpt.c (tests/golden/make_gpt_golden.py, tests/interop/gpt_interop.py,
bench/torch_gpt.py). Attention is PyTorch's fused scaled_dot_product_attention where it has one
(2.x), else written out (Debian's 1.13)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class LayerNorm(nn.Module):
    """nanoGPT's LayerNorm without a bias (PyTorch 1.13's nn.LayerNorm cannot drop it)."""

    def __init__(self, width):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, None, 1e-5)


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.width, self.heads = width, heads
        self.ln_1, self.ln_2 = LayerNorm(width), LayerNorm(width)
        self.attn, self.mlp = nn.Module(), nn.Module()
        self.attn.c_attn = nn.Linear(width, 3 * width, bias=False)
        self.attn.c_proj = nn.Linear(width, width, bias=False)
        self.mlp.c_fc = nn.Linear(width, 4 * width, bias=False)
        self.mlp.c_proj = nn.Linear(4 * width, width, bias=False)

    def attention(self, x):
        b, t, c = x.shape
        q, k, v = self.attn.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
            y = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1) @ v
        return self.attn.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, context, layers, heads, width):
        super().__init__()
        self.transformer = nn.Module()
        self.transformer.wte = nn.Embedding(vocab, width)
        self.transformer.wpe = nn.Embedding(context, width)
        self.transformer.h = nn.ModuleList([Block(width, heads) for _ in range(layers)])
        self.transformer.ln_f = LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * layers))
            elif p.dim() >= 2:
                nn.init.normal_(p, mean=0.0, std=0.02)

    def forward(self, idx):
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(idx.shape[1]))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def adamw(net, lr, weight_decay=0.1):
    """nanoGPT's AdamW: weight decay on parameters of >= 2 dims only, betas (0.9, 0.99)."""
    params = list(net.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.99), eps=1e-8), params


def val_loss(net, val, context, vocab, rows=64):
    """The whole validation split in non-overlapping windows, as `loom train shakespeare-gpt`."""
    windows = (len(val) - 1) // context
    total = 0.0
    with torch.no_grad():
        for w0 in range(0, windows, rows):
            n = min(rows, windows - w0)
            x = torch.stack([val[(w0 + k) * context:(w0 + k + 1) * context] for k in range(n)])
            y = torch.stack([val[(w0 + k) * context + 1:(w0 + k + 1) * context + 1]
                             for k in range(n)])
            total += F.cross_entropy(net(x).view(-1, vocab), y.view(-1)).item() * n
    return total / windows
