/* runtime/cpu/cpu_async.c — a rank's communication steps: async collectives on its
 * communication thread (runtime/comm/comm_engine.c), the time its own thread spends blocked
 * on communication (exposed communication), and the timeline events of --trace-out.
 *
 * RT_B_COLL_START hands the collective to the engine and returns; RT_B_COLL_WAIT blocks until
 * it is done.  While a rank has an engine, its synchronous collectives go through the engine
 * too (submitted and waited for at once), so the engine runs all of the rank's collectives
 * in program order and every group's members meet in the same order.  Point-to-point
 * transfers stay on the rank's thread (mailboxes, not group barriers).  The collective the
 * engine runs is the same builtin with the same buffers as the synchronous one, so the
 * results are the same bits.
 *
 * Without an engine (one rank, or a driver that gives none) a start runs its collective at
 * once and a wait does nothing.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/cpu/cpu_exec.h"
#include "runtime/cpu/cpu_kernels.h"

typedef struct CpuAsync {
  RtStep st;           /* the collective, unwrapped */
  void *bufs[4];       /* its buffers (all_to_allv has four; the others two) */
  Comm *comm;
  const char *label;   /* the start's label, in the program */
  int64_t ticket;
  bool pending;
} CpuAsync;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Group collectives: the ones a start can begin, and all_to_allv (synchronous only). */
static bool is_collective(int which) {
  return (which >= RT_B_ALL_REDUCE && which <= RT_B_ALL_TO_ALL) || which == RT_B_ALL_TO_ALLV;
}

bool cpu_program_has_async(const RtProgram *p) {
  for (int f = 0; f < p->n_funcs; f++)
    for (int s = 0; s < p->funcs[f].n_steps; s++) {
      const RtStep *st = &p->funcs[f].steps[s];
      if (st->kind == RT_STEP_BUILTIN && st->which == RT_B_COLL_START) return true;
    }
  return false;
}

void cpu_trace_add(CpuProgram *cp, const char *label, double t0, double t1, int track) {
  if (!cp->tracing) return;
  if (cp->n_trace == cp->cap_trace) {
    int cap = cp->cap_trace ? 2 * cp->cap_trace : 1024;
    CpuTraceEvent *t = realloc(cp->trace, sizeof *t * (size_t)cap);
    if (!t) return;   /* a shorter timeline, not a failed run */
    cp->trace = t;
    cp->cap_trace = cap;
  }
  cp->trace[cp->n_trace++] = (CpuTraceEvent){label, t0, t1, track};
}

static int job(void *arg, char *err, size_t errlen) {
  CpuAsync *a = arg;
  return cpu_builtin_run(NULL, a->comm, &a->st, a->bufs, err, errlen);
}

/* One slot per handle of the program (the largest + 1), and one more for synchronous
   collectives; allocated once, since the engine holds pointers into it. */
static int ensure_slots(CpuProgram *cp, char *err, size_t errlen) {
  if (cp->async) return 0;
  int64_t most = -1;
  for (int f = 0; f < cp->p->n_funcs; f++)
    for (int s = 0; s < cp->p->funcs[f].n_steps; s++) {
      const RtStep *st = &cp->p->funcs[f].steps[s];
      if (st->kind == RT_STEP_BUILTIN && st->which == RT_B_COLL_START && st->i[1] > most) most = st->i[1];
    }
  cp->n_async = (int)most + 2;
  cp->async = calloc((size_t)cp->n_async, sizeof *cp->async);
  if (!cp->async) {
    snprintf(err, errlen, "out of memory");
    return 1;
  }
  return 0;
}

static int wait_slot(CpuProgram *cp, CpuAsync *a, double t0, char *err, size_t errlen) {
  int rc = comm_engine_wait(cp->engine, a->ticket, err, errlen);
  a->pending = false;
  cp->comm_wait_s += now_s() - t0;
  if (cp->tracing) {
    double b, e;
    comm_engine_job_times(cp->engine, a->ticket, &b, &e);
    if (e > 0) cpu_trace_add(cp, a->label, b, e, 1);
  }
  return rc;
}

int cpu_async_step(CpuProgram *cp, const RtStep *st, void *const *bufs, bool *handled, char *err, size_t errlen) {
  *handled = false;
  if (st->kind != RT_STEP_BUILTIN) return 0;
  int w = st->which;
  bool start = w == RT_B_COLL_START, wait = w == RT_B_COLL_WAIT, coll = is_collective(w);
  bool transfer = w == RT_B_SEND || w == RT_B_RECV;
  if (!start && !wait && !coll && !transfer) return 0;
  *handled = true;
  double t0 = now_s();
  if (!cp->engine || transfer) {   /* on this thread: the rank waits for all of it */
    int rc = cpu_builtin_run(cp->tp, cp->comm, st, bufs, err, errlen);
    double t1 = now_s();
    if (!wait) {
      cp->comm_wait_s += t1 - t0;
      cpu_trace_add(cp, st->label, t0, t1, 1);
    }
    return rc;
  }
  if (ensure_slots(cp, err, errlen)) return 1;
  if (start || coll) {
    int64_t h = start ? st->i[1] : cp->n_async - 1;
    if (h >= cp->n_async - 1 + !start) {
      snprintf(err, errlen, "%s: handle %lld out of range", st->label, (long long)h);
      return 2;
    }
    CpuAsync *a = &cp->async[h];
    if (a->pending) {
      snprintf(err, errlen, "%s: handle %lld is started again before its wait", st->label, (long long)h);
      return 2;
    }
    if (start) cpu_coll_unwrap(st, &a->st);
    else a->st = *st;
    for (int k = 0; k < 4; k++) a->bufs[k] = k < st->n_in + st->n_out ? bufs[k] : NULL;
    a->comm = cp->comm;
    a->label = st->label;
    a->ticket = comm_engine_submit(cp->engine, job, a);
    if (a->ticket < 0) {
      snprintf(err, errlen, "%s: the communication thread has stopped", st->label);
      return 1;
    }
    a->pending = true;
    return start ? 0 : wait_slot(cp, a, t0, err, errlen);
  }
  int64_t h = st->i[0];
  if (h < 0 || h >= cp->n_async - 1 || !cp->async[h].pending) {
    snprintf(err, errlen, "%s: waits for handle %lld, which was not started", st->label, (long long)h);
    return 2;
  }
  return wait_slot(cp, &cp->async[h], t0, err, errlen);
}
