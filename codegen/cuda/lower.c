/* codegen/cuda/lower.c — program functions -> RtProgram for CUDA, and the translation unit.
 *
 * Like codegen/cpu/lower.c, one op becomes one step (a reshape between equal offsets none;
 * layernorm_grad, rmsnorm_grad, attention_grad, embedding_grad, moe_count and moe_dispatch
 * two; moe_sort three), but every step that
 * is not a GEMM is RT_STEP_KERNEL: a fused kernel of kernel.c, or an extern "C" wrapper that
 * instantiates a template of codegen/cuda/kernels/<family>.cuh for the storage dtypes of the step's buffers (the
 * kernel's name spells them: f f32, b bf16, h f16, e f8e4m3, m f8e5m2, i i32; data movement
 * that only copies is named by the element size).  Launch shapes are set per step; see
 * cuda.h for the conventions and the scratch memory some builtins use.
 *
 * Memory: every value at its memory-plan offset (memory-plan with target CUDA: each dtype's
 * size); globals in their regions (parameters, "grad.*", the rest), in placement order
 * (cg_placement_order), each dtype's size, 64-byte aligned.  AdamW over a weight-decay group's
 * parameters, and the fills that zero their gradients, merge into one launch each
 * (merge_updates): a multi-tensor AdamW over one contiguous span per region.
 *
 * Why one file of ~1,100 lines: every builtin's lowering is a case of lower_builtin beside
 * its launch shape and shared-memory size.  The step builders (cl_new_step, cl_set_bufs,
 * cl_instantiate, ...) live in steps.c, shared through cuda_internal.h, and op families have
 * moved out (lower_mesh.c: collectives, transfers and per-rank ops; lower_gemm.c: matmuls,
 * their epilogues and the gradient accumulation; lower_fuse.c: weight copies, norm statistics,
 * the fused classifier; lower_attn.c: attention, its gradient and the attention blocks).
 * Those files never call back here: the one op they lower through the dispatcher goes through
 * L->lower_op.  Data movement and the optimizer are the next families to move the same way.
 */
#include "codegen/cuda/cuda_internal.h"
#include "codegen/cuda/kernels.h"
#include "codegen/lower_common.h"
#include "runtime/cuda/nvrtc.h"


/* moe_sort and moe_count (kernels/moe.cuh): a counting sort in chunks of CUDA_MOE_CHUNK
   assignments.  i[] is program.h's (n, experts, capacity) and one slot more,
   i[CUDA_MOE_CHUNK_INT]: the chunk.  Scratch (i32): parts[P][E], offs[P][E], count[E],
   start[E] (P chunks).  moe_count: 1 idx -> parts;  2 parts -> count (its result) start
   offs.  moe_sort: the same with count in scratch, then 3 idx count start offs -> pos. */
#define CUDA_MOE_CHUNK 1024   /* kernels/moe.cuh's LOOM_MOE_CHUNK: the most a chunk may hold */
static int lower_moe_sort(Lower *L, Steps *s) {
  const Op *op = L->op;
  bool sort = op->kind == OP_MOE_SORT;
  int64_t n = type_numel(&op->operands[0]->type), E = op_int(op, "experts"), cap = op_int(op, "capacity");
  if (E < 1 || E > INT32_MAX || n > INT32_MAX || cap < 0)
    return cl_fail(L, "%lld experts, %lld assignments, capacity %lld: the CUDA routing takes 1 to 2^31-1 of each",
                 (long long)E, (long long)n, (long long)cap);
  int64_t P = (n + CUDA_MOE_CHUNK - 1) / CUDA_MOE_CHUNK;
  int64_t parts_at = 0, offs_at = cg_align64(4 * P * E), count_at = offs_at + cg_align64(4 * P * E);
  int64_t start_at = count_at + cg_align64(4 * E);
  const int64_t ints[CUDA_MOE_CHUNK_INT + 1] = {n, E, cap, CUDA_MOE_CHUNK};
  /* 1: each chunk's count per expert */
  RtStep *st = cl_new_step(L, s, RT_STEP_KERNEL, 0, " (counts per chunk)");
  if (!st || cl_set_bufs(L, st, (const Value *const *)op->operands, 1, false)) return IR_EINPUT;
  if (st->bufs[0].storage != RT_ST_I32) return cl_fail(L, "expert indices must be i32");
  if (cl_add_scratch_i32(L, st, parts_at, P * E)) return IR_EINPUT;
  memcpy(st->i, ints, sizeof ints);
  st->block[0] = 256;
  st->grid[0] = cl_clamp_grid(P, 65535);
  if (cl_instantiate(L, st, "moe_hist", "loom_moe_hist", (const int[]){0, -1}, NULL, "", 256)) return IR_EINPUT;
  RtBuf idx = st->bufs[0], parts = st->bufs[1];
  /* 2: the counts kept, each expert's first row, each chunk's first rank per expert */
  st = cl_new_step(L, s, RT_STEP_KERNEL, 0, sort ? " (offsets)" : "");
  if (!st) return IR_EINPUT;
  st->n_in = 1;
  st->bufs[0] = parts;
  if (sort) {
    if (cl_add_scratch_i32(L, st, count_at, E)) return IR_EINPUT;
  } else {
    st->n_out = 1;
    if (cl_buf_of(L, op->results[0], &st->bufs[1])) return IR_EINPUT;
    if (st->bufs[1].storage != RT_ST_I32) return cl_fail(L, "counts must be i32");
  }
  if (cl_add_scratch_i32(L, st, start_at, E) || cl_add_scratch_i32(L, st, offs_at, P * E)) return IR_EINPUT;
  memcpy(st->i, ints, sizeof ints);
  st->block[0] = 256;
  if (cl_instantiate(L, st, "moe_offsets", "loom_moe_offsets", (const int[]){0, -1}, NULL, "", 256)) return IR_EINPUT;
  if (!sort) return 0;
  RtBuf count = st->bufs[1], start = st->bufs[2], offs = st->bufs[3];
  /* 3: every assignment's row (or -1) */
  st = cl_new_step(L, s, RT_STEP_KERNEL, 0, " (positions)");
  if (!st) return IR_EINPUT;
  st->n_in = 4;
  st->bufs[0] = idx;
  st->bufs[1] = count;
  st->bufs[2] = start;
  st->bufs[3] = offs;
  st->n_out = 1;
  if (cl_buf_of(L, op->results[0], &st->bufs[4])) return IR_EINPUT;
  if (st->bufs[4].storage != RT_ST_I32) return cl_fail(L, "positions must be i32");
  memcpy(st->i, ints, sizeof ints);
  st->block[0] = 256;
  st->grid[0] = cl_clamp_grid(P, 65535);
  return cl_instantiate(L, st, "moe_place", "loom_moe_place", (const int[]){0, -1}, NULL, "", 256);
}

/* The grouped matmuls' tiles: 64 x 64 outputs a block (kernels/moe.cuh's LOOM_GM_T); with bf16
   operands, tensor-core tiles of 128 x 128 (LOOM_GMT), the weight gradient's 128 n x 64 k
   (LOOM_GMW_N, LOOM_GMW_K).  The kernels stride over any grid: these only size it.  The
   tensor-core forward's dynamic shared memory (loom_gm_tc_smem): 3 stages of k 32, A [128][40]
   and B [128][40] (tb) or [32][136]; the kernel traps on less. */
#define CUDA_GM_TILE 64
#define CUDA_GM_TC 128
#define CUDA_GM_TC_K 32
#define CUDA_GM_TC_SMEM(tb) \
  (3 * 2 * (CUDA_GM_TC * (CUDA_GM_TC_K + 8) + ((tb) ? CUDA_GM_TC * (CUDA_GM_TC_K + 8) : CUDA_GM_TC_K * (CUDA_GM_TC + 8))))

/* A step that fills the op's first result with zeros (loom_fill), before a step that writes
   only some of it (embedding_grad's rows, moe_dispatch's reached rows). */
/* An embedding's vocab_axis (a vocabulary-parallel table: rows [c*V, (c+1)*V) on the rank of
   coordinate c): i[] gets the axis + 1 (0: whole) and the coordinate, which the runtime
   writes (RtStep.coord_at). */
static int vocab_ints(Lower *L, RtStep *st, int *n) {
  const Attr *a = op_attr(L->op, "vocab_axis");
  int64_t axis = a && a->s && a->s[0] ? mesh_axis_parse(a->s) : -1;
  if (axis < 0 && a && a->s && a->s[0]) return cl_fail(L, "vocab_axis '%s' is not a mesh axis", a->s);
  if (cl_push_int(L, st, n, axis + 1)) return IR_EINPUT;
  if (axis >= 0) {
    st->coord_at = (uint8_t)(*n + 1);
    st->coord_axis = (uint8_t)axis;
  }
  return cl_push_int(L, st, n, 0);
}

static int zero_result(Lower *L, Steps *s) {
  RtStep *st = cl_new_step(L, s, RT_STEP_KERNEL, 0, " (zero)");
  if (!st) return IR_EINPUT;
  st->n_out = 1;
  if (cl_buf_of(L, L->op->results[0], &st->bufs[0])) return IR_EINPUT;
  int n = 0;
  if (cl_push_int(L, st, &n, type_numel(&L->op->results[0]->type))) return IR_EINPUT;
  st->f[0] = 0;
  cl_launch_ew(st, type_numel(&L->op->results[0]->type));
  return cl_instantiate(L, st, "fill", "loom_fill", (const int[]){0, -1}, NULL, "", 1024);
}

static int lower_builtin(Lower *L, Steps *s) {
  const Op *op = L->op;
  const Type *x = op->n_operands ? &op->operands[0]->type : NULL;
  const Type *y = op->n_results ? &op->results[0]->type : NULL;
  RtStep *st;
  int n = 0;
#define STEP(suffix_)                                               \
  do {                                                              \
    st = cl_new_step(L, s, RT_STEP_KERNEL, 0, (suffix_));              \
    if (!st || cl_set_operand_bufs(L, st)) return IR_EINPUT;           \
    n = 0;                                                          \
  } while (0)
#define INT(v)                                      \
  do {                                              \
    if (cl_push_int(L, st, &n, (v))) return IR_EINPUT; \
  } while (0)
#define IDX(...) ((const int[]){__VA_ARGS__, -1})
  switch (op->kind) {
  case OP_LAYERNORM:
  case OP_RMSNORM: {
    bool ln = op->kind == OP_LAYERNORM;
    STEP("");
    int64_t D = cl_last_dim(x);
    INT(D ? type_numel(x) / D : 0);
    INT(D);
    st->f[0] = op_float(op, "eps");
    cl_launch_rows(st, st->i[0], D);
    if (cl_fuse_norm_fwd(L, s, st, L->op_index)) return IR_EINPUT;   /* (mean, rstd) saved (lower_fuse.c) */
    if (ln) return cl_instantiate(L, st, "layernorm", "loom_norm_fwd", IDX(0, 1, 2, 3), "true", "", 1024);
    return cl_instantiate(L, st, "rmsnorm", "loom_norm_fwd", IDX(0, 1, 1, 2), "false", "", 1024);
  }
  case OP_LAYERNORM_GRAD:
  case OP_RMSNORM_GRAD: {
    int fused = cl_fuse_norm_bwd(L, s, L->op_index);   /* from the saved statistics, one launch (lower_fuse.c) */
    if (fused != 1) return fused;
    bool ln = op->kind == OP_LAYERNORM_GRAD;
    const Type *xt = &op->operands[1]->type;
    int64_t D = cl_last_dim(xt), rows = D ? type_numel(xt) / D : 0, parts = ln ? 2 : 1;
    uint32_t nb = cl_clamp_grid(rows, 256);
    /* 1: dx and per-block partial sums of dw (db) */
    st = cl_new_step(L, s, RT_STEP_KERNEL, 0, " (dx)");
    if (!st || cl_set_bufs(L, st, (const Value *const *)op->operands, 3, false)) return IR_EINPUT;
    st->n_out = 1;
    if (cl_buf_of(L, op->results[0], &st->bufs[3]) || cl_add_scratch(L, st, 0, (int64_t)nb * parts * D)) return IR_EINPUT;
    n = 0;
    INT(rows);
    INT(D);
    st->f[0] = op_float(op, "eps");
    st->block[0] = cl_row_threads(D);
    st->grid[0] = nb;
    if (cl_instantiate(L, st, ln ? "lngrad" : "rmsgrad", "loom_norm_bwd", IDX(0, 1, 2, 3), ln ? "true" : "false", "", 1024))
      return IR_EINPUT;
    RtBuf part = st->bufs[4];
    /* 2: the partial sums in block order */
    st = cl_new_step(L, s, RT_STEP_KERNEL, 0, " (dw)");
    if (!st) return IR_EINPUT;
    st->n_in = 1;
    st->bufs[0] = part;
    st->n_out = (int)parts;
    for (int r = 0; r < parts; r++)
      if (cl_buf_of(L, op->results[1 + r], &st->bufs[1 + r])) return IR_EINPUT;
    n = 0;
    INT(nb);
    INT(D);
    INT(parts);
    cl_launch_ew(st, parts * D);
    return cl_instantiate(L, st, "normsum", "loom_norm_colsum", ln ? IDX(1, 2) : IDX(1, 1), NULL, "", 1024);
  }
  case OP_SOFTMAX:
  case OP_SOFTMAX_GRAD: {
    bool fwd = op->kind == OP_SOFTMAX;
    STEP("");
    int64_t D = cl_last_dim(y);
    INT(D ? type_numel(y) / D : 0);
    INT(D);
    cl_launch_rows(st, st->i[0], D);
    if (fwd) return cl_instantiate(L, st, "softmax", "loom_softmax_fwd", IDX(0, 1), NULL, "", 1024);
    return cl_instantiate(L, st, "softmax_bwd", "loom_softmax_bwd", IDX(0, 1, 2), NULL, "", 1024);
  }
  case OP_ROPE: {
    int64_t axis1 = 0;
    if (x->dims[3] % 2) return cl_fail(L, "rope needs an even head size");
    if (cl_seq_axis1(L, &axis1)) return IR_EINPUT;
    STEP("");
    for (int d = 0; d < 4; d++) INT(x->dims[d]);
    INT(op_int(op, "offset"));
    INT(op_bool(op, "inverse"));
    INT(axis1);
    INT(op_int(op, "seq_n"));
    INT(op_bool(op, "zigzag"));
    INT(0);   /* i[CUDA_ROPE_COORD_INT]: the rank's coordinate, written by the runtime */
    if (axis1) {
      st->coord_at = CUDA_ROPE_COORD_INT + 1;
      st->coord_axis = (uint8_t)(axis1 - 1);
    }
    cg_rope_f(op, st->f);
    cl_launch_ew(st, type_numel(x) / 2);
    return cl_instantiate(L, st, "rope", "loom_rope", IDX(0, 1), NULL, "", 1024);
  }
  /* generation with a KV cache (kernels/decode.cuh): program.h's i[] layouts; positions i32 */
  case OP_ROPE_AT:
    if (x->dims[3] % 2) return cl_fail(L, "rope_at needs an even head size");
    STEP("");
    if (st->bufs[1].storage != RT_ST_I32) return cl_fail(L, "positions must be i32");
    for (int d = 0; d < 4; d++) INT(x->dims[d]);
    cg_rope_f(op, st->f);
    cl_launch_ew(st, type_numel(x) / 2);
    return cl_instantiate(L, st, "rope_at", "loom_rope_at", IDX(0, 2), NULL, "", 1024);
  case OP_ATTENTION_CACHED: {
    const Type *kt = &op->operands[1]->type;
    int64_t rows = x->dims[0] * x->dims[1] * x->dims[2], Dh = x->dims[3];
    if (kt->dims[2] <= 0 || x->dims[2] % kt->dims[2])
      return cl_fail(L, "%lld query heads do not share %lld kv heads evenly", (long long)x->dims[2], (long long)kt->dims[2]);
    if (Dh > 4096) return cl_fail(L, "head size %lld: attention_cached on CUDA takes head sizes up to 4096", (long long)Dh);
    STEP("");
    if (st->bufs[3].storage != RT_ST_I32) return cl_fail(L, "positions must be i32");
    for (int d = 0; d < 4; d++) INT(x->dims[d]);
    INT(kt->dims[1]);
    INT(kt->dims[2]);
    INT(op_int(op, "window"));
    st->f[0] = op_float(op, "scale");
    st->block[0] = 128;   /* LOOM_AC_THREADS: a block per query row, grid-stride over the rows */
    st->grid[0] = cl_clamp_grid(rows, 65535);
    st->smem = (uint32_t)(4 * (2 * Dh + 128));   /* the query, the output's sums, a tile's scores */
    return cl_instantiate(L, st, "attn_cached", "loom_attn_cached", IDX(0, 1, 2, 4), NULL, "", 128);
  }
  case OP_KV_WRITE: {
    /* the cache is written in place: listed once, as input 0 (no outputs), like assign */
    const Type *v = &op->operands[1]->type;
    STEP("");
    if (st->bufs[2].storage != RT_ST_I32) return cl_fail(L, "positions must be i32");
    INT(v->dims[0]);
    INT(v->dims[1]);
    INT(x->dims[1]);
    INT(v->dims[2] * v->dims[3]);
    cl_launch_ew(st, type_numel(v));
    return cl_instantiate(L, st, "kv_write", "loom_kv_write", IDX(0, 1), NULL, "", 1024);
  }
  /* mixture of experts (kernels/moe.cuh): program.h's i[] (RT_B_TOPK .. RT_B_GROUPED_WGRAD);
     expert indices, positions and counts i32 */
  case OP_TOPK:
  case OP_GATHER_LAST:
  case OP_SCATTER_LAST: {
    const Type *big = op->kind == OP_SCATTER_LAST ? y : x;
    const Type *idx = op->kind == OP_TOPK ? y : &op->operands[1]->type;
    STEP("");
    if (st->bufs[1].storage != RT_ST_I32) return cl_fail(L, "expert indices must be i32");
    int64_t E = cl_last_dim(big), rows = E ? type_numel(big) / E : 0, k = cl_last_dim(idx);
    INT(rows);
    INT(E);
    INT(k);
    if (op->kind == OP_TOPK) {
      if (k < 1 || k > E) return cl_fail(L, "k = %lld of %lld experts", (long long)k, (long long)E);
      cl_launch_ew(st, rows);
      return cl_instantiate(L, st, "topk", "loom_topk", IDX(0, 1), NULL, "", 1024);
    }
    cl_launch_ew(st, rows * (op->kind == OP_GATHER_LAST ? k : E));
    if (op->kind == OP_GATHER_LAST) return cl_instantiate(L, st, "gather_last", "loom_gather_last", IDX(0, 2), NULL, "", 1024);
    return cl_instantiate(L, st, "scatter_last", "loom_scatter_last", IDX(0, 2), NULL, "", 1024);
  }
  case OP_MOE_SORT:
  case OP_MOE_COUNT: return lower_moe_sort(L, s);
  case OP_MOE_DISPATCH:
  case OP_MOE_COMBINE:
  case OP_MOE_WEIGHT_GRAD: {
    bool wg = op->kind == OP_MOE_WEIGHT_GRAD, disp = op->kind == OP_MOE_DISPATCH;
    const Type *rows = disp ? y : x, *pos = &op->operands[wg ? 2 : 1]->type;
    int64_t N = disp ? x->dims[0] : wg ? op->operands[1]->type.dims[0] : y->dims[0];
    int64_t k = N ? type_numel(pos) / N : 0, D = rows->dims[1], R = rows->dims[0];
    if (disp && zero_result(L, s)) return IR_EINPUT;   /* 1: rows no assignment reaches are 0 */
    STEP("");
    if (st->bufs[wg ? 2 : 1].storage != RT_ST_I32) return cl_fail(L, "positions must be i32");
    INT(N);
    INT(k);
    INT(D);
    INT(R);
    if (wg) {   /* a warp per assignment */
      st->block[0] = 256;
      st->grid[0] = cl_clamp_grid((N * k + 7) / 8, 65535);
      return cl_instantiate(L, st, "moe_wgrad", "loom_moe_wgrad", IDX(0, 1, 3), NULL, "", 256);
    }
    cl_launch_ew(st, (disp ? N * k : N) * D);
    if (disp) return cl_instantiate(L, st, "moe_dispatch", "loom_moe_dispatch", IDX(0, 2, 3), NULL, "", 1024);
    return cl_instantiate(L, st, "moe_combine", "loom_moe_combine", IDX(0, 2, 3), NULL, "", 1024);
  }
  case OP_GROUPED_MATMUL:
  case OP_GROUPED_MATMUL_WGRAD: {
    const Type *b = &op->operands[1]->type, *cnt = &op->operands[2]->type;
    bool wg = op->kind == OP_GROUPED_MATMUL_WGRAD, tb = wg || op_bool(op, "tb");
    int64_t R = x->dims[0], K = wg ? b->dims[1] : x->dims[1], N = wg ? x->dims[1] : y->dims[1];
    int64_t E = wg ? op_int(op, "experts") : b->dims[0], G = cnt->dims[0];
    if (E < 1 || G % E || R > INT32_MAX || K > INT32_MAX || N > INT32_MAX)
      return cl_fail(L, "%lld groups on %lld experts: the groups must be a multiple of the experts, and the sizes fit "
                   "int32", (long long)G, (long long)E);
    const char *why_not;   /* LOOM_CUDA_MOE_GEMM=batched: one cuBLASLt GEMM at a capacity (lower_moe.c) */
    int batched = cl_lower_moe_batched(L, s, &why_not);
    if (batched != 1) return batched;
    STEP(why_not ? why_not : "");
    if (st->bufs[2].storage != RT_ST_I32) return cl_fail(L, "group counts must be i32");
    INT(R);
    INT(K);
    INT(N);
    INT(E);
    INT(G);
    INT(tb);
    st->block[0] = 256;
    bool tc = st->bufs[0].storage == RT_ST_BF16 && st->bufs[1].storage == RT_ST_BF16;
    int64_t tm = tc ? CUDA_GM_TC : CUDA_GM_TILE;
    if (wg) {   /* a block per tile of one expert's dw [N,K] */
      st->grid[0] = cl_clamp_grid((K + CUDA_GM_TILE - 1) / CUDA_GM_TILE, 65535);
      st->grid[1] = cl_clamp_grid((N + tm - 1) / tm, 65535);
      st->grid[2] = cl_clamp_grid(E, 65535);
      return cl_instantiate(L, st, "gmm_wgrad", "loom_grouped_wgrad", IDX(0, 1, 3), NULL, "", 256);
    }
    /* x: the column tiles; y: the row tiles, at most ceil(R/tm) + G + 1 (each group's last tile
       may be partial, and the rows past the groups are zeroed tm at a time) */
    st->grid[0] = cl_clamp_grid((N + tm - 1) / tm, 65535);
    st->grid[1] = cl_clamp_grid((R + tm - 1) / tm + G + 1, 65535);
    if (tc) st->smem = (uint32_t)CUDA_GM_TC_SMEM(tb);
    return cl_instantiate(L, st, "gmm", "loom_grouped_mm", IDX(0, 1, 3), tb ? "true" : "false", tb ? "_t" : "_n", 256);
  }
  case OP_CROSS_ENTROPY:
  case OP_CROSS_ENTROPY_GRAD: {
    bool fwd = op->kind == OP_CROSS_ENTROPY;
    if (fwd) {   /* with its gradient in one pass over the logits (lower_fuse.c) */
      int fused = cl_fuse_xent(L, s, L->op_index);
      if (fused != 1) return fused;
    }
    const Type *logits = &op->operands[fwd ? 0 : 1]->type;
    STEP("");
    if (st->bufs[fwd ? 1 : 2].storage != RT_ST_I32) return cl_fail(L, "targets must be i32");
    int64_t V = cl_last_dim(logits);
    INT(V ? type_numel(logits) / V : 0);
    INT(V);
    cl_launch_rows(st, st->i[0], V);
    if (fwd) return cl_instantiate(L, st, "xent", "loom_xent_fwd", IDX(0, 2), NULL, "", 1024);
    return cl_instantiate(L, st, "xent_bwd", "loom_xent_bwd", IDX(0, 1, 3), NULL, "", 1024);
  }
  case OP_EMBEDDING: {
    int fused = cl_fuse_embed_pos(L, s, L->op_index);   /* with the positions' add (lower_fuse.c) */
    if (fused != 1) return fused;
    STEP("");
    if (st->bufs[1].storage != RT_ST_I32) return cl_fail(L, "ids must be i32");
    INT(type_numel(&op->operands[1]->type));
    INT(x->dims[0]);
    INT(x->dims[1]);
    if (vocab_ints(L, st, &n)) return IR_EINPUT;
    cl_launch_ew(st, st->i[0] * st->i[2]);
    return cl_instantiate(L, st, "embedding", "loom_embedding_fwd", IDX(0, 2), NULL, "", 1024);
  }
  case OP_EMBEDDING_GRAD: {
    /* a leaf of a gradient tree (lower_gemm.c): its rows added into the f32 gradient, no fill */
    const RtBuf *into = L->leaf_into && L->leaf_into[L->op_index].n ? &L->leaf_into[L->op_index] : NULL;
    if (!into && zero_result(L, s)) return IR_EINPUT;   /* 1: zero the table gradient */
    /* 2: the rows of the ids that occur */
    STEP(into ? " (+= a gradient)" : "");
    if (into) st->bufs[2] = *into;
    if (st->bufs[1].storage != RT_ST_I32) return cl_fail(L, "ids must be i32");
    INT(type_numel(&op->operands[1]->type));
    INT(y->dims[0]);
    INT(y->dims[1]);
    if (vocab_ints(L, st, &n)) return IR_EINPUT;
    INT(into != NULL);
    st->block[0] = 256;
    st->grid[0] = cl_clamp_grid(st->i[0], 65536);
    return cl_instantiate(L, st, "embedding_bwd", "loom_embedding_bwd", IDX(0, 2), NULL, "", 1024);
  }
  case OP_TRANSPOSE:
  case OP_SLICE:
  case OP_PAD: {
    STEP("");
    INT(x->rank);
    for (int d = 0; d < x->rank; d++) INT(x->dims[d]);
    for (int a = 0; a < op_info(op->kind)->n_attrs; a++)
      for (int d = 0; d < x->rank; d++) INT(op->attrs[a].ints[d]);
    cl_launch_ew(st, type_numel(y));
    const char *base = op->kind == OP_TRANSPOSE ? "transpose" : op->kind == OP_SLICE ? "slice" : "pad";
    char tmpl[32];
    snprintf(tmpl, sizeof tmpl, "loom_%s", base);
    return cl_instantiate_raw(L, st, base, tmpl, cl_st_size(st->bufs[0].storage));
  }
  case OP_CONCAT: {
    int dim = (int)op_int(op, "dim");
    STEP("");
    INT(op->n_operands);
    INT(cl_prod_dims(y, 0, dim));
    INT(cl_prod_dims(y, dim + 1, y->rank));
    for (int i = 0; i < op->n_operands; i++) INT(op->operands[i]->type.dims[dim]);
    cl_launch_ew(st, type_numel(y));
    return cl_instantiate_raw(L, st, "concat", "loom_concat", cl_st_size(st->bufs[0].storage));
  }
  case OP_BROADCAST: {
    STEP("");
    INT(y->rank);
    for (int d = 0; d < y->rank; d++) INT(y->dims[d]);
    int off = y->rank - x->rank;
    for (int d = 0; d < y->rank; d++) {
      int e = d - off;
      INT(e < 0 || x->dims[e] == 1 ? 0 : cl_prod_dims(x, e + 1, x->rank));
    }
    cl_launch_ew(st, type_numel(y));
    return cl_instantiate_raw(L, st, "broadcast", "loom_broadcast", cl_st_size(st->bufs[0].storage));
  }
  case OP_RESHAPE:
    if (op->operands[0]->kind != VAL_GLOBAL && op->operands[0]->offset == op->results[0]->offset) {
      RtBuf a, b;   /* shares its operand's buffer: no step, but check both */
      if (cl_buf_of(L, op->operands[0], &a) || cl_buf_of(L, op->results[0], &b)) return IR_EINPUT;
      cl_weight_copy_follow(L, op->operands[0], op->results[0]);
      return 0;
    }
    STEP("");
    INT(type_numel(y));
    cl_launch_ew(st, type_numel(y));
    return cl_instantiate_raw(L, st, "copyraw", "loom_copy_raw", cl_st_size(st->bufs[0].storage));
  case OP_CAST: {
    bool ff = dtype_is_float(x->dtype) && dtype_is_float(y->dtype);
    STEP("");
    INT(type_numel(y));
    if (!ff) INT(y->dtype == DT_BOOL);
    cl_launch_ew(st, type_numel(y));
    if (st->bufs[0].storage == st->bufs[1].storage)
      return cl_instantiate_raw(L, st, "copyraw", "loom_copy_raw", cl_st_size(st->bufs[0].storage));
    if (ff) return cl_instantiate(L, st, "copy", "loom_copy", IDX(0, 1), NULL, "", 1024);
    return cl_instantiate(L, st, "cast", "loom_cast", IDX(0, 1), NULL, "", 1024);
  }
  case OP_CONSTANT:
    STEP("");
    INT(type_numel(y));
    st->f[0] = op_float(op, "value");
    cl_launch_ew(st, type_numel(y));
    return cl_instantiate(L, st, "fill", "loom_fill", IDX(0), NULL, "", 1024);
  case OP_IOTA:
    STEP("");
    INT(y->rank);
    for (int d = 0; d < y->rank; d++) INT(y->dims[d]);
    INT(op_int(op, "dim"));
    cl_launch_ew(st, type_numel(y));
    return cl_instantiate(L, st, "iota", "loom_iota", IDX(0), NULL, "", 1024);
  case OP_ACCUMULATE:
  case OP_ASSIGN: {
    bool acc = op->kind == OP_ACCUMULATE;
    STEP("");
    INT(type_numel(x));
    cl_launch_ew(st, type_numel(x));
    return cl_instantiate(L, st, acc ? "accumulate" : "assign", "loom_update", IDX(0, 1), acc ? "true" : "false", "", 1024);
  }
  case OP_FILL:
    /* the global is the output */
    st = cl_new_step(L, s, RT_STEP_KERNEL, 0, "");
    if (!st) return IR_EINPUT;
    st->n_out = 1;
    if (cl_buf_of(L, op->operands[0], &st->bufs[0])) return IR_EINPUT;
    INT(type_numel(x));
    st->f[0] = op_float(op, "value");
    cl_launch_ew(st, type_numel(x));
    return cl_instantiate(L, st, "fill", "loom_fill", IDX(0), NULL, "", 1024);
  case OP_ADAMW: {
    STEP("");
    int64_t cnt = type_numel(x);
    INT(cnt);
    st->f[0] = op_float(op, "beta1");
    st->f[1] = op_float(op, "beta2");
    st->f[2] = op_float(op, "eps");
    st->f[3] = op_float(op, "weight_decay");
    if (!cl_all_float(st)) return cl_fail(L, "adamw on integer tensors");
    if (st->bufs[4].storage != st->bufs[5].storage || st->bufs[4].storage != st->bufs[6].storage)
      return cl_fail(L, "gscale, lr and t of different dtypes are not supported by the CUDA backend");
    for (int i = 0; i < 3; i++)
      if (st->bufs[i].storage != st->bufs[7 + i].storage) return cl_fail(L, "adamw results of other dtypes than p, m, v");
    if (L->adamw_in_place) {
      /* p2 m2 v2 are only assigned back to p m v: write them there (the kernel reads each
         element before it writes it) and skip the three assigns */
      for (int i = 0; i < 3; i++) st->bufs[7 + i] = st->bufs[i];
      snprintf(st->label + strlen(st->label), sizeof st->label - strlen(st->label), " (in place)");
    }
    bool vec = cnt % 4 == 0;
    for (int i = 0; i < 10; i++)
      if (st->bufs[i].storage != RT_ST_F32) vec = false;
    cl_launch_ew(st, vec ? cnt / 4 : cnt);
    /* the parameter's bf16 copy written too (lower_fuse.c): output 4, buffer 10 */
    if (L->adamw_in_place && cl_weight_copy_adamw(L, st))
      return cl_instantiate(L, st, "adamw", "loom_adamw_copy", IDX(0, 1, 2, 3, 4, 10), vec ? "true" : "false",
                            vec ? "_v4" : "", 1024);
    return cl_instantiate(L, st, "adamw", "loom_adamw", IDX(0, 1, 2, 3, 4), vec ? "true" : "false", vec ? "_v4" : "", 1024);
  }
  default: break;
  }
#undef STEP
#undef INT
#undef IDX
  const OpInfo *info = op_info(op->kind);
  if (info->cls == CLASS_ELEMENTWISE || info->cls == CLASS_REDUCTION)
    return cl_fail(L, "is outside a kernel func; the CUDA backend runs elementwise ops and reductions only in fused "
                 "kernels (run the fuse pass first)");
  if (info->cls == CLASS_COLLECTIVE)   /* lower_mesh.c lowers the others */
    return cl_fail(L, "is not supported by the CUDA backend yet; it runs on the cpu backend (--backend cpu)");
  return cl_fail(L, "is not supported by the CUDA backend");
}

/* ---------------------------------------------------------------- functions */

/* `%p2, %m2, %v2 = adamw $p, ...` whose results are only assigned back (ir/module.c):
   the adamw writes the globals itself.  Marks the assigns to skip. */
static bool adamw_in_place(Lower *L, int i) {
  int found[3];
  if (!adamw_assigned_back(L->f, i, found)) return false;
  for (int k = 0; k < 3; k++) L->skip[found[k]] = true;
  return true;
}

/* ---------------------------------------------------------------- the gradient norm

   The optimizer's global norm is a chain: per gradient g, s = call k(g) with k
   `square` then `reduce_sum` over every dim; the sums are added one by one (call of a
   kernel that adds two scalars).  That is two launches per parameter (GPT-2 124M: 295).
   When the chain's ops are consecutive, every sum and partial total feeds only the next
   add, and its gradients are f32 in the gradient region, it runs instead as
   loom_sumsq_parts over each contiguous span of those gradients (the 64-byte gaps are zero)
   and one loom_sum_parts of all the parts into the chain's total: deterministic, a few
   launches, a different order of additions (within f32 rounding of the chain's). */

static bool is_sumsq_kernel(const Func *k) {
  if (!k || !k->is_kernel || k->args.n != 1 || k->rets.n != 1 || k->ops.n != 2) return false;
  const Op *sq = k->ops.items[0], *rs = k->ops.items[1];
  const Value *x = k->args.items[0];
  return sq->kind == OP_SQUARE && sq->operands[0] == x && rs->kind == OP_REDUCE_SUM && rs->operands[0] == sq->results[0] &&
         rs->results[0]->type.rank == 0 && k->rets.items[0] == rs->results[0] && x->type.dtype == DT_F32;
}

static bool is_scalar_add_kernel(const Func *k) {
  if (!k || !k->is_kernel || k->args.n != 2 || k->rets.n != 1 || k->ops.n != 1) return false;
  const Op *ad = k->ops.items[0];
  return ad->kind == OP_ADD && ad->results[0]->type.rank == 0 && ad->results[0]->type.dtype == DT_F32 &&
         k->rets.items[0] == ad->results[0] && ad->operands[0] != ad->operands[1] &&
         ad->operands[0]->kind == VAL_ARG && ad->operands[1]->kind == VAL_ARG;
}

typedef struct {
  int last;               /* the op index of the chain's last add */
  int n_grads;
  int *grads;             /* global indices */
} NormChain;


/* The longest norm chain starting at op `at` (0 when there is none of 4 gradients or more). */
static int find_norm_chain(Lower *L, const Func *f, int at, NormChain *c) {
  memset(c, 0, sizeof *c);
  const Op *op0 = f->ops.items[at];
  if (op0->kind != OP_CALL || !is_sumsq_kernel(op0->callee)) return 0;
  c->grads = malloc(sizeof(int) * (size_t)f->ops.n);
  if (!c->grads) return 0;   /* unmerged is correct, only slower */
  const Value *total = NULL;   /* the chain's running total (or its only sum so far) */
  int i = at, pending = 0;     /* sums not yet added */
  const Value *sums[2] = {0};
  for (; i < f->ops.n; i++) {
    const Op *op = f->ops.items[i];
    if (op->kind != OP_CALL) break;
    if (is_sumsq_kernel(op->callee)) {
      const Value *g = op->operands[0];
      if (g->kind != VAL_GLOBAL || L->global_region[g->global->index] != RT_REGION_GRADS || pending == 2 ||
          cl_uses(f, op->results[0]) != 1)
        break;
      c->grads[c->n_grads++] = g->global->index;
      sums[pending++] = op->results[0];
      continue;
    }
    if (!is_scalar_add_kernel(op->callee)) break;
    const Value *a = op->operands[0], *b = op->operands[1];
    /* total + sum, or the first two sums */
    bool ok = (total && pending == 1 && ((a == total && b == sums[0]) || (b == total && a == sums[0]))) ||
              (!total && pending == 2 && ((a == sums[0] && b == sums[1]) || (a == sums[1] && b == sums[0])));
    if (!ok || (total && cl_uses(f, total) != 1)) break;
    total = op->results[0];
    pending = 0;
  }
  /* end on the last add: the sums after it are not the chain's */
  c->n_grads -= pending;
  c->last = i - 1 - pending;
  if (c->n_grads < 4 || !total) {
    free(c->grads);
    memset(c, 0, sizeof *c);
    return 0;
  }
  return 1;
}

/* The chain's steps: parts per span, then their sum into the chain's total. */
static int lower_norm_chain(Lower *L, Steps *s, NormChain *c) {
  const Func *f = L->f;
  const RtProgram *p = L->p;
  int n = c->n_grads, *order = c->grads;
  for (int a = 1; a < n; a++)   /* by offset in the region */
    for (int b = a; b > 0 && L->global_offset[order[b - 1]] > L->global_offset[order[b]]; b--) {
      int t = order[b];
      order[b] = order[b - 1];
      order[b - 1] = t;
    }
  L->op = f->ops.items[c->last];
  int64_t parts_at = 0;   /* floats of scratch so far */
  int rc = 0;
  for (int a = 0; a < n && !rc;) {
    int64_t start = L->global_offset[order[a]], end = start + 4 * p->globals[order[a]].n;
    int b = a + 1;
    for (; b < n && L->global_offset[order[b]] == cg_align64(end); b++) end = L->global_offset[order[b]] + 4 * p->globals[order[b]].n;
    int64_t count = (end - start) / 4, per = 8192, blocks = (count + per - 1) / per;
    if (blocks > 1024) per = (count + 1023) / 1024, blocks = (count + per - 1) / per;
    RtStep *st = cl_new_step(L, s, RT_STEP_KERNEL, 0, "");
    if (!st) return IR_EINPUT;
    snprintf(st->label, sizeof st->label, "gradient norm: sum of squares [%d tensors]", b - a);
    st->n_in = 1;
    st->bufs[0] = (RtBuf){.region = RT_REGION_GRADS, .storage = RT_ST_F32, .offset = start, .n = count};
    rc = cl_add_scratch(L, st, 4 * parts_at, blocks);
    st->i[0] = count;
    st->i[1] = per;
    st->block[0] = 256;
    st->grid[0] = (uint32_t)blocks;
    if (!rc) rc = cl_instantiate(L, st, "sumsq", "loom_sumsq_parts", (const int[]){0, -1}, NULL, "", 256);
    parts_at += blocks;
    a = b;
  }
  if (rc) return rc;
  RtStep *st = cl_new_step(L, s, RT_STEP_KERNEL, 0, "");
  if (!st) return IR_EINPUT;
  snprintf(st->label, sizeof st->label, "gradient norm: sum of %lld parts", (long long)parts_at);
  if (cl_add_scratch(L, st, 0, parts_at)) return IR_EINPUT;   /* the parts: input 0 */
  st->n_in = 1;
  st->n_out = 1;
  if (cl_buf_of(L, ((const Op *)f->ops.items[c->last])->results[0], &st->bufs[1])) return IR_EINPUT;
  st->i[0] = parts_at;
  st->block[0] = 256;
  return cl_instantiate(L, st, "sumparts", "loom_sum_parts", (const int[]){1, -1}, NULL, "", 256);
}

/* Op *i of the current function (not skipped) as its steps; *i moves to the last op it took
   (a norm chain takes several). */
int cl_lower_op(Lower *L, Steps *s, int *i) {
  const Func *f = L->f;
  L->op = f->ops.items[*i];
  L->op_index = *i;   /* lower_fuse.c's fusions look at the ops after it */
  NormChain nc;
  if (L->op->kind == OP_CALL && find_norm_chain(L, f, *i, &nc)) {
    int rc = lower_norm_chain(L, s, &nc);
    free(nc.grads);
    *i = nc.last;
    return rc;
  }
  if (L->gemm_at[*i] >= 0) return cl_lower_gemm_at(L, s, *i);
  if (L->leaf_into[*i].n && L->op->kind == OP_PAD) return cl_lower_tree_leaf(L, s, *i);
  L->adamw_in_place = L->op->kind == OP_ADAMW && adamw_in_place(L, *i);
  const Value *acc = L->op->kind == OP_CALL || L->op->kind == OP_MATMUL ? cl_fuse_grad_accum(L, f, *i) : NULL;
  switch (L->op->kind) {
  case OP_CALL: return acc ? cl_lower_cast_accumulate(L, s, acc) : cl_lower_call(L, s);
  case OP_MATMUL: return cl_lower_matmul_op(L, s, *i, acc);
  case OP_ATTENTION:
  case OP_ATTENTION_GRAD:
  case OP_ATTENTION_BLOCK:
  case OP_ATTENTION_BLOCK_GRAD: return cl_lower_attention(L, s);
  default: return cl_mesh_op(L->op) ? cl_lower_mesh_op(L, s) : lower_builtin(L, s);
  }
}

static int lower_func(Lower *L, const Func *f, RtFunc *rf) {
  L->f = f;
  L->op = NULL;
  L->scratch = 0;
  L->moe_pad_of = NULL;   /* lower_moe.c: nothing padded in this function yet */
  char why[256];
  if (cg_func_head(f, rf, why, sizeof why)) return cl_fail(L, "%s", why);
  for (int i = 0; i < f->args.n; i++) {
    if (cl_buf_of(L, f->args.items[i], &rf->args[i])) return IR_EINPUT;
    cg_describe_place(&((Value *)f->args.items[i])->type, &rf->arg_place[i]);
  }
  for (int i = 0; i < f->rets.n; i++)
    if (cl_buf_of(L, f->rets.items[i], &rf->rets[i])) return IR_EINPUT;
  Steps s = {0};
  int rc = 0;
  L->skip = calloc((size_t)(f->ops.n ? f->ops.n : 1), sizeof(bool));
  L->n_values = func_number((Func *)f);
  L->handle = calloc((size_t)L->n_values + 1, sizeof(int));
  L->value_buf = NULL;   /* lower_fuse.c: values held elsewhere than their arena place */
  L->value_has = NULL;
  L->n_handles = 0;
  if (!L->skip || !L->handle) {
    free(L->skip);
    free(L->handle);
    return cl_fail(L, "out of memory");
  }
  rc = cl_weight_copies_begin(L, f);   /* the casts that read copies, before any plan looks at buffers */
  if (!rc) rc = cl_plan_bgrad(L, f);
  for (int i = 0; i < f->ops.n && !rc; i++) {
    if (L->skip[i] || L->defer[i] >= 0) continue;   /* lowered with another op, or after one */
    rc = cl_lower_op(L, &s, &i);
  }
  L->op = NULL;
  free(L->skip);
  free(L->handle);
  free(L->defer);
  free(L->bgrad);
  free(L->bgrad_scratch);
  free(L->gemm_at);
  free(L->resid);
  free(L->sum_into);
  L->resid = NULL;
  L->sum_into = NULL;
  free(L->acc_into);
  free(L->acc_ld);
  free(L->leaf_into);
  free(L->leaf_of);
  L->acc_into = NULL;
  L->acc_ld = NULL;
  L->leaf_into = NULL;
  L->leaf_of = NULL;
  free(L->view);
  free(L->view_ld);
  L->view = NULL;
  L->view_ld = NULL;
  L->n_view = 0;
  L->bgrad_scratch = NULL;
  L->gemm_at = NULL;
  L->moved_value = NULL;
  L->skip = NULL;
  L->handle = NULL;
  L->defer = NULL;
  L->bgrad = NULL;
  cl_fuse_func_end(L, &s);   /* the norms' saved statistics placed past the scratch */
  rf->steps = s.items;
  rf->n_steps = s.n;
  rf->arena_bytes = L->scratch ? cg_align64(f->arena_bytes) + L->scratch : f->arena_bytes;
  if (!rc) cl_merge_updates(L, rf);
  return rc;
}

static void header(Str *o, const Module *m) {
  str_add(o, "/* CUDA translation unit of module @%s, generated by loom (codegen/cuda).\n", m->name ? m->name : "?");
  str_add(o, "   Compile as is with NVRTC or nvcc; every kernel is extern \"C\" and takes one LoomArgs\n"
              "   (runtime/program.h): buffer addresses (inputs, then outputs), then i[] and f[] of its step. */\n");
  /* what follows is the same in every module: the prelude of each NVRTC program (nvrtc.h) */
  str_add(o, "%s", NVRTC_PRELUDE_MARK);
  str_add(o, "struct LoomArgs {\n  void *buf[%d];\n  long long i[%d];\n  double f[4];\n};\n\n", RT_MAX_BUFS, RT_MAX_INTS);
  /* a benchmarking knob: flash-attention's numerics on tensor cores (see the prelude) */
  const char *round = getenv("LOOM_CUDA_ATTN_ROUND");
  if (round && !strcmp(round, "1")) str_add(o, "#define LOOM_ATTN_SPLIT 0   /* LOOM_CUDA_ATTN_ROUND=1 */\n\n");
  const char *families[] = {loom_cuh_common,      loom_cuh_norms,          loom_cuh_loss,       loom_cuh_data,
                            loom_cuh_optimizer,   loom_cuh_attention,      loom_cuh_attention_tc, loom_cuh_attention_sm90,
                            loom_cuh_attn_block,  loom_cuh_decode,         loom_cuh_moe,        loom_cuh_mesh};
  for (size_t i = 0; i < sizeof families / sizeof *families; i++) str_add(o, "%s", families[i]);
  str_add(o, "\n/* ---------------------------------------------------------------- kernels of this program */\n");
}

int cuda_lower(const Module *m, RtProgram *out, char **cuda_source, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (cuda_source) *cuda_source = NULL;
  if (err && errlen) err[0] = 0;
  Lower L = {.m = m, .p = out, .lower_op = cl_lower_op, .err = err, .errlen = errlen};
  int nf = m->funcs.n, ng = m->globals.n, rc = 0;
  L.global_offset = calloc((size_t)(ng ? ng : 1), sizeof(int64_t));
  L.global_region = calloc((size_t)(ng ? ng : 1), sizeof(RtRegion));
  L.fused_symbol = calloc((size_t)(nf ? nf : 1), sizeof(int));
  L.fused_fin = calloc((size_t)(nf ? nf : 1), sizeof(int));
  L.fused_info = calloc((size_t)(nf ? nf : 1), sizeof(CudaKernelInfo));
  out->globals = calloc((size_t)(ng ? ng : 1), sizeof(RtGlobal));
  int n_programs = 0;
  for (int i = 0; i < nf; i++)
    if (!((const Func *)m->funcs.items[i])->is_kernel) n_programs++;
  out->funcs = calloc((size_t)n_programs + 2, sizeof(RtFunc));   /* + the bf16 weight copies' + the first micro-batch's */
  if (!L.global_offset || !L.global_region || !L.fused_symbol || !L.fused_fin || !L.fused_info || !out->globals ||
      !out->funcs) {
    rc = cl_fail(&L, "out of memory");
    goto done;
  }
  for (int i = 0; i < nf; i++) L.fused_symbol[i] = L.fused_fin[i] = -1;

  /* globals: one region per kind, in placement order (cg_placement_order: a weight-decay
     group's AdamW updates merge), each dtype's size, 64-byte aligned */
  out->n_globals = ng;
  cg_describe_mesh(&m->mesh, out);
  int *order = cg_placement_order(m);
  if (!order) rc = cl_fail(&L, "out of memory");
  for (int k = 0; k < ng && !rc; k++) {
    int i = order[k];
    const Global *g = m->globals.items[i];
    const Type *t = &g->value->type;
    RtGlobal *rg = &out->globals[i];
    RtRegion r = cg_region_of(g);
    int64_t off = cg_align64(out->region_bytes[r]);
    if (cg_describe_global(g, &m->mesh, rg, off)) {
      rc = cl_fail(&L, "global $%s: the name is longer than %zu characters", g->name, sizeof rg->name - 1);
      break;
    }
    int st = cl_storage_of(t->dtype);
    if (st < 0) {
      rc = cl_fail(&L, "global $%s is %s: the CUDA backend holds only f32, bf16, f16, f8, i32 and bool tensors", g->name,
                 dtype_name(t->dtype));
      break;
    }
    out->region_bytes[r] = off + (int64_t)cl_st_size(st) * rg->n;
    L.global_offset[i] = off;
    L.global_region[i] = r;
  }
  free(order);
  cg_describe_pipe(m, out);   /* the schedule and each global's stage: a pipeline needs no IR to run */
  for (int r = 0; r < RT_REGION_COUNT; r++) out->region_bytes[r] = cg_align64(out->region_bytes[r]);
  if (!rc) rc = cl_weight_copies_plan(&L);   /* the parameters with a bf16 copy (lower_fuse.c) */

  /* program functions (kernels are compiled as their calls are met) */
  for (int i = 0; i < nf && !rc; i++) {
    const Func *f = m->funcs.items[i];
    if (f->is_kernel) continue;
    rc = lower_func(&L, f, &out->funcs[out->n_funcs++]);
  }
  if (!rc) {   /* the function that writes the copies, when there are any */
    RtFunc wc;
    rc = cl_weight_copies_func(&L, &wc);
    if (!rc && wc.n_steps) out->funcs[out->n_funcs++] = wc;
  }
  if (!rc) rc = cl_first_grads_func(&L, out);   /* @grad_step writing the gradients (lower_grads.c) */
  /* kernels no program calls still belong to the translation unit (--emit=cuda shows them) */
  for (int i = 0; i < nf && !rc; i++) {
    const Func *f = m->funcs.items[i];
    if (f->is_kernel) {
      L.f = NULL;
      L.op = NULL;
      rc = cl_fused_kernel(&L, i);
    }
  }
  if (!rc && L.text.oom) rc = cl_fail(&L, "out of memory");
  if (!rc) {
    out->n_kernels = L.n_names;
    out->kernel_names = calloc((size_t)(L.n_names ? L.n_names : 1), sizeof *out->kernel_names);
    if (!out->kernel_names) rc = cl_fail(&L, "out of memory");
    else if (L.n_names) memcpy(out->kernel_names, L.names, sizeof *out->kernel_names * (size_t)L.n_names);
  }
  if (!rc && cuda_source) {
    Str tu = {0};
    header(&tu, m);
    str_add(&tu, "%s", L.text.s ? L.text.s : "");
    if (tu.oom) {
      str_free(&tu);
      rc = cl_fail(&L, "out of memory");
    } else {
      *cuda_source = tu.s;
    }
  }

done:
  free(L.global_offset);
  free(L.global_region);
  free(L.fused_symbol);
  free(L.fused_fin);
  free(L.fused_info);
  free(L.copy_offset);
  free(L.copy_dtype);
  free(L.names);
  str_free(&L.text);
  for (int b = 0; b < L.n_bodies; b++) free(L.bodies[b]);
  free(L.bodies);
  free(L.body_hash);
  free(L.body_symbol);
  free(L.body_fin);
  if (rc) rt_program_free(out);
  return rc;
}

int cuda_emit(const Module *m, char **source, char *err, size_t errlen) {
  RtProgram p;
  int rc = cuda_lower(m, &p, source, err, errlen);
  if (!rc) rt_program_free(&p);
  return rc;
}
