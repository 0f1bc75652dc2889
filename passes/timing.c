/* passes/timing.c — the time model of one training step (timing.h says what goes in).
 *
 * One op, on one rank:
 *   matmul, attention(_grad)   max(FLOPs / (peak[dtype] · eff_matmul|eff_attention),
 *                                  bytes / (mem_bw · eff_memory))
 *   everything else that runs  bytes / (mem_bw · eff)                (memory bound; eff the
 *                              op's category's efficiency, timing_category, else eff_memory)
 *   reshape                    0 (an alias of its operand's bytes)
 *   a call of a fused kernel   its operands' and results' bytes (the kernel keeps the rest in
 *                              registers), plus the FLOPs of any matmul inside
 *   a collective or transfer   the alpha-beta time below, over the link of its axis, on the
 *                              rank's communication queue (one collective at a time): a
 *                              blocking one waits for itself, an async start runs until its
 *                              wait while the ops between compute; the idle time of waits is
 *                              the exposed communication
 * and every op that runs adds hw->op_overhead.  FLOPs are flops.c's (model FLOPs: causal
 * attention over the whole square); bytes are every operand's and result's elements at their
 * dtype's size.
 *
 * Ring collectives over n ranks, per-rank buffer S bytes, link bandwidth beta (one direction,
 * one device), latency alpha per step (the playbook's appendix A0; NCCL's ring):
 *   all_reduce = reduce_scatter + all_gather: 2(n-1) steps, each sends S/n
 *   all_gather, reduce_scatter, all_to_all:    (n-1) steps, each sends S/n
 * Links: an axis's groups are intra-node when they fit in one node under the placement
 * (timing_axis_link), else the inter-node link is the bottleneck.
 */
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"
#include "passes/timing.h"
#include "ir/schedule.h"

void hardware_default_order(int order[AX_COUNT]) {
  order[0] = AX_TP, order[1] = AX_CP, order[2] = AX_EP, order[3] = AX_DP, order[4] = AX_PP;
}

int timing_axis_link(const Hardware *hw, const Mesh *mesh, int axis) {
  int64_t stride = 1;
  for (int i = 0; i < AX_COUNT && hw->axis_order[i] != axis; i++) stride *= mesh->size[hw->axis_order[i]];
  int64_t span = stride * mesh->size[axis];
  return hw->devices_per_node > 0 && span <= hw->devices_per_node ? LINK_INTRA : LINK_INTER;
}

double timing_collective(OpKind kind, int64_t n, double bytes, double beta, double alpha) {
  if (kind == OP_SEND || kind == OP_RECV) return alpha + bytes / beta;
  if (n <= 1) return 0;
  double steps = (double)(n - 1), part = bytes / (double)n;
  if (kind == OP_ALL_REDUCE) steps *= 2;
  return steps * (alpha + part / beta);
}

static double value_bytes(const Value *v) { return (double)type_numel(&v->type) * (double)dtype_size(v->type.dtype); }

/* The dtype an op's arithmetic runs in: its first floating operand's. */
static DType compute_dtype(const Op *op) {
  for (int i = 0; i < op->n_operands; i++)
    if (op->operands[i]->type.dtype != DT_I32 && op->operands[i]->type.dtype != DT_I64) return op->operands[i]->type.dtype;
  return DT_F32;
}

static double peak_of(const Hardware *hw, DType dt) {
  return hw->peak_flops[dt] > 0 ? hw->peak_flops[dt] : hw->peak_flops[DT_F32];
}

typedef struct {
  const Value *v;
  double f;
} Frac;

typedef struct {
  const Hardware *hw;
  const Mesh *mesh;
  StepTime *t;      /* accumulates compute_s, memory_s, overhead_s, comm_s, model_flops */
  double scale;     /* how many times the function runs per step */
  /* the function's timeline: compute runs on one clock, collectives one after another on
     the rank's communication queue (a thread or stream); a start enqueues, its wait (or a
     blocking collective) waits for it */
  double clock, comm_free, exposed;
  const Value **pending;   /* a start's result -> its end time */
  double *pending_end;
  int n_pending, cap_pending;
  const FuncFigures *given;   /* the first n_given of m->funcs: a call's time given (loom plan) */
  int n_given;
  /* Expert space (shard_ep.c): values sized for the worst case, every rank's rows to this
     rank's experts (ep x its rows), of which balanced routing fills a fraction: the grouped
     matmul's `routed` rows over its buffer's, the all_to_allv's rows over its result's.
     Values of the same rows computed from them carry it.  A hash by pointer, per function. */
  Frac *frac;
  int cap_frac, n_frac;
} Acc;

static unsigned frac_slot(const Acc *a, const Value *v) {
  return (unsigned)(((uintptr_t)v >> 4) * 2654435761u) & (unsigned)(a->cap_frac - 1);
}

static double frac_of(const Acc *a, const Value *v) {
  if (!a->n_frac) return 1;
  for (unsigned i = frac_slot(a, v);; i = (i + 1) & (unsigned)(a->cap_frac - 1)) {
    if (!a->frac[i].v) return 1;
    if (a->frac[i].v == v) return a->frac[i].f;
  }
}

static void frac_set(Acc *a, const Value *v, double f) {
  if (f >= 1) return;
  if (2 * (a->n_frac + 1) > a->cap_frac) {   /* grow (and rehash) */
    int old = a->cap_frac;
    Frac *was = a->frac;
    a->cap_frac = old ? 2 * old : 1024;
    a->frac = calloc((size_t)a->cap_frac, sizeof *a->frac);
    a->n_frac = 0;
    for (int i = 0; i < old; i++)
      if (was[i].v) frac_set(a, was[i].v, was[i].f);
    free(was);
  }
  unsigned i = frac_slot(a, v);
  while (a->frac[i].v && a->frac[i].v != v) i = (i + 1) & (unsigned)(a->cap_frac - 1);
  if (!a->frac[i].v) a->n_frac++;
  a->frac[i].v = v, a->frac[i].f = f;
}

static double func_time(const Func *f, Acc *a);

/* The bytes an op moves: its operands and results, expert-space ones as far as routing fills them. */
static double op_io_bytes(const Op *op, const Acc *a) {
  double b = 0;
  if (op->kind == OP_EMBEDDING) return 2 * value_bytes(op->results[0]) + value_bytes(op->operands[1]);
  if (op->kind == OP_EMBEDDING_GRAD) return 2 * value_bytes(op->operands[0]) + value_bytes(op->operands[1]);
  for (int i = 0; i < op->n_operands; i++) b += value_bytes(op->operands[i]) * frac_of(a, op->operands[i]);
  for (int i = 0; i < op->n_results; i++) b += value_bytes(op->results[i]) * frac_of(a, op->results[i]);
  return b;
}

/* The fraction of op's results routing fills (see Acc.frac), from its kind or its operands. */
static void note_frac(const Op *op, Acc *a) {
  if (!op->n_results || !op->n_operands || op->results[0]->type.rank < 1) return;
  int64_t rows = op->results[0]->type.dims[0];
  double f = 1;
  if (op->kind == OP_GROUPED_MATMUL && op_int(op, "routed") > 0 && op->operands[0]->type.rank >= 1)
    f = (double)op_int(op, "routed") / (double)op->operands[0]->type.dims[0];
  else if (op->kind == OP_ALL_TO_ALLV)
    f = value_bytes(op->operands[0]) / value_bytes(op->results[0]);
  else
    for (int i = 0; i < op->n_operands; i++) {
      const Value *v = op->operands[i];
      double g = frac_of(a, v);
      if (g < f && v->type.rank >= 1 && v->type.dims[0] == rows) f = g;
    }
  if (f < 1)
    for (int r = 0; r < op->n_results; r++)
      if (op->results[r]->type.rank >= 1 && op->results[r]->type.dims[0] == rows) frac_set(a, op->results[r], f);
}

/* The collective an op starts or is: X for X and X_start (by name, so any async op the
   overlap pass adds is timed as its collective); -1 for ops that are not collectives. */
static int collective_of(const Op *op) {
  const OpInfo *info = op_info(op->kind);
  if (info->cls != CLASS_COLLECTIVE || op->kind == OP_SHARD_SLICE || op->kind == OP_SHARD_PAD) return -1;
  size_t n = strlen(info->name);
  OpKind k;
  if (n > 6 && !strcmp(info->name + n - 6, "_start")) return op_lookup(info->name, n - 6, &k) ? -1 : (int)k;
  return (int)op->kind;
}

static bool is_wait(const Op *op) { return !strcmp(op_info(op->kind)->name, "wait"); }

/* Advances the rank's clock to `end` (a collective's completion), counting the wait. */
static void wait_until(Acc *a, double end) {
  if (end > a->clock) a->exposed += end - a->clock, a->clock = end;
}

const char *const timing_cat_names[TC_COUNT] = {"norm", "elementwise", "loss", "optimizer", "cast", "reduce", "copy"};

static int builtin_category(OpKind k) {
  switch (k) {
  case OP_LAYERNORM: case OP_RMSNORM: case OP_LAYERNORM_GRAD: case OP_RMSNORM_GRAD: return TC_NORM;
  case OP_CROSS_ENTROPY: case OP_CROSS_ENTROPY_GRAD: case OP_TARGET_PICK: return TC_LOSS;
  case OP_ADAMW: return TC_OPTIMIZER;
  case OP_CAST: return TC_CAST;
  case OP_ACCUMULATE: case OP_SOFTMAX: case OP_SOFTMAX_GRAD: case OP_ROPE: case OP_ROPE_AT: return TC_ELEMENTWISE;
  case OP_TOPK: case OP_MOE_COUNT: case OP_MOE_WEIGHT_GRAD: return TC_REDUCE;
  default: break;
  }
  switch (op_info(k)->cls) {
  case CLASS_ELEMENTWISE: return TC_ELEMENTWISE;
  case CLASS_REDUCTION: return TC_REDUCE;
  default: return TC_COPY;   /* data movement: transpose, slice, pad, concat, broadcast, embedding, gathers, fills */
  }
}

/* A builtin by its kind; a call of a fused kernel by what is inside, as cost.c names the
   kernels: a norm or the loss if it holds one, else a reduction if it reduces, a cast if it
   only casts, else elementwise. */
int timing_category(const Op *op) {
  if (op->kind != OP_CALL || !op->callee) return builtin_category(op->kind);
  const Func *k = op->callee;
  bool reduces = false, casts_only = k->ops.n > 0;
  for (int i = 0; i < k->ops.n; i++) {
    const Op *o = k->ops.items[i];
    int c = builtin_category(o->kind);
    if (c == TC_NORM || c == TC_LOSS) return c;
    reduces |= c == TC_REDUCE;
    casts_only &= o->kind == OP_CAST || o->kind == OP_RESHAPE;
  }
  return reduces ? TC_REDUCE : casts_only ? TC_CAST : TC_ELEMENTWISE;
}

/* Runs one op on the timeline; returns its own duration (for the top list). */
static double op_time(const Op *op, Acc *a) {
  note_frac(op, a);
  const Hardware *hw = a->hw;
  if (op->kind == OP_RESHAPE) return 0;
  if (is_wait(op)) {
    for (int i = 0; i < a->n_pending; i++)
      if (a->pending[i] == op->operands[0]) {
        wait_until(a, a->pending_end[i]);
        a->pending[i] = a->pending[--a->n_pending], a->pending_end[i] = a->pending_end[a->n_pending];
        break;
      }
    return 0;
  }
  int coll = collective_of(op);
  /* A ring's transfers (context parallelism): the send goes on the communication link while
     the rank computes; the recv waits for it (every rank sends alike, so the block it waits
     for arrives when its own send is done). */
  bool ring = (op->kind == OP_SEND || op->kind == OP_RECV) && op_bool(op, "rel");
  if (ring && op->kind == OP_RECV) {
    wait_until(a, a->comm_free);
    return 0;
  }
  if (coll >= 0) {
    const Attr *ax = op_attr(op, "axis");
    int axis = ax ? mesh_axis_parse(ax->s) : -1;
    if (axis < 0) return 0;
    double bytes = 0;
    for (int i = 0; i < op->n_operands; i++) {
      double b = value_bytes(op->operands[i]);
      if (b > bytes) bytes = b;
    }
    for (int i = 0; i < op->n_results; i++) {
      double b = value_bytes(op->results[i]);
      if (b > bytes) bytes = b;
    }
    /* all_to_allv: expert space is sized for the worst case (every rank's rows to one rank's
       experts: ep x its rows); balanced routing moves the rank's own rows each way, the smaller
       side (as `--collectives` counts it). Taking the larger side made it ep times too slow. */
    if (coll == OP_ALL_TO_ALLV && op->n_results) {
      double in = value_bytes(op->operands[0]), out = value_bytes(op->results[0]);
      bytes = in < out ? in : out;
    }
    int link = timing_axis_link(hw, a->mesh, axis);
    double s = timing_collective((OpKind)coll, op_int(op, "n"), bytes, hw->link_bw[link] * hw->eff_link, hw->link_lat[link]);
    a->t->comm_s[axis] += a->scale * s;
    double begin = a->comm_free > a->clock ? a->comm_free : a->clock;
    a->comm_free = begin + s;
    if (ring) return s;   /* its recv waits */
    if (coll != (int)op->kind && op->n_results == 1) {   /* a start: its wait comes later */
      if (a->n_pending == a->cap_pending) {
        a->cap_pending = a->cap_pending ? 2 * a->cap_pending : 64;
        a->pending = realloc(a->pending, sizeof *a->pending * (size_t)a->cap_pending);
        a->pending_end = realloc(a->pending_end, sizeof *a->pending_end * (size_t)a->cap_pending);
      }
      a->pending[a->n_pending] = op->results[0], a->pending_end[a->n_pending++] = a->comm_free;
    } else {
      wait_until(a, a->comm_free);   /* blocking */
    }
    return s;
  }
  /* flops_op: matmul and attention FLOPs, a call's through its kernel; 0 for the rest */
  double flops = flops_op(op), bytes = op_io_bytes(op, a);
  bool attn = op->kind == OP_ATTENTION || op->kind == OP_ATTENTION_GRAD || op->kind == OP_ATTENTION_BLOCK ||
              op->kind == OP_ATTENTION_BLOCK_GRAD;
  double eff = attn ? hw->eff_attention : hw->eff_matmul;
  double tc = flops > 0 ? flops / (peak_of(hw, compute_dtype(op)) * eff) : 0;
  int cat = flops > 0 ? -1 : timing_category(op);
  double eff_mem = cat >= 0 && hw->eff_cat[cat] > 0 ? hw->eff_cat[cat] : hw->eff_memory;
  double tm = bytes / (hw->mem_bw * eff_mem);
  a->t->model_flops += a->scale * flops;
  if (tc >= tm && tc > 0) a->t->compute_s += a->scale * tc;
  else {
    a->t->memory_s += a->scale * tm;
    if (cat >= 0) a->t->memory_cat_s[cat] += a->scale * tm;
  }
  a->t->overhead_s += a->scale * hw->op_overhead;
  double d = (tc > tm ? tc : tm) + hw->op_overhead;
  a->clock += d;
  return d;
}

/* Keeps the TIMING_TOP ops with the most time per step, largest first. */
static void note_top(StepTime *t, const Func *f, const Op *op, double s) {
  int k = TIMING_TOP;
  while (k > 0 && (!t->top[k - 1].op || t->top[k - 1].s < s)) k--;
  if (k == TIMING_TOP) return;
  memmove(&t->top[k + 1], &t->top[k], sizeof t->top[0] * (size_t)(TIMING_TOP - 1 - k));
  t->top[k].func = f, t->top[k].op = op, t->top[k].s = s;
}

/* One call of f: the time from its first op to its last, waits for collectives included
   (a start left unwaited at the end is waited for there). */
static double func_time(const Func *f, Acc *a) {
  a->clock = a->comm_free = a->exposed = 0;
  a->n_pending = 0;
  if (a->n_frac) memset(a->frac, 0, sizeof *a->frac * (size_t)a->cap_frac);
  a->n_frac = 0;
  for (int i = 0; i < f->ops.n; i++) {
    double t = op_time(f->ops.items[i], a);
    if (t > 0) note_top(a->t, f, f->ops.items[i], t * a->scale);
  }
  wait_until(a, a->comm_free);
  a->t->exposed_comm_s += a->scale * a->exposed;
  return a->clock;
}

static double run_func(const Module *m, const char *name, Acc *a, double scale, bool *found) {
  int i = 0;
  while (i < m->funcs.n && strcmp(((const Func *)m->funcs.items[i])->name, name)) i++;
  *found = i < m->funcs.n;
  if (!*found) return 0;
  if (i < a->n_given && a->given[i].given) return a->given[i].call_s;   /* its ops are not walked: no class totals */
  a->scale = scale;
  return func_time(m->funcs.items[i], a);
}

double timing_call_s(const Func *f, const Module *m, const Hardware *hw) {
  StepTime t;
  memset(&t, 0, sizeof t);
  Acc a = {.hw = hw, .mesh = &m->mesh, .t = &t, .scale = 1};
  double s = func_time(f, &a);
  free(a.pending), free(a.pending_end), free(a.frac);
  return s;
}

static void finish(StepTime *t, const Module *m, const Hardware *hw) {
  /* The peak the MFU is against: the matmuls' dtype (bf16 when any operand of a matmul is). */
  DType dt = DT_F32;
  for (int i = 0; i < m->funcs.n && dt == DT_F32; i++) {
    const Func *f = m->funcs.items[i];
    for (int k = 0; k < f->ops.n; k++) {
      const Op *op = f->ops.items[k];
      if (op->kind == OP_MATMUL && compute_dtype(op) != DT_F32) dt = compute_dtype(op);
    }
  }
  t->peak_flops = peak_of(hw, dt);
  t->mfu = t->step_s > 0 && t->peak_flops > 0 ? t->model_flops / (t->step_s * t->peak_flops) : 0;
  for (int k = 0; k < AX_COUNT; k++) t->link[k] = m->mesh.size[k] > 1 ? timing_axis_link(hw, &m->mesh, k) : LINK_INTRA;
}

int timing_predict(const Module *m, const Hardware *hw, int64_t grad_accum, StepTime *out, char *err, size_t errlen) {
  return timing_predict_given(m, hw, grad_accum, NULL, 0, out, err, errlen);
}

int timing_predict_given(const Module *m, const Hardware *hw, int64_t grad_accum, const FuncFigures *given, int n_given,
                         StepTime *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (hw->mem_bw <= 0 || hw->peak_flops[DT_F32] <= 0 || hw->link_bw[0] <= 0 || hw->link_bw[1] <= 0 ||
      hw->eff_matmul <= 0 || hw->eff_attention <= 0 || hw->eff_memory <= 0 || hw->eff_link <= 0) {
    snprintf(err, errlen, "hardware '%s': peaks, bandwidths and efficiencies must be positive", hw->name);
    return 2;
  }
  Acc a = {.hw = hw, .mesh = &m->mesh, .t = out, .scale = 1, .given = given, .n_given = n_given};
  bool found;
  if (m->pipe.chunks > 0) {
    Schedule s;
    int rc = schedule_build(m->pipe.kind, (int)m->mesh.size[AX_PP], (int)m->pipe.virt, (int)m->pipe.micro, &s, err, errlen);
    if (rc) return rc;
    if (s.chunks > 256) {
      schedule_free(&s);
      snprintf(err, errlen, "more than 256 pipeline chunks");
      return 2;
    }
    double cost[256][3];
    const char *pre[3][2] = {{"fwd", "fwd"}, {"bwd", "bwd_b"}, {"bwd", "bwd_w"}};
    for (int c = 0; c < s.chunks; c++)
      for (int k = 0; k < 3; k++) {
        cost[c][k] = 0;
        if (k == 2 && !s.split_bw) continue;
        char name[64];
        snprintf(name, sizeof name, "%s.c%d", pre[k][s.split_bw], c);
        /* the cost of one call; the class totals count every micro-batch's call */
        cost[c][k] = run_func(m, name, &a, (double)m->pipe.micro, &found);
        if (!found) {
          schedule_free(&s);
          free(a.pending), free(a.pending_end), free(a.frac);
          snprintf(err, errlen, "the pipelined module has no @%s", name);
          return 2;
        }
      }
    SimResult sim;
    rc = schedule_simulate(&s, (const double (*)[3])cost, &sim, err, errlen);
    if (rc) {
      schedule_free(&s);
      free(a.pending), free(a.pending_end), free(a.frac);
      return rc;
    }
    double busy_max = 0;
    for (int r = 0; r < s.p; r++) {
      double busy = 0;
      for (int k = 0; k < s.n[r]; k++) busy += sim.end[r][k] - sim.start[r][k];
      if (busy > busy_max) busy_max = busy;
    }
    out->bubble_s = sim.makespan - busy_max;
    /* the chunk totals above cover every stage: per-rank averages */
    out->compute_s /= s.p, out->memory_s /= s.p, out->overhead_s /= s.p, out->model_flops /= s.p;
    out->exposed_comm_s /= s.p;
    for (int k = 0; k < AX_COUNT; k++) out->comm_s[k] /= s.p;
    /* every stage's own optimizer step; the step waits for the slowest */
    double opt = 0;
    for (int r = 0; r < s.p; r++) {
      char name[64];
      snprintf(name, sizeof name, "optimizer_step.s%d", r);
      StepTime one = {0};
      Acc b = {.hw = hw, .mesh = &m->mesh, .t = &one, .scale = 1, .given = given, .n_given = n_given};
      double t = run_func(m, name, &b, 1, &found);
      free(b.pending), free(b.pending_end), free(b.frac);
      if (t > opt) opt = t;
      out->exposed_comm_s += one.exposed_comm_s / s.p;
      out->compute_s += one.compute_s / s.p, out->memory_s += one.memory_s / s.p;
      out->overhead_s += one.overhead_s / s.p, out->model_flops += one.model_flops / s.p;
      for (int k = 0; k < AX_COUNT; k++) out->comm_s[k] += one.comm_s[k] / s.p;
    }
    out->optimizer_s = opt;
    out->step_s = sim.makespan + opt;
    sim_result_free(&sim, s.p);
    schedule_free(&s);
  } else {
    int64_t ga = grad_accum > 0 ? grad_accum : 1;
    double g = run_func(m, "grad_step", &a, (double)ga, &found);
    if (!found) {
      snprintf(err, errlen, "no @grad_step: --time needs a training program (--passes=train[,lower])");
      return 2;
    }
    out->optimizer_s = run_func(m, "optimizer_step", &a, 1, &found);
    out->step_s = (double)ga * g + out->optimizer_s;
  }
  free(a.pending), free(a.pending_end), free(a.frac);
  finish(out, m, hw);
  return 0;
}

static const char *const link_names[2] = {"intra-node", "inter-node"};

void timing_report(FILE *out, const Module *m, const Hardware *hw, const StepTime *t, double tokens) {
  int64_t world = mesh_world(&m->mesh);
  fprintf(out, "predicted step on %s (%lld devices, %lld a node; placement innermost first:", hw->name, (long long)world,
          (long long)hw->devices_per_node);
  for (int i = 0; i < AX_COUNT; i++) fprintf(out, " %s", mesh_axis_names[hw->axis_order[i]]);
  fprintf(out, ")\n");
  fprintf(out, "  step                 %12.3f ms\n", t->step_s * 1e3);
  fprintf(out, "  compute              %12.3f ms   matmul, attention: %.3g FLOP per rank at %.4g TFLOP/s x %.2f\n",
          t->compute_s * 1e3, t->model_flops, t->peak_flops * 1e-12, hw->eff_matmul);
  fprintf(out, "  memory-bound ops     %12.3f ms   at %.4g GB/s x %.2f\n", t->memory_s * 1e3, hw->mem_bw * 1e-9,
          hw->eff_memory);
  for (int c = 0; c < TC_COUNT; c++)
    if (t->memory_cat_s[c] > 0)
      fprintf(out, "    %-18s %12.3f ms   x %.2f%s\n", timing_cat_names[c], t->memory_cat_s[c] * 1e3,
              hw->eff_cat[c] > 0 ? hw->eff_cat[c] : hw->eff_memory, hw->eff_cat[c] > 0 ? " (its own)" : "");
  fprintf(out, "  per-op overhead      %12.3f ms\n", t->overhead_s * 1e3);
  for (int k = 0; k < AX_COUNT; k++)
    if (m->mesh.size[k] > 1)
      fprintf(out, "  comm %-3s %-11s %12.3f ms   %s=%lld, %.4g GB/s, alpha %.3g us\n", mesh_axis_names[k],
              link_names[t->link[k]], t->comm_s[k] * 1e3, mesh_axis_names[k], (long long)m->mesh.size[k],
              hw->link_bw[t->link[k]] * hw->eff_link * 1e-9, hw->link_lat[t->link[k]] * 1e6);
  fprintf(out, "  exposed comm         %12.3f ms   (waits for collectives; one communication queue a rank)\n",
          t->exposed_comm_s * 1e3);
  if (m->pipe.chunks > 0) fprintf(out, "  pipeline bubble      %12.3f ms\n", t->bubble_s * 1e3);
  fprintf(out, "  optimizer step       %12.3f ms\n", t->optimizer_s * 1e3);
  if (tokens > 0 && t->step_s > 0)
    fprintf(out, "  tokens/s             %12.0f   (%.0f per device)\n", tokens / t->step_s, tokens / t->step_s / (double)world);
  fprintf(out, "  MFU                  %12.3f\n", t->mfu);
  fprintf(out, "the ops that take the most time in a step (calls x predicted time):\n");
  for (int k = 0; k < TIMING_TOP && t->top[k].op; k++) {
    const Op *op = t->top[k].op;
    const Value *r = op->n_results ? op->results[0] : op->n_operands ? op->operands[0] : NULL;
    char shape[96] = "";
    if (r) {
      int n = snprintf(shape, sizeof shape, "%s[", dtype_name(r->type.dtype));
      for (int d = 0; d < r->type.rank && n < (int)sizeof shape - 24; d++)
        n += snprintf(shape + n, sizeof shape - (size_t)n, "%s%lld", d ? "," : "", (long long)r->type.dims[d]);
      snprintf(shape + n, sizeof shape - (size_t)n, "]");
    }
    const char *what = op->kind == OP_CALL && op->callee ? op->callee->name : op_info(op->kind)->name;
    fprintf(out, "  %10.3f ms  @%-18s %-24s %s\n", t->top[k].s * 1e3, t->top[k].func->name, what, shape);
  }
}
