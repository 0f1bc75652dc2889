/* passes/recompute.c — pass "recompute": forward values the backward reads are computed
 * again in the backward instead of kept alive from the forward (activation recomputation,
 * the playbook's "Activation recomputation").  It rewrites @grad_step after autodiff and
 * shard (so every size it weighs is per rank) and before bucket, cse and the memory plan.
 *
 * What it builds.  For a set R of forward ops, every backward op that reads a result of an
 * op in R reads a clone instead.  A clone is the same op (same kind, attributes, operand
 * order) on the clones of its R operands and on the kept originals of the others, so it
 * gives the same bits: recomputation never changes results.  Clones are inserted right
 * before the first backward op that needs them and are *visible*: their results are named
 * `%rc.<original name>` (`%rc.N` for unnamed ones).  That prefix is the convention the
 * rest of loom knows: cse never merges an `rc.` op with its original (which would undo the
 * recomputation).  The originals then die at their last forward use, so the memory plan
 * frees them before the backward starts.
 *
 * Which ops go in R (`--recompute`, spec "recompute"):
 *   none       nothing (the pass does not change the module).
 *   full       every op of every transformer layer except the layer's outputs (values a
 *              later layer or the head reads): only each layer's input is kept, and a
 *              layer's forward runs again, whole, right before that layer's backward first
 *              needs one of its values.  A layer is found from the parameters an op reads
 *              (h.N. / layers.N.) and flows to the ops that read its results.
 *   selective  ops of the named classes (norm: layernorm, rmsnorm; act: gelu, silu, relu,
 *              sigmoid, tanh; eltwise: the other elementwise ops, such as bias and residual
 *              adds and SwiGLU's product; rope; attn: attention), but only where that saves
 *              memory: an op is recomputed when each of its inputs is kept anyway (the
 *              backward reads it) or is itself recomputed, so the values it frees are not
 *              traded for its inputs.  Matmul outputs are always kept.  The default,
 *              norm,act,eltwise: their inputs (the residual stream, the pre-activation, the
 *              SwiGLU factors) are kept for their own gradients, so recomputing them costs
 *              O(tokens x width) elementwise work and frees the norms' outputs, the
 *              activations' outputs and SwiGLU's product (GPT-2: 6 of the 16 widths per
 *              token a layer keeps).  rope is off by default: its input (q, k before
 *              rotation) is not otherwise kept, so recomputing it would keep the same bytes.
 *              attn is off by default: loom's attention never stores the T x T scores, so
 *              recomputing it frees one width per token for a fifth of the layer's FLOPs.
 *   auto       what fits `--memory-budget` (bytes per rank) at the least added work.
 * In every mode but none, ops that read only parameters (slices, casts, broadcasts and
 * ZeRO-3 gathers of weights) are recomputed too: they cost no activation memory to redo.
 * Reshapes and, in selective mode, data movement and collectives follow their operands
 * (recomputed when every activation operand is), since a reshape shares its operand's
 * bytes and an all-gather of a recomputed norm (sequence parallel) must be redone too.
 *
 * The algorithm of auto (greedy by bytes saved per FLOP, verified against the real plan):
 *   1. The real plan without recomputation (the rest of the training pipeline and lowering,
 *      bucket,canonicalize,cse,dce,fuse,memory-plan, on a copy of the module): if its
 *      peak (state + the largest function arena, what `loom ir --memory` totals) fits,
 *      nothing is recomputed.  State alone over the budget is refused at once.
 *   2. A model of what the forward keeps: K, the values the backward reads (directly or
 *      through a recomputed op's inputs) that are not recomputed.  A move recomputes one
 *      kept value v together with the chain of ops that produce it from values already in
 *      K (so the move makes nothing new kept); it saves bytes(v) and costs the FLOPs of
 *      that chain (matmuls 2MNK, attention 4BHT^2Dh, elementwise ops one per element,
 *      composites eight, collectives four, reshapes none).  Greedily take the move with
 *      the most bytes saved per FLOP, recompute K, repeat until nothing is kept but what
 *      no move can free: an ordered list of moves.
 *   3. Verify against the real plan: the real peak of evenly spaced prefixes of that list
 *      (0, 1/16, 2/16, ... of it, in order, until one fits), then a bisection between the
 *      last prefix that did not fit and the first that did, gives the shortest prefix that
 *      fits (the real peak need not fall at every move, so this is the shortest found, not
 *      a proven minimum).  When no sample fits, selective or else full is taken where it
 *      fits; otherwise the budget is refused with the smallest peak of every plan tried
 *      (the 17 prefixes, full and selective).  Parameter-only ops (above) are part of every
 *      prefix.
 * The chosen values and the planned peak before and after are printed.
 * With pipeline parallelism (pp > 1) the pass runs before the pipeline pass, on the whole
 * step: the pipeline pass puts the clones in the backward functions of their chunks (their
 * `rc.` names say they are the backward's), so the stash a chunk's forward hands to its
 * backward holds what the clones read (under full, each layer's input) instead of what they
 * recompute, and `auto` weighs the real pipelined plan (pipeline runs in its trials).
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

typedef struct {
  Module *m;
  Func *f;
  int target;
  int n_ops, n_vals, n_layers;
  Op **ops;           /* @grad_step's ops as they were, by index */
  int *def;           /* value id -> index of its op, -1 for arguments */
  bool *fwd;          /* op -> computes something the loss depends on (the forward) */
  bool *side;         /* op -> before the loss seed, off the loss's path: the forward's side work, such as
                         the experts' load counted into state (moe_load.l<N>): it reads the originals
                         where it stands, so it is no backward reader (it would pull a whole layer's
                         clones into the forward under full, and keep them to the backward) */
  int *layer;         /* op -> its transformer layer, -1 before the first, n_layers after the last */
  bool *param_only;   /* op -> reads parameters and constants only */
  bool *other_param;  /* op -> parameter-only, and reads a parameter of no layer */
  bool *bwd_read;     /* value id -> a backward op reads it or a reshape of it (set on roots) */
  bool *in_r;         /* op -> recomputed */
  bool *layer_out;    /* op -> a layer's output: a forward op of another layer (or the head) reads it */
  bool *pinned;       /* op -> with pp, never cloned: it reads the tokens or targets and no activation
                         (the embedding: its clone would belong to no chunk's backward), or its result is
                         read by another layer (a clone there would be read by a later chunk's backward,
                         which runs before its own) */
} RC;

/* ---- analysis ---- */

/* Never cloned: effects, calls, and context parallelism's attention blocks (each is paired
   with the ring's transfers around it, and its output and lse are what the backward's ring
   reads: they are kept, as a flash-attention's output and row statistics are). */
static bool clonable(const Op *op) {
  return !(op_info(op->kind)->flags & OPF_EFFECT) && op->kind != OP_CALL && op->kind != OP_ATTENTION_BLOCK &&
         op->kind != OP_ATTENTION_BLOCK_GRAD;
}

static bool is_local(const Value *v) { return v->kind == VAL_RESULT; }

static bool can_clone(const RC *rc, int i) { return clonable(rc->ops[i]) && !rc->pinned[i]; }

/* A reshape shares its operand's bytes: the buffer's owner. */
static Value *root(Value *v) {
  while (is_local(v) && v->def->kind == OP_RESHAPE && is_local(v->def->operands[0])) v = v->def->operands[0];
  return v;
}

/* The layer of a parameter name ("h.3.attn...", "model.layers.3...."), or -1. */
static int layer_of_name(const char *name) {
  static const char *const pats[] = {"h.", "layers."};
  for (int k = 0; k < 2; k++) {
    size_t len = strlen(pats[k]);
    for (const char *p = name; (p = strstr(p, pats[k])); p++) {
      if (p != name && p[-1] != '.') continue;
      if (!isdigit((unsigned char)p[len])) continue;
      char *end;
      long l = strtol(p + len, &end, 10);
      if (*end == '.' && l >= 0 && l < 100000) return (int)l;
    }
  }
  return -1;
}

static int64_t vbytes(const Value *v, int target) {
  int64_t n = type_numel(&v->type) * (target == TARGET_CUDA ? dtype_size(v->type.dtype) : 4);
  return (n + 63) / 64 * 64;
}

static void rc_free(RC *rc) {
  free(rc->ops);
  free(rc->def);
  free(rc->fwd);
  free(rc->side);
  free(rc->layer);
  free(rc->param_only);
  free(rc->other_param);
  free(rc->pinned);
  free(rc->layer_out);
  free(rc->bwd_read);
  free(rc->in_r);
  memset(rc, 0, sizeof *rc);
}

static int rc_analyze(RC *rc, Module *m, Func *f, int target, char *err, size_t errlen) {
  memset(rc, 0, sizeof *rc);
  rc->m = m, rc->f = f, rc->target = target;
  rc->n_vals = func_number(f);
  int n = rc->n_ops = f->ops.n, nv = rc->n_vals + 1;
  rc->ops = malloc(sizeof(Op *) * (size_t)(n + 1));
  rc->def = malloc(sizeof(int) * (size_t)nv);
  rc->fwd = calloc((size_t)n + 1, 1);
  rc->side = calloc((size_t)n + 1, 1);
  rc->layer = calloc((size_t)n + 1, sizeof(int));
  rc->param_only = calloc((size_t)n + 1, 1);
  rc->other_param = calloc((size_t)n + 1, 1);
  rc->bwd_read = calloc((size_t)nv, 1);
  rc->in_r = calloc((size_t)n + 1, 1);
  rc->pinned = calloc((size_t)n + 1, 1);
  rc->layer_out = calloc((size_t)n + 1, 1);
  if (!rc->ops || !rc->def || !rc->fwd || !rc->side || !rc->layer || !rc->param_only || !rc->other_param || !rc->bwd_read || !rc->in_r ||
      !rc->pinned || !rc->layer_out) {
    rc_free(rc);
    snprintf(err, errlen, "out of memory");
    return IR_ERUN;
  }
  for (int i = 0; i < nv; i++) rc->def[i] = -1;
  for (int i = 0; i < n; i++) {
    Op *op = rc->ops[i] = f->ops.items[i];
    for (int r = 0; r < op->n_results; r++) rc->def[op->results[r]->id] = i;
  }
  for (int g = 0; g < m->globals.n; g++) {
    const Global *gl = m->globals.items[g];
    int l = gl->kind == GLOBAL_PARAM ? layer_of_name(gl->name) : -1;
    if (l + 1 > rc->n_layers) rc->n_layers = l + 1;
  }
  /* The forward: every op the returned loss depends on. */
  bool *live = calloc((size_t)nv, 1);
  const Value *loss = f->rets.n ? f->rets.items[f->rets.n - 1] : NULL;
  if (loss && is_local(loss)) live[loss->id] = true;
  for (int i = n - 1; i >= 0; i--) {
    Op *op = rc->ops[i];
    bool any = false;
    for (int r = 0; r < op->n_results; r++) any |= live[op->results[r]->id];
    if (!any || (op_info(op->kind)->flags & OPF_EFFECT)) continue;
    rc->fwd[i] = true;
    for (int k = 0; k < op->n_operands; k++)
      if (is_local(op->operands[k])) live[op->operands[k]->id] = true;
  }
  free(live);
  /* A ring's transfers in the forward (context parallelism: a recv whose value a forward op
     reads, and its send, the one before with the same axis and tag) are the forward's:
     never cloned, and not backward readers of what they send. */
  bool *fwd_read = calloc((size_t)nv, 1);   /* value id -> a forward op reads it */
  for (int i = 0; fwd_read && i < n; i++)
    for (int k = 0; rc->fwd[i] && k < rc->ops[i]->n_operands; k++)
      if (is_local(rc->ops[i]->operands[k])) fwd_read[rc->ops[i]->operands[k]->id] = true;
  for (int i = 0; fwd_read && i < n; i++) {
    int si = ring_send_of(f, i);
    if (si < 0 || !fwd_read[rc->ops[i]->results[0]->id]) continue;
    rc->fwd[i] = rc->fwd[si] = true;
  }
  free(fwd_read);
  /* The forward's side work: what stands before the seed (autodiff's first backward value)
     and is not the forward's. */
  int seed = -1;
  for (int i = 0; i < n && seed < 0; i++)
    if (op_is_loss_seed(rc->ops[i])) seed = i;
  for (int i = 0; i < seed; i++) rc->side[i] = !rc->fwd[i];
  /* Layers, parameter-only ops, and what the backward reads. */
  for (int i = 0; i < n; i++) {
    Op *op = rc->ops[i];
    if (!rc->fwd[i]) {
      for (int k = 0; k < op->n_operands && !rc->side[i]; k++) {
        Value *v = op->operands[k];
        if (is_local(v) && rc->fwd[rc->def[v->id]]) rc->bwd_read[root(v)->id] = true;
      }
      continue;
    }
    /* lp: the largest layer of the parameters read (directly, or through parameter-only
       ops such as bf16 casts, ZeRO-3 gathers, slices); other: a parameter of no layer is
       read (final norm, embeddings); lo: the largest layer of the activations read. */
    int lp = -1, lo = -1;
    bool other = false, po = true, any_act = false;
    for (int k = 0; k < op->n_operands; k++) {
      Value *v = op->operands[k];
      if (v->kind == VAL_GLOBAL) {
        int l = layer_of_name(v->global->name);
        if (l > lp) lp = l;
        other |= l < 0;
      } else if (is_local(v) && rc->param_only[rc->def[v->id]]) {
        int d = rc->def[v->id];
        if (rc->layer[d] > lp) lp = rc->layer[d];
        other |= rc->other_param[d];
      } else if (is_local(v)) {
        int d = rc->def[v->id];
        if (rc->layer[d] > lo) lo = rc->layer[d];
        po = false;
        any_act = true;
      } else {
        po = false;   /* the tokens, the targets */
      }
    }
    rc->param_only[i] = po;
    rc->other_param[i] = po && other;
    rc->pinned[i] = m->mesh.size[AX_PP] > 1 && !po && !any_act;
    rc->layer[i] = po ? lp : lp >= 0 ? lp : other && lo >= 0 ? rc->n_layers : lo;
  }
  for (int j = 0; j < n; j++) {
    if (!rc->fwd[j]) continue;
    const Op *u = rc->ops[j];
    for (int k = 0; k < u->n_operands; k++) {
      const Value *v = u->operands[k];
      if (is_local(v) && rc->layer[rc->def[v->id]] != rc->layer[j]) rc->layer_out[rc->def[v->id]] = true;
    }
  }
  for (int i = 0; m->mesh.size[AX_PP] > 1 && i < n; i++)   /* with pp, layer outputs stay kept: a chunk recomputes its own layers */
    rc->pinned[i] |= rc->layer_out[i] && !rc->param_only[i];
  return 0;
}

/* ---- the rewrite ---- */

typedef struct {
  RC *rc;
  Value **clone_of;   /* value id -> its clone */
  bool *cloned;       /* op -> clone made */
  bool *need;         /* op -> in R and its clone is read */
  bool *group_done;   /* layer + 1 -> materialized (full) */
  PtrVec out;
  int named, made;
  double flops, work;   /* model FLOPs (matmul, attention) and all work (op_cost) of the clones */
} Rewrite;

static double op_cost(const Op *op);

static void materialize(Rewrite *w, int i) {
  RC *rc = w->rc;
  if (w->cloned[i]) return;
  w->cloned[i] = true;
  Op *op = rc->ops[i];
  Value *small[16], **operands = op->n_operands <= 16 ? small : malloc(sizeof(Value *) * (size_t)op->n_operands);
  for (int k = 0; k < op->n_operands; k++) {
    Value *v = op->operands[k];
    if (is_local(v) && rc->in_r[rc->def[v->id]]) {
      materialize(w, rc->def[v->id]);
      v = w->clone_of[v->id];
    }
    operands[k] = v;
  }
  Type types[IR_MAX_RESULTS];
  for (int r = 0; r < op->n_results; r++) types[r] = op->results[r]->type;
  Op *c = op_new(rc->m, op->kind, operands, op->n_operands, types);
  if (operands != small) free(operands);
  memcpy(c->attrs, op->attrs, sizeof c->attrs);
  c->callee = op->callee;
  for (int r = 0; r < op->n_results; r++) {
    Value *v = op->results[r];
    char name[512];
    if (v->name) {   /* "rc.<name>", as snprintf would cut it (snprintf itself showed in loom plan's profiles) */
      size_t len = strlen(v->name);
      if (len > sizeof name - 4) len = sizeof name - 4;
      memcpy(name, "rc.", 3), memcpy(name + 3, v->name, len), name[3 + len] = 0;
    } else {
      snprintf(name, sizeof name, "rc.%d", w->named++);
    }
    value_set_name(rc->m, c->results[r], name);
    w->clone_of[v->id] = c->results[r];
  }
  ptrvec_push(rc->m->arena, &w->out, c);
  w->made++;
  w->flops += flops_op(op);
  w->work += op_cost(op);
}

/* Full recomputation: a layer's needed clones all at once, in forward order. */
static void materialize_group(Rewrite *w, int layer) {
  RC *rc = w->rc;
  if (w->group_done[layer + 1]) return;
  w->group_done[layer + 1] = true;
  for (int i = 0; i < rc->n_ops; i++)
    if (rc->fwd[i] && rc->layer[i] == layer && w->need[i]) materialize(w, i);
}

/* Which ops of R have a clone that something reads: a backward op, or the clone of a
   later op that is itself needed (readers come after, so one reverse sweep). */
static void compute_need(const RC *rc, bool *need, bool *wanted) {
  memset(need, 0, (size_t)rc->n_ops + 1);
  memset(wanted, 0, (size_t)rc->n_vals + 1);
  for (int i = rc->n_ops - 1; i >= 0; i--) {
    Op *op = rc->ops[i];
    if (rc->fwd[i] && rc->in_r[i])
      for (int r = 0; r < op->n_results; r++) need[i] |= wanted[op->results[r]->id];
    if ((!rc->fwd[i] && !rc->side[i]) || need[i])
      for (int k = 0; k < op->n_operands; k++)
        if (is_local(op->operands[k])) wanted[op->operands[k]->id] = true;
  }
}

/* Applies R (rc->in_r) to the function; by layer (full) or op by op.  Returns the clones made. */
static int rewrite(RC *rc, bool by_layer, double *flops, double *work) {
  Rewrite w = {rc, calloc((size_t)rc->n_vals + 1, sizeof(Value *)), calloc((size_t)rc->n_ops + 1, 1),
               calloc((size_t)rc->n_ops + 1, 1), calloc((size_t)rc->n_layers + 3, 1), {0}, 0, 0, 0, 0};
  bool *wanted = calloc((size_t)rc->n_vals + 1, 1);
  compute_need(rc, w.need, wanted);
  free(wanted);
  /* Unnamed clones are %rc.N: N past any such name the function has (recompute ran before). */
  for (int i = 0; i < rc->n_ops; i++) {
    Op *op = rc->ops[i];
    for (int r = 0; r < op->n_results; r++) {
      const char *nm = op->results[r]->name;
      char *end;
      long k = nm && !strncmp(nm, "rc.", 3) && isdigit((unsigned char)nm[3]) ? strtol(nm + 3, &end, 10) : -1;
      if (k >= 0 && !*end && k >= w.named) w.named = (int)k + 1;
    }
  }
  for (int i = 0; i < rc->n_ops; i++) {
    Op *op = rc->ops[i];
    if (!rc->fwd[i] && !rc->side[i]) {
      for (int k = 0; k < op->n_operands; k++) {
        Value *v = op->operands[k];
        if (!is_local(v) || rc->def[v->id] < 0 || !rc->in_r[rc->def[v->id]] || !rc->fwd[rc->def[v->id]]) continue;
        int d = rc->def[v->id];
        if (by_layer) materialize_group(&w, rc->layer[d]);
        materialize(&w, d);
        op->operands[k] = w.clone_of[v->id];
      }
    }
    ptrvec_push(rc->m->arena, &w.out, op);
  }
  rc->f->ops = w.out;
  free(w.clone_of);
  free(w.cloned);
  free(w.need);
  free(w.group_done);
  if (flops) *flops = w.flops;
  if (work) *work = w.work - w.flops;
  return w.made;
}

/* ---- policies ---- */

/* An op's class is written beside it in ir/ops.def (OPF_RC_*): a new activation or norm
   names its class there, not here. */
static unsigned class_of(const Op *op) {
  const OpInfo *in = op_info(op->kind);
  if (in->flags & OPF_RC_NORM) return RC_NORM;
  if (in->flags & OPF_RC_ACT) return RC_ACT;
  if (in->flags & OPF_RC_ROPE) return RC_ROPE;
  if (in->flags & OPF_RC_ATTN) return RC_ATTN;
  return in->cls == CLASS_ELEMENTWISE ? RC_ELTWISE : 0;
}

/* Reshapes follow their operand; parameter-only ops are always recomputed. */
static void finish(RC *rc) {
  for (int i = 0; i < rc->n_ops; i++) {
    Op *op = rc->ops[i];
    if (!rc->fwd[i] || !can_clone(rc, i)) continue;
    if (rc->param_only[i]) rc->in_r[i] = true;
    else if (op->kind == OP_RESHAPE && is_local(op->operands[0])) rc->in_r[i] = rc->in_r[rc->def[op->operands[0]->id]];
  }
}

static void policy_selective(RC *rc, unsigned classes) {
  for (int i = 0; i < rc->n_ops; i++) {
    Op *op = rc->ops[i];
    if (!rc->fwd[i] || !can_clone(rc, i) || rc->param_only[i]) continue;
    OpClass cls = op_info(op->kind)->cls;
    bool follows = op->kind == OP_RESHAPE || cls == CLASS_DATA || cls == CLASS_COLLECTIVE;
    if (!follows && !(class_of(op) & classes)) continue;
    bool ok = true, any = false;
    for (int k = 0; k < op->n_operands && ok; k++) {
      Value *v = op->operands[k];
      if (!is_local(v)) continue;
      int d = rc->def[v->id];
      any = true;
      if (rc->in_r[d] || rc->param_only[d]) continue;
      Value *r0 = root(v);
      ok = !follows && rc->bwd_read[r0->id] && !rc->in_r[rc->def[r0->id]];
    }
    rc->in_r[i] = ok && any;
  }
  finish(rc);
}

static void policy_full(RC *rc) {
  for (int i = 0; i < rc->n_ops; i++)   /* each layer but its outputs (rc->layer_out) */
    rc->in_r[i] = rc->fwd[i] && can_clone(rc, i) && rc->layer[i] >= 0 && rc->layer[i] < rc->n_layers && !rc->layer_out[i];
  finish(rc);
}

/* ---- the model of what the forward keeps (auto, and the summaries) ---- */

/* kept[root id]: read by the backward or by a needed clone, and not recomputed. */
static int64_t model_kept(const RC *rc, bool *kept, bool *need, bool *wanted) {
  compute_need(rc, need, wanted);
  memset(kept, 0, (size_t)rc->n_vals + 1);
  int64_t bytes = 0;
  for (int i = 0; i < rc->n_ops; i++) {
    if (!rc->fwd[i]) continue;
    Op *op = rc->ops[i];
    if (!rc->in_r[i])
      for (int r = 0; r < op->n_results; r++) {
        Value *v = op->results[r];
        if (root(v) == v && rc->bwd_read[v->id]) kept[v->id] = true;
      }
    if (need[i])
      for (int k = 0; k < op->n_operands; k++) {
        Value *u = op->operands[k];
        if (!is_local(u)) continue;
        Value *ru = root(u);
        if (!rc->in_r[rc->def[ru->id]]) kept[ru->id] = true;
      }
  }
  for (int v = 0; v < rc->n_vals; v++)
    if (kept[v]) {
      Op *op = rc->ops[rc->def[v]];
      for (int r = 0; r < op->n_results; r++)
        if (op->results[r]->id == v) bytes += vbytes(op->results[r], rc->target);
    }
  return bytes;
}

/* The work of recomputing an op, in FLOPs (see the file's opening comment). */
static double op_cost(const Op *op) {
  double f = flops_op(op);
  if (f > 0) return f;
  double n = 0;
  for (int r = 0; r < op->n_results; r++) n += (double)type_numel(&op->results[r]->type);
  switch (op_info(op->kind)->cls) {
  case CLASS_COMPOSITE: return 8 * n;
  case CLASS_COLLECTIVE: return 4 * n;
  case CLASS_DATA: return op->kind == OP_RESHAPE ? 0 : n;
  default: return n;
  }
}

typedef struct {
  int *ops, n_ops;     /* the moves' ops, one after another */
  int *end, n;         /* move k: ops[end[k-1] .. end[k]) */
} Moves;

/* The closure of recomputing op i from what K holds: into cl[], returns its size; *saved,
   *cost.  mark[] is scratch (cleared on return). */
static int closure(const RC *rc, int i, const bool *kept, bool *mark, int *cl, int64_t *saved, double *cost) {
  int n = 0;
  int64_t newly = 0, sv = 0;
  double c = 0;
  cl[n++] = i;
  mark[i] = true;
  for (int x = 0; x < n; x++) {
    Op *op = rc->ops[cl[x]];
    c += op_cost(op);
    for (int k = 0; k < op->n_operands; k++) {
      Value *u = op->operands[k];
      if (!is_local(u)) continue;
      Value *ru = root(u);
      int d = rc->def[ru->id];
      if (rc->in_r[d] || kept[ru->id] || mark[d]) continue;
      mark[d] = true;
      if (!can_clone(rc, d)) newly += vbytes(ru, rc->target);
      else cl[n++] = d;
    }
  }
  Op *op = rc->ops[i];
  for (int r = 0; r < op->n_results; r++)
    if (kept[op->results[r]->id]) sv += vbytes(op->results[r], rc->target);
  /* clear the marks: the closure, and the unclonable operands it met */
  for (int x = 0; x < n; x++) {
    Op *o = rc->ops[cl[x]];
    for (int k = 0; k < o->n_operands; k++)
      if (is_local(o->operands[k])) mark[rc->def[root(o->operands[k])->id]] = false;
    mark[cl[x]] = false;
  }
  *saved = sv - newly;
  *cost = c;
  return n;
}

/* Step 2 of auto: the greedy list of moves, from R0 (parameter-only ops). */
static int greedy_moves(RC *rc, Moves *mv) {
  int n = rc->n_ops;
  bool *kept = calloc((size_t)rc->n_vals + 1, 1), *need = calloc((size_t)n + 1, 1), *mark = calloc((size_t)n + 1, 1);
  bool *wanted = calloc((size_t)rc->n_vals + 1, 1);
  int *cl = malloc(sizeof(int) * ((size_t)n + 1)), *best_cl = malloc(sizeof(int) * ((size_t)n + 1));
  mv->ops = malloc(sizeof(int) * ((size_t)n + 1));
  mv->end = malloc(sizeof(int) * ((size_t)n + 1));
  mv->n = mv->n_ops = 0;
  if (!kept || !need || !mark || !wanted || !cl || !best_cl || !mv->ops || !mv->end) return IR_ERUN;
  finish(rc);
  for (;;) {
    model_kept(rc, kept, need, wanted);
    int best = -1, best_n = 0;
    double best_score = 0;
    for (int i = 0; i < n; i++) {
      Op *op = rc->ops[i];
      if (!rc->fwd[i] || rc->in_r[i] || !can_clone(rc, i) || op->kind == OP_RESHAPE) continue;
      bool any = false;
      for (int r = 0; r < op->n_results; r++) any |= kept[op->results[r]->id];
      if (!any) continue;
      int64_t saved;
      double cost;
      int cn = closure(rc, i, kept, mark, cl, &saved, &cost);
      if (saved <= 0) continue;
      double score = (double)saved / (cost + 1);
      if (score > best_score) {
        best_score = score, best = i, best_n = cn;
        memcpy(best_cl, cl, sizeof(int) * (size_t)cn);
      }
    }
    if (best < 0) break;
    for (int x = 0; x < best_n; x++) {
      rc->in_r[best_cl[x]] = true;
      mv->ops[mv->n_ops++] = best_cl[x];
    }
    mv->end[mv->n++] = mv->n_ops;
    finish(rc);
  }
  free(kept), free(need), free(mark), free(wanted), free(cl), free(best_cl);
  return 0;
}

/* R0 plus the first k moves, into rc->in_r. */
static void set_prefix(RC *rc, const Moves *mv, int k) {
  memset(rc->in_r, 0, (size_t)rc->n_ops + 1);
  for (int x = 0; x < (k ? mv->end[k - 1] : 0); x++) rc->in_r[mv->ops[x]] = true;
  finish(rc);
}

/* The real planned peak of the module with R = in_r (NULL: nothing recomputed): a copy,
   rewritten, through the rest of the training pipeline and lowering. */
static int real_peak(Module *m, const bool *in_r, const PassContext *ctx, int target, int64_t *peak, int64_t *arena,
                     char *err, size_t errlen) {
  char *text = module_to_string(m);
  Module *c = NULL;
  int rc = text ? parse_module("<recompute: a copy of the module>", text, &c, err, errlen) : IR_ERUN;
  free(text);
  if (rc) {
    module_free(c);
    return rc;
  }
  if (in_r) {
    RC r2;
    Func *g = module_find_func(c, "grad_step");
    if (!g || (rc = rc_analyze(&r2, c, g, target, err, errlen))) {
      module_free(c);
      return rc ? rc : IR_ERUN;
    }
    memcpy(r2.in_r, in_r, (size_t)r2.n_ops);
    rewrite(&r2, false, NULL, NULL);
    rc_free(&r2);
  }
  PassOptions po;
  memset(&po, 0, sizeof po);
  po.train = ctx->opt ? ctx->opt->train : NULL;
  po.target = target;
  /* the pass manager's runner, handed to us (PassContext.run_pipeline): a pass that runs
     passes without a loop between the two files */
  rc = ctx->run_pipeline(c, c->mesh.size[AX_PP] > 1 ? "pipeline,bucket,canonicalize,cse,dce,overlap,fuse,memory-plan"
                                                 : "bucket,canonicalize,cse,dce,overlap,fuse,memory-plan",
                    &po, err, errlen);
  if (!rc && c->pipe.kind) {   /* the worst pp rank: its state, arena and stash (memory_rank.c) */
    *peak = memory_rank_peak(c, target);
    if (*peak < 0) rc = IR_ERUN, snprintf(err, errlen, "recompute: the pipeline's schedule could not be built");
    *arena = 0;
  } else if (!rc) {
    *peak = memory_planned_peak(c, target, NULL, arena);
  }
  module_free(c);
  return rc;
}

static void human(char *buf, size_t n, int64_t bytes) {
  const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, u++;
  snprintf(buf, n, u ? "%.2f %s" : "%.0f %s", v, unit[u]);
}

/* The names of the values the forward no longer keeps (kept under `before`, not under in_r). */
static void print_freed(FILE *out, RC *rc, const bool *before) {
  bool *kept = calloc((size_t)rc->n_vals + 1, 1), *need = calloc((size_t)rc->n_ops + 1, 1);
  bool *wanted = calloc((size_t)rc->n_vals + 1, 1);
  model_kept(rc, kept, need, wanted);
  int unnamed = 0, col = 0;
  fprintf(out, "recompute: no longer kept for the backward:");
  for (int v = 0; v < rc->n_vals; v++) {
    if (!before[v] || kept[v]) continue;
    const Op *op = rc->ops[rc->def[v]];
    const char *name = NULL;
    for (int r = 0; r < op->n_results; r++)
      if (op->results[r]->id == v) name = op->results[r]->name;
    if (!name) {
      unnamed++;
      continue;
    }
    if (col > 90) fprintf(out, "\n ");
    col = col > 90 ? 0 : col;
    col += fprintf(out, " %%%s", name);
  }
  if (unnamed) fprintf(out, "%s and %d unnamed values", col ? "," : "", unnamed);
  fputc('\n', out);
  free(kept), free(need), free(wanted);
}

/* Step 1 and 3 of auto; leaves rc->in_r as chosen. */
static int choose_auto(RC *rc, const PassContext *ctx, int64_t budget, FILE *out, char *err, size_t errlen) {
  int target = rc->target;
  int64_t state, p0, a0;
  bool pp = rc->m->mesh.size[AX_PP] > 1;   /* peaks are the worst pp rank's (real_peak) */
  memory_planned_peak(rc->m, target, &state, NULL);
  char b[32], x[32], y[32], z[32], parts[96];
  human(b, sizeof b, budget);
  human(x, sizeof x, state);
  if (!pp && state > budget) {   /* with pp a rank holds only its stages' state: the trials say */
    snprintf(err, errlen, "--memory-budget %s per rank cannot be met: the parameters, gradients and optimizer state "
             "alone take %s per rank (%lld bytes), before any activation; raise the budget, or shard the state over "
             "more ranks (--zero 3 with a larger dp, or tp)", b, x, (long long)state);
    return IR_EINPUT;
  }
  int rc_ = real_peak(rc->m, NULL, ctx, target, &p0, &a0, err, errlen);
  if (rc_) return rc_;
  human(y, sizeof y, p0);
  human(z, sizeof z, a0);
  if (pp) snprintf(parts, sizeof parts, "the worst pp rank's state, arena and stash");
  else snprintf(parts, sizeof parts, "state %s + arena %s", x, z);
  fprintf(out, "recompute auto: budget %s per rank (budget %lld bytes); planned peak without recomputation %s (%s)\n", b,
          (long long)budget, y, parts);
  if (p0 <= budget) {
    fprintf(out, "recompute auto: it fits: nothing is recomputed\n");
    return 0;
  }
  Moves mv;
  if (greedy_moves(rc, &mv)) {
    free(mv.ops), free(mv.end);
    snprintf(err, errlen, "out of memory");
    return IR_ERUN;
  }
  /* Step 3: the shortest prefix that fits. */
  enum { SAMPLES = 16 };
  int64_t best_peak = p0, peak, arena;
  const char *best_what = "no recomputation";
  char what[64];
  int lo = -1, hi = -1;
  for (int s = 0; s <= SAMPLES && !rc_; s++) {
    int k = (int)((int64_t)mv.n * s / SAMPLES);
    set_prefix(rc, &mv, k);
    if ((rc_ = real_peak(rc->m, rc->in_r, ctx, target, &peak, &arena, err, errlen))) break;
    if (peak < best_peak) {
      best_peak = peak;
      snprintf(what, sizeof what, "the first %d of %d greedy moves", k, mv.n);
      best_what = what;
    }
    if (peak <= budget) {
      hi = k;
      break;
    }
    lo = k;
  }
  while (!rc_ && hi >= 0 && hi - lo > 1) {
    int mid = lo + (hi - lo) / 2;
    set_prefix(rc, &mv, mid);
    if ((rc_ = real_peak(rc->m, rc->in_r, ctx, target, &peak, &arena, err, errlen))) break;
    if (peak <= budget) hi = mid;
    else lo = mid;
  }
  if (!rc_ && hi < 0) {   /* no prefix fits: full and selective too (the real peak need not fall
                             with every move), the cheaper that fits, else the smallest peak */
    const char *names[2] = {"full", "selective"};
    int64_t pk[2] = {INT64_MAX, INT64_MAX};
    for (int p = 0; p < 2 && !rc_; p++) {
      memset(rc->in_r, 0, (size_t)rc->n_ops + 1);
      if (p == 0) policy_full(rc);
      else policy_selective(rc, RC_DEFAULT_CLASSES);
      if ((rc_ = real_peak(rc->m, rc->in_r, ctx, target, &peak, &arena, err, errlen))) break;
      pk[p] = peak;
      if (peak < best_peak) best_peak = peak, best_what = names[p];
    }
    int fit = pk[1] <= budget ? 1 : pk[0] <= budget ? 0 : -1;   /* selective adds no matmul: first */
    if (!rc_ && fit >= 0) {
      memset(rc->in_r, 0, (size_t)rc->n_ops + 1);
      if (fit == 0) policy_full(rc);
      else policy_selective(rc, RC_DEFAULT_CLASSES);
      human(y, sizeof y, pk[fit]);
      fprintf(out, "recompute auto: no prefix of the %d greedy moves fits; chose %s: planned peak %s, under the budget "
              "%s\n", mv.n, names[fit], y, b);
      free(mv.ops), free(mv.end);
      return 0;
    }
    if (!rc_) {
      human(y, sizeof y, best_peak);
      snprintf(err, errlen, "--memory-budget %s per rank cannot be met: the smallest planned peak recomputation reaches "
               "is %s (%lld bytes, with %s; %s%s), over the budget; raise the budget to at least %s, or "
               "shard over more ranks (dp with --zero 3, tp%s), or lower --batch or --seq", b, y, (long long)best_peak,
               best_what, pp ? "the worst pp rank's" : "state ", pp ? "" : x, y, pp ? ", pp" : "");
      rc_ = IR_EINPUT;
    }
  }
  if (!rc_) {
    set_prefix(rc, &mv, hi);
    rc_ = real_peak(rc->m, rc->in_r, ctx, target, &peak, &arena, err, errlen);
    if (!rc_) {
      human(y, sizeof y, peak);
      human(z, sizeof z, arena);
      if (pp) snprintf(parts, sizeof parts, "the worst pp rank's state, arena and stash");
      else snprintf(parts, sizeof parts, "state %s + arena %s", x, z);
      fprintf(out, "recompute auto: chose the first %d of %d greedy moves (by bytes saved per FLOP): planned peak %s "
              "(%s), under the budget %s (the lowered program's plan, which the backends allocate: "
              "--passes=train,lower --memory prints it)\n", hi, mv.n, y, parts, b);
    }
  }
  free(mv.ops), free(mv.end);
  return rc_;
}

/* ---- the pass ---- */

static int run(Module *m, PassContext *ctx, char *err, size_t errlen) {
  const TrainSettings *ts = ctx->opt && ctx->opt->train ? ctx->opt->train : &train_defaults;
  int mode = ts->recompute;
  if (mode == RECOMPUTE_NONE) return 0;
  FILE *out = ctx->opt && ctx->opt->print_to ? ctx->opt->print_to : stderr;
  int target = ctx->opt ? ctx->opt->target : TARGET_CPU;
  if (m->pipe.kind) {
    snprintf(err, errlen, "recompute rewrites the whole @grad_step, and the pipeline pass has already cut it into "
             "chunks: run recompute before pipeline (--passes=train does)");
    return IR_EINPUT;
  }
  Func *f = module_find_func(m, "grad_step");
  if (!f) {
    snprintf(err, errlen, "recompute rewrites @grad_step, and the module has none: run it after autodiff "
             "(--passes=train does)");
    return IR_EINPUT;
  }
  for (int i = 0; i < m->funcs.n; i++)
    if (((Func *)m->funcs.items[i])->is_kernel) {
      snprintf(err, errlen, "recompute runs before fuse (the module already has kernels): put it before fuse");
      return IR_EINPUT;
    }
  if (mode == RECOMPUTE_AUTO && ts->memory_budget <= 0) {
    snprintf(err, errlen, "--recompute auto needs --memory-budget (the planned peak per rank to fit, e.g. 40GiB)");
    return IR_EINPUT;
  }
  RC rc;
  int r = rc_analyze(&rc, m, f, target, err, errlen);
  if (r) return r;
  bool *kept0 = calloc((size_t)rc.n_vals + 1, 1), *need = calloc((size_t)rc.n_ops + 1, 1);
  bool *wanted = calloc((size_t)rc.n_vals + 1, 1);
  int64_t before = model_kept(&rc, kept0, need, wanted);
  char policy[128];
  snprintf(policy, sizeof policy, "%s", recompute_mode_names[mode]);
  if (mode == RECOMPUTE_SELECTIVE) {
    unsigned cls = ts->recompute_classes ? ts->recompute_classes : RC_DEFAULT_CLASSES;
    for (int c = 0, first = 1; c < RC_N_CLASSES; c++)
      if (cls & (1u << c)) {
        snprintf(policy + strlen(policy), sizeof policy - strlen(policy), "%s%s", first ? ":" : ",",
                 recompute_class_names[c]);
        first = 0;
      }
    policy_selective(&rc, cls);
  } else if (mode == RECOMPUTE_FULL) {
    policy_full(&rc);
  } else {
    r = choose_auto(&rc, ctx, ts->memory_budget, out, err, errlen);
  }
  free(need);
  free(wanted);
  if (r) {
    free(kept0);
    rc_free(&rc);
    return r;
  }
  bool *kept = calloc((size_t)rc.n_vals + 1, 1), *need2 = calloc((size_t)rc.n_ops + 1, 1);
  bool *wanted2 = calloc((size_t)rc.n_vals + 1, 1);
  int64_t after = model_kept(&rc, kept, need2, wanted2);
  free(kept), free(need2), free(wanted2);
  print_freed(out, &rc, kept0);
  double flops = 0, other = 0, total_mm, total_at;
  flops_of(f, &total_mm, &total_at);
  int made = rewrite(&rc, mode == RECOMPUTE_FULL, &flops, &other);
  char b0[32], b1[32];
  human(b0, sizeof b0, before);
  human(b1, sizeof b1, after);
  fprintf(out, "recompute %s: %d forward ops cloned into the backward (%%rc.*): +%.4g model FLOPs (matmul, attention: "
          "%.1f%% of the step's) and about %.4g other operations (elementwise, norms, copies); activations kept for "
          "the backward %s -> %s\n", policy, made, flops, total_mm + total_at > 0 ? 100 * flops / (total_mm + total_at) : 0.0,
          other, b0, b1);
  ctx->changed += made;
  free(kept0);
  rc_free(&rc);
  return 0;
}

const Pass pass_recompute = {"recompute", "clone forward ops into the backward instead of keeping them (--recompute)", run};
