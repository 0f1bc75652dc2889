/* ir/verify.c — the verifier.  Checks what every later stage relies on: values defined
   before use (SSA order), operand and result counts, attributes, result types equal to
   the inferred ones, and shardings that are well formed for the mesh.  Every message
   names the function and the op, and the source line when the module was parsed. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

typedef struct {
  const Module *m;
  const Func *f;
  char *err;
  size_t errlen;
} Verifier;

static int op_error(Verifier *vf, const Op *op, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int op_error(Verifier *vf, const Op *op, const char *fmt, ...) {
  char msg[1024], optext[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  char where[256] = "";
  if (vf->m->source && op && op->line) snprintf(where, sizeof where, "%s:%d: ", vf->m->source, op->line);
  else if (vf->m->source) snprintf(where, sizeof where, "%s: ", vf->m->source);
  if (op)
    snprintf(vf->err, vf->errlen, "%serror: in @%s, op '%s': %s\n  %s", where, vf->f ? vf->f->name : "?",
             op_info(op->kind)->name, msg, op_to_string(op, optext, sizeof optext));
  else
    snprintf(vf->err, vf->errlen, "%serror: in @%s: %s", where, vf->f ? vf->f->name : "?", msg);
  return IR_EINPUT;
}

/* A sharding is well formed when split dims exist and each mesh axis splits its dim
   evenly.  (Marking an axis of size 1 is allowed: it means nothing, and a plan written
   for a bigger mesh still reads.) */
static int check_sharding(Verifier *vf, const Op *op, const Type *t, const char *what) {
  char buf[256];
  for (int a = 0; a < AX_COUNT; a++) {
    int64_t size = vf->m->mesh.size[a];
    if (t->sh.kind[a] == SH_R) continue;
    if (t->sh.kind[a] == SH_S) {
      int d = t->sh.dim[a];
      if (d < 0 || d >= t->rank)
        return op_error(vf, op, "%s %s: split dim %d is out of range", what, type_str(t, buf, sizeof buf), d);
      /* a partitioned (local) module holds one rank's piece: nothing to divide */
      if (!vf->m->local && t->dims[d] % size)
        return op_error(vf, op, "%s %s: dim %d (%lld) does not divide evenly over %s=%lld", what,
                        type_str(t, buf, sizeof buf), d, (long long)t->dims[d], mesh_axis_names[a], (long long)size);
    } else if (t->sh.kind[a] != SH_P) {
      return op_error(vf, op, "%s: bad sharding kind on axis %s", what, mesh_axis_names[a]);
    }
  }
  return 0;
}

/* On every axis: the same placement, or a partial result from a replicated operand. */
static bool partial_of_replicated(const Sharding *in, const Sharding *out) {
  for (int a = 0; a < AX_COUNT; a++) {
    bool same = in->kind[a] == out->kind[a] && (in->kind[a] != SH_S || in->dim[a] == out->dim[a]);
    if (!same && !(out->kind[a] == SH_P && in->kind[a] == SH_R)) return false;
  }
  return true;
}

static int verify_op(Verifier *vf, const Op *op, const bool *defined) {
  const OpInfo *info = op_info(op->kind);
  if (info->n_operands >= 0 ? op->n_operands != info->n_operands : op->n_operands < (op->kind == OP_CALL ? 0 : 1))
    return op_error(vf, op, "takes %d operands, has %d", info->n_operands, op->n_operands);
  if (info->n_results >= 0 && op->n_results != info->n_results)
    return op_error(vf, op, "has %d results, should have %d", op->n_results, info->n_results);
  if (op->kind == OP_CALL && (!op->callee || !op->callee->is_kernel))
    return op_error(vf, op, "calls '@%s', which is not a kernel func", op->attrs[0].s ? op->attrs[0].s : "?");
  if (vf->f->is_kernel) {
    bool allowed = info->cls == CLASS_ELEMENTWISE || info->cls == CLASS_REDUCTION || op->kind == OP_BROADCAST ||
                   op->kind == OP_RESHAPE || op->kind == OP_CONSTANT || op->kind == OP_IOTA || op->kind == OP_CAST;
    if (!allowed)
      return op_error(vf, op, "cannot appear in a kernel func (kernels hold elementwise ops, broadcast, reshape, "
                      "constant, iota, cast and reductions; see docs/lowering.md)");
  }
  for (int i = 0; i < op->n_operands; i++) {
    const Value *v = op->operands[i];
    if (!v) return op_error(vf, op, "operand %d is missing", i);
    if (v->kind == VAL_GLOBAL) {
      if (v->global->index >= vf->m->globals.n || vf->m->globals.items[v->global->index] != v->global)
        return op_error(vf, op, "operand %d refers to a global that is not in the module", i);
    } else if (!defined[v->id]) {
      return op_error(vf, op, "operand %d (%%%s) is used before it is defined", i, v->name ? v->name : "?");
    }
  }
  if (info->cls == CLASS_COLLECTIVE && op->kind != OP_WAIT) {
    int axis = mesh_axis_parse(op_attr(op, "axis")->s);
    if (axis >= 0 && op_int(op, "n") != vf->m->mesh.size[axis])
      return op_error(vf, op, "n=%lld but the mesh has %s=%lld", (long long)op_int(op, "n"), mesh_axis_names[axis],
                      (long long)vf->m->mesh.size[axis]);
  }
  for (int i = 0; i < op_n_writes(op->kind); i++)
    if (op->operands[i]->kind != VAL_GLOBAL)
      return op_error(vf, op, "operand %d is written, so it must be a global ($name)", i);
  for (int i = 0; i < info->n_attrs; i++) {
    if (!op->attrs[i].set) return op_error(vf, op, "attribute '%s' is not set", info->attrs[i].name);
    if (op->attrs[i].kind != info->attrs[i].kind)
      return op_error(vf, op, "attribute '%s' has the wrong kind", info->attrs[i].name);
  }
  Type inferred[IR_MAX_RESULTS];
  char msg[1024];
  if (op->n_results > IR_MAX_RESULTS) return op_error(vf, op, "has more than %d results", IR_MAX_RESULTS);
  if (infer_types(op, inferred, msg, sizeof msg)) return op_error(vf, op, "%s", msg);
  for (int r = 0; r < op->n_results; r++) {
    const Type *t = &op->results[r]->type;
    if (!type_shape_eq(t, &inferred[r])) {
      char a[256], b[256];
      return op_error(vf, op, "result %d is declared %s, but the op produces %s", r, type_str(t, a, sizeof a),
                      type_str(&inferred[r], b, sizeof b));
    }
    if (type_numel(t) > IR_MAX_NUMEL) return op_error(vf, op, "result %d has more than 2^48 elements", r);
    if (check_sharding(vf, op, t, "result")) return IR_EINPUT;
  }
  /* Elementwise ops compute each element where it lives: all shardings must agree, except
     that a partial result may come of partial operands scaled by replicated ones (an op
     linear in its partial operands: mul by a replicated factor, div of a partial numerator). */
  if (info->cls == CLASS_ELEMENTWISE)
    for (int i = 0; i < op->n_operands; i++)
      if (!sharding_eq(&op->operands[i]->type.sh, &op->results[0]->type.sh) &&
          !partial_of_replicated(&op->operands[i]->type.sh, &op->results[0]->type.sh)) {
        char a[256], b[256];
        return op_error(vf, op, "operand %d is sharded %s but the result %s; elementwise ops need equal shardings", i,
                        type_str(&op->operands[i]->type, a, sizeof a), type_str(&op->results[0]->type, b, sizeof b));
      }
  return 0;
}

/* A kernel's promise (docs/lowering.md): one iteration space of N elements.  Every value
   has N elements, or is a reduction of N elements, or only feeds broadcasts. */
static int check_kernel_space(Verifier *vf, const Func *f) {
  int64_t N = 0;
  for (int i = 0; i < f->args.n; i++) {
    int64_t n = type_numel(&((const Value *)f->args.items[i])->type);
    if (n > N) N = n;
  }
  for (int i = 0; i < f->ops.n; i++) {
    const Op *op = f->ops.items[i];
    for (int r = 0; r < op->n_results; r++) {
      int64_t n = type_numel(&op->results[r]->type);
      if (n > N) N = n;
    }
  }
  int n_ids = func_number((Func *)f);
  bool *only_broadcast = malloc((size_t)(n_ids ? n_ids : 1));
  for (int i = 0; i < n_ids; i++) only_broadcast[i] = true;
  for (int i = 0; i < f->ops.n; i++) {
    const Op *op = f->ops.items[i];
    for (int k = 0; k < op->n_operands; k++) {
      const Value *v = op->operands[k];
      if (v->kind != VAL_GLOBAL && op->kind != OP_BROADCAST) only_broadcast[v->id] = false;
      if (op_info(op->kind)->cls == CLASS_REDUCTION && type_numel(&v->type) != N) {
        free(only_broadcast);
        return op_error(vf, op, "in a kernel, a reduction must read a value of the kernel's %lld elements", (long long)N);
      }
    }
  }
  for (int i = 0; i < f->rets.n; i++) {
    const Value *v = f->rets.items[i];
    if (v->kind != VAL_GLOBAL) only_broadcast[v->id] = false;
  }
  int rc = 0;
  for (int i = 0; i < f->ops.n && !rc; i++) {
    const Op *op = f->ops.items[i];
    if (op_info(op->kind)->cls == CLASS_REDUCTION) continue;
    for (int r = 0; r < op->n_results && !rc; r++)
      if (type_numel(&op->results[r]->type) != N && !only_broadcast[op->results[r]->id])
        rc = op_error(vf, op, "in a kernel, a value of %lld elements (not the kernel's %lld) may only feed broadcasts",
                      (long long)type_numel(&op->results[r]->type), (long long)N);
  }
  for (int i = 0; i < f->args.n && !rc; i++) {
    const Value *v = f->args.items[i];
    if (type_numel(&v->type) != N && !only_broadcast[v->id])
      rc = op_error(vf, NULL, "kernel argument %d has %lld elements, not the kernel's %lld, and is not only broadcast", i,
                    (long long)type_numel(&v->type), (long long)N);
  }
  free(only_broadcast);
  return rc;
}

/* Async collectives: a wait reads the result of a start, and every start's result is read
   by exactly one wait (not returned, not read by anything else: until the wait it is still
   being written). */
static int check_start_wait(Verifier *vf, const Func *f, int n_ids) {
  int *waits = calloc((size_t)(n_ids ? n_ids : 1), sizeof *waits);
  int rc = 0;
  for (int i = 0; i < f->ops.n && !rc; i++) {
    const Op *op = f->ops.items[i];
    for (int k = 0; k < op->n_operands && !rc; k++) {
      const Value *v = op->operands[k];
      bool started = v->kind == VAL_RESULT && op_is_start(v->def->kind);
      if (op->kind == OP_WAIT && !started)
        rc = op_error(vf, op, "waits for a value no collective start produced (wait reads the result of "
                      "all_reduce_start, all_gather_start, reduce_scatter_start or all_to_all_start)");
      else if (started && op->kind != OP_WAIT)
        rc = op_error(vf, op, "reads operand %d, the result of a collective start, which is only valid after its wait; "
                      "read the wait's result", k);
      else if (started && ++waits[v->id] > 1)
        rc = op_error(vf, op, "waits a second time for the same collective start");
    }
  }
  for (int i = 0; i < f->rets.n && !rc; i++) {
    const Value *v = f->rets.items[i];
    if (v->kind == VAL_RESULT && op_is_start(v->def->kind))
      rc = op_error(vf, NULL, "returns value %d, the result of a collective start, without waiting for it", i);
  }
  for (int i = 0; i < f->ops.n && !rc; i++) {
    const Op *op = f->ops.items[i];
    if (op_is_start(op->kind) && !waits[op->results[0]->id])
      rc = op_error(vf, op, "is never waited for (every collective start needs its wait in the same function)");
  }
  free(waits);
  return rc;
}

int verify_func(const Func *f, char *err, size_t errlen) {
  Verifier vf = {f->module, f, err, errlen};
  int n = func_number((Func *)f);
  bool *defined = calloc((size_t)(n ? n : 1), 1);
  int rc = 0;
  for (int i = 0; i < f->args.n && !rc; i++) {
    const Value *v = f->args.items[i];
    defined[v->id] = true;
    rc = check_sharding(&vf, NULL, &v->type, "argument");
  }
  for (int i = 0; i < f->ops.n && !rc; i++) {
    const Op *op = f->ops.items[i];
    rc = verify_op(&vf, op, defined);
    for (int r = 0; r < op->n_results; r++) defined[op->results[r]->id] = true;
  }
  for (int i = 0; i < f->rets.n && !rc; i++) {
    const Value *v = f->rets.items[i];
    if (v->kind != VAL_GLOBAL && !defined[v->id]) rc = op_error(&vf, NULL, "returned value %d is not defined", i);
  }
  if (!rc && f->is_kernel) rc = check_kernel_space(&vf, f);
  if (!rc) rc = check_start_wait(&vf, f, n);
  free(defined);
  return rc;
}

int verify_module(const Module *m, char *err, size_t errlen) {
  Verifier vf = {m, NULL, err, errlen};
  for (int i = 0; i < AX_COUNT; i++)
    if (m->mesh.size[i] < 1) return op_error(&vf, NULL, "mesh axis %s has size %lld", mesh_axis_names[i], (long long)m->mesh.size[i]);
  for (int i = 0; i < m->globals.n; i++) {
    const Global *g = m->globals.items[i];
    for (int j = 0; j < i; j++)
      if (!strcmp(g->name, ((const Global *)m->globals.items[j])->name))
        return op_error(&vf, NULL, "global $%s is declared twice", g->name);
    if (check_sharding(&vf, NULL, &g->value->type, g->name)) return IR_EINPUT;
  }
  for (int i = 0; i < m->funcs.n; i++) {
    int rc = verify_func(m->funcs.items[i], err, errlen);
    if (rc) return rc;
  }
  return 0;
}
