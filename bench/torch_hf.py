"""The PyTorch peer of bench/hf.sh: Hugging Face models in transformers, eager.

    python torch_hf.py make DIR gpt2|llama TEXT   a folder with random weights (GPT-2 small's
                                                  configuration, or a Llama of ~125M parameters)
                                                  and a byte-level tokenizer trained on TEXT
    python torch_hf.py run DIR STEPS THREADS      AdamW training steps on batches of 4 x 128
                                                  tokens; prints ms/step (the mean of the steps
                                                  after the first 2) and peak RSS"""
import os
import resource
import sys
import time

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

B, T = 4, 128


def make(d, kind, text_path):
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_layer=12, n_head=12, n_embd=768, n_positions=1024,
                                      vocab_size=50257, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
        net = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(hidden_size=768, intermediate_size=2048,
                                       num_hidden_layers=12, num_attention_heads=12,
                                       num_key_value_heads=4, max_position_embeddings=2048,
                                       vocab_size=32000, tie_word_embeddings=False)
        net = transformers.LlamaForCausalLM(cfg)
    net.save_pretrained(d)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train([text_path], trainers.BpeTrainer(
        vocab_size=1000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(os.path.join(d, "tokenizer.json"))
    print(f"{d}: {sum(p.numel() for p in net.parameters()) / 1e6:.1f}M parameters")


def run(d, steps, threads):
    torch.set_num_threads(threads)
    net = transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32).train()
    decay = [p for p in net.parameters() if p.dim() >= 2]
    rest = [p for p in net.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}], lr=1e-4, betas=(0.9, 0.99))
    g = torch.Generator().manual_seed(0)
    times = []
    for s in range(steps):
        x = torch.randint(0, 1000, (B, T + 1), generator=g)
        t0 = time.perf_counter()
        logits = net(x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    ms = 1e3 * sum(times[2:]) / len(times[2:])
    print(f"ms/step {ms:.1f}")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss} KB")


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        run(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
