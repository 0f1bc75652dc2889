#!/usr/bin/env python3
"""PyTorch beside loom on one GPU: a bf16 training step of a loom run spec's model (issue 31).

    python3 bench/torch_gpu_step.py --spec models/gpt2-124M.json --batch 16 --seq 1024
    python3 bench/torch_gpu_step.py --spec models/llama-1B.json --batch 4 --seq 2048
        [--steps 20] [--warmup 5] [--no-compile] [--vocab-multiple 128] [--peak-tflops 989]

Written as a careful PyTorch user writes it (nanoGPT / llm.c's train_gpt2.py style):
  * the model in f32 parameters, run under torch.autocast(bfloat16) (matmuls and attention in
    bf16, f32 master weights and optimizer state, as loom's bf16 precision keeps them);
  * F.scaled_dot_product_attention(is_causal=True) (flash attention on H100/H200);
  * torch.optim.AdamW(fused=True), weight decay only on tensors of 2 or more dims (as loom);
    clip_grad_norm_(grad_clip, foreach=True); zero_grad(set_to_none=True);
  * torch.compile(model) (Inductor, Triton kernels); the compile happens in the warmup steps;
  * TF32 allowed for any f32 matmul left; no loss.item() inside the timed steps (the host
    never waits for the GPU in a step); tokens are random ids pre-generated on the device.
GPT-2: learned positions, LayerNorm, GELU tanh (gelu_new), tied lm_head, biases.  Llama:
RMSNorm, rotary embeddings (rope_theta), SwiGLU MLP, grouped-query attention (SDPA's
enable_gqa where the torch has it, else the KV heads repeated), lm_head tied when the config
says so.  The vocabulary is padded to a multiple of --vocab-multiple (128, as
bench/gpu_step.sh runs loom: GPT-2's 50257 -> 50304); the padded logits are masked to -inf so
the loss is the real vocabulary's.  Shapes, init scale and optimizer settings come from the spec
(loom's defaults where it has none: lr 3e-4, weight decay 0.1, betas 0.9 / 0.95, eps 1e-8,
grad_clip 1.0).

Timing: a CUDA event before and after every timed step, read after the last one; the report
is the median ms/step, tokens/s = batch*seq / median, MFU = model FLOPs / time / peak (the
FLOPs: 6 N tokens + 12 L T D tokens, loom ir --flops' formula, with the unpadded vocabulary),
and the peak memory torch allocated.  The last line is machine-read by bench/gpu_step.sh:
    torch: <name> <batch>x<seq> ms <median> tokens/s <n> mfu <pct> mem_gib <x>
"""
import argparse
import json
import math
import statistics
import sys


def load_spec(path):
    with open(path) as f:
        spec = json.load(f)
    return spec.get("model", spec), spec


def build(cfg, vocab_multiple, torch, nn, F):
    llama = cfg.get("model_type", "gpt2") == "llama"
    V = cfg["vocab_size"]
    Vp = (V + vocab_multiple - 1) // vocab_multiple * vocab_multiple
    if llama:
        D, L, H = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
        KV = cfg.get("num_key_value_heads", H)
        Dh = cfg.get("head_dim", D // H)
        inner = cfg["intermediate_size"]
        eps = cfg.get("rms_norm_eps", 1e-5)
        theta = cfg.get("rope_theta", 10000.0)
        tied = cfg.get("tie_word_embeddings", False)
    else:
        D, L, H = cfg["n_embd"], cfg["n_layer"], cfg["n_head"]
        KV, Dh = H, D // H
        inner = cfg.get("n_inner") or 4 * D
        eps = cfg.get("layer_norm_epsilon", 1e-5)
        tied = True
    std = cfg.get("initializer_range", 0.02)
    has_gqa = "enable_gqa" in (getattr(F.scaled_dot_product_attention, "__doc__", "") or "")

    class RMSNorm(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * self.weight

    def rope(x, cos, sin):   # x [B, H, T, Dh]; rotate halves (HF Llama's convention)
        x1, x2 = x[..., : Dh // 2], x[..., Dh // 2:]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            norm = (lambda: RMSNorm(D)) if llama else (lambda: nn.LayerNorm(D, eps=eps))
            self.ln_1, self.ln_2 = norm(), norm()
            self.qkv = nn.Linear(D, (H + 2 * KV) * Dh, bias=not llama)
            self.proj = nn.Linear(H * Dh, D, bias=not llama)
            if llama:
                self.gate_up = nn.Linear(D, 2 * inner, bias=False)
                self.down = nn.Linear(inner, D, bias=False)
            else:
                self.fc = nn.Linear(D, inner)
                self.fc_proj = nn.Linear(inner, D)

        def forward(self, x, cos, sin):
            B, T, _ = x.shape
            q, k, v = self.qkv(self.ln_1(x)).split([H * Dh, KV * Dh, KV * Dh], dim=-1)
            q = q.view(B, T, H, Dh).transpose(1, 2)
            k = k.view(B, T, KV, Dh).transpose(1, 2)
            v = v.view(B, T, KV, Dh).transpose(1, 2)
            if llama:
                q, k = rope(q, cos, sin), rope(k, cos, sin)
            if KV != H and has_gqa:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            else:
                if KV != H:
                    k = k.repeat_interleave(H // KV, dim=1)
                    v = v.repeat_interleave(H // KV, dim=1)
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, H * Dh))
            h = self.ln_2(x)
            if llama:
                g, u = self.gate_up(h).chunk(2, dim=-1)
                return x + self.down(F.silu(g) * u)
            return x + self.fc_proj(F.gelu(self.fc(h), approximate="tanh"))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(Vp, D)
            self.wpe = None if llama else nn.Embedding(cfg["n_positions"], D)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = RMSNorm(D) if llama else nn.LayerNorm(D, eps=eps)
            self.lm_head = nn.Linear(D, Vp, bias=False)
            if tied:
                self.lm_head.weight = self.wte.weight
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    scale = std / math.sqrt(2 * L) if name.endswith(("proj.weight", "down.weight")) else std
                    nn.init.normal_(p, 0.0, scale)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)
            with torch.no_grad():
                self.wte.weight[V:].zero_()
            self.register_buffer("vmask", torch.arange(Vp) >= V, persistent=False)

        def forward(self, idx, targets, cos, sin):
            B, T = idx.shape
            x = self.wte(idx)
            if self.wpe is not None:
                x = x + self.wpe(torch.arange(T, device=idx.device))
            for b in self.blocks:
                x = b(x, cos, sin)
            logits = self.lm_head(self.ln_f(x)).masked_fill(self.vmask, float("-inf"))
            return F.cross_entropy(logits.view(B * T, Vp), targets.view(B * T))

    n_matmul = L * (D * (H + 2 * KV) * Dh + H * Dh * D + (3 if llama else 2) * D * inner) + V * D
    return Model(), dict(L=L, D=D, H=H, Dh=Dh, V=V, Vp=Vp, theta=theta if llama else 0, n_matmul=n_matmul,
                         llama=llama)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", default="models/gpt2-124M.json")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--vocab-multiple", type=int, default=128)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    a = ap.parse_args()
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    if not torch.cuda.is_available():
        print("SKIPPED: torch finds no CUDA device")
        return 0
    cfg, spec = load_spec(a.spec)
    if cfg.get("model_type", "gpt2") not in ("gpt2", "llama"):
        print(f"SKIPPED: {a.spec} is a {cfg.get('model_type')} model; this baseline has GPT-2 and Llama")
        return 0
    B = a.batch or spec.get("batch", 4)
    T = a.seq or spec.get("seq", 1024)
    torch.manual_seed(spec.get("seed", 1337))
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = torch.device("cuda")
    model, m = build(cfg, a.vocab_multiple, torch, nn, F)
    model.to(dev)
    cos = sin = None
    if m["llama"]:
        inv = 1.0 / (m["theta"] ** (torch.arange(0, m["Dh"], 2, device=dev).float() / m["Dh"]))
        ang = torch.outer(torch.arange(T, device=dev).float(), inv)
        ang = torch.cat((ang, ang), dim=-1)
        cos, sin = ang.cos()[None, None], ang.sin()[None, None]
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": spec.get("weight_decay", 0.1)},
                             {"params": no_decay, "weight_decay": 0.0}], lr=spec.get("lr", 3e-4),
                            betas=(spec.get("beta1", 0.9), spec.get("beta2", 0.95)), eps=spec.get("eps", 1e-8),
                            fused=True)
    clip = spec.get("grad_clip", 1.0)
    step_model = model if a.no_compile else torch.compile(model)
    gen = torch.Generator(device=dev).manual_seed(1)
    n_batches = 8
    data = torch.randint(0, m["V"], (n_batches, B, T + 1), device=dev, generator=gen)

    def step(i):
        x, y = data[i % n_batches, :, :T], data[i % n_batches, :, 1:]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(x, y, cos, sin)
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for i in range(a.warmup):
        step(i).item()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(a.steps)]
    losses = []
    for i in range(a.steps):
        ev[i][0].record()
        losses.append(step(a.warmup + i).detach())
        ev[i][1].record()
    torch.cuda.synchronize()
    ms = [s.elapsed_time(e) for s, e in ev]
    med = statistics.median(ms)
    name = a.spec.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    flops = 6 * m["n_matmul"] * B * T + 12 * m["L"] * T * m["D"] * B * T
    toks = B * T * 1000 / med
    mfu = 100 * flops / (med / 1000) / (a.peak_tflops * 1e12)
    mem = torch.cuda.max_memory_allocated() / 2**30
    print(f"{name}: torch {torch.__version__}, {torch.cuda.get_device_name(0)}, {'eager' if a.no_compile else 'torch.compile'}, "
          f"bf16 autocast, vocabulary {m['V']} padded to {m['Vp']}")
    print(f"  ms/step median {med:.2f} (min {min(ms):.2f}, max {max(ms):.2f}) over {a.steps} steps after {a.warmup} warmup; "
          f"loss {losses[0].item():.4f} -> {losses[-1].item():.4f}")
    print(f"  {toks:,.0f} tokens/s, {flops / 1e12:.2f} TFLOP/step, MFU {mfu:.1f}% of {a.peak_tflops:g} TFLOP/s, "
          f"peak allocated {mem:.2f} GiB")
    print(f"torch: {name} {B}x{T} ms {med:.3f} tokens/s {toks:.0f} mfu {mfu:.1f} mem_gib {mem:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
