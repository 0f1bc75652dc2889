/* passes/fuse.c — pass "fuse": groups chains of elementwise ops, broadcasts, reshapes,
 * casts and reductions into kernels (`kernel func @<f>.kN`, called with `call`), so that
 * a value that only feeds the next op of its group stays in registers.  Matmuls,
 * composites, data movement and effects stay as they are: library calls and builtins.
 *
 * A group has one iteration space of N elements (docs/lowering.md).  Ops are taken in
 * program order; an op joins the group of an operand when:
 *   - it is fusable and works on N elements (a reduction: reads N elements; a broadcast:
 *     writes N elements);
 *   - the group is open: no op outside it has read one of its values yet.  The kernel runs
 *     where its last op was, so a value read earlier by an outsider would come too late;
 *   - it does not read the result of a reduction of that group (that would need a second
 *     pass over the data: softmax-like chains split there);
 *   - a reduction joins only a group without reductions or with the same reduced dims.
 * An op that reads values of two open groups of the same size merges them.  Effect ops
 * (accumulate, assign, fill, adamw) close the groups that read what they write, that they
 * read a value of, or that hold a reduction; other groups stay open across them (a layer's
 * backward keeps fusing across its weight gradients' accumulates: Llama's SwiGLU gradient,
 * dS x up then silu_grad, one kernel) but take no reduction afterwards (GPT-2's residual
 * gradient would swallow the bias gradient's sum, which the CUDA lowering makes a GEMM
 * epilogue and a norm-gradient fusion).
 * Siblings: an elementwise op that no operand's group takes joins an open group that reads
 * one of its operands, or else a closed group (no reduction, at most HOIST_MAX ops back)
 * that reads or defines one, when every operand is ready where that group's kernel runs:
 * the op is computed earlier, the shared input read once (Llama's dS x gate, dS x up and
 * silu_grad: one kernel).  An elementwise value another group defines is computed again
 * instead of read when the reading group reads all its inputs anyway (silu of the gate's
 * input in SwiGLU's gradient): its definer may then stop writing it (the forward keeps no
 * gate).  Both move no rounding: the same ops on the same values.
 * Constants and iotas are cloned into each kernel that reads them instead of being
 * passed; a reshape of a value from outside stays a reshape (memory-plan aliases it).
 * A kernel passes at most FUSE_MAX_BUFS buffers (inputs + outputs: a lowered step's
 * limit); a group that would need more is split back into one kernel per op.
 */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

typedef struct {
  int64_t n;              /* iteration space: elements */
  bool open;
  int parent;             /* union-find: merged groups point to the survivor */
  int last;               /* index of the last member op */
  const Op *reduction;    /* the first reduction of the group (its signature) */
  bool crossed;           /* stayed open across a write (close_at_write) */
} Group;

typedef struct {
  Func *f;
  Module *m;
  Group *groups;
  int n_groups;
  int *group_of;          /* per op index: group or -1 */
  int *def_index;         /* per value id: index of the defining op, or -1 */
  int *reader;            /* per value id (arguments and results): the last group that read it, or -1 */
  bool *hoisted;          /* per op index: joined a closed group (sibling) */
  int *remat;             /* per value id: the group that computes it again instead of reading it, or -1 */
} Fuser;

static bool fusable(const Op *op) {
  OpClass c = op_info(op->kind)->cls;
  return c == CLASS_ELEMENTWISE || c == CLASS_REDUCTION || op->kind == OP_BROADCAST || op->kind == OP_RESHAPE ||
         op->kind == OP_CAST;
}

static int64_t space_of(const Op *op) {
  if (op_info(op->kind)->cls == CLASS_REDUCTION) return type_numel(&op->operands[0]->type);
  return type_numel(&op->results[0]->type);
}

static int find(Fuser *fz, int g) {
  while (fz->groups[g].parent != g) g = fz->groups[g].parent = fz->groups[fz->groups[g].parent].parent;
  return g;
}

/* The group whose op defines v, or -1. */
static int group_of_value(Fuser *fz, const Value *v) {
  if (v->kind != VAL_RESULT) return -1;
  int d = fz->def_index[v->id];
  return d < 0 || fz->group_of[d] < 0 ? -1 : find(fz, fz->group_of[d]);
}

static bool is_reduction_result(const Value *v) {
  return v->kind == VAL_RESULT && op_info(v->def->kind)->cls == CLASS_REDUCTION;
}

static bool same_reduction(const Op *a, const Op *b) {
  return attr_eq(&a->attrs[0], &b->attrs[0]) && type_shape_eq(&a->operands[0]->type, &b->operands[0]->type);
}

/* Can op (at index i) join group g? */
static bool can_join(Fuser *fz, const Op *op, int g) {
  Group *gr = &fz->groups[g];
  if (!gr->open || gr->n != space_of(op)) return false;
  for (int k = 0; k < op->n_operands; k++)
    if (is_reduction_result(op->operands[k]) && group_of_value(fz, op->operands[k]) == g) return false;
  if (op_info(op->kind)->cls == CLASS_REDUCTION && gr->reduction && !same_reduction(gr->reduction, op)) return false;
  if (gr->crossed && op_info(op->kind)->cls == CLASS_REDUCTION) return false;
  return true;
}

static bool same_storage(const Value *a, const Value *b) {
  if (a == b) return true;
  return a->kind == VAL_GLOBAL && b->kind == VAL_GLOBAL && a->global == b->global;
}

/* A write (op i) closes the groups a kernel placed after it would get wrong: a member reads
   what it writes (it would read the new contents), or it reads a value of the group (the
   value would not exist yet); and groups with a reduction (kept where they were).  The
   groups left open are marked crossed (can_join). */
static void close_at_write(Fuser *fz, int i) {
  const Op *w = fz->f->ops.items[i];
  int nw = op_n_writes(w->kind);
  for (int k = 0; k < w->n_operands; k++) {
    int g = group_of_value(fz, w->operands[k]);
    if (g >= 0) fz->groups[g].open = false;
  }
  for (int j = 0; j < i; j++) {
    if (fz->group_of[j] < 0) continue;
    int g = find(fz, fz->group_of[j]);
    if (!fz->groups[g].open) continue;
    const Op *op = fz->f->ops.items[j];
    if (fz->groups[g].reduction) fz->groups[g].open = false;
    for (int k = 0; k < op->n_operands && fz->groups[g].open; k++)
      for (int t = 0; t < nw && t < w->n_operands; t++)
        if (same_storage(op->operands[k], w->operands[t])) fz->groups[g].open = false;
  }
  for (int g = 0; g < fz->n_groups; g++)
    if (fz->groups[g].open) fz->groups[g].crossed = true;
}

/* How far back (ops) an op may be hoisted into a closed group: a layer's backward, not the
   forward it reads (a hoisted value lives from the group's kernel on). */
enum { HOIST_MAX = 12 };

/* Is v computed before op index p (where a closed group's kernel runs), or inside group g? */
static bool ready_at(Fuser *fz, const Value *v, int p, int g) {
  if (v->kind == VAL_ARG) return true;
  if (v->kind != VAL_RESULT) return false;   /* a global may be written between: not hoisted */
  int d = fz->def_index[v->id];
  if (d < 0) return false;
  if (fz->group_of[d] < 0) return d < p;
  int h = find(fz, fz->group_of[d]);
  return h == g || (!fz->groups[h].open && fz->groups[h].last < p);
}

/* A sibling: an elementwise op that no open group takes may join a closed group without a
   reduction that reads one of its operands or defines one (dS x gate, then dS x up and
   silu_grad: SwiGLU's gradient, one read of dS), when each operand is ready where that
   group's kernel runs and no write in between touches one.  The kernel stays where it was:
   the op is computed earlier. */
static int sibling(Fuser *fz, const Op *op, int i) {
  OpClass c = op_info(op->kind)->cls;
  if (c != CLASS_ELEMENTWISE && op->kind != OP_CAST) return -1;
  for (int k = 0; k < op->n_operands; k++) {
    const Value *v = op->operands[k];
    if (v->kind == VAL_GLOBAL) return -1;
  }
  for (int k = 0; k < 2 * op->n_operands; k++) {
    const Value *v = op->operands[k / 2];
    int g = k % 2 ? group_of_value(fz, v) : fz->reader[v->id] >= 0 ? find(fz, fz->reader[v->id]) : -1;
    if (g < 0) continue;
    Group *gr = &fz->groups[g];
    int p = gr->last;
    if (gr->open || gr->reduction || gr->n != space_of(op) || p >= i || i - p > HOIST_MAX) continue;
    bool ok = true;
    for (int j = 0; j < op->n_operands && ok; j++) ok = ready_at(fz, op->operands[j], p, g);
    for (int w = p + 1; w < i && ok; w++) {
      const Op *wr = fz->f->ops.items[w];
      int nw = op_n_writes(wr->kind);
      for (int t = 0; t < nw && t < wr->n_operands && ok; t++)
        for (int j = 0; j < op->n_operands && ok; j++) ok = !same_storage(op->operands[j], wr->operands[t]);
    }
    if (ok) return g;
  }
  return -1;
}

static void assign_groups(Fuser *fz) {
  Func *f = fz->f;
  for (int i = 0; i < f->ops.n; i++) {
    Op *op = f->ops.items[i];
    if (op_n_writes(op->kind)) {   /* a write: nothing that reads what it writes moves across it */
      close_at_write(fz, i);
      continue;
    }
    int target = -1;
    if (fusable(op) && op->kind != OP_CONSTANT) {
      /* Groups this op reads from that it may join; merge them into one. */
      for (int k = 0; k < op->n_operands; k++) {
        int g = group_of_value(fz, op->operands[k]);
        if (g < 0 || g == target || !can_join(fz, op, g)) continue;
        if (target < 0) target = g;
        else {
          fz->groups[g].parent = target;   /* merge g into target */
          if (!fz->groups[target].reduction) fz->groups[target].reduction = fz->groups[g].reduction;
          if (fz->groups[g].last > fz->groups[target].last) fz->groups[target].last = fz->groups[g].last;
        }
      }
      /* No operand's group takes it: an open group that reads one of its operands may
         (one read of the shared input). */
      OpClass cls = op_info(op->kind)->cls;
      for (int k = 0; target < 0 && (cls == CLASS_ELEMENTWISE || op->kind == OP_CAST) && k < op->n_operands; k++) {
        const Value *v = op->operands[k];
        int g = v->kind == VAL_GLOBAL || fz->reader[v->id] < 0 ? -1 : find(fz, fz->reader[v->id]);
        if (g >= 0 && can_join(fz, op, g)) target = g;
      }
      bool hoisted = false;
      if (target < 0 && op->kind != OP_RESHAPE) hoisted = (target = sibling(fz, op, i)) >= 0;
      if (hoisted) {
        fz->group_of[i] = target;   /* its kernel stays at the group's last op: `last` unchanged */
        fz->hoisted[i] = true;
        for (int k = 0; k < op->n_operands; k++) fz->reader[op->operands[k]->id] = target;
        continue;
      }
      /* A reshape of an outside value stays a reshape: it costs nothing once aliased. */
      if (target < 0 && op->kind != OP_RESHAPE) {
        target = fz->n_groups++;
        fz->groups[target] = (Group){space_of(op), true, target, i, NULL, false};
      }
    }
    /* Every group this op reads from without joining is now read by an outsider. */
    for (int k = 0; k < op->n_operands; k++) {
      int g = group_of_value(fz, op->operands[k]);
      if (g >= 0 && g != target) fz->groups[g].open = false;
    }
    if (target >= 0) {
      fz->group_of[i] = target;
      fz->groups[target].last = i;
      for (int k = 0; k < op->n_operands; k++)
        if (op->operands[k]->kind != VAL_GLOBAL) fz->reader[op->operands[k]->id] = target;
      if (op_info(op->kind)->cls == CLASS_REDUCTION && !fz->groups[target].reduction) fz->groups[target].reduction = op;
    }
  }
  for (int i = 0; i < f->ops.n; i++)
    if (fz->group_of[i] >= 0) fz->group_of[i] = find(fz, fz->group_of[i]);
  /* A group's last op may have moved when groups merged (a sibling's does not count). */
  for (int i = 0; i < f->ops.n; i++)
    if (fz->group_of[i] >= 0 && !fz->hoisted[i]) fz->groups[fz->group_of[i]].last = i;
}

/* Computed again, not read: a group reading v = op(u...), an elementwise op of another
   group, when the group reads every u itself (SwiGLU's gradient reads the gate's input for
   silu_grad: it computes silu again, and the forward no longer writes the gate).  The same
   op on the same values: the same result.  stamp/now: scratch, per value id. */
static void choose_remat(Fuser *fz, const int *first, const int *next, int *stamp, int *now) {
  Func *f = fz->f;
  for (int g = 0; g < fz->n_groups; g++) {
    if (first[g] < 0) continue;
    ++*now;
    for (int i = first[g]; i >= 0; i = next[i]) {   /* what the group reads from outside */
      const Op *op = f->ops.items[i];
      for (int k = 0; k < op->n_operands; k++) {
        const Value *v = op->operands[k];
        if (v->kind != VAL_GLOBAL) stamp[v->id] = *now;
      }
    }
    for (int i = first[g]; i >= 0; i = next[i]) {
      const Op *op = f->ops.items[i];
      for (int k = 0; k < op->n_operands; k++) {
        const Value *v = op->operands[k];
        if (v->kind != VAL_RESULT || fz->remat[v->id] >= 0) continue;
        int d = fz->def_index[v->id];
        const Op *dop = fz->f->ops.items[d];
        if (fz->group_of[d] == g || fz->group_of[d] < 0 || op_info(dop->kind)->cls != CLASS_ELEMENTWISE ||
            dop->n_results != 1)
          continue;
        bool all = true;
        for (int j = 0; j < dop->n_operands && all; j++) {
          const Value *u = dop->operands[j];
          all = u->kind != VAL_GLOBAL && stamp[u->id] == *now &&
                (u->kind != VAL_RESULT || fz->group_of[fz->def_index[u->id]] != g);
        }
        if (all) fz->remat[v->id] = g;
      }
    }
  }
}

/* Builds the kernel of group g and returns the call that replaces it; *map[id] receives
   the call's results for the group's outputs. */
/* The group's ops: first[g], then next[i] (op indices in order, -1 ends). inner and ginner
   (program value id / global index -> kernel value) come zeroed and go back zeroed: one
   pair serves every kernel of the function, so building them all stays linear. */
typedef struct {
  const int *first, *next;
  Value **inner, **ginner;
} Members;

static Op *build_kernel(Fuser *fz, int g, int serial, bool *used_outside, Value **map, const Members *mb) {
  Func *f = fz->f;
  Module *m = fz->m;
  char name[256];   /* "<function>.k<serial>", written by hand: snprintf showed in loom plan's profiles */
  size_t len = strlen(f->name);
  if (len > sizeof name - 16) len = sizeof name - 16;
  memcpy(name, f->name, len);
  name[len++] = '.', name[len++] = 'k';
  char digits[12];
  int nd = 0;
  for (unsigned u = (unsigned)serial; nd == 0 || u; u /= 10) digits[nd++] = (char)('0' + u % 10);
  while (nd) name[len++] = digits[--nd];
  name[len] = 0;
  Func *k = module_add_func(m, name);
  k->is_kernel = true;
  Value **inner = mb->inner, **ginner = mb->ginner;
  Value *args[FUSE_MAX_BUFS + 1];
  int n_args = 0;
  for (int i = mb->first[g]; i >= 0; i = mb->next[i]) {
    Op *op = f->ops.items[i];
    Value *operands[256];
    for (int j = 0; j < op->n_operands; j++) {
      Value *v = op->operands[j];
      Value **slot = v->kind == VAL_GLOBAL ? &ginner[v->global->index] : &inner[v->id];
      if (!*slot && v->kind == VAL_RESULT && fz->remat[v->id] == g) {
        const Op *d = v->def;   /* computed again from the group's own inputs */
        Value *ins[256];
        for (int t = 0; t < d->n_operands; t++) {
          Value *u = d->operands[t];
          if (!inner[u->id]) inner[u->id] = func_add_arg(k, u->name, u->type), args[n_args++] = u;
          ins[t] = inner[u->id];
        }
        Type t = v->type;
        Op *c = func_add_op(k, d->kind, ins, d->n_operands, &t);
        memcpy(c->attrs, d->attrs, sizeof c->attrs);
        c->results[0]->name = v->name;
        *slot = c->results[0];
      }
      if (!*slot) {
        const Op *d = v->kind == VAL_RESULT ? v->def : NULL;
        if (d && (d->kind == OP_CONSTANT || d->kind == OP_IOTA)) {
          /* Cheaper to recompute than to load: clone it into the kernel. */
          Type t = v->type;
          Op *c = func_add_op(k, d->kind, NULL, 0, &t);
          memcpy(c->attrs, d->attrs, sizeof c->attrs);
          c->results[0]->name = v->name;
          *slot = c->results[0];
        } else {
          *slot = func_add_arg(k, v->name, v->type);
          args[n_args++] = v;
        }
      }
      operands[j] = *slot;
    }
    Type types[IR_MAX_RESULTS];
    for (int r = 0; r < op->n_results; r++) types[r] = op->results[r]->type;
    Op *c = func_add_op(k, op->kind, operands, op->n_operands, types);
    memcpy(c->attrs, op->attrs, sizeof c->attrs);
    for (int r = 0; r < op->n_results; r++) {
      c->results[r]->name = op->results[r]->name;
      inner[op->results[r]->id] = c->results[r];
      if (used_outside[op->results[r]->id]) func_add_ret(k, c->results[r]);
    }
  }
  Op *call = op_new_n(m, OP_CALL, args, n_args, NULL, k->rets.n);
  call->callee = k;
  call->attrs[0].kind = ATTR_FUNC;
  call->attrs[0].s = k->name;
  call->attrs[0].set = true;
  int r = 0;
  for (int i = mb->first[g]; i >= 0; i = mb->next[i]) {
    Op *op = f->ops.items[i];
    for (int j = 0; j < op->n_results; j++) {
      inner[op->results[j]->id] = NULL;
      if (used_outside[op->results[j]->id]) {
        Value *res = call->results[r++];
        res->type = op->results[j]->type;
        res->name = op->results[j]->name;
        map[op->results[j]->id] = res;
      }
    }
    for (int j = 0; j < op->n_operands; j++) {
      Value *v = op->operands[j];
      if (v->kind == VAL_GLOBAL) ginner[v->global->index] = NULL;
      else inner[v->id] = NULL;
    }
  }
  return call;
}

/* first[g], next[i]: each group's op indices in order (tail: scratch). */
static void link_members(const Fuser *fz, int n_ops, int *first, int *next, int *tail) {
  for (int g = 0; g < fz->n_groups; g++) first[g] = tail[g] = -1;
  for (int i = 0; i < n_ops; i++) {
    int g = fz->group_of[i];
    next[i] = -1;
    if (g < 0) continue;
    if (tail[g] < 0) first[g] = i;
    else next[tail[g]] = i;
    tail[g] = i;
  }
}

static int fuse_func(Module *m, Func *f, int *serial) {
  int n_values = func_number(f), n_ops = f->ops.n;
  Fuser fz = {f, m, calloc(2 * (size_t)n_ops + 1, sizeof(Group)), 0, malloc(sizeof(int) * ((size_t)n_ops + 1)),
              malloc(sizeof(int) * ((size_t)n_values + 1)), NULL, NULL, NULL};
  fz.reader = malloc(sizeof(int) * ((size_t)n_values + 1));
  fz.hoisted = calloc((size_t)n_ops + 1, 1);
  fz.remat = malloc(sizeof(int) * ((size_t)n_values + 1));
  for (int i = 0; i < n_ops; i++) fz.group_of[i] = -1;
  for (int i = 0; i < n_values; i++) fz.def_index[i] = fz.reader[i] = -1;
  for (int i = 0; i < n_ops; i++) {
    const Op *op = f->ops.items[i];
    for (int r = 0; r < op->n_results; r++) fz.def_index[op->results[r]->id] = i;
  }
  assign_groups(&fz);

  /* Values of a group read by an op outside it (or returned) become kernel outputs.
     Groups that would pass too many buffers are split into one kernel per op. */
  bool *used_outside = calloc((size_t)n_values + 1, 1);
  int *bufs = calloc(2 * (size_t)n_ops + 1, sizeof(int));   /* per group: at most 2 n_ops of them */
  /* groups: at most 2 n_ops (fz.groups' size), splitting included */
  int *first = malloc(sizeof(int) * (2 * (size_t)n_ops + 1)), *next = malloc(sizeof(int) * ((size_t)n_ops + 1));
  int *tail = malloc(sizeof(int) * (2 * (size_t)n_ops + 1));
  int *stamp = calloc((size_t)n_values + (size_t)m->globals.n + 1, sizeof(int)), stamp_now = 0;
  for (;;) {
    link_members(&fz, n_ops, first, next, tail);
    for (int i = 0; i < n_values; i++) fz.remat[i] = -1;
    choose_remat(&fz, first, next, stamp, &stamp_now);
    memset(used_outside, 0, (size_t)n_values + 1);
    for (int i = 0; i < n_ops; i++) {
      const Op *op = f->ops.items[i];
      for (int k = 0; k < op->n_operands; k++) {
        const Value *v = op->operands[k];
        if (v->kind == VAL_RESULT && fz.group_of[fz.def_index[v->id]] >= 0 &&
            fz.group_of[fz.def_index[v->id]] != fz.group_of[i] && (fz.group_of[i] < 0 || fz.remat[v->id] != fz.group_of[i]))
          used_outside[v->id] = true;
      }
    }
    for (int i = 0; i < f->rets.n; i++) {
      const Value *v = f->rets.items[i];
      if (v->kind == VAL_RESULT) used_outside[v->id] = true;
    }
    /* Count each group's buffers: outputs, and distinct inputs from outside (a group's
       members in order; stamp: the last group visit that counted a value). */
    memset(bufs, 0, sizeof(int) * (2 * (size_t)n_ops + 1));
    for (int g = 0; g < fz.n_groups; g++) {
      stamp_now++;
      for (int i = first[g]; i >= 0; i = next[i]) {
        const Op *op = f->ops.items[i];
        for (int r = 0; r < op->n_results; r++) bufs[g] += used_outside[op->results[r]->id];
        for (int k = 0; k < op->n_operands; k++) {
          const Value *v = op->operands[k];
          bool inside = v->kind == VAL_RESULT && fz.group_of[fz.def_index[v->id]] == g;
          bool cloned = v->kind == VAL_RESULT && (v->def->kind == OP_CONSTANT || v->def->kind == OP_IOTA || fz.remat[v->id] == g);
          if (inside || cloned) continue;
          int *st = v->kind == VAL_GLOBAL ? &stamp[n_values + v->global->index] : &stamp[v->id];
          if (*st != stamp_now) *st = stamp_now, bufs[g]++;   /* not read already (here or by an earlier member) */
        }
      }
    }
    bool split = false;
    for (int i = 0; i < n_ops; i++) {
      int g = fz.group_of[i];
      if (g < 0 || bufs[g] <= FUSE_MAX_BUFS) continue;
      int single = fz.n_groups++;
      fz.groups[single] = (Group){space_of(f->ops.items[i]), false, single, i, NULL, false};
      fz.group_of[i] = single;
      split = true;
    }
    if (!split) break;
  }
  free(bufs), free(stamp);

  /* Rebuild the op list: each group becomes one call, placed at its last op. */
  Value **map = calloc((size_t)n_values + 1, sizeof *map);
  link_members(&fz, n_ops, first, next, tail);
  Members mb = {first, next, calloc((size_t)n_values + 1, sizeof(Value *)), calloc((size_t)m->globals.n + 1, sizeof(Value *))};
  PtrVec old = f->ops;
  memset(&f->ops, 0, sizeof f->ops);
  int kernels = 0;
  for (int i = 0; i < old.n; i++) {
    Op *op = old.items[i];
    int g = fz.group_of[i];
    if (g >= 0 && fz.groups[g].last != i) continue;
    if (g >= 0) {
      PtrVec keep = f->ops;   /* build_kernel reads the group's ops by their old indices */
      f->ops = old;
      op = build_kernel(&fz, g, (*serial)++, used_outside, map, &mb);
      f->ops = keep;
      kernels++;
    }
    ptrvec_push(m->arena, &f->ops, op);
  }
  /* Uses of group outputs now read the call results.  (Ids are those of the old list.) */
  for (int i = 0; i < f->ops.n; i++) {
    Op *op = f->ops.items[i];
    for (int k = 0; k < op->n_operands; k++) {
      Value *v = op->operands[k];
      if (v->kind == VAL_RESULT && v->def->kind != OP_CALL && map[v->id]) op->operands[k] = map[v->id];
    }
  }
  for (int i = 0; i < f->rets.n; i++) {
    Value *v = f->rets.items[i];
    if (v->kind == VAL_RESULT && map[v->id]) f->rets.items[i] = map[v->id];
  }
  free(map);
  free(first), free(next), free(tail), free(mb.inner), free(mb.ginner);
  free(used_outside);
  free(fz.groups);
  free(fz.group_of);
  free(fz.def_index);
  free(fz.reader), free(fz.hoisted), free(fz.remat);
  remove_dead_ops(f);   /* constants now cloned into every kernel that read them */
  return kernels;
}

static int run(Module *m, PassContext *ctx, char *err, size_t errlen) {
  int n_funcs = m->funcs.n, serial = 0;
  for (int i = 0; i < n_funcs; i++) {
    Func *f = m->funcs.items[i];
    if (f->is_kernel) continue;
    for (int k = 0; k < f->ops.n; k++)
      if (((Op *)f->ops.items[k])->kind == OP_CALL) {
        snprintf(err, errlen, "@%s is already fused (it calls kernels)", f->name);
        return IR_EINPUT;
      }
    serial = 0;
    ctx->changed += fuse_func(m, f, &serial);
  }
  return 0;
}

const Pass pass_fuse = {"fuse", "group elementwise/broadcast/reduction chains into kernels (kernel func + call)", run};
