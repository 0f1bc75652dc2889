#!/usr/bin/python3
"""PyTorch baseline: one f32 training step of the GPT-2 in a loom run spec, on the CPU.

    /usr/bin/python3 bench/torch_gpt2_step.py [--spec models/bench-gpt2-small.json]
        [--threads N] [--warmup 3] [--steps 10] [--no-profile] [--compile]

Eager by default; --compile wraps the model in torch.compile (torch >= 2.0; the forward
and, through AOTAutograd, the backward are compiled by Inductor into C++/OpenMP kernels
around the BLAS; the optimizer step stays eager).  Compilation happens in the warmup
steps, which are not timed (give --warmup >= 2 with --compile).

The model is written as a careful PyTorch user writes GPT-2 (nanoGPT style): nn.Embedding
for tokens and positions, nn.LayerNorm, nn.Linear for c_attn / c_proj / c_fc / c_proj,
F.gelu(approximate="tanh") (GPT-2's gelu_new), causal self-attention (the fused
F.scaled_dot_product_attention where this torch has it, torch >= 2.0; otherwise the
explicit q @ k^T, masked_fill(-inf), softmax, @ v that a user of torch 1.x writes), an
lm_head tied to the token embedding, F.cross_entropy; then clip_grad_norm_(grad_clip),
torch.optim.AdamW (fused on the CPU where this torch supports it, torch >= 2.4; otherwise
the multi-tensor foreach implementation; --optimizer picks another) with weight decay
only on tensors of 2 or more dimensions, as loom does, the learning rate set each step
from loom's schedule, and zero_grad(set_to_none=True).  Shapes, initialization scales and
optimizer settings come from the run spec; tokens are uniform random in [0, vocab) from
a fixed seed, pre-generated so that no data loading is timed.

One timed step is: zero_grad, forward, loss, backward, clip, optimizer step, loss.item()
(loom also reads the loss every step).  --warmup steps run first (they allocate the
AdamW state and warm caches), then --steps timed steps; the report gives the median
(and min / max) ms/step and tokens/s = batch*seq / median.

Memory (Linux):
  * RSS: the resident set size of the whole process from /proc/self/status: at start
    (interpreter + torch loaded), after building the model and optimizer, and the peak
    (VmHWM) over the timed steps.  Before the timed steps the high-water mark is reset
    (writing 5 to /proc/self/clear_refs), so "peak RSS" is the largest resident size
    seen during steady-state training steps, and "step growth" is that peak minus the
    RSS just before the timed steps (activations, gradients, temporaries that the
    allocator got from the OS during a step).  glibc may keep freed memory, so growth
    can under-count; the absolute peak does not.
  * profiler: one extra step runs under torch.profiler with profile_memory=True; the
    tensor allocations and frees it records are summed in time order and the maximum is
    the peak of tensor bytes live during the step above those live when it began (the
    parameters and the AdamW moments, which are listed separately).  This is what the
    training step itself needs, independent of the allocator and of the Python runtime.

The last line is the summary, e.g.
  torch eager: 812.3 ms/step, 2521 tok/s, peak RSS 512 MB (threads 2, torch 1.13, BLAS openblas)
and a line starting with TORCH_SUMMARY holds the same numbers as key=value for scripts.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def default_threads():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default=os.path.join(ROOT, "models", "bench-gpt2-small.json"),
                    help="loom run spec with an embedded GPT-2 config (default %(default)s)")
    ap.add_argument("--threads", type=int, default=default_threads(),
                    help="torch.set_num_threads and OpenBLAS threads (default: CPUs available, "
                         "%(default)s)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    ap.add_argument("--seed", type=int, default=1337, help="seed of weights and tokens")
    ap.add_argument("--optimizer", choices=["auto", "fused", "foreach", "for-loop"],
                    default="auto", help="AdamW implementation (default auto: fused if this "
                    "torch has it on the CPU, else foreach)")
    ap.add_argument("--no-profile", action="store_true",
                    help="skip the profiler step that measures tensor memory")
    ap.add_argument("--per-step", action="store_true", help="print every timed step")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model (torch >= 2.0); the warmup steps compile it")
    a = ap.parse_args(argv)
    if a.threads < 1 or a.steps < 1 or a.warmup < 0:
        ap.error("--threads and --steps must be >= 1, --warmup >= 0")
    return a


ARGS = parse_args(sys.argv[1:])
# Debian's OpenBLAS is the pthreads build with its own pool: give it the same thread count.
# (Must be set before torch, and with it libopenblas, is loaded.)
os.environ["OPENBLAS_NUM_THREADS"] = str(ARGS.threads)
os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    sys.exit("torch_gpt2_step.py: PyTorch is not installed for %s (Debian: apt-get install "
             "python3-torch)" % sys.executable)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from blas_gflops import blas_description, set_threads  # noqa: E402

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


# --------------------------------------------------------------------------------------
# the model


class CausalSelfAttention(nn.Module):
    def __init__(self, D, H, max_T):
        super().__init__()
        self.H = H
        self.c_attn = nn.Linear(D, 3 * D)
        self.c_proj = nn.Linear(D, D)
        if not HAS_SDPA:
            self.register_buffer("mask", torch.ones(max_T, max_T, dtype=torch.bool).tril()
                                 .view(1, 1, max_T, max_T), persistent=False)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.c_attn(x).split(D, dim=2)
        hd = D // self.H
        q = q.view(B, T, self.H, hd).transpose(1, 2)  # [B, H, T, hd]
        k = k.view(B, T, self.H, hd).transpose(1, 2)
        v = v.view(B, T, self.H, hd).transpose(1, 2)
        if HAS_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, D)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, D, Fh):
        super().__init__()
        self.c_fc = nn.Linear(D, Fh)
        self.c_proj = nn.Linear(Fh, D)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, D, H, Fh, max_T, eps):
        super().__init__()
        self.ln_1 = nn.LayerNorm(D, eps=eps)
        self.attn = CausalSelfAttention(D, H, max_T)
        self.ln_2 = nn.LayerNorm(D, eps=eps)
        self.mlp = MLP(D, Fh)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        D, H, L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
        V, P = cfg["vocab_size"], cfg["n_positions"]
        Fh = cfg.get("n_inner") or 4 * D
        eps = cfg.get("layer_norm_epsilon", 1e-5)
        self.wte = nn.Embedding(V, D)
        self.wpe = nn.Embedding(P, D)
        self.h = nn.ModuleList([Block(D, H, Fh, P, eps) for _ in range(L)])
        self.ln_f = nn.LayerNorm(D, eps=eps)
        self.lm_head = nn.Linear(D, V, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        # GPT-2 initialization, as loom's (normal 0.02; positions 0.01; residual projections
        # 0.02/sqrt(2L); biases 0, LayerNorm 1/0).  It does not change the speed.
        std = cfg.get("initializer_range", 0.02)
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                nn.init.zeros_(p)
            elif "ln_" in name:
                nn.init.ones_(p)
            elif name == "wpe.weight":
                nn.init.normal_(p, 0.0, 0.01)
            elif name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * L))
            else:
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        B, T = idx.shape
        pos = torch.arange(T, dtype=torch.long)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


# --------------------------------------------------------------------------------------
# optimizer and schedule (loom's semantics: see README.md, "Training semantics")


def make_optimizer(model, tr, which):
    params = [p for p in model.parameters() if p.requires_grad]  # tied weight listed once
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": tr["weight_decay"]},
              {"params": no_decay, "weight_decay": 0.0}]
    kw = dict(lr=tr["lr"], betas=(tr["beta1"], tr["beta2"]), eps=tr["eps"])
    tried = ["fused", "foreach", "for-loop"] if which == "auto" else [which]
    last = None
    for impl in tried:
        try:
            if impl == "fused":
                opt = torch.optim.AdamW(groups, fused=True, **kw)
                # torch < 2.4 accepts fused=True but only for CUDA tensors: probe it.
                for p in params:
                    p.grad = torch.zeros_like(p)
                opt.step()
                opt.zero_grad(set_to_none=True)
                opt = torch.optim.AdamW(groups, fused=True, **kw)  # fresh state
            elif impl == "foreach":
                opt = torch.optim.AdamW(groups, foreach=True, **kw)
            else:
                opt = torch.optim.AdamW(groups, foreach=False, **kw)
            return opt, impl
        except (TypeError, RuntimeError, ValueError) as e:
            last = e
            for p in params:  # drop the probe's gradients
                p.grad = None
    raise SystemExit("torch_gpt2_step.py: no AdamW implementation %s works here: %s" % (tried, last))


def step_flops(cfg, B, T):
    """Model FLOPs of one training step (forward + backward), counting matmuls only:
    6 * N_mm per token for the weight matmuls (N_mm = L*(3D^2 + D^2 + 2*D*Fh) + V*D, the
    tied lm_head included, the embedding lookups not) plus 12 * L * T * D per token for
    attention (q @ k^T and att @ v over the full T x T square, as computed, times 3 for
    the backward).  Layer norms, GELU, softmax and AdamW (O(N) elementwise) are left out."""
    D, L, V = cfg["n_embd"], cfg["n_layer"], cfg["vocab_size"]
    Fh = cfg.get("n_inner") or 4 * D
    n_mm = L * (3 * D * D + D * D + 2 * D * Fh) + V * D
    return B * T * (6 * n_mm + 12 * L * T * D), n_mm


def lr_at(s, tr):
    lr, min_lr, warmup, steps = tr["lr"], tr["min_lr"], tr["warmup"], tr["steps"]
    if s < warmup:
        return lr * (s + 1) / warmup
    r = min(1.0, (s - warmup) / max(1, steps - warmup))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * r)) * (lr - min_lr)


# --------------------------------------------------------------------------------------
# memory


def proc_status_kb(key):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def reset_peak_rss():
    """Reset VmHWM to the current RSS (Linux >= 4.0). True if it worked."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def profiler_peak_bytes(step_fn):
    """Peak of tensor bytes allocated and not yet freed during one step_fn(), from the
    profiler's memory events (None if this torch cannot tell)."""
    try:
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return None
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step_fn()
    deltas = []
    try:
        for e in prof.profiler.kineto_results.events():
            if e.name() == "[memory]":
                deltas.append((e.start_us(), int(e.nbytes())))
    except Exception:
        deltas = [(e.time_range.start, int(e.cpu_memory_usage)) for e in prof.events()
                  if e.name == "[memory]"]
    if not deltas or not any(d for _, d in deltas):
        return None  # no memory events (torch 2.x records them elsewhere): say "na", not 0
    deltas.sort(key=lambda d: d[0])  # stable: ties keep the recorded order
    live = peak = 0
    for _, d in deltas:
        live += d
        peak = max(peak, live)
    return peak


# --------------------------------------------------------------------------------------


def load_spec(path):
    with open(path) as f:
        spec = json.load(f)
    cfg = spec["model"]
    if isinstance(cfg, str):
        with open(os.path.join(os.path.dirname(os.path.abspath(path)), cfg)) as f:
            cfg = json.load(f)
    if cfg.get("model_type") != "gpt2":
        sys.exit("torch_gpt2_step.py: %s: only GPT-2 specs are supported" % path)
    if spec.get("precision", "fp32") != "fp32" or spec.get("grad_accum", 1) != 1:
        sys.exit("torch_gpt2_step.py: %s: only fp32 with grad_accum 1 is supported" % path)
    tr = dict(steps=10, lr=3e-4, min_lr=0.0, warmup=0, weight_decay=0.1, beta1=0.9,
              beta2=0.95, eps=1e-8, grad_clip=1.0)
    for k in tr:
        if k in spec:
            tr[k] = spec[k]
    return cfg, spec.get("batch", 8), spec.get("seq", cfg["n_positions"]), tr


def main():
    a = ARGS
    rss0 = proc_status_kb("VmRSS")
    set_threads(a.threads)
    blas_kind, blas_desc = blas_description()
    cfg, B, T, tr = load_spec(a.spec)
    V = cfg["vocab_size"]
    torch.manual_seed(a.seed)
    model = GPT2(cfg)
    model.train()
    nparams = sum(p.numel() for p in model.parameters())
    opt, opt_impl = make_optimizer(model, tr, a.optimizer)
    g = torch.Generator().manual_seed(a.seed + 1)
    total = a.warmup + a.steps + (0 if a.no_profile else 1)
    batches = [torch.randint(0, V, (B, T + 1), generator=g) for _ in range(total)]
    batches = [(t[:, :-1].contiguous(), t[:, 1:].contiguous()) for t in batches]
    params = list(model.parameters())
    run_model = model
    if a.compile:
        if not hasattr(torch, "compile"):
            sys.exit("torch_gpt2_step.py: --compile needs torch >= 2.0 (this is torch %s)" % torch.__version__)
        if a.warmup < 2:
            sys.exit("torch_gpt2_step.py: --compile needs --warmup >= 2 (the first steps compile)")
        run_model = torch.compile(model)
    rss_model = proc_status_kb("VmRSS")

    step_no = [0]
    last = {}

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = run_model(x, y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, tr["grad_clip"]) if tr["grad_clip"] > 0 else None
        lr = lr_at(step_no[0], tr)
        for grp in opt.param_groups:
            grp["lr"] = lr
        opt.step()
        step_no[0] += 1
        last["loss"] = loss.item()
        last["norm"] = float(norm) if norm is not None else float("nan")

    print("torch %s, %d threads (torch.get_num_threads() = %d), BLAS: %s" % (
        torch.__version__, a.threads, torch.get_num_threads(), blas_desc))
    print("model: GPT-2 L=%d D=%d H=%d V=%d, %d parameters; batch %d x seq %d = %d tokens/step" % (
        cfg["n_layer"], cfg["n_embd"], cfg["n_head"], V, nparams, B, T, B * T))
    mode = "compiled" if a.compile else "eager"
    print("mode: %s%s" % (mode, " (torch.compile, Inductor; compiled during the warmup steps)" if a.compile else ""))
    print("attention: %s; AdamW: %s; clip_grad_norm_(%g); zero_grad(set_to_none=True)" % (
        "F.scaled_dot_product_attention(is_causal=True)" if HAS_SDPA else
        "explicit q@k^T + masked_fill + softmax + @v (this torch has no F.scaled_dot_product_attention)",
        opt_impl, tr["grad_clip"]))

    i = 0
    t_warm = time.perf_counter()
    for _ in range(a.warmup):
        t0 = time.perf_counter()
        step(*batches[i])
        i += 1
        if a.per_step:
            print("warmup step | loss %.4f | norm %.3f | %8.1f ms" % (
                last["loss"], last["norm"], 1e3 * (time.perf_counter() - t0)))
    if a.compile:
        print("warmup (compilation included): %.1f s for %d steps" % (time.perf_counter() - t_warm, a.warmup))
    rss_before = proc_status_kb("VmRSS")
    hwm_ok = reset_peak_rss()
    times = []
    for s in range(a.steps):
        t0 = time.perf_counter()
        step(*batches[i])
        dt = time.perf_counter() - t0
        i += 1
        times.append(dt)
        if a.per_step:
            print("step %5d/%d | loss %.4f | norm %.3f | %8.1f ms | %9.0f tok/s" % (
                s + 1, a.steps, last["loss"], last["norm"], 1e3 * dt, B * T / dt))
    peak_rss = proc_status_kb("VmHWM") if hwm_ok else -1
    if not hwm_ok:  # ru_maxrss: the peak over the whole process life
        import resource
        peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    prof_peak = None
    if not a.no_profile:
        prof_peak = profiler_peak_bytes(lambda: step(*batches[i]))

    med = statistics.median(times)
    ms = 1e3 * med
    tok_s = B * T / med
    flops, n_mm = step_flops(cfg, B, T)
    print("model FLOPs: %.2f GFLOP/step (6 * %d matmul weights * %d tokens + attention "
          "12*L*T*D * tokens); achieved %.1f GFLOP/s at the median, %.1f at the fastest step"
          % (flops / 1e9, n_mm, B * T, flops / med / 1e9, flops / min(times) / 1e9))
    MB = 1024.0  # kB -> MB
    state_bytes = 4 * nparams * 3  # parameters + AdamW exp_avg + exp_avg_sq (f32)
    print("timed: %d steps after %d warmup: median %.1f ms (min %.1f, max %.1f), last loss %.4f"
          % (a.steps, a.warmup, ms, 1e3 * min(times), 1e3 * max(times), last["loss"]))
    print("memory: RSS at start %.0f MB, after model+optimizer %.0f MB, before timed steps %.0f MB, "
          "peak during timed steps %.0f MB (step growth %.0f MB)" % (
              rss0 / MB, rss_model / MB, rss_before / MB, peak_rss / MB, (peak_rss - rss_before) / MB))
    if prof_peak is not None:
        print("memory: profiler: tensors live at step start (params + AdamW moments) %.1f MB; "
              "peak tensor memory allocated within the step %.1f MB; total %.1f MB" % (
                  state_bytes / 2**20, prof_peak / 2**20, (state_bytes + prof_peak) / 2**20))
    short_ver = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    print("TORCH_SUMMARY ms=%.3f min_ms=%.3f tok_s=%.1f gflops=%.1f gflop_step=%.3f "
          "peak_rss_mb=%.1f step_rss_growth_mb=%.1f "
          "prof_step_peak_mb=%s threads=%d torch=%s blas=%s optimizer=%s attention=%s mode=%s" % (
              ms, 1e3 * min(times), tok_s, flops / med / 1e9, flops / 1e9,
              peak_rss / MB, (peak_rss - rss_before) / MB,
              "%.1f" % (prof_peak / 2**20) if prof_peak is not None else "na", a.threads,
              torch.__version__, blas_kind, opt_impl, "sdpa" if HAS_SDPA else "explicit", mode))
    print("torch %s: %.1f ms/step, %.0f tok/s, peak RSS %.0f MB (threads %d, torch %s, BLAS %s)"
          % (mode, ms, tok_s, peak_rss / MB, a.threads, short_ver, blas_kind))


if __name__ == "__main__":
    main()
