/* ir/clone.c — a deep copy of a module (module_clone) and dropping a function.
 *
 * The copy has its own arena: globals, functions, ops, values, names, attribute strings and
 * arrays are all copied, so it outlives the source and either may be changed or freed on its
 * own (or, with share_strings, the names and attribute strings and arrays stay the source's,
 * which must then outlive the copy).  The source is only read (value ids are not renumbered), so several threads may copy
 * one module at once: `loom plan` compiles many layouts from one trained module this way.
 * Everything the passes read is kept: value ids, memory-plan offsets, arena sizes, source
 * lines, the mesh and pipeline description. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

/* Source pointer -> copy, open addressing (keys are arena pointers: never NULL). */
typedef struct {
  const void **key;
  void **val;
  size_t mask;
} PtrMap;

static bool map_init(PtrMap *p, size_t n) {
  size_t cap = 16;
  while (cap < 2 * n + 2) cap *= 2;
  p->key = calloc(cap, sizeof *p->key);
  p->val = calloc(cap, sizeof *p->val);
  p->mask = cap - 1;
  return p->key && p->val;
}

static size_t map_slot(const PtrMap *p, const void *k) {
  size_t at = (size_t)(((uintptr_t)k >> 4) * UINT64_C(0x9E3779B97F4A7C15) >> 20) & p->mask;
  while (p->key[at] && p->key[at] != k) at = (at + 1) & p->mask;
  return at;
}

static void map_put(PtrMap *p, const void *k, void *v) {
  size_t at = map_slot(p, k);
  p->key[at] = k, p->val[at] = v;
}

static void *map_get(const PtrMap *p, const void *k) { return p->val[map_slot(p, k)]; }

static void map_free(PtrMap *p) { free(p->key), free(p->val); }

typedef struct {
  Module *m;
  bool share;   /* strings and attribute arrays: src's (it outlives the copy) */
} Copy;

static const char *dup_name(const Copy *cp, const char *s) {
  return !s || cp->share ? s : arena_strdup(cp->m->arena, s);
}

/* The copy of operand v of a function of src: a global of the copy, or a local in map. */
static Value *copy_of(Module *m, const PtrMap *locals, Value *v) {
  if (v->kind == VAL_GLOBAL) return ((Global *)m->globals.items[v->global->index])->value;
  return map_get(locals, v);
}

/* An op like `op` (attributes, line, results' types, names, ids and offsets), its operands
   left for the caller: one piece of the arena, laid out as op_new_n's. */
static Op *copy_op(const Copy *cp, const Op *op) {
  size_t no = (size_t)(op->n_operands ? op->n_operands : 1), nr = (size_t)(op->n_results > 0 ? op->n_results : 1);
  size_t at_ops = (sizeof(Op) + 15) & ~(size_t)15, at_res = at_ops + ((sizeof(Value *) * no + 15) & ~(size_t)15);
  size_t at_vals = at_res + ((sizeof(Value *) * nr + 15) & ~(size_t)15), vsize = (sizeof(Value) + 15) & ~(size_t)15;
  char *mem = arena_alloc_uninit(cp->m->arena, at_vals + vsize * (size_t)(op->n_results > 0 ? op->n_results : 0));
  Op *x = (Op *)mem;
  *x = *op;
  x->operands = (Value **)(mem + at_ops);
  x->results = (Value **)(mem + at_res);
  if (!cp->share)
    for (int k = 0; k < IR_MAX_ATTRS; k++) {
      Attr *a = &x->attrs[k];
      if (a->s) a->s = arena_strdup(cp->m->arena, a->s);
      if (a->ints) {
        int64_t *v = arena_alloc(cp->m->arena, sizeof(int64_t) * (size_t)(a->n ? a->n : 1));
        memcpy(v, a->ints, sizeof(int64_t) * (size_t)a->n);
        a->ints = v;
      }
    }
  for (int r = 0; r < op->n_results; r++) {
    Value *y = (Value *)(mem + at_vals + vsize * (size_t)r);
    *y = *op->results[r];
    y->def = x, y->index = r, y->name = dup_name(cp, y->name);
    x->results[r] = y;
  }
  return x;
}

/* The ops are made first and their operands set after: an operand may be the result of a
   later op (a pass's intermediate form before the one that restores the order). */
static bool clone_func(const Copy *cp, const Func *f, Func *c, const PtrMap *funcs) {
  Module *m = cp->m;
  size_t n = (size_t)f->args.n;
  for (int i = 0; i < f->ops.n; i++) n += (size_t)((Op *)f->ops.items[i])->n_results;
  PtrMap locals;
  if (!map_init(&locals, n)) {
    map_free(&locals);
    return false;
  }
  for (int i = 0; i < f->args.n; i++) {
    const Value *a = f->args.items[i];
    Value *x = func_add_arg(c, NULL, a->type);
    x->name = dup_name(cp, a->name), x->id = a->id, x->offset = a->offset;
    map_put(&locals, a, x);
  }
  c->ops.items = arena_alloc_uninit(m->arena, sizeof(void *) * (size_t)(f->ops.n ? f->ops.n : 1));
  c->ops.cap = f->ops.n;
  for (int i = 0; i < f->ops.n; i++) {
    const Op *op = f->ops.items[i];
    Op *x = copy_op(cp, op);
    if (op->callee) {
      x->callee = map_get(funcs, op->callee);
      if (op->attrs[0].kind == ATTR_FUNC && x->callee) x->attrs[0].s = x->callee->name;
    }
    for (int r = 0; r < op->n_results; r++) map_put(&locals, op->results[r], x->results[r]);
    c->ops.items[c->ops.n++] = x;
  }
  bool ok = true;
  for (int i = 0; i < f->ops.n; i++) {
    const Op *op = f->ops.items[i];
    Op *x = c->ops.items[i];
    for (int k = 0; k < op->n_operands; k++) ok &= (x->operands[k] = copy_of(m, &locals, op->operands[k])) != NULL;
  }
  for (int i = 0; i < f->rets.n; i++) {
    Value *v = copy_of(m, &locals, f->rets.items[i]);
    ok &= v != NULL;
    func_add_ret(c, v);
  }
  map_free(&locals);
  return ok;   /* false: an operand of no op of f (a value the copy cannot hold) */
}

Module *module_clone(const Module *src, bool share_strings) {
  Module *m = module_new(src->name);
  if (!m) return NULL;
  Copy cp = {m, share_strings};
  m->local = src->local;
  m->source = dup_name(&cp, src->source);
  m->mesh = src->mesh;
  m->pipe = src->pipe;
  /* globals in the same order, so the source's name index is the copy's too */
  m->globals.items = arena_alloc(m->arena, sizeof(void *) * (size_t)(src->globals.n ? src->globals.n : 1));
  m->globals.cap = src->globals.n;
  Global *gs = arena_alloc(m->arena, sizeof(Global) * (size_t)(src->globals.n ? src->globals.n : 1));
  Value *vs = arena_alloc(m->arena, sizeof(Value) * (size_t)(src->globals.n ? src->globals.n : 1));
  for (int i = 0; i < src->globals.n; i++) {
    const Global *g = src->globals.items[i];
    Global *c = &gs[i];
    *c = *g;
    c->name = dup_name(&cp, g->name);
    c->value = &vs[i];
    *c->value = *g->value;
    c->value->global = c;
    c->value->name = g->value->name == g->name ? c->name : dup_name(&cp, g->value->name);
    m->globals.items[m->globals.n++] = c;
  }
  if (src->gcap) {
    m->gslot = arena_alloc_uninit(m->arena, sizeof(int) * (size_t)src->gcap);
    memcpy(m->gslot, src->gslot, sizeof(int) * (size_t)src->gcap);
    m->gcap = src->gcap;
  }
  PtrMap funcs;
  bool ok = map_init(&funcs, (size_t)src->funcs.n);
  for (int i = 0; ok && i < src->funcs.n; i++) {
    const Func *f = src->funcs.items[i];
    Func *c = module_add_func(m, f->name);
    c->is_kernel = f->is_kernel, c->arena_bytes = f->arena_bytes;
    map_put(&funcs, f, c);
  }
  for (int i = 0; ok && i < src->funcs.n; i++) ok = clone_func(&cp, src->funcs.items[i], m->funcs.items[i], &funcs);
  map_free(&funcs);
  if (!ok) {
    module_free(m);
    return NULL;
  }
  return m;
}

void module_drop_func(Module *m, const char *name) {
  int out = 0;
  for (int i = 0; i < m->funcs.n; i++)
    if (strcmp(((Func *)m->funcs.items[i])->name, name)) m->funcs.items[out++] = m->funcs.items[i];
  m->funcs.n = out;
}
