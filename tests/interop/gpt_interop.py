"""GPT weights move between loom and PyTorch, both ways.

    python gpt_interop.py LOOM TMPDIR

loom trains a small shakespeare-gpt and saves it; the same GPT written as nanoGPT's model.py in
PyTorch loads the file (strict load_state_dict, lm_head.weight tied) and computes the exact
validation loss loom printed; then PyTorch trains its copy a few steps, saves it (safetensors,
without the tied lm_head.weight), and `loom eval shakespeare-gpt` gives PyTorch's validation loss.
Exit 77 (skipped) without torch and safetensors."""
import gzip
import math
import os
import re
import subprocess
import sys

os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")
try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from safetensors.torch import load_file, save_file
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

LOOM, TMP = sys.argv[1], sys.argv[2]
L, H, C, T = 2, 2, 32, 32
SHAPE = ["--layers", str(L), "--heads", str(H), "--width", str(C), "--context", str(T)]
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
        self.attn, self.mlp = nn.Module(), nn.Module()
        self.attn.c_attn = nn.Linear(C, 3 * C, bias=False)
        self.attn.c_proj = nn.Linear(C, C, bias=False)
        self.mlp.c_fc = nn.Linear(C, 4 * C, bias=False)
        self.mlp.c_proj = nn.Linear(4 * C, C, bias=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (z.view(b, t, H, c // H).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // H)
        att = att.masked_fill(~torch.tril(torch.ones(t, t, dtype=torch.bool)), float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.attn.c_proj(y)
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.transformer = nn.Module()
        self.transformer.wte = nn.Embedding(vocab, C)
        self.transformer.wpe = nn.Embedding(T, C)
        self.transformer.h = nn.ModuleList([Block() for _ in range(L)])
        self.transformer.ln_f = LayerNorm()
        self.lm_head = nn.Linear(C, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, idx):
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(idx.shape[1]))
        for blk in self.transformer.h:
            x = blk(x)
        return self.lm_head(self.transformer.ln_f(x))


def val_loss(net, val, vocab):
    """The whole validation split in non-overlapping windows, as loom computes it."""
    windows = (len(val) - 1) // T
    with torch.no_grad():
        x = torch.stack([val[k * T:(k + 1) * T] for k in range(windows)])
        y = torch.stack([val[k * T + 1:(k + 1) * T + 1] for k in range(windows)])
        return F.cross_entropy(net(x).view(-1, vocab), y.view(-1)).item()


def loom_val(out):
    return float(re.search(r"^val loss: ([0-9.]+)$", out, re.M).group(1))


def main():
    torch.set_num_threads(1)
    text_path = os.path.join(TMP, "gpt-interop.txt")
    with gzip.open(os.path.join(HERE, "..", "..", "data", "tinyshakespeare.txt.gz"), "rt") as f:
        text = f.read()[:100000]
    with open(text_path, "w") as f:
        f.write(text)
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    val = data[int(len(data) * 0.9):]
    ours = os.path.join(TMP, "gpt-loom.safetensors")
    out = subprocess.run([LOOM, "train", "shakespeare-gpt", "--data", text_path, *SHAPE, "--steps",
                          "40", "--batch", "8", "--warmup-steps", "5", "--eval-interval", "40",
                          "--save", ours], check=True, capture_output=True, text=True).stdout
    net = GPT(len(chars))
    net.load_state_dict(load_file(ours), strict=True)  # lm_head.weight included, tied
    got, want = val_loss(net, val, len(chars)), loom_val(out)
    print(f"loom's GPT in PyTorch: val loss {got:.4f}, loom printed {want:.4f}")
    ok = abs(got - want) < 2e-4
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    for s in range(10):
        ix = torch.randint(0, int(len(data) * 0.9) - T, (8,), generator=torch.Generator().manual_seed(s))
        x = torch.stack([data[i:i + T] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + T] for i in ix])
        loss = F.cross_entropy(net(x).view(-1, len(chars)), y.view(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    theirs = os.path.join(TMP, "gpt-torch.safetensors")
    state = {k: v.contiguous() for k, v in net.state_dict().items() if k != "lm_head.weight"}
    save_file(state, theirs)
    out = subprocess.run([LOOM, "eval", "shakespeare-gpt", "--data", text_path, *SHAPE, "--init",
                          theirs], check=True, capture_output=True, text=True).stdout
    got, want = loom_val(out), val_loss(net, val, len(chars))
    print(f"PyTorch's GPT in loom: val loss {got:.4f}, PyTorch's {want:.4f}")
    ok = ok and abs(got - want) < 2e-4
    print("ok" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
