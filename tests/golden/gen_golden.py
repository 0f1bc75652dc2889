#!/usr/bin/python3
"""Generate loom's golden reference data for the tiny models.

Run from anywhere:   /usr/bin/python3 tests/golden/gen_golden.py

For each tiny model M (gpt2-tiny, llama-tiny, llama-tiny-tied) this reads the run spec
models/M.json and writes tests/golden/M/ (see tests/golden/README.md for the contents and
the exact semantics).  Plain torch only (no transformers, no safetensors package): the
models are written out below from the published architectures, and the safetensors and
llm.c shard writers are a few lines each.

Everything is deterministic: parameters and tokens come from numpy's PCG64 generator with
fixed seeds, the reference is computed in float64 on one CPU thread from the float32
parameters, and results are rounded to float32 when written.  Re-running produces
identical bytes.
"""

import json
import math
import os
import re
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDEN = os.path.join(ROOT, "tests", "golden")
MODELS = os.path.join(ROOT, "models")

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)

DT = torch.float64  # reference precision

# --------------------------------------------------------------------------------------
# file writers


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, np.ndarray float32). Order is kept; data is contiguous."""
    header = {}
    blobs = []
    off = 0
    names = set()
    for name, arr in tensors:
        assert name not in names, name
        names.add(name)
        a = np.array(arr, dtype="<f4", order="C")  # (np.ascontiguousarray would turn 0-d into 1-d)
        b = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        assert info["dtype"] == "F32"
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + b:8 + n + e], dtype="<f4").reshape(info["shape"])
    return out


def write_shard(path, tokens, wide):
    """llm.c token shard. wide=False: magic 20240520 v1 uint16; wide=True: 20240801 v7 uint32."""
    tokens = np.asarray(tokens)
    hdr = np.zeros(256, dtype="<i4")
    if wide:
        hdr[0], hdr[1] = 20240801, 7
        body = tokens.astype("<u4")
    else:
        assert tokens.max() < 65536
        hdr[0], hdr[1] = 20240520, 1
        body = tokens.astype("<u2")
    hdr[2] = len(tokens)
    with open(path, "wb") as f:
        f.write(hdr.tobytes())
        f.write(body.tobytes())


def read_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    hdr = np.frombuffer(data[:1024], dtype="<i4")
    if hdr[0] == 20240520:
        assert hdr[1] == 1
        toks = np.frombuffer(data[1024:], dtype="<u2")
    elif hdr[0] == 20240801:
        assert hdr[1] == 7
        toks = np.frombuffer(data[1024:], dtype="<u4")
    else:
        raise ValueError("bad magic in " + path)
    assert len(toks) == hdr[2]
    return toks.astype(np.int64)


# --------------------------------------------------------------------------------------
# parameters


def gpt2_param_shapes(cfg):
    V, P, D, L = cfg["vocab_size"], cfg["n_positions"], cfg["n_embd"], cfg["n_layer"]
    Fh = cfg.get("n_inner") or 4 * D
    shapes = [("wte.weight", [V, D]), ("wpe.weight", [P, D])]
    for i in range(L):
        p = "h.%d." % i
        shapes += [
            (p + "ln_1.weight", [D]), (p + "ln_1.bias", [D]),
            (p + "attn.c_attn.weight", [D, 3 * D]), (p + "attn.c_attn.bias", [3 * D]),
            (p + "attn.c_proj.weight", [D, D]), (p + "attn.c_proj.bias", [D]),
            (p + "ln_2.weight", [D]), (p + "ln_2.bias", [D]),
            (p + "mlp.c_fc.weight", [D, Fh]), (p + "mlp.c_fc.bias", [Fh]),
            (p + "mlp.c_proj.weight", [Fh, D]), (p + "mlp.c_proj.bias", [D]),
        ]
    shapes += [("ln_f.weight", [D]), ("ln_f.bias", [D])]
    return shapes


def llama_dims(cfg):
    D, H = cfg["hidden_size"], cfg["num_attention_heads"]
    KVH = cfg.get("num_key_value_heads") or H
    hd = cfg.get("head_dim") or D // H
    return D, H, KVH, hd


def llama_param_shapes(cfg):
    V, L, Fh = cfg["vocab_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
    D, H, KVH, hd = llama_dims(cfg)
    shapes = [("model.embed_tokens.weight", [V, D])]
    for i in range(L):
        p = "model.layers.%d." % i
        shapes += [
            (p + "input_layernorm.weight", [D]),
            (p + "self_attn.q_proj.weight", [H * hd, D]),
            (p + "self_attn.k_proj.weight", [KVH * hd, D]),
            (p + "self_attn.v_proj.weight", [KVH * hd, D]),
            (p + "self_attn.o_proj.weight", [D, H * hd]),
            (p + "post_attention_layernorm.weight", [D]),
            (p + "mlp.gate_proj.weight", [Fh, D]),
            (p + "mlp.up_proj.weight", [Fh, D]),
            (p + "mlp.down_proj.weight", [D, Fh]),
        ]
    shapes += [("model.norm.weight", [D])]
    if not cfg.get("tie_word_embeddings", False):
        shapes += [("lm_head.weight", [V, D])]
    return shapes


def is_norm_weight(name):
    return name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight", "layernorm.weight",
                          "model.norm.weight"))


def init_params(shapes, rng):
    """matrices ~ N(0, 0.15); norm weights 1 + 0.1 N(0,1); biases 0.1 N(0,1). float32."""
    out = []
    for name, shape in shapes:
        z = rng.standard_normal(shape)
        if len(shape) >= 2:
            a = 0.15 * z
        elif is_norm_weight(name):
            a = 1.0 + 0.1 * z
        else:
            a = 0.1 * z
        out.append((name, a.astype(np.float32)))
    return out


# --------------------------------------------------------------------------------------
# models (functional, over a dict name -> tensor)


def causal_attention(q, k, v, scale):
    # q,k,v: [B, H, T, hd]
    T = q.shape[2]
    att = (q @ k.transpose(-2, -1)) * scale
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    att = att.masked_fill(~mask, float("-inf"))
    att = torch.softmax(att, dim=-1)
    return att @ v


def gpt2_forward(cfg, P, ids):
    B, T = ids.shape
    D, H, L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
    eps = cfg["layer_norm_epsilon"]
    hd = D // H
    x = P["wte.weight"][ids] + P["wpe.weight"][:T]
    for i in range(L):
        p = "h.%d." % i
        n = F.layer_norm(x, (D,), P[p + "ln_1.weight"], P[p + "ln_1.bias"], eps)
        qkv = n @ P[p + "attn.c_attn.weight"] + P[p + "attn.c_attn.bias"]
        q, k, v = qkv.split(D, dim=-1)
        q, k, v = [t.view(B, T, H, hd).transpose(1, 2) for t in (q, k, v)]
        y = causal_attention(q, k, v, 1.0 / math.sqrt(hd))
        y = y.transpose(1, 2).reshape(B, T, D)
        x = x + (y @ P[p + "attn.c_proj.weight"] + P[p + "attn.c_proj.bias"])
        n = F.layer_norm(x, (D,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], eps)
        h = F.gelu(n @ P[p + "mlp.c_fc.weight"] + P[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + (h @ P[p + "mlp.c_proj.weight"] + P[p + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (D,), P["ln_f.weight"], P["ln_f.bias"], eps)
    return x @ P["wte.weight"].t()


def rope_theta(cfg):
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict) and rp.get("rope_theta") is not None:
        return float(rp["rope_theta"])
    if cfg.get("rope_theta") is not None:
        return float(cfg["rope_theta"])
    return 10000.0


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def apply_rope(x, cos, sin):
    # x: [B, H, T, hd]; rotate half: pairs (i, i + hd/2)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def llama_forward(cfg, P, ids):
    B, T = ids.shape
    D, H, KVH, hd = llama_dims(cfg)
    L, eps = cfg["num_hidden_layers"], cfg["rms_norm_eps"]
    theta = rope_theta(cfg)
    i = torch.arange(hd // 2, dtype=DT)
    inv_freq = theta ** (-2.0 * i / hd)
    ang = torch.arange(T, dtype=DT)[:, None] * inv_freq[None, :]  # [T, hd/2]
    cos, sin = torch.cos(ang), torch.sin(ang)
    rep = H // KVH
    x = P["model.embed_tokens.weight"][ids]
    for l in range(L):
        p = "model.layers.%d." % l
        n = rmsnorm(x, P[p + "input_layernorm.weight"], eps)
        q = (n @ P[p + "self_attn.q_proj.weight"].t()).view(B, T, H, hd).transpose(1, 2)
        k = (n @ P[p + "self_attn.k_proj.weight"].t()).view(B, T, KVH, hd).transpose(1, 2)
        v = (n @ P[p + "self_attn.v_proj.weight"].t()).view(B, T, KVH, hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # query head h uses kv head h // rep
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        y = causal_attention(q, k, v, 1.0 / math.sqrt(hd))
        y = y.transpose(1, 2).reshape(B, T, H * hd)
        h = x + y @ P[p + "self_attn.o_proj.weight"].t()
        n = rmsnorm(h, P[p + "post_attention_layernorm.weight"], eps)
        g = F.silu(n @ P[p + "mlp.gate_proj.weight"].t())
        u = n @ P[p + "mlp.up_proj.weight"].t()
        x = h + (g * u) @ P[p + "mlp.down_proj.weight"].t()
    x = rmsnorm(x, P["model.norm.weight"], eps)
    head = P["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else P["lm_head.weight"]
    return x @ head.t()


def forward(cfg, P, ids):
    if cfg["model_type"] == "gpt2":
        return gpt2_forward(cfg, P, ids)
    if cfg["model_type"] == "llama":
        return llama_forward(cfg, P, ids)
    raise ValueError(cfg["model_type"])


def loss_fn(cfg, P, ids, tgt):
    logits = forward(cfg, P, ids)
    V = logits.shape[-1]
    return logits, F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1))


# --------------------------------------------------------------------------------------
# data loader (llm.c-style shards)


class Loader:
    def __init__(self, shards, B, T):
        self.shards, self.B, self.T = shards, B, T
        self.shard, self.pos = 0, 0

    def next(self):
        n = self.B * self.T
        if self.pos + n + 1 > len(self.shards[self.shard]):
            self.shard = (self.shard + 1) % len(self.shards)
            self.pos = 0
        toks = self.shards[self.shard]
        assert self.pos + n + 1 <= len(toks)
        w = toks[self.pos:self.pos + n + 1]
        where = (self.shard, self.pos)
        self.pos += n
        x = torch.tensor(w[:-1], dtype=torch.long).view(self.B, self.T)
        y = torch.tensor(w[1:], dtype=torch.long).view(self.B, self.T)
        return x, y, where


# --------------------------------------------------------------------------------------
# per-model generation

TRAIN = dict(grad_accum=2, steps=3, lr=1e-2, min_lr=1e-3, warmup=2, weight_decay=0.1,
             beta1=0.9, beta2=0.95, eps=1e-4, grad_clip=0.5)

SPECS = {
    # name: (seed, wide tokens (uint32 shard), train shard lengths or None = tokens.bin)
    "gpt2-tiny": (1001, False, None),
    "llama-tiny": (1002, False, [150, 200]),
    "llama-tiny-tied": (1003, True, None),
}


def lr_at(s, tr):
    lr, min_lr, warmup, steps = tr["lr"], tr["min_lr"], tr["warmup"], tr["steps"]
    if s < warmup:
        return lr * (s + 1) / warmup
    r = (s - warmup) / max(1, steps - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * r)) * (lr - min_lr)


def to_params(named):
    return {n: torch.tensor(a, dtype=DT).requires_grad_(True) for n, a in named}


def f32(t):
    return t.detach().to(torch.float32).numpy()


def generate(name):
    seed, wide, train_lens = SPECS[name]
    with open(os.path.join(MODELS, name + ".json")) as f:
        spec = json.load(f)
    cfg, B, T = spec["model"], spec["batch"], spec["seq"]
    V = cfg["vocab_size"]
    out = os.path.join(GOLDEN, name)
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(seed)

    shapes = gpt2_param_shapes(cfg) if cfg["model_type"] == "gpt2" else llama_param_shapes(cfg)
    named = init_params(shapes, rng)
    tokens = rng.integers(0, V, size=300)
    write_safetensors(os.path.join(out, "weights.safetensors"), named, {"format": "pt"})
    write_shard(os.path.join(out, "tokens.bin"), tokens, wide)
    tokens = read_shard(os.path.join(out, "tokens.bin"))

    # forward + backward on tokens[0:B*T] -> tokens[1:B*T+1]
    P = to_params(named)
    ids = torch.tensor(tokens[0:B * T], dtype=torch.long).view(B, T)
    tgt = torch.tensor(tokens[1:B * T + 1], dtype=torch.long).view(B, T)
    logits, loss = loss_fn(cfg, P, ids, tgt)
    loss.backward()
    write_safetensors(os.path.join(out, "expected.safetensors"),
                      [("logits", f32(logits)), ("loss", f32(loss))], {"format": "pt"})
    write_safetensors(os.path.join(out, "grads.safetensors"),
                      [("loss", f32(loss))] + [("grad." + n, f32(P[n].grad)) for n, _ in named],
                      {"format": "pt"})
    res = {"loss": float(loss), "ln_V": math.log(V),
           "logits_std": float(logits.std())}

    # training
    tr = dict(TRAIN)
    if train_lens is None:
        data = ["tokens.bin"]
    else:
        data = []
        for j, n in enumerate(train_lens):
            fn = "train_%d.bin" % j
            write_shard(os.path.join(out, fn), rng.integers(0, V, size=n), wide)
            data.append(fn)
    shards = [read_shard(os.path.join(out, fn)) for fn in data]
    loader = Loader(shards, B, T)
    P = to_params(named)
    order = [n for n, _ in named]
    decay = [P[n] for n in order if P[n].dim() >= 2]
    no_decay = [P[n] for n in order if P[n].dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": tr["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=tr["lr"], betas=(tr["beta1"], tr["beta2"]), eps=tr["eps"], foreach=False)
    G = tr["grad_accum"]
    losses, norms, lrs, windows = [], [], [], []
    for s in range(tr["steps"]):
        opt.zero_grad(set_to_none=True)
        tot = 0.0
        for _ in range(G):
            x, y, where = loader.next()
            windows.append(list(where))
            _, l = loss_fn(cfg, P, x, y)
            (l / G).backward()
            tot += float(l)
        losses.append(tot / G)
        norm = math.sqrt(sum(float((P[n].grad ** 2).sum()) for n in order))
        assert norm > tr["grad_clip"], (name, s, norm)
        coef = min(1.0, tr["grad_clip"] / (norm + 1e-6))
        for n in order:
            P[n].grad.mul_(coef)
        lr_s = lr_at(s, tr)
        for g in opt.param_groups:
            g["lr"] = lr_s
        opt.step()
        norms.append(norm)
        lrs.append(lr_s)
    write_safetensors(
        os.path.join(out, "train.safetensors"),
        [(n, f32(P[n])) for n in order]
        + [("losses", np.array(losses, dtype=np.float32)),
           ("grad_norms", np.array(norms, dtype=np.float32)),
           ("lrs", np.array(lrs, dtype=np.float32))],
        {"format": "pt"})
    tj = {"B": B, "T": T}
    tj.update(tr)
    tj["data"] = data
    tj["windows"] = windows  # informative: (shard index, position) of each micro-batch, in order
    text = json.dumps(tj, indent=2)
    # keep each [shard, pos] pair of "windows" on one line
    text = re.sub(r"\[\s+(\d+),\s+(\d+)\s+\]", r"[\1, \2]", text)
    with open(os.path.join(out, "train.json"), "w") as f:
        f.write(text + "\n")
    # The same run as a loom run spec: `loom train train_spec.json --out X` reproduces it.
    spec = {"model": cfg, "batch": B, "seq": T, "data": data, "init": "weights.safetensors"}
    spec.update({k: tr[k] for k in ("grad_accum", "steps", "lr", "min_lr", "warmup", "weight_decay",
                                    "beta1", "beta2", "eps", "grad_clip")})
    with open(os.path.join(out, "train_spec.json"), "w") as f:
        f.write(json.dumps(spec, indent=2) + "\n")
    res.update(losses=losses, grad_norms=norms, lrs=lrs, windows=windows)
    return res


def main(argv):
    names = argv[1:] or list(SPECS)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import golden_dir  # the golden-folder files `loom check` reads
    for n in names:
        r = generate(n)
        golden_dir.convert(n)
        print("%-16s loss %.6f (ln V %.4f, logits std %.3f)" % (n, r["loss"], r["ln_V"], r["logits_std"]))
        print("%-16s train losses %s" % ("", " ".join("%.6f" % v for v in r["losses"])))
        print("%-16s grad norms   %s" % ("", " ".join("%.6f" % v for v in r["grad_norms"])))
        print("%-16s lrs          %s" % ("", " ".join("%.6g" % v for v in r["lrs"])))
        print("%-16s windows      %s" % ("", r["windows"]))


if __name__ == "__main__":
    main(sys.argv)
