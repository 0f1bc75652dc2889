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
      if (op_info(op->kind)->cls == CLASS_REDUCTION && !fz->groups[target].reduction) fz->groups[target].reduction = op;
    }
  }
  for (int i = 0; i < f->ops.n; i++)
    if (fz->group_of[i] >= 0) fz->group_of[i] = find(fz, fz->group_of[i]);
  /* A group's last op may have moved when groups merged. */
  for (int i = 0; i < f->ops.n; i++)
    if (fz->group_of[i] >= 0) fz->groups[fz->group_of[i]].last = i;
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
              malloc(sizeof(int) * ((size_t)n_values + 1))};
  for (int i = 0; i < n_ops; i++) fz.group_of[i] = -1;
  for (int i = 0; i < n_values; i++) fz.def_index[i] = -1;
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
    memset(used_outside, 0, (size_t)n_values + 1);
    for (int i = 0; i < n_ops; i++) {
      const Op *op = f->ops.items[i];
      for (int k = 0; k < op->n_operands; k++) {
        const Value *v = op->operands[k];
        if (v->kind == VAL_RESULT && fz.group_of[fz.def_index[v->id]] >= 0 &&
            fz.group_of[fz.def_index[v->id]] != fz.group_of[i])
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
          bool cloned = v->kind == VAL_RESULT && (v->def->kind == OP_CONSTANT || v->def->kind == OP_IOTA);
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
