"""Hugging Face folders in and out of loom, held against transformers and tokenizers themselves.

    python hf_interop.py LOOM TEST_HF TMPDIR

Makes, with no network: a byte-level BPE tokenizer trained by `tokenizers` on Tiny Shakespeare,
and GPT-2 and Llama folders written by transformers' save_pretrained from small configs with
random weights (GPT-2: float32, bfloat16, float16, sharded; Llama: grouped-query heads with an untied
head, float32 and bfloat16, and plain heads with a tied head). Then:
  - TEST_HF (tests/test_hf.c) checks loom's logits against transformers' (1e-4 relative) and
    loom's token ids against tokenizers' (the whole text, hostile UTF-8, decoding round trips);
  - five training steps of `loom train hf` (GPT-2, Llama) against the same steps in PyTorch,
    float32 and float64:
    loom's parameters within 8x the float32 run's distance from the float64 run;
  - `loom eval hf` gives the validation loss transformers gives; a resumed run ends bitwise as
    the run never stopped, and so does the run under mpirun (2 processes of a device each;
    MPIEXEC, where loom is built with MPI);
  - the folder loom saves loads in transformers (no missing or unexpected keys), and greedy
    generation there gives the text `loom sample hf --temperature 0` gives;
  - bad folders (another model type, a missing shard, a tensor of another shape, a truncated
    tokenizer.json, an activation or a rope scaling loom does not build) are refused in one line
    naming the file and the field or tensor.
Exit 77 (skipped) without torch, transformers and tokenizers."""
import gzip
import json
import os
import shutil
import struct
import subprocess
import sys

os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")
try:
    import torch
    import transformers
    from safetensors.torch import save_file
    from tokenizers import (Tokenizer, decoders, models, normalizers, pre_tokenizers, processors,
                            trainers)
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

LOOM, TEST_HF, TMP = sys.argv[1], sys.argv[2], sys.argv[3]
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(TMP, "hf")
transformers.logging.set_verbosity_error()
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def write_ids(path, ids):
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{len(ids)}i", *ids))


def make_tokenizer(text):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer)
    return tok


def make_sp_tokenizer(text):
    """Llama 2's kind (SentencePiece's BPE as transformers converts it): spaces as U+2581 and one
    in front, byte fallback, <unk> fused, <s> in front of an encoded text."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=specials, limit_alphabet=50)
    tok.train_from_iterator(text.splitlines(), trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok


HOSTILE = [
    "plain ASCII, with 's and 're and   three spaces\n\n\tand tabs  \n",
    "caf\u00e9 na\u0131\u0308ve e\u0301 combining marks \u0300\u0301 alone",
    "emoji \U0001F600\U0001F469\u200d\U0001F469\u200d\U0001F467 flags \U0001F1EB\U0001F1F7",
    "CJK \u4e2d\u6587\u5b57 \u65e5\u672c\u8a9e\u3067\u3059 \u3000ideographic space",
    "numbers \u0661\u0662\u0663 \u2167 \u00bd 123abc 4.5e6 and <|endoftext|> inside text<|endoftext|>",
    "mixed 'tis I'LL don't we've  \u00a0nbsp \u2028line sep \u0085nel",
]
HOSTILE_BYTES = [
    b"invalid \xff\xfe bytes \xc0\xaf overlong \xed\xa0\x80 surrogate \xf4\x90\x80\x80 too big",
    b"cut short \xe2\x82 then \xf0\x9f\x98 end \xe2",
    b"\x80\x80 lone continuations \xc3",
]


def write_cases(tok, prefix, text):
    """The ids tokenizer `tok` gives the text and the hostile strings, and its decoding of them
    (special tokens skipped): prefix + text.ids / .dec, hostileN.bin / .ids / .dec."""
    def put(name, raw):
        ids = tok.encode(raw.decode("utf-8", "replace"), add_special_tokens=False).ids
        write_ids(os.path.join(OUT, prefix + name + ".ids"), ids)
        with open(os.path.join(OUT, prefix + name + ".dec"), "wb") as f:
            f.write(tok.decode(ids, skip_special_tokens=True).encode())
    put("text", text.encode())
    for i, raw in enumerate([s.encode() for s in HOSTILE] + HOSTILE_BYTES):
        with open(os.path.join(OUT, f"hostile{i}.bin"), "wb") as f:
            f.write(raw)
        put(f"hostile{i}", raw)


def make_fixtures(text):
    os.makedirs(OUT, exist_ok=True)
    tok = make_tokenizer(text)
    tok_path = os.path.join(OUT, "tokenizer.json")
    tok.save(tok_path)
    with open(os.path.join(OUT, "text.txt"), "w") as f:
        f.write(text)
    write_cases(tok, "", text)
    # the byte tokens as Llama 2's file has them: in the vocabulary, not added tokens
    make_sp_tokenizer(text).save(os.path.join(OUT, "sp-norm.json"))
    doc = json.load(open(os.path.join(OUT, "sp-norm.json")))
    doc["added_tokens"] = [a for a in doc["added_tokens"] if not a["content"].startswith("<0x")]
    json.dump(doc, open(os.path.join(OUT, "sp-norm.json"), "w"))
    write_cases(Tokenizer.from_file(os.path.join(OUT, "sp-norm.json")), "sp-norm.", text)
    # the same model as newer conversions write it: a Metaspace pre-tokenizer (prepend_scheme
    # first) in place of the normalizers, words split at U+2581; then its Metaspace decoder too,
    # which keeps byte tokens as their names
    doc["normalizer"] = None
    doc["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581",
                            "prepend_scheme": "first", "split": True}
    json.dump(doc, open(os.path.join(OUT, "sp-meta.json"), "w"))
    write_cases(Tokenizer.from_file(os.path.join(OUT, "sp-meta.json")), "sp-meta.", text)
    doc["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                      "split": True}
    json.dump(doc, open(os.path.join(OUT, "sp-metadec.json"), "w"))
    write_cases(Tokenizer.from_file(os.path.join(OUT, "sp-metadec.json")), "sp-metadec.", text)
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=64, n_embd=32, n_layer=2,
                     n_head=2, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
    net = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # biases and LayerNorms away from their zeros and ones
        for p in net.parameters():
            p.add_(0.05 * torch.randn_like(p))
    net.save_pretrained(os.path.join(OUT, "gpt2"))
    net.save_pretrained(os.path.join(OUT, "gpt2-sharded"), max_shard_size="60KB")
    net.to(torch.bfloat16).save_pretrained(os.path.join(OUT, "gpt2-bf16"))
    net.to(torch.float16).save_pretrained(os.path.join(OUT, "gpt2-f16"))
    for d in ("gpt2", "gpt2-sharded", "gpt2-bf16", "gpt2-f16"):
        shutil.copy(tok_path, os.path.join(OUT, d))
    sp_path = os.path.join(OUT, "sp-norm.json")
    for name, kv, tied, path in (("llama-gqa", 2, False, tok_path), ("llama-tied", 4, True, tok_path),
                                 ("llama-sp", 2, False, sp_path)):
        vocab = Tokenizer.from_file(path).get_vocab_size()
        lc = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=kv,
                         max_position_embeddings=64, tie_word_embeddings=tied, rope_theta=500.0,
                         rms_norm_eps=1e-5)
        net = LlamaForCausalLM(lc).eval()
        with torch.no_grad():
            for p in net.parameters():
                p.add_(0.05 * torch.randn_like(p))
        net.save_pretrained(os.path.join(OUT, name))
        shutil.copy(path, os.path.join(OUT, name, "tokenizer.json"))
        if not tied and name != "llama-sp":
            net.to(torch.bfloat16).save_pretrained(os.path.join(OUT, name + "-bf16"))
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, cfg.vocab_size, (3, 40), generator=g)
    ref = {"tokens": tokens.to(torch.int32)}
    for name in ("gpt2", "gpt2-bf16", "gpt2-f16", "llama-gqa", "llama-gqa-bf16", "llama-tied"):
        kind = LlamaForCausalLM if name.startswith("llama") else GPT2LMHeadModel
        m = kind.from_pretrained(os.path.join(OUT, name), torch_dtype=torch.float32)
        with torch.no_grad():
            ref[name] = m.eval()(tokens).logits.contiguous()
    save_file(ref, os.path.join(OUT, "ref.safetensors"))
    index = json.load(open(os.path.join(OUT, "gpt2-sharded", "model.safetensors.index.json")))
    check(len(set(index["weight_map"].values())) > 1, "the sharded folder has several shards")
    return tok, cfg


def run(args, **kw):
    return subprocess.run([LOOM, *args], capture_output=True, text=True, **kw)


def same_steps(text, tok, name, kind):
    """Five steps of loom against PyTorch float32 and float64 from the same folder."""
    B, T, steps, lr = 4, 32, 5, 3e-3
    save = os.path.join(TMP, name + "-trained")
    shutil.rmtree(save, ignore_errors=True)
    data = os.path.join(OUT, "small.txt")
    with open(data, "w") as f:
        f.write(text)
    r = run(["train", "hf", "--init", os.path.join(OUT, name), "--data", data, "--steps", str(steps), "--batch", str(B), "--context",
             str(T), "--lr", str(lr), "--min-lr", str(lr), "--warmup-steps", "0",
             "--no-shuffle", "--eval-interval", "1000", "--save", save, "--quiet", "--devices", "2"])
    check(r.returncode == 0, f"loom train hf runs {name} and saves it: " + r.stderr.strip()[-300:])
    if r.returncode:
        return None
    ids = torch.tensor(tok.encode(text, add_special_tokens=False).ids)
    ntrain = int(len(ids) * 0.9)
    span = ntrain - T

    def train(dtype):
        net = kind.from_pretrained(os.path.join(OUT, name), torch_dtype=dtype)
        net.train()
        decay = [p for p in net.parameters() if p.dim() >= 2]
        rest = [p for p in net.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": rest, "weight_decay": 0.0}], lr=lr,
                                betas=(0.9, 0.99), eps=1e-8)
        for s in range(steps):
            at = [((s * B + r) * T) % span for r in range(B)]
            x = torch.stack([ids[a:a + T] for a in at])
            y = torch.stack([ids[a + 1:a + 1 + T] for a in at])
            logits = net(x).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
        return {k: v.detach().double() for k, v in net.state_dict().items()}

    f32, f64 = train(torch.float32), train(torch.float64)
    ours = kind.from_pretrained(save, torch_dtype=torch.float32).state_dict()
    start = kind.from_pretrained(os.path.join(OUT, name)).state_dict()
    keys = [k for k in f64 if not k.endswith("attn.bias") and not k.endswith("masked_bias")]
    dist = lambda a: sum(float(((a[k].double() - f64[k]) ** 2).sum()) for k in keys) ** 0.5
    d32, dloom, moved = dist(f32), dist(ours), dist(start)
    print(f"{name}, five steps: |loom - f64| {dloom:.3e}, |torch f32 - f64| {d32:.3e}, moved "
          f"{moved:.3e}")
    check(dloom <= 8 * d32 and moved > 1000 * dloom, f"{name}, five steps: loom within 8x PyTorch "
          "float32's distance from float64")
    return save


def same_weights(a, b):
    """Whether two saved folders hold bitwise the same tensors."""
    from safetensors.numpy import load_file
    x = load_file(os.path.join(a, "model.safetensors"))
    y = load_file(os.path.join(b, "model.safetensors"))
    return sorted(x) == sorted(y) and all((x[k] == y[k]).all() for k in x)


def resumed(name):
    """Four steps straight, and two then two more from the checkpoint: the same parameters; and
    the same four steps under mpirun (two processes of one device each, where loom has MPI)."""
    base = ["train", "hf", "--init", os.path.join(OUT, name), "--data",
            os.path.join(OUT, "small.txt"), "--batch", "4", "--context", "32", "--eval-interval",
            "2", "--quiet"]
    two = base + ["--devices", "2"]
    d = os.path.join(TMP, "hf-resume")
    shutil.rmtree(d, ignore_errors=True)
    straight = os.path.join(d, "straight")
    r1 = run(two + ["--steps", "4", "--save", straight])
    r2 = run(two + ["--steps", "2", "--checkpoint-dir", os.path.join(d, "ck")])
    r3 = run(two + ["--steps", "4", "--checkpoint-dir", os.path.join(d, "ck"), "--resume",
                    os.path.join(d, "ck"), "--save", os.path.join(d, "resumed")])
    ok = not (r1.returncode or r2.returncode or r3.returncode)
    check(ok and same_weights(straight, os.path.join(d, "resumed")),
          f"{name}: a run resumed from its checkpoint ends with bitwise the parameters of the run "
          "never stopped")
    mpirun = os.environ.get("MPIEXEC")  # (CMake's, where loom is built with MPI)
    if not mpirun or r1.returncode:
        print("skip mpirun: loom built without MPI")
        return
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    r4 = subprocess.run([mpirun, "-np", "2", LOOM, *base, "--devices", "1", "--steps", "4",
                         "--save", os.path.join(d, "mpi")], capture_output=True, text=True,
                        env=env, timeout=240)
    check(r4.returncode == 0 and same_weights(straight, os.path.join(d, "mpi")),
          f"{name}: mpirun -np 2 (a device each) trains bitwise as 2 devices of one process: "
          + r4.stderr.strip()[-300:])


def evaluation(tok, name, kind):
    """`loom eval hf`: the validation loss transformers gives, the split in windows of the
    model's positions."""
    data = os.path.join(OUT, "small.txt")
    ids = torch.tensor(tok.encode(open(data).read(), add_special_tokens=False).ids)
    val = ids[int(len(ids) * 0.9):]
    net = kind.from_pretrained(os.path.join(OUT, name), torch_dtype=torch.float64).eval()
    T = net.config.max_position_embeddings if name.startswith("llama") else net.config.n_positions
    windows = (len(val) - 1) // T
    x = torch.stack([val[w * T:w * T + T] for w in range(windows)])
    y = torch.stack([val[w * T + 1:w * T + T + 1] for w in range(windows)])
    with torch.no_grad():
        logits = net(x).logits
        want = float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                       y.reshape(-1)))
    r = run(["eval", "hf", "--init", os.path.join(OUT, name), "--data", data])
    got = float(r.stdout.split("val loss: ")[1]) if "val loss: " in r.stdout else float("nan")
    check(abs(got - want) < 1e-4, f"loom eval hf {name}: val loss {got:.4f}, transformers "
          f"{want:.4f}")


def generation(save, tok, kind):
    """The saved folder in transformers, and greedy generation there and in loom."""
    net, info = kind.from_pretrained(save, output_loading_info=True)
    missing = info["missing_keys"] + info["unexpected_keys"] + info["mismatched_keys"]
    check(not missing, f"transformers loads {os.path.basename(save)} with no missing or unexpected "
          f"keys ({missing})")
    prompt = "ROMEO:"
    n = 24
    x = torch.tensor([tok.encode(prompt).ids])
    with torch.no_grad():  # greedy decoding by hand: generate() imports torch.distributed
        for _ in range(n):  # parts that Debian's torch 1.13 cannot import on Python 3.11
            x = torch.cat([x, net.eval()(x).logits[:, -1].argmax(-1, keepdim=True)], 1)
    want = tok.decode(x[0].tolist(), skip_special_tokens=True)
    r = subprocess.run([LOOM, "sample", "hf", "--init", save, "--prompt", prompt, "--temperature",
                        "0", "--tokens", str(n), "--data", os.path.join(OUT, "small.txt"),
                        "--num-samples", "2"],
                       capture_output=True)  # (bytes: a token may end inside a character)
    got = r.stdout.decode("utf-8", "replace")
    got = got[:-1] if got.endswith("\n") else got  # (loom ends with a newline)
    check(r.returncode == 0 and got == want + "\n---------------\n" + want,
          f"greedy generation from {os.path.basename(save)}, two samples: loom {got!r}, "
          f"transformers {want!r}")


def bad_folders():
    base = os.path.join(OUT, "gpt2")
    cases = []

    def clone(name, src=None):
        d = os.path.join(TMP, "hf-bad", name)
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(src or (base if name != "shard" else os.path.join(OUT, "gpt2-sharded")), d)
        return d

    d = clone("type")
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg["model_type"] = "bert"
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    cases.append((d, ["config.json", "model_type", "bert"]))
    d = clone("shard")
    index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    gone = sorted(set(index["weight_map"].values()))[-1]
    os.remove(os.path.join(d, gone))
    cases.append((d, [gone]))
    d = clone("shape", os.path.join(OUT, "gpt2-sharded"))
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg["n_inner"] = 100
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    shard = index["weight_map"]["transformer.h.0.mlp.c_fc.weight"]
    cases.append((d, [shard, "mlp.c_fc.weight", "(32,128)", "(32,100)"]))
    d = clone("tokenizer")
    raw = open(os.path.join(d, "tokenizer.json"), "rb").read()
    open(os.path.join(d, "tokenizer.json"), "wb").write(raw[:len(raw) // 2])
    cases.append((d, ["tokenizer.json", "malformed JSON at byte"]))
    d = clone("act")
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg["activation_function"] = "relu"
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    cases.append((d, ["config.json", "activation_function", "relu"]))
    d = clone("rope", os.path.join(OUT, "llama-gqa"))
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    cases.append((d, ["config.json", "rope_scaling"]))
    for d, words in cases:
        r = run(["eval", "hf", "--init", d, "--data", os.path.join(OUT, "text.txt")])
        err = r.stderr.strip()
        ok = r.returncode in (1, 2) and len(err.splitlines()) == 1 and all(w in err for w in words)
        check(ok and "Traceback" not in err, f"bad folder {os.path.basename(d)}: exit "
              f"{r.returncode}, {err!r}")


def main():
    torch.set_num_threads(1)
    with gzip.open(os.path.join(HERE, "..", "..", "data", "tinyshakespeare.txt.gz"), "rt") as f:
        text = f.read()
    tok, cfg = make_fixtures(text)
    r = subprocess.run([TEST_HF, OUT], capture_output=True, text=True)
    print(r.stdout + r.stderr, end="")
    check(r.returncode == 0, "test_hf: logits and token ids")
    sp = Tokenizer.from_file(os.path.join(OUT, "sp-norm.json"))
    for name, kind, t in (("gpt2", GPT2LMHeadModel, tok), ("llama-gqa", LlamaForCausalLM, tok),
                          ("llama-sp", LlamaForCausalLM, sp)):
        save = same_steps(text[:200000], t, name, kind)
        evaluation(t, name, kind)
        if name == "llama-sp":
            resumed(name)
        if save:
            generation(save, t, kind)
    bad_folders()
    print(f"{len(failures)} failure(s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
