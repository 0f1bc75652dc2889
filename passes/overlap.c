/* passes/overlap.c — pass "overlap": collectives split into a start and a wait, the start
 * moved as early and the wait as late as the dependencies allow, so that communication runs
 * while the rank computes (the playbook's "overlapping computation and communication").
 *
 *     %g = all_reduce %x {axis="dp", n=2}        becomes   %g.start = all_reduce_start %x {...}
 *                                                           ... ops that do not need %g ...
 *                                                           %g = wait %g.start
 *
 * What moves, in one function at a time (of a partitioned module; pipelined modules keep
 * their collectives synchronous for now):
 *   - every wait sinks to just before the first op that reads its result, or that writes the
 *     global its start reads (the communication thread still reads it), or the return; a
 *     collective of a computed value (a gradient's reduce-scatter, a tp all-reduce) is waited
 *     for at the latest when the OVERLAP_WINDOW-th such collective after it starts, so the
 *     backward's gradients are not all held in flight to its end (where they are accumulated);
 *   - before that, the cheap data movement that only unpacks a collective's result (the
 *     slices of a gradient bucket, reshapes) sinks to its first reader, so that the wait
 *     can follow it;
 *   - every start rises to just after the op that defines its operand, or the last op
 *     before it that writes the global it reads (or the top of the function);
 *   - ZeRO-3 parameter gathers (an all_gather over dp of a parameter) rise no further than
 *     the first wait of the previous layer's gathers: layer i+1's parameters are gathered
 *     while layer i computes, in the forward and in the backward, and at most two layers'
 *     gathered parameters are held (gathering every layer at the top would hold the whole
 *     model, which is what ZeRO-3 exists to avoid).  A layer is the prefix of a parameter's
 *     name up to its first all-digit part ("h.3.", "model.layers.3."); the other parameters
 *     form groups of their own.  Gathers are grouped in program order, so the backward's
 *     gathers (last layer first) prefetch in its own direction.
 * ZeRO-0 with one micro-batch a step all-reduces the gradients in @grad_step (shard_dp.c),
 * in buckets (bucket.c) followed by their slices and accumulates: a bucket's wait sinks to
 * the window's end with its slices and accumulates, so it travels while the rest of the
 * backward runs (DDP). With several micro-batches ZeRO-0/1 all-reduce the accumulated
 * gradients in @optimizer_step (after the last micro-batch), so there their buckets overlap
 * each other and the updates, not the backward.
 * Starts may pass each other (every rank runs the same program, so every member of a group
 * issues them in the same order; verify-collectives checks it), waits too; a gradient's
 * accumulate that reads a wait's result sinks with it (it writes its own global, which
 * nothing else in the step touches), and so do a bucket's slices and accumulates.  Nothing else moves, and no op computes anything differently: the collectives are the same collectives,
 * so the results are bitwise those of the synchronous program (tests/cli/overlap.sh).
 * Collectives over an axis of size 1 (the identity) stay as they are.
 *
 * Memory: a start's result is a buffer from the start to the last reader of its wait, and
 * its operand stays alive until the wait (passes/memory_plan.c), so the planned arena counts
 * what is in flight.
 *
 * TrainSettings.overlap = false (--overlap false) leaves the module as it is.
 */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

/* Collectives of computed values in flight behind one, at most (sink_waits). */
#define OVERLAP_WINDOW 4

/* ---------------------------------------------------------------- splitting */

/* Replaces every collective over more than one rank by its start and its wait (in place:
   the wait takes over the old result value, so its readers are unchanged).  Returns how
   many were split. */
static int split(Func *f) {
  Module *m = f->module;
  int n_split = 0;
  PtrVec out = {0};
  for (int i = 0; i < f->ops.n; i++) {
    Op *op = f->ops.items[i];
    OpKind sk = op_start_of(op->kind);
    if (sk == OP_COUNT || op_int(op, "n") < 2) {
      ptrvec_push(m->arena, &out, op);
      continue;
    }
    Value *v = op->results[0];
    Op *start = op_new(m, sk, op->operands, 1, &v->type);
    memcpy(start->attrs, op->attrs, sizeof start->attrs);
    start->line = op->line;
    if (v->name) {   /* the printer tells equal names apart */
      char name[300];
      snprintf(name, sizeof name, "%s.start", v->name);
      value_set_name(m, start->results[0], name);
    }
    Op *wait = op_new(m, OP_WAIT, start->results, 1, &v->type);
    wait->results[0] = v;   /* the old result is now the wait's */
    v->def = wait;
    v->index = 0;
    wait->line = op->line;
    ptrvec_push(m->arena, &out, start);
    ptrvec_push(m->arena, &out, wait);
    n_split++;
  }
  f->ops = out;
  return n_split;
}

/* ---------------------------------------------------------------- moving */

static int index_of(const Func *f, const Op *op) {
  for (int i = 0; i < f->ops.n; i++)
    if (f->ops.items[i] == op) return i;
  return -1;
}

/* Moves the op at `from` to index `to` (the others shift). */
static void move_op(Func *f, int from, int to) {
  void *op = f->ops.items[from];
  if (from < to) memmove(&f->ops.items[from], &f->ops.items[from + 1], sizeof(void *) * (size_t)(to - from));
  else if (from > to) memmove(&f->ops.items[to + 1], &f->ops.items[to], sizeof(void *) * (size_t)(from - to));
  f->ops.items[to] = op;
}

static bool reads(const Op *op, const Value *v) {
  for (int k = 0; k < op->n_operands; k++)
    if (op->operands[k] == v) return true;
  return false;
}

/* Does op write global g? */
static bool writes_global(const Op *op, const Global *g) {
  int nw = op_n_writes(op->kind);
  for (int k = 0; k < nw && k < op->n_operands; k++)
    if (op->operands[k]->kind == VAL_GLOBAL && op->operands[k]->global == g) return true;
  return false;
}

/* Does any op of [from, to) read or write global g? */
static bool touched_between(const Func *f, const Global *g, int from, int to) {
  for (int j = from; j < to && j < f->ops.n; j++) {
    const Op *o = f->ops.items[j];
    if (writes_global(o, g)) return true;
    for (int k = 0; k < o->n_operands; k++)
      if (o->operands[k]->kind == VAL_GLOBAL && o->operands[k]->global == g) return true;
  }
  return false;
}

/* The first index after `i` whose op reads any result of op i (f->ops.n: none does; the
   return counts as the end). */
static int first_reader(const Func *f, int i) {
  const Op *op = f->ops.items[i];
  for (int j = i + 1; j < f->ops.n; j++)
    for (int r = 0; r < op->n_results; r++)
      if (reads(f->ops.items[j], op->results[r])) return j;
  return f->ops.n;
}

/* The wait whose result v is, seen through the data movement that unpacks it, or NULL. */
static const Op *wait_of(const Value *v) {
  while (v->kind == VAL_RESULT) {
    if (v->def->kind == OP_WAIT) return v->def;
    if (op_info(v->def->kind)->cls != CLASS_DATA || v->def->n_operands != 1) return NULL;
    v = v->def->operands[0];
  }
  return NULL;
}

/* Sinks single-operand data movement (slice, reshape, ...) that unpacks a collective's
   result to just before its first reader, last ops first so chains move together. */
static void sink_unpacking(Func *f) {
  for (int i = f->ops.n - 1; i >= 0; i--) {
    Op *op = f->ops.items[i];
    if (op_info(op->kind)->cls != CLASS_DATA || op->n_operands != 1 || (op_info(op->kind)->flags & OPF_EFFECT) ||
        !wait_of(op->operands[0]))
      continue;
    int to = first_reader(f, i) - 1;
    if (to > i) move_op(f, i, to);
  }
}

/* A collective of a computed value (not a global: a gradient's reduce-scatter, a tp
   all-reduce) holds its operand and its result from start to wait. */
static bool of_computed(const Op *start) { return start->operands[0]->kind != VAL_GLOBAL; }

/* Sinks every wait to just before its first reader, or a write to its start's global, or --
   for a collective of a computed value -- the start of the OVERLAP_WINDOW-th such collective
   after its own: a gradient's reduce-scatter is waited for while the next few run, not at
   the end of the backward (where the accumulates are), which would hold every full
   gradient until then. */
static bool is_unpack(const Op *o) {
  return op_info(o->kind)->cls == CLASS_DATA && o->n_operands == 1 && !(op_info(o->kind)->flags & OPF_EFFECT);
}

/* Does op o (at index at, before limit) go down with the wait: a gradient accumulate that
   reads the wait's result (directly, or through a bucket's slice and reshape) when nothing
   before limit touches its global, or such an unpacking op whose every reader goes down too? */
static bool goes_with(const Func *f, const Op *o, const Op *wait, int at, int limit, int depth) {
  if (o->kind == OP_ACCUMULATE)
    return o->operands[0]->kind == VAL_GLOBAL && wait_of(o->operands[1]) == wait &&
           !touched_between(f, o->operands[0]->global, at + 1, limit);
  if (!is_unpack(o) || wait_of(o->operands[0]) != wait || depth > 8) return false;
  bool any = false;
  for (int j = at + 1; j < f->ops.n; j++) {
    const Op *r = f->ops.items[j];
    if (!reads(r, o->results[0])) continue;
    if (j >= limit || !goes_with(f, r, wait, j, limit, depth + 1)) return false;
    any = true;
  }
  for (int j = 0; j < f->rets.n; j++)
    if (f->rets.items[j] == o->results[0]) return false;
  return any;
}

static void sink_waits(Func *f) {
  for (int i = f->ops.n - 1; i >= 0; i--) {
    Op *op = f->ops.items[i];
    if (op->kind != OP_WAIT) continue;
    const Op *start = op->operands[0]->def;
    const Value *x = start->operands[0];
    int limit = f->ops.n, seen = 0;
    if (of_computed(start))
      for (int j = index_of(f, start) + 1; j < f->ops.n; j++) {
        const Op *o = f->ops.items[j];
        if (op_is_start(o->kind) && of_computed(o) && ++seen == OVERLAP_WINDOW) {
          limit = j;
          break;
        }
      }
    int to = i + 1;
    const Op *first_moved = NULL;
    for (; to < limit; to++) {
      Op *o = f->ops.items[to];
      if (o == first_moved) break;   /* the ops that went down: the wait goes just before them */
      /* the gradient accumulate that reads it (autodiff places it right after its gradient;
         the bucket pass after its bucket's slices) goes down with it, to the window's end */
      if (goes_with(f, o, op, to, limit, 0)) {
        if (to == limit - 1) break;
        move_op(f, to, limit - 1);
        if (!first_moved) first_moved = o;
        to--;
        continue;
      }
      if (reads(o, op->results[0]) || (x->kind == VAL_GLOBAL && writes_global(o, x->global))) break;
    }
    if (to - 1 > i) move_op(f, i, to - 1);
  }
}

/* The layer of a parameter's name: its prefix through the first all-digit part ("h.3"),
   or "" (not in a layer).  Written into buf. */
static const char *layer_of(const char *name, char *buf, size_t n) {
  const char *p = name;
  while (*p) {
    const char *end = strchr(p, '.');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    bool digits = len > 0;
    for (size_t k = 0; k < len; k++) digits &= p[k] >= '0' && p[k] <= '9';
    if (digits) {
      snprintf(buf, n, "%.*s", (int)(p + len - name), name);
      return buf;
    }
    if (!end) break;
    p = end + 1;
  }
  buf[0] = 0;
  return buf;
}

static bool is_param_gather(const Op *op) {
  const Value *x = op->operands[0];
  return op->kind == OP_ALL_GATHER_START && !strcmp(op_attr(op, "axis")->s, "dp") && x->kind == VAL_GLOBAL &&
         x->global->kind == GLOBAL_PARAM;
}

/* Raises every start to just after what it depends on; ZeRO-3 parameter gathers no higher
   than the first wait of the previous layer's gathers (the prefetch window). */
static int hoist_starts(Func *f) {
  /* the starts in program order, and for the parameter gathers the op they may not rise above */
  int ns = 0;
  for (int i = 0; i < f->ops.n; i++) ns += op_is_start(((Op *)f->ops.items[i])->kind);
  Op **starts = calloc((size_t)ns + 1, sizeof *starts), **bound = calloc((size_t)ns + 1, sizeof *bound);
  if (!starts || !bound) {
    free(starts);
    free(bound);
    return IR_ERUN;
  }
  ns = 0;
  char layer[256] = "", prev_layer[256] = "";
  Op *group_first_wait = NULL, *prev_group_first_wait = NULL;
  bool in_group = false;
  for (int i = 0; i < f->ops.n; i++) {
    Op *op = f->ops.items[i];
    if (!op_is_start(op->kind)) continue;
    starts[ns] = op;
    if (is_param_gather(op)) {
      char key[256];
      layer_of(op->operands[0]->global->name, key, sizeof key);
      Op *w = NULL;   /* this gather's wait */
      for (int j = i + 1; j < f->ops.n && !w; j++)
        if (((Op *)f->ops.items[j])->kind == OP_WAIT && reads(f->ops.items[j], op->results[0])) w = f->ops.items[j];
      if (!in_group || strcmp(key, layer)) {   /* a new group */
        prev_group_first_wait = in_group ? group_first_wait : NULL;
        snprintf(prev_layer, sizeof prev_layer, "%s", layer);
        snprintf(layer, sizeof layer, "%s", key);
        group_first_wait = w;
        in_group = true;
      } else if (w && group_first_wait && index_of(f, w) < index_of(f, group_first_wait)) {
        group_first_wait = w;
      }
      bound[ns] = prev_group_first_wait;
    }
    ns++;
  }
  /* last first: starts that rise to the same place keep their order (the order the
     communication thread runs them in) */
  for (int s = ns - 1; s >= 0; s--) {
    Op *op = starts[s];
    int i = index_of(f, op), to = 0;
    const Value *x = op->operands[0];
    if (bound[s] && index_of(f, bound[s]) > i) continue;   /* the previous layer starts later: stay */
    for (int j = i - 1; j >= 0; j--) {
      const Op *o = f->ops.items[j];
      bool dep = x->kind == VAL_GLOBAL ? writes_global(o, x->global) : (x->kind == VAL_RESULT && x->def == o);
      if (dep || o == bound[s]) {
        to = j + 1;
        break;
      }
    }
    if (to < i) move_op(f, i, to);
  }
  free(starts);
  free(bound);
  return 0;
}

static int run(Module *m, PassContext *ctx, char *err, size_t errlen) {
  const TrainSettings *ts = ctx->opt && ctx->opt->train ? ctx->opt->train : &train_defaults;
  if (!ts->overlap || !m->local || m->pipe.kind) return 0;
  for (int i = 0; i < m->funcs.n; i++) {
    Func *f = m->funcs.items[i];
    if (f->is_kernel) continue;
    bool async = false;   /* already split (a dump fed back in): leave it */
    for (int k = 0; k < f->ops.n && !async; k++) async = op_is_start(((Op *)f->ops.items[k])->kind);
    if (async) continue;
    int n = split(f);
    if (!n) continue;
    ctx->changed += n;
    sink_unpacking(f);
    sink_waits(f);
    if (hoist_starts(f)) {
      snprintf(err, errlen, "overlap: out of memory");
      return IR_ERUN;
    }
  }
  return 0;
}

const Pass pass_overlap = {"overlap", "collectives as start/wait: starts as early, waits as late as dependencies allow",
                           run};
