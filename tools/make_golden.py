#!/usr/bin/env python3
"""`loom make-golden SPEC -o DIR [--steps N] [--seed S]`: a golden folder (README "Golden
folders") computed by PyTorch with the Hugging Face transformers model of the config.

    python3 tools/make_golden.py SPEC -o DIR [--steps N] [--seed S]

SPEC is a Hugging Face config.json or a loom run spec (batch, seq and the training settings
are taken from it, with loom's defaults otherwise).  The parameters are drawn from the seed
(numpy PCG64; tests/golden/gen_golden.py's scales), rounded to float32 and written; the model
(GPT2LMHeadModel, or LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM;
eager attention) then runs in float64 from exactly
those values: one forward and backward on tokens[0:B*T] -> tokens[1:B*T+1], and N training
steps with loom's semantics (AdamW as torch.optim.AdamW with decay on tensors of 2+ dims,
clipping by the global norm, warmup + cosine schedule, grad_accum micro-batches averaged,
consecutive data windows).  Results are rounded to float32 when written.
Exit 0 done, 2 bad input or torch / transformers missing.
"""
import argparse
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
INSTALL = ("python3 -m venv V && V/bin/pip install torch transformers numpy, then run loom with "
           "LOOM_PYTHON=V/bin/python")


def die(msg, code=2):
    sys.stderr.write("loom make-golden: error: %s\n" % msg)
    sys.exit(code)


def import_packages():
    """numpy, torch, transformers and tests/golden/gen_golden.py's helpers (writers, parameter
    shapes and init, lr schedule), imported once the spec has been read, so that a bad spec
    is reported as such whatever the python has."""
    global np, torch, F, transformers, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, gg
    try:
        import numpy as np
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        die("%s needs PyTorch and numpy (%s): %s" % (sys.executable, e, INSTALL))
    try:
        import transformers
        from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        die("%s has no Hugging Face transformers (%s): %s" % (sys.executable, e, INSTALL))
    sys.path.insert(0, os.path.join(ROOT, "tests", "golden"))
    import gen_golden as gg


# loom's training defaults but for Adam's eps: 1e-4, not 1e-8.  With 1e-8 a weight whose
# gradient is near zero moves by about +-lr whatever the gradient's float noise says, so an f32
# run lands up to 2 x steps x lr away from the float64 golden (2e-4 relative on a 3-layer Llama)
# and `loom check`'s training cell (1e-5) cannot tell a right run from a wrong one; 1e-4 damps
# that (2.7e-7 on the same model).  A spec's own "eps" is kept.
DEFAULTS = dict(batch=4, steps=3, grad_accum=1, lr=3e-4, min_lr=0.0, warmup=0, weight_decay=0.1,
                beta1=0.9, beta2=0.95, eps=1e-4, grad_clip=1.0)
TRAIN_KEYS = ("grad_accum", "lr", "min_lr", "warmup", "weight_decay", "beta1", "beta2", "eps", "grad_clip")


def load_spec(path):
    try:
        with open(path) as f:
            spec = json.load(f)
    except OSError as e:
        die("%s: %s" % (path, e.strerror))
    except ValueError as e:
        die("%s: not JSON: %s" % (path, e))
    if not isinstance(spec, dict):
        die("%s: expected a JSON object (a Hugging Face config or a loom run spec)" % path)
    if "model_type" in spec:
        return spec, {}
    cfg = spec.get("model")
    if isinstance(cfg, str):
        p = os.path.join(os.path.dirname(os.path.abspath(path)), cfg)
        if os.path.isdir(p):
            p = os.path.join(p, "config.json")
        try:
            with open(p) as f:
                cfg = json.load(f)
        except (OSError, ValueError) as e:
            die("%s: \"model\" names %s, which cannot be read: %s" % (path, p, e))
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        die("%s: neither a Hugging Face config (no \"model_type\") nor a run spec with a \"model\"" % path)
    return cfg, spec


# The Llama-like families: model_type -> (transformers' modeling module, config and model class names).
LLAMA_LIKE = {"llama": ("llama", "LlamaConfig", "LlamaForCausalLM"),
              "qwen2": ("qwen2", "Qwen2Config", "Qwen2ForCausalLM"),
              "qwen3": ("qwen3", "Qwen3Config", "Qwen3ForCausalLM"),
              "mistral": ("mistral", "MistralConfig", "MistralForCausalLM")}


def modeling(mt):
    import importlib
    try:
        return importlib.import_module("transformers.models.%s.modeling_%s" % (LLAMA_LIKE[mt][0], LLAMA_LIKE[mt][0]))
    except ImportError as e:
        die("transformers %s has no %s model (%s): %s" % (transformers.__version__, mt, e, INSTALL))


def hf_model(cfg, path):
    mt = cfg.get("model_type")
    keys = {k: v for k, v in cfg.items() if not k.startswith("_")}
    try:
        return build(mt, keys)
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        die("%s: transformers %s cannot build this %s config: %s" % (path, transformers.__version__, mt, e))


def build(mt, keys):
    if mt == "gpt2":
        c = GPT2Config(**keys)
        c.attn_pdrop = c.embd_pdrop = c.resid_pdrop = 0.0
        c._attn_implementation = "eager"
        return GPT2LMHeadModel(c), "transformer."
    if mt in LLAMA_LIKE:
        mod = modeling(mt)
        c = getattr(mod, LLAMA_LIKE[mt][1], None) or getattr(transformers, LLAMA_LIKE[mt][1])
        c = c(**keys)
        c.attention_dropout = 0.0
        c._attn_implementation = "eager"
        return getattr(mod, LLAMA_LIKE[mt][2])(c), ""


def llama3_inv_freq(inv, rs):
    """transformers' _compute_llama3_parameters (rope_type "llama3"), in float64."""
    factor, lo, hi = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    orig = float(rs["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > orig / lo, inv / factor, inv)
    smooth = (orig / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < orig / hi) & ~(wavelen > orig / lo)
    return torch.where(medium, smoothed, scaled)


def llama_float64(model, model_cfg, path):
    """transformers' Llama (and Qwen2, Qwen3, Mistral) computes three things in float32
    whatever the model's dtype (they are meant for half precision): RoPE's inv_freq, angles
    and cos/sin (an angle t*inv_freq near t = 1000 is then off by ~6e-5), RMSNorm, and the
    eager attention's softmax.  The golden is float64 throughout, so these are redone here
    with transformers' own formulas (default or llama3 RoPE with attention_scaling 1;
    x * rsqrt(mean(x^2) + eps) * w; the eager attention with repeat_kv, and the mask
    transformers gives it: causal, and Mistral's sliding window) without the float32 casts."""
    ml = modeling(model_cfg["model_type"])
    rot = model.model.rotary_emb
    if rot.rope_type not in ("default", "llama3"):
        die("%s: rope type '%s': make-golden writes goldens for the default and llama3 RoPE only" % (path, rot.rope_type))
    c = model.config
    base = (getattr(c, "rope_parameters", None) or {}).get("rope_theta", getattr(c, "rope_theta", None))
    want = (model_cfg.get("rope_parameters") or {}).get("rope_theta", model_cfg.get("rope_theta", 10000.0))
    if base is None or float(base) != float(want):
        die("%s: rope_theta is %s in the config but transformers %s reads %s: use a newer transformers"
            % (path, want, transformers.__version__, base))
    dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    rot.inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if rot.rope_type == "llama3":
        rs = model_cfg.get("rope_parameters") if (model_cfg.get("rope_parameters") or {}).get("rope_type") \
            else model_cfg.get("rope_scaling")
        rot.inv_freq = llama3_inv_freq(rot.inv_freq, rs)
        if float(getattr(rot, "attention_scaling", 1.0)) != 1.0:
            die("internal: llama3 RoPE with attention_scaling %s" % rot.attention_scaling, 1)

    def rope(x, position_ids):
        freqs = position_ids[..., None].to(torch.float64) * rot.inv_freq.to(device=x.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * rot.attention_scaling).to(x.dtype), (emb.sin() * rot.attention_scaling).to(x.dtype)

    rot.forward = rope

    def rmsnorm(m):
        return lambda h: m.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + m.variance_epsilon))

    for m in model.modules():
        if type(m).__name__.endswith("RMSNorm"):
            m.forward = rmsnorm(m)

    def eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        k = ml.repeat_kv(key, module.num_key_value_groups)
        v = ml.repeat_kv(value, module.num_key_value_groups)
        w = torch.matmul(query, k.transpose(2, 3)) * scaling
        if attention_mask is not None:   # (Mistral: causal and the sliding window)
            w = w + attention_mask[:, :, :, : k.shape[-2]]
        w = torch.nn.functional.softmax(w, dim=-1)
        return torch.matmul(w, v).transpose(1, 2).contiguous(), w

    ml.eager_attention_forward = eager


def llama_like_shapes(cfg):
    """Llama's parameters (gen_golden.py), with Qwen2's q/k/v biases after their weights and
    Qwen3's q/k norms after o_proj."""
    D, H, KVH, hd = gg.llama_dims(cfg)
    out = []
    for name, shape in gg.llama_param_shapes(cfg):
        out.append((name, shape))
        if cfg["model_type"] == "qwen2" and name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
            out.append((name[:-len("weight")] + "bias", [shape[0]]))
        if cfg["model_type"] == "qwen3" and name.endswith("o_proj.weight"):
            p = name[:-len("o_proj.weight")]
            out += [(p + "q_norm.weight", [hd]), (p + "k_norm.weight", [hd])]
    return out


def main(argv):
    ap = argparse.ArgumentParser(prog="loom make-golden", description=__doc__.split("\n\n")[0])
    ap.add_argument("spec")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--seed", type=int, default=1337)
    a = ap.parse_args(argv)
    if a.steps is not None and a.steps < 0:
        die("--steps must be >= 0")
    cfg, spec = load_spec(a.spec)
    if cfg.get("model_type") not in ("gpt2",) + tuple(LLAMA_LIKE):
        die("%s: model_type '%s': make-golden writes goldens for gpt2, llama, qwen2, qwen3 and mistral"
            % (a.spec, cfg.get("model_type")))

    def num(src, key, default, kind, lo):
        v = src.get(key, default)
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v >= lo and (kind is float or v == int(v))
        if not ok:
            die("%s: \"%s\" is %s: expected %s >= %s" % (a.spec, key, json.dumps(v),
                "a whole number" if kind is int else "a number", lo))
        return kind(v)

    P_max = cfg.get("n_positions") or cfg.get("max_position_embeddings")
    P_max = num({"positions": P_max or (1024 if cfg["model_type"] == "gpt2" else 2048)}, "positions", 0, int, 1)
    V = num(cfg, "vocab_size", None, int, 1)
    B = num(spec, "batch", DEFAULTS["batch"], int, 1)
    T = num(spec, "seq", min(1024, P_max), int, 1)
    tr = {k: num(spec, k, DEFAULTS[k], int if k in ("grad_accum", "warmup") else float, 1 if k == "grad_accum" else 0)
          for k in TRAIN_KEYS}
    tr["steps"] = a.steps if a.steps is not None else num(spec, "steps", DEFAULTS["steps"], int, 0)
    if cfg["model_type"] == "gpt2" and T > P_max:
        die("%s: seq %d is longer than the model's %d positions (n_positions)" % (a.spec, T, P_max))
    import_packages()
    try:
        shapes = gg.gpt2_param_shapes(cfg) if cfg["model_type"] == "gpt2" else llama_like_shapes(cfg)
    except KeyError as e:
        die("%s: the %s config has no %s" % (a.spec, cfg["model_type"], e))
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    model, prefix = hf_model(cfg, a.spec)
    model = model.double()
    model.eval()  # no dropout; gradients still flow
    if model.config._attn_implementation != "eager":
        die("internal: transformers chose attention '%s', not eager" % model.config._attn_implementation, 1)
    if cfg["model_type"] in LLAMA_LIKE:
        llama_float64(model, cfg, a.spec)

    rng = np.random.default_rng(a.seed)
    named = gg.init_params(shapes, rng)
    n_tok = max(B * T + 1, tr["steps"] * tr["grad_accum"] * B * T + 1)
    tokens = rng.integers(0, V, size=n_tok)
    wide = V > 65536
    try:
        os.makedirs(a.out, exist_ok=True)
    except OSError as e:
        die("cannot create the folder %s: %s" % (a.out, e.strerror))
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    gg.write_safetensors(os.path.join(a.out, "weights.safetensors"), named, {"format": "pt"})
    gg.write_shard(os.path.join(a.out, "tokens.bin"), tokens, wide)
    tokens = gg.read_shard(os.path.join(a.out, "tokens.bin"))

    # loom's names -> the transformers model's parameters
    hf = dict(model.named_parameters())
    params = {}
    for n, arr in named:
        p = hf.get(prefix + n) if (prefix + n) in hf else hf.get(n)
        if p is None:
            die("internal: the transformers model has no parameter for %s" % n, 1)
        if tuple(p.shape) != tuple(arr.shape):
            die("internal: %s is %s in transformers but %s in loom" % (n, tuple(p.shape), arr.shape), 1)
        params[n] = p
    loom_names = {prefix + n for n, _ in named} | {n for n, _ in named}
    for hn in hf:
        if hn not in loom_names and not (hn == "lm_head.weight" and model.config.tie_word_embeddings):
            die("internal: transformers' parameter %s has no loom name" % hn, 1)

    def load(state):
        with torch.no_grad():
            for n, arr in state:
                params[n].copy_(torch.tensor(arr, dtype=torch.float64))

    def loss_of(ids, tgt):
        logits = model(input_ids=ids).logits
        return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))

    sys.stderr.write("make-golden: %s (%s), batch %d x seq %d, %d steps, torch %s, transformers %s, float64\n"
                     % (a.spec, cfg["model_type"], B, T, tr["steps"], torch.__version__, transformers.__version__))
    load(named)
    model.zero_grad(set_to_none=True)
    ids = torch.tensor(tokens[0:B * T], dtype=torch.long).view(B, T)
    tgt = torch.tensor(tokens[1:B * T + 1], dtype=torch.long).view(B, T)
    logits, loss = loss_of(ids, tgt)
    loss.backward()
    out = [("logits", gg.f32(logits)), ("loss", gg.f32(loss))]
    out += [("grad." + n, gg.f32(params[n].grad)) for n, _ in named]
    sys.stderr.write("make-golden: forward and backward: loss %.6f\n" % float(loss.detach()))

    if tr["steps"] > 0:
        load(named)
        order = [n for n, _ in named]
        decay = [params[n] for n in order if params[n].dim() >= 2]
        no_decay = [params[n] for n in order if params[n].dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": tr["weight_decay"]},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=tr["lr"], betas=(tr["beta1"], tr["beta2"]), eps=tr["eps"], foreach=False)
        loader = gg.Loader([tokens], B, T)
        G = tr["grad_accum"]
        losses, norms, lrs = [], [], []
        for s in range(tr["steps"]):
            opt.zero_grad(set_to_none=True)
            tot = 0.0
            for _ in range(G):
                x, y, _ = loader.next()
                _, l = loss_of(x, y)
                (l / G).backward()
                tot += float(l.detach())
            losses.append(tot / G)
            norm = math.sqrt(sum(float((params[n].grad ** 2).sum()) for n in order))
            if tr["grad_clip"] > 0:
                coef = min(1.0, tr["grad_clip"] / (norm + 1e-6))
                for n in order:
                    params[n].grad.mul_(coef)
            lr_s = gg.lr_at(s, tr)
            for g in opt.param_groups:
                g["lr"] = lr_s
            opt.step()
            norms.append(norm)
            lrs.append(lr_s)
            sys.stderr.write("make-golden: step %d/%d loss %.6f norm %.4f lr %.3e\n"
                             % (s + 1, tr["steps"], losses[-1], norm, lr_s))
        out += [(n, gg.f32(params[n])) for n in order]
        out += [("losses", np.array(losses, dtype=np.float32)), ("grad_norms", np.array(norms, dtype=np.float32)),
                ("lrs", np.array(lrs, dtype=np.float32))]
    gg.write_safetensors(os.path.join(a.out, "expected.safetensors"), out, {"format": "pt"})
    golden = {"batch": B, "seq": T, "steps": tr["steps"]}
    golden.update({k: tr[k] for k in TRAIN_KEYS})
    golden.update(seed=a.seed, data=["tokens.bin"],
                  generator="loom make-golden: torch %s, transformers %s, float64"
                  % (torch.__version__, transformers.__version__))
    with open(os.path.join(a.out, "golden.json"), "w") as f:
        json.dump(golden, f, indent=2)
        f.write("\n")
    print("wrote %s: config.json, weights.safetensors, tokens.bin (%d tokens), golden.json, expected.safetensors "
          "(%d tensors)" % (a.out, len(tokens), len(out)))


if __name__ == "__main__":
    main(sys.argv[1:])
