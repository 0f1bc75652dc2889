/* ir/print.c — the text form.  print(parse(print(m))) == print(m) for every module:
   names are kept, unnamed values are numbered in order, attributes print in schema
   order and are left out when they equal their default. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

void format_double(char *buf, size_t n, double x) {
  if (isnan(x)) { snprintf(buf, n, "nan"); return; }
  if (isinf(x)) { snprintf(buf, n, x < 0 ? "-inf" : "inf"); return; }
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(buf, n, "%.*g", prec, x);
    if (strtod(buf, NULL) == x) return;
  }
}

/* Printed names of one function's values, indexed by Value.id, and a hash set of the
   names given so far (each with the next suffix to try for a name taken again): naming
   is linear in the values, not quadratic as a scan of every earlier name was. */
typedef struct {
  const char *key;    /* a name in names[], or NULL */
  int next_suffix;    /* "key.N" for N below this are taken */
} NameSlot;
typedef struct {
  char **names;
  int n;
  NameSlot *set;
  size_t cap;         /* a power of two, at least twice the names */
} Namer;

static bool name_char_ok(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
}

static bool all_digits(const char *s) {
  if (!*s) return true;
  for (; *s; s++)
    if (*s < '0' || *s > '9') return false;
  return true;
}

static size_t name_hash(const char *s) {   /* FNV-1a */
  size_t h = 1469598103934665603u;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211u;
  return h;
}

/* The slot of s: its own when taken, else the empty one it would go in. */
static NameSlot *name_slot(const Namer *nm, const char *s) {
  size_t i = name_hash(s) & (nm->cap - 1);
  while (nm->set[i].key && strcmp(nm->set[i].key, s)) i = (i + 1) & (nm->cap - 1);
  return &nm->set[i];
}

static bool taken(const Namer *nm, const char *s) { return name_slot(nm, s)->key != NULL; }

static void namer_assign(Namer *nm, const Value *v, int *next_number) {
  int id = v->id;
  char buf[256];
  if (v->name && !all_digits(v->name)) {
    size_t k = 0;
    for (const char *s = v->name; *s && k < 190; s++) buf[k++] = name_char_ok(*s) ? *s : '_';
    buf[k] = 0;
    NameSlot *base_slot = name_slot(nm, buf);
    if (base_slot->key) {   /* the smallest free suffix only grows as names are added */
      char base[200];
      memcpy(base, buf, k + 1);
      int suffix = base_slot->next_suffix > 1 ? base_slot->next_suffix : 1;
      for (;; suffix++) {
        snprintf(buf, sizeof buf, "%s.%d", base, suffix);
        if (!taken(nm, buf)) break;
      }
      base_slot->next_suffix = suffix + 1;
    }
  } else {
    do snprintf(buf, sizeof buf, "%d", (*next_number)++);
    while (taken(nm, buf));
  }
  nm->names[id] = strdup(buf);
  if (nm->names[id]) name_slot(nm, buf)->key = nm->names[id];
}

static void namer_init(Namer *nm, const Func *f) {
  nm->n = func_number((Func *)f);
  nm->names = calloc((size_t)(nm->n ? nm->n : 1), sizeof(char *));
  for (nm->cap = 16; nm->cap < 2 * (size_t)nm->n + 16; nm->cap *= 2) {}
  nm->set = calloc(nm->cap, sizeof *nm->set);
  if (!nm->names || !nm->set) {   /* out of memory: print values by their own names (print_value) */
    free(nm->names);
    free(nm->set);
    nm->names = NULL, nm->set = NULL, nm->n = 0;
    return;
  }
  int next_number = 0;
  for (int i = 0; i < f->args.n; i++) namer_assign(nm, f->args.items[i], &next_number);
  for (int i = 0; i < f->ops.n; i++) {
    const Op *op = f->ops.items[i];
    for (int r = 0; r < op->n_results; r++) namer_assign(nm, op->results[r], &next_number);
  }
}

static void namer_free(Namer *nm) {
  for (int i = 0; i < nm->n; i++) free(nm->names[i]);
  free(nm->names);
  free(nm->set);
}

static void print_value(FILE *out, const Namer *nm, const Value *v) {
  if (v->kind == VAL_GLOBAL) fprintf(out, "$%s", v->global->name);
  else if (nm && nm->names && nm->names[v->id]) fprintf(out, "%%%s", nm->names[v->id]);
  else if (v->name) fprintf(out, "%%%s", v->name);
  else fprintf(out, "%%%d", v->id);
}

static void print_attr_value(FILE *out, const Attr *a) {
  char buf[64];
  switch (a->kind) {
  case ATTR_INT: fprintf(out, "%lld", (long long)a->i); break;
  case ATTR_FLOAT: format_double(buf, sizeof buf, a->f); fputs(buf, out); break;
  case ATTR_BOOL: fputs(a->i ? "true" : "false", out); break;
  case ATTR_DTYPE: fputs(dtype_name((DType)a->i), out); break;
  case ATTR_STR: fprintf(out, "\"%s\"", a->s ? a->s : ""); break;
  case ATTR_FUNC: fprintf(out, "@%s", a->s ? a->s : "?"); break;
  case ATTR_INTS:
    fputc('[', out);
    for (int i = 0; i < a->n; i++) fprintf(out, i ? ",%lld" : "%lld", (long long)a->ints[i]);
    fputc(']', out);
    break;
  }
}

static void print_op_named(FILE *out, const Namer *nm, const Op *op) {
  const OpInfo *info = op_info(op->kind);
  for (int r = 0; r < op->n_results; r++) {
    if (r) fputs(", ", out);
    print_value(out, nm, op->results[r]);
  }
  fprintf(out, op->n_results ? " = %s" : "%s", info->name);
  for (int i = 0; i < op->n_operands; i++) {
    fputs(i ? ", " : " ", out);
    print_value(out, nm, op->operands[i]);
  }
  bool open = false;
  for (int i = 0; i < info->n_attrs; i++) {
    const AttrSpec *spec = &info->attrs[i];
    const Attr *a = &op->attrs[i];
    if (!a->set || (spec->has_default && attr_eq(a, &spec->def))) continue;
    fputs(open ? ", " : " {", out);
    open = true;
    fprintf(out, "%s=", spec->name);
    print_attr_value(out, a);
  }
  if (open) fputc('}', out);
  if (op->n_results) fputs(" : ", out);
  for (int r = 0; r < op->n_results; r++) {
    if (r) fputs(", ", out);
    type_fprint(out, &op->results[r]->type);
    if (op->results[r]->offset >= 0) fprintf(out, " at %lld", (long long)op->results[r]->offset);
  }
}

void print_op(FILE *out, const Op *op) { print_op_named(out, NULL, op); }

char *op_to_string(const Op *op, char *buf, size_t n) {
  FILE *f = fmemopen(buf, n, "w");
  if (!f) { snprintf(buf, n, "%s", op_info(op->kind)->name); return buf; }
  print_op(f, op);
  fclose(f);
  buf[n - 1] = 0;
  return buf;
}

void print_func(FILE *out, const Func *f) {
  Namer nm;
  namer_init(&nm, f);
  fprintf(out, "  %sfunc @%s(", f->is_kernel ? "kernel " : "", f->name);
  for (int i = 0; i < f->args.n; i++) {
    const Value *v = f->args.items[i];
    if (i) fputs(", ", out);
    print_value(out, &nm, v);
    fputs(": ", out);
    type_fprint(out, &v->type);
    if (v->offset >= 0) fprintf(out, " at %lld", (long long)v->offset);
  }
  fputs(") -> (", out);
  for (int i = 0; i < f->rets.n; i++) {
    if (i) fputs(", ", out);
    type_fprint(out, &((const Value *)f->rets.items[i])->type);
  }
  if (f->arena_bytes >= 0) fprintf(out, ") arena %lld {\n", (long long)f->arena_bytes);
  else fputs(") {\n", out);
  for (int i = 0; i < f->ops.n; i++) {
    fputs("    ", out);
    print_op_named(out, &nm, f->ops.items[i]);
    fputc('\n', out);
  }
  fputs("    return", out);
  for (int i = 0; i < f->rets.n; i++) {
    fputs(i ? ", " : " ", out);
    print_value(out, &nm, f->rets.items[i]);
  }
  fputs("\n  }\n", out);
  namer_free(&nm);
}

static void print_init(FILE *out, const Init *init) {
  char buf[64];
  switch (init->kind) {
  case INIT_ZEROS: fputs("zeros", out); break;
  case INIT_ONES: fputs("ones", out); break;
  case INIT_NORMAL: format_double(buf, sizeof buf, init->value); fprintf(out, "normal(%s)", buf); break;
  case INIT_CONST: format_double(buf, sizeof buf, init->value); fprintf(out, "const(%s)", buf); break;
  }
}

void print_module(FILE *out, const Module *m) {
  fprintf(out, "module @%s {\n  mesh", m->name);
  for (int a = 0; a < AX_COUNT; a++) fprintf(out, " %s=%lld", mesh_axis_names[a], (long long)m->mesh.size[a]);
  fputs(m->local ? " local\n" : "\n", out);
  if (m->pipe.kind)
    fprintf(out, "  pipeline \"%s\" virtual=%lld micro=%lld chunks=%lld\n", pipe_kind_names[m->pipe.kind],
            (long long)m->pipe.virt, (long long)m->pipe.micro, (long long)m->pipe.chunks);
  if (m->globals.n) fputc('\n', out);
  for (int i = 0; i < m->globals.n; i++) {
    const Global *g = m->globals.items[i];
    fprintf(out, "  %s $%s : ", g->kind == GLOBAL_PARAM ? "param" : "state", g->name);
    type_fprint(out, &g->value->type);
    fputs(" = ", out);
    print_init(out, &g->init);
    if (g->hf_rank) {
      fputs(" as [", out);
      for (int d = 0; d < g->hf_rank; d++) fprintf(out, d ? ",%lld" : "%lld", (long long)g->hf_dims[d]);
      fputc(']', out);
    }
    if (g->hf_experts) fputs(" as experts", out);
    fputc('\n', out);
  }
  for (int i = 0; i < m->funcs.n; i++) {
    fputc('\n', out);
    print_func(out, m->funcs.items[i]);
  }
  fputs("}\n", out);
}

char *module_to_string(const Module *m) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return NULL;
  print_module(f, m);
  fclose(f);
  return buf;
}
