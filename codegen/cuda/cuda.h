/* codegen/cuda/cuda.h — the CUDA backend: one CUDA C++ translation unit per program (compiled
 * by NVRTC, runtime/cuda/nvrtc.h), program functions as steps over native-dtype buffers.
 *
 *   kernel.c   a fused `kernel func` -> one extern "C" __global__ kernel (grid-stride loops;
 *              reductions per output row, column or thread: deterministic orders)
 *   lower.c    every program function (after `fuse` and `memory-plan` with target CUDA) ->
 *              RtSteps; the translation unit: the kernel families of kernels/<family>.cuh (embedded
 *              at build time, listed in kernels.h: conversions, norms, loss, data movement,
 *              AdamW, flash attention, context parallelism's blocks, the KV cache, mixture of
 *              experts, mesh), the fused kernels (identical ones shared),
 *              one extern "C" wrapper per builtin kernel and storage signature used
 *
 * The program (runtime/program.h, "On CUDA every step ..."):
 *   - every buffer holds its dtype natively (RtBuf.storage: f32, bf16, f16, f8e4m3, f8e5m2;
 *     i32 for integer tensors) and RtBuf.round = RT_ROUND_NONE (kernels round when they
 *     store); globals are laid out in their regions with each dtype's size, 64-byte aligned.
 *     A float global's storage is the dtype its RtGlobal.round names (NONE: f32).
 *   - a matmul is RT_STEP_GEMM as on the CPU (cuBLASLt with the buffers' storage types);
 *     every other step is RT_STEP_KERNEL: `which` indexes RtProgram.kernel_names, a symbol
 *     of the translation unit, `extern "C" __global__ void k(LoomArgs a)`, launched with the
 *     step's grid, block and dynamic shared memory (smem, bytes).  Steps whose smem exceeds
 *     48 KiB (the flash-attention kernels) need
 *     cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem) first.
 *   - fused kernels: bufs = arguments then results (as on the CPU); i[0] = N (the element
 *     count of the iteration space), and for kernels with reductions i[1] = outputs and
 *     i[2] = elements reduced per output.  A kernel whose few outputs each reduce many
 *     elements (a loss mean, a gradient norm, bias gradients) is split: step 1 (label
 *     "... (parts)") also writes each block's part to scratch (its last buffer), step 2
 *     ("... (sum of parts)", bufs: scratch -> the reduction results; i: outputs, parts)
 *     adds the parts in order.
 *   - builtins keep program.h's i[]/f[] layout of the op they implement.  Some ops take two
 *     steps and scratch memory at the end of the function's arena (RtFunc.arena_bytes is the
 *     memory plan's arena plus the largest scratch any step of the function needs; scratch
 *     is only live between the steps of one op, and is listed among the step's outputs):
 *       layernorm_grad, rmsnorm_grad  1: dy x w -> dx part   (part: f32[nb, parts, D])
 *                                     2: part -> dw [db]     i: nb, D, parts
 *       attention_grad                1: dout q k v -> dq L Dsum      (f32[B*H*T] each; L in base 2 on tensor cores)
 *                                     2: dout q k v L Dsum -> dk dv
 *       attention_block_grad          1: dout q k v lse delta -> dq;  2: the same -> dk dv
 *                                     (no scratch)
 *       embedding_grad                1: fill dtable with 0;  2: dy ids -> dtable
 *   - an adamw whose three results are only assigned back to its p, m, v writes them there
 *     (outputs = the globals, label "... (in place)") and the three assigns get no step.
 *   - context parallelism (rope, attention_block, attention_block_grad with seq_axis set):
 *     those steps keep program.h's i[] and add one slot, the rank's coordinate on the seq
 *     axis (CUDA_ROPE_COORD_INT, CUDA_ATTN_BLOCK_COORD_INT below), which the runtime writes
 *     before the launch (RtStep.coord_at; the lowering writes 0).
 *   - a partitioned program (lower_mesh.c): collectives are RT_STEP_BUILTIN steps with
 *     program.h's i[] (RT_B_ALL_REDUCE .. RT_B_ALL_TO_ALL, RT_B_COLL_START, RT_B_COLL_WAIT),
 *     run by the runtime as NCCL calls on a stream per mesh axis; embedding and
 *     embedding_grad add vocab axis + 1 and the rank's coordinate on it (i[3], i[4]);
 *     shard_slice, shard_pad, target_pick and onehot are kernels of kernels/mesh.cuh, their
 *     i[] program.h's plus the coordinate.  send and recv on a ring (rel=true: context
 *     parallelism) are RT_B_SEND / RT_B_RECV steps with program.h's i[], which the runtime
 *     issues as NCCL groups (runtime/cuda/cuda_exec.h, "point-to-point transfers"); a
 *     transfer to a fixed rank (a pipeline's) or to the rank itself, and all_to_allv, are
 *     refused.
 *   - generation with a KV cache (loom sample: rope_at, kv_write, attention_cached; kernels
 *     of kernels/decode.cuh): one step each, program.h's i[] and f[] (RT_B_ROPE_AT,
 *     RT_B_KV_WRITE, RT_B_ATTN_CACHED); the positions are an i32 buffer [B,C].  kv_write
 *     writes its cache global in place: the cache is listed once, as input 0, and the step
 *     has no outputs (as assign and accumulate list their global).  The caches are state
 *     globals initialized to zeros (cuda_globals_init), and attention_cached reads rows
 *     0..pos of them: rows a kv_write of this or an earlier call wrote when the host feeds
 *     positions 0, 1, 2, ... in order.  No device-side error flag exists: the host checks
 *     that every position is in [0, Tmax) before each call, as the CPU runtime does.  A
 *     kernel that meets one outside (rope_at: a negative one) traps rather than clamp or skip:
 *     the call fails (CUDA_ERROR_LAUNCH_FAILED) and the program is broken.
 *   - mixture of experts (topk .. grouped_matmul_wgrad; kernels of kernels/moe.cuh): program.h's
 *     i[] (RT_B_TOPK .. RT_B_GROUPED_WGRAD); expert indices, positions and counts are i32
 *     buffers.  One step each, except:
 *       moe_count   1: idx -> parts (scratch);  2: parts -> count start offs
 *       moe_sort    1, 2 as moe_count (count in scratch);  3: idx count start offs -> pos
 *                   (a counting sort in chunks of up to 1024 assignments, a block each; the
 *                   scratch is i32: parts and offs [chunks, E], count and start [E]; i[] adds
 *                   one slot, the chunk, at CUDA_MOE_CHUNK_INT)
 *       moe_dispatch  1: fill the rows with 0;  2: x pos w -> rows
 *     The group counts of grouped_matmul and grouped_matmul_wgrad stay on the device (a
 *     moe_count wrote them): both are tiled kernels of kernels/moe.cuh (T x T outputs a block,
 *     T = 64, or 128 on tensor cores for bf16 (docs/moe.md), f32 accumulation), not cuBLASLt
 *     GEMMs, which would need each group's size on the host (a synchronization per MoE layer
 *     and direction).  Every thread walks the counts, so a block finds its group itself:
 *     grouped_matmul's grid is (columns / T, an upper bound ceil(R/T) + G + 1 of the groups' row
 *     tiles; the rest of the blocks exit or zero the rows past the groups),
 *     grouped_matmul_wgrad's (K / 64, N / T, E).  An index, position or
 *     count out of range traps (as a bad KV-cache position does).
 *     LOOM_CUDA_MOE_GEMM=batched with a capacity (lower_moe.c): the groups fit [E, cap, D]
 *     whatever the counts, so the sizes are static after all:
 *       grouped_matmul        1: x cnt -> xp (loom_moe_pad, scratch; skipped when the last pad
 *                             of x is still there);  2: xp w -> yp (a GEMM of batch E, scratch);
 *                             3: yp cnt -> y (loom_moe_unpad)
 *       grouped_matmul_wgrad  1, 2: dy and x padded;  3: dyp^T xp -> dw (a GEMM of batch E,
 *                             into the f32 gradient with beta 1 when an accumulation follows)
 * Steps run in program order on one stream (the scratch region is shared by all steps).
 * Every reduction has a fixed order: the same inputs give the same bits on every run.
 */
#ifndef LOOM_CODEGEN_CUDA_H
#define LOOM_CODEGEN_CUDA_H

#include "ir/ir.h"
#include "runtime/program.h"

/* The slot of the rank's coordinate on the seq axis in i[] of the kernels loom_rope_* (the
   axis + 1 at i[6]) and loom_attnblk_* (the axis + 1 at i[7]); see "context parallelism". */
#define CUDA_ROPE_COORD_INT 9
#define CUDA_ATTN_BLOCK_COORD_INT 11
/* The slot of the chunk (assignments per block, at most 1024) in i[] of moe_sort's and
   moe_count's kernels (loom_moe_hist, loom_moe_offsets, loom_moe_place): program.h's
   n, experts, capacity, then the chunk. */
#define CUDA_MOE_CHUNK_INT 3

/* A GEMM step (RT_STEP_GEMM) with more than C = op(A) op(B): program.h's RT_GEMM_EPI_INT
   (bias, GELU, a residual) and RT_GEMM_BETA_INT (C += op(A) op(B)). */
#define CUDA_GEMM_EPI_INT RT_GEMM_EPI_INT
#define CUDA_GEMM_BETA_INT RT_GEMM_BETA_INT

/* Lowers every non-kernel function of m (after fuse and memory-plan with target CUDA: each
   value's offset counts each dtype's size) into *out (free with rt_program_free), and the
   translation unit into *cuda_source (malloc'd; may be NULL if not wanted).  Fails with a
   message naming the op on what the backend does not support (e.g. attention with a head
   size that is not a multiple of 8 or above 128, collectives, integer tensors other than
   i32 in memory). */
int cuda_lower(const Module *m, RtProgram *out, char **cuda_source, char *err, size_t errlen);

/* The translation unit alone (for `loom ir --emit=cuda`). */
int cuda_emit(const Module *m, char **source, char *err, size_t errlen);

#endif
