/* ir/hash.c — a structural hash of a function (func_hash): two functions with the same
 * hash have, with the odds of a 128-bit collision, the same arguments, ops (kinds,
 * attributes, operands, result types), results, and globals (types, kinds), and the same
 * names (the function's, its values', its globals', its callees') up to the numbers in them,
 * and the same point-to-point peers and tags up to a renaming (each distinct one numbered in
 * the order it first appears).  `loom plan` uses it to lower a function it has already
 * lowered for another layout only once: passes that work function by function give equal
 * functions equal results, and none of them reads a number in a name or a peer's or tag's
 * value beyond telling them apart (so the interior chunks of a pipeline, @fwd.c5 of layers
 * 10-11 and @fwd.c6 of 12-13, are one function to it).  It is on that path for every
 * function of every candidate, so it mixes whole words: two lanes, a multiply-xorshift one
 * and a multiply-add one. */
#include <stdlib.h>
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

/* A name up to its numbers: each run of digits mixed as one '#' ("layers.12.mlp" and
   "layers.3.mlp" mix alike), words at a time. */
static void mix_name(H *h, const char *s) {
  if (!s) {
    mix(h, UINT64_C(0xA5A5A5A5A5A5A5A5));
    return;
  }
  uint64_t w = 0;
  int k = 0;
  size_t n = 0;
  for (const char *p = s; *p; p++) {
    char c = *p;
    if (c >= '0' && c <= '9') {
      while (p[1] >= '0' && p[1] <= '9') p++;
      c = '#';
    }
    w |= (uint64_t)(uint8_t)c << (8 * k);
    n++;
    if (++k == 8) mix(h, w), w = 0, k = 0;
  }
  mix(h, w | (uint64_t)n << 56);
}

/* A peer or tag up to a renaming: its number in the order of first appearance (past 32
   distinct ones, the value itself, told apart by a high bit). */
typedef struct {
  int64_t v[32];
  int n;
} Renaming;
static uint64_t renamed(Renaming *r, int64_t v) {
  for (int k = 0; k < r->n; k++)
    if (r->v[k] == v) return (uint64_t)k;
  if (r->n < 32) return r->v[r->n] = v, (uint64_t)r->n++;
  return (uint64_t)v | UINT64_C(1) << 62;
}

static void mix_type(H *h, const Type *t) {
  uint64_t sh = 0;
  for (int a = 0; a < AX_COUNT; a++) sh = sh << 8 | (uint64_t)(uint8_t)t->sh.kind[a] << 4 | (uint8_t)t->sh.dim[a];
  mix(h, sh << 16 | (uint64_t)t->dtype << 8 | (uint64_t)t->rank);
  for (int d = 0; d < t->rank; d++) mix(h, (uint64_t)t->dims[d]);
}

uint64_t global_hash(const Global *g) {
  H h = {UINT64_C(0x243F6A8885A308D3), 0};
  mix_name(&h, g->name);
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
  Renaming peers = {.n = 0}, tags = {.n = 0};
  /* per global of the module: its place among the globals f reads (valid where seen[]) */
  int *first = n_globals && f->module ? malloc(sizeof(int) * ((size_t)f->module->globals.n + 1)) : NULL;
  func_number(f);
  mix_name(&h, f->name);
  mix(&h, (uint64_t)f->is_kernel << 32 | (uint32_t)f->args.n);
  for (int i = 0; i < f->args.n; i++) {
    const Value *v = f->args.items[i];
    mix_type(&h, &v->type);
    mix_name(&h, v->name);
  }
  if (n_globals) *n_globals = 0;
  mix(&h, (uint64_t)f->ops.n);
  for (int i = 0; i < f->ops.n; i++) {
    const Op *op = f->ops.items[i];
    const OpInfo *info = op_info(op->kind);
    bool p2p = op->kind == OP_SEND || op->kind == OP_RECV;
    int peer_at = p2p ? op_attr_index(op->kind, "peer") : -1, tag_at = p2p ? op_attr_index(op->kind, "tag") : -1;
    mix(&h, (uint64_t)op->kind << 40 | (uint64_t)(uint32_t)op->n_results << 20 | (uint32_t)op->n_operands);
    for (int k = 0; k < op->n_operands; k++) {
      const Value *v = op->operands[k];
      mix_value(&h, v, gh);
      if (v->kind == VAL_GLOBAL && n_globals && !seen[v->global->index]) {
        seen[v->global->index] = true;
        if (first) first[v->global->index] = *n_globals;
        globals[(*n_globals)++] = v->global;
      }
      /* which of the globals read so far (names up to their numbers do not tell layers apart) */
      if (v->kind == VAL_GLOBAL) mix(&h, first ? (uint64_t)first[v->global->index] : (uint64_t)v->global->index << 32);
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
      case ATTR_STR: mix_str(&h, a->s); break;
      case ATTR_FUNC: mix_name(&h, a->s); break;
      default:
        if (p2p && (k == peer_at || k == tag_at)) mix(&h, renamed(k == peer_at ? &peers : &tags, a->i));
        else mix(&h, (uint64_t)a->i);
      }
    }
    if (op->callee) mix_name(&h, op->callee->name);
    for (int r = 0; r < op->n_results; r++) {
      mix_type(&h, &op->results[r]->type);
      mix_name(&h, op->results[r]->name);
    }
  }
  mix(&h, (uint64_t)f->rets.n);
  for (int i = 0; i < f->rets.n; i++) mix_value(&h, f->rets.items[i], gh);
  if (n_globals)
    for (int k = 0; k < *n_globals; k++) seen[globals[k]->index] = false;
  free(first);
  out[0] = h.a, out[1] = h.b;
}
