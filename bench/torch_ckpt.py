# bench/torch_ckpt.py - PyTorch's cost of the same checkpoint: nanoGPT's shakespeare-char model's size (0.8 M parameters)
# with AdamW's state, saved as nanoGPT does (torch.save of model and optimizer state_dicts) and
# with an fsync, 200 times.
import os, time, torch
torch.set_num_threads(1)
n = 4 * (3 * 128 * 128 + 128 * 128 + 2 * 4 * 128 * 128) + 65 * 128 + 64 * 128  # ~ the GPT's
p = torch.nn.Parameter(torch.randn(n))
opt = torch.optim.AdamW([p], lr=1e-3)
p.grad = torch.randn(n); opt.step()
t0 = time.time()
for i in range(200):
    path = f"/tmp/ckpt_torch.pt"
    with open(path + ".tmp", "wb") as f:
        torch.save({"model": {"w": p.data}, "optimizer": opt.state_dict()}, f)
        f.flush(); os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
dt = (time.time() - t0) / 200
print(f"torch {torch.__version__}: {n} parameters, {os.path.getsize(path)} bytes, {dt*1e3:.1f} ms a checkpoint")
