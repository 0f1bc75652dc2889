#!/usr/bin/env python3
"""`loom make-golden SPEC -o DIR [--steps N] [--seed S]`: a golden folder (README "Golden
folders") computed by PyTorch with the Hugging Face transformers model of the config.

    python3 tools/make_golden.py SPEC -o DIR [--steps N] [--seed S]

SPEC is a Hugging Face config.json or a loom run spec (batch, seq and the training settings
are taken from it, with loom's defaults otherwise).  The parameters are drawn from the seed
(numpy PCG64; tests/golden/gen_golden.py's scales), rounded to float32 and written; the model
(GPT2LMHeadModel or LlamaForCausalLM, eager attention) then runs in float64 from exactly
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
import gen_golden as gg  # noqa: E402  (writers, parameter shapes and init, lr schedule)

DEFAULTS = dict(batch=4, steps=3, grad_accum=1, lr=3e-4, min_lr=0.0, warmup=0, weight_decay=0.1,
                beta1=0.9, beta2=0.95, eps=1e-8, grad_clip=1.0)
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


def hf_model(cfg, path):
    mt = cfg.get("model_type")
    keys = {k: v for k, v in cfg.items() if not k.startswith("_")}
    if mt == "gpt2":
        c = GPT2Config(**keys)
        c.attn_pdrop = c.embd_pdrop = c.resid_pdrop = 0.0
        c._attn_implementation = "eager"
        return GPT2LMHeadModel(c), "transformer."
    if mt == "llama":
        c = LlamaConfig(**keys)
        c.attention_dropout = 0.0
        c._attn_implementation = "eager"
        return LlamaForCausalLM(c), ""
    die("%s: model_type '%s': make-golden writes goldens for gpt2 and llama" % (path, mt))


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
    V = int(cfg.get("vocab_size", 0))
    P_max = int(cfg.get("n_positions") or cfg.get("max_position_embeddings") or 1024)
    B = int(spec.get("batch", DEFAULTS["batch"]))
    T = int(spec.get("seq", min(1024, P_max)))
    tr = {k: spec.get(k, DEFAULTS[k]) for k in TRAIN_KEYS}
    tr["steps"] = a.steps if a.steps is not None else int(spec.get("steps", DEFAULTS["steps"]))
    if B < 1 or T < 1 or V < 1 or T > P_max:
        die("%s: batch %d, seq %d, vocab %d, positions %d: need batch, seq, vocab >= 1 and seq <= positions"
            % (a.spec, B, T, V, P_max))
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    model, prefix = hf_model(cfg, a.spec)
    model = model.double()
    model.eval()  # no dropout; gradients still flow

    rng = np.random.default_rng(a.seed)
    shapes = gg.gpt2_param_shapes(cfg) if cfg["model_type"] == "gpt2" else gg.llama_param_shapes(cfg)
    named = gg.init_params(shapes, rng)
    n_tok = max(B * T + 1, tr["steps"] * tr["grad_accum"] * B * T + 1)
    tokens = rng.integers(0, V, size=n_tok)
    wide = V > 65536
    os.makedirs(a.out, exist_ok=True)
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
