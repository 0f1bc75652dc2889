#!/usr/bin/env python3
"""tests/gpu/microbench.py — OWED.md check 7's microbenchmarks, on the device machine's PyTorch.

    python3 tests/gpu/microbench.py models/hardware/h200.json [OUT.json]

Measures, on GPU 0: bf16 GEMM throughput through cuBLAS (torch.matmul, which is the library
loom's GEMMs call too: cuBLASLt) at a square 8192 shape and at GPT-2 124M's and Llama-1B's
largest training GEMMs, and the device-to-device copy bandwidth (bytes read + written).
Prints each figure and the efficiencies they give against the description's datasheet peaks
(matmul: the median GEMM's TFLOP/s / peak bf16; memory: copy bandwidth / memory_tb_s), and
with OUT.json writes the description with those two efficiencies filled in, the date and the
device named in its notes. Attention is loom's own kernel, not cuBLAS: its efficiency stays
what the file says until loom's attention is timed on the device (bench/gpu_step.sh's profile).
Each timing is the median of 10 runs after 3 warm-ups, with CUDA events.
"""
import datetime
import json
import statistics
import sys

import torch


def timed(fn, reps=10, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1000.0)
    return statistics.median(times)


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: microbench.py HW.json [OUT.json]")
    hw = json.load(open(sys.argv[1]))
    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA device for PyTorch")
        return 0
    dev = torch.cuda.get_device_name(0)
    peak = hw["peak_tflops"]["bf16"]
    print(f"device: {dev}; description {sys.argv[1]} ({hw['name']}): bf16 peak {peak} TFLOP/s, memory {hw['memory_tb_s']} TB/s")
    shapes = [(8192, 8192, 8192, "square"),
              (16 * 1024, 3072, 768, "GPT-2 124M MLP up (16 x 1024 tokens)"),
              (16 * 1024, 50304, 768, "GPT-2 124M head (16 x 1024 tokens)"),
              (4 * 2048, 8192, 2048, "Llama-1B MLP gate (4 x 2048 tokens)"),
              (4 * 2048, 128256, 2048, "Llama-1B head (4 x 2048 tokens)")]
    rates = []
    for m, n, k, what in shapes:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        t = timed(lambda: torch.matmul(x, w))
        tf = 2.0 * m * n * k / t / 1e12
        rates.append(tf)
        print(f"gemm {m} x {n} x {k} ({what}): {t * 1e3:.3f} ms, {tf:.1f} TFLOP/s, {100 * tf / peak:.1f}% of peak")
        del x, w
    n_bytes = 4 << 30
    src = torch.empty(n_bytes // 2, device="cuda", dtype=torch.bfloat16).fill_(1)
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src))
    bw = 2 * n_bytes / t / 1e12   # read + write
    print(f"copy {n_bytes >> 30} GiB device to device: {t * 1e3:.3f} ms, {bw:.2f} TB/s (read + write), "
          f"{100 * bw / hw['memory_tb_s']:.1f}% of {hw['memory_tb_s']} TB/s")
    eff_mm = round(statistics.median(rates) / peak, 3)
    eff_mem = round(bw / hw["memory_tb_s"], 3)
    print(f"efficiencies: matmul {eff_mm} (median of the GEMMs), memory {eff_mem}")
    if len(sys.argv) > 2:
        out = dict(hw)
        out["efficiency"] = dict(hw.get("efficiency", {}), matmul=eff_mm, memory=eff_mem)
        out["notes"] = (hw.get("notes", "") + f" Efficiencies matmul {eff_mm} and memory {eff_mem} measured by "
                        f"tests/gpu/microbench.py on {dev}, {datetime.date.today().isoformat()} (cuBLAS bf16 GEMMs through "
                        "PyTorch, median of five shapes; device copy read + write); attention as before.")
        json.dump(out, open(sys.argv[2], "w"), indent=1)
        print(f"wrote {sys.argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
