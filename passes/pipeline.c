/* passes/pipeline.c — pass "pipeline": pipeline parallelism over the mesh's pp axis.
 *
 * Input: a partitioned training step (@grad_step for one micro-batch, @optimizer_step).
 * Output: the step cut at layer boundaries into pp x virtual chunks, each a set of
 * functions every rank holding that chunk runs:
 *
 *   @fwd.cK(tokens, targets) -> ([loss,] stash...)   recv chunk K-1's output, the
 *                                                    forward ops, send to chunk K+1
 *   @bwd.cK(tokens, targets, stash...) -> ()         recv chunk K+1's input gradient, the
 *                                                    backward, accumulate $grad.*, send on
 *   zero-bubble schedules split the backward:
 *   @bwd_b.cK(tokens, targets, stash...) -> (wstash...)   input gradients only
 *   @bwd_w.cK(tokens, targets, wstash...) -> ()           weight gradients
 *   @optimizer_step.sR(lr, step) -> (grad_norm)     rank R's parameters; the gradient norm
 *                                                    summed over pp; tied copies' gradients
 *                                                    exchanged and summed first
 *
 * The stash (what a backward needs of its forward) is explicit: results of @fwd.cK that
 * the runtime holds per micro-batch until the backward runs, so memory reports and the
 * schedules' memory bounds see it.
 *
 * How each op of @grad_step finds its chunk.  A parameter's "unit" is its layer + 1 (from
 * the HF name: h.N. or layers.N.); other parameters, the tokens and the targets are unit 0.
 * A forward op's unit is the largest of its operands' (so ln_f and the head land after the
 * last layer, with the loss); a value's "reach" is the largest unit that reads it in the
 * forward.  A backward op's unit is the smallest reach/unit of its operands (the adjoint
 * flows down; the backward of a layer uses the values that layer read).  Ops that read
 * only parameters and constants (weight slices, casts, the seed's constants) belong to no
 * unit: they are cloned into every function that uses them.  Units then map to chunks by
 * the split: balanced by FLOPs (forward + backward, per unit) or the user's --pp-split.
 * The backward is the set of ops that depend on the loss seed (%loss_seed, named by
 * autodiff), and the recompute pass's clones (results named rc.*: forward ops run again in
 * the backward).  A tied parameter (GPT-2's wte, read by the embedding and the head) is read
 * in two chunks: each accumulates its own gradient, and the optimizer steps of the two
 * ranks exchange and add them (a + b == b + a in IEEE arithmetic: both copies get the same
 * bits), so their updates stay identical.
 *
 * Over 1,000 lines on purpose: classifying, cutting and building the chunk and optimizer
 * functions share the PP state of one @grad_step walk; split apart they would pass it all.
 */
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"
#include "ir/schedule.h"

enum { PH_FLOAT, PH_F, PH_B, PH_DEAD };
enum { PART_F, PART_B, PART_W };

typedef struct {
  Module *m;
  Func *g;
  int n_vals;
  int n_units;        /* layers + 2 */
  int *unit_chunk;    /* [n_units] */
  int C, p, v, kind;
  bool split;         /* B/W split */
  /* per op of @grad_step */
  int *phase, *unit, *part;
  /* per value id */
  int *vphase, *vunit, *reach, *vpart;
  Op **def;
  Value **vval;       /* id -> the value */
  int *vidx;          /* id -> index of its op in @grad_step */
  /* the cuts (cut_all): per value id its chunk and its crossing bits (build_chunk's) for the
     chunks vchunk - 1, vchunk, vchunk + 1; each chunk's values with bits (ids ascending:
     cv_ids[cv_start[c] ..]); each chunk's F, B and W ops (first_op[3c + part], next_op[i]) */
  unsigned char *need3;
  int *vchunk, *cv_start, *cv_ids, *first_op, *next_op;
  Value **map_pool;   /* Out's maps (build_chunk): zero between functions */
  const Global **param;   /* global index -> the parameter it is about (param_of), or NULL */
  int *touched, n_touched;
  bool *used;         /* [rank x global]: a chunk function of that rank reads the parameter the
                         global is about (set as build_chunk emits: global_users' answer) */
  int rank, used_ng;  /* the rank of the chunk being built; globals.n when used was made */
  char *err;
  size_t errlen;
} PP;

static int fail(PP *pp, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#include <stdarg.h>
static int fail(PP *pp, int rc, const char *fmt, ...) {
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

static bool is_arg(const Value *v) { return v->kind == VAL_ARG; }
static const Global *param_of(const PP *pp, const Global *gl) { return pp->param[gl->index]; }

/* Phase and unit of every op (the forward's units, reaches, the backward's units). */
static int classify(PP *pp) {
  Func *g = pp->g;
  int nl = 0, ng = pp->m->globals.n;
  int *gunit = malloc(sizeof(int) * ((size_t)ng + 1));   /* global_unit of every global, once */
  if (!gunit) return fail(pp, IR_ERUN, "out of memory");
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
    bool seed = op->n_results == 1 && op->results[0]->name && !strcmp(op->results[0]->name, "loss_seed");
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
    return fail(pp, IR_EINPUT, "@grad_step has no %%loss_seed (the backward's start, named by autodiff): the pipeline pass "
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

/* The units' FLOPs (forward and backward) and the split: unit_chunk[]. */
static int split_units(PP *pp, const TrainSettings *ts) {
  int U = pp->n_units, L = U - 2, C = pp->C;
  if (L < C)
    return fail(pp, IR_EINPUT, "pp=%d x %d chunks per rank needs %d chunks of at least one layer, but the model has %d "
                "layers: use a smaller pp or --pp-virtual", pp->p, pp->v, C, L);
  int64_t start[257];
  if (ts->n_pp_split) {
    if (ts->n_pp_split != C)
      return fail(pp, IR_EINPUT, "--pp-split gives %d chunk starts, but pp=%d x virtual %d makes %d chunks: give %d layer "
                  "numbers, the first 0", ts->n_pp_split, pp->p, pp->v, C, C);
    for (int c = 0; c < C; c++) {
      start[c] = ts->pp_split[c];
      if ((c == 0 && start[c] != 0) || (c > 0 && start[c] <= start[c - 1]) || start[c] >= L)
        return fail(pp, IR_EINPUT, "--pp-split must start at layer 0 and rise strictly below the layer count %d "
                    "(entry %d is %lld)", L, c, (long long)start[c]);
    }
  } else {
    double *cost = calloc((size_t)U, sizeof(double));
    for (int i = 0; i < pp->g->ops.n; i++)
      if (pp->phase[i] == PH_F || pp->phase[i] == PH_B) cost[pp->unit[i]] += flops_op(pp->g->ops.items[i]);
    /* Layers l0..l1-1 in one chunk; the first chunk also has unit 0, the last unit U-1.
       best[c][l]: the smallest max-cost of layers 0..l-1 in c chunks. */
    double *best = malloc(sizeof(double) * (size_t)(C + 1) * (size_t)(L + 1));
    int *arg = malloc(sizeof(int) * (size_t)(C + 1) * (size_t)(L + 1));
#define BEST(c, l) best[(c) * (L + 1) + (l)]
#define ARG(c, l) arg[(c) * (L + 1) + (l)]
    for (int c = 0; c <= C; c++)
      for (int l = 0; l <= L; l++) BEST(c, l) = 1e300, ARG(c, l) = 0;
    BEST(0, 0) = 0;
    for (int c = 1; c <= C; c++)
      for (int l = c; l <= L; l++)
        for (int k = c - 1; k < l; k++) {
          double w = 0;
          for (int u = k + 1; u <= l; u++) w += cost[u];
          if (k == 0) w += cost[0];
          if (l == L) w += cost[U - 1];
          double mx = BEST(c - 1, k) > w ? BEST(c - 1, k) : w;
          if (mx < BEST(c, l) || (mx == BEST(c, l) && k > ARG(c, l))) BEST(c, l) = mx, ARG(c, l) = k;
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
    free(cost);
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
static void index_values(PP *pp) {
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

static int op_chunk(PP *pp, int i) { return pp->unit_chunk[pp->unit[i]]; }
static int val_chunk(PP *pp, const Value *v) { return pp->unit_chunk[pp->vunit[v->id]]; }

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
static void split_tied_accumulates(PP *pp) {
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
static void split_parts(PP *pp) {
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

/* ---- building the functions ---- */

typedef struct {
  Func *f;
  Value **map;     /* old value id -> value in f */
  PP *pp;
  bool clone;      /* values of @grad_step: floating ops are cloned on use (and map is pp's pool) */
} Out;

/* map[id] = x; the pool remembers what to clear (end_out). */
static void map_set(Out *o, int id, Value *x) {
  if (o->clone && !o->map[id]) o->pp->touched[o->pp->n_touched++] = id;
  o->map[id] = x;
}

/* A function of the chunks is done: its map (the pool) is cleared for the next. */
static void end_out(Out *o) {
  PP *pp = o->pp;
  for (int k = 0; k < pp->n_touched; k++) o->map[pp->touched[k]] = NULL;
  pp->n_touched = 0;
}

static Value *get(Out *o, Value *v);

/* A chunk function's new op: the parameters its global operands are about are used by the
   chunk's rank (what global_users would find walking the functions afterwards). */
static void note_globals(Out *o, const Op *c) {
  PP *pp = o->pp;
  if (!o->clone || !pp->used) return;
  for (int k = 0; k < c->n_operands; k++)
    if (c->operands[k]->kind == VAL_GLOBAL) {
      const Global *p = param_of(pp, c->operands[k]->global);
      if (p) pp->used[pp->rank * pp->used_ng + p->index] = true;
    }
}

/* A floating op (parameters and constants only) cloned into o->f. */
static Value *clone_float(Out *o, Value *v) {
  Op *d = o->pp->def[v->id];
  Value *ops[256];   /* (a concat of cp's zigzag permutation has 2cp operands; shard allows cp <= 128) */
  for (int k = 0; k < d->n_operands && k < 256; k++) ops[k] = get(o, d->operands[k]);
  Op *c = op_new_n(o->pp->m, d->kind, ops, d->n_operands, NULL, d->n_results);   /* types copied once, below */
  memcpy(c->attrs, d->attrs, sizeof(Attr) * (size_t)op_info(d->kind)->n_attrs);   /* the rest stay zero */
  c->callee = d->callee;
  ptrvec_push(o->pp->m->arena, &o->f->ops, c);
  note_globals(o, c);
  for (int r = 0; r < d->n_results; r++) {
    c->results[r]->type = d->results[r]->type;
    c->results[r]->name = d->results[r]->name;
    map_set(o, d->results[r]->id, c->results[r]);
  }
  return o->map[v->id];
}

static Value *get(Out *o, Value *v) {
  if (v->kind == VAL_GLOBAL) return v;
  if (o->map[v->id]) return o->map[v->id];
  if (o->clone && v->kind == VAL_RESULT && o->pp->vphase[v->id] == PH_FLOAT) return clone_float(o, v);
  return NULL;
}

static void emit(Out *o, Op *op) {
  Value *ops[256];
  for (int k = 0; k < op->n_operands; k++) ops[k] = get(o, op->operands[k]);
  Op *c = op_new_n(o->pp->m, op->kind, ops, op->n_operands, NULL, op->n_results);   /* types copied once, below */
  /* the schema's attributes only (the rest stay zero): the whole array is 8 cache lines of
     an op the walk has not touched yet, and this copy was the pass's hottest line */
  memcpy(c->attrs, op->attrs, sizeof(Attr) * (size_t)op_info(op->kind)->n_attrs);
  c->callee = op->callee;
  ptrvec_push(o->pp->m->arena, &o->f->ops, c);
  note_globals(o, c);
  for (int r = 0; r < op->n_results; r++) {
    c->results[r]->type = op->results[r]->type;
    c->results[r]->name = op->results[r]->name;
    map_set(o, op->results[r]->id, c->results[r]);
  }
}

static Out new_out(PP *pp, const char *name) {
  Out o = {module_add_func(pp->m, name), pp->map_pool, pp, true};
  for (int a = 0; a < pp->g->args.n; a++) {
    Value *v = pp->g->args.items[a];
    map_set(&o, v->id, func_add_arg(o.f, v->name, v->type));
  }
  return o;
}

static void p2p(Out *o, Value *v, bool send, int peer, int tag) {
  PP *pp = o->pp;
  Op *op;
  if (send) {
    Value *x = get(o, v);
    op = op_new(pp->m, OP_SEND, &x, 1, NULL);
  } else {
    op = op_new(pp->m, OP_RECV, NULL, 0, &v->type);
    op->results[0]->name = v->name;
    map_set(o, v->id, op->results[0]);
  }
  op->attrs[op_attr_index(op->kind, "axis")] = (Attr){.kind = ATTR_STR, .s = "pp", .set = true};
  op_set_int(op, "n", pp->p);
  op_set_int(op, "peer", peer);
  op_set_int(op, "tag", tag);
  ptrvec_push(pp->m->arena, &o->f->ops, op);
  note_globals(o, op);
}

static int chunk_rank(PP *pp, int c) { return schedule_chunk_rank(pp->kind, pp->p, pp->v, c); }

/* Tags: (chunk the transfer goes into) x 2 + direction (0 forward, 1 backward), x 256 + the
   value's index at that boundary. */
static int tag_of(int into, int dir, int k) { return ((into * 2 + dir) << 8) | k; }

/* The values each chunk's parts need from elsewhere, and checks that they can get there,
   for every chunk at once: build_chunk then walks only its own ops and values. Bits: 1 F-in
   (from c-1), 2 F->B stash, 4 B-in (from c+1), 8 B->W stash, 16 F-out (to c+1), 32 B-out
   (to c-1). */
static int cut_all(PP *pp) {
  Func *g = pp->g;
  int nv = pp->n_vals, n = g->ops.n, C = pp->C;
  pp->need3 = calloc(3 * (size_t)nv + 1, 1);
  pp->vchunk = malloc(sizeof(int) * ((size_t)nv + 1));
  pp->cv_start = calloc((size_t)C + 2, sizeof(int));
  pp->first_op = malloc(sizeof(int) * (3 * (size_t)C + 1));
  pp->next_op = malloc(sizeof(int) * ((size_t)n + 1));
  pp->map_pool = calloc((size_t)nv + 1, sizeof(Value *));
  pp->touched = malloc(sizeof(int) * ((size_t)nv + 1));
  int *tail = malloc(sizeof(int) * (3 * (size_t)C + 1));
  if (!pp->need3 || !pp->vchunk || !pp->cv_start || !pp->first_op || !pp->next_op || !pp->map_pool || !pp->touched || !tail) {
    free(tail);
    return fail(pp, IR_ERUN, "pipeline: out of memory");
  }
  for (int id = 0; id < nv; id++) pp->vchunk[id] = -1;
  for (int k = 0; k < 3 * C; k++) pp->first_op[k] = tail[k] = -1;
  for (int i = 0; i < n; i++) {
    Op *op = g->ops.items[i];
    pp->next_op[i] = -1;
    if (pp->phase[i] != PH_F && pp->phase[i] != PH_B) continue;
    int oc = op_chunk(pp, i), part = pp->part[i];
    int kind = 3 * oc + (pp->phase[i] == PH_F ? 0 : part == PART_W ? 2 : 1);
    if (pp->phase[i] == PH_F || part == PART_B || part == PART_W) {   /* the ops build_chunk emits, in order */
      if (tail[kind] < 0) pp->first_op[kind] = i;
      else pp->next_op[tail[kind]] = i;
      tail[kind] = i;
    }
    for (int k = 0; k < op->n_operands; k++) {
      Value *v = op->operands[k];
      if (v->kind != VAL_RESULT || pp->vphase[v->id] == PH_FLOAT) continue;
      int vc = val_chunk(pp, v), d = oc - vc;
      unsigned char *nd = pp->need3 + 3 * (size_t)v->id;   /* [0]: chunk vc - 1, [1]: vc, [2]: vc + 1 */
      pp->vchunk[v->id] = vc;
      if (pp->vphase[v->id] == PH_F) {
        if (d != 0 && d != 1) goto bad;
        nd[d + 1] |= (part != PART_F ? 2 : 0) | (part == PART_W ? 8 : 0) | (d == 1 ? 1 : 0);
        if (d == 1) nd[1] |= 16;
      } else {   /* a backward value */
        int dpart = pp->vidx[v->id] >= 0 ? pp->part[pp->vidx[v->id]] : PART_F;
        if (d != 0 && d != -1) goto bad;
        if (d == 0 && part == PART_W && dpart != PART_W) nd[1] |= 8;
        if (d == -1) nd[0] |= 4 | (part == PART_W ? 8 : 0), nd[1] |= 32;
      }
      continue;
    bad:;
      char text[512];
      free(tail);
      return fail(pp, IR_EINPUT, "the pipeline cut needs %%%s (made in chunk %d) in chunk %d, which is not a neighbour: "
                  "values may only cross one chunk boundary (op: %s); try another --pp-split",
                  v->name ? v->name : "?", vc, oc, op_to_string(op, text, sizeof text));
    }
  }
  free(tail);
  /* each chunk's values with bits, ids ascending (= program order of their ops) */
  for (int pass = 0; pass < 2; pass++) {
    int *at = pass ? calloc((size_t)C + 1, sizeof(int)) : NULL;
    if (pass) {
      for (int c = 0; c < C; c++) at[c] = pp->cv_start[c];
      pp->cv_ids = malloc(sizeof(int) * ((size_t)pp->cv_start[C] + 1));
    }
    for (int id = 0; id < nv; id++)
      for (int d = -1; d <= 1 && pp->vchunk[id] >= 0; d++) {
        int c = pp->vchunk[id] + d;
        if (c < 0 || c >= C || !pp->need3[3 * (size_t)id + (size_t)(d + 1)]) continue;
        if (pass) pp->cv_ids[at[c]++] = id;
        else pp->cv_start[c + 1]++;
      }
    if (!pass)
      for (int c = 0; c < C; c++) pp->cv_start[c + 1] += pp->cv_start[c];
    free(at);
  }
  return 0;
}

static void cut_free(PP *pp) {
  free(pp->need3), free(pp->vchunk), free(pp->cv_start), free(pp->cv_ids), free(pp->first_op), free(pp->next_op);
  free(pp->map_pool), free(pp->touched);
}

/* The crossing bits of value id at chunk c (cut_all). */
static int need_at(const PP *pp, int id, int c) {
  int d = c - pp->vchunk[id];
  return d >= -1 && d <= 1 ? pp->need3[3 * (size_t)id + (size_t)(d + 1)] : 0;
}

/* Chunk c's functions: @fwd.cK, then @bwd.cK (or @bwd_b.cK and @bwd_w.cK). */
static int build_chunk(PP *pp, int c) {
  char name[64];
  const int *ids = pp->cv_ids + pp->cv_start[c], nids = pp->cv_start[c + 1] - pp->cv_start[c];
  bool last = c == pp->C - 1;
  pp->rank = chunk_rank(pp, c);
  /* ---- @fwd.cK ---- */
  snprintf(name, sizeof name, "fwd.c%d", c);
  Out o = new_out(pp, name);
  int k = 0;
  for (int x = 0; x < nids; x++)
    if (need_at(pp, ids[x], c) & 1) p2p(&o, pp->vval[ids[x]], false, chunk_rank(pp, c - 1), tag_of(c, 0, k++));
  for (int i = pp->first_op[3 * c]; i >= 0; i = pp->next_op[i]) emit(&o, pp->g->ops.items[i]);
  k = 0;
  for (int x = 0; x < nids; x++)
    if (need_at(pp, ids[x], c) & 16) p2p(&o, pp->vval[ids[x]], true, chunk_rank(pp, c + 1), tag_of(c + 1, 0, k++));
  if (last) {
    Value *loss = pp->g->rets.items[0];
    Value *l = get(&o, loss);
    if (!l) {
      end_out(&o);
      return fail(pp, IR_ERUN, "internal error: the loss is not computed in the last chunk");
    }
    func_add_ret(o.f, l);
  }
  /* the stash: values received from c-1 first, then the others (ids ascending in each) */
  Value **stash = calloc((size_t)nids + 1, sizeof(Value *));
  int ns = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int x = 0; x < nids; x++) {
      int nd = need_at(pp, ids[x], c);
      if (!(nd & 2) || (pass == 0) != ((nd & 1) != 0)) continue;
      Value *v = pp->vval[ids[x]], *y = o.map[ids[x]];
      if (!y) {
        end_out(&o);
        free(stash);
        return fail(pp, IR_ERUN, "internal error: stash value %%%s is not in @%s", v && v->name ? v->name : "?", name);
      }
      func_add_ret(o.f, y);
      stash[ns++] = v;
    }
  end_out(&o);
  /* ---- @bwd.cK or @bwd_b.cK ---- */
  snprintf(name, sizeof name, pp->split ? "bwd_b.c%d" : "bwd.c%d", c);
  o = new_out(pp, name);
  for (int q = 0; q < ns; q++) map_set(&o, stash[q]->id, func_add_arg(o.f, stash[q]->name, stash[q]->type));
  k = 0;
  for (int x = 0; x < nids; x++)
    if (need_at(pp, ids[x], c) & 4) p2p(&o, pp->vval[ids[x]], false, chunk_rank(pp, c + 1), tag_of(c, 1, k++));
  for (int i = pp->first_op[3 * c + 1]; i >= 0; i = pp->next_op[i]) emit(&o, pp->g->ops.items[i]);
  if (c > 0) {
    k = 0;
    for (int x = 0; x < nids; x++)
      if (need_at(pp, ids[x], c) & 32) p2p(&o, pp->vval[ids[x]], true, chunk_rank(pp, c - 1), tag_of(c - 1, 1, k++));
  }
  if (pp->split) {
    /* W's inputs: stash values W reads (forward or backward), in id order */
    Value **ws = calloc((size_t)nids + 1, sizeof(Value *));
    int nw = 0;
    for (int x = 0; x < nids; x++)
      if (need_at(pp, ids[x], c) & 8) {
        Value *y = o.map[ids[x]];
        if (!y) {
          end_out(&o);
          free(ws), free(stash);
          return fail(pp, IR_ERUN, "internal error: %%%s, which W needs, is not in @%s",
                      pp->vval[ids[x]]->name ? pp->vval[ids[x]]->name : "?", name);
        }
        func_add_ret(o.f, y);
        ws[nw++] = pp->vval[ids[x]];
      }
    end_out(&o);
    snprintf(name, sizeof name, "bwd_w.c%d", c);
    o = new_out(pp, name);
    for (int q = 0; q < nw; q++) map_set(&o, ws[q]->id, func_add_arg(o.f, ws[q]->name, ws[q]->type));
    for (int i = pp->first_op[3 * c + 2]; i >= 0; i = pp->next_op[i]) emit(&o, pp->g->ops.items[i]);
    free(ws);
  }
  end_out(&o);
  free(stash);
  return 0;
}

/* ---- the optimizer step of one pp rank ---- */

/* The parameter a global belongs to: itself, or the X of grad.X / adam_m.X / adam_v.X
   (PP.param holds it for every global: the optimizer steps of many pp ranks ask for every op). */
static const Global *find_param(Module *m, const Global *gl) {
  const char *pre[] = {GRAD_PREFIX, ADAM_M_PREFIX, ADAM_V_PREFIX};
  if (gl->kind == GLOBAL_PARAM) return gl;
  for (int k = 0; k < 3; k++)
    if (!strncmp(gl->name, pre[k], strlen(pre[k]))) return module_find_global(m, gl->name + strlen(pre[k]));
  return NULL;
}

/* uses[rank][global index]: does a function of that rank read or write the global? */
static void global_users(PP *pp, bool *used) {
  Module *m = pp->m;
  for (int f = 0; f < m->funcs.n; f++) {
    Func *fn = m->funcs.items[f];
    int c = -1;
    if (sscanf(fn->name, "fwd.c%d", &c) != 1 && sscanf(fn->name, "bwd.c%d", &c) != 1 &&
        sscanf(fn->name, "bwd_b.c%d", &c) != 1 && sscanf(fn->name, "bwd_w.c%d", &c) != 1)
      continue;
    int r = chunk_rank(pp, c);
    for (int i = 0; i < fn->ops.n; i++) {
      Op *op = fn->ops.items[i];
      for (int k = 0; k < op->n_operands; k++)
        if (op->operands[k]->kind == VAL_GLOBAL) {
          const Global *p = param_of(pp, op->operands[k]->global);
          if (p) used[r * m->globals.n + p->index] = true;
        }
    }
  }
}

/* What every rank's optimizer step shares, from one walk of @optimizer_step: per op the
   parameter it is about (`ab`: its index, -1 none, -2 the gradient norm's chain, -3 an op
   outside the norm that mixes parameters: an error when a rank reaches it), per value the
   same (`about`), and which ops the norm's sqrt depends on (`in_norm`).  The chain: the ops
   the norm depends on that combine several parameters' terms. */
typedef struct {
  int *about, *ab;
  bool *in_norm;
  Value **map;       /* a rank's copies (cleared after each rank) */
  int *dropped_on;   /* value id -> 1 + the rank that dropped it */
} OptPlan;

static void opt_plan_free(OptPlan *op) { free(op->about), free(op->ab), free(op->in_norm), free(op->map), free(op->dropped_on); }

static int opt_plan(PP *pp, Func *opt, OptPlan *pl) {
  int nv = func_number(opt), n = opt->ops.n;
  *pl = (OptPlan){malloc(sizeof(int) * (size_t)(nv + 1)), malloc(sizeof(int) * (size_t)(n + 1)),
                  calloc((size_t)n + 1, 1), calloc((size_t)nv + 1, sizeof(Value *)), calloc((size_t)nv + 1, sizeof(int))};
  bool *need = calloc((size_t)nv + 1, 1);
  if (!pl->about || !pl->ab || !pl->in_norm || !pl->map || !pl->dropped_on || !need) {
    free(need);
    return fail(pp, IR_ERUN, "out of memory");
  }
  for (int i = n - 1; i >= 0; i--) {
    Op *op = opt->ops.items[i];
    bool in = op->kind == OP_SQRT && op->results[0]->name && !strcmp(op->results[0]->name, "grad_norm");
    for (int r2 = 0; r2 < op->n_results && !in; r2++) in = need[op->results[r2]->id];
    if (!in) continue;
    pl->in_norm[i] = true;
    for (int k = 0; k < op->n_operands; k++)
      if (op->operands[k]->kind == VAL_RESULT) need[op->operands[k]->id] = true;
  }
  free(need);
  for (int i = 0; i < n; i++) {
    Op *op = opt->ops.items[i];
    int ab = -1;
    bool chain_in = false;
    for (int k = 0; k < op->n_operands; k++) {
      Value *v = op->operands[k];
      int a = -1;
      if (v->kind == VAL_GLOBAL) {
        const Global *p = param_of(pp, v->global);
        a = p ? p->index : -1;
      } else if (v->kind == VAL_RESULT) {
        a = pl->about[v->id];
        chain_in |= a == -2;
      }
      if (a < 0) continue;
      ab = ab == -1 ? a : ab == a ? a : -3;
    }
    if (pl->in_norm[i] && (chain_in || ab == -3)) ab = -2;
    pl->ab[i] = ab;
    for (int rr = 0; rr < op->n_results; rr++) pl->about[op->results[rr]->id] = ab;
  }
  return 0;
}

/* Rank r's optimizer step: the ops about its parameters or about none, and the norm's chain
   over the terms it counts.  An op about another rank's parameter is not looked at: nothing
   this rank keeps reads it (the chain counts such a term as another rank's). */
static int build_optimizer(PP *pp, Func *opt, const OptPlan *pl, const bool *used, int r, const int *mine, int n_mine) {
  Module *m = pp->m;
  int ng = m->globals.n;
  char name[64];
  snprintf(name, sizeof name, "optimizer_step.s%d", r);
  Out o = {module_add_func(m, name), pl->map, pp, false};
  for (int a = 0; a < opt->args.n; a++) {
    Value *v = opt->args.items[a];
    o.map[v->id] = func_add_arg(o.f, v->name, v->type);
  }
  /* Tied parameters this rank shares with another: send, receive, add, assign. */
  for (int gi = 0; gi < ng; gi++) {
    Global *p = m->globals.items[gi];
    if (p->kind != GLOBAL_PARAM || !used[r * ng + gi]) continue;
    int other = -1, owners = 0;
    for (int q = 0; q < pp->p; q++)
      if (used[q * ng + gi]) owners++, other = q != r ? q : other;
    if (owners == 1) continue;
    if (owners > 2)
      return fail(pp, IR_EINPUT, "$%s is read by %d pipeline ranks; tied parameters may be shared by two", p->name, owners);
    char gname[512];
    snprintf(gname, sizeof gname, GRAD_PREFIX "%s", p->name);
    Global *gg = module_find_global(m, gname);
    if (!gg) continue;
    Value *gv = gg->value;
    Op *s = op_new(m, OP_SEND, &gv, 1, NULL);
    Type t = gv->type;
    Op *rv = op_new(m, OP_RECV, NULL, 0, &t);
    Op *xs[2] = {s, rv};
    for (int k = 0; k < 2; k++) {
      xs[k]->attrs[op_attr_index(xs[k]->kind, "axis")] = (Attr){.kind = ATTR_STR, .s = "pp", .set = true};
      op_set_int(xs[k], "n", pp->p);
      op_set_int(xs[k], "peer", other);
      op_set_int(xs[k], "tag", (1 << 20) + gi);
      ptrvec_push(m->arena, &o.f->ops, xs[k]);
    }
    rv->results[0]->name = arena_printf(m->arena, "%s.from_pp%d", gname, other);
    Value *ops[2] = {gv, rv->results[0]};
    Op *add = op_new(m, OP_ADD, ops, 2, &t);
    ptrvec_push(m->arena, &o.f->ops, add);
    Value *as[2] = {gv, add->results[0]};
    ptrvec_push(m->arena, &o.f->ops, op_new(m, OP_ASSIGN, as, 2, NULL));
  }
  /* Every op of the step: kept when it is about a parameter of this rank (or about none).
     The gradient norm's running sum: a term of a parameter of another rank, or of a tied
     parameter counted on its first owner, drops out of it. */
  int *dropped = pl->dropped_on, mark = r + 1, rc = 0;
  bool have_norm = false;
  for (int x = 0; x < n_mine && !rc; x++) {
    int i = mine[x], ab = pl->ab[i];
    Op *op = opt->ops.items[i];
    if (ab == -3) {
      char text[512];
      rc = fail(pp, IR_ERUN, "internal error: an @optimizer_step op outside the norm mixes parameters: %s",
                op_to_string(op, text, sizeof text));
      break;
    }
    if (ab == -2) {
      int live[8], nl = 0;
      for (int k = 0; k < op->n_operands; k++) {
        Value *v = op->operands[k];
        bool dead = v->kind == VAL_RESULT && dropped[v->id] == mark;
        if (!dead && v->kind == VAL_RESULT && pl->about[v->id] >= 0) {
          int pi = pl->about[v->id], first = -1;
          for (int q = 0; q < pp->p && first < 0; q++)
            if (used[q * ng + pi]) first = q;
          dead = first != r;
        }
        if (!dead && nl < 8) live[nl++] = k;
      }
      if (op->kind == OP_ADD && nl == 1) {
        o.map[op->results[0]->id] = get(&o, op->operands[live[0]]);
        continue;
      }
      if (nl == 0) {
        for (int rr = 0; rr < op->n_results; rr++) dropped[op->results[rr]->id] = mark;
        continue;
      }
      if (nl != op->n_operands) {
        char text[512];
        rc = fail(pp, IR_ERUN, "internal error: the gradient norm's op %s loses an operand on pp rank %d",
                  op_to_string(op, text, sizeof text), r);
        break;
      }
    }
    bool any_dropped = false;
    for (int k = 0; k < op->n_operands; k++)
      any_dropped |= op->operands[k]->kind == VAL_RESULT && dropped[op->operands[k]->id] == mark;
    if (any_dropped) {
      for (int rr = 0; rr < op->n_results; rr++) dropped[op->results[rr]->id] = mark;
      continue;
    }
    /* The norm: the sum of squares is summed over pp before its square root. */
    if (op->kind == OP_SQRT && op->results[0]->name && !strcmp(op->results[0]->name, "grad_norm")) {
      Value *x = get(&o, op->operands[0]);
      Type t = x->type;
      Op *ar = op_new(m, OP_ALL_REDUCE, &x, 1, &t);
      ar->attrs[op_attr_index(OP_ALL_REDUCE, "axis")] = (Attr){.kind = ATTR_STR, .s = "pp", .set = true};
      op_set_int(ar, "n", pp->p);
      ar->attrs[op_attr_index(OP_ALL_REDUCE, "reduce")] = (Attr){.kind = ATTR_STR, .s = "sum", .set = true};
      ptrvec_push(m->arena, &o.f->ops, ar);
      o.map[op->operands[0]->id] = ar->results[0];
      have_norm = true;
    }
    emit(&o, op);
  }
  for (int i = 0; i < opt->rets.n && !rc; i++) {
    Value *v = opt->rets.items[i];
    Value *x = v->kind == VAL_GLOBAL ? v : o.map[v->id];
    if (!x) {
      rc = fail(pp, IR_ERUN, "internal error: @optimizer_step's result %d has no value on pp rank %d", i, r);
      break;
    }
    func_add_ret(o.f, x);
  }
  /* the copies are this rank's: cleared for the next (only this rank's ops set any) */
  for (int a = 0; a < opt->args.n; a++) o.map[((Value *)opt->args.items[a])->id] = NULL;
  for (int x = 0; x < n_mine; x++) {
    Op *op = opt->ops.items[mine[x]];
    for (int rr = 0; rr < op->n_results; rr++) o.map[op->results[rr]->id] = NULL;
    if (op->n_operands && op->operands[0]->kind == VAL_RESULT) o.map[op->operands[0]->id] = NULL;
  }
  if (rc) return rc;
  if (!have_norm) return fail(pp, IR_EINPUT, "@optimizer_step has no %%grad_norm = sqrt ...: the pipeline pass needs the "
                              "optimizer pass's step");
  return 0;
}

static int run(Module *m, PassContext *ctx, char *err, size_t errlen) {
  int p = (int)m->mesh.size[AX_PP];
  if (p == 1 || m->pipe.kind) return 0;   /* nothing to pipeline, or done */
  const TrainSettings *ts = ctx->opt && ctx->opt->train ? ctx->opt->train : &train_defaults;
  Func *g = module_find_func(m, "grad_step"), *opt = module_find_func(m, "optimizer_step");
  if (!g || !opt) {
    snprintf(err, errlen, "the pipeline pass cuts a training step: run autodiff and optimizer first (--passes=train)");
    return IR_EINPUT;
  }
  if (!m->local) {
    snprintf(err, errlen, "the pipeline pass runs after the shard pass (the step must be partitioned first)");
    return IR_EINPUT;
  }
  if (ts->zero >= 2) {
    snprintf(err, errlen, "ZeRO-%d shards gradients%s across dp, which pipelines cannot accumulate over micro-batches "
             "(DeepSpeed refuses it too): use --zero 1 or 0 with pp", ts->zero, ts->zero == 3 ? " and parameters" : "");
    return IR_EINPUT;
  }
  PP pp = {0};
  pp.m = m, pp.g = g, pp.err = err, pp.errlen = errlen, pp.p = p;
  pp.kind = ts->pp_schedule ? ts->pp_schedule : PIPE_1F1B;
  pp.v = ts->pp_virtual ? ts->pp_virtual : schedule_default_virtual(pp.kind);
  pp.C = p * pp.v;
  pp.split = pp.kind == PIPE_ZBH1 || pp.kind == PIPE_DUALPIPEV;
  /* The schedule must be able to run before anything is cut. */
  Schedule s;
  int rc = schedule_build(pp.kind, p, pp.v, (int)(ts->grad_accum > 0 ? ts->grad_accum : 1), &s, err, errlen);
  if (rc) return rc;
  schedule_free(&s);
  pp.param = malloc(sizeof *pp.param * ((size_t)m->globals.n + 1));
  if (!pp.param) return fail(&pp, IR_ERUN, "out of memory");
  for (int gi = 0; gi < m->globals.n; gi++) pp.param[gi] = find_param(m, m->globals.items[gi]);
  pp.n_vals = func_number(g);
  int n = g->ops.n;
  pp.phase = calloc((size_t)n + 1, sizeof(int));
  pp.unit = calloc((size_t)n + 1, sizeof(int));
  pp.vphase = calloc((size_t)pp.n_vals + 1, sizeof(int));
  pp.vunit = calloc((size_t)pp.n_vals + 1, sizeof(int));
  pp.reach = calloc((size_t)pp.n_vals + 1, sizeof(int));
  pp.def = calloc((size_t)pp.n_vals + 1, sizeof(Op *));
  rc = classify(&pp);
  if (!rc) rc = split_units(&pp, ts);
  if (!rc) {
    split_tied_accumulates(&pp);
    index_values(&pp);
    pp.part = calloc((size_t)g->ops.n + 1, sizeof(int));
    split_parts(&pp);
  }
  if (!rc) rc = cut_all(&pp);
  pp.used_ng = m->globals.n;
  if (!rc && !(pp.used = calloc((size_t)p * (size_t)m->globals.n + 1, 1))) rc = fail(&pp, IR_ERUN, "out of memory");
  for (int c = 0; c < pp.C && !rc; c++) rc = build_chunk(&pp, c);
  cut_free(&pp);
  if (rc) free(pp.used);
  if (!rc) {
    bool *used = pp.used;
    pp.used = NULL;
    if (pp.used_ng != m->globals.n) {   /* (building added globals: walk the functions instead) */
      free(used);
      used = calloc((size_t)p * (size_t)m->globals.n + 1, 1);
      global_users(&pp, used);
    }
    for (int gi = 0; gi < m->globals.n; gi++) {   /* a parameter nothing reads still gets its update, on rank 0 */
      bool any = false;
      for (int r = 0; r < p; r++) any |= used[r * m->globals.n + gi];
      if (!any && ((Global *)m->globals.items[gi])->kind == GLOBAL_PARAM) used[gi] = true;
    }
    OptPlan pl;
    rc = opt_plan(&pp, opt, &pl);
    /* Each rank's ops of @optimizer_step (about none of the parameters, or about one it
       uses), in order: each rank walks and clears only its own, not all p x ops. */
    int ng = m->globals.n, n_opt = opt->ops.n;
    int *owners = NULL, *n_own = NULL, *mine = NULL, *mine_start = NULL;
    if (!rc) {
      owners = malloc(sizeof(int) * ((size_t)ng * (size_t)p + 1)), n_own = calloc((size_t)ng + 1, sizeof(int));
      mine_start = calloc((size_t)p + 2, sizeof(int));
      if (!owners || !n_own || !mine_start) rc = fail(&pp, IR_ERUN, "out of memory");
    }
    for (int gi = 0; gi < ng && !rc; gi++)
      for (int r = 0; r < p; r++)
        if (used[r * ng + gi]) owners[gi * p + n_own[gi]++] = r;
    for (int i = 0; i < n_opt && !rc; i++) {   /* counts, then the lists */
      if (pl.ab[i] < 0) for (int r = 0; r < p; r++) mine_start[r + 2]++;
      else for (int q = 0; q < n_own[pl.ab[i]]; q++) mine_start[owners[pl.ab[i] * p + q] + 2]++;
    }
    for (int r = 0; r < p && !rc; r++) mine_start[r + 2] += mine_start[r + 1];
    if (!rc && !(mine = malloc(sizeof(int) * ((size_t)mine_start[p + 1] + 1)))) rc = fail(&pp, IR_ERUN, "out of memory");
    for (int i = 0; i < n_opt && !rc; i++) {
      if (pl.ab[i] < 0) for (int r = 0; r < p; r++) mine[mine_start[r + 1]++] = i;
      else for (int q = 0; q < n_own[pl.ab[i]]; q++) mine[mine_start[owners[pl.ab[i] * p + q] + 1]++] = i;
    }
    for (int r = 0; r < p && !rc; r++)
      rc = build_optimizer(&pp, opt, &pl, used, r, mine + mine_start[r], mine_start[r + 1] - mine_start[r]);
    free(owners), free(n_own), free(mine), free(mine_start);
    opt_plan_free(&pl);
    free(used);
  }
  if (!rc) {
    module_drop_func(m, "grad_step");
    module_drop_func(m, "optimizer_step");
    module_drop_func(m, "forward");
    for (int i = 0; i < m->funcs.n; i++) remove_dead_ops(m->funcs.items[i]);
    m->pipe = (PipeInfo){pp.kind, pp.v, ts->grad_accum > 0 ? ts->grad_accum : 1, pp.C};
    ctx->changed += pp.C;
  }
  free(pp.phase), free(pp.unit), free(pp.part), free(pp.vphase), free(pp.vunit), free(pp.reach), free(pp.def);
  free(pp.unit_chunk), free(pp.vval), free(pp.vidx), free(pp.param);
  return rc;
}

const Pass pass_pipeline = {"pipeline", "pp: the step cut into per-chunk forward/backward functions with send/recv, "
                            "per-rank optimizer steps", run};
