/* driver/plan_internal.h — what the planner's files share (driver/plan.h lists them). */
#ifndef LOOM_DRIVER_PLAN_INTERNAL_H
#define LOOM_DRIVER_PLAN_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <stdio.h>

#include "driver/plan.h"
#include "passes/lower_memo.h"
#include "passes/passes.h"

typedef PlanCand Cand;

/* ---- compiling a candidate (plan_compile.c) ----
   A compile is the training pipeline and lowering without their verifier passes (a
   candidate's program is checked when it is compiled to run), in three parts that
   candidates share:
   - front: the frontend and the passes up to `optimizer`, then @forward dropped (the
     evaluation, no part of a step: neither the time model nor the memory per rank reads
     it).  It depends on the layers, the batch, the gradient accumulation and tp (which pads
     the vocabulary), so it is kept for the run (Ctx.front) and each compile takes a copy;
   - middle: `shard` and `recompute`, which read the layout but not its pipeline schedule:
     the schedules of a family share it (plan_screen.c);
   - back: `pipeline` and `bucket`, then the lowering (canonicalize .. memory-plan, which work
     function by function), then the time model and the memory per rank.  A screening
     compile lowers only the functions it has not met before (Ctx.memo, by func_hash and the
     mesh): many are met again (an optimizer step does not change with the micro-batch or
     the recomputation, a forward chunk is 1f1b's and zb-h1's), and for those the figures
     lowering gave are reused: a call's time, the arena, the globals it reads. */
enum { FRONT_CACHE = 64 };
typedef struct {
  int64_t key[4];   /* layers, batch, grad_accum, tp */
  Module *m;        /* never changed: compiles take copies */
  int users;        /* copies being taken now */
} Front;

typedef struct Stash Stash;   /* plan_stash.c: the stash bounds */

typedef struct {
  const RunSpec *base;
  const Hardware *hw;
  int target;
  int compiles;
  pthread_mutex_t lock;   /* the counters and the caches (screening runs on several threads) */
  FILE *quiet;            /* /dev/null: where the passes' reports go */
  char passes[4][512];    /* front, middle, pipeline + bucket, lowering */
  Front front[FRONT_CACHE];
  int front_next;
  LowerMemo *memo;        /* functions lowered before (passes/lower_memo.h) */
  double layer_s;         /* a layer's forward and backward for one sequence at peak FLOP/s (pruning) */
  double seq_flops;       /* the model's forward and backward FLOPs for one sequence (MFU) */
  double layer_flops;     /* one layer's share of them */
  Stash *stash;           /* the fast search's stash bounds, for the exact phase (or NULL) */
} Ctx;

/* A Ctx for rq (ctx_free frees it); 1 when out of memory. */
int ctx_init(Ctx *x, const PlanRequest *rq);
void ctx_free(Ctx *x);
void count_compile(Ctx *x);
double now_s(void);

/* The progress line of a long search on standard error: on a terminal one line rewritten at
   most twice a second (plan_progress_end clears it before the summary); elsewhere (a pipe,
   `tee`, a log) a whole line every 10 s at most, so a plan of minutes shows it is alive. */
typedef struct {
  bool on, tty;
  double t0, shown, every;
} PlanProgress;
static inline void plan_progress_init(PlanProgress *p, bool on, bool tty, double t0) {
  const char *e = getenv("LOOM_PLAN_PROGRESS_S");   /* the interval off a terminal (tests/cli/plan.sh) */
  p->on = on, p->tty = tty, p->t0 = t0, p->shown = t0, p->every = tty ? 0.5 : e && *e ? atof(e) : 10.0;
}
__attribute__((format(printf, 3, 4))) static inline void plan_progress_say(PlanProgress *p, double now,
                                                                           const char *fmt, ...) {
  if (!p->on || now - p->shown < p->every) return;
  p->shown = now;
  char line[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, p->tty ? "\r%s (%.0f s)" : "%s (%.0f s)\n", line, now - p->t0);
  fflush(stderr);
}
static inline void plan_progress_end(PlanProgress *p) {
  if (p->on && p->tty && p->shown > p->t0) fprintf(stderr, "\r\033[K");
}
/* OpenBLAS's idle worker threads stopped (they would take a core from the search). */
void blas_threads_stop(void);
/* x->layer_s, x->seq_flops, x->layer_flops: from the trained modules of 1 and 2 layers. */
void layer_seconds(Ctx *x);

/* Compiles c with `layers` layers (the model's: whole); its predicted step and memory, and
   the lowered module in *keep when keep is not NULL.  2 when the layout is not one loom can
   build (the message says why), 1 on a failure.  *counted: whether it is a compile the
   count has (the spec was valid); the caller counts it. */
int compile_one(Ctx *x, const Cand *c, int64_t layers, StepTime *t, int64_t *mem, Module **keep, char *err,
                size_t errlen, bool *counted);
/* The run spec of candidate c with `layers` layers, checked (sp holds *x->base). */
int cand_spec(const Ctx *x, const Cand *c, int64_t layers, RunSpec *sp, char *err, size_t errlen);
/* The front and middle parts of sp's program in *out; *pin: the front cache entry it shares
   names with (unpin when it is freed). */
int front_middle(Ctx *x, const RunSpec *sp, Module **out, int *pin, char *err, size_t errlen);
void unpin(Ctx *x, int pin);
/* A pipelined screening compile's stash (memory_rank.c, pipe_stash_peaks): the bytes one
   micro-batch of a chunk holds from F to B (f) and from B to W (w), for the first chunk,
   every interior one and the last (ok: 3 chunks or more, the interior ones all the same). */
typedef struct {
  bool ok;
  int64_t f[3], w[3];   /* [first, interior, last] */
} ChunkStash;
/* The back part for a screening compile (the memo's shared lowering); m is freed.  stash:
   NULL, or the pipeline's stash (ok false without pp). */
int back_screen(Ctx *x, const Cand *c, const RunSpec *sp, Module *m, double *step_s, int64_t *mem, ChunkStash *stash,
                char *err, size_t errlen);
/* The back part in full (the whole lowering): step, memory, the module kept in *keep. */
int back(Ctx *x, const Cand *c, const RunSpec *sp, Module *m, StepTime *t, int64_t *mem, Module **keep, char *err,
         size_t errlen);

/* The layers of c's screening compiles (1 or 2 entries: 1 and 2 layers a chunk, or the
   model when that is as small) and the screened figures extrapolated from them. */
int screen_layers(const Cand *c, int64_t L, int64_t out[2]);
void extrapolate(Cand *c, int64_t L, const int64_t ls[2], int nl, const double st[2], const int64_t m[2]);
/* A pruned candidate screened in full after all (the exact phase reached it).  stop_far:
   one found far out of memory (over 1.5 x the device) at its first compile stays pruned,
   its memory that compile's (a lower bound: the exact phase skips it all the same), or
   m1 + k (m2_lb - m1) where that is larger, m2_lb a lower bound on the second compile's
   memory (0: none). */
void resolve(Ctx *x, Cand *c, int64_t L, const Hardware *hw, bool stop_far, double m2_lb, int *refused,
             char *first_refusal);

/* The exact phase's whole compiles, several at once (each thread takes the next). */
typedef struct {
  Ctx *x;
  const Cand *c;
  int64_t L;
  StepTime t;
  int64_t mem;
  int rc;
  bool counted;
  char err[IR_ERR_LEN];
} Whole;
void *whole_worker(void *arg);

/* ---- the searches ---- */
typedef struct {
  int skipped, pruned, threads;
  double seconds;
} ScreenStats;

/* plan_screen.c: every candidate of cs[0..n) screened (by compiling it), in rounds that prune
   what cannot win.  On return cs holds the buildable ones (*n of them; the rest counted in
   *refused, the first reason in first_refusal) with their screened figures. */
int screen_exhaustive(Ctx *x, const PlanRequest *rq, Cand *cs, int *n, int *refused, char *first_refusal,
                      ScreenStats *st, char *err, size_t errlen);

/* plan_fast.c: every candidate's step and memory estimated from its layer programs, then
   only those whose estimate could be among the keep best screened (by compiling, as above).
   The same contract as screen_exhaustive; *programs: layer programs compiled. */
int screen_fast(Ctx *x, const PlanRequest *rq, Cand *cs, int *n, int *refused, char *first_refusal, ScreenStats *st,
                int *programs, char *err, size_t errlen);

/* plan_stash.c: a lower bound on pruned candidate c's screened memory from the stash the
   screening compiles showed, or its reference's (made where they show nothing); 0 where
   nothing tells or x->stash is NULL; *m2_lb: the bound on its second screening compile's
   memory (2 layers a chunk; 0 where none). */
double stash_far_bound(Ctx *x, const Cand *c, double *m2_lb);
void stash_free(Stash *st);

/* plan_screen.c: half[i], the candidate like i with half its batch; none[i], like i without
   recomputation (i recomputes); -1 where there is none.  1 when out of memory. */
int siblings(const Cand *cs, int n, int *half, int *none);

/* plan_sim.c: the pipeline schedules of the fast search's estimates, each ordered once so
   that a simulation is one pass (schedule_simulate's makespan, to the bit). */
typedef struct {
  int kind, p, v, m;        /* the schedule (PipeKind, pp, virtual, micro-batches) */
  bool ok, split_bw;        /* ok: built, and simulated without a deadlock */
  int n;                    /* actions */
  unsigned char *rank;      /* [n] each action's pp rank, in an order that follows every dependency */
  int *dep;                 /* [n] the place of the action it waits for, or -1 */
  uint16_t *ci;             /* [n] chunk x 4 + ActKind */
  double held[3];           /* the peak held activations per recomputation (plan_fast.c's held_chunks) */
} SimPlan;
typedef struct {
  SimPlan *p;               /* sorted by (kind, p, v, m) */
  int n;
} SimPlans;
/* The distinct schedules of cs[0..n) (pp > 1, at most 256 chunks), built on every thread;
   held[k] with rcm[k] a chunk between F and B, w[k] between B and W.  1 when out of memory. */
int sim_plans_build(SimPlans *all, const Cand *cs, int n, const double rcm[3], const double w[3]);
void sim_plans_free(SimPlans *all);
const SimPlan *sim_plan_find(const SimPlans *all, int kind, int p, int v, int m);
/* The makespan of sp (ok) with cost[chunk][ActKind] (as schedule_simulate takes them), or -1
   where schedule_simulate would refuse it (an end below 0); end: scratch of sp->n. */
double sim_plan_makespan(const SimPlan *sp, const double (*cost)[3], double *end);

int cmp_step(const void *a, const void *b);
int threads_to_use(void);

#endif
