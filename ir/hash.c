/* ir/hash.c — a structural hash of a function (func_hash): two functions with the same
 * hash have, with the odds of a 128-bit collision, the same name, arguments, ops (kinds,
 * attributes, operands, result types and names), results, and globals (names, types,
 * kinds).  `loom plan` uses it to lower a function it has already lowered for another
 * layout only once: passes that work function by function give equal functions equal
 * results.  It is on that path for every function of every candidate, so it mixes whole
 * words: two lanes, a multiply-xorshift one and a multiply-add one. */
#include <string.h>

#include "ir.h"

typedef struct {
  uint64_t a, b;
} H;

static inline void mix(H *h, uint64_t x) {
  h->a = (h->a ^ x) * UINT64_C(0x9E3779B97F4A7C15);
  h->a ^= h->a >> 32;
  h->b = (h->b + x) * UINT64_C(0xC2B2AE3D27D4EB4F) + 1;
}

static void mix_str(H *h, const char *s) {
  if (!s) {
    mix(h, UINT64_C(0xA5A5A5A5A5A5A5A5));
    return;
  }
  size_t n = strlen(s), i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, s + i, 8);
    mix(h, w);
  }
  uint64_t w = (uint64_t)n << 56;   /* the tail and the length */
  memcpy(&w, s + i, n - i);
  mix(h, w);
}

static void mix_type(H *h, const Type *t) {
  uint64_t sh = 0;
  for (int a = 0; a < AX_COUNT; a++) sh = sh << 8 | (uint64_t)(uint8_t)t->sh.kind[a] << 4 | (uint8_t)t->sh.dim[a];
  mix(h, sh << 16 | (uint64_t)t->dtype << 8 | (uint64_t)t->rank);
  for (int d = 0; d < t->rank; d++) mix(h, (uint64_t)t->dims[d]);
}

uint64_t global_hash(const Global *g) {
  H h = {UINT64_C(0x243F6A8885A308D3), 0};
  mix_str(&h, g->name);
  mix_type(&h, &g->value->type);
  mix(&h, (uint64_t)g->kind);
  return h.a ^ h.b;
}

/* An operand: an argument or an earlier result by its number (func_number), a global by
   its hash. */
static void mix_value(H *h, const Value *v, const uint64_t *gh) {
  if (v->kind == VAL_GLOBAL) mix(h, gh ? gh[v->global->index] : global_hash(v->global));
  else mix(h, (uint64_t)v->kind << 32 | (uint32_t)v->id);
}

void func_hash(Func *f, const uint64_t *gh, uint64_t out[2], const Global **globals, int *n_globals, bool *seen) {
  H h = {UINT64_C(0xcbf29ce484222325), UINT64_C(0x84222325cbf29ce4)};
  func_number(f);
  mix_str(&h, f->name);
  mix(&h, (uint64_t)f->is_kernel << 32 | (uint32_t)f->args.n);
  for (int i = 0; i < f->args.n; i++) {
    const Value *v = f->args.items[i];
    mix_type(&h, &v->type);
    mix_str(&h, v->name);
  }
  if (n_globals) *n_globals = 0;
  mix(&h, (uint64_t)f->ops.n);
  for (int i = 0; i < f->ops.n; i++) {
    const Op *op = f->ops.items[i];
    const OpInfo *info = op_info(op->kind);
    mix(&h, (uint64_t)op->kind << 40 | (uint64_t)(uint32_t)op->n_results << 20 | (uint32_t)op->n_operands);
    for (int k = 0; k < op->n_operands; k++) {
      const Value *v = op->operands[k];
      mix_value(&h, v, gh);
      if (v->kind == VAL_GLOBAL && n_globals && !seen[v->global->index]) {
        seen[v->global->index] = true;
        globals[(*n_globals)++] = v->global;
      }
    }
    for (int k = 0; k < info->n_attrs; k++) {   /* what an op's schema has (the rest stay zero) */
      const Attr *a = &op->attrs[k];
      mix(&h, (uint64_t)a->kind << 1 | (uint64_t)a->set);
      switch (a->kind) {
      case ATTR_FLOAT: {
        uint64_t w;
        memcpy(&w, &a->f, sizeof w);
        mix(&h, w);
        break;
      }
      case ATTR_INTS:
        mix(&h, (uint64_t)(uint32_t)a->n);
        for (int j = 0; a->ints && j < a->n; j++) mix(&h, (uint64_t)a->ints[j]);
        break;
      case ATTR_STR:
      case ATTR_FUNC: mix_str(&h, a->s); break;
      default: mix(&h, (uint64_t)a->i);
      }
    }
    if (op->callee) mix_str(&h, op->callee->name);
    for (int r = 0; r < op->n_results; r++) {
      mix_type(&h, &op->results[r]->type);
      mix_str(&h, op->results[r]->name);
    }
  }
  mix(&h, (uint64_t)f->rets.n);
  for (int i = 0; i < f->rets.n; i++) mix_value(&h, f->rets.items[i], gh);
  if (n_globals)
    for (int k = 0; k < *n_globals; k++) seen[globals[k]->index] = false;
  out[0] = h.a, out[1] = h.b;
}
