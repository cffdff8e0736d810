"""Weights move between loom and the real readers, both ways, for both recipes; a checkpoint of
loom's continues its run in PyTorch; TensorBoard's own reader reads loom's event files.

    python interop.py LOOM TMPDIR

Needs numpy and safetensors (the PyPI package); with torch importable too, it also loads loom's
file into the equivalent torch.nn.Sequential (strict load_state_dict) and compares test accuracy,
and has loom evaluate weights that PyTorch trained and saved. Exit 77 (skipped) without
safetensors."""
import os
import re
import shutil
import subprocess
import sys

os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
try:
    import numpy as np
    from safetensors.numpy import load_file, save_file
    from torch_recipes import model, read_idx
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)
try:
    import torch
    import torch.nn as nn
    from safetensors.torch import save_file as torch_save_file
except ImportError:
    torch = None

LOOM, TMP = sys.argv[1], sys.argv[2]
DATA = os.environ.get("LOOM_DATA", "/usr/share/datasets/fashion-mnist")
SHAPES = {
    "fmnist-mlp": {"0.weight": (256, 784), "0.bias": (256,), "2.weight": (256, 256),
                   "2.bias": (256,), "4.weight": (10, 256), "4.bias": (10,)},
    "fmnist-cnn": {"0.weight": (32, 1, 3, 3), "0.bias": (32,), "3.weight": (64, 32, 3, 3),
                   "3.bias": (64,), "7.weight": (128, 1600), "7.bias": (128,),
                   "9.weight": (10, 128), "9.bias": (10,)},
}


def loom(*args):
    out = subprocess.run([LOOM, *args], check=True, capture_output=True, text=True).stdout
    return float(re.search(r"^test accuracy: ([0-9.]+)$", out, re.M).group(1))


def torch_model(recipe):
    first = nn.Flatten() if recipe == "fmnist-mlp" else nn.Identity()
    return nn.Sequential(first, model(recipe))


def test_set():
    def idx(name):
        return read_idx(os.path.join(DATA, name))
    x = torch.from_numpy(idx("t10k-images-idx3-ubyte.gz").astype(np.float32) / 255.0)
    return x.unsqueeze(1), torch.from_numpy(idx("t10k-labels-idx1-ubyte.gz").astype(np.int64))


def accuracy(net, x, y):
    with torch.no_grad():
        return (net(x).argmax(1) == y).float().mean().item()


def check(recipe):
    a = os.path.join(TMP, recipe + "-loom.safetensors")
    acc_loom = loom("train", recipe, "--steps", "30", "--save", a)
    w = load_file(a)  # the real reader
    assert {k: v.shape for k, v in w.items()} == SHAPES[recipe], w.keys()
    assert all(v.dtype == np.float32 for v in w.values())
    b = os.path.join(TMP, recipe + "-numpy.safetensors")
    save_file(w, b)  # the real writer; loom must read it and get the same accuracy exactly
    assert loom("eval", recipe, "--init", b) == acc_loom
    print(f"{recipe}: safetensors reads loom's file and writes one loom reads (accuracy {acc_loom})")
    if torch is None:
        return
    torch.set_num_threads(1)
    x, y = test_set()
    net = torch_model(recipe)
    net[1].load_state_dict({k: torch.from_numpy(v) for k, v in w.items()}, strict=True)
    acc_torch = accuracy(net, x, y)
    assert abs(acc_torch - acc_loom) <= 5e-4, (acc_torch, acc_loom)
    torch.manual_seed(1)
    net = torch_model(recipe)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    for i in range(30):
        loss = nn.functional.cross_entropy(net(x[i * 64:(i + 1) * 64]), y[i * 64:(i + 1) * 64])
        opt.zero_grad()
        loss.backward()
        opt.step()
    c = os.path.join(TMP, recipe + "-torch.safetensors")
    torch_save_file(net[1].state_dict(), c)
    acc_t, acc_l = accuracy(net, x, y), loom("eval", recipe, "--init", c)
    assert abs(acc_t - acc_l) <= 5e-4, (acc_t, acc_l)
    print(f"{recipe}: torch {torch.__version__} loads loom's weights ({acc_torch} vs {acc_loom}); "
          f"loom evaluates torch's ({acc_l} vs {acc_t})")


def train_set():
    def idx(name):
        return read_idx(os.path.join(DATA, name))
    x = torch.from_numpy(idx("train-images-idx3-ubyte.gz").astype(np.float32) / 255.0)
    return x.unsqueeze(1), torch.from_numpy(idx("train-labels-idx1-ubyte.gz").astype(np.int64))


def check_checkpoint():
    """loom's checkpoint after step 7 (AdamW, batches in order) loaded into torch.nn and
    torch.optim.AdamW as docs/checkpoints.md shows; PyTorch's step 8 on the same batch must give loom's
    step-8 parameters to float rounding."""
    d = os.path.join(TMP, "interop-checkpoints")
    subprocess.run([LOOM, "train", "fmnist-mlp", "--optimizer", "adamw", "--weight-decay", "0.01",
                    "--no-shuffle", "--batch", "100", "--steps", "8", "--checkpoint-dir", d,
                    "--checkpoint-every", "1"], check=True, capture_output=True)
    from safetensors import safe_open
    with safe_open(os.path.join(d, "step-000007.safetensors"), "pt") as f:  # the lines docs/checkpoints.md shows
        meta, sd = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    net = model("fmnist-mlp")
    net.load_state_dict({k: v for k, v in sd.items() if not k.startswith("optimizer.")})
    opt = torch.optim.AdamW(net.parameters(), lr=float(meta["config.--lr"]),
                            weight_decay=float(meta["config.--weight-decay"]))
    for name, p in net.named_parameters():
        opt.state[p] = {"step": torch.tensor(float(meta["optimizer.step"])),
                        "exp_avg": sd[f"optimizer.{name}.exp_avg"],
                        "exp_avg_sq": sd[f"optimizer.{name}.exp_avg_sq"]}
    assert meta["optimizer"] == "adamw" and meta["loom.step"] == "7", meta
    x, y = train_set()
    step = int(meta["loom.step"])  # the next batch: samples 700 to 799 (in order)
    loss = nn.functional.cross_entropy(net(x[step * 100:(step + 1) * 100].flatten(1)),
                                       y[step * 100:(step + 1) * 100])
    opt.zero_grad()
    loss.backward()
    opt.step()
    want = load_file(os.path.join(d, "step-000008.safetensors"))
    worst = 0.0
    for name, p in net.named_parameters():
        w = torch.from_numpy(want[name])
        worst = max(worst, ((p.detach() - w).abs().max() / w.abs().max()).item())
        e = torch.from_numpy(want[f"optimizer.{name}.exp_avg_sq"])
        assert torch.allclose(opt.state[p]["exp_avg_sq"], e, rtol=1e-4, atol=1e-12), name
    assert worst < 1e-5, worst
    print(f"checkpoint: torch {torch.__version__} continues loom's run at step 8 (parameters "
          f"within {worst:.2g} of loom's)")


def check_tensorboard():
    """A run to step 30 and the same run resumed from its step 20 log into one directory:
    TensorBoard's EventAccumulator sees each step once (the resumed file's START drops the first
    file's steps 21 to 30), with metrics.csv's values."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError as e:
        print(f"tensorboard: skipped ({e})")
        return
    logs, ck = os.path.join(TMP, "interop-tb"), os.path.join(TMP, "interop-tb-ck")
    shutil.rmtree(logs, ignore_errors=True)
    shutil.rmtree(ck, ignore_errors=True)
    run = [LOOM, "train", "fmnist-mlp", "--steps", "30", "--log-dir", logs, "--checkpoint-dir",
           ck, "--checkpoint-every", "10"]
    subprocess.run(run, check=True, capture_output=True)
    subprocess.run(run + ["--resume", os.path.join(ck, "step-000020.safetensors")], check=True,
                   capture_output=True)
    rows = [r.split(",") for r in open(os.path.join(logs, "metrics.csv")).read().split("\n")[1:] if r]
    ea = EventAccumulator(logs)
    ea.Reload()
    loss = ea.Scalars("train/loss")
    assert [e.step for e in loss] == list(range(1, 31)), [e.step for e in loss]
    want = {int(r[0]): float(r[2]) for r in rows if r[4]}  # the step rows
    assert sorted(want) == list(range(1, 31)), sorted(want)
    assert all(abs(e.value - want[e.step]) <= 1e-6 * max(1.0, abs(e.value)) for e in loss)
    acc = ea.Scalars("val/accuracy")
    assert [e.step for e in acc] == [30] and abs(acc[0].value - float(rows[-1][5])) < 1e-6, acc
    assert {"train/lr", "train/samples_per_s", "val/loss"} <= set(ea.Tags()["scalars"])
    print("tensorboard: its reader takes loom's event files, a resumed run's steps once each")


for r in SHAPES:
    check(r)
if torch is not None:
    check_checkpoint()
check_tensorboard()
