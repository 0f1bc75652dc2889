/* codegen/cuda/lower_fuse.c — fusions of the CUDA lowering around the optimizer and the norms
 * (issue 31), hooked into lower.c's cases.
 *
 * The bf16 weight copies.  A bf16 program computes on f32 master weights: mixed-precision
 * (passes/precision.c) makes every use of a parameter read `cast $p : bf16`, which fuse turns
 * into one kernel call per parameter per micro-batch (GPT-2 124M: 148 launches of
 * `k0_forward_k0` a micro-batch).  Here such a parameter gets a bf16 copy that lives beside the
 * parameters, and
 *   - the cast call produces no step: its result is read from the copy (cl_weight_copy_buf in steps.c,
 *     consulted by cl_buf_of; a reshape at the same place follows it);
 *   - the in-place AdamW of the parameter writes the copy as it writes the parameter (the same
 *     rounding of the same f32 value as the cast: the same bits);
 *   - a function of the program, RT_FUNC_WEIGHT_COPIES, casts the parameters into their copies
 *     (a launch per contiguous span); the runtime runs it before the first call that follows
 *     a write of any global from the host (initialization, loading weights, a checkpoint),
 *     so the copies exist before the first step and follow every load.  The f32 masters stay
 *     the truth: checkpoints read and write only them.
 * A parameter qualifies when it is an f32 global of the parameter region, every cast of it in
 * the program is to bf16 (or f16: two bytes), and nothing writes it but its in-place AdamW
 * (ZeRO's gathers, pipeline transfers or any other writer leave it as it was).  The copies
 * mirror the parameter region at half scale (copy of the parameter at byte o: base + o / 2),
 * so the multi-tensor AdamW's spans (merge_updates) cover the copies with the same element
 * indices, and the 64-byte gaps (zero) map to zero gaps.
 * LOOM_CUDA_NO_WEIGHT_COPIES=1 keeps the casts (the tests' unfused program).
 */
#include "codegen/cuda/cuda_internal.h"
#include "codegen/lower_common.h"

static bool no_copies(void) { return cl_env_on("LOOM_CUDA_NO_WEIGHT_COPIES"); }

int cl_weight_copies_plan(Lower *L) {
  const Module *m = L->m;
  int ng = m->globals.n;
  L->copy_offset = malloc(sizeof(int64_t) * (size_t)(ng ? ng : 1));
  L->copy_dtype = calloc((size_t)(ng ? ng : 1), sizeof(DType));
  if (!L->copy_offset || !L->copy_dtype) return cl_fail(L, "out of memory");
  for (int g = 0; g < ng; g++) L->copy_offset[g] = -1;
  if (no_copies()) return 0;
  /* which parameters qualify: ir/module.c's rule, which the memory plan counts too */
  if (weight_copy_dtypes(m, L->copy_dtype) < 0) return cl_fail(L, "out of memory");
  RtProgram *p = L->p;
  int64_t base = cg_align64(p->region_bytes[RT_REGION_PARAMS]);
  bool any = false;
  for (int g = 0; g < ng; g++)
    if (L->copy_dtype[g] != DT_F32) {
      L->copy_offset[g] = base + L->global_offset[g] / 2;
      any = true;
    }
  if (any) p->region_bytes[RT_REGION_PARAMS] = base + cg_align64(base / 2);
  return 0;
}

/* Value v of the current function lives in buffer b from now on, instead of its arena place
   (false: out of memory, nothing changed). */
static bool set_alias(Lower *L, const Value *v, RtBuf b) {
  if (v->kind == VAL_GLOBAL || v->id < 0 || v->id > L->n_values) return false;
  if (!L->value_buf) {
    L->value_buf = calloc((size_t)L->n_values + 1, sizeof(RtBuf));
    L->value_has = calloc((size_t)L->n_values + 1, sizeof(bool));
    if (!L->value_buf || !L->value_has) {
      free(L->value_buf);
      free(L->value_has);
      L->value_buf = NULL;
      L->value_has = NULL;
      return false;
    }
  }
  L->value_buf[v->id] = b;
  L->value_has[v->id] = true;
  return true;
}

/* Before the function's ops are lowered (and before any plan asks for a buffer: lower_gemm.c's
   views take their base's buffer when planned): every cast of a parameter with a copy, and every
   reshape of one at the same place, reads the copy. */
int cl_weight_copies_begin(Lower *L, const Func *f) {
  for (int i = 0; i < f->ops.n; i++) {
    const Op *op = f->ops.items[i];
    int g = weight_cast_of_param(op);
    if (g >= 0 && L->copy_offset[g] >= 0 && L->copy_dtype[g] == op->results[0]->type.dtype) {
      const Value *r = op->results[0];
      RtBuf b = {.region = RT_REGION_PARAMS, .storage = L->copy_dtype[g] == DT_BF16 ? RT_ST_BF16 : RT_ST_F16,
                 .round = RT_ROUND_NONE, .offset = L->copy_offset[g], .n = type_numel(&r->type)};
      set_alias(L, r, b);   /* false (out of memory): the cast stays, correct, only slower */
    } else if (op->kind == OP_RESHAPE && op->operands[0]->kind != VAL_GLOBAL &&
               op->operands[0]->offset == op->results[0]->offset) {
      cl_weight_copy_follow(L, op->operands[0], op->results[0]);
    }
  }
  return 0;
}

void cl_weight_copy_follow(Lower *L, const Value *from, const Value *to) {
  if (L->value_has && from->kind != VAL_GLOBAL && L->value_has[from->id]) {
    RtBuf b = L->value_buf[from->id];
    b.n = type_numel(&to->type);
    set_alias(L, to, b);
  }
}

int cl_weight_copy_adamw(Lower *L, RtStep *st) {
  const Value *p = L->op->operands[0];
  if (p->kind != VAL_GLOBAL || L->copy_offset[p->global->index] < 0) return 0;
  int g = p->global->index;
  if (st->n_in + st->n_out >= RT_MAX_BUFS) return 0;
  RtBuf *b = &st->bufs[st->n_in + st->n_out++];
  memset(b, 0, sizeof *b);
  b->region = RT_REGION_PARAMS;
  b->storage = L->copy_dtype[g] == DT_BF16 ? RT_ST_BF16 : RT_ST_F16;
  b->offset = L->copy_offset[g];
  b->n = st->bufs[0].n;
  return 1;
}

/* The function that writes every copy from its parameter: one loom_copy per run of
   parameters whose copies follow one another (the gaps between them are zero in both). */
int cl_weight_copies_func(Lower *L, RtFunc *rf) {
  const Module *m = L->m;
  int ng = m->globals.n, n = 0;
  int *order = malloc(sizeof(int) * (size_t)(ng ? ng : 1));
  if (!order) return cl_fail(L, "out of memory");
  for (int g = 0; g < ng; g++)
    if (L->copy_offset[g] >= 0) order[n++] = g;
  for (int a = 1; a < n; a++)   /* by offset */
    for (int b = a; b > 0 && L->global_offset[order[b - 1]] > L->global_offset[order[b]]; b--) {
      int t = order[b];
      order[b] = order[b - 1];
      order[b - 1] = t;
    }
  memset(rf, 0, sizeof *rf);
  snprintf(rf->name, sizeof rf->name, "%s", RT_FUNC_WEIGHT_COPIES);
  Steps s = {0};
  int rc = 0;
  L->f = NULL;
  for (int a = 0; a < n && !rc;) {
    int g0 = order[a];
    int64_t start = L->global_offset[g0], end = start + 4 * L->p->globals[g0].n;
    int b = a + 1;
    for (; b < n && L->global_offset[order[b]] == cg_align64(end) && L->copy_dtype[order[b]] == L->copy_dtype[g0]; b++)
      end = L->global_offset[order[b]] + 4 * L->p->globals[order[b]].n;
    int64_t count = (end - start) / 4;
    RtStep *st = NULL;
    if (s.n == s.cap) {
      int cap = s.cap ? 2 * s.cap : 8;
      RtStep *items = realloc(s.items, sizeof(RtStep) * (size_t)cap);
      if (!items) {
        rc = cl_fail(L, "out of memory");
        break;
      }
      s.items = items;
      s.cap = cap;
    }
    st = &s.items[s.n++];
    memset(st, 0, sizeof *st);
    st->kind = RT_STEP_KERNEL;
    st->grid[1] = st->grid[2] = st->block[1] = st->block[2] = 1;
    snprintf(st->label, sizeof st->label, "%s copy of $%.60s [%d tensors]", dtype_name(L->copy_dtype[g0]),
             m->globals.items[g0] ? ((const Global *)m->globals.items[g0])->name : "?", b - a);
    st->n_in = st->n_out = 1;
    st->bufs[0] = (RtBuf){.region = RT_REGION_PARAMS, .storage = RT_ST_F32, .offset = start, .n = count};
    st->bufs[1] = (RtBuf){.region = RT_REGION_PARAMS,
                          .storage = L->copy_dtype[g0] == DT_BF16 ? RT_ST_BF16 : RT_ST_F16,
                          .offset = L->copy_offset[g0],
                          .n = count};
    st->i[0] = count;
    cl_launch_ew(st, count);
    rc = cl_instantiate(L, st, "copy", "loom_copy", (const int[]){0, 1, -1}, NULL, "", 1024);
    a = b;
  }
  free(order);
  rf->steps = s.items;
  rf->n_steps = s.n;
  if (rc) {
    free(s.items);
    rf->steps = NULL;
    rf->n_steps = 0;
  }
  return rc;
}

/* ---------------------------------------------------------------- norms

   A layernorm (rmsnorm) whose gradient op later in the same function reads the same x and
   weight with the same eps saves its rows' (mean, rstd) for it, in a stats area of the
   function past the arena and its scratch (each pair its own, so nothing between writes it);
   the gradient then reads them instead of recomputing them and runs in one launch
   (loom_norm_bwd_saved: the block that finishes last sums the per-block parts of dw and db in
   block order).  The same arithmetic as the two launches it replaces: the same bits.
   When dw (db) is only accumulated into an f32 gradient (fp32: `accumulate $g, %dw`; bf16 with
   LOOM_CUDA_FUSE_BF16=1: through a cast to f32, which no longer rounds it to bf16 first) the
   last block adds the sums to the gradient, and the accumulate launches are gone.
   LOOM_CUDA_NO_NORM_STATS=1 keeps the two launches (the tests' unfused program). */

static bool no_norm_stats(void) { return cl_env_on("LOOM_CUDA_NO_NORM_STATS"); }

static bool refers(const Op *op, const Value *g) {
  for (int k = 0; k < op->n_operands; k++)
    if (op->operands[k] == g) return true;
  for (int k = 0; k < op->n_results; k++)
    if (op->results[k] == g) return true;
  return false;
}

/* A call that only casts its argument v to f32. */
static bool casts_to_f32(const Op *op, const Value *v) {
  if (op->kind != OP_CALL || op->n_operands != 1 || op->operands[0] != v || op->n_results != 1) return false;
  const Func *k = op->callee;
  if (!k || !k->is_kernel || k->args.n != 1 || k->rets.n != 1 || k->ops.n != 1) return false;
  const Op *c = k->ops.items[0];
  return c->kind == OP_CAST && c->operands[0] == k->args.items[0] && k->rets.items[0] == c->results[0] &&
         op->results[0]->type.dtype == DT_F32;
}

/* dw (db) = result r of the gradient op j: the f32 gradient it is only accumulated into within
   the next ops (those ops in acc_ops[0..1], -1 unused), or NULL. */
static const Value *accumulated_into(const Func *f, int j, const Value *r, int acc_ops[2]) {
  acc_ops[0] = acc_ops[1] = -1;
  if (getenv("LOOM_CUDA_NO_ACC_FUSION") || cl_uses(f, r) != 1) return NULL;
  const Value *v = r;
  for (int k = j + 1; k < f->ops.n && k <= j + 8; k++) {
    const Op *op = f->ops.items[k];
    if (v == r && r->type.dtype != DT_F32 && casts_to_f32(op, r)) {
      if (!cl_fuse_narrow() || cl_uses(f, op->results[0]) != 1) return NULL;
      acc_ops[0] = k;
      v = op->results[0];
      continue;
    }
    if (op->kind == OP_ACCUMULATE && op->operands[1] == v) {
      const Value *g = op->operands[0];
      if (v->type.dtype != DT_F32 || g->kind != VAL_GLOBAL || g->type.dtype != DT_F32 ||
          type_numel(&g->type) != type_numel(&r->type))
        return NULL;
      for (int q = j + 1; q < k; q++)   /* nothing between touches the gradient */
        if (q != acc_ops[0] && refers(f->ops.items[q], g)) return NULL;
      acc_ops[1] = k;
      return g;
    }
  }
  return NULL;
}

/* A buffer at `at` of the stats area: its offset is STATS_MARK + at until cl_fuse_func_end
   places the area (no arena is that large). */
#define STATS_MARK ((int64_t)1 << 60)
static RtBuf stats_buf(int64_t at, int64_t n, int storage) {
  return (RtBuf){.region = RT_REGION_ARENA, .storage = (uint8_t)storage, .is_int = storage == RT_ST_I32,
                 .offset = STATS_MARK + at, .n = n};
}

RtBuf cl_stats_buf(int64_t at, int64_t n, int storage) { return stats_buf(at, n, storage); }

/* `bytes` of the stats area for the gradient op j (the attention's saved L2 and O,
   lower_attn.c): its offset in the area, or -1 (no memory: the caller keeps its unfused path). */
int64_t cl_stats_reserve(Lower *L, int j, int64_t bytes) {
  if (!L->norm_stats) {
    L->norm_stats = malloc(sizeof(int64_t) * (size_t)(L->f->ops.n ? L->f->ops.n : 1));
    if (!L->norm_stats) return -1;
    for (int k = 0; k < L->f->ops.n; k++) L->norm_stats[k] = -1;
  }
  int64_t at = L->stats_bytes;
  L->stats_bytes += cg_align64(bytes);
  L->norm_stats[j] = at;
  return at;
}

int64_t cl_stats_of(const Lower *L, int j) { return L->norm_stats ? L->norm_stats[j] : -1; }

int cl_fuse_norm_fwd(Lower *L, Steps *s, RtStep *st, int i) {
  const Func *f = L->f;
  const Op *op = L->op;
  if (no_norm_stats()) return 0;
  bool ln = op->kind == OP_LAYERNORM;
  int j = -1;
  for (int k = i + 1; k < f->ops.n && j < 0; k++) {
    const Op *g = f->ops.items[k];
    if ((g->kind == (ln ? OP_LAYERNORM : OP_RMSNORM)) && g->operands[0] == op->operands[0] &&
        g->operands[1] == op->operands[1])
      return 0;   /* another forward of the same x first: that one saves them */
    if (g->kind == (ln ? OP_LAYERNORM_GRAD : OP_RMSNORM_GRAD) && g->operands[1] == op->operands[0] &&
        g->operands[2] == op->operands[1] && op_float(g, "eps") == op_float(op, "eps"))
      j = k;
  }
  if (j < 0 || st->n_in + st->n_out >= RT_MAX_BUFS) return 0;
  if (!L->norm_stats) {
    L->norm_stats = malloc(sizeof(int64_t) * (size_t)(f->ops.n ? f->ops.n : 1));
    if (!L->norm_stats) return 0;   /* unfused: correct, only slower */
    for (int k = 0; k < f->ops.n; k++) L->norm_stats[k] = -1;
  }
  int64_t rows = st->i[0], at = L->stats_bytes;
  L->stats_bytes += cg_align64(4 * (2 * rows + 1));   /* (mean, rstd) per row, then the counter */
  L->norm_stats[j] = at;
  st->bufs[st->n_in + st->n_out++] = stats_buf(at, 2 * rows + 1, RT_ST_F32);
  st->i[2] = 1;
  return 0;
}

/* The op after the gradient op j (after the accumulations of dw and db this step takes over,
   taken[0..n_taken)): a call of a kernel that only adds its two arguments, one of them dx (read
   by nothing else), the other *res of dx's type: its index (*sum its result), or -1.  A bf16
   (f16) dx is then no longer rounded before the add: LOOM_CUDA_FUSE_BF16=1 only. */
static int residual_add(Lower *L, int j, const int *taken, int n_taken, const Value **res, const Value **sum) {
  const Func *f = L->f;
  const Value *dx = ((const Op *)f->ops.items[j])->results[0];
  *res = *sum = NULL;
  if (getenv("LOOM_CUDA_NO_NORM_RESIDUAL") || cl_uses(f, dx) != 1) return -1;
  if (dx->type.dtype != DT_F32 && !cl_fuse_narrow()) return -1;
  int at = j + 1;
  for (bool more = true; more;) {
    more = false;
    for (int t = 0; t < n_taken; t++)
      if (taken[t] == at) at++, more = true;
  }
  if (at >= f->ops.n) return -1;
  const Op *op = f->ops.items[at];
  if (op->kind != OP_CALL || op->n_operands != 2 || op->n_results != 1) return -1;
  const Func *k = op->callee;
  if (!k || !k->is_kernel || k->args.n != 2 || k->rets.n != 1 || k->ops.n != 1) return -1;
  const Op *add = k->ops.items[0];
  if (add->kind != OP_ADD || k->rets.items[0] != add->results[0] || add->operands[0] == add->operands[1] ||
      add->operands[0]->kind != VAL_ARG || add->operands[1]->kind != VAL_ARG)
    return -1;
  const Value *a = op->operands[0], *b = op->operands[1], *r = a == dx ? b : b == dx ? a : NULL;
  const Value *out = op->results[0];
  if (!r || r == dx || r->kind == VAL_GLOBAL || r->type.dtype != dx->type.dtype || type_numel(&r->type) != type_numel(&dx->type) ||
      out->type.dtype != dx->type.dtype || type_numel(&out->type) != type_numel(&dx->type) || out->kind == VAL_GLOBAL)
    return -1;
  *res = r;
  *sum = out;
  return at;
}

int cl_fuse_norm_bwd(Lower *L, Steps *s, int j) {
  const Op *op = L->op;
  if (!L->norm_stats || L->norm_stats[j] < 0) return 1;
  bool ln = op->kind == OP_LAYERNORM_GRAD;
  const Type *xt = &op->operands[1]->type;
  int64_t D = xt->rank ? xt->dims[xt->rank - 1] : 1, rows = D ? type_numel(xt) / D : 0, np = ln ? 2 : 1;
  int64_t nb = rows < 1 ? 1 : rows > 256 ? 256 : rows, stats_at = L->norm_stats[j];
  /* dw (db) accumulated straight into their f32 gradients? (all of them, or none) */
  const Value *acc[2] = {0};
  int acc_ops[2][2];
  bool fuse_acc = true;
  for (int r = 0; r < np; r++)
    if (!(acc[r] = accumulated_into(L->f, j, op->results[1 + r], acc_ops[r]))) fuse_acc = false;
  const Value *res = NULL, *sum = NULL;   /* the residual gradient added to dx next, and the sum */
  int taken[4], n_taken = 0;
  for (int r = 0; fuse_acc && r < np; r++)
    for (int k = 0; k < 2; k++)
      if (acc_ops[r][k] >= 0) taken[n_taken++] = acc_ops[r][k];
  int add_op = residual_add(L, j, taken, n_taken, &res, &sum);
  RtStep *st = cl_new_step(L, s, RT_STEP_KERNEL, 0, " (dx dw, saved statistics)");
  if (!st || cl_set_bufs(L, st, (const Value *const *)op->operands, 3, false)) return IR_EINPUT;
  st->bufs[st->n_in++] = stats_buf(stats_at, 2 * rows + 1, RT_ST_F32);
  if (res && cl_buf_of(L, res, &st->bufs[st->n_in++])) return IR_EINPUT;
  for (int r = 0; r < 1 + np; r++)
    if (cl_buf_of(L, r == 0 && sum ? sum : r > 0 && fuse_acc ? acc[r - 1] : op->results[r], &st->bufs[st->n_in + st->n_out++]))
      return IR_EINPUT;
  if (sum) {   /* the sum may take the place of dy, x or r (element for element), nothing else's */
    const RtBuf *o = &st->bufs[st->n_in];
    for (int k = 0; k < st->n_in + st->n_out; k++) {
      const RtBuf *b = &st->bufs[k];
      if (k == st->n_in || !cl_overlap(b, o)) continue;
      bool exact = (k <= 1 || k == 4) && b->offset == o->offset && b->n == o->n && cl_st_size(b->storage) == cl_st_size(o->storage);
      if (!exact) return cl_fail(L, "internal error: the norm gradient's residual sum shares memory with buffer %d", k);
    }
    L->skip[add_op] = true;
    size_t n = strlen(st->label);
    snprintf(st->label + n, sizeof st->label - n, " + residual");
  }
  int part = st->n_in + st->n_out;   /* after dx dw [db] */
  /* the parts in scratch; the counter after the statistics */
  int64_t at = 0;
  st->n_out++;
  st->bufs[part] = (RtBuf){.region = RT_REGION_ARENA, .storage = RT_ST_F32, .offset = cg_align64(L->f->arena_bytes) + at, .n = nb * np * D};
  if (at + 4 * nb * np * D > L->scratch) L->scratch = cg_align64(at + 4 * nb * np * D);
  st->bufs[st->n_in + st->n_out++] = stats_buf(stats_at + 8 * rows, 1, RT_ST_F32);
  st->i[0] = rows;
  st->i[1] = D;
  st->i[2] = part;
  st->f[0] = op_float(op, "eps");
  st->block[0] = D <= 32 ? 32 : D <= 64 ? 64 : D <= 256 ? 128 : D <= 4096 ? 256 : 512;   /* lower.c's row_threads */
  st->grid[0] = (uint32_t)nb;
  if (fuse_acc) {
    for (int r = 0; r < np; r++)
      for (int k = 0; k < 2; k++)
        if (acc_ops[r][k] >= 0) L->skip[acc_ops[r][k]] = true;
    size_t n = strlen(st->label);
    snprintf(st->label + n, sizeof st->label - n, " (+= $%s)", acc[0]->global->name);
  }
  char extra[96], suffix[16];
  int o = sum ? 5 : 4;
  snprintf(extra, sizeof extra, "%s, %s, %s, %s", sum ? (st->bufs[4].storage == RT_ST_BF16 ? "loom_sbf16" : st->bufs[4].storage == RT_ST_F16 ? "loom_sf16" : "loom_sf32") : "loom_sf32",
           ln ? "true" : "false", fuse_acc ? "true" : "false", sum ? "true" : "false");
  snprintf(suffix, sizeof suffix, "%s%s", fuse_acc ? "_acc" : "", sum ? "_res" : "");
  return cl_instantiate(L, st, ln ? "lngrads" : "rmsgrads", "loom_norm_bwd_saved", (const int[]){0, 1, 2, o, o + 1, -1},
                        extra, suffix, 512);   /* row_threads gives at most 512: registers to spare */
}

void cl_fuse_func_end(Lower *L, Steps *s) {
  int64_t base = cg_align64(L->f->arena_bytes) + cg_align64(L->scratch);
  for (int k = 0; k < s->n; k++)
    for (int b = 0; b < s->items[k].n_in + s->items[k].n_out; b++) {
      RtBuf *u = &s->items[k].bufs[b];
      if (u->region == RT_REGION_ARENA && u->offset >= STATS_MARK) u->offset += base - STATS_MARK;
    }
  free(L->value_buf);
  free(L->value_has);
  L->value_buf = NULL;
  L->value_has = NULL;
  if (L->stats_bytes) L->scratch = cg_align64(L->scratch) + L->stats_bytes;   /* the arena grows by both */
  free(L->norm_stats);
  L->norm_stats = NULL;
  L->stats_bytes = 0;
}

/* ---------------------------------------------------------------- the fused classifier

   `%ce = cross_entropy %logits, %t` and, later in the same function, `%dl = cross_entropy_grad
   %c, %logits, %t` with %c a constant (the loss's seed: 1 / (rows x micro-batches)) become one
   launch at the forward's place (loom_xent_fused: per row, the online max and sum, the loss,
   then the gradient), so the logits are read once where they were read twice, by two launches.
   The same arithmetic as loom_xent_fwd and loom_xent_bwd: the same bits.  The gradient is
   written earlier than the program says, so its buffer must hold nothing live in between (or be
   the logits' own, in place: each row is read before its block writes it, and nothing in between
   reads the logits).  LOOM_CUDA_NO_XENT_FUSION=1 keeps the two launches. */

/* Is the arena buffer of value v free from op `from` to op `to` of f (inclusive), but for `self`
   (v's buffer may be self's, exactly, when no op strictly between reads self)? */
static bool slot_free(Lower *L, const Func *f, const Value *v, int from, int to, const Value *self, const Value *const *moved,
                      int n_moved) {
  RtBuf vb;
  if (cl_buf_of(L, v, &vb)) {
    L->err[0] = 0;
    return false;
  }
  int nv = L->n_values + 1;
  int *def = malloc(sizeof(int) * (size_t)nv), *last = malloc(sizeof(int) * (size_t)nv);
  const Value **val = calloc((size_t)nv, sizeof *val);
  bool ok = def && last && val;
  for (int k = 0; ok && k < nv; k++) def[k] = INT32_MAX, last[k] = -1;
  for (int a = 0; ok && a < f->args.n; a++) {
    const Value *u = f->args.items[a];
    if (u->id >= 0 && u->id < nv) def[u->id] = -1, val[u->id] = u;
  }
  for (int i = 0; ok && i < f->ops.n; i++) {
    const Op *op = f->ops.items[i];
    for (int k = 0; k < op->n_results; k++) {
      const Value *u = op->results[k];
      if (u->kind != VAL_GLOBAL && u->id >= 0 && u->id < nv) def[u->id] = i, last[u->id] = i, val[u->id] = u;
    }
    for (int k = 0; k < op->n_operands; k++) {
      const Value *u = op->operands[k];
      if (u->kind != VAL_GLOBAL && u->id >= 0 && u->id < nv && last[u->id] < i) last[u->id] = i;
    }
  }
  for (int r = 0; ok && r < f->rets.n; r++) {
    const Value *u = f->rets.items[r];
    if (u->kind != VAL_GLOBAL && u->id >= 0 && u->id < nv) last[u->id] = f->ops.n;
  }
  for (int k = 0; ok && k < nv; k++) {
    const Value *u = val[k];
    bool gone = false;   /* held elsewhere, or never computed */
    for (int q = 0; q < n_moved; q++) gone |= u == moved[q];
    if (!u || u == v || gone || def[k] > to || last[k] < from) continue;
    RtBuf ub;
    if (cl_buf_of(L, u, &ub)) {
      L->err[0] = 0;
      ok = false;
      break;
    }
    if (!cl_overlap(&ub, &vb)) continue;
    if (u == self && ub.region == vb.region && ub.offset == vb.offset &&
        ub.n * cl_st_size(ub.storage) == vb.n * cl_st_size(vb.storage)) {
      for (int i = from + 1; i < to && ok; i++) {
        const Op *op = f->ops.items[i];
        for (int q = 0; q < op->n_operands; q++)
          if (op->operands[q] == self) ok = false;
      }
      continue;
    }
    ok = false;
  }
  free(def);
  free(last);
  free(val);
  return ok;
}

int cl_fuse_xent(Lower *L, Steps *s, int i) {
  const Func *f = L->f;
  const Op *op = L->op;
  if (cl_env_on("LOOM_CUDA_NO_XENT_FUSION")) return 1;
  const Value *logits = op->operands[0], *tg = op->operands[1];
  int j = -1, c = -1;
  for (int k = i + 1; k < f->ops.n && j < 0; k++) {
    const Op *g = f->ops.items[k];
    if (g->kind == OP_CROSS_ENTROPY_GRAD && g->operands[1] == logits && g->operands[2] == tg) j = k;
  }
  if (j < 0) return 1;
  const Op *g = f->ops.items[j];
  const Value *dl = g->operands[0];
  /* the seed: a constant, or a data-parallel rank's slice of one (the same value) */
  int slice = -1;
  const Value *seed = dl;
  for (int k = j - 1; k >= 0 && c < 0; k--) {
    const Op *d = f->ops.items[k];
    if (!d->n_results || d->results[0] != dl) continue;
    if (d->kind == OP_SHARD_SLICE && slice < 0) {
      dl = d->operands[0];
      slice = k;
      k = j;   /* look again for the sliced value's definition */
      continue;
    }
    c = k;
  }
  if (c < 0 || ((const Op *)f->ops.items[c])->kind != OP_CONSTANT || dl->type.dtype != DT_F32) return 1;
  /* the loss rows move to the stats area (the gradient's buffer may be theirs, freed early) */
  const Value *ce = op->results[0];
  /* the seed's ops (its fill, a rank's slice of it) go when nothing else reads them; they may
     not write over the gradient once it is written */
  bool drop = c > i && (slice < 0 || slice > i) && cl_uses(f, seed) == 1 && (slice < 0 || cl_uses(f, dl) == 1);
  const Value *moved[3] = {ce, seed, dl};
  if (cl_uses(f, ce) < 1 || !slot_free(L, f, g->results[0], i, j, logits, moved, drop ? 3 : 1)) return 1;
  for (int r = 0; r < f->rets.n; r++)
    if (f->rets.items[r] == ce) return 1;
  int64_t rows_at = L->stats_bytes;
  if (!set_alias(L, ce, stats_buf(rows_at, type_numel(&ce->type), ce->type.dtype == DT_F32 ? RT_ST_F32 : RT_ST_BF16)))
    return 1;
  L->stats_bytes += cg_align64(4 * type_numel(&ce->type));
  RtStep *st = cl_new_step(L, s, RT_STEP_KERNEL, 0, " + cross_entropy_grad (one pass)");
  if (!st || cl_set_bufs(L, st, (const Value *const[]){logits, tg}, 2, true)) return IR_EINPUT;
  if (st->bufs[1].storage != RT_ST_I32) return cl_fail(L, "targets must be i32");
  if (cl_buf_of(L, g->results[0], &st->bufs[st->n_in + st->n_out++])) return IR_EINPUT;
  int64_t V = logits->type.rank ? logits->type.dims[logits->type.rank - 1] : 1;
  st->i[0] = V ? type_numel(&logits->type) / V : 0;
  st->i[1] = V;
  st->f[0] = op_float(f->ops.items[c], "value");
  st->block[0] = V <= 32 ? 32 : V <= 64 ? 64 : V <= 256 ? 128 : V <= 4096 ? 256 : 512;   /* lower.c's row_threads */
  st->grid[0] = (uint32_t)(st->i[0] < 1 ? 1 : st->i[0] > (1 << 20) ? (1 << 20) : st->i[0]);
  L->skip[j] = true;
  if (drop) {   /* the seed's fill (and slice), read by nothing else */
    L->skip[c] = true;
    if (slice >= 0) L->skip[slice] = true;
  }
  return cl_instantiate(L, st, "xent_fused", "loom_xent_fused", (const int[]){0, 2, 3, -1}, NULL, "", 1024);
}

/* ---------------------------------------------------------------- embedding + positions

   GPT-2's x = wte[tokens] + broadcast(wpe): the embedding writes its rows, a kernel reads them
   back with the positions and writes the sum (one [B, T, D] written and read for nothing).
   When the embedding's only user is a call of a kernel add(y, broadcast(p)) (either order) with
   p of y's trailing shape [T, D] and y's dtype, and every op between them makes no step (the
   bf16 parameter casts that read the weight copies), the embedding writes the sum: the same
   add, rounded once, the same bits.  Not for a vocabulary-parallel table (its rows are summed
   over the ranks before the positions are added).  LOOM_CUDA_NO_EMBED_POS=1: off. */
/* Does v exist before op i runs: a global or argument, a value defined before i, a cast that
   reads a weight copy, or a slice read in place (no step) of such a value? */
static bool ready_at(Lower *L, const Value *v, int i, int depth) {
  if (v->kind == VAL_GLOBAL || v->kind == VAL_ARG || (L->value_has && v->id >= 0 && L->value_has[v->id])) return true;
  if (v->kind != VAL_RESULT || depth > 4) return false;
  const Func *f = L->f;
  for (int q = 0; q < f->ops.n; q++) {
    const Op *o = f->ops.items[q];
    if (o != v->def) continue;
    if (q < i) return true;
    bool view = (o->kind == OP_SLICE || o->kind == OP_RESHAPE) && L->skip[q] && L->view && v->id >= 0 &&
                v->id < L->n_view && L->view[v->id].n;
    return view && ready_at(L, o->operands[0], i, depth + 1);
  }
  return false;
}

int cl_fuse_embed_pos(Lower *L, Steps *s, int i) {
  const Func *f = L->f;
  const Op *op = L->op;
  const Attr *va = op_attr(op, "vocab_axis");
  if (cl_env_on("LOOM_CUDA_NO_EMBED_POS") || (va && va->s && va->s[0])) return 1;
  const Value *y = op->results[0];
  if (cl_uses(f, y) != 1 || y->type.rank < 2) return 1;
  int j = i + 1;
  for (; j < f->ops.n && j <= i + 4; j++) {
    const Op *o = f->ops.items[j];
    bool reads_y = false;
    for (int k = 0; k < o->n_operands; k++) reads_y |= o->operands[k] == y;
    if (reads_y) break;
    /* an op between makes no step: a cast that reads a weight copy, a slice read in place */
    bool copy = o->kind == OP_CALL && o->n_results == 1 && L->value_has && L->value_has[o->results[0]->id];
    bool view = (o->kind == OP_SLICE || o->kind == OP_RESHAPE) && L->skip[j] && L->view && o->results[0]->id >= 0 &&
                o->results[0]->id < L->n_view && L->view[o->results[0]->id].n;
    if (!copy && !view) return 1;
  }
  if (j >= f->ops.n || j > i + 4 || L->skip[j]) return 1;
  const Op *call = f->ops.items[j];
  const Func *k = call->callee;
  if (call->kind != OP_CALL || call->n_operands != 2 || call->n_results != 1 || !k || !k->is_kernel || k->args.n != 2 ||
      k->rets.n != 1 || k->ops.n != 2)
    return 1;
  const Op *bc = k->ops.items[0], *add = k->ops.items[1];
  if (bc->kind != OP_BROADCAST || add->kind != OP_ADD || k->rets.items[0] != add->results[0] ||
      bc->operands[0]->kind != VAL_ARG)
    return 1;
  const Value *ya = add->operands[0] == bc->results[0] ? add->operands[1] : add->operands[0];
  if (ya == bc->results[0] || ya->kind != VAL_ARG || ya == bc->operands[0] ||
      (add->operands[0] != bc->results[0] && add->operands[1] != bc->results[0]))
    return 1;
  const Value *p = NULL, *yo = NULL;
  for (int a = 0; a < 2; a++) {
    if (k->args.items[a] == bc->operands[0]) p = call->operands[a];
    if (k->args.items[a] == ya) yo = call->operands[a];
  }
  const Value *x = call->results[0];
  if (yo != y || !p || p->type.dtype != y->type.dtype || x->type.dtype != y->type.dtype ||
      type_numel(&x->type) != type_numel(&y->type) || p->type.rank > y->type.rank)
    return 1;
  for (int d = 0; d < p->type.rank; d++)
    if (p->type.dims[d] != y->type.dims[y->type.rank - p->type.rank + d]) return 1;
  if (!ready_at(L, p, i, 0)) return 1;
  /* the sum may not land on what the pass still reads (the kernel it replaces read only y there) */
  RtBuf bx, bin;
  if (cl_buf_of(L, x, &bx)) return IR_EINPUT;
  for (int a = 0; a < 3; a++) {
    if (cl_buf_of(L, a == 2 ? p : op->operands[a], &bin)) return IR_EINPUT;
    if (cl_overlap(&bx, &bin)) return 1;
  }
  RtStep *st = cl_new_step(L, s, RT_STEP_KERNEL, 0, " + positions");
  if (!st || cl_set_bufs(L, st, (const Value *const[]){op->operands[0], op->operands[1], p}, 3, false)) return IR_EINPUT;
  if (st->bufs[1].storage != RT_ST_I32) return cl_fail(L, "ids must be i32");
  if (cl_buf_of(L, x, &st->bufs[st->n_in + st->n_out++])) return IR_EINPUT;
  const Type *t = &op->operands[0]->type;
  st->i[0] = type_numel(&op->operands[1]->type);
  st->i[1] = t->dims[0];
  st->i[2] = t->dims[1];
  st->i[5] = type_numel(&p->type);
  cl_launch_ew(st, st->i[0] * st->i[2]);
  L->skip[j] = true;
  return cl_instantiate(L, st, "embedding_pos", "loom_embedding_pos_fwd", (const int[]){0, 3, -1}, NULL, "", 1024);
}
