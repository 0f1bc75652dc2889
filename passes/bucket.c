/* passes/bucket.c — pass "bucket": data-parallel gradient all-reduces in buckets.
 *
 * After the shard pass, @optimizer_step all-reduces every gradient accumulator over dp on
 * its own (`%g = all_reduce $grad.X {axis="dp"}`): one collective per parameter, 148 for
 * GPT-2, each paying the collective's latency.  This pass packs them into buckets of at
 * most TrainSettings.bucket_mb megabytes (10^6 bytes; a gradient larger than that is a
 * bucket alone) and at most 15 gradients (a concat is one runtime step of at most 16
 * buffers), in the order the backward produces the gradients (the order of the
 * `accumulate $grad.X` ops in @grad_step: last layer first), as PyTorch DDP does with its
 * bucket_cap_mb (default 25).  A bucket of k > 1 gradients becomes
 *
 *     %f_i = reshape $grad.X_i : f32[n_i]            (P over dp, as the gradient)
 *     %c   = concat %f_1 .. %f_k {dim=0} : f32[N]    (P)
 *     %r   = all_reduce %c {axis="dp", n=...}        (R)
 *     %s_i = slice %r [o_i, o_i + n_i) ; reshape to the gradient's type
 *
 * placed where the bucket's first all-reduce was, and every use of an old all-reduce reads
 * its slice.  The sums are the same numbers (a sum over ranks per element), so results do
 * not change; the bytes sent do not change either; the count of collectives drops.
 *
 * Bucketed: gradients whose placement is P over dp and R on every other axis, in f32 or
 * bf16 alike within a bucket.  Gradients split over tp (S) keep their own all-reduce, and
 * ZeRO's reduce-scatters and all-gathers stay per tensor (each rank's shard of each
 * parameter; flat-buffer sharding would change the layout of the optimizer state).
 * ZeRO-0 with one micro-batch a step all-reduces each gradient in @grad_step instead, as the
 * backward makes it (shard_dp.c): those all-reduces are bucketed the same way, in program
 * order, each bucket placed where its last gradient is complete, so the overlap pass can
 * start it while the rest of the backward runs (DDP's buckets).
 * bucket_mb = 0 turns the pass off. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

/* A bucket's concat is one runtime step: its inputs and output fit in FUSE_MAX_BUFS buffers. */
#define BUCKET_MAX (FUSE_MAX_BUFS - 1)

typedef struct {
  Op *op;          /* the all_reduce */
  int pos;         /* its index in @optimizer_step */
  int order;       /* when the backward produces the gradient */
  int64_t n;       /* elements */
  double bytes;
  Op *reader;      /* @grad_step: the accumulate that reads the all-reduce (moved after its bucket) */
  int reader_pos;
} Member;

static bool dp_partial_only(const Type *t) {
  for (int a = 0; a < AX_COUNT; a++)
    if (t->sh.kind[a] != (a == AX_DP ? SH_P : SH_R)) return false;
  return true;
}

static int by_order(const void *a, const void *b) {
  const Member *x = a, *y = b;
  return (x->order > y->order) - (x->order < y->order);
}

/* Packs mem[0..nm) (sorted by production order) of function f into buckets of at most cap
   bytes: each bucket's reshape, concat, all-reduce and slices are placed before its first
   member's position (at_last = false: @optimizer_step's members read globals, there from
   the top) or before its last member's (at_last = true: @grad_step's members reduce values
   the backward computes, all of them there by the last). */
static int pack(Module *m, Func *f, Member *mem, int nm, bool at_last, double cap, PassContext *ctx, char *err,
                size_t errlen) {
  int n0 = f->ops.n, fn = func_number(f), changed = 0;
  Value **repl = calloc((size_t)fn + 1, sizeof *repl), **old = calloc((size_t)fn + 1, sizeof *old);
  /* per op index of f: the new ops to place before it, and whether it goes */
  PtrVec *before = calloc((size_t)n0 + 1, sizeof *before);
  bool *drop = calloc((size_t)n0 + 1, sizeof *drop);
  if (!repl || !old || !before || !drop) {
    free(repl), free(old), free(before), free(drop);
    snprintf(err, errlen, "bucket: out of memory");
    return IR_ERUN;
  }
  Builder b = {f, ""};
  int rc = 0;
  for (int s = 0; s < nm && !rc;) {
    /* the bucket: consecutive members (production order) up to the cap, of one dtype */
    int e = s + 1;
    double bytes = mem[s].bytes;
    while (e < nm && e - s < BUCKET_MAX && bytes + mem[e].bytes <= cap &&
           mem[e].op->operands[0]->type.dtype == mem[s].op->operands[0]->type.dtype)
      bytes += mem[e++].bytes;
    if (e - s < 2) {
      s = e;
      continue;
    }
    int at = mem[s].pos, k = e - s;
    for (int j = s; j < e; j++) at = (at_last ? mem[j].pos > at : mem[j].pos < at) ? mem[j].pos : at;
    int mark = f->ops.n;
    Value **flat = calloc((size_t)k, sizeof *flat);
    for (int j = 0; j < k; j++) {
      Value *g = mem[s + j].op->operands[0];
      Type t = g->type;
      t.rank = 1;
      t.dims[0] = mem[s + j].n;
      flat[j] = build_typed(&b, OP_RESHAPE, g, t, NULL);
    }
    Op *cat = build_begin(&b, OP_CONCAT, flat, k);
    op_set_int(cat, "dim", 0);
    Value *c = build_end(&b, NULL);
    c->type.sh = flat[0]->type.sh;   /* still partial over dp: the all-reduce sums it */
    Op *ar = build_begin(&b, OP_ALL_REDUCE, &c, 1);
    ar->attrs[0] = mem[s].op->attrs[0];   /* axis, n and reduce as the originals */
    ar->attrs[1] = mem[s].op->attrs[1];
    ar->attrs[2] = mem[s].op->attrs[2];
    Value *r = build_end(&b, "grad_bucket");
    int64_t off = 0;
    for (int j = 0; j < k; j++) {
      Op *prev = mem[s + j].op;
      int64_t start = off, end = off + mem[s + j].n;
      Op *sl = build_begin(&b, OP_SLICE, &r, 1);
      op_set_ints(m, sl, "start", &start, 1);
      op_set_ints(m, sl, "end", &end, 1);
      Value *piece = build_end(&b, NULL);
      Value *back = build_typed(&b, OP_RESHAPE, piece, prev->results[0]->type, prev->results[0]->name);
      repl[prev->results[0]->id] = back;
      old[prev->results[0]->id] = prev->results[0];
      drop[mem[s + j].pos] = true;
      off = end;
    }
    for (int j = 0; j < k; j++)   /* each accumulate follows its slice: the bucket is reduced by then */
      if (mem[s + j].reader) {
        ptrvec_push(m->arena, &f->ops, mem[s + j].reader);
        drop[mem[s + j].reader_pos] = true;
      }
    free(flat);
    if (b.err[0]) {
      snprintf(err, errlen, "bucket: %s", b.err);
      rc = IR_ERUN;
      break;
    }
    for (int q = mark; q < f->ops.n; q++) ptrvec_push(m->arena, &before[at], f->ops.items[q]);
    f->ops.n = mark;   /* placed below, before the op at `at` */
    changed++;
    s = e;
  }
  if (!rc && changed) {
    ctx->changed += changed;
    /* rebuild the op list: each bucket at its place; old all-reduces dropped */
    int out = 0, cap_items = f->ops.n + 1;
    for (int i = 0; i < n0; i++) cap_items += before[i].n;
    void **all = malloc(sizeof(void *) * (size_t)cap_items);
    if (!all) {
      rc = IR_ERUN;
      snprintf(err, errlen, "bucket: out of memory");
    } else {
      for (int i = 0; i < n0; i++) {
        for (int q = 0; q < before[i].n; q++) all[out++] = before[i].items[q];
        if (!drop[i]) all[out++] = f->ops.items[i];
      }
      f->ops.n = 0;
      for (int q = 0; q < out; q++) ptrvec_push(m->arena, &f->ops, all[q]);
      free(all);
      /* every use of an old all-reduce reads its slice (the new values' ids are not numbered:
         match the old values by pointer) */
      for (int i = 0; i < f->ops.n; i++) {
        Op *op = f->ops.items[i];
        for (int q = 0; q < op->n_operands; q++) {
          Value *v = op->operands[q];
          if (v->kind == VAL_RESULT && v->id >= 0 && v->id < fn && repl[v->id] && old[v->id] == v)
            op->operands[q] = repl[v->id];
        }
      }
      for (int i = 0; i < f->rets.n; i++) {
        Value *v = f->rets.items[i];
        if (v->kind == VAL_RESULT && v->id >= 0 && v->id < fn && repl[v->id] && old[v->id] == v)
          f->rets.items[i] = repl[v->id];
      }
    }
  }
  free(repl), free(old), free(before), free(drop);
  return rc;
}

static bool is_dp_sum(const Op *op) {
  return op->kind == OP_ALL_REDUCE && !strcmp(op_attr(op, "axis")->s, "dp") && !strcmp(op_attr(op, "reduce")->s, "sum");
}

/* @optimizer_step's all-reduces of $grad.X, in the order the backward produces them. */
static int optimizer_members(Func *f, Func *gs, Member *mem) {
  int nm = 0;
  /* when the backward produces each gradient: the index in @grad_step of the op that
     computes the value accumulated into $grad.X */
  int gn = gs ? func_number(gs) : 0;
  int *def_pos = calloc((size_t)gn + 1, sizeof *def_pos);
  if (!def_pos) return -1;
  for (int k = 0; gs && k < gs->ops.n; k++) {
    const Op *o = gs->ops.items[k];
    for (int r = 0; r < o->n_results; r++) def_pos[o->results[r]->id] = k;
  }
  for (int i = 0; i < f->ops.n; i++) {
    Op *op = f->ops.items[i];
    if (!is_dp_sum(op)) continue;
    const Value *g = op->operands[0];
    if (g->kind != VAL_GLOBAL || strncmp(g->global->name, GRAD_PREFIX, strlen(GRAD_PREFIX)) ||
        !dtype_is_float(g->type.dtype) || !dp_partial_only(&g->type))
      continue;
    int order = gs ? gs->ops.n : 0;   /* not accumulated in @grad_step: last */
    for (int k = 0; gs && k < gs->ops.n; k++) {
      const Op *acc = gs->ops.items[k];
      if (acc->kind == OP_ACCUMULATE && acc->operands[0] == g) {
        const Value *x = acc->operands[1];
        order = x->kind == VAL_RESULT ? def_pos[x->id] : k;
        break;
      }
    }
    int64_t n = type_numel(&g->type);
    mem[nm++] = (Member){op, i, order, n, (double)n * dtype_size(g->type.dtype), NULL, -1};
  }
  free(def_pos);
  /* stable: equal orders keep program order (qsort is not stable, so break ties by pos) */
  for (int i = 0; i < nm; i++) mem[i].order = mem[i].order * (f->ops.n + 1) + mem[i].pos;
  qsort(mem, (size_t)nm, sizeof *mem, by_order);
  return nm;
}

/* @grad_step's all-reduces of gradients the backward computes (ZeRO-0 with one micro-batch a
   step: shard_dp.c), whose one reader accumulates into $grad.X, in program order. */
static int step_members(Func *gs, Member *mem) {
  int nm = 0, gn = func_number(gs);
  int *uses = calloc((size_t)gn + 1, sizeof *uses), *reader = calloc((size_t)gn + 1, sizeof *reader);
  int *n_acc = calloc((size_t)gs->module->globals.n + 1, sizeof *n_acc);
  if (!uses || !reader || !n_acc) {
    free(uses), free(reader), free(n_acc);
    return -1;
  }
  for (int k = 0; k < gs->ops.n; k++) {
    const Op *o = gs->ops.items[k];
    bool acc = o->kind == OP_ACCUMULATE && o->operands[0]->kind == VAL_GLOBAL &&
               !strncmp(o->operands[0]->global->name, GRAD_PREFIX, strlen(GRAD_PREFIX));
    if (acc) n_acc[o->operands[0]->global->index]++;
    for (int q = 0; q < o->n_operands; q++) {
      const Value *v = o->operands[q];
      if (v->kind != VAL_RESULT) continue;
      uses[v->id]++;
      if (acc && q == 1) reader[v->id] = k + 1;
    }
  }
  for (int i = 0; i < gs->rets.n; i++) {
    const Value *v = gs->rets.items[i];
    if (v->kind == VAL_RESULT) uses[v->id]++;
  }
  for (int k = 0; k < gs->ops.n; k++) {
    Op *op = gs->ops.items[k];
    if (!is_dp_sum(op)) continue;
    const Value *g = op->operands[0], *r = op->results[0];
    /* one reader, an accumulate, the global's only one: the sum is then AR(g) however it is
       packed (two accumulates of reduced parts would round differently from the reduction of
       their sum, which the optimizer step's reduction computes) */
    if (g->kind != VAL_RESULT || !dtype_is_float(g->type.dtype) || !dp_partial_only(&g->type) || uses[r->id] != 1 ||
        !reader[r->id])
      continue;
    Op *acc = gs->ops.items[reader[r->id] - 1];
    if (n_acc[acc->operands[0]->global->index] != 1) continue;
    int64_t n = type_numel(&g->type);
    mem[nm++] = (Member){op, k, k, n, (double)n * dtype_size(g->type.dtype), acc, reader[r->id] - 1};
  }
  free(uses), free(reader), free(n_acc);
  return nm;
}

static int run(Module *m, PassContext *ctx, char *err, size_t errlen) {
  const TrainSettings *ts = ctx->opt && ctx->opt->train ? ctx->opt->train : &train_defaults;
  Func *f = module_find_func(m, "optimizer_step"), *gs = module_find_func(m, "grad_step");
  if (!m->local || ts->bucket_mb <= 0 || !f || m->mesh.size[AX_DP] < 2) return 0;
  double cap = ts->bucket_mb * 1e6;
  int rc = 0;
  for (int pass = 0; pass < 2 && !rc; pass++) {
    Func *in = pass == 0 ? f : gs;
    if (!in) continue;
    Member *mem = calloc((size_t)in->ops.n + 1, sizeof *mem);
    int nm = !mem ? -1 : pass == 0 ? optimizer_members(f, gs, mem) : step_members(gs, mem);
    if (nm < 0) {
      free(mem);
      snprintf(err, errlen, "bucket: out of memory");
      return IR_ERUN;
    }
    rc = pack(m, in, mem, nm, pass == 1, cap, ctx, err, errlen);
    free(mem);
  }
  return rc;
}

const Pass pass_bucket = {"bucket", "data-parallel gradient all-reduces in buckets of bucket_mb (production order)",
                          run};
