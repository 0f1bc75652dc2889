/* passes/cse.c — pass "cse": two ops of the same kind, operands (in either order when
   the op commutes), attributes and result types compute the same thing; the later one
   is replaced by the earlier.  Ops with effects are never merged, nor collectives, nor
   the clones the recompute pass makes (results named %rc.*). */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

static bool recomputed(const Op *op) {
  return op->n_results > 0 && op->results[0]->name && !strncmp(op->results[0]->name, "rc.", 3);
}

static uint64_t mix(uint64_t h, uint64_t x) { return (h ^ x) * 1099511628211ull; }

/* Operand identity: globals by index (offset past all local ids), locals by id. */
static uint64_t operand_key(const Value *v, int n_locals) {
  return v->kind == VAL_GLOBAL ? (uint64_t)(n_locals + v->global->index) : (uint64_t)v->id;
}

static uint64_t op_hash(const Op *op, int n_locals) {
  uint64_t h = mix(1469598103934665603ull, (uint64_t)op->kind);
  uint64_t sum = 0;
  for (int i = 0; i < op->n_operands; i++) {
    uint64_t k = operand_key(op->operands[i], n_locals);
    if (op_info(op->kind)->flags & OPF_COMMUTATIVE) sum += k * 0x9E3779B97F4A7C15ull;
    else h = mix(h, k);
  }
  return mix(h, sum);
}

static bool same_op(const Op *a, const Op *b) {
  if (a->kind != b->kind || a->n_operands != b->n_operands || a->n_results != b->n_results) return false;
  bool same = true;
  for (int i = 0; i < a->n_operands && same; i++) same = a->operands[i] == b->operands[i];
  if (!same && (op_info(a->kind)->flags & OPF_COMMUTATIVE) && a->n_operands == 2)
    same = a->operands[0] == b->operands[1] && a->operands[1] == b->operands[0];
  if (!same) return false;
  const OpInfo *info = op_info(a->kind);
  for (int i = 0; i < info->n_attrs; i++)
    if (!attr_eq(&a->attrs[i], &b->attrs[i])) return false;
  for (int r = 0; r < a->n_results; r++)
    if (!type_eq(&a->results[r]->type, &b->results[r]->type)) return false;
  return true;
}

static int cse_func(Func *f) {
  int n = func_number(f);
  Value **repl = calloc((size_t)(n ? n : 1), sizeof *repl);
  size_t cap = 16;
  while (cap < (size_t)f->ops.n * 2) cap *= 2;
  Op **table = calloc(cap, sizeof *table);
  /* the slots filled since the table was last emptied: an effect empties only those (a
     memset of the whole table at every write made the optimizer's step quadratic) */
  size_t *filled = malloc(sizeof *filled * ((size_t)f->ops.n + 1)), n_filled = 0;
  int merged = 0, kept = 0;
  for (int i = 0; i < f->ops.n; i++) {
    Op *op = f->ops.items[i];
    /* Operands first take their replacements, so chains of duplicates merge in one go. */
    for (int k = 0; k < op->n_operands; k++) {
      Value *v = op->operands[k];
      if (v->kind == VAL_RESULT && repl[v->id]) op->operands[k] = repl[v->id];
    }
    /* ZeRO-3 gathers again in the backward, on purpose; and a recomputed op (%rc.*, the
       recompute pass) is a clone of a forward op made so the original need not be kept. */
    if (op_info(op->kind)->cls == CLASS_COLLECTIVE || recomputed(op)) {
      f->ops.items[kept++] = op;
      continue;
    }
    if (op_info(op->kind)->flags & OPF_EFFECT) {
      /* A write to a global may change what later reads of it see: nothing computed
         before it is reused after it. */
      while (n_filled) table[filled[--n_filled]] = NULL;
      f->ops.items[kept++] = op;
      continue;
    }
    size_t slot = op_hash(op, n) & (cap - 1);
    while (table[slot] && !same_op(table[slot], op)) slot = (slot + 1) & (cap - 1);
    if (table[slot]) {
      for (int r = 0; r < op->n_results; r++) repl[op->results[r]->id] = table[slot]->results[r];
      merged++;   /* dropped: its uses now read the earlier op */
    } else {
      table[slot] = op;
      filled[n_filled++] = slot;
      f->ops.items[kept++] = op;
    }
  }
  f->ops.n = kept;
  replace_uses(f, repl);
  free(repl);
  free(table);
  free(filled);
  return merged;
}

static int run(Module *m, PassContext *ctx, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  for (int i = 0; i < m->funcs.n; i++) ctx->changed += cse_func(m->funcs.items[i]);
  return 0;
}

const Pass pass_cse = {"cse", "merge ops that compute the same value", run};
