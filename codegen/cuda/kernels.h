/* codegen/cuda/kernels.h — the CUDA kernels loom emits into every translation unit, one
 * family per file under codegen/cuda/kernels/ (real CUDA C++, compiled by nvcc in the test
 * suite: tests/cli/cuda_nvcc.sh), embedded into the binary at build time by
 * cmake/embed_kernels.cmake as NUL-terminated byte arrays. cuda_emit_prelude (lower.c) writes
 * them in this order; a file may use what the files before it define.
 *
 *   common.cuh      storage conversions (bf16, f16, f8), block reductions, fused-kernel arithmetic
 *   norms.cuh       layer norm and RMS norm, forward and backward
 *   loss.cuh        softmax and cross entropy
 *   data.cuh        embedding, rope, data movement (slices, pads, transposes, sums, casts)
 *   optimizer.cuh   the gradient norm and AdamW
 *   attention.cuh   flash attention on CUDA cores
 *   attention_tc.cuh    flash attention on tensor cores (mma.sync), the fragment helpers
 *   attention_sm90.cuh  the Hopper forward, dq and dk/dv (wgmma, bulk copies, mbarriers;
 *                       LOOM_CUDA_WGMMA=1)
 *   attn_block.cuh  context parallelism's attention blocks (ring attention)
 *   decode.cuh      generation with a KV cache
 *   moe.cuh         mixture of experts: routing, permutations, grouped matmuls, and the
 *                   padding to a capacity for the batched GEMM (LOOM_CUDA_MOE_GEMM=batched)
 *   mesh.cuh        sharding's slices and pads, vocabulary-parallel picks
 *
 * Kernels are templates over storage dtypes; lower.c instantiates them through extern "C"
 * wrappers per program. Adding a family: a .cuh here, its name in CMakeLists.txt's
 * LOOM_CUH_NAMES, a declaration below and a line in cuda_emit_prelude. */
#ifndef LOOM_CODEGEN_CUDA_KERNELS_H
#define LOOM_CODEGEN_CUDA_KERNELS_H

extern const char loom_cuh_common[], loom_cuh_norms[], loom_cuh_loss[], loom_cuh_data[],
    loom_cuh_optimizer[], loom_cuh_attention[], loom_cuh_attention_tc[], loom_cuh_attention_sm90[], loom_cuh_attn_block[], loom_cuh_decode[],
    loom_cuh_moe[], loom_cuh_mesh[];

#endif
