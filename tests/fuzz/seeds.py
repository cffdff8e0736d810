#!/usr/bin/python3
"""Seed inputs of the fuzz targets' corpora (tests/fuzz/corpus/<target>/seed-*): small valid
files of each format and a few broken ones, so that fuzzing starts from the formats' structure.
Run from anywhere: python3 tests/fuzz/seeds.py. Inputs the fuzzers find (and every crash, as a
regression input) are added to the same directories by scripts/fuzz.sh."""
import gzip
import json
import os
import struct

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    os.makedirs(os.path.join(HERE, target), exist_ok=True)
    with open(os.path.join(HERE, target, "seed-" + name), "wb") as f:
        f.write(data)


def safetensors(tensors, meta=None):
    header, blobs, off = {}, b"", 0
    if meta:
        header["__metadata__"] = meta
    for name, (dt, shape, data) in tensors.items():
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs += data
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + blobs


f32 = lambda *v: struct.pack("<%df" % len(v), *v)
model = safetensors({"w": ("F32", [2, 3], f32(1, 2, 3, 4, 5, 6)), "b": ("F32", [3], f32(7, 8, 9))},
                    {"format": "pt"})
put("safetensors", "model", model)
put("safetensors", "truncated", model[:-5])
put("safetensors", "dtypes", safetensors({"d": ("F64", [2], struct.pack("<2d", 1, 2)),
                                          "i": ("I32", [1, 2], struct.pack("<2i", 3, 4)),
                                          "e": ("F32", [0, 4], b"")}))
put("safetensors", "empty-header", struct.pack("<Q", 2) + b"{}")


def idx(magic, dims, body):
    return struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + body


images = idx(0x803, [2, 3, 4], bytes(range(24)))
labels = idx(0x801, [2], bytes([3, 9]))
for mode in range(4):  # bit 0: images gzip'd by the target, bit 1: labels
    put("idx", "mode%d" % mode, bytes([mode]) + struct.pack(">H", len(images)) + images + labels)
put("idx", "gzip-inside", bytes([0]) + struct.pack(">H", len(gzip.compress(images))) +
    gzip.compress(images) + labels)
put("idx", "short", bytes([1]) + struct.pack(">H", 16) + idx(0x803, [60000, 28, 28], b"") + labels)

trailer = lambda body: body + b"loomsum1" + bytes(8)  # a trailer with the wrong hash
put("kernel_cache", "elf-head", trailer(b"\x7fELF\x02\x01\x01" + bytes(57)))
put("kernel_cache", "tag-only", b"loomsum1" + bytes(8))

for i, line in enumerate([
        "fmnist-mlp\0--steps\0003\0--lr\0000.1",
        "fmnist-cnn\0--optimizer\0adamw\0--weight-decay\0001e-2\0--nesterov",
        "fmnist-mlp\0--devices\0auto\0--timeout\0000.5\0--seed\0-1",
        "fmnist-mlp\0--init\0w.st\0--save\0x.st\0--log-dir\0logs\0--no-shuffle\0--drop-last",
        "\0--epochs\0999999999999999999999\0--batch"]):
    put("args", "line%d" % i, bytes([i % 2]) + line.encode())

for i, line in enumerate([
        "--layers\0002\0--heads\0002\0--width\00032\0--context\00016\0--batch\0008",
        "--batch\00072057594037927936\0--context\0001024",
        "--tokens\0004611686018427387903\0--init\0w.st\0--start\0ROMEO:",
        "--width\0008192\0--heads\0001\0--layers\0001000\0--devices\0auto",
        "--lr\0001e-3\0--min-lr\0001e-2\0--clip-norm\0000\0--timeout\0001e19",
        "--warmup-steps\00010\0--decay-steps\0005\0--dropout\0000.5\0--seed\0007"]):
    put("gpt_args", "line%d" % i, bytes([i % 3]) + line.encode())

shakespeare = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
               "All:\nSpeak, speak.\n").encode()
put("text", "plain", bytes([0]) + shakespeare)
put("text", "to-gzip", bytes([1]) + shakespeare)
put("text", "gzip-inside", bytes([0]) + gzip.compress(shakespeare))
put("text", "gzip-cut", bytes([0]) + gzip.compress(shakespeare)[:40])
put("text", "gzip-twice", bytes([0]) + gzip.compress(shakespeare) + gzip.compress(b"caf\xc3\xa9 \xe6\x97\xa5"))
put("text", "wide", bytes([0]) + "日本語のテキスト、café\n".encode() * 3)
put("text", "one-char", bytes([0]) + b"a" * 50)

small_bpe = json.dumps({
    "version": "1.0", "added_tokens": [{"id": 6, "content": "<|endoftext|>", "special": True}],
    "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False},
    "post_processor": None, "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3, "\u0120ab": 4,
                                       "c": 5}, "merges": ["a b", ["\u0120", "ab"]]}}).encode()
put("tokenizer", "small", bytes([0]) + small_bpe)
put("tokenizer", "cut", bytes([0]) + small_bpe[:70])
put("tokenizer", "text", bytes([1]) + shakespeare + b" the thee theee <|end|>x")
put("tokenizer", "hostile", bytes([1]) + "caf\u00e9 \U0001F600 \u4e2d\u6587 \u0661 's".encode()
    + b" \xff\xc0\xaf\xed\xa0\x80\xe2\x82")
