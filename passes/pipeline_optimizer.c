/* passes/pipeline_optimizer.c — the pipeline pass's optimizer steps: @optimizer_step cut
 * into @optimizer_step.sR, each pp rank's, with the ops about the parameters its chunks read
 * (or about none), the tied parameters' gradients exchanged and added, and the gradient norm's
 * sum of squares summed over pp.  Its own file: it walks @optimizer_step, not @grad_step, and
 * needs of the chunks only which rank reads which parameter. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/pipeline_internal.h"

/* The parameter a global belongs to: itself, or the X of grad.X / adam_m.X / adam_v.X
   (PP.param holds it for every global: the optimizer steps of many pp ranks ask for every op). */
const Global *pipeline_find_param(Module *m, const Global *gl) {
  const char *pre[] = {GRAD_PREFIX, ADAM_M_PREFIX, ADAM_V_PREFIX};
  if (gl->kind == GLOBAL_PARAM) return gl;
  for (int k = 0; k < 3; k++)
    if (!strncmp(gl->name, pre[k], strlen(pre[k]))) return module_find_global(m, gl->name + strlen(pre[k]));
  return NULL;
}

/* uses[rank][global index]: does a function of that rank read or write the global? */
void pipeline_global_users(PP *pp, bool *used) {
  Module *m = pp->m;
  for (int f = 0; f < m->funcs.n; f++) {
    Func *fn = m->funcs.items[f];
    int c = -1;
    if (sscanf(fn->name, "fwd.c%d", &c) != 1 && sscanf(fn->name, "bwd.c%d", &c) != 1 &&
        sscanf(fn->name, "bwd_b.c%d", &c) != 1 && sscanf(fn->name, "bwd_w.c%d", &c) != 1)
      continue;
    int r = chunk_rank(pp, c);
    for (int i = 0; i < fn->ops.n; i++) {
      Op *op = fn->ops.items[i];
      for (int k = 0; k < op->n_operands; k++)
        if (op->operands[k]->kind == VAL_GLOBAL) {
          const Global *p = param_of(pp, op->operands[k]->global);
          if (p) used[r * m->globals.n + p->index] = true;
        }
    }
  }
}

void pipeline_opt_plan_free(OptPlan *op) { free(op->about), free(op->ab), free(op->in_norm), free(op->map), free(op->dropped_on); }

int pipeline_opt_plan(PP *pp, Func *opt, OptPlan *pl) {
  int nv = func_number(opt), n = opt->ops.n;
  *pl = (OptPlan){malloc(sizeof(int) * (size_t)(nv + 1)), malloc(sizeof(int) * (size_t)(n + 1)),
                  calloc((size_t)n + 1, 1), calloc((size_t)nv + 1, sizeof(Value *)), calloc((size_t)nv + 1, sizeof(int))};
  bool *need = calloc((size_t)nv + 1, 1);
  if (!pl->about || !pl->ab || !pl->in_norm || !pl->map || !pl->dropped_on || !need) {
    free(need);
    return pipeline_fail(pp, IR_ERUN, "out of memory");
  }
  for (int i = n - 1; i >= 0; i--) {
    Op *op = opt->ops.items[i];
    bool in = op->kind == OP_SQRT && op->results[0]->name && !strcmp(op->results[0]->name, "grad_norm");
    for (int r2 = 0; r2 < op->n_results && !in; r2++) in = need[op->results[r2]->id];
    if (!in) continue;
    pl->in_norm[i] = true;
    for (int k = 0; k < op->n_operands; k++)
      if (op->operands[k]->kind == VAL_RESULT) need[op->operands[k]->id] = true;
  }
  free(need);
  for (int i = 0; i < n; i++) {
    Op *op = opt->ops.items[i];
    int ab = -1;
    bool chain_in = false;
    for (int k = 0; k < op->n_operands; k++) {
      Value *v = op->operands[k];
      int a = -1;
      if (v->kind == VAL_GLOBAL) {
        const Global *p = param_of(pp, v->global);
        a = p ? p->index : -1;
      } else if (v->kind == VAL_RESULT) {
        a = pl->about[v->id];
        chain_in |= a == -2;
      }
      if (a < 0) continue;
      ab = ab == -1 ? a : ab == a ? a : -3;
    }
    if (pl->in_norm[i] && (chain_in || ab == -3)) ab = -2;
    pl->ab[i] = ab;
    for (int rr = 0; rr < op->n_results; rr++) pl->about[op->results[rr]->id] = ab;
  }
  return 0;
}

/* Rank r's optimizer step: the ops about its parameters or about none, and the norm's chain
   over the terms it counts.  An op about another rank's parameter is not looked at: nothing
   this rank keeps reads it (the chain counts such a term as another rank's). */
int pipeline_build_optimizer(PP *pp, Func *opt, const OptPlan *pl, const bool *used, int r, const int *mine, int n_mine) {
  Module *m = pp->m;
  int ng = m->globals.n;
  char name[64];
  snprintf(name, sizeof name, "optimizer_step.s%d", r);
  Out o = {module_add_func(m, name), pl->map, pp, false};
  for (int a = 0; a < opt->args.n; a++) {
    Value *v = opt->args.items[a];
    o.map[v->id] = func_add_arg(o.f, v->name, v->type);
  }
  /* Tied parameters this rank shares with another: send, receive, add, assign. */
  for (int gi = 0; gi < ng; gi++) {
    Global *p = m->globals.items[gi];
    if (p->kind != GLOBAL_PARAM || !used[r * ng + gi]) continue;
    int other = -1, owners = 0;
    for (int q = 0; q < pp->p; q++)
      if (used[q * ng + gi]) owners++, other = q != r ? q : other;
    if (owners == 1) continue;
    if (owners > 2)
      return pipeline_fail(pp, IR_EINPUT, "$%s is read by %d pipeline ranks; tied parameters may be shared by two", p->name, owners);
    char gname[512];
    snprintf(gname, sizeof gname, GRAD_PREFIX "%s", p->name);
    Global *gg = module_find_global(m, gname);
    if (!gg) continue;
    Value *gv = gg->value;
    Op *s = op_new(m, OP_SEND, &gv, 1, NULL);
    Type t = gv->type;
    Op *rv = op_new(m, OP_RECV, NULL, 0, &t);
    Op *xs[2] = {s, rv};
    for (int k = 0; k < 2; k++) {
      xs[k]->attrs[op_attr_index(xs[k]->kind, "axis")] = (Attr){.kind = ATTR_STR, .s = "pp", .set = true};
      op_set_int(xs[k], "n", pp->p);
      op_set_int(xs[k], "peer", other);
      op_set_int(xs[k], "tag", (1 << 20) + gi);
      ptrvec_push(m->arena, &o.f->ops, xs[k]);
    }
    rv->results[0]->name = arena_printf(m->arena, "%s.from_pp%d", gname, other);
    Value *ops[2] = {gv, rv->results[0]};
    Op *add = op_new(m, OP_ADD, ops, 2, &t);
    ptrvec_push(m->arena, &o.f->ops, add);
    Value *as[2] = {gv, add->results[0]};
    ptrvec_push(m->arena, &o.f->ops, op_new(m, OP_ASSIGN, as, 2, NULL));
  }
  /* Every op of the step: kept when it is about a parameter of this rank (or about none).
     The gradient norm's running sum: a term of a parameter of another rank, or of a tied
     parameter counted on its first owner, drops out of it. */
  int *dropped = pl->dropped_on, mark = r + 1, rc = 0;
  bool have_norm = false;
  for (int x = 0; x < n_mine && !rc; x++) {
    int i = mine[x], ab = pl->ab[i];
    Op *op = opt->ops.items[i];
    if (ab == -3) {
      char text[512];
      rc = pipeline_fail(pp, IR_ERUN, "internal error: an @optimizer_step op outside the norm mixes parameters: %s",
                op_to_string(op, text, sizeof text));
      break;
    }
    if (ab == -2) {
      int live[8], nl = 0;
      for (int k = 0; k < op->n_operands; k++) {
        Value *v = op->operands[k];
        bool dead = v->kind == VAL_RESULT && dropped[v->id] == mark;
        if (!dead && v->kind == VAL_RESULT && pl->about[v->id] >= 0) {
          int pi = pl->about[v->id], first = -1;
          for (int q = 0; q < pp->p && first < 0; q++)
            if (used[q * ng + pi]) first = q;
          dead = first != r;
        }
        if (!dead && nl < 8) live[nl++] = k;
      }
      if (op->kind == OP_ADD && nl == 1) {
        o.map[op->results[0]->id] = pipeline_get(&o, op->operands[live[0]]);
        continue;
      }
      if (nl == 0) {
        for (int rr = 0; rr < op->n_results; rr++) dropped[op->results[rr]->id] = mark;
        continue;
      }
      if (nl != op->n_operands) {
        char text[512];
        rc = pipeline_fail(pp, IR_ERUN, "internal error: the gradient norm's op %s loses an operand on pp rank %d",
                  op_to_string(op, text, sizeof text), r);
        break;
      }
    }
    bool any_dropped = false;
    for (int k = 0; k < op->n_operands; k++)
      any_dropped |= op->operands[k]->kind == VAL_RESULT && dropped[op->operands[k]->id] == mark;
    if (any_dropped) {
      for (int rr = 0; rr < op->n_results; rr++) dropped[op->results[rr]->id] = mark;
      continue;
    }
    /* The norm: the sum of squares is summed over pp before its square root. */
    if (op->kind == OP_SQRT && op->results[0]->name && !strcmp(op->results[0]->name, "grad_norm")) {
      Value *x = pipeline_get(&o, op->operands[0]);
      Type t = x->type;
      Op *ar = op_new(m, OP_ALL_REDUCE, &x, 1, &t);
      ar->attrs[op_attr_index(OP_ALL_REDUCE, "axis")] = (Attr){.kind = ATTR_STR, .s = "pp", .set = true};
      op_set_int(ar, "n", pp->p);
      ar->attrs[op_attr_index(OP_ALL_REDUCE, "reduce")] = (Attr){.kind = ATTR_STR, .s = "sum", .set = true};
      ptrvec_push(m->arena, &o.f->ops, ar);
      o.map[op->operands[0]->id] = ar->results[0];
      have_norm = true;
    }
    pipeline_emit(&o, op);
  }
  for (int i = 0; i < opt->rets.n && !rc; i++) {
    Value *v = opt->rets.items[i];
    Value *x = v->kind == VAL_GLOBAL ? v : o.map[v->id];
    if (!x) {
      rc = pipeline_fail(pp, IR_ERUN, "internal error: @optimizer_step's result %d has no value on pp rank %d", i, r);
      break;
    }
    func_add_ret(o.f, x);
  }
  /* the copies are this rank's: cleared for the next (only this rank's ops set any) */
  for (int a = 0; a < opt->args.n; a++) o.map[((Value *)opt->args.items[a])->id] = NULL;
  for (int x = 0; x < n_mine; x++) {
    Op *op = opt->ops.items[mine[x]];
    for (int rr = 0; rr < op->n_results; rr++) o.map[op->results[rr]->id] = NULL;
    if (op->n_operands && op->operands[0]->kind == VAL_RESULT) o.map[op->operands[0]->id] = NULL;
  }
  if (rc) return rc;
  if (!have_norm) return pipeline_fail(pp, IR_EINPUT, "@optimizer_step has no %%grad_norm = sqrt ...: the pipeline pass needs the "
                              "optimizer pass's step");
  return 0;
}
