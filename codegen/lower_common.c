/* codegen/lower_common.c — see lower_common.h. */
#include "codegen/lower_common.h"

#include <stdio.h>
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
  if (!strncmp(g->name, CG_GRAD_PREFIX, strlen(CG_GRAD_PREFIX))) return RT_REGION_GRADS;
  return RT_REGION_OPTIM;
}

int cg_describe_global(const Global *g, RtGlobal *rg, int64_t offset) {
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
  return 0;
}
