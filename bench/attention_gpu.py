#!/usr/bin/env python3
"""bench/attention_gpu.py — loom's tensor-core attention kernels against PyTorch's
scaled_dot_product_attention (flash backend) on one GPU, in the same run (issue 32's target:
at least SDPA flash's TFLOP/s, forward + backward, causal, T = 1024 and 2048, D = 64 and 128).

Needs a GPU, PyTorch with CUDA, nvcc (torch.utils.cpp_extension builds the launcher), and a
translation unit loom emitted here (the kernels are its prelude's templates; no loom build
is needed on the device):

  build/loom ir models/gpt2-124M.json --passes=train,lower --precision bf16 --target=cuda \\
      --emit=cuda -o .gpu/attn_tu.cu          # here; carry .gpu
  python3 bench/attention_gpu.py .gpu/attn_tu.cu   # on the device

For each shape (batch B with B*T = 16384 tokens, H = 2048 / D heads, causal, bf16) it prints
loom's forward and forward + backward ms and TFLOP/s beside SDPA flash's, and the largest
relative difference of out, dq, dk, dv from SDPA's (bf16 results: expect ~1e-2).  FLOPs as
FlashAttention counts them: forward 4 B H T^2 D / 2 (causal), backward 2.5 x forward.
Set SHAPES="T:D,T:D" to choose, ITERS (default 20), GQA=G (query heads per kv head, default 1),
LSE=0 for the backward without the forward's saved L2 and O (dq in two passes: the path of a
gradient in another function, or LOOM_CUDA_NO_ATTN_LSE=1).

On an sm_90 device (or with WGMMA=1) it also times the Hopper kernels LOOM_CUDA_WGMMA=1 picks
(loom_attn_fwd_wg, loom_attn_bwd_dq_wg and loom_attn_bwd_dkdv_wg: wgmma, TMA tensor copies,
mbarriers; built for sm_90a; dq on wgmma in its one-pass form only, LSE=0 keeps mma.sync's;
their tensor maps encoded here as runtime/cuda/cuda_tmap.c encodes them, through
libcuda.so.1's cuTensorMapEncodeTiled), forward and forward + backward, in columns of their own, and
their out, L2, O, dq, dk, dv against the mma.sync kernels' ("vs mma": the same arithmetic,
expect 0 or rounding noise).  WGMMA=0 leaves them out.
"""
import os, re, sys, time

import torch

HEAD = "#include <torch/extension.h>\n#include <cuda_runtime.h>\n#include <cuda.h>\n#include <dlfcn.h>\n"
LAUNCHER = r"""
static void go(const void *fn, LoomArgs &a, dim3 grid, unsigned smem, unsigned threads = 128, LoomTmaps *t = nullptr) {
  if (smem > 48 * 1024) cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  void *args[] = {&a, t};   /* the Hopper kernels take their tensor maps second */
  cudaError_t e = cudaLaunchKernel(fn, grid, dim3(threads), args, smem, 0);
  TORCH_CHECK(e == cudaSuccess, cudaGetErrorString(e));
}
/* The Hopper kernels' tensor maps as runtime/cuda/cuda_tmap.c encodes them from lower_attn.c's
   fields: map m of bufs[m], a [B][rows][heads][D] bf16 tensor, a box of {64, 1, box[m], 1},
   the 128-byte swizzle, zeros out of bounds (the driver's function through dlopen, as loom's
   runtime loads it: no -lcuda) */
static LoomTmaps maps_of(std::vector<torch::Tensor> bufs, std::vector<unsigned> box) {
  static decltype(&cuTensorMapEncodeTiled) encode = nullptr;
  if (!encode) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    TORCH_CHECK(h, "libcuda.so.1: ", dlerror());
    encode = (decltype(&cuTensorMapEncodeTiled))dlsym(h, "cuTensorMapEncodeTiled");
    TORCH_CHECK(encode, "the driver lacks cuTensorMapEncodeTiled (CUDA 12.0+)");
  }
  LoomTmaps t;
  memset(&t, 0, sizeof t);
  for (size_t m = 0; m < bufs.size(); m++) {
    const torch::Tensor &x = bufs[m];
    TORCH_CHECK(x.dim() == 4 && x.is_contiguous() && x.scalar_type() == torch::kBFloat16, "tensor map of a non-[B][T][H][D] bf16 tensor");
    const cuuint64_t dim[4] = {(cuuint64_t)x.size(3), (cuuint64_t)x.size(2), (cuuint64_t)x.size(1), (cuuint64_t)x.size(0)};
    const cuuint64_t stride[3] = {dim[0] * 2, dim[0] * dim[1] * 2, dim[0] * dim[1] * dim[2] * 2};
    const cuuint32_t bx[4] = {64, 1, box[m], 1}, es[4] = {1, 1, 1, 1};
    CUresult r = encode((CUtensorMap *)&t.m[m], CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, x.data_ptr(), dim, stride, bx, es,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    TORCH_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (CUresult ", (int)r, ") for map ", m);
  }
  return t;
}
static LoomArgs args_of(std::vector<torch::Tensor> bufs, int64_t B, int64_t T, int64_t H, int64_t D, int64_t S,
                        int64_t KV, double scale, bool saved = false) {
  LoomArgs a;
  memset(&a, 0, sizeof a);
  for (size_t i = 0; i < bufs.size(); i++) a.buf[i] = bufs[i].data_ptr();
  long long ints[9] = {B, T, H, D, S, KV, 1, 0, saved};   /* causal, no window; i[8]: the saved L2 and O */
  for (int i = 0; i < 9; i++) a.i[i] = ints[i];
  a.f[0] = scale;
  return a;
}
/* Os.numel() > 0: the forward also saves L2 and O (f32) and dq runs its one pass from them
   (lower_attn.c's path when the gradient is in the same function); else two passes. */
void fwd(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor o, torch::Tensor L, torch::Tensor Os,
         double scale) {
  int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3), S = k.size(1), KV = k.size(2);
  bool saved = Os.numel() > 0;
  LoomArgs a = saved ? args_of({q, k, v, o, L, Os}, B, T, H, D, S, KV, scale, true) : args_of({q, k, v, o}, B, T, H, D, S, KV, scale);
  go(D == 64 ? (const void *)FWD64 : (const void *)FWD128, a, dim3(B * H, (T + 63) / 64), 2 * 2 * 64 * (D + 8) * 2);
}
/* the Hopper forward (lower_attn.c's launch: 384 threads, 128 query rows a block) */
void fwd_wg(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor o, torch::Tensor L, torch::Tensor Os,
            double scale) {
  int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3), S = k.size(1), KV = k.size(2);
  bool saved = Os.numel() > 0;
  LoomArgs a = saved ? args_of({q, k, v, o, L, Os}, B, T, H, D, S, KV, scale, true) : args_of({q, k, v, o}, B, T, H, D, S, KV, scale);
#ifdef FWG64
  LoomTmaps t = maps_of({q, k, v}, {128, 64, 64});
  go(D == 64 ? (const void *)FWG64 : (const void *)FWG128, a, dim3(B * H, (T + 127) / 128),
     1024 + 128 * D * 2 + 3 * 2 * 64 * D * 2 + 56, 384, &t);
#else
  TORCH_CHECK(false, "built without the wgmma forward (WGMMA=0)");
#endif
}
void bwd(torch::Tensor dout, torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor dq, torch::Tensor dk,
         torch::Tensor dv, torch::Tensor L, torch::Tensor Ds, torch::Tensor Os, double scale, bool wg) {
  int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3), S = k.size(1), KV = k.size(2);
  int64_t tile = D <= 64 ? 64 : 32;
  bool saved = Os.numel() > 0;
  LoomArgs a = saved ? args_of({dout, q, k, v, L, Os, dq, Ds}, B, T, H, D, S, KV, scale, true)
                     : args_of({dout, q, k, v, dq, L, Ds}, B, T, H, D, S, KV, scale);
#ifdef DQG64
  LoomTmaps t = maps_of({dout, q, k, v}, {64, 64, 64, 64});   /* dq's and dk dv's */
  if (wg && saved)   /* the Hopper dq (its one-pass form; lower_attn.c's launch: 256 threads, 64 rows a block) */
    go(D == 64 ? (const void *)DQG64 : (const void *)DQG128, a, dim3(B * H, (T + 63) / 64),
       1024 + 2 * 64 * D * 2 + (D == 128 ? 3 : 2) * (2 * 64 * D * 2 + 16) + 8, 256, &t);
  else
#endif
    go(D == 64 ? (const void *)DQ64 : (const void *)DQ128, a, dim3(B * H, (T + 63) / 64), 8 * tile * (D + 8));
  LoomArgs b = args_of({dout, q, k, v, L, Ds, dk, dv}, B, T, H, D, S, KV, scale);
  if (wg) {   /* the Hopper dk dv (lower_attn.c's launch: 256 threads, 64 keys a block) */
#ifdef KVG64
    go(D == 64 ? (const void *)KVG64 : (const void *)KVG128, b, dim3(B * KV, (S + 63) / 64),
       1024 + 2 * 64 * D * 2 + 2 * 2 * 64 * D * 2 + 40, 256, &t);
#endif
    return;
  }
  go(D == 64 ? (const void *)KV64 : (const void *)KV128, b, dim3(B * KV, (S + 63) / 64),
     4 * 64 * (D + 8) + 4 * (2 * tile * (D + 8) + 4 * tile));
}
"""

# the kernels this benchmark instantiates: q k v -> out bf16; dout q k v -> dq (f32) L Dsum; -> dk dv (f32)
INSTANCES = r"""
extern "C" __global__ void __launch_bounds__(128) bench_fwd_64(LoomArgs a) { loom_attn_fwd_tc<loom_sbf16, loom_sbf16, loom_sbf16, loom_sbf16, 64>(a); }
extern "C" __global__ void __launch_bounds__(128) bench_fwd_128(LoomArgs a) { loom_attn_fwd_tc<loom_sbf16, loom_sbf16, loom_sbf16, loom_sbf16, 128>(a); }
extern "C" __global__ void __launch_bounds__(128) bench_dq_64(LoomArgs a) { loom_attn_bwd_dq_tc<loom_sbf16, loom_sbf16, loom_sbf16, loom_sbf16, loom_sf32, 64>(a); }
extern "C" __global__ void __launch_bounds__(128) bench_dq_128(LoomArgs a) { loom_attn_bwd_dq_tc<loom_sbf16, loom_sbf16, loom_sbf16, loom_sbf16, loom_sf32, 128>(a); }
extern "C" __global__ void __launch_bounds__(128) bench_kv_64(LoomArgs a) { loom_attn_bwd_dkdv_tc<loom_sbf16, loom_sbf16, loom_sbf16, loom_sbf16, loom_sf32, loom_sf32, 64>(a); }
extern "C" __global__ void __launch_bounds__(128) bench_kv_128(LoomArgs a) { loom_attn_bwd_dkdv_tc<loom_sbf16, loom_sbf16, loom_sbf16, loom_sbf16, loom_sf32, loom_sf32, 128>(a); }
#define FWD64 bench_fwd_64
#define FWD128 bench_fwd_128
#define DQ64 bench_dq_64
#define DQ128 bench_dq_128
#define KV64 bench_kv_64
#define KV128 bench_kv_128
"""
INSTANCES_WG = r"""
extern "C" __global__ void __launch_bounds__(384, 1) bench_fwg_64(LoomArgs a, const __grid_constant__ LoomTmaps t) { loom_attn_fwd_wg<loom_sbf16, loom_sbf16, loom_sbf16, loom_sbf16, 64>(a, t); }
extern "C" __global__ void __launch_bounds__(384, 1) bench_fwg_128(LoomArgs a, const __grid_constant__ LoomTmaps t) { loom_attn_fwd_wg<loom_sbf16, loom_sbf16, loom_sbf16, loom_sbf16, 128>(a, t); }
extern "C" __global__ void __launch_bounds__(256, 1) bench_kvg_64(LoomArgs a, const __grid_constant__ LoomTmaps t) { loom_attn_bwd_dkdv_wg<loom_sbf16, loom_sbf16, loom_sbf16, loom_sbf16, loom_sf32, loom_sf32, 64>(a, t); }
extern "C" __global__ void __launch_bounds__(256, 1) bench_kvg_128(LoomArgs a, const __grid_constant__ LoomTmaps t) { loom_attn_bwd_dkdv_wg<loom_sbf16, loom_sbf16, loom_sbf16, loom_sbf16, loom_sf32, loom_sf32, 128>(a, t); }
extern "C" __global__ void __launch_bounds__(256, 1) bench_dqg_64(LoomArgs a, const __grid_constant__ LoomTmaps t) { loom_attn_bwd_dq_wg<loom_sbf16, loom_sbf16, loom_sbf16, loom_sbf16, loom_sf32, 64>(a, t); }
extern "C" __global__ void __launch_bounds__(256, 1) bench_dqg_128(LoomArgs a, const __grid_constant__ LoomTmaps t) { loom_attn_bwd_dq_wg<loom_sbf16, loom_sbf16, loom_sbf16, loom_sbf16, loom_sf32, 128>(a, t); }
#define DQG64 bench_dqg_64
#define DQG128 bench_dqg_128
#define FWG64 bench_fwg_64
#define FWG128 bench_fwg_128
#define KVG64 bench_kvg_64
#define KVG128 bench_kvg_128
"""


def build(tu_path, wgmma):
    from torch.utils.cpp_extension import load_inline
    tu = open(tu_path).read()
    mark = "\n/*@loom-unit "
    start = tu.find("/*@loom-prelude*/\n")
    prelude = tu[max(start, 0):tu.index(mark)]
    # the prelude's `extern __shared__ float loom_smem[]` is per kernel; the rest is device code
    src = HEAD + prelude + INSTANCES + (INSTANCES_WG if wgmma else "") + LAUNCHER
    arch = os.environ.get("ARCH", "")
    if wgmma and not arch:   # wgmma is sm_90a's (the kernel traps elsewhere)
        os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0a"
    # no -std: torch's load_inline picks its own (C++17, or C++20 where its headers need it)
    flags = ["-O3"] + ([f"-gencode=arch=compute_{arch},code=sm_{arch}"] if arch else [])
    return load_inline("loom_attn_bench" + ("_wg" if wgmma else ""), cpp_sources="void fwd(torch::Tensor q, torch::Tensor k, torch::Tensor v, "
                       "torch::Tensor o, torch::Tensor L, torch::Tensor Os, double scale);\nvoid fwd_wg(torch::Tensor q, torch::Tensor k, "
                       "torch::Tensor v, torch::Tensor o, torch::Tensor L, torch::Tensor Os, double scale);\nvoid bwd(torch::Tensor dout, "
                       "torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor dq, torch::Tensor dk, "
                       "torch::Tensor dv, torch::Tensor L, torch::Tensor Ds, torch::Tensor Os, double scale, bool wg);", cuda_sources=src, functions=["fwd", "fwd_wg", "bwd"],
                       extra_cuda_cflags=flags, verbose=False)


def timed(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / iters


def rel(x, y):
    return ((x.float() - y.float()).abs().max() / y.float().abs().max().clamp_min(1e-30)).item()


def main():
    if not torch.cuda.is_available():
        print("SKIPPED: no GPU (torch.cuda.is_available() is False)")
        return 0
    wg_env = os.environ.get("WGMMA")
    wgmma = wg_env == "1" or (wg_env is None and torch.cuda.get_device_capability(0) == (9, 0))
    ext = build(sys.argv[1], wgmma)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    iters = int(os.environ.get("ITERS", "20"))
    gqa = int(os.environ.get("GQA", "1"))
    lse = os.environ.get("LSE", "1") != "0"
    shapes = [tuple(int(x) for x in s.split(":")) for s in os.environ.get("SHAPES", "1024:64,2048:64,1024:128,2048:128").split(",")]
    dev = torch.cuda.get_device_name(0)
    print(f"device: {dev}; torch {torch.__version__}; bf16, causal, GQA {gqa}; "
          + ("the forward saves L2 and O, dq in one pass" if lse else "LSE=0: dq in two passes"))
    print(f"{'T':>5s} {'D':>4s} {'B':>3s} {'H':>3s} | {'loom fwd ms':>11s} {'TF/s':>6s} {'f+b ms':>8s} {'TF/s':>6s} | "
          f"{'sdpa fwd ms':>11s} {'TF/s':>6s} {'f+b ms':>8s} {'TF/s':>6s} | {'out':>7s} {'dq':>7s} {'dk':>7s} {'dv':>7s}"
          + (f" | {'wgmma fwd':>9s} {'TF/s':>6s} {'f+b ms':>8s} {'TF/s':>6s} {'vs mma':>7s}" if wgmma else ""))
    for T, D in shapes:
        H = 2048 // D
        B = max(1, 16384 // T)
        KV = H // gqa
        scale = D ** -0.5
        g = torch.Generator(device="cuda").manual_seed(T + D)
        q = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(B, T, KV, D, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(B, T, KV, D, device="cuda", dtype=torch.bfloat16, generator=g)
        do = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
        o = torch.empty_like(q)
        dq = torch.empty(B, T, H, D, device="cuda", dtype=torch.float32)
        dk = torch.empty(B, T, KV, D, device="cuda", dtype=torch.float32)
        dv = torch.empty_like(dk)
        L = torch.empty(B * H * T, device="cuda", dtype=torch.float32)
        Ds = torch.empty_like(L)
        Os = torch.empty(B, T, H, D, device="cuda", dtype=torch.float32) if lse else torch.empty(0, device="cuda")
        f_loom = lambda: ext.fwd(q, k, v, o, L, Os, scale)
        fb_loom = lambda: (ext.fwd(q, k, v, o, L, Os, scale), ext.bwd(do, q, k, v, dq, dk, dv, L, Ds, Os, scale, False))
        # SDPA takes [B, H, T, D]; GQA by repeating kv heads (enable_gqa where the version has it)
        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
        kr = kt.repeat_interleave(gqa, dim=1) if gqa > 1 else kt
        vr = vt.repeat_interleave(gqa, dim=1) if gqa > 1 else vt
        dot = do.transpose(1, 2)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            sd = lambda: torch.nn.functional.scaled_dot_product_attention(qt, kr, vr, is_causal=True, scale=scale)
            def sd_fb():
                out = sd()
                out.backward(dot)
            ms_sf = timed(sd, iters)
            ms_sfb = timed(sd_fb, iters)
            qt.grad = kt.grad = vt.grad = None
            ref = sd()
            ref.backward(dot)
        ms_lf = timed(f_loom, iters)
        ms_lfb = timed(fb_loom, iters)
        fl = 4 * B * H * T * T * D / 2
        tf = lambda ms, mult: fl * mult / (ms * 1e-3) / 1e12
        errs = (rel(o, ref.transpose(1, 2)), rel(dq, qt.grad.transpose(1, 2)), rel(dk, kt.grad.transpose(1, 2)),
                rel(dv, vt.grad.transpose(1, 2)))
        wcols = ""
        if wgmma:   # the Hopper forward: its times, and out, L2, O against the mma.sync forward's just computed
            o_ref, L_ref, Os_ref = o.clone(), L.clone(), Os.clone()
            f_wg = lambda: ext.fwd_wg(q, k, v, o, L, Os, scale)
            g_ref = (dq.clone(), dk.clone(), dv.clone())
            fb_wg = lambda: (ext.fwd_wg(q, k, v, o, L, Os, scale), ext.bwd(do, q, k, v, dq, dk, dv, L, Ds, Os, scale, True))
            ms_wf, ms_wfb = timed(f_wg, iters), timed(fb_wg, iters)
            fb_wg()
            torch.cuda.synchronize()
            dw = max(rel(o, o_ref), rel(Os, Os_ref) if lse else 0.0, rel(L, L_ref) if lse else 0.0,
                     *(rel(x, y) for x, y in zip((dq, dk, dv), g_ref)))
            wcols = f" | {ms_wf:9.3f} {tf(ms_wf, 1):6.1f} {ms_wfb:8.3f} {tf(ms_wfb, 3.5):6.1f} {dw:7.1e}"
        print(f"{T:5d} {D:4d} {B:3d} {H:3d} | {ms_lf:11.3f} {tf(ms_lf, 1):6.1f} {ms_lfb:8.3f} {tf(ms_lfb, 3.5):6.1f} | "
              f"{ms_sf:11.3f} {tf(ms_sf, 1):6.1f} {ms_sfb:8.3f} {tf(ms_sfb, 3.5):6.1f} | "
              + " ".join(f"{e:7.1e}" for e in errs) + wcols)
    return 0


if __name__ == "__main__":
    sys.exit(main())
