/* codegen/lower_common.c — see lower_common.h. */
#include "codegen/lower_common.h"
#include "ir/schedule.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cg_vfail(char *err, size_t errlen, const Func *f, const Op *op, const char *fmt, va_list ap) {
  char msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  if (op && f) {
    char text[512];
    snprintf(err, errlen, "@%s: op '%s' (%s): %s", f->name, op_info(op->kind)->name, op_to_string(op, text, sizeof text),
             msg);
  } else if (f) {
    snprintf(err, errlen, "@%s: %s", f->name, msg);
  } else {
    snprintf(err, errlen, "%s", msg);
  }
  return IR_EINPUT;
}

uint8_t cg_round_of(DType dt) {
  switch (dt) {
  case DT_BF16: return RT_ROUND_BF16;
  case DT_F16: return RT_ROUND_F16;
  case DT_F8E4M3: return RT_ROUND_F8E4M3;
  case DT_F8E5M2: return RT_ROUND_F8E5M2;
  default: return RT_ROUND_NONE;
  }
}

RtRegion cg_region_of(const Global *g) {
  if (g->kind == GLOBAL_PARAM) return RT_REGION_PARAMS;
  if (!strncmp(g->name, GRAD_PREFIX, strlen(GRAD_PREFIX))) return RT_REGION_GRADS;
  return RT_REGION_OPTIM;
}

int cg_describe_global(const Global *g, const Mesh *mesh, RtGlobal *rg, int64_t offset) {
  const Type *t = &g->value->type;
  if (strlen(g->name) >= sizeof rg->name) return -1;
  snprintf(rg->name, sizeof rg->name, "%s", g->name);
  rg->region = cg_region_of(g);
  rg->offset = offset;
  rg->n = type_numel(t);
  rg->rank = t->rank;
  for (int d = 0; d < t->rank; d++) rg->shape[d] = t->dims[d];
  if (g->hf_rank) {   /* the outside world (checkpoints, --out) sees the checkpoint shape */
    rg->rank = g->hf_rank;
    for (int d = 0; d < g->hf_rank; d++) rg->shape[d] = g->hf_dims[d];
  }
  static const RtInitKind kinds[] = {[INIT_ZEROS] = RT_INIT_ZEROS, [INIT_ONES] = RT_INIT_ONES,
                                     [INIT_NORMAL] = RT_INIT_NORMAL, [INIT_CONST] = RT_INIT_CONST};
  rg->init = kinds[g->init.kind];
  rg->init_value = g->init.value;
  rg->round = cg_round_of(t->dtype);
  rg->experts = g->hf_experts;
  /* the placement, and the whole checkpoint shape of a piece */
  rg->ir_rank = (int8_t)t->rank;
  for (int d = 0; d < t->rank; d++) rg->piece_dims[d] = t->dims[d];
  bool split = false;
  for (int a = 0; a < AX_COUNT && a < 5; a++) {
    if (t->sh.kind[a] == SH_S) rg->split[a] = (int8_t)(t->sh.dim[a] + 1), split = true;
    if (t->sh.kind[a] == SH_P) rg->partial |= (uint8_t)(1u << a);
  }
  if (split && !g->hf_rank && mesh) {
    for (int a = 0; a < AX_COUNT && a < 5; a++)
      if (rg->split[a]) rg->shape[rg->split[a] - 1] *= mesh->size[a];
  }
  return 0;
}

void cg_describe_place(const Type *t, RtPlace *pl) {
  memset(pl, 0, sizeof *pl);
  pl->ir_rank = (int8_t)(t->rank < 8 ? t->rank : 8);
  for (int d = 0; d < pl->ir_rank; d++) pl->piece_dims[d] = t->dims[d];
  for (int a = 0; a < AX_COUNT && a < 5; a++)
    if (t->sh.kind[a] == SH_S) pl->split[a] = (int8_t)(t->sh.dim[a] + 1);
}

void cg_describe_mesh(const Mesh *mesh, RtProgram *out) {
  for (int a = 0; a < 5; a++) out->mesh[a] = a < AX_COUNT && mesh->size[a] > 1 ? mesh->size[a] : 1;
}

void cg_describe_pipe(const Module *m, RtProgram *out) {
  out->pipe = (RtPipe){0};
  if (m->pipe.kind) out->pipe = (RtPipe){m->pipe.kind, (int32_t)m->pipe.virt, (int32_t)m->pipe.micro};
  for (int k = 0; k < out->n_globals && k < m->globals.n; k++)
    out->globals[k].owner = (int16_t)(m->pipe.kind ? pipe_owner_of(m, m->globals.items[k]) : -1);
}

static void describe_value(const Type *t, RtBuf *b) {
  memset(b, 0, sizeof *b);
  b->region = RT_REGION_ARENA;
  b->n = type_numel(t);
  b->is_int = !dtype_is_float(t->dtype);
  b->round = cg_round_of(t->dtype);
  b->storage = b->is_int ? RT_ST_I32 : RT_ST_F32;
}

int cg_describe_module(const Module *m, RtProgram *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  cg_describe_mesh(&m->mesh, out);
  out->funcs = calloc((size_t)m->funcs.n + 1, sizeof *out->funcs);
  out->globals = calloc((size_t)m->globals.n + 1, sizeof *out->globals);
  if (!out->funcs || !out->globals) {
    rt_program_free(out);
    snprintf(err, errlen, "out of memory");
    return IR_ERUN;
  }
  out->n_funcs = m->funcs.n;
  out->n_globals = m->globals.n;
  for (int k = 0; k < m->funcs.n; k++) {
    const Func *f = m->funcs.items[k];
    RtFunc *rf = &out->funcs[k];
    if (strlen(f->name) >= sizeof rf->name || f->args.n > RT_MAX_FUNC_IO || f->rets.n > RT_MAX_FUNC_IO) {
      snprintf(err, errlen, "@%s: a name of at most %zu characters and at most %d arguments and results each, "
               "as a lowered program holds", f->name, sizeof rf->name - 1, RT_MAX_FUNC_IO);
      rt_program_free(out);
      return IR_EINPUT;
    }
    snprintf(rf->name, sizeof rf->name, "%s", f->name);
    rf->n_args = f->args.n;
    rf->n_rets = f->rets.n;
    for (int i = 0; i < f->args.n; i++) {
      const Type *t = &((const Value *)f->args.items[i])->type;
      describe_value(t, &rf->args[i]);
      cg_describe_place(t, &rf->arg_place[i]);
    }
    for (int i = 0; i < f->rets.n; i++) describe_value(&((const Value *)f->rets.items[i])->type, &rf->rets[i]);
  }
  for (int i = 0; i < m->globals.n; i++) {
    const Global *g = m->globals.items[i];
    if (cg_describe_global(g, &m->mesh, &out->globals[i], 0)) {
      snprintf(err, errlen, "global $%.200s...: the name is longer than %zu characters", g->name,
               sizeof out->globals[i].name - 1);
      rt_program_free(out);
      return IR_EINPUT;
    }
  }
  cg_describe_pipe(m, out);   /* a pipeline's schedule and every global's stage */
  return 0;
}

/* The order globals are placed in their regions: parameters grouped by the weight decay
   their AdamW uses (the first group seen first), module order within a group; each
   parameter's gradient, first moment and second moment in the same order (all first
   moments, then all second moments), so a group is one span in every region and its
   updates merge (merge_updates in each lowering).  Other globals follow in module order.  Returns a
   malloc'd permutation of the global indices, or NULL. */
int *cg_placement_order(const Module *m) {
  int ng = m->globals.n;
  int *order = malloc(sizeof(int) * (size_t)(ng ? ng : 1));
  int64_t *key = malloc(sizeof(int64_t) * (size_t)(ng ? ng : 1));
  double *wd = malloc(sizeof(double) * (size_t)(ng ? ng : 1)), groups[64];
  int n_groups = 0;
  if (!order || !key || !wd) {
    free(order), free(key), free(wd);
    return NULL;
  }
  for (int i = 0; i < ng; i++) wd[i] = -1;   /* no adamw: its own group */
  const Func *opt = module_find_func(m, "optimizer_step");
  for (int k = 0; opt && k < opt->ops.n; k++) {
    const Op *op = opt->ops.items[k];
    if (op->kind == OP_ADAMW && op->operands[0]->kind == VAL_GLOBAL)
      wd[op->operands[0]->global->index] = op_float(op, "weight_decay");
  }
  /* rank of a parameter: group, then module index */
  int64_t *prank = malloc(sizeof(int64_t) * (size_t)(ng ? ng : 1));
  if (!prank) {
    free(order), free(key), free(wd);
    return NULL;
  }
  for (int i = 0; i < ng; i++) {
    const Global *g = m->globals.items[i];
    int grp = 63;
    if (g->kind == GLOBAL_PARAM) {
      for (grp = 0; grp < n_groups && groups[grp] != wd[i]; grp++) {}
      if (grp == n_groups && n_groups < 63) groups[n_groups++] = wd[i];
      else if (grp == n_groups) grp = 63;
    }
    prank[i] = (int64_t)grp * (ng + 1) + i;
  }
  static const char *const prefixes[] = {GRAD_PREFIX, ADAM_M_PREFIX, ADAM_V_PREFIX};
  int64_t span = (int64_t)64 * (ng + 1);
  for (int i = 0; i < ng; i++) {
    const Global *g = m->globals.items[i];
    key[i] = g->kind == GLOBAL_PARAM ? prank[i] : 3 * span + i;   /* other state last */
    for (int p = 0; p < 3 && g->kind != GLOBAL_PARAM; p++) {
      size_t n = strlen(prefixes[p]);
      const Global *of = strncmp(g->name, prefixes[p], n) ? NULL : module_find_global(m, g->name + n);
      if (of && of->kind == GLOBAL_PARAM) key[i] = (p == 2 ? span : 0) + prank[of->index];
    }
  }
  for (int i = 0; i < ng; i++) order[i] = i;
  for (int i = 1; i < ng; i++)   /* insertion sort by key: stable, a few hundred globals */
    for (int j = i; j > 0 && key[order[j - 1]] > key[order[j]]; j--) {
      int t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  free(prank), free(key), free(wd);
  return order;
}

void cg_label_merged(RtStep *st, int tensors) {
  if (tensors <= 1) return;
  char tail[32];
  int k = snprintf(tail, sizeof tail, " [%d tensors]", tensors);
  size_t len = strlen(st->label), at = len + (size_t)k < sizeof st->label ? len : sizeof st->label - 1 - (size_t)k;
  memcpy(st->label + at, tail, (size_t)k + 1);
}

int cg_wrap_start(RtStep *st, int h) {
  if (st->kind != RT_STEP_BUILTIN || st->which < RT_B_ALL_REDUCE || st->which > RT_B_ALL_TO_ALL) return -1;
  if (st->i[RT_MAX_INTS - 1] || st->i[RT_MAX_INTS - 2]) return -1;
  memmove(st->i + 2, st->i, sizeof(int64_t) * (RT_MAX_INTS - 2));
  st->i[0] = st->which;
  st->i[1] = h;
  st->which = RT_B_COLL_START;
  return 0;
}

/* ---- the runtime's builtins against the IR's ops (runtime/builtins.def, ir/ops.def) ----
   A builtin that lowers one IR op one to one names that op; the build fails here when the op
   is gone from ops.def or when its operand or result count no longer matches the builtin's
   buffers.  (tests/unit/test_builtins.c compares the names, through cg_builtin_op.) */
enum {
#define OP(e, name, n_operands, n_results, cls, flags, schema) CG_IN_##e = n_operands, CG_OUT_##e = n_results,
#include "ir/ops.def"
#undef OP
  CG_IN_NONE = -2, CG_OUT_NONE = -2
};
#define RT_BUILTIN(e, name, n_in, n_out, ir_op)                                                                   \
  _Static_assert(CG_IN_##ir_op == -2 || (CG_IN_##ir_op == (n_in) && (CG_OUT_##ir_op == (n_out) || (n_out) == -1)),  \
                 "runtime/builtins.def: builtin " name " takes other buffers than ir/ops.def's op " #ir_op);
#include "runtime/builtins.def"
#undef RT_BUILTIN

int cg_builtin_op(int builtin) {
  switch (builtin) {
#define OP_NONE (-1)
#define RT_BUILTIN(e, name, n_in, n_out, ir_op) case RT_B_##e: return OP_##ir_op;
#include "runtime/builtins.def"
#undef RT_BUILTIN
#undef OP_NONE
  default: return -1;
  }
}

void cg_rope_f(const Op *op, double f[4]) {
  f[0] = op_float(op, "theta");
  f[1] = f[2] = f[3] = 0.0;
  double factor = op_float(op, "factor"), orig = (double)op_int(op, "original_max_pos");
  if (!(factor > 0.0)) return;
  f[1] = factor;
  f[2] = orig / op_float(op, "low_freq_factor");
  f[3] = orig / op_float(op, "high_freq_factor");
}

RtStep *cg_new_step(RtStep **items, int *n, int *cap, const Op *op, RtStepKind kind, int which, const char *suffix) {
  if (*n == *cap) {
    int c = *cap ? 2 * *cap : 64;
    RtStep *grown = realloc(*items, sizeof(RtStep) * (size_t)c);
    if (!grown) return NULL;
    *items = grown;
    *cap = c;
  }
  RtStep *st = &(*items)[(*n)++];
  memset(st, 0, sizeof *st);
  st->kind = kind;
  st->which = which;
  const Value *r = op->n_results ? op->results[0] : op->operands[0];
  const char *name = r->kind == VAL_GLOBAL ? r->global->name : r->name;
  if (op->kind == OP_CALL) snprintf(st->label, sizeof st->label, "call @%s", op->callee->name);
  else if (name)
    snprintf(st->label, sizeof st->label, "%s %s%s%s", op_info(op->kind)->name, r->kind == VAL_GLOBAL ? "$" : "%", name,
             suffix);
  else snprintf(st->label, sizeof st->label, "%s%s", op_info(op->kind)->name, suffix);
  return st;
}

int cg_func_head(const Func *f, RtFunc *rf, char *msg, size_t n) {
  if (strlen(f->name) >= sizeof rf->name) {
    snprintf(msg, n, "the function name is longer than %zu characters", sizeof rf->name - 1);
    return IR_EINPUT;
  }
  snprintf(rf->name, sizeof rf->name, "%s", f->name);
  if (f->arena_bytes < 0) {
    snprintf(msg, n, "has no arena size; run the memory-plan pass first");
    return IR_EINPUT;
  }
  rf->arena_bytes = f->arena_bytes;
  if (f->args.n > RT_MAX_FUNC_IO || f->rets.n > RT_MAX_FUNC_IO) {
    snprintf(msg, n,
             "has %d arguments and %d results; a lowered function holds at most %d of each (RT_MAX_FUNC_IO): "
             "a pipeline chunk this long keeps too many activations, use more stages or --pp-virtual",
             f->args.n, f->rets.n, RT_MAX_FUNC_IO);
    return IR_EINPUT;
  }
  rf->n_args = f->args.n;
  rf->n_rets = f->rets.n;
  return 0;
}
