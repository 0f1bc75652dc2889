#!/usr/bin/env python3
"""Cross-checks the MoE goldens (tests/golden/mixtral-tiny, tests/golden/qwen3-moe-tiny), which
gen_golden.py computes in plain torch, against Hugging Face transformers' own
MixtralForCausalLM / Qwen3MoeForCausalLM.

    PY tests/golden/check_moe_transformers.py [MODEL ...] [--fused]

PY is a Python with torch and transformers: Mixtral needs transformers 4.40 or later (4.44.2
runs on Debian's torch 1.13), Qwen3-MoE needs 4.51 or later (so a newer torch). MODEL is
mixtral-tiny and/or qwen3-moe-tiny; without any, both are checked where this transformers
has the class, and a model it lacks is reported as SKIPPED (exit 0 if every check that ran
passed). --fused: only with transformers 5, also load mixtral-tiny/weights_fused.safetensors
(transformers 5's fused expert layout) and check it the same way.

For each model: the folder's config.json and weights.safetensors go into a scratch folder,
from_pretrained loads them in float64 with eager attention (no missing, unexpected or
mismatched keys allowed), and the golden batch (inputs tokens[0:B*T], targets
tokens[1:B*T+1], both [B,T]) runs with labels and output_router_logits=True.  Compared with
expected.safetensors / grads.safetensors, as max|a-b| / max|golden| per tensor:

  logits         the model's logits
  aux_loss       transformers' aux_loss (load_balancing_loss_func over every sparse layer)
  ce_loss        mean cross-entropy of transformers' logits against the golden targets
  loss           ce_loss + router_aux_loss_coef * aux_loss, both from transformers
  hf_loss        transformers' own loss (it shifts labels: positions 0..T-2 of each row
                 against labels = inputs) against the same quantity from the golden logits
                 and aux_loss, which checks how transformers combines ce and aux
  tokens/expert  per sparse layer, the assignment counts from transformers' router logits
                 against router.l<N>.tokens_per_expert (must be equal)
  grad.*         d(ce_loss + coef*aux_loss)/d(param) by transformers' autograd against
                 grads.safetensors (for transformers 5's fused experts, the golden
                 per-expert gradients are fused the same way first)
  weights        the loaded parameters against the file (after transformers' conversion)

Fails (exit 1) when any of these is above 1e-5 (transformers keeps some steps in float32
even in a float64 model: RMSNorm, RoPE's inverse frequencies, eager attention's softmax and
the routing softmax; that alone moves results by ~1e-7 relative).
"""

import json
import os
import re
import shutil
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
import transformers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDEN = os.path.join(ROOT, "tests", "golden")
TOL = 1e-5

torch.set_num_threads(1)
sys.path.insert(0, GOLDEN)
from gen_golden import read_safetensors, read_shard  # noqa: E402  (the goldens' own readers)


def to_hf_layout(golden, hf_name):
    """The golden tensor (numpy) for transformers' parameter hf_name: the same name, or, for
    transformers 5's fused experts, the per-expert tensors stacked (gate and up concatenated)."""
    if hf_name in golden:
        return golden[hf_name]
    m = re.match(r"(model\.layers\.\d+\.)mlp\.(gate\.weight|experts\.gate_up_proj|experts\.down_proj)$", hf_name)
    if not m:
        raise KeyError(hf_name)
    p, what = m.groups()
    mix = (p + "block_sparse_moe.gate.weight") in golden
    blk = p + ("block_sparse_moe." if mix else "mlp.")
    if what == "gate.weight":
        return golden[blk + "gate.weight"]
    E = golden[blk + "gate.weight"].shape[0]
    g, u, d = ("w1", "w3", "w2") if mix else ("gate_proj", "up_proj", "down_proj")
    if what == "experts.gate_up_proj":
        return np.stack([np.concatenate([golden[blk + "experts.%d.%s.weight" % (e, g)],
                                         golden[blk + "experts.%d.%s.weight" % (e, u)]], axis=0)
                         for e in range(E)])
    return np.stack([golden[blk + "experts.%d.%s.weight" % (e, d)] for e in range(E)])


def rel(a, b):
    a = torch.as_tensor(a, dtype=torch.float64)
    b = b.detach().to(torch.float64) if torch.is_tensor(b) else torch.as_tensor(np.array(b), dtype=torch.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    den = float(b.abs().max()) if b.numel() else 0.0
    return float((a - b).abs().max()) / (den if den > 0 else 1.0), float((a - b).abs().max())


def load(folder, weights_file):
    tmp = tempfile.mkdtemp()
    try:
        shutil.copy(os.path.join(folder, "config.json"), os.path.join(tmp, "config.json"))
        shutil.copy(os.path.join(folder, weights_file), os.path.join(tmp, "model.safetensors"))
        kw = {"attn_implementation": "eager", "output_loading_info": True}
        major = int(transformers.__version__.split(".")[0])
        kw["dtype" if major >= 5 else "torch_dtype"] = torch.float64
        if major >= 5:  # its default grouped_mm experts kernel has no float64: the per-expert loop
            kw["experts_implementation"] = "eager"
        model, info = transformers.AutoModelForCausalLM.from_pretrained(tmp, **kw)
    finally:
        shutil.rmtree(tmp)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        raise SystemExit("%s/%s: loading info %s" % (folder, weights_file, bad))
    return model.eval()


def check(name, weights_file="weights.safetensors"):
    folder = os.path.join(GOLDEN, name)
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(folder, "golden.json")) as f:
        B, T = (lambda g: (g["batch"], g["seq"]))(json.load(f))
    exp = read_safetensors(os.path.join(folder, "expected.safetensors"))
    grads = read_safetensors(os.path.join(folder, "grads.safetensors"))
    weights = read_safetensors(os.path.join(folder, "weights.safetensors"))
    toks = read_shard(os.path.join(folder, "tokens.bin"))
    ids = torch.tensor(toks[0:B * T]).view(B, T)
    tgt = torch.tensor(toks[1:B * T + 1]).view(B, T)
    coef = cfg["router_aux_loss_coef"]
    E = cfg.get("num_local_experts") or cfg["num_experts"]
    k = cfg["num_experts_per_tok"]

    model = load(folder, weights_file)
    print("%s (%s) with transformers %s, torch %s: %s" % (name, weights_file, transformers.__version__,
                                                         torch.__version__, type(model).__name__))
    rows = []  # (what, rel, abs)

    params = dict(model.named_parameters())
    wmax = max(rel(p.detach(), to_hf_layout(weights, n))[0] for n, p in params.items())
    rows.append(("weights (%d tensors)" % len(params), wmax, float("nan")))

    out = model(input_ids=ids, labels=ids, output_router_logits=True, use_cache=False)
    logits, aux = out.logits, out.aux_loss
    V = logits.shape[-1]
    ce = F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1))
    loss = ce + coef * aux
    rows.append(("logits",) + rel(logits.detach(), exp["logits"]))
    rows.append(("aux_loss",) + rel(aux.detach(), exp["aux_loss"]))
    rows.append(("ce_loss",) + rel(ce.detach(), exp["ce_loss"]))
    rows.append(("loss",) + rel(loss.detach(), exp["loss"]))
    gl = torch.tensor(exp["logits"], dtype=torch.float64)
    hf_want = F.cross_entropy(gl[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1)) + coef * float(exp["aux_loss"])
    rows.append(("hf_loss (shifted labels)",) + rel(out.loss.detach(), hf_want))

    sparse = sorted(int(m.group(1)) for m in (re.match(r"router\.l(\d+)\.tokens_per_expert$", n) for n in exp) if m)
    assert len(out.router_logits) == len(sparse), (len(out.router_logits), sparse)
    counts_ok = True
    for l, rl in zip(sparse, out.router_logits):
        sel = torch.topk(torch.softmax(rl.detach().to(torch.float64), dim=-1), k, dim=-1).indices
        cnt = np.bincount(sel.flatten().numpy(), minlength=E)
        want = exp["router.l%d.tokens_per_expert" % l].astype(np.int64)
        ok = bool((cnt == want).all())
        counts_ok &= ok
        print("  layer %d tokens/expert %s %s" % (l, cnt.tolist(), "== golden" if ok else "!= golden %s" % want.tolist()))

    loss.backward()
    gmax, gworst = 0.0, None
    for n, p in params.items():
        r, _ = rel(p.grad, to_hf_layout({g[5:]: v for g, v in grads.items() if g.startswith("grad.")}, n))
        if r >= gmax:
            gmax, gworst = r, n
    rows.append(("grad.* (%d tensors; worst %s)" % (len(params), gworst), gmax, float("nan")))
    rows.append(("grads.safetensors loss",) + rel(loss.detach(), grads["loss"]))

    ok = counts_ok
    for what, r, a in rows:
        good = r <= TOL
        ok &= good
        print("  %-52s rel %.3e%s%s" % (what, r, "" if a != a else "  (abs %.3e)" % a, "" if good else "  FAIL"))
    print("  values: loss %.6f = ce %.6f + %g * aux %.6f (golden loss %.6f, aux %.6f); transformers' "
          "logits %s, aux_loss %s" % (float(loss.detach()), float(ce.detach()), coef, float(aux.detach()),
                                      float(exp["loss"]), float(exp["aux_loss"]), logits.dtype, aux.dtype))
    print("  %s" % ("PASS" if ok else "FAIL"))
    return ok


def has_class(name):
    return hasattr(transformers, name)


def main(argv):
    fused = "--fused" in argv
    names = [a for a in argv if not a.startswith("--")]
    explicit = bool(names)
    names = names or ["mixtral-tiny", "qwen3-moe-tiny"]
    cls = {"mixtral-tiny": "MixtralForCausalLM", "qwen3-moe-tiny": "Qwen3MoeForCausalLM"}
    ok, ran = True, 0
    for n in names:
        if not has_class(cls[n]):
            print("%s: SKIPPED: transformers %s has no %s" % (n, transformers.__version__, cls[n]))
            if explicit:
                ok = False
            continue
        ok &= check(n)
        ran += 1
        if fused and n == "mixtral-tiny":
            if int(transformers.__version__.split(".")[0]) < 5:
                print("%s: weights_fused.safetensors SKIPPED: needs transformers 5 (have %s)" % (n, transformers.__version__))
            else:
                ok &= check(n, "weights_fused.safetensors")
                ran += 1
    if not ran:
        print("no check ran")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
