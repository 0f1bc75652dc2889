/* codegen/cuda/lower_attn.c — attention on CUDA: attention and attention_grad as the
 * flash-attention kernels of kernels/attention_tc.cuh (tensor cores for bf16/f16; Hopper's
 * in attention_sm90.cuh) and kernels/attention.cuh (CUDA cores, f32), attention_block and attention_block_grad (context parallelism's ring steps)
 * as those of kernels/attn_block.cuh.
 *
 * Split from lower.c (issue 32): the dispatcher reaches this file through cl_lower_attention,
 * and this file calls only the step builders of steps.c, never lower.c.
 */
#include "codegen/cuda/cuda_internal.h"
#include "codegen/lower_common.h"

#define IDX(...) ((const int[]){__VA_ARGS__, -1})

/* flash attention: the head size as a template argument */
static int attention_dims(Lower *L, const Type *q, const Type *k) {
  int64_t Dh = q->dims[3], H = q->dims[2], KV = k->dims[2], T = q->dims[1], S = k->dims[1];
  if (Dh % 8 || Dh < 8 || Dh > 128)
    return cl_fail(L, "head size %lld: the CUDA flash-attention kernels take head sizes that are multiples of 8 up "
                 "to 128", (long long)Dh);
  if (KV <= 0 || H % KV) return cl_fail(L, "%lld query heads do not share %lld kv heads evenly", (long long)H, (long long)KV);
  if ((T + 63) / 64 > 65535 || (S + 31) / 32 > 65535 || q->dims[0] * H > INT32_MAX)
    return cl_fail(L, "the sequence (%lld) or batch x heads is too large for one launch", (long long)T);
  return 0;
}

static uint32_t fa_smem(int which, int64_t D) {
  int64_t LD = D + 1;
  switch (which) {
  case 0: return (uint32_t)(4 * (3 * 64 * LD + 64 * 65));                      /* forward */
  case 1: return (uint32_t)(4 * (2 * 64 * LD + 2 * 32 * LD + 64 * 33));          /* dq */
  default: return (uint32_t)(4 * (2 * 32 * LD + 2 * 64 * LD + 2 * 32 * 65 + 128)); /* dk dv */
  }
}

/* Attention on tensor cores (loom_attn_*_tc): the first n_operands buffers (q, k, v; dout,
   q, k, v) all bf16 or all f16, the head size a multiple of 16.  f32 attention stays on CUDA cores, in f32 (TF32 would not hold
   the f32 results to 1e-4 of the reference). */
static bool tensor_cores(const RtStep *st, int n_operands, int64_t D) {
  int t = st->bufs[0].storage;
  for (int k = 1; k < n_operands; k++)
    if (st->bufs[k].storage != t) return false;
  /* their indices within a (batch, head) are 32-bit, their softmax in base 2 takes scale > 0 */
  const int64_t *i = st->i;   /* B, T, H, D, S, KV */
  bool small = i[1] * i[2] * i[3] < INT32_MAX && i[4] * i[5] * i[3] < INT32_MAX && i[0] * i[2] < INT32_MAX;
  return (t == RT_ST_BF16 || t == RT_ST_F16) && D % 16 == 0 && small && st->f[0] > 0;
}

/* attention_block (one step: q k v -> o lse) and attention_block_grad (two: dout q k v lse
   delta -> dq, then the same inputs -> dk dv): loom_attnblk_* of kernels/attn_block.cuh, on
   CUDA cores in f32 whatever the inputs' dtypes (the outputs are f32; no scratch).  i[] is program.h's
   RT_B_ATTN_BLOCK layout and one slot more: i[CUDA_ATTN_BLOCK_COORD_INT] (11), the rank's
   coordinate on the seq axis, which the runtime writes before the launch (RtStep.coord_at;
   rope's slot is CUDA_ROPE_COORD_INT). */
static int lower_attention_block(Lower *L, Steps *s) {
  const Op *op = L->op;
  bool grad = op->kind == OP_ATTENTION_BLOCK_GRAD;
  const Type *q = &op->operands[grad]->type, *kt = &op->operands[grad + 1]->type;
  int64_t axis1 = 0;
  if (attention_dims(L, q, kt) || cl_seq_axis1(L, &axis1)) return IR_EINPUT;
  int64_t B = q->dims[0], T = q->dims[1], H = q->dims[2], D = q->dims[3], S = kt->dims[1], KV = kt->dims[2];
  const int64_t ints[CUDA_ATTN_BLOCK_COORD_INT + 2] = {
      B, T, H, D, S, KV, op_bool(op, "causal"), axis1, op_int(op, "seq_n"), op_bool(op, "zigzag"),
      op_int(op, "kv_shift"), 0 /* the coordinate: see above */, op_int(op, "window")};
  char extra[24], suffix[24];
  snprintf(extra, sizeof extra, "%lld", (long long)D);
  snprintf(suffix, sizeof suffix, "_%lld", (long long)D);
  static const char *const base[3] = {"attnblk_fwd", "attnblk_dq", "attnblk_dkdv"};
  static const char *const label[3] = {"", " (dq)", " (dk dv)"};
  for (int which = grad; which < (grad ? 3 : 1); which++) {   /* 0 forward; 1 dq, 2 dk dv */
    RtStep *st = cl_new_step(L, s, RT_STEP_KERNEL, 0, label[which]);
    if (!st || cl_set_bufs(L, st, (const Value *const *)op->operands, op->n_operands, false)) return IR_EINPUT;
    /* the outputs: o, lse; dq; dk, dv */
    int first = which == 2, n_out = which == 1 ? 1 : 2;
    for (int r = 0; r < n_out; r++)
      if (cl_buf_of(L, op->results[first + r], &st->bufs[st->n_in + st->n_out++])) return IR_EINPUT;
    memcpy(st->i, ints, sizeof ints);
    if (axis1) {
      st->coord_at = CUDA_ATTN_BLOCK_COORD_INT + 1;
      st->coord_axis = (uint8_t)(axis1 - 1);
    }
    st->f[0] = op_float(op, "scale");
    st->block[0] = 128;   /* dk dv: a block per 32 keys and kv head; the others per 64 queries and head */
    st->grid[0] = (uint32_t)(B * (which == 2 ? KV : H));
    st->grid[1] = which == 2 ? cl_clamp_grid((S + 31) / 32, 65535) : cl_clamp_grid((T + 63) / 64, 65535);
    /* the tiles of loom_attn_fwd, _bwd_dq, _bwd_dkdv, then the positions of the key tile (64
       keys, 32 for dq) or of the query tile (64, dk dv) */
    st->smem = fa_smem(which, D) + 8 * (which == 1 ? 32 : 64);
    char tmpl[32];
    snprintf(tmpl, sizeof tmpl, "loom_%s", base[which]);
    /* templated on the storage of the inputs (q k v; dout q k v); the outputs are f32 */
    if (cl_instantiate(L, st, base[which], tmpl, grad ? (const int[]){0, 1, 2, 3, -1} : (const int[]){0, 1, 2, -1},
                    extra, suffix, 128))
      return IR_EINPUT;
  }
  return 0;
}

/* ---------------------------------------------------------------- the saved log-sum-exp

   An attention on tensor cores whose attention_grad later in the same function reads the same
   q, k and v (same causal, window and scale; dout in their dtype) saves, for it, each row's
   log-sum-exp L2 and O before its rounding (f32), in the function's stats area past the arena
   (lower_fuse.c's, as the norms' mean and rstd: each attention its own, nothing between writes
   it).  The gradient's dq kernel then takes Dsum = dout . O and runs one pass (3 tile products
   a key tile instead of 5: no recomputation of L2 and Dsum), and dk dv read the forward's L2.
   Not when the forward and the gradient are in different functions (pipeline chunks,
   recomputation): they keep the two passes.  LOOM_CUDA_NO_ATTN_LSE=1 keeps them everywhere
   (the tests' unfused program).  The f32 attention on CUDA cores keeps them too. */

static bool no_attn_lse(void) { return cl_env_on("LOOM_CUDA_NO_ATTN_LSE"); }

/* The attention_grad that reads attention op i (tensor cores on both sides), or -1. */
static int lse_reader(Lower *L, int i) {
  const Func *f = L->f;
  const Op *op = f->ops.items[i];
  DType dt = op->operands[0]->type.dtype;
  for (int k = 0; k < 3; k++)
    if (op->operands[k]->type.dtype != dt) return -1;
  for (int k = i + 1; k < f->ops.n; k++) {
    const Op *g = f->ops.items[k];
    bool same = g->n_operands >= 4 && g->operands[1] == op->operands[0] && g->operands[2] == op->operands[1] &&
                g->operands[3] == op->operands[2];
    if (g->kind == OP_ATTENTION && g->operands[0] == op->operands[0] && g->operands[1] == op->operands[1] &&
        g->operands[2] == op->operands[2])
      return -1;   /* another forward of the same q k v first (recomputation): that one saves them */
    if (g->kind == OP_ATTENTION_GRAD && same) {
      if (op_bool(g, "causal") != op_bool(op, "causal") || op_int(g, "window") != op_int(op, "window") ||
          op_float(g, "scale") != op_float(op, "scale") || g->operands[0]->type.dtype != dt)
        return -1;
      return k;
    }
  }
  return -1;
}

/* LOOM_CUDA_WGMMA=1: the forward, dq (its one-pass form, from the forward's saved L2 and O)
   and dk dv on Hopper's warpgroup MMA (kernels/attention_sm90.cuh), for tensor-core attention
   at head size 64 or 128 without a sliding window, their tiles copied by tensor maps
   (wgmma_tmaps).  Opt-in, for sm_90a
   devices only (the lowering does not see the device; elsewhere the kernel traps): its
   shared-memory layouts are checked against the emulated device's reading of the PTX ISA, not
   yet on a GPU (tests/gpu/OWED.md). */
static bool wgmma_forward(int64_t D, int64_t window, int64_t T, int64_t S) {
  return cl_env_on("LOOM_CUDA_WGMMA") && (D == 64 || D == 128) && (window <= 0 || window >= T + S);
}

/* The wgmma kernels copy their tiles with tensor maps (program.h's RT_TMAP_INT): map m is
   buffer m, [batch][rows][heads][D] (q and dout: T rows of H heads; k and v: S of KV), in
   boxes of `box` rows of one head, 64 columns a copy. */
static void wgmma_tmaps(RtStep *st, int n, const int64_t box[]) {
  const int64_t B = st->i[0], T = st->i[1], H = st->i[2], D = st->i[3], S = st->i[4], KV = st->i[5];
  st->tmaps = (uint8_t)n;
  for (int m = 0; m < n; m++) {
    /* the forward's q k v, or the dk dv kernel's dout q k v */
    const bool kv = n == 3 ? m > 0 : m > 1;
    int64_t *f = &st->i[RT_TMAP_INT + RT_TMAP_FIELDS * m];
    const int64_t fields[RT_TMAP_FIELDS] = {m, D, kv ? KV : H, kv ? S : T, B, box[m]};
    memcpy(f, fields, sizeof fields);
  }
}

/* attention: one step, q k v -> out [L2 O].  i: B, T, H, D, S, KV, causal, window[, save];  f: scale */
static int lower_attention_fwd(Lower *L, Steps *s) {
  const Op *op = L->op;
  const Type *q = &op->operands[0]->type, *kt = &op->operands[1]->type;
  char extra[24], suffix[24];
  if (attention_dims(L, q, kt)) return IR_EINPUT;
  RtStep *st = cl_new_step(L, s, RT_STEP_KERNEL, 0, "");
  if (!st || cl_set_operand_bufs(L, st)) return IR_EINPUT;
  const int64_t ints[8] = {q->dims[0], q->dims[1], q->dims[2], q->dims[3], kt->dims[1], kt->dims[2],
                           op_bool(op, "causal"), op_int(op, "window")};
  memcpy(st->i, ints, sizeof ints);
  st->f[0] = op_float(op, "scale");
  st->block[0] = 128;
  st->grid[0] = (uint32_t)(q->dims[0] * q->dims[2]);
  st->grid[1] = cl_clamp_grid((q->dims[1] + 63) / 64, 65535);
  st->smem = fa_smem(0, q->dims[3]);
  snprintf(extra, sizeof extra, "%lld", (long long)q->dims[3]);
  snprintf(suffix, sizeof suffix, "_%lld", (long long)q->dims[3]);
  if (tensor_cores(st, 3, q->dims[3])) {   /* two stages of K and V tiles, 64 rows of D + 8 */
    st->smem = (uint32_t)(2 * 2 * 64 * (q->dims[3] + 8) * 2);
    const int64_t D = q->dims[3];
    const bool wg = wgmma_forward(D, op_int(op, "window"), q->dims[1], kt->dims[1]);
    if (wg) {   /* 128 query rows a block (a producer warpgroup, two consumers); Q, three stages of K and V, mbarriers */
      st->block[0] = 384;
      st->grid[1] = cl_clamp_grid((q->dims[1] + 127) / 128, 65535);
      st->smem = (uint32_t)(1024 + 128 * D * 2 + 3 * 2 * 64 * D * 2 + 56);
      size_t n = strlen(st->label);
      snprintf(st->label + n, sizeof st->label - n, " (wgmma)");
    }
    int j = no_attn_lse() ? -1 : lse_reader(L, L->op_index);
    int64_t rows = q->dims[0] * q->dims[2] * q->dims[1], n_o = type_numel(q);
    int64_t at = j < 0 || st->n_in + st->n_out + 2 > RT_MAX_BUFS ? -1 : cl_stats_reserve(L, j, cg_align64(4 * rows) + 4 * n_o);
    if (at >= 0) {   /* L2 per row (b, h, t), then O as out's layout, f32 */
      st->bufs[st->n_in + st->n_out++] = cl_stats_buf(at, rows, RT_ST_F32);
      st->bufs[st->n_in + st->n_out++] = cl_stats_buf(at + cg_align64(4 * rows), n_o, RT_ST_F32);
      st->i[8] = 1;
      size_t n = strlen(st->label);
      snprintf(st->label + n, sizeof st->label - n, " (+ L2, O for the gradient)");
    }
    if (wg) {
      wgmma_tmaps(st, 3, (const int64_t[]){128, 64, 64});
      return cl_instantiate(L, st, "attn_fwd_wg", "loom_attn_fwd_wg", IDX(0, 1, 2, 3), extra, suffix, 384);
    }
    return cl_instantiate(L, st, "attn_fwd_tc", "loom_attn_fwd_tc", IDX(0, 1, 2, 3), extra, suffix, 128);
  }
  return cl_instantiate(L, st, "attn_fwd", "loom_attn_fwd", IDX(0, 1, 2, 3), extra, suffix, 128);
}

/* attention_grad: two steps, dout q k v -> dq (and each row's L2 and Dsum into scratch), then
   dout q k v L2 Dsum -> dk dv.  With the forward's L2 and O saved (see above): dout q k v L2 O
   -> dq Dsum in one pass, then dk dv from the forward's L2. */
static int lower_attention_grad(Lower *L, Steps *s) {
  const Op *op = L->op;
  char extra[24], suffix[24];
  const Type *q = &op->operands[1]->type, *kt = &op->operands[2]->type;
  if (attention_dims(L, q, kt)) return IR_EINPUT;
  int64_t B = q->dims[0], T = q->dims[1], H = q->dims[2], D = q->dims[3], S = kt->dims[1], KV = kt->dims[2];
  int64_t rows = B * H * T, l_at = 0, d_at = cg_align64(4 * rows);
  int64_t ints[8] = {B, T, H, D, S, KV, op_bool(op, "causal"), op_int(op, "window")};
  snprintf(extra, sizeof extra, "%lld", (long long)D);
  snprintf(suffix, sizeof suffix, "_%lld", (long long)D);
  /* 1: dq, L, Dsum (or dq, Dsum from the saved L2 and O) */
  const int64_t saved_at = cl_stats_of(L, L->op_index);
  RtStep *st = cl_new_step(L, s, RT_STEP_KERNEL, 0, saved_at >= 0 ? " (dq, saved L2 and O)" : " (dq)");
  if (!st || cl_set_bufs(L, st, (const Value *const *)op->operands, 4, false)) return IR_EINPUT;
  if (saved_at >= 0) {
    st->bufs[st->n_in++] = cl_stats_buf(saved_at, rows, RT_ST_F32);
    st->bufs[st->n_in++] = cl_stats_buf(saved_at + cg_align64(4 * rows), B * T * H * D, RT_ST_F32);
    st->n_out = 1;
    if (cl_buf_of(L, op->results[0], &st->bufs[6]) || cl_add_scratch(L, st, d_at, rows)) return IR_EINPUT;
  } else {
    st->n_out = 1;
    if (cl_buf_of(L, op->results[0], &st->bufs[4]) || cl_add_scratch(L, st, l_at, rows) || cl_add_scratch(L, st, d_at, rows))
      return IR_EINPUT;
  }
  memcpy(st->i, ints, sizeof ints);
  st->i[8] = saved_at >= 0;
  st->f[0] = op_float(op, "scale");
  st->block[0] = 128;
  st->grid[0] = (uint32_t)(B * H);
  st->grid[1] = cl_clamp_grid((T + 63) / 64, 65535);
  st->smem = fa_smem(1, D);
  bool tc = tensor_cores(st, 4, D);
  if (saved_at >= 0 && !tc) return cl_fail(L, "internal error: the saved log-sum-exp of an attention off the tensor cores");
  int64_t tile = D <= 64 ? 64 : 32;   /* the tensor-core kernels' key (dq) and query (dk dv) tiles */
  if (tc) st->smem = (uint32_t)(8 * tile * (D + 8));   /* two stages of K and V tiles */
  if (tc && saved_at >= 0 && wgmma_forward(D, op_int(op, "window"), T, S)) {   /* a producer warpgroup and a consumer; Q, dO, stages of K, V */
    st->block[0] = 256;
    const int64_t ring = D == 128 ? 3 : 2;   /* stages: dq is pipelined at D 128 (attention_sm90.cuh) */
    st->smem = (uint32_t)(1024 + 2 * 64 * D * 2 + ring * 2 * 64 * D * 2 + 8 * (2 * ring + 1));
    size_t n = strlen(st->label);
    snprintf(st->label + n, sizeof st->label - n, " (wgmma)");
    wgmma_tmaps(st, 4, (const int64_t[]){64, 64, 64, 64});   /* dout q k v, as dk dv's */
    if (cl_instantiate(L, st, "attn_dq_wg", "loom_attn_bwd_dq_wg", IDX(0, 1, 2, 3, 6), extra, suffix, 256)) return IR_EINPUT;
  } else if (tc ? cl_instantiate(L, st, "attn_dq_tc", "loom_attn_bwd_dq_tc", IDX(0, 1, 2, 3, saved_at >= 0 ? 6 : 4), extra,
                                 suffix, 128)
                : cl_instantiate(L, st, "attn_dq", "loom_attn_bwd_dq", IDX(0, 1, 2, 3, 4), extra, suffix, 128))
    return IR_EINPUT;
  RtBuf lb = st->bufs[saved_at >= 0 ? 4 : 5], db = st->bufs[saved_at >= 0 ? 7 : 6];
  /* 2: dk, dv */
  st = cl_new_step(L, s, RT_STEP_KERNEL, 0, " (dk dv)");
  if (!st || cl_set_bufs(L, st, (const Value *const *)op->operands, 4, false)) return IR_EINPUT;
  st->bufs[4] = lb;
  st->bufs[5] = db;
  st->n_in = 6;
  st->n_out = 2;
  if (cl_buf_of(L, op->results[1], &st->bufs[6]) || cl_buf_of(L, op->results[2], &st->bufs[7])) return IR_EINPUT;
  memcpy(st->i, ints, sizeof ints);
  st->f[0] = op_float(op, "scale");
  st->block[0] = 128;
  st->grid[0] = (uint32_t)(B * KV);
  st->grid[1] = cl_clamp_grid((S + 31) / 32, 65535);
  st->smem = fa_smem(2, D);
  if (tc && wgmma_forward(D, op_int(op, "window"), T, S)) {   /* a producer warpgroup and a consumer; K, V, stages of Q, dO */
    st->grid[1] = cl_clamp_grid((S + 63) / 64, 65535);
    st->block[0] = 256;
    const int64_t ring = 3;   /* stages: dk dv is pipelined (attention_sm90.cuh) */
    st->smem = (uint32_t)(1024 + 2 * 64 * D * 2 + ring * 2 * 64 * D * 2 + 8 * (2 * ring + 1));
    size_t n = strlen(st->label);
    snprintf(st->label + n, sizeof st->label - n, " (wgmma)");
    wgmma_tmaps(st, 4, (const int64_t[]){64, 64, 64, 64});
    return cl_instantiate(L, st, "attn_dkdv_wg", "loom_attn_bwd_dkdv_wg", IDX(0, 1, 2, 3, 6, 7), extra, suffix, 256);
  }
  if (tc) {
    st->grid[1] = cl_clamp_grid((S + 63) / 64, 65535);
    /* K and V (64 rows), then two stages of Q, dO (tile rows) and their L2, Dsum */
    st->smem = (uint32_t)(4 * 64 * (D + 8) + 4 * (2 * tile * (D + 8) + 4 * tile));
    return cl_instantiate(L, st, "attn_dkdv_tc", "loom_attn_bwd_dkdv_tc", IDX(0, 1, 2, 3, 6, 7), extra, suffix, 128);
  }
  return cl_instantiate(L, st, "attn_dkdv", "loom_attn_bwd_dkdv", IDX(0, 1, 2, 3, 6, 7), extra, suffix, 128);
}

int cl_lower_attention(Lower *L, Steps *s) {
  switch (L->op->kind) {
  case OP_ATTENTION: return lower_attention_fwd(L, s);
  case OP_ATTENTION_GRAD: return lower_attention_grad(L, s);
  default: return lower_attention_block(L, s);
  }
}
