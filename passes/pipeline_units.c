/* passes/pipeline_units.c — the pipeline pass's first walk of @grad_step (passes/pipeline.c
 * says how each op finds its chunk): every op's phase (forward, backward, floating) and unit,
 * the values' reaches, the units' split into chunks (balanced by FLOPs or --pp-split), the tied
 * parameters' accumulates split per chunk, and the zero-bubble schedules' B/W parts.  Its own
 * file: it decides where every op goes and builds nothing; pipeline_chunks.c and
 * pipeline_optimizer.c build from its tables (PP, pipeline_internal.h). */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "passes/pipeline_internal.h"

/* The pass's error: the message into pp->err, rc returned (every file of the pass uses it). */
int pipeline_fail(PP *pp, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(pp->err, pp->errlen, fmt, ap);
  va_end(ap);
  return rc;
}

/* The layer of a parameter name ("h.3.attn..." or "model.layers.3...."), or -1. */
static int layer_of(const char *name) {
  const char *pats[] = {"h.", "layers."};
  for (int k = 0; k < 2; k++) {
    const char *s = name;
    while ((s = strstr(s, pats[k]))) {
      if ((s == name || s[-1] == '.') && s[strlen(pats[k])] >= '0' && s[strlen(pats[k])] <= '9') {
        char *end;
        long l = strtol(s + strlen(pats[k]), &end, 10);
        if (*end == '.') return (int)l;
      }
      s++;
    }
  }
  return -1;
}

static int global_unit(const Global *gl) {
  int l = layer_of(gl->name);
  return l < 0 ? 0 : l + 1;
}

/* Phase and unit of every op (the forward's units, reaches, the backward's units). */
int pipeline_classify(PP *pp) {
  Func *g = pp->g;
  int nl = 0, ng = pp->m->globals.n;
  int *gunit = malloc(sizeof(int) * ((size_t)ng + 1));   /* global_unit of every global, once */
  if (!gunit) return pipeline_fail(pp, IR_ERUN, "out of memory");
  for (int i = 0; i < ng; i++) {
    gunit[i] = global_unit(pp->m->globals.items[i]);
    if (gunit[i] > nl) nl = gunit[i];
  }
  pp->n_units = nl + 2;
  bool seen_seed = false;
  /* floating values made of a parameter (a bf16 cast of a weight): an op that reads one and
     an argument is the forward's, as an op reading the parameter itself is */
  bool *vparam = calloc((size_t)pp->n_vals + 1, 1), *varg = calloc((size_t)pp->n_vals + 1, 1);
  for (int i = 0; i < g->ops.n; i++) {
    Op *op = g->ops.items[i];
    int ph = PH_FLOAT, unit = 0;
    bool seed = op_is_loss_seed(op);
    int si = ring_send_of(g, i);
    if (seed) {
      ph = PH_B, unit = pp->n_units - 1, seen_seed = true;
    } else if (si >= 0) {   /* a ring's recv (context parallelism) goes where its send is */
      ph = pp->phase[si], unit = pp->unit[si];
    } else {
      /* An op of the tokens or targets and constants alone (a one-hot of the targets) is
         floating too: every chunk function has the arguments, so it is cloned where used. */
      bool any_b = false, any_dyn = false, any_arg = false, any_global = false;
      for (int k = 0; k < op->n_operands; k++) {
        Value *v = op->operands[k];
        if (v->kind == VAL_GLOBAL) {
          any_global = true;
          if (k >= op_n_writes(op->kind)) unit = unit > gunit[v->global->index] ? unit : gunit[v->global->index];
          continue;
        }
        if (is_arg(v)) {
          any_arg = true;
          continue;
        }
        int vp = pp->vphase[v->id];
        any_arg |= vp == PH_FLOAT && varg[v->id];   /* the tokens permuted (cp's zigzag) are tokens still */
        any_b |= vp == PH_B;
        any_dyn |= vp == PH_F;
        any_global |= vp == PH_FLOAT && vparam[v->id];
        if (vp != PH_B && pp->vunit[v->id] > unit) unit = pp->vunit[v->id];
      }
      /* a recompute clone (passes/recompute.c names its results rc.*) is the backward's:
         it runs in its layer's backward function, on what the forward stashed */
      bool clone = op->n_results >= 1 && op->results[0]->name && !strncmp(op->results[0]->name, "rc.", 3);
      if (any_b || op_n_writes(op->kind)) ph = PH_B;
      else if (any_dyn || (any_arg && any_global)) ph = clone ? PH_B : PH_F;
      if (ph == PH_B) unit = -1;   /* set below, once reaches are known */
    }
    pp->phase[i] = ph;
    pp->unit[i] = unit;
    bool made_of_param = false;
    for (int k = 0; k < op->n_operands && ph == PH_FLOAT; k++)
      made_of_param |= op->operands[k]->kind == VAL_GLOBAL ||
                       (op->operands[k]->kind == VAL_RESULT && vparam[op->operands[k]->id]);
    bool made_of_arg = false;
    for (int k = 0; k < op->n_operands && ph == PH_FLOAT; k++)
      made_of_arg |= is_arg(op->operands[k]) || (op->operands[k]->kind == VAL_RESULT && varg[op->operands[k]->id]);
    for (int r = 0; r < op->n_results; r++) {
      vparam[op->results[r]->id] = made_of_param;
      varg[op->results[r]->id] = made_of_arg;
      pp->vphase[op->results[r]->id] = ph;
      pp->vunit[op->results[r]->id] = unit;
      pp->def[op->results[r]->id] = op;
    }
  }
  free(vparam);
  free(varg);
  if (!seen_seed) {
    free(gunit);
    return pipeline_fail(pp, IR_EINPUT, "@grad_step has no %%loss_seed (the backward's start, named by autodiff): the pipeline pass "
                "needs the step as autodiff made it (loom ir --passes=train)");
  }
  /* Reach of forward values: the largest unit of a forward op that reads them. */
  for (int id = 0; id < pp->n_vals; id++) pp->reach[id] = pp->vunit[id];
  for (int i = 0; i < g->ops.n; i++) {
    Op *op = g->ops.items[i];
    if (pp->phase[i] != PH_F) continue;
    for (int k = 0; k < op->n_operands; k++) {
      Value *v = op->operands[k];
      if (v->kind == VAL_RESULT && pp->vphase[v->id] == PH_F && pp->unit[i] > pp->reach[v->id]) pp->reach[v->id] = pp->unit[i];
    }
  }
  /* The reach of a parameter: the largest unit of a forward op that reads it (directly or
     through floating ops: a tied embedding's is the head's); of a floating value: the
     largest reach of the parameters it is made of. */
  int *preach = calloc((size_t)ng + 1, sizeof(int));
  for (int gi = 0; gi < ng; gi++) preach[gi] = gunit[gi];
  free(gunit);
  int *greach = calloc((size_t)pp->n_vals + 1, sizeof(int));   /* floating value -> its reach so far */
  for (int i = g->ops.n - 1; i >= 0; i--) {   /* consumers first: floating ops pass reach down */
    Op *op = g->ops.items[i];
    int u = -1;
    if (pp->phase[i] == PH_F) u = pp->unit[i];
    else if (pp->phase[i] == PH_FLOAT)
      for (int r = 0; r < op->n_results; r++) u = u > greach[op->results[r]->id] ? u : greach[op->results[r]->id];
    if (u < 0) continue;
    for (int k = 0; k < op->n_operands; k++) {
      Value *v = op->operands[k];
      if (v->kind == VAL_GLOBAL && k >= op_n_writes(op->kind) && u > preach[v->global->index]) preach[v->global->index] = u;
      if (v->kind == VAL_RESULT && pp->vphase[v->id] == PH_FLOAT && u > greach[v->id]) greach[v->id] = u;
    }
  }
  for (int i = 0; i < g->ops.n; i++) {   /* a floating value's reach: that of its parameters */
    Op *op = g->ops.items[i];
    if (pp->phase[i] != PH_FLOAT) continue;
    int u = -1;   /* made of no parameter: it binds no unit */
    for (int k = 0; k < op->n_operands; k++) {
      Value *v = op->operands[k];
      int x = v->kind == VAL_GLOBAL ? preach[v->global->index]
              : v->kind == VAL_RESULT && greach[v->id] < pp->n_units ? greach[v->id] : -1;
      if (x > u) u = x;
    }
    for (int r = 0; r < op->n_results; r++) greach[op->results[r]->id] = u < 0 ? pp->n_units : u;
  }
  /* Backward units: the smallest over operands (adjoints: their unit; forward values,
     parameters and floating values: their reach). */
  for (int i = 0; i < g->ops.n; i++) {
    Op *op = g->ops.items[i];
    if (pp->phase[i] != PH_B || pp->unit[i] >= 0) continue;
    int unit = pp->n_units - 1;
    for (int k = op_n_writes(op->kind); k < op->n_operands; k++) {
      Value *v = op->operands[k];
      int u = pp->n_units;
      if (v->kind == VAL_GLOBAL) u = preach[v->global->index];
      else if (v->kind == VAL_RESULT)
        u = pp->vphase[v->id] == PH_B ? pp->vunit[v->id] : pp->vphase[v->id] == PH_F ? pp->reach[v->id] : greach[v->id];
      if (u < unit) unit = u;
    }
    int si = ring_send_of(g, i);
    if (si >= 0) unit = pp->unit[si];   /* with its send */
    if (op->kind == OP_ACCUMULATE) {   /* a gradient is accumulated where its parameter is read */
      const Global *p = param_of(pp, op->operands[0]->global);
      if (p && preach[p->index] < unit) unit = preach[p->index];
    }
    pp->unit[i] = unit;
    for (int r = 0; r < op->n_results; r++) pp->vunit[op->results[r]->id] = unit;
  }
  /* A backward op whose results only lower units read sinks to the highest of them when
     that moves no new value across a boundary: each adjoint it reads is read down there
     anyway (a bias gradient summed from the gradient a chunk receives belongs with its
     accumulate, not on the rank before; the sum of two adjoints does not move down). */
  int *umax = malloc(sizeof(int) * (size_t)(pp->n_vals + 1));
  int *ucount = calloc((size_t)pp->n_vals + 1, sizeof(int)), *ustart = calloc((size_t)pp->n_vals + 2, sizeof(int));
  for (int i = 0; i < g->ops.n; i++) {
    Op *op = g->ops.items[i];
    for (int k = 0; k < op->n_operands; k++)
      if (op->operands[k]->kind == VAL_RESULT) ucount[op->operands[k]->id]++;
  }
  for (int id = 0; id < pp->n_vals; id++) ustart[id + 1] = ustart[id] + ucount[id];
  int *users = malloc(sizeof(int) * (size_t)(ustart[pp->n_vals] + 1));
  memset(ucount, 0, sizeof(int) * (size_t)(pp->n_vals + 1));
  for (int i = 0; i < g->ops.n; i++) {
    Op *op = g->ops.items[i];
    for (int k = 0; k < op->n_operands; k++)
      if (op->operands[k]->kind == VAL_RESULT) {
        int id = op->operands[k]->id;
        users[ustart[id] + ucount[id]++] = i;
      }
  }
  for (int id = 0; id <= pp->n_vals; id++) umax[id] = -1;
  char *notw = NULL;
  for (int i = g->ops.n - 1; i >= 0; i--) {
    Op *op = g->ops.items[i];
    if (pp->phase[i] != PH_B) continue;
    if (!(op_info(op->kind)->flags & OPF_EFFECT) && op->n_results) {
      int mx = -1;
      for (int r = 0; r < op->n_results; r++) mx = umax[op->results[r]->id] > mx ? umax[op->results[r]->id] : mx;
      for (int k = 0; k < op->n_operands; k++) {   /* never below a forward value it reads */
        Value *v = op->operands[k];
        if (v->kind == VAL_RESULT && pp->vphase[v->id] == PH_F && pp->vunit[v->id] > mx) mx = pp->vunit[v->id];
      }
      for (int k = 0; k < op->n_operands && mx >= 0 && mx < pp->unit[i]; k++) {
        Value *v = op->operands[k];
        if (v->kind != VAL_RESULT || pp->vphase[v->id] != PH_B || pp->vunit[v->id] <= mx) continue;
        bool other = false;
        for (int u = ustart[v->id]; u < ustart[v->id + 1] && !other; u++) other = users[u] != i && pp->unit[users[u]] <= mx;
        if (!other) mx = -1;
      }
      if (mx >= 0 && mx < pp->unit[i]) {
        pp->unit[i] = mx;
        for (int r = 0; r < op->n_results; r++) pp->vunit[op->results[r]->id] = mx;
      }
    }
    for (int k = 0; k < op->n_operands; k++) {
      Value *v = op->operands[k];
      if (v->kind == VAL_RESULT && pp->vphase[v->id] == PH_B && pp->unit[i] > umax[v->id]) umax[v->id] = pp->unit[i];
    }
  }
  free(umax);
  free(notw);
  free(ucount), free(ustart), free(users);
  free(preach);
  free(greach);
  return 0;
}

/* The layers' split into chunks whose largest cost is least (passes.h).  best[c][l]: the
   least largest chunk cost of layers 0..l-1 in c chunks; arg[c][l]: the last chunk's first
   layer there, the later one on ties.  For each first layer k the chunk's cost grows layer by
   layer, summed in layer order (as a sum per (k, l) would be, to the bit), so the search is
   C x L^2; a candidate replaces the best only when strictly better (least cost, then latest
   start), so the order it visits them in does not change the result. */
int pipeline_chunk_starts(int C, int L, const double *layer, double first, double last, int *start) {
  if (C < 1 || C > L) return -1;
  double *best = malloc(sizeof(double) * (size_t)(C + 1) * (size_t)(L + 1));
  int *arg = malloc(sizeof(int) * (size_t)(C + 1) * (size_t)(L + 1));
  if (!best || !arg) {
    free(best), free(arg);
    return -1;
  }
#define BEST(c, l) best[(c) * (L + 1) + (l)]
#define ARG(c, l) arg[(c) * (L + 1) + (l)]
  for (int c = 0; c <= C; c++)
    for (int l = 0; l <= L; l++) BEST(c, l) = 1e300, ARG(c, l) = 0;
  BEST(0, 0) = 0;
  for (int c = 1; c <= C; c++)
    for (int k = c - 1; k < L; k++) {
      double sum = 0;   /* layers k..l-1 */
      for (int l = k + 1; l <= L; l++) {
        sum += layer[l - 1];
        double w = sum;
        if (k == 0) w += first;
        if (l == L) w += last;
        double mx = BEST(c - 1, k) > w ? BEST(c - 1, k) : w;
        if (mx < BEST(c, l) || (mx == BEST(c, l) && k > ARG(c, l))) BEST(c, l) = mx, ARG(c, l) = k;
      }
    }
  int l = L;
  for (int c = C; c >= 1; c--) {
    start[c - 1] = ARG(c, l);
    l = ARG(c, l);
  }
#undef BEST
#undef ARG
  free(best);
  free(arg);
  return 0;
}

/* The units' FLOPs (forward and backward) and the split: unit_chunk[]. */
int pipeline_split_units(PP *pp, const TrainSettings *ts) {
  int U = pp->n_units, L = U - 2, C = pp->C;
  if (L < C)
    return pipeline_fail(pp, IR_EINPUT, "pp=%d x %d chunks per rank needs %d chunks of at least one layer, but the model has %d "
                "layers: use a smaller pp or --pp-virtual", pp->p, pp->v, C, L);
  if (C > 256)   /* start[] below; the tags (pipeline_chunks.c) hold a chunk in 23 bits, so this is the bound */
    return pipeline_fail(pp, IR_EINPUT, "pp=%d x %d chunks per rank makes %d chunks; loom pipelines at most 256: use a smaller pp "
                "or --pp-virtual", pp->p, pp->v, C);
  int64_t start[257];
  if (ts->n_pp_split) {
    if (ts->n_pp_split != C)
      return pipeline_fail(pp, IR_EINPUT, "--pp-split gives %d chunk starts, but pp=%d x virtual %d makes %d chunks: give %d layer "
                  "numbers, the first 0", ts->n_pp_split, pp->p, pp->v, C, C);
    for (int c = 0; c < C; c++) {
      start[c] = ts->pp_split[c];
      if ((c == 0 && start[c] != 0) || (c > 0 && start[c] <= start[c - 1]) || start[c] >= L)
        return pipeline_fail(pp, IR_EINPUT, "--pp-split must start at layer 0 and rise strictly below the layer count %d "
                    "(entry %d is %lld)", L, c, (long long)start[c]);
    }
  } else {
    double *cost = calloc((size_t)U, sizeof(double));
    int *found = malloc(sizeof(int) * (size_t)C);
    for (int i = 0; cost && i < pp->g->ops.n; i++)
      if (pp->phase[i] == PH_F || pp->phase[i] == PH_B) cost[pp->unit[i]] += flops_op(pp->g->ops.items[i]);
    /* units 1..U-2 are the layers; the first chunk also has unit 0, the last unit U-1 */
    int rc = cost && found ? pipeline_chunk_starts(C, L, cost + 1, cost[0], cost[U - 1], found) : -1;
    for (int c = 0; c < C && !rc; c++) start[c] = found[c];
    free(found);
    free(cost);
    if (rc) return pipeline_fail(pp, IR_ERUN, "out of memory splitting %d layers into %d chunks", L, C);
  }
  pp->unit_chunk = calloc((size_t)U, sizeof(int));
  for (int u = 1; u < U - 1; u++) {
    int c = 0;
    while (c + 1 < C && start[c + 1] <= u - 1) c++;
    pp->unit_chunk[u] = c;
  }
  pp->unit_chunk[0] = 0;
  pp->unit_chunk[U - 1] = C - 1;
  return 0;
}

/* id -> value and op index, after every renumbering of @grad_step. */
void pipeline_index_values(PP *pp) {
  free(pp->vval), free(pp->vidx);
  pp->vval = calloc((size_t)pp->n_vals + 1, sizeof(Value *));
  pp->vidx = calloc((size_t)pp->n_vals + 1, sizeof(int));
  for (int a = 0; a < pp->g->args.n; a++) {
    Value *v = pp->g->args.items[a];
    pp->vval[v->id] = v, pp->vidx[v->id] = -1;
  }
  for (int i = 0; i < pp->g->ops.n; i++) {
    Op *op = pp->g->ops.items[i];
    for (int r = 0; r < op->n_results; r++) pp->vval[op->results[r]->id] = op->results[r], pp->vidx[op->results[r]->id] = i;
  }
}

/* Tied parameters: an accumulate whose added terms (through adds and casts each used once)
   come from different chunks: its terms (leaves) and the adds and casts between (chain). */
static bool tied_split(PP *pp, const int *uses, Op *op, Value **leaves, int *n_leaves, Op **chain, int *n_chain) {
  int nl = 0, nc = 0;
  bool split = false;
  *n_leaves = *n_chain = 0;
  if (op->kind != OP_ACCUMULATE || op->operands[1]->kind != VAL_RESULT) return false;
  Value *stack[64];
  int sp = 0;
  stack[sp++] = op->operands[1];
  bool ok = true;
  while (sp && ok) {
    Value *v = stack[--sp];
    Op *d = v->kind == VAL_RESULT ? pp->def[v->id] : NULL;
    bool inner = d && (d->kind == OP_ADD || d->kind == OP_CAST) && uses[v->id] == 1 && pp->vphase[v->id] == PH_B &&
                 nc < 63 && sp < 62;
    if (inner && d->kind == OP_ADD && !type_shape_eq(&d->operands[0]->type, &d->operands[1]->type)) inner = false;
    if (inner) {
      chain[nc++] = d;
      for (int k = d->n_operands - 1; k >= 0; k--) stack[sp++] = d->operands[k];
    } else if (nl < 64) {
      leaves[nl++] = v;
    } else {
      ok = false;
    }
  }
  for (int k = 1; k < nl && ok; k++)
    if (leaves[k]->kind != VAL_RESULT || leaves[0]->kind != VAL_RESULT || val_chunk(pp, leaves[k]) != val_chunk(pp, leaves[0]))
      split = true;
  *n_leaves = nl, *n_chain = nc;
  return split && ok;
}

/* Tied parameters: `accumulate $grad.X, add(a, b)` (through casts) whose terms come from
   different chunks becomes one accumulate per term, each in its term's chunk. */
void pipeline_split_tied_accumulates(PP *pp) {
  Func *g = pp->g;
  int n = g->ops.n;
  PtrVec out = {0};
  int *uses = calloc((size_t)pp->n_vals + 1, sizeof(int));
  for (int i = 0; i < n; i++) {
    Op *op = g->ops.items[i];
    for (int k = 0; k < op->n_operands; k++)
      if (op->operands[k]->kind == VAL_RESULT) uses[op->operands[k]->id]++;
  }
  /* Nothing to split (no tied parameter across chunks: the usual case): the step, its ids and
     the per-value tables stay as classify made them (reach is not read after this). */
  Value *leaves[64];
  Op *chain[64];
  int nl = 0, nc = 0;
  bool any = false;
  for (int i = 0; i < n && !any; i++) any = tied_split(pp, uses, g->ops.items[i], leaves, &nl, chain, &nc);
  if (!any) {
    free(uses);
    return;
  }
  int cap = n * 3 + 256;
  int *phase = malloc(sizeof(int) * (size_t)cap), *unit = malloc(sizeof(int) * (size_t)cap);
  int no = 0;
  for (int i = 0; i < n; i++) {
    Op *op = g->ops.items[i];
    bool split = tied_split(pp, uses, op, leaves, &nl, chain, &nc) && no + 2 * nl < cap - (n - i);
    if (!split) {
      ptrvec_push(pp->m->arena, &out, op);
      phase[no] = pp->phase[i], unit[no++] = pp->unit[i];
      continue;
    }
    /* The chain's adds and casts die; each leaf is cast to the accumulator's dtype and
       accumulated where it was made. */
    for (int c = 0; c < nc; c++)
      for (int j = 0; j < out.n; j++)
        if (out.items[j] == chain[c]) phase[j] = PH_DEAD;
    for (int k = nl - 1; k >= 0; k--) {
      Value *leaf = leaves[k];
      int u = pp->vunit[leaf->id];
      if (leaf->type.dtype != op->operands[0]->type.dtype) {
        Type t = leaf->type;
        t.dtype = op->operands[0]->type.dtype;
        Op *c = op_new(pp->m, OP_CAST, &leaf, 1, &t);
        ptrvec_push(pp->m->arena, &out, c);
        phase[no] = PH_B, unit[no++] = u;
        leaf = c->results[0];
      }
      Value *ops[2] = {op->operands[0], leaf};
      ptrvec_push(pp->m->arena, &out, op_new(pp->m, OP_ACCUMULATE, ops, 2, NULL));
      phase[no] = PH_B, unit[no++] = u;
    }
  }
  g->ops = out;
  free(pp->phase);
  free(pp->unit);
  pp->phase = phase;
  pp->unit = unit;
  free(uses);
  /* New values (casts) need ids: renumber and rebuild the per-value tables. */
  int nv = func_number(g);
  int *vphase = calloc((size_t)nv + 1, sizeof(int)), *vunit = calloc((size_t)nv + 1, sizeof(int));
  int *reach = calloc((size_t)nv + 1, sizeof(int));
  Op **def = calloc((size_t)nv + 1, sizeof(Op *));
  for (int i = 0; i < g->ops.n; i++) {
    Op *op = g->ops.items[i];
    for (int r = 0; r < op->n_results; r++) {
      int id = op->results[r]->id;
      vphase[id] = pp->phase[i], vunit[id] = pp->unit[i], def[id] = op;
    }
  }
  /* reach was computed on the old ids: recompute it. */
  for (int id = 0; id < nv; id++) reach[id] = vunit[id];
  for (int i = 0; i < g->ops.n; i++) {
    Op *op = g->ops.items[i];
    if (pp->phase[i] != PH_F) continue;
    for (int k = 0; k < op->n_operands; k++) {
      Value *v = op->operands[k];
      if (v->kind == VAL_RESULT && vphase[v->id] == PH_F && pp->unit[i] > reach[v->id]) reach[v->id] = pp->unit[i];
    }
  }
  free(pp->vphase), free(pp->vunit), free(pp->reach), free(pp->def);
  pp->vphase = vphase, pp->vunit = vunit, pp->reach = reach, pp->def = def, pp->n_vals = nv;
}

/* Zero-bubble split: a backward op is W when every use of its results is a W op of its
   chunk (weight-gradient matmuls, bias sums, the accumulates). */
void pipeline_split_parts(PP *pp) {
  Func *g = pp->g;
  int n = g->ops.n;
  /* users: for each value, does a non-W use exist? walk backwards */
  bool *b_use = calloc((size_t)pp->n_vals + 1, 1);
  for (int i = 0; i < g->rets.n; i++) {
    Value *v = g->rets.items[i];
    if (v->kind == VAL_RESULT) b_use[v->id] = true;
  }
  for (int i = n - 1; i >= 0; i--) {
    Op *op = g->ops.items[i];
    if (pp->phase[i] == PH_F) {
      pp->part[i] = PART_F;
      continue;
    }
    if (pp->phase[i] != PH_B) continue;
    bool w = pp->split;
    if (w && op->kind != OP_ACCUMULATE) {
      bool any = op->n_results == 0;
      for (int r = 0; r < op->n_results; r++) any |= b_use[op->results[r]->id];
      w = !any && op->n_results > 0;
    }
    pp->part[i] = w ? PART_W : PART_B;
    for (int k = 0; k < op->n_operands; k++) {
      Value *v = op->operands[k];
      if (v->kind != VAL_RESULT) continue;
      /* a use from another chunk, or from B, keeps the value in B */
      if (!w || val_chunk(pp, v) != op_chunk(pp, i)) b_use[v->id] = true;
    }
  }
  free(b_use);
}
