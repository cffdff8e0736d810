#!/usr/bin/python3
"""Golden fixture from PyTorch for tests/test_gpt.c. Run with Debian's python3-torch:

    /usr/bin/python3 tests/golden/make_gpt_golden.py

A small GPT written as nanoGPT's model.py writes it (scripts/torch_gpt_model.py: bias-free
LayerNorm and Linear, GELU MLP, lm_head tied to wte; vocabulary 13, context 8, 2 layers, 2 heads,
width 16), initialised as
nanoGPT does (normal 0.02, residual projections 0.02 / sqrt(2 layers), LayerNorms ones) under
torch.manual_seed(0), trained STEPS steps on fixed batches of B windows with nanoGPT's recipe in
small: AdamW lr 1e-3, betas 0.9 and 0.99, eps 1e-8, weight decay 0.1 on parameters of 2 dims or
more and 0 on the others, lr warm-up over 2 steps and a cosine down to 1e-4 at step 4, gradients
clipped to global norm 0.5. Writes tests/golden/gpt.safetensors holding:
  init.<name>       the initial parameters (nanoGPT's names; lm_head.weight is init.transformer.wte)
  idx, targets      (STEPS, B, T) int32 tokens and next tokens
  logits64          the float64 model's logits of idx[0] at the initial parameters
  delta64.<name>    the float64 run's parameters after STEPS steps minus the initial ones
  dist32            the float32 run's distance from the float64 run (the Euclidean norm of the
                    difference of the parameter vectors)
  loss64            the float64 run's loss at each step
"""
import math
import os
import sys

os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from make_golden import save_safetensors  # noqa: E402
from torch_gpt_model import GPT, adamw  # noqa: E402
from torch_recipes import get_lr  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
V, CTX, L, H, C = 13, 8, 2, 2, 16
B, T, STEPS = 4, 8, 5
WARMUP, DECAY, LR, MIN_LR, CLIP = 2, 4, 1e-3, 1e-4, 0.5


def lr_at(t):
    return get_lr(t, LR, WARMUP, DECAY, MIN_LR)


def train(init, idx, targets, dtype):
    net = GPT(V, CTX, L, H, C)
    net.load_state_dict(init, strict=False)
    net = net.to(dtype)
    opt, params = adamw(net, LR)  # (tied: wte once)
    logits0 = net(idx[0]).detach()
    losses = []
    for s in range(STEPS):
        for group in opt.param_groups:
            group["lr"] = lr_at(s)
        logits = net(idx[s])
        loss = F.cross_entropy(logits.view(-1, V), targets[s].reshape(-1))
        opt.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, CLIP)
        if dtype == torch.float64:
            print(f"  step {s}: lr {lr_at(s):.3g}, loss {loss.item():.4f}, gradient norm {norm:.3g}")
        opt.step()
        losses.append(loss.item())
    out = {k: p.detach().to(torch.float64).reshape(-1).numpy()
           for k, p in net.named_parameters()}
    return out, losses, logits0


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    init = {k: v.clone() for k, v in GPT(V, CTX, L, H, C).state_dict().items()
            if k != "lm_head.weight"}
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(0, V, (STEPS, B, T + 1), generator=g)
    idx, targets = seq[:, :, :T].contiguous(), seq[:, :, 1:].contiguous()
    p64, losses, logits64 = train(init, idx, targets, torch.float64)
    p32, _, _ = train(init, idx, targets, torch.float32)
    out = {"init." + k: v.numpy() for k, v in init.items()}
    out["idx"] = idx.numpy().astype(np.int32)
    out["targets"] = targets.numpy().astype(np.int32)
    out["logits64"] = logits64.numpy().astype(np.float32)
    sq = 0.0
    for k, v in p64.items():
        v0 = init[k].to(torch.float64).reshape(-1).numpy()
        out["delta64." + k] = (v - v0).astype(np.float32)
        sq += float(np.sum((p32[k] - v) ** 2))
    out["dist32"] = np.array([math.sqrt(sq)], np.float32)
    out["loss64"] = np.array(losses, np.float32)
    path = os.path.join(HERE, "gpt.safetensors")
    save_safetensors(path, out)
    print(f"{path}: {os.path.getsize(path)} bytes; float32 {math.sqrt(sq):.3g} from float64, "
          f"losses {losses[0]:.4f} .. {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
