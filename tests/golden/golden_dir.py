#!/usr/bin/env python3
"""Adds the golden-folder files that `loom check` reads (README "Golden folders") to the
checked-in goldens, from the files gen_golden.py writes:

    python3 tests/golden/golden_dir.py            # all five folders
    python3 tests/golden/golden_dir.py gpt2-tiny

For tests/golden/M/ it writes
  config.json          the model's Hugging Face config (models/M.json's "model")
  golden.json          batch, seq and the training settings of train.json; "data" (train.json's
                       shards) since llama-tiny trains on two shards; "min_topk_gap" for the MoE models
  expected.safetensors logits and loss (as before; for the MoE models also ce_loss, aux_loss and
                       router.l<N>.tokens_per_expert), plus grad.<name> from grads.safetensors and
                       the trained parameters, losses, grad_norms and lrs from train.safetensors
Plain Python (no numpy, no torch): it only moves bytes.  gen_golden.py calls it after writing.
"""
import json
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDEN = os.path.join(ROOT, "tests", "golden")
MODELS = os.path.join(ROOT, "models")


def read_st(path):
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    meta = h.pop("__metadata__", None)
    data = b[8 + n:]
    out = []
    for name, t in sorted(h.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        s, e = t["data_offsets"]
        out.append((name, t["dtype"], t["shape"], data[s:e]))
    return out, meta


def write_st(path, tensors, meta):
    header = {"__metadata__": meta} if meta else {}
    off = 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, _, _, raw in tensors:
            f.write(raw)


def convert(model):
    d = os.path.join(GOLDEN, model)
    with open(os.path.join(MODELS, model + ".json")) as f:
        spec = json.load(f)
    with open(os.path.join(d, "train.json")) as f:
        tr = json.load(f)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(spec["model"], f, indent=2)
        f.write("\n")
    golden = {"batch": tr["B"], "seq": tr["T"]}
    for k in ("steps", "grad_accum", "lr", "min_lr", "warmup", "weight_decay", "beta1", "beta2", "eps", "grad_clip"):
        golden[k] = tr[k]
    golden["data"] = tr["data"]
    if "min_topk_gap" in tr:  # the MoE models: smallest top-k router gap over all their forwards
        golden["min_topk_gap"] = tr["min_topk_gap"]
    golden["generator"] = "tests/golden/gen_golden.py (plain torch, float64), merged by golden_dir.py"
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(golden, f, indent=2)
        f.write("\n")
    exp, meta = read_st(os.path.join(d, "expected.safetensors"))
    names = {t[0] for t in exp}
    keep = [t for t in exp if t[0] in ("logits", "loss", "ce_loss", "aux_loss") or t[0].startswith("router.")]
    grads, _ = read_st(os.path.join(d, "grads.safetensors"))
    train, _ = read_st(os.path.join(d, "train.safetensors"))
    merged = keep + [t for t in grads if t[0].startswith("grad.")] + train
    assert len({t[0] for t in merged}) == len(merged), "a name appears twice"
    write_st(os.path.join(d, "expected.safetensors"), merged, meta or {"format": "pt"})
    print("%s: config.json, golden.json, expected.safetensors (%d tensors; was %d)" % (d, len(merged), len(names)))


def main(argv):
    for m in argv or ["gpt2-tiny", "llama-tiny", "llama-tiny-tied", "mixtral-tiny", "qwen3-moe-tiny"]:
        convert(m)


if __name__ == "__main__":
    main(sys.argv[1:])
