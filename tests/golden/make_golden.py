#!/usr/bin/python3
"""Golden fixtures from PyTorch for tests/test_golden.c. Run with Debian's python3-torch:

    /usr/bin/python3 tests/golden/make_golden.py

For each recipe (fmnist-mlp, fmnist-cnn) it writes tests/golden/<recipe>.safetensors holding:
  init.<name>            PyTorch's own initialisation (torch.manual_seed(0)), every element
  x, y                   3 fixed batches of 16 Fashion-MNIST training images (the first 48)
  <opt>.loss             the loss at each of 3 steps
  <opt>.grad.<name>      gradients at the 3rd step (sgd only)
  <opt>.param.<name>     parameters after 3 steps
for opt in sgd (lr 0.05, momentum 0.9), sgdn (lr 0.05, momentum 0.9, nesterov, weight decay
5e-4) and adamw (lr 1e-3, weight decay 1e-2). To keep the files small, gradients and final
parameters of tensors over 8192 elements are stored at every k-th element, k in stride.<name>.

It also writes tests/golden/<recipe>.long.safetensors, the reference of the paths users take
(the loom train command, loom_trainer_fit, the accelerator): from the same initialisation, LONG
steps on batches of LONG_B training images in file order (the loader's --no-shuffle order), in
float64 (the near-exact answer) and in float32, for adamw and sgdn as above and adamwx: nanoGPT's
recipe in small (AdamW lr 1e-3, betas 0.9 and 0.99, weight decay 0.1 on parameters of 2 dims or
more and 0 on the others, lr warm-up over 3 steps and a cosine to 1e-4 at step 10, gradients
clipped to global norm 0.5). It holds
  <opt>.delta64.<name>   the float64 run's parameters after LONG steps minus the initial ones
                         (float32; every k-th element, k in stride.<name>, as above)
  <opt>.dist32           the float32 run's distance from the float64 run over those elements:
                         the Euclidean norm of the difference of the parameter vectors
  <opt>.loss64           the float64 run's loss at each step
A loom run is then judged by its own distance from the float64 run, as a multiple of dist32.
"""
import json
import os
import struct
import sys

# The same OpenBLAS kernel as loom's tests (set before numpy and torch load OpenBLAS).
os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from torch_recipes import get_lr, model, read_idx  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.environ.get("LOOM_DATA", "/usr/share/datasets/fashion-mnist")
B, STEPS, KEEP = 16, 3, 8192
LONG, LONG_B = 12, 32


def save_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        dt = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32"}[arr.dtype]
        b = arr.tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def subsample(name, t, out):
    flat = t.detach().reshape(-1).numpy().astype(np.float32)
    k = max(1, -(-flat.size // KEEP))
    out["stride." + name] = np.array([k], np.int32)
    return flat[::k]


OPTS = {"sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
        "sgdn": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True,
                                          weight_decay=5e-4),
        "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=1e-2)}


# adamwx: the schedule nanoGPT's get_lr computes, at step t (0-based)
WARMUP, DECAY, LR, MIN_LR, CLIP = 3, 10, 1e-3, 1e-4, 0.5


def lr_at(t):
    return get_lr(t, LR, WARMUP, DECAY, MIN_LR)


def make_opt(oname, net):
    if oname != "adamwx":
        return OPTS[oname](net.parameters())
    groups = [{"params": [p for p in net.parameters() if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in net.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.99), eps=1e-8)


def train_long(recipe, init, oname, dtype):
    """The parameters (name -> flat float64 array) and losses after LONG steps in dtype."""
    x8 = read_idx(os.path.join(DATA, "train-images-idx3-ubyte.gz"))[:LONG * LONG_B]
    y = torch.from_numpy(read_idx(os.path.join(DATA, "train-labels-idx1-ubyte.gz"))
                         [:LONG * LONG_B].astype(np.int64))
    # the pixels as loom and torchvision's ToTensor make them: a float32 division by 255, then
    # widened (the float64 run starts from the very inputs the float32 runs see)
    x = torch.from_numpy(x8.astype(np.float32) / np.float32(255.0)).to(dtype)
    net = model(recipe)
    net.load_state_dict(init)
    net = net.to(dtype)
    opt = make_opt(oname, net)
    losses = []
    for s in range(LONG):
        if oname == "adamwx":
            for group in opt.param_groups:
                group["lr"] = lr_at(s)
        xb = x[s * LONG_B:(s + 1) * LONG_B].reshape(LONG_B, 1, 28, 28)
        xb = xb.reshape(LONG_B, 784) if recipe == "fmnist-mlp" else xb
        loss = F.cross_entropy(net(xb), y[s * LONG_B:(s + 1) * LONG_B])
        opt.zero_grad()
        loss.backward()
        if oname == "adamwx":
            norm = torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)
            if dtype == torch.float64:
                print(f"  {recipe} adamwx step {s}: lr {lr_at(s):.3g}, gradient norm {norm:.3g}")
        opt.step()
        losses.append(loss.item())
    params = {k: p.detach().to(torch.float64).reshape(-1).numpy() for k, p in
              net.named_parameters()}
    return params, losses


def write_long(recipe, init):
    out = {}
    for oname in ("adamw", "sgdn", "adamwx"):
        p64, losses = train_long(recipe, init, oname, torch.float64)
        p32, _ = train_long(recipe, init, oname, torch.float32)
        sq = 0.0
        for k, v in p64.items():
            step = max(1, -(-v.size // KEEP))
            out["stride." + k] = np.array([step], np.int32)
            v0 = init[k].to(torch.float64).reshape(-1).numpy()
            out[oname + ".delta64." + k] = (v - v0)[::step].astype(np.float32)
            sq += float(np.sum((p32[k][::step] - v[::step]) ** 2))
        out[oname + ".dist32"] = np.array([np.sqrt(sq)], np.float32)
        out[oname + ".loss64"] = np.array(losses, np.float32)
        print(f"{recipe} {oname}: float32 {np.sqrt(sq):.3g} from float64 after {LONG} steps, "
              f"losses {losses[0]:.4f} .. {losses[-1]:.4f}")
    path = os.path.join(HERE, recipe + ".long.safetensors")
    save_safetensors(path, out)
    print(f"{path}: {os.path.getsize(path)} bytes")


def main():
    torch.set_num_threads(1)
    x_all = read_idx(os.path.join(DATA, "train-images-idx3-ubyte.gz"))[:B * STEPS]
    y_all = read_idx(os.path.join(DATA, "train-labels-idx1-ubyte.gz"))[:B * STEPS]
    x = torch.from_numpy(x_all.astype(np.float32) / 255.0).reshape(STEPS, B, 1, 28, 28)
    y = torch.from_numpy(y_all.astype(np.int64)).reshape(STEPS, B)
    for recipe in ("fmnist-mlp", "fmnist-cnn"):
        torch.manual_seed(0)
        init = {k: v.clone() for k, v in model(recipe).state_dict().items()}
        out = {"init." + k: v.numpy() for k, v in init.items()}
        out["x"] = x.numpy()
        out["y"] = y.numpy().astype(np.int32)
        if "--long-only" in sys.argv:  # the 3-step fixtures stay as committed
            write_long(recipe, init)
            continue
        for oname, make in OPTS.items():
            net = model(recipe)
            net.load_state_dict(init)
            opt = make(net.parameters())
            losses = []
            for s in range(STEPS):
                xb = x[s].reshape(B, 784) if recipe == "fmnist-mlp" else x[s]
                loss = F.cross_entropy(net(xb), y[s])
                opt.zero_grad()
                loss.backward()
                if oname == "sgd" and s == STEPS - 1:
                    for k, p in net.named_parameters():
                        out["sgd.grad." + k] = subsample(k, p.grad, out)
                opt.step()
                losses.append(loss.item())
            out[oname + ".loss"] = np.array(losses, np.float32)
            for k, p in net.named_parameters():
                out[oname + ".param." + k] = subsample(k, p, out)
        path = os.path.join(HERE, recipe + ".safetensors")
        save_safetensors(path, out)
        print(f"{path}: {os.path.getsize(path)} bytes, losses {out['sgd.loss']}")
        write_long(recipe, init)


if __name__ == "__main__":
    main()
