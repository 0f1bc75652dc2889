/* driver/plan_fast.c — placeholder while the restructure is checked */
#include "driver/plan_internal.h"
int screen_fast(Ctx *x, const PlanRequest *rq, Cand *cs, int *n, int *refused, char *first_refusal, ScreenStats *st,
                int *programs, char *err, size_t errlen) {
  *programs = 0;
  return screen_exhaustive(x, rq, cs, n, refused, first_refusal, st, err, errlen);
}
