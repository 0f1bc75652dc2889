/* passes/memory_cuda.c — the bytes the CUDA lowering adds past a function's arena, so that the
 * memory plan (`loom ir --memory`, `loom plan`, `loom train`'s check before a run) counts what
 * the CUDA runtime allocates (docs/memory.md, "The CUDA target's stats area and scratch").
 *
 * codegen/cuda lays out, past the memory plan's arena (RtFunc.arena_bytes = the arena, 64-byte
 * aligned, + scratch + the stats area):
 *   - the stats area (lower_fuse.c, lower_attn.c), each entry its own, 64-byte aligned:
 *       a layer norm or RMS norm whose gradient is in the same function: (mean, rstd) a row
 *         and a counter, 4 (2 rows + 1) bytes (LOOM_CUDA_NO_NORM_STATS=1: none);
 *       an attention on tensor cores whose gradient is in the same function: the log-sum-exp
 *         a row, 4 B H T bytes (aligned), and O in f32, 4 B T H D (LOOM_CUDA_NO_ATTN_LSE=1: none);
 *       a cross-entropy fused with its gradient: the loss rows, 4 bytes each
 *         (LOOM_CUDA_NO_XENT_FUSION=1: none);
 *   - scratch, shared by the function's steps, so its size is the largest any step takes: the
 *     norm gradients' per-block parts of dw (db), attention gradients' L and Dsum rows, and the
 *     gradient norm's per-block parts (counted as for one span of every gradient, side by side
 *     in their region, as a single rank's program lays them out).  Smaller users (split reductions, a bias
 *     gradient held for its users, MoE counting) are not counted; the batched expert matmuls'
 *     padded operands (LOOM_CUDA_MOE_GEMM=batched, codegen/cuda/lower_moe.c) are: tests/cli/cuda_memory.sh
 *     checks the total against what the emulated device allocates, on models where these
 *     rules are the whole story.
 * The rules mirror the lowering's (the same scans, the same switches); the lowering's
 * conditions that depend on the memory layout (the fused classifier's slot_free) are taken as
 * met, so the figure is never below the allocation.  Keep them in step with codegen/cuda: the
 * CLI test above fails when they drift. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

#define ALIGN64(x) (((x) + 63) / 64 * 64)

static bool env_on(const char *name) {
  const char *e = getenv(name);
  return e && *e && strcmp(e, "0");
}

static int64_t last_dim(const Type *t) { return t->rank ? t->dims[t->rank - 1] : 1; }

/* lower_fuse.c's cl_fuse_norm_fwd: the norm op i saves (mean, rstd) for a gradient later in f. */
static bool norm_saves(const Func *f, int i) {
  const Op *op = f->ops.items[i];
  bool ln = op->kind == OP_LAYERNORM;
  for (int k = i + 1; k < f->ops.n; k++) {
    const Op *g = f->ops.items[k];
    if (g->kind == op->kind && g->operands[0] == op->operands[0] && g->operands[1] == op->operands[1]) return false;
    if (g->kind == (ln ? OP_LAYERNORM_GRAD : OP_RMSNORM_GRAD) && g->operands[1] == op->operands[0] &&
        g->operands[2] == op->operands[1] && op_float(g, "eps") == op_float(op, "eps"))
      return true;
  }
  return false;
}

/* lower_attn.c's tensor_cores and lse_reader: the attention op i runs on tensor cores and saves
   its log-sum-exp and O for a gradient later in f. */
static bool attention_saves(const Func *f, int i) {
  const Op *op = f->ops.items[i];
  if (op->n_operands < 3) return false;
  const Type *q = &op->operands[0]->type, *kt = &op->operands[1]->type;
  DType dt = q->dtype;
  for (int k = 0; k < 3; k++)
    if (op->operands[k]->type.dtype != dt) return false;
  if ((dt != DT_BF16 && dt != DT_F16) || q->rank != 4 || kt->rank != 4) return false;
  int64_t B = q->dims[0], T = q->dims[1], H = q->dims[2], D = q->dims[3], S = kt->dims[1], KV = kt->dims[2];
  bool small = T * H * D < INT32_MAX && S * KV * D < INT32_MAX && B * H < INT32_MAX;
  if (D % 16 || !small || !(op_float(op, "scale") > 0)) return false;
  for (int k = i + 1; k < f->ops.n; k++) {
    const Op *g = f->ops.items[k];
    if (g->kind == OP_ATTENTION && g->operands[0] == op->operands[0] && g->operands[1] == op->operands[1] &&
        g->operands[2] == op->operands[2])
      return false;
    if (g->kind == OP_ATTENTION_GRAD && g->n_operands >= 4 && g->operands[1] == op->operands[0] &&
        g->operands[2] == op->operands[1] && g->operands[3] == op->operands[2])
      return op_bool(g, "causal") == op_bool(op, "causal") && op_int(g, "window") == op_int(op, "window") &&
             op_float(g, "scale") == op_float(op, "scale") && g->operands[0]->type.dtype == dt;
  }
  return false;
}

/* lower_fuse.c's cl_fuse_xent, but for slot_free (the gradient's buffer free until it is
   written): the cross-entropy op i runs with its gradient and keeps its loss rows apart. */
static bool xent_fuses(const Func *f, int i) {
  const Op *op = f->ops.items[i];
  const Value *logits = op->operands[0], *tg = op->operands[1], *ce = op->results[0];
  int j = -1;
  for (int k = i + 1; k < f->ops.n && j < 0; k++) {
    const Op *g = f->ops.items[k];
    if (g->kind == OP_CROSS_ENTROPY_GRAD && g->operands[1] == logits && g->operands[2] == tg) j = k;
  }
  if (j < 0) return false;
  const Value *dl = ((const Op *)f->ops.items[j])->operands[0];
  int c = -1;
  bool sliced = false;
  for (int k = j - 1; k >= 0 && c < 0; k--) {
    const Op *d = f->ops.items[k];
    if (!d->n_results || d->results[0] != dl) continue;
    if (d->kind == OP_SHARD_SLICE && !sliced) {
      dl = d->operands[0];
      sliced = true;
      k = j;
      continue;
    }
    c = k;
  }
  if (c < 0 || ((const Op *)f->ops.items[c])->kind != OP_CONSTANT || dl->type.dtype != DT_F32) return false;
  for (int r = 0; r < f->rets.n; r++)
    if (f->rets.items[r] == ce) return false;
  for (int k = i + 1; k < f->ops.n; k++) {   /* read by someone (cl_uses >= 1) */
    const Op *u = f->ops.items[k];
    for (int q = 0; q < u->n_operands; q++)
      if (u->operands[q] == ce) return true;
  }
  return false;
}

/* lower.c's is_sumsq_kernel: a call of sum(square(x)) over an f32 x. */
static bool sumsq_call(const Op *op) {
  const Func *k = op->kind == OP_CALL ? op->callee : NULL;
  if (!k || !k->is_kernel || k->args.n != 1 || k->rets.n != 1 || k->ops.n != 2) return false;
  const Op *sq = k->ops.items[0], *rs = k->ops.items[1];
  return sq->kind == OP_SQUARE && rs->kind == OP_REDUCE_SUM && rs->operands[0] == sq->results[0] &&
         ((const Value *)k->args.items[0])->type.dtype == DT_F32 && op->operands[0]->kind == VAL_GLOBAL;
}

/* codegen/cuda/lower_moe.c (LOOM_CUDA_MOE_GEMM=batched): a grouped matmul whose counts are
   moe_count's with a capacity, one group an expert (at most 1024), pads its two operands (the
   forward: x and the product) to [E, cap, ...] in scratch, side by side. */
static int64_t moe_padded_bytes(const Op *op) {
  bool wg = op->kind == OP_GROUPED_MATMUL_WGRAD;
  const Value *a = op->operands[0], *b = op->operands[1], *cnt = op->operands[2];
  if (a->type.rank != 2 || b->type.rank != (wg ? 2 : 3) || op->results[0]->type.rank < 2) return 0;
  int64_t E = wg ? op_int(op, "experts") : b->type.dims[0];
  if (cnt->kind != VAL_RESULT || !cnt->def || cnt->def->kind != OP_MOE_COUNT || op_int(cnt->def, "experts") != E ||
      type_numel(&cnt->type) != E || E > 1024)
    return 0;
  int64_t cap = op_int(cnt->def, "capacity");
  if (cap <= 0) return 0;
  /* first: dy [R,N] (wgrad) or x [R,K]; second: x [R,K] (wgrad) or y [R,N]; each in 4-byte
     units from a 64-byte aligned start (steps.c's cl_add_scratch) */
  const Value *second = wg ? b : op->results[0];
  int64_t first = E * cap * a->type.dims[1] * dtype_size(a->type.dtype);
  int64_t next = E * cap * second->type.dims[1] * dtype_size(second->type.dtype);
  return ALIGN64(ALIGN64(first) + (next + 3) / 4 * 4);
}

void memory_cuda_extra_parts(const Func *f, int target, int64_t *stats, int64_t *scratch) {
  *stats = *scratch = 0;
  if (target != TARGET_CUDA || f->is_kernel) return;
  bool norms = !env_on("LOOM_CUDA_NO_NORM_STATS"), lse = !env_on("LOOM_CUDA_NO_ATTN_LSE"),
       xent = !env_on("LOOM_CUDA_NO_XENT_FUSION");
  const char *mg = getenv("LOOM_CUDA_MOE_GEMM");
  bool moe_batched = mg && !strcmp(mg, "batched");
  int64_t st = 0, scr = 0, gnorm = 0;
  for (int i = 0; i < f->ops.n; i++) {
    const Op *op = f->ops.items[i];
    int64_t need = 0;
    switch (op->kind) {
    case OP_LAYERNORM:
    case OP_RMSNORM:
      if (norms && norm_saves(f, i)) {
        int64_t D = last_dim(&op->operands[0]->type), rows = D ? type_numel(&op->operands[0]->type) / D : 0;
        st += ALIGN64(4 * (2 * rows + 1));
      }
      break;
    case OP_LAYERNORM_GRAD:
    case OP_RMSNORM_GRAD: {   /* the per-block parts of dw (db): min(rows, 256) blocks */
      int64_t D = last_dim(&op->operands[1]->type), rows = D ? type_numel(&op->operands[1]->type) / D : 0;
      int64_t nb = rows < 1 ? 1 : rows > 256 ? 256 : rows;
      need = ALIGN64(4 * nb * (op->kind == OP_LAYERNORM_GRAD ? 2 : 1) * D);
      break;
    }
    case OP_ATTENTION:
      if (lse && attention_saves(f, i)) {
        const Type *q = &op->operands[0]->type;
        st += ALIGN64(ALIGN64(4 * q->dims[0] * q->dims[2] * q->dims[1]) + 4 * type_numel(q));
      }
      break;
    case OP_ATTENTION_GRAD:   /* L and Dsum a row (Dsum alone from a saved log-sum-exp: the same end) */
      if (op->n_operands >= 2 && op->operands[1]->type.rank == 4) {
        const Type *q = &op->operands[1]->type;
        int64_t rows = q->dims[0] * q->dims[2] * q->dims[1];
        need = ALIGN64(ALIGN64(4 * rows) + 4 * rows);
      }
      break;
    case OP_CROSS_ENTROPY:
      if (xent && xent_fuses(f, i)) st += ALIGN64(4 * type_numel(&op->results[0]->type));
      break;
    case OP_CALL:
      if (sumsq_call(op)) {   /* the gradient norm's parts: up to 8192 elements a block, 1024 blocks */
        gnorm += (type_numel(&op->operands[0]->type) + 15) / 16 * 16;   /* the tensors side by side, 64-byte aligned */
        int64_t per = 8192, blocks = (gnorm + per - 1) / per;
        if (blocks > 1024) per = (gnorm + 1023) / 1024, blocks = (gnorm + per - 1) / per;
        need = ALIGN64(4 * blocks);
      }
      break;
    case OP_GROUPED_MATMUL:
    case OP_GROUPED_MATMUL_WGRAD:
      if (moe_batched) need = moe_padded_bytes(op);
      break;
    default: break;
    }
    if (need > scr) scr = need;
  }
  *stats = st;
  *scratch = scr;
}

int64_t memory_cuda_extra(const Func *f, int target) {
  int64_t st, scr;
  memory_cuda_extra_parts(f, target, &st, &scr);
  int64_t s = st ? ALIGN64(scr) + st : scr;   /* lower.c: the arena, aligned, + scratch + stats */
  return s ? ALIGN64(f->arena_bytes) - f->arena_bytes + s : 0;
}

int64_t memory_func_arena(const Func *f, int target) {
  return f->arena_bytes < 0 ? f->arena_bytes : f->arena_bytes + memory_cuda_extra(f, target);
}
