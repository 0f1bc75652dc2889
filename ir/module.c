/* ir/module.c — building modules, functions, ops and values. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

Module *module_new(const char *name) {
  Arena *a = arena_new();
  if (!a) return NULL;
  Module *m = arena_alloc(a, sizeof *m);
  m->arena = a;
  m->name = arena_strdup(a, name ? name : "m");
  for (int i = 0; i < AX_COUNT; i++) m->mesh.size[i] = 1;
  return m;
}

void module_free(Module *m) {
  if (m) arena_free(m->arena);
}

static unsigned name_hash(const char *s) {
  unsigned h = 2166136261u;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
  return h;
}

/* Indexes globals[i] by name (the table grows to keep it under half full; the old one stays
   in the arena). */
static void gslot_put(Module *m, int i) {
  if (2 * (m->globals.n + 1) > m->gcap) {
    int cap = m->gcap ? 2 * m->gcap : 64;
    while (2 * (m->globals.n + 1) > cap) cap *= 2;
    m->gslot = arena_alloc(m->arena, sizeof(int) * (size_t)cap);   /* zeroed: every slot empty */
    m->gcap = cap;
    for (int k = 0; k < m->globals.n; k++)
      if (k != i) gslot_put(m, k);
  }
  const Global *g = m->globals.items[i];
  unsigned at = name_hash(g->name) & (unsigned)(m->gcap - 1);
  while (m->gslot[at]) at = (at + 1) & (unsigned)(m->gcap - 1);
  m->gslot[at] = i + 1;
}

Global *module_add_global(Module *m, GlobalKind kind, const char *name, Type t, Init init) {
  Global *g = arena_alloc(m->arena, sizeof *g);
  g->kind = kind;
  g->name = arena_strdup(m->arena, name);
  g->init = init;
  g->index = m->globals.n;
  Value *v = arena_alloc(m->arena, sizeof *v);
  v->type = t;
  v->offset = -1;
  v->kind = VAL_GLOBAL;
  v->global = g;
  v->name = g->name;
  g->value = v;
  ptrvec_push(m->arena, &m->globals, g);
  gslot_put(m, g->index);
  return g;
}

Global *module_find_global(const Module *m, const char *name) {
  if (!m->gcap) return NULL;
  unsigned at = name_hash(name) & (unsigned)(m->gcap - 1);
  for (; m->gslot[at]; at = (at + 1) & (unsigned)(m->gcap - 1)) {
    Global *g = m->globals.items[m->gslot[at] - 1];
    if (!strcmp(g->name, name)) return g;   /* the first of equal names, as a scan would find */
  }
  return NULL;
}

Func *module_add_func(Module *m, const char *name) {
  Func *f = arena_alloc(m->arena, sizeof *f);
  f->name = arena_strdup(m->arena, name);
  f->module = m;
  f->arena_bytes = -1;
  ptrvec_push(m->arena, &m->funcs, f);
  return f;
}

Func *module_find_func(const Module *m, const char *name) {
  for (int i = 0; i < m->funcs.n; i++) {
    Func *f = m->funcs.items[i];
    if (!strcmp(f->name, name)) return f;
  }
  return NULL;
}

Value *func_add_arg(Func *f, const char *name, Type t) {
  Value *v = arena_alloc(f->module->arena, sizeof *v);
  v->type = t;
  v->offset = -1;
  v->kind = VAL_ARG;
  v->index = f->args.n;
  if (name) v->name = arena_strdup(f->module->arena, name);
  ptrvec_push(f->module->arena, &f->args, v);
  return v;
}

void func_add_ret(Func *f, Value *v) { ptrvec_push(f->module->arena, &f->rets, v); }

Op *op_new(Module *m, OpKind k, Value **operands, int n_operands, const Type *result_types) {
  return op_new_n(m, k, operands, n_operands, result_types, op_info(k)->n_results);
}

Op *op_new_n(Module *m, OpKind k, Value **operands, int n_operands, const Type *result_types, int n_results) {
  const OpInfo *info = op_info(k);
  /* the op, its operand and result arrays and its results in one piece of the arena */
  size_t no = (size_t)(n_operands ? n_operands : 1), nr = (size_t)(n_results > 0 ? n_results : 1);
  size_t at_ops = (sizeof(Op) + 15) & ~(size_t)15, at_res = at_ops + ((sizeof(Value *) * no + 15) & ~(size_t)15);
  size_t at_vals = at_res + ((sizeof(Value *) * nr + 15) & ~(size_t)15), vsize = (sizeof(Value) + 15) & ~(size_t)15;
  char *mem = arena_alloc(m->arena, at_vals + vsize * (size_t)(n_results > 0 ? n_results : 0));
  Op *op = (Op *)mem;
  op->kind = k;
  op->n_operands = n_operands;
  op->operands = (Value **)(mem + at_ops);
  for (int i = 0; i < n_operands; i++) op->operands[i] = operands[i];
  op->n_results = n_results;
  op->results = (Value **)(mem + at_res);
  for (int i = 0; i < n_results; i++) {
    Value *v = (Value *)(mem + at_vals + vsize * (size_t)i);
    v->offset = -1;
    v->kind = VAL_RESULT;
    v->def = op;
    v->index = i;
    if (result_types) v->type = result_types[i];
    op->results[i] = v;
  }
  for (int i = 0; i < info->n_attrs; i++) {
    op->attrs[i] = info->attrs[i].def;
    op->attrs[i].kind = info->attrs[i].kind;
    op->attrs[i].set = info->attrs[i].has_default;
  }
  return op;
}

Op *func_add_op(Func *f, OpKind k, Value **operands, int n_operands, const Type *result_types) {
  Op *op = op_new(f->module, k, operands, n_operands, result_types);
  ptrvec_push(f->module->arena, &f->ops, op);
  return op;
}

void value_set_name(Module *m, Value *v, const char *name) {
  v->name = name ? arena_strdup(m->arena, name) : NULL;
}

int func_number(Func *f) {
  int id = 0;
  for (int i = 0; i < f->args.n; i++) ((Value *)f->args.items[i])->id = id++;
  for (int i = 0; i < f->ops.n; i++) {
    Op *op = f->ops.items[i];
    for (int r = 0; r < op->n_results; r++) op->results[r]->id = id++;
  }
  return id;
}

/* ---- attributes ---- */

static Attr *attr_slot(Op *op, const char *name, AttrKind kind) {
  int i = op_attr_index(op->kind, name);
  if (i < 0 || op_info(op->kind)->attrs[i].kind != kind) return NULL;
  op->attrs[i].set = true;
  return &op->attrs[i];
}

void op_set_int(Op *op, const char *name, int64_t v) {
  Attr *a = attr_slot(op, name, ATTR_INT);
  if (a) a->i = v;
}
void op_set_float(Op *op, const char *name, double v) {
  Attr *a = attr_slot(op, name, ATTR_FLOAT);
  if (a) a->f = v;
}
void op_set_bool(Op *op, const char *name, bool v) {
  Attr *a = attr_slot(op, name, ATTR_BOOL);
  if (a) a->i = v;
}
void op_set_ints(Module *m, Op *op, const char *name, const int64_t *v, int n) {
  Attr *a = attr_slot(op, name, ATTR_INTS);
  if (!a) return;
  a->n = n;
  a->ints = arena_alloc(m->arena, sizeof(int64_t) * (size_t)(n ? n : 1));
  memcpy(a->ints, v, sizeof(int64_t) * (size_t)n);
}

const Attr *op_attr(const Op *op, const char *name) {
  int i = op_attr_index(op->kind, name);
  return i < 0 ? NULL : &op->attrs[i];
}
int64_t op_int(const Op *op, const char *name) {
  const Attr *a = op_attr(op, name);
  return a ? a->i : 0;
}
double op_float(const Op *op, const char *name) {
  const Attr *a = op_attr(op, name);
  return a ? a->f : 0;
}
bool op_bool(const Op *op, const char *name) {
  const Attr *a = op_attr(op, name);
  return a ? a->i != 0 : false;
}

static bool op_uses(const Op *o, const Value *v) {
  for (int k = 0; k < o->n_operands; k++)
    if (o->operands[k] == v) return true;
  return false;
}

bool adamw_assigned_back(const Func *f, int i, int assigns[3]) {
  const Op *op = f->ops.items[i];
  if (op->kind != OP_ADAMW) return false;
  for (int k = 0; k < 3; k++)
    if (op->operands[k]->kind != VAL_GLOBAL || op->results[k]->type.dtype != op->operands[k]->type.dtype) return false;
  int n_found = 0;
  for (int k = 0; k < 3; k++) assigns[k] = -1;
  for (int j = i + 1; j < f->ops.n; j++) {
    const Op *o = f->ops.items[j];
    bool ours = false;
    if (o->kind == OP_ASSIGN)
      for (int k = 0; k < 3; k++)
        if (assigns[k] < 0 && o->operands[1] == op->results[k] && o->operands[0] == op->operands[k]) {
          assigns[k] = j;
          n_found++;
          ours = true;
        }
    if (ours) continue;
    for (int k = 0; k < 3; k++) {
      if (op_uses(o, op->results[k])) return false;
      if (n_found < 3 && op_uses(o, op->operands[k])) return false;
    }
  }
  for (int k = 0; k < f->rets.n; k++)
    for (int r = 0; r < 3; r++)
      if (f->rets.items[k] == op->results[r]) return false;
  return n_found == 3;
}

/* A call of a kernel func that only casts its one argument, an f32 parameter global, to a
   2-byte float dtype of the same size: that global's index, else -1. */
int weight_cast_of_param(const Op *op) {
  if (op->kind != OP_CALL || op->n_operands != 1 || op->n_results != 1) return -1;
  const Func *k = op->callee;
  if (!k || !k->is_kernel || k->args.n != 1 || k->rets.n != 1 || k->ops.n != 1) return -1;
  const Op *c = k->ops.items[0];
  if (c->kind != OP_CAST || c->operands[0] != k->args.items[0] || k->rets.items[0] != c->results[0]) return -1;
  const Value *p = op->operands[0], *r = op->results[0];
  if (p->kind != VAL_GLOBAL || p->type.dtype != DT_F32 || p->global->kind != GLOBAL_PARAM) return -1;
  if ((r->type.dtype != DT_BF16 && r->type.dtype != DT_F16) || type_numel(&r->type) != type_numel(&p->type)) return -1;
  return p->global->index;
}

/* The same cast as an op of its own, as a function is before fuse: the planner's memo figures
   some functions without lowering them (passes/lower_memo.c), and the plan must count the
   copies as the whole lowering will (LOOM_PLAN_CHECK compares the two).  Only in functions
   the caller says are not lowered: a lowered function's bare cast stays a cast (lower_fuse.c
   gives no copy to a parameter only such a cast reads). */
static int bare_cast_of_param(const Op *op) {
  if (op->kind != OP_CAST || op->n_operands != 1 || op->n_results != 1) return -1;
  const Value *p = op->operands[0], *r = op->results[0];
  if (p->kind != VAL_GLOBAL || p->type.dtype != DT_F32 || p->global->kind != GLOBAL_PARAM) return -1;
  if ((r->type.dtype != DT_BF16 && r->type.dtype != DT_F16) || type_numel(&r->type) != type_numel(&p->type)) return -1;
  return p->global->index;
}

int weight_copy_dtypes(const Module *m, DType *copy) { return weight_copy_dtypes_before_fuse(m, copy, NULL); }

int weight_copy_dtypes_before_fuse(const Module *m, DType *copy, const bool *before_fuse) {
  int ng = m->globals.n, n = 0;
  /* 0: not cast; 1: cast (to copy[g]); 2: ruled out */
  char *state = calloc((size_t)(ng ? ng : 1), 1);
  if (!state) return -1;
  for (int fi = 0; fi < m->funcs.n; fi++) {
    const Func *f = m->funcs.items[fi];
    if (f->is_kernel) continue;
    /* the assigns of in-place AdamW updates write their globals; the adamw itself none */
    bool *assign_back = calloc((size_t)(f->ops.n ? f->ops.n : 1), sizeof(bool));
    if (!assign_back) {
      free(state);
      return -1;
    }
    for (int i = 0; i < f->ops.n; i++) {
      int found[3];
      if (adamw_assigned_back(f, i, found))
        for (int k = 0; k < 3; k++) assign_back[found[k]] = true;
    }
    for (int i = 0; i < f->ops.n; i++) {
      const Op *op = f->ops.items[i];
      int g = weight_cast_of_param(op);
      if (g < 0 && before_fuse && before_fuse[fi]) g = bare_cast_of_param(op);
      if (g >= 0) {
        DType dt = op->results[0]->type.dtype;
        if (state[g] == 0) state[g] = 1, copy[g] = dt;
        else if (state[g] == 1 && copy[g] != dt) state[g] = 2;
        continue;
      }
      /* any other writer of a global rules it out */
      const OpInfo *info = op_info(op->kind);
      if ((info->flags & (OPF_W1 | OPF_W3)) && !assign_back[i])
        for (int k = 0; k < ((info->flags & OPF_W3) ? 3 : 1) && k < op->n_operands; k++)
          if (op->operands[k]->kind == VAL_GLOBAL) state[op->operands[k]->global->index] = 2;
      for (int r = 0; r < op->n_results; r++)
        if (op->results[r]->kind == VAL_GLOBAL) state[op->results[r]->global->index] = 2;
    }
    free(assign_back);
  }
  for (int g = 0; g < ng; g++) {
    if (state[g] != 1) copy[g] = DT_F32;
    else n++;
  }
  free(state);
  return n;
}

int ir_expert_name(const char *name, int64_t e, char *buf, size_t n) {
  const char *at = NULL;
  for (const char *p = strstr(name, ".experts."); p; p = strstr(p + 1, ".experts.")) at = p;
  if (!at) return -1;
  int w = snprintf(buf, n, "%.*s.experts.%lld.%s.weight", (int)(at - name), name, (long long)e, at + 9);
  return w < 0 || (size_t)w >= n ? -1 : 0;
}
