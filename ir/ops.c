/* ir/ops.c — the op table built from ops.def, and attribute schemas.
   The schema strings are parsed once into OpInfo (guarded by pthread_once, since ranks
   may run on threads). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

typedef struct {
  const char *name;
  int n_operands, n_results;
  OpClass cls;
  unsigned flags;
  const char *schema;
} OpDef;

static const OpDef op_defs[OP_COUNT] = {
#define OP(e, name, nops, nres, cls, flags, schema) \
  [OP_##e] = {name, nops, nres, CLASS_##cls, flags, schema},
#include "ops.def"
#undef OP
};

static OpInfo op_table[OP_COUNT];
static pthread_once_t op_table_once = PTHREAD_ONCE_INIT;
static _Atomic int op_table_built;   /* set once the table is built: op_info's fast path */

/* Parses one "name:kind" or "name:kind=default" entry. The schemas are ours, so a
   malformed one is a programming error caught by the unit tests (kind stays ATTR_INT). */
static void parse_attr_spec(const char *s, size_t n, AttrSpec *out) {
  static char names[OP_COUNT * IR_MAX_ATTRS][32];
  static int n_names;
  const char *colon = memchr(s, ':', n);
  size_t name_len = colon ? (size_t)(colon - s) : n;
  char *name = names[n_names++];
  memcpy(name, s, name_len < 31 ? name_len : 31);
  out->name = name;
  if (!colon) return;
  const char *kind = colon + 1;
  const char *eq = memchr(kind, '=', n - (size_t)(kind - s));
  size_t kind_len = eq ? (size_t)(eq - kind) : n - (size_t)(kind - s);
  static const char *const kinds[] = {"int", "float", "bool", "ints", "dtype", "str", "func"};
  for (int k = 0; k < 7; k++)
    if (strlen(kinds[k]) == kind_len && !memcmp(kinds[k], kind, kind_len)) out->kind = (AttrKind)k;
  if (eq) {
    out->has_default = true;
    out->def.kind = out->kind;
    char tmp[32] = {0};
    size_t dl = n - (size_t)(eq + 1 - s);
    memcpy(tmp, eq + 1, dl < 31 ? dl : 31);
    if (out->kind == ATTR_FLOAT) out->def.f = strtod(tmp, NULL);
    else if (out->kind == ATTR_STR) {   /* "text": kept in a static pool like the names */
      static char strs[OP_COUNT][32];
      static int n_strs;
      char *d = strs[n_strs++];
      size_t l = strlen(tmp);
      if (l >= 2 && tmp[0] == '"' && tmp[l - 1] == '"') memcpy(d, tmp + 1, l - 2);
      out->def.s = d;
    } else out->def.i = strtoll(tmp, NULL, 10);
  }
}

static void build_table(void) {
  for (int k = 0; k < OP_COUNT; k++) {
    const OpDef *d = &op_defs[k];
    OpInfo *info = &op_table[k];
    info->name = d->name;
    info->n_operands = d->n_operands;
    info->n_results = d->n_results;
    info->cls = d->cls;
    info->flags = d->flags;
    const char *s = d->schema;
    while (*s) {
      const char *end = strchr(s, ',');
      size_t n = end ? (size_t)(end - s) : strlen(s);
      parse_attr_spec(s, n, &info->attrs[info->n_attrs++]);
      s += n + (end ? 1 : 0);
    }
  }
  atomic_store_explicit(&op_table_built, 1, memory_order_release);
}

const OpInfo *op_info(OpKind k) {
  if (!atomic_load_explicit(&op_table_built, memory_order_acquire)) pthread_once(&op_table_once, build_table);
  return &op_table[k];
}

int op_n_writes(OpKind k) {
  unsigned f = op_defs[k].flags;
  return (f & OPF_W3) ? 3 : (f & OPF_W1) ? 1 : 0;
}

int op_lookup(const char *name, size_t n, OpKind *out) {
  for (int k = 0; k < OP_COUNT; k++)
    if (strlen(op_defs[k].name) == n && !memcmp(op_defs[k].name, name, n)) {
      *out = (OpKind)k;
      return 0;
    }
  return -1;
}

int op_attr_index(OpKind k, const char *name) {
  const OpInfo *info = op_info(k);
  for (int i = 0; i < info->n_attrs; i++)
    if (info->attrs[i].name[0] == name[0] && !strcmp(info->attrs[i].name, name)) return i;
  return -1;
}

bool attr_eq(const Attr *a, const Attr *b) {
  if (a->kind != b->kind) return false;
  switch (a->kind) {
  case ATTR_FLOAT: return a->f == b->f || (a->f != a->f && b->f != b->f);
  case ATTR_INTS:
    if (a->n != b->n) return false;
    for (int i = 0; i < a->n; i++)
      if (a->ints[i] != b->ints[i]) return false;
    return true;
  case ATTR_STR:
  case ATTR_FUNC: return (a->s && b->s) ? !strcmp(a->s, b->s) : a->s == b->s;
  default: return a->i == b->i;
  }
}

/* ---------------------------------------------------------------- async collectives */

static const OpKind start_pairs[][2] = {
  {OP_ALL_REDUCE, OP_ALL_REDUCE_START},
  {OP_ALL_GATHER, OP_ALL_GATHER_START},
  {OP_REDUCE_SCATTER, OP_REDUCE_SCATTER_START},
  {OP_ALL_TO_ALL, OP_ALL_TO_ALL_START},
};
#define N_START_PAIRS (int)(sizeof start_pairs / sizeof start_pairs[0])

OpKind op_start_of(OpKind k) {
  for (int i = 0; i < N_START_PAIRS; i++)
    if (start_pairs[i][0] == k) return start_pairs[i][1];
  return OP_COUNT;
}

OpKind op_sync_of(OpKind k) {
  for (int i = 0; i < N_START_PAIRS; i++)
    if (start_pairs[i][1] == k) return start_pairs[i][0];
  return k;
}

bool op_is_start(OpKind k) { return op_sync_of(k) != k; }
