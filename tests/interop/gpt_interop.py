"""GPT weights move between loom and PyTorch, both ways.

    python gpt_interop.py LOOM TMPDIR

loom trains a small shakespeare-gpt and saves it; the same GPT written as nanoGPT's model.py in
PyTorch loads the file (strict load_state_dict, lm_head.weight tied) and computes the exact
validation loss loom printed; then PyTorch trains its copy a few steps, saves it (safetensors,
without the tied lm_head.weight), and `loom eval shakespeare-gpt` gives PyTorch's validation loss.
Exit 77 (skipped) without torch and safetensors."""
import gzip
import os
import re
import subprocess
import sys

os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
try:
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file, save_file
    from torch_gpt_model import GPT, val_loss
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

LOOM, TMP = sys.argv[1], sys.argv[2]
L, H, C, T = 2, 2, 32, 32
SHAPE = ["--layers", str(L), "--heads", str(H), "--width", str(C), "--context", str(T)]
HERE = os.path.dirname(os.path.abspath(__file__))


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
    net = GPT(len(chars), T, L, H, C)
    net.load_state_dict(load_file(ours), strict=True)  # lm_head.weight included, tied
    got, want = val_loss(net, val, T, len(chars)), loom_val(out)
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
    got, want = loom_val(out), val_loss(net, val, T, len(chars))
    print(f"PyTorch's GPT in loom: val loss {got:.4f}, PyTorch's {want:.4f}")
    ok = ok and abs(got - want) < 2e-4
    print("ok" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
