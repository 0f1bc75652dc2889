/* codegen/cpu/lower.c — program functions -> RtProgram (runtime/program.h).
 *
 * After `fuse` and `memory-plan` a program function holds calls of kernel funcs,
 * matmuls, and ops the runtime has a builtin for; every value has an arena offset.  Each
 * op becomes one RtStep (a reshape between equal offsets becomes none):
 *
 *   call      RT_STEP_KERNEL   which = kernel index, i[0] = parallel extent (cpu.h)
 *   matmul    RT_STEP_GEMM     i: batch M N K ta tb strideA strideB strideC
 *   others    RT_STEP_BUILTIN  the i[] / f[] layout documented in program.h
 *
 * Globals get their own regions, in module order at 64-byte aligned offsets:
 * parameters -> RT_REGION_PARAMS, state named "grad.*" -> RT_REGION_GRADS, other state
 * (optimizer moments, step counters) -> RT_REGION_OPTIM.  Every element takes 4 bytes
 * (floats as f32, integers as int32), as memory-plan lays out the arena on the CPU.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cpu/cpu.h"
#include "codegen/lower_common.h"


typedef struct {
  const Module *m;
  RtProgram *p;
  const Func *f;
  const Op *op;
  int64_t *kernel_extent;     /* per func index of the module (kernels only) */
  int *kernel_index;          /* per func index: index in p->kernel_names, or -1 */
  int64_t *global_offset;     /* per global */
  RtRegion *global_region;
  bool *skip;                 /* per op of the current function: lowered with another op */
  bool adamw_in_place;        /* the current adamw updates its globals (its assigns skipped) */
  int *handle;                /* per value id of the current function: a collective start's handle */
  int n_handles;
  char *err;
  size_t errlen;
} Lower;

static int lfail(Lower *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int lfail(Lower *L, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = cg_vfail(L->err, L->errlen, L->f, L->op, fmt, ap);
  va_end(ap);
  return rc;
}


/* The buffer of a value: a global's region, or the function's arena. */
static int buf_of(Lower *L, const Value *v, RtBuf *b) {
  memset(b, 0, sizeof *b);
  b->n = type_numel(&v->type);
  b->is_int = !dtype_is_float(v->type.dtype);
  b->round = cg_round_of(v->type.dtype);
  b->storage = b->is_int ? RT_ST_I32 : RT_ST_F32;   /* the CPU holds floats as f32 */
  if (v->kind == VAL_GLOBAL) {
    b->region = (uint8_t)L->global_region[v->global->index];
    b->offset = L->global_offset[v->global->index];
    return 0;
  }
  b->region = RT_REGION_ARENA;
  if (v->offset < 0)
    return lfail(L, "value %%%s has no arena offset; run the memory-plan pass first", v->name ? v->name : "?");
  if (v->offset % 64) return lfail(L, "value %%%s is at offset %lld, not 64-byte aligned", v->name ? v->name : "?",
                                   (long long)v->offset);
  if (v->offset + 4 * b->n > L->f->arena_bytes)
    return lfail(L, "value %%%s (%lld bytes at %lld) does not fit in the arena of %lld bytes", v->name ? v->name : "?",
                 (long long)(4 * b->n), (long long)v->offset, (long long)L->f->arena_bytes);
  b->offset = v->offset;
  return 0;
}

static bool overlap(const RtBuf *a, const RtBuf *b) {
  return a->region == b->region && a->offset < b->offset + 4 * b->n && b->offset < a->offset + 4 * a->n;
}

/* ---------------------------------------------------------------- steps */

typedef struct {
  RtStep *items;
  int n, cap;
} Steps;

static RtStep *new_step(Lower *L, Steps *s, RtStepKind kind, int which) {
  RtStep *st = cg_new_step(&s->items, &s->n, &s->cap, L->op, kind, which, "");
  if (!st) lfail(L, "out of memory");
  return st;
}

/* Buffers: the given operands as inputs, then the op's results as outputs. */
static int set_bufs(Lower *L, RtStep *st, const Value *const *in, int n_in, bool results) {
  const Op *op = L->op;
  int n_out = results ? op->n_results : 0;
  if (n_in + n_out > RT_MAX_BUFS)
    return lfail(L, "needs %d buffers; a step holds at most %d (RT_MAX_BUFS)", n_in + n_out, RT_MAX_BUFS);
  st->n_in = n_in;
  st->n_out = n_out;
  for (int i = 0; i < n_in; i++)
    if (buf_of(L, in[i], &st->bufs[i])) return IR_EINPUT;
  for (int i = 0; i < n_out; i++)
    if (buf_of(L, op->results[i], &st->bufs[n_in + i])) return IR_EINPUT;
  return 0;
}

static int set_operand_bufs(Lower *L, RtStep *st) {
  return set_bufs(L, st, (const Value *const *)L->op->operands, L->op->n_operands, true);
}

static int push_int(Lower *L, RtStep *st, int *n, int64_t v) {
  if (*n >= RT_MAX_INTS) return lfail(L, "needs more than %d integer parameters (RT_MAX_INTS)", RT_MAX_INTS);
  st->i[(*n)++] = v;
  return 0;
}

static int64_t prod_dims(const Type *t, int from, int to) {
  int64_t p = 1;
  for (int d = from; d < to; d++) p *= t->dims[d];
  return p;
}

static int64_t last_dim(const Type *t) { return t->rank ? t->dims[t->rank - 1] : 1; }

static int lower_call(Lower *L, Steps *s) {
  const Op *op = L->op;
  const Func *k = op->callee;
  int fi = -1;
  for (int i = 0; i < L->m->funcs.n; i++)
    if (L->m->funcs.items[i] == k) fi = i;
  if (fi < 0 || L->kernel_index[fi] < 0) return lfail(L, "calls @%s, which is not a kernel func of this module", k->name);
  RtStep *st = new_step(L, s, RT_STEP_KERNEL, L->kernel_index[fi]);
  if (!st || set_operand_bufs(L, st)) return IR_EINPUT;
  st->i[0] = L->kernel_extent[fi];
  /* In place is only safe element for element: an N-element result (not a reduction, whose
     outputs are zeroed first) over an N-element argument at the same offset. */
  int64_t N = 0;
  for (int i = 0; i < k->args.n; i++)
    if (type_numel(&((const Value *)k->args.items[i])->type) > N) N = type_numel(&((const Value *)k->args.items[i])->type);
  for (int i = 0; i < k->ops.n; i++) {
    const Op *kop = k->ops.items[i];
    for (int r = 0; r < kop->n_results; r++)
      if (type_numel(&kop->results[r]->type) > N) N = type_numel(&kop->results[r]->type);
  }
  for (int o = st->n_in; o < st->n_in + st->n_out; o++) {
    const Value *ret = k->rets.items[o - st->n_in];
    bool elementwise = !(ret->kind == VAL_RESULT && op_info(ret->def->kind)->cls == CLASS_REDUCTION);
    for (int i = 0; i < st->n_in + st->n_out; i++) {
      if (i == o || !overlap(&st->bufs[i], &st->bufs[o])) continue;
      bool exact = i < st->n_in && elementwise && st->bufs[i].offset == st->bufs[o].offset && st->bufs[i].n == N &&
                   st->bufs[o].n == N;
      if (!exact)
        return lfail(L, "result %d shares memory with %s %d; a kernel may only write an N-element result (not a "
                     "reduction) over an N-element argument at the same offset", o - st->n_in,
                     i < st->n_in ? "argument" : "result", i < st->n_in ? i : i - st->n_in);
    }
  }
  return 0;
}

static int lower_matmul(Lower *L, Steps *s) {
  const Op *op = L->op;
  const Type *a = &op->operands[0]->type, *b = &op->operands[1]->type, *c = &op->results[0]->type;
  bool ta = op_bool(op, "ta"), tb = op_bool(op, "tb");
  int64_t M = c->dims[c->rank - 2], N = c->dims[c->rank - 1], K = a->dims[a->rank - (ta ? 2 : 1)];
  RtStep *st = new_step(L, s, RT_STEP_GEMM, 0);
  if (!st || set_operand_bufs(L, st)) return IR_EINPUT;
  int64_t batch = M * N != 0 ? type_numel(c) / (M * N) : 0;
  int64_t v[9] = {batch, M, N, K, ta, tb, M * K, b->rank > 2 ? K * N : 0, M * N};
  memcpy(st->i, v, sizeof v);
  return 0;
}

/* A vocab_axis attribute as program.h's "axis + 1" (0: the vocabulary is not split). */
static int64_t vocab_axis1(const Op *op) {
  const Attr *a = op_attr(op, "vocab_axis");
  return a && a->s && a->s[0] ? mesh_axis_parse(a->s) + 1 : 0;
}

/* A seq_axis attribute (context parallelism) as "axis + 1" (0: the sequence is whole). */
static int64_t seq_axis1(const Op *op) {
  const Attr *a = op_attr(op, "seq_axis");
  return a && a->s && a->s[0] ? mesh_axis_parse(a->s) + 1 : 0;
}

static int lower_builtin(Lower *L, Steps *s) {
  const Op *op = L->op;
  const Type *x = op->n_operands ? &op->operands[0]->type : NULL;
  const Type *y = op->n_results ? &op->results[0]->type : NULL;
  RtStep *st;
  int n = 0;
#define BUILTIN(b)                                  \
  do {                                              \
    st = new_step(L, s, RT_STEP_BUILTIN, (b));      \
    if (!st || set_operand_bufs(L, st)) return IR_EINPUT; \
  } while (0)
#define INT(v)                                      \
  do {                                              \
    if (push_int(L, st, &n, (v))) return IR_EINPUT; \
  } while (0)
  const OpKind kind = op_sync_of(op->kind);   /* a start: its collective's step (lower_func wraps it) */
  switch (kind) {
  case OP_LAYERNORM:
  case OP_RMSNORM:
  case OP_LAYERNORM_GRAD:
  case OP_RMSNORM_GRAD: {
    const Type *xt = op->kind == OP_LAYERNORM || op->kind == OP_RMSNORM ? x : &op->operands[1]->type;
    static const RtBuiltin which[] = {[OP_LAYERNORM] = RT_B_LAYERNORM, [OP_RMSNORM] = RT_B_RMSNORM,
                                      [OP_LAYERNORM_GRAD] = RT_B_LAYERNORM_GRAD, [OP_RMSNORM_GRAD] = RT_B_RMSNORM_GRAD};
    BUILTIN(which[op->kind]);
    int64_t D = last_dim(xt);
    INT(D ? type_numel(xt) / D : 0);
    INT(D);
    st->f[0] = op_float(op, "eps");
    return 0;
  }
  case OP_SOFTMAX:
  case OP_SOFTMAX_GRAD: {
    BUILTIN(op->kind == OP_SOFTMAX ? RT_B_SOFTMAX : RT_B_SOFTMAX_GRAD);
    int64_t D = last_dim(y);
    INT(D ? type_numel(y) / D : 0);
    INT(D);
    return 0;
  }
  case OP_ATTENTION:
  case OP_ATTENTION_GRAD: {
    bool grad = op->kind == OP_ATTENTION_GRAD;
    const Type *q = &op->operands[grad ? 1 : 0]->type, *kt = &op->operands[grad ? 2 : 1]->type;
    BUILTIN(grad ? RT_B_ATTENTION_GRAD : RT_B_ATTENTION);
    INT(q->dims[0]);
    INT(q->dims[1]);
    INT(q->dims[2]);
    INT(q->dims[3]);
    INT(kt->dims[1]);
    INT(kt->dims[2]);
    INT(op_bool(op, "causal"));
    INT(op_int(op, "window"));
    st->f[0] = op_float(op, "scale");
    return 0;
  }
  case OP_ROPE:
    BUILTIN(RT_B_ROPE);
    for (int d = 0; d < 4; d++) INT(x->dims[d]);
    INT(op_int(op, "offset"));
    INT(op_bool(op, "inverse"));
    INT(seq_axis1(op));
    INT(op_int(op, "seq_n"));
    INT(op_bool(op, "zigzag"));
    cg_rope_f(op, st->f);
    return 0;
  case OP_ROPE_AT:
    BUILTIN(RT_B_ROPE_AT);
    for (int d = 0; d < 4; d++) INT(x->dims[d]);
    cg_rope_f(op, st->f);
    return 0;
  case OP_ATTENTION_CACHED: {
    const Type *kt = &op->operands[1]->type;
    BUILTIN(RT_B_ATTN_CACHED);
    for (int d = 0; d < 4; d++) INT(x->dims[d]);
    INT(kt->dims[1]);
    INT(kt->dims[2]);
    INT(op_int(op, "window"));
    st->f[0] = op_float(op, "scale");
    return 0;
  }
  case OP_KV_WRITE: {
    const Type *v = &op->operands[1]->type;
    BUILTIN(RT_B_KV_WRITE);
    INT(v->dims[0]);
    INT(v->dims[1]);
    INT(x->dims[1]);
    INT(v->dims[2] * v->dims[3]);
    return 0;
  }
  /* mixture of experts */
  case OP_TOPK:
  case OP_GATHER_LAST:
  case OP_SCATTER_LAST: {
    const Type *big = op->kind == OP_TOPK || op->kind == OP_GATHER_LAST ? x : y;
    const Type *idx = op->kind == OP_TOPK ? y : &op->operands[1]->type;
    BUILTIN(op->kind == OP_TOPK ? RT_B_TOPK : op->kind == OP_GATHER_LAST ? RT_B_GATHER_LAST : RT_B_SCATTER_LAST);
    int64_t E = last_dim(big);
    INT(E ? type_numel(big) / E : 0);
    INT(E);
    INT(last_dim(idx));
    return 0;
  }
  case OP_MOE_SORT:
  case OP_MOE_COUNT:
    BUILTIN(op->kind == OP_MOE_SORT ? RT_B_MOE_SORT : RT_B_MOE_COUNT);
    INT(type_numel(x));
    INT(op_int(op, "experts"));
    INT(op_int(op, "capacity"));
    return 0;
  case OP_MOE_DISPATCH:
  case OP_MOE_COMBINE:
  case OP_MOE_WEIGHT_GRAD: {
    bool wg = op->kind == OP_MOE_WEIGHT_GRAD;
    const Type *rows = op->kind == OP_MOE_DISPATCH ? y : x, *pos = &op->operands[wg ? 2 : 1]->type;
    int64_t N = op->kind == OP_MOE_DISPATCH ? x->dims[0] : wg ? op->operands[1]->type.dims[0] : y->dims[0];
    BUILTIN(op->kind == OP_MOE_DISPATCH ? RT_B_MOE_DISPATCH : op->kind == OP_MOE_COMBINE ? RT_B_MOE_COMBINE : RT_B_MOE_WEIGHT_GRAD);
    INT(N);
    INT(N ? type_numel(pos) / N : 0);
    INT(rows->dims[1]);
    INT(rows->dims[0]);
    return 0;
  }
  case OP_GROUPED_MATMUL:
  case OP_GROUPED_MATMUL_WGRAD: {
    const Type *b = &op->operands[1]->type, *cnt = &op->operands[2]->type;
    bool wg = op->kind == OP_GROUPED_MATMUL_WGRAD;
    BUILTIN(wg ? RT_B_GROUPED_WGRAD : RT_B_GROUPED_MATMUL);
    INT(x->dims[0]);
    INT(wg ? b->dims[1] : x->dims[1]);
    INT(wg ? x->dims[1] : y->dims[1]);
    INT(wg ? op_int(op, "experts") : b->dims[0]);
    INT(cnt->dims[0]);
    INT(wg ? 1 : op_bool(op, "tb"));
    return 0;
  }
  case OP_ATTENTION_BLOCK:
  case OP_ATTENTION_BLOCK_GRAD: {
    bool grad = op->kind == OP_ATTENTION_BLOCK_GRAD;
    const Type *q = &op->operands[grad]->type, *kt = &op->operands[grad + 1]->type;
    BUILTIN(grad ? RT_B_ATTN_BLOCK_GRAD : RT_B_ATTN_BLOCK);
    for (int d = 0; d < 4; d++) INT(q->dims[d]);
    INT(kt->dims[1]);
    INT(kt->dims[2]);
    INT(op_bool(op, "causal"));
    INT(seq_axis1(op));
    INT(op_int(op, "seq_n"));
    INT(op_bool(op, "zigzag"));
    INT(op_int(op, "kv_shift"));
    INT(0);   /* i[11]: the CUDA kernels' rank coordinate (program.h) */
    INT(op_int(op, "window"));
    st->f[0] = op_float(op, "scale");
    return 0;
  }
  case OP_CROSS_ENTROPY:
  case OP_CROSS_ENTROPY_GRAD: {
    const Type *logits = &op->operands[op->kind == OP_CROSS_ENTROPY ? 0 : 1]->type;
    BUILTIN(op->kind == OP_CROSS_ENTROPY ? RT_B_CROSS_ENTROPY : RT_B_CROSS_ENTROPY_GRAD);
    int64_t V = last_dim(logits);
    INT(V ? type_numel(logits) / V : 0);
    INT(V);
    return 0;
  }
  case OP_EMBEDDING:
  case OP_EMBEDDING_GRAD: {
    const Type *table = op->kind == OP_EMBEDDING ? x : y, *ids = &op->operands[1]->type;
    BUILTIN(op->kind == OP_EMBEDDING ? RT_B_EMBEDDING : RT_B_EMBEDDING_GRAD);
    INT(type_numel(ids));
    INT(table->dims[0]);
    INT(table->dims[1]);
    INT(vocab_axis1(op));
    return 0;
  }
  case OP_TARGET_PICK:
  case OP_ONEHOT: {
    const Type *wide = op->kind == OP_TARGET_PICK ? x : y;
    int64_t V = last_dim(wide);
    BUILTIN(op->kind == OP_TARGET_PICK ? RT_B_TARGET_PICK : RT_B_ONEHOT);
    INT(V ? type_numel(wide) / V : 0);
    INT(V);
    INT(vocab_axis1(op));
    return 0;
  }
  case OP_ALL_REDUCE:
    BUILTIN(RT_B_ALL_REDUCE);
    INT(type_numel(y));
    INT(mesh_axis_parse(op_attr(op, "axis")->s));
    INT(op_int(op, "n"));
    INT(!strcmp(op_attr(op, "reduce")->s, "max"));
    return 0;
  case OP_SEND:
  case OP_RECV: {   /* the value moved: the operand of send, the result of recv */
    const Value *v = kind == OP_SEND ? op->operands[0] : op->results[0];
    if (!dtype_is_float(v->type.dtype)) return lfail(L, "point-to-point moves float values");
    BUILTIN(kind == OP_SEND ? RT_B_SEND : RT_B_RECV);
    INT(type_numel(&v->type));
    INT(mesh_axis_parse(op_attr(op, "axis")->s));
    INT(op_int(op, "n"));
    INT(op_int(op, "peer"));
    INT(op_int(op, "tag"));
    INT(op_bool(op, "rel"));
    return 0;
  }
  case OP_ALL_GATHER:
  case OP_REDUCE_SCATTER:
  case OP_SHARD_SLICE:
  case OP_SHARD_PAD: {
    /* the piece's type: x for all_gather and shard_pad, y for reduce_scatter and shard_slice */
    bool piece_is_x = kind == OP_ALL_GATHER || kind == OP_SHARD_PAD;
    const Type *piece = piece_is_x ? x : y;
    int dim = (int)op_int(op, "dim");
    BUILTIN(kind == OP_ALL_GATHER       ? RT_B_ALL_GATHER
            : kind == OP_REDUCE_SCATTER ? RT_B_REDUCE_SCATTER
            : kind == OP_SHARD_SLICE    ? RT_B_SHARD_SLICE
                                            : RT_B_SHARD_PAD);
    INT(mesh_axis_parse(op_attr(op, "axis")->s));
    INT(op_int(op, "n"));
    if (kind == OP_SHARD_SLICE || kind == OP_SHARD_PAD) INT(op_int(op, "parts"));
    INT(prod_dims(piece, 0, dim));
    INT(piece->dims[dim]);
    INT(prod_dims(piece, dim + 1, piece->rank));
    return 0;
  }
  case OP_ALL_TO_ALLV:
    BUILTIN(RT_B_ALL_TO_ALLV);
    INT(mesh_axis_parse(op_attr(op, "axis")->s));
    INT(op_int(op, "n"));
    INT(x->dims[0]);
    INT(x->dims[1]);
    INT(y->dims[0]);
    INT(op->operands[1]->type.dims[0] / op_int(op, "n"));
    return 0;
  case OP_ALL_TO_ALL: {
    int64_t n_ax = op_int(op, "n");
    int sd = (int)op_int(op, "split"), cd = (int)op_int(op, "concat");
    BUILTIN(RT_B_ALL_TO_ALL);
    INT(mesh_axis_parse(op_attr(op, "axis")->s));
    INT(n_ax);
    INT(prod_dims(x, 0, sd));
    INT(x->dims[sd] / n_ax);
    INT(prod_dims(x, sd + 1, x->rank));
    INT(prod_dims(y, 0, cd));
    INT(y->dims[cd] / n_ax);
    INT(prod_dims(y, cd + 1, y->rank));
    return 0;
  }
  case OP_TRANSPOSE:
  case OP_SLICE:
  case OP_PAD: {
    BUILTIN(op->kind == OP_TRANSPOSE ? RT_B_TRANSPOSE : op->kind == OP_SLICE ? RT_B_SLICE : RT_B_PAD);
    INT(x->rank);
    for (int d = 0; d < x->rank; d++) INT(x->dims[d]);
    for (int a = 0; a < op_info(op->kind)->n_attrs; a++)
      for (int d = 0; d < x->rank; d++) INT(op->attrs[a].ints[d]);
    return 0;
  }
  case OP_CONCAT: {
    int dim = (int)op_int(op, "dim");
    BUILTIN(RT_B_CONCAT);
    INT(op->n_operands);
    INT(prod_dims(y, 0, dim));
    INT(prod_dims(y, dim + 1, y->rank));
    for (int i = 0; i < op->n_operands; i++) INT(op->operands[i]->type.dims[dim]);
    return 0;
  }
  case OP_BROADCAST: {
    BUILTIN(RT_B_BROADCAST);
    INT(y->rank);
    for (int d = 0; d < y->rank; d++) INT(y->dims[d]);
    int off = y->rank - x->rank;
    for (int d = 0; d < y->rank; d++) {
      int e = d - off;
      INT(e < 0 || x->dims[e] == 1 ? 0 : prod_dims(x, e + 1, x->rank));
    }
    return 0;
  }
  case OP_RESHAPE: {
    if (op->operands[0]->kind != VAL_GLOBAL && op->operands[0]->offset == op->results[0]->offset) {
      RtBuf a, b;   /* shares its operand's buffer: no step, but check both */
      if (buf_of(L, op->operands[0], &a) || buf_of(L, op->results[0], &b)) return IR_EINPUT;
      return 0;
    }
    BUILTIN(RT_B_COPY);
    INT(type_numel(y));
    return 0;
  }
  case OP_CAST:
    BUILTIN(dtype_is_float(x->dtype) && dtype_is_float(y->dtype) ? RT_B_COPY : RT_B_CAST);
    INT(type_numel(y));
    if (!(dtype_is_float(x->dtype) && dtype_is_float(y->dtype))) INT(y->dtype == DT_BOOL);   /* bool: x != 0 */
    return 0;
  case OP_CONSTANT:
    BUILTIN(RT_B_FILL);
    INT(type_numel(y));
    st->f[0] = op_float(op, "value");
    return 0;
  case OP_IOTA:
    BUILTIN(RT_B_IOTA);
    INT(y->rank);
    for (int d = 0; d < y->rank; d++) INT(y->dims[d]);
    INT(op_int(op, "dim"));
    return 0;
  case OP_ACCUMULATE:
  case OP_ASSIGN:
    BUILTIN(op->kind == OP_ACCUMULATE ? RT_B_ACCUMULATE : RT_B_ASSIGN);
    INT(type_numel(x));
    return 0;
  case OP_FILL:
    /* the global is the output */
    st = new_step(L, s, RT_STEP_BUILTIN, RT_B_FILL);
    if (!st) return IR_EINPUT;
    st->n_out = 1;
    if (buf_of(L, op->operands[0], &st->bufs[0])) return IR_EINPUT;
    INT(type_numel(x));
    st->f[0] = op_float(op, "value");
    return 0;
  case OP_ADAMW:
    BUILTIN(RT_B_ADAMW);
    if (L->adamw_in_place) st->n_out = 0;   /* p, m, v updated where they are */
    INT(type_numel(x));
    st->f[0] = op_float(op, "beta1");
    st->f[1] = op_float(op, "beta2");
    st->f[2] = op_float(op, "eps");
    st->f[3] = op_float(op, "weight_decay");
    return 0;
  default: break;
  }
#undef BUILTIN
#undef INT
  const OpInfo *info = op_info(op->kind);
  if (info->cls == CLASS_ELEMENTWISE || info->cls == CLASS_REDUCTION)
    return lfail(L, "is outside a kernel func; the CPU backend runs elementwise ops and reductions only in fused "
                 "kernels (run the fuse pass first)");
  return lfail(L, "is not supported by the CPU backend");
}

/* ---------------------------------------------------------------- functions */

/* Does the step write buffer k (an output, or what a builtin updates in place)? */
static bool writes(const RtStep *st, int k) {
  if (k >= st->n_in) return true;
  if (st->kind != RT_STEP_BUILTIN) return false;
  if (st->which == RT_B_ADAMW && st->n_out == 0) return k < 3;
  return (st->which == RT_B_ACCUMULATE || st->which == RT_B_ASSIGN) && k == 0;
}

/* Do steps t and u conflict: one writes bytes the other reads or writes? */
static bool conflict(const RtStep *t, const RtStep *u) {
  for (int i = 0; i < t->n_in + t->n_out; i++)
    for (int j = 0; j < u->n_in + u->n_out; j++)
      if ((writes(t, i) || writes(u, j)) && overlap(&t->bufs[i], &u->bufs[j])) return true;
  return false;
}

/* b directly follows a in a region (the next 64-byte-aligned place) and is alike. */
static bool follows(const RtBuf *a, const RtBuf *b) {
  return a->region == b->region && a->is_int == b->is_int && a->round == b->round && a->region != RT_REGION_ARENA &&
         b->offset == cg_align64(a->offset + 4 * a->n);
}

/* Can step u (an in-place adamw or a fill of a global) extend step h over a longer span? */
static bool extends(const RtStep *h, const RtStep *u) {
  if (h->kind != RT_STEP_BUILTIN || u->kind != RT_STEP_BUILTIN || h->which != u->which) return false;
  if (h->which == RT_B_ADAMW) {
    if (h->n_out || u->n_out) return false;   /* in place only */
    for (int k = 0; k < 4; k++)
      if (h->f[k] != u->f[k]) return false;
    for (int k = 4; k < 7; k++)   /* gscale, lr, t: the same scalars */
      if (h->bufs[k].region != u->bufs[k].region || h->bufs[k].offset != u->bufs[k].offset) return false;
    for (int k = 0; k < 4; k++)   /* p, m, v, g: each right after the span so far, by the same amount */
      if (!follows(&h->bufs[k], &u->bufs[k]) || u->bufs[k].offset - h->bufs[k].offset != u->bufs[0].offset - h->bufs[0].offset)
        return false;
    return true;
  }
  return h->which == RT_B_FILL && h->n_in == 0 && u->n_in == 0 && h->f[0] == u->f[0] && follows(&h->bufs[0], &u->bufs[0]);
}

/* AdamW over all parameters in a few steps: consecutive in-place adamw updates whose p, m,
   v and g are each contiguous (cpu_lower places a weight-decay group's parameters, their
   gradients and moments in the same order) run as one step over the span, and the fills
   that zero contiguous gradients as one fill.  A step moves into an earlier one only if
   no step emitted since conflicts with it (writes what it reads or writes, or reads what
   it writes).  The 64-byte gaps between tensors are zero in every region and stay zero
   under both (adamw of zeros is zero), so results are the same bits as one step per
   tensor. */
static void merge_updates(RtFunc *rf) {
  int out = 0, *tensors = calloc((size_t)rf->n_steps + 1, sizeof *tensors);   /* per kept step: merged into it */
  if (!tensors) return;   /* unmerged is correct, only slower */
  for (int s = 0; s < rf->n_steps; s++) {
    RtStep *u = &rf->steps[s];
    bool mergeable = u->kind == RT_STEP_BUILTIN && (u->which == RT_B_ADAMW || u->which == RT_B_FILL);
    int into = -1;
    for (int t = out - 1; mergeable && t >= 0; t--) {
      if (extends(&rf->steps[t], u)) {
        into = t;
        break;
      }
      if (conflict(&rf->steps[t], u)) break;   /* u may not move before t */
    }
    if (into >= 0) {   /* h covers [its start, the end of u) in each of its buffers */
      RtStep *h = &rf->steps[into];
      int64_t n = (u->bufs[0].offset - h->bufs[0].offset) / 4 + u->bufs[0].n;
      for (int k = 0; k < (u->which == RT_B_ADAMW ? 4 : 1); k++) h->bufs[k].n = n;
      h->i[0] = n;
      tensors[into]++;
      continue;
    }
    if (out != s) rf->steps[out] = *u;
    tensors[out++] = 1;
  }
  rf->n_steps = out;
  for (int t = 0; t < out; t++) cg_label_merged(&rf->steps[t], tensors[t]);
  free(tensors);
}

/* A collective start: the collective's step (just lowered) becomes RT_B_COLL_START with the
   collective and the start's handle in front of its ints (program.h). */
static int wrap_start(Lower *L, Steps *s) {
  if (L->n_handles >= RT_MAX_HANDLES) return lfail(L, "starts more than %d collectives in one function", RT_MAX_HANDLES);
  int h = L->n_handles++;
  L->handle[L->op->results[0]->id] = h;
  if (cg_wrap_start(&s->items[s->n - 1], h)) return lfail(L, "internal: a collective start did not lower to a collective");
  return 0;
}

/* A wait: RT_B_COLL_WAIT over its start's operand and result (the collective reads and
   writes them until here, so no step touching them is moved across it). */
static int lower_wait(Lower *L, Steps *s) {
  const Op *op = L->op, *start = op->operands[0]->def;
  if (op->operands[0]->kind != VAL_RESULT || !op_is_start(start->kind)) return lfail(L, "waits for no collective start");
  if (op->operands[0]->offset != op->results[0]->offset)
    return lfail(L, "the wait's result must share its start's buffer (run the memory-plan pass)");
  RtStep *st = new_step(L, s, RT_STEP_BUILTIN, RT_B_COLL_WAIT);
  if (!st) return IR_EINPUT;
  st->n_in = st->n_out = 1;
  if (buf_of(L, start->operands[0], &st->bufs[0]) || buf_of(L, op->results[0], &st->bufs[1])) return IR_EINPUT;
  st->i[0] = L->handle[op->operands[0]->id];
  return 0;
}

static int lower_func(Lower *L, const Func *f, RtFunc *rf) {
  L->f = f;
  L->op = NULL;
  char why[256];
  if (cg_func_head(f, rf, why, sizeof why)) return lfail(L, "%s", why);
  for (int i = 0; i < f->args.n; i++) {
    if (buf_of(L, f->args.items[i], &rf->args[i])) return IR_EINPUT;
    cg_describe_place(&((Value *)f->args.items[i])->type, &rf->arg_place[i]);
  }
  for (int i = 0; i < f->rets.n; i++)
    if (buf_of(L, f->rets.items[i], &rf->rets[i])) return IR_EINPUT;
  Steps s = {0};
  int rc = 0;
  L->skip = calloc((size_t)(f->ops.n ? f->ops.n : 1), sizeof(bool));
  L->handle = calloc((size_t)func_number((Func *)f) + 1, sizeof(int));
  L->n_handles = 0;
  if (!L->skip || !L->handle) {
    free(L->skip);
    free(L->handle);
    return lfail(L, "out of memory");
  }
  for (int i = 0; i < f->ops.n && !rc; i++) {
    L->op = f->ops.items[i];
    if (L->skip[i]) continue;
    int assigns[3];
    L->adamw_in_place = L->op->kind == OP_ADAMW && adamw_assigned_back(f, i, assigns);
    if (L->adamw_in_place)
      for (int k = 0; k < 3; k++) L->skip[assigns[k]] = true;
    switch (L->op->kind) {
    case OP_CALL: rc = lower_call(L, &s); break;
    case OP_MATMUL: rc = lower_matmul(L, &s); break;
    case OP_WAIT: rc = lower_wait(L, &s); break;
    default: rc = lower_builtin(L, &s); break;
    }
    if (!rc && op_is_start(L->op->kind)) rc = wrap_start(L, &s);
  }
  free(L->skip);
  free(L->handle);
  L->skip = NULL;
  L->handle = NULL;
  L->op = NULL;
  rf->steps = s.items;
  rf->n_steps = s.n;
  if (!rc) merge_updates(rf);
  return rc;
}

int cpu_lower(const Module *m, RtProgram *out, char **llvm_ir_text, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (llvm_ir_text) *llvm_ir_text = NULL;
  Lower L = {.m = m, .p = out, .err = err, .errlen = errlen};
  int nf = m->funcs.n, ng = m->globals.n, rc = 0;
  L.kernel_extent = calloc((size_t)(nf ? nf : 1), sizeof(int64_t));
  L.kernel_index = calloc((size_t)(nf ? nf : 1), sizeof(int));
  L.global_offset = calloc((size_t)(ng ? ng : 1), sizeof(int64_t));
  L.global_region = calloc((size_t)(ng ? ng : 1), sizeof(RtRegion));
  out->globals = calloc((size_t)(ng ? ng : 1), sizeof(RtGlobal));
  int n_kernels = 0, n_programs = 0;
  for (int i = 0; i < nf; i++) {
    if (((const Func *)m->funcs.items[i])->is_kernel) n_kernels++;
    else n_programs++;
  }
  out->kernel_names = calloc((size_t)(n_kernels ? n_kernels : 1), sizeof *out->kernel_names);
  out->funcs = calloc((size_t)(n_programs ? n_programs : 1), sizeof(RtFunc));
  if (!L.kernel_extent || !L.kernel_index || !L.global_offset || !L.global_region || !out->globals ||
      !out->kernel_names || !out->funcs) {
    rc = lfail(&L, "out of memory");
    goto done;
  }

  /* globals: one region per kind, 64-byte aligned, in placement order */
  out->n_globals = ng;
  cg_describe_mesh(&m->mesh, out);
  int *order = cg_placement_order(m);
  if (!order) {
    rc = lfail(&L, "out of memory");
    goto done;
  }
  for (int k = 0; k < ng && !rc; k++) {
    int i = order[k];
    const Global *g = m->globals.items[i];
    RtGlobal *rg = &out->globals[i];
    RtRegion r = cg_region_of(g);
    int64_t off = cg_align64(out->region_bytes[r]);
    if (cg_describe_global(g, &m->mesh, rg, off)) {
      rc = lfail(&L, "global $%s: the name is longer than %zu characters", g->name, sizeof rg->name - 1);
      break;
    }
    out->region_bytes[r] = off + 4 * rg->n;
    L.global_offset[i] = off;
    L.global_region[i] = r;
  }
  free(order);
  cg_describe_pipe(m, out);   /* the schedule and each global's stage: a pipeline needs no IR to run */
  for (int r = 0; r < RT_REGION_COUNT; r++) out->region_bytes[r] = cg_align64(out->region_bytes[r]);

  /* kernels: index, symbol and parallel extent */
  for (int i = 0; i < nf && !rc; i++) {
    const Func *f = m->funcs.items[i];
    L.kernel_index[i] = -1;
    if (!f->is_kernel) continue;
    if (strlen(f->name) >= sizeof out->kernel_names[0]) {
      rc = lfail(&L, "kernel @%s: the name is longer than %zu characters", f->name, sizeof out->kernel_names[0] - 1);
      break;
    }
    L.kernel_index[i] = out->n_kernels;
    snprintf(out->kernel_names[out->n_kernels++], sizeof out->kernel_names[0], "%s", f->name);
    rc = cpu_kernel_extent(f, &L.kernel_extent[i], err, errlen);
  }

  /* program functions */
  for (int i = 0; i < nf && !rc; i++) {
    const Func *f = m->funcs.items[i];
    if (f->is_kernel) continue;
    rc = lower_func(&L, f, &out->funcs[out->n_funcs++]);
  }
  if (!rc && llvm_ir_text) rc = cpu_emit_llvm(m, llvm_ir_text, err, errlen);

done:
  free(L.kernel_extent);
  free(L.kernel_index);
  free(L.global_offset);
  free(L.global_region);
  if (rc) rt_program_free(out);
  return rc;
}
