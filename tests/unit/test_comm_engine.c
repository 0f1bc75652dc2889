/* tests/unit/test_comm_engine.c — runtime/comm/comm_engine.c, a rank's communication thread:
 *   - jobs run in submission order on the engine's thread (not the caller's), and waiting for
 *     ticket t returns once job t is done, in any order of waits;
 *   - a failing job's code and message reach its wait and every later wait, and later jobs
 *     are not run;
 *   - two ranks of a LocalWorld all-reduce through their engines while their own threads go
 *     on: the sums are bitwise those of the synchronous all-reduce, over many rounds;
 *   - a wait for a ticket never submitted is an error, not a hang; more jobs than the ring
 *     holds are taken (submit waits for room).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm.h"

#include "tests/unit/check.h"

/* ---- order, threads, failures ---- */

typedef struct {
  int *log, *n;       /* the order jobs ran in */
  int id;
  pthread_t caller;
  bool on_other_thread;
  int fail;           /* return this (with a message) */
} OrderJob;

static int order_job(void *arg, char *err, size_t errlen) {
  OrderJob *j = arg;
  j->log[(*j->n)++] = j->id;   /* only the engine's one thread writes */
  j->on_other_thread = !pthread_equal(pthread_self(), j->caller);
  if (j->fail) snprintf(err, errlen, "job %d failed on purpose", j->id);
  return j->fail;
}

static void test_order(void) {
  char err[256];
  CommEngine *e = comm_engine_new(err, sizeof err);
  check(e != NULL, "engine: %s", err);
  if (!e) return;
  enum { N = 64 };
  int log[N], n = 0;
  OrderJob jobs[N];
  int64_t t[N];
  for (int i = 0; i < N; i++) {
    jobs[i] = (OrderJob){log, &n, i, pthread_self(), false, 0};
    t[i] = comm_engine_submit(e, order_job, &jobs[i]);
  }
  /* wait in reverse: the last one implies all */
  int rc = 0;
  for (int i = N - 1; i >= 0; i--) rc |= comm_engine_wait(e, t[i], err, sizeof err);
  check(rc == 0, "waits succeed");
  bool in_order = n == N, other = true;
  for (int i = 0; i < N && in_order; i++) in_order = log[i] == i && t[i] == i;
  for (int i = 0; i < N; i++) other &= jobs[i].on_other_thread;
  check(in_order, "jobs run in submission order (%d ran)", n);
  check(other, "jobs run on the engine's thread, not the caller's");
  check(comm_engine_wait(e, 1000, err, sizeof err) != 0 && strstr(err, "never started"),
        "a wait for a ticket never submitted fails: %s", err);
  comm_engine_free(e);
}

static void test_failure(void) {
  char err[256];
  CommEngine *e = comm_engine_new(err, sizeof err);
  if (!e) return;
  int log[8], n = 0;
  OrderJob a = {log, &n, 0, pthread_self(), false, 0}, b = {log, &n, 1, pthread_self(), false, 1},
           c = {log, &n, 2, pthread_self(), false, 0};
  int64_t ta = comm_engine_submit(e, order_job, &a), tb = comm_engine_submit(e, order_job, &b),
          tc = comm_engine_submit(e, order_job, &c);
  check(comm_engine_wait(e, ta, err, sizeof err) == 0, "the job before the failure succeeds");
  err[0] = 0;
  int rb = comm_engine_wait(e, tb, err, sizeof err);
  check(rb == 1 && strstr(err, "job 1 failed on purpose"), "the failure reaches its wait: %d '%s'", rb, err);
  err[0] = 0;
  int rc = comm_engine_wait(e, tc, err, sizeof err);
  check(rc == 1 && strstr(err, "job 1 failed"), "and every later wait: %d '%s'", rc, err);
  check(n == 2, "jobs after the failure do not run (%d ran)", n);
  comm_engine_free(e);
}

static int count_job(void *arg, char *err, size_t errlen) {
  (void)err, (void)errlen;
  (*(int *)arg)++;
  return 0;
}

static void test_many(void) {
  char err[256];
  CommEngine *e = comm_engine_new(err, sizeof err);
  if (!e) return;
  int count = 0;
  int64_t last = -1;
  for (int i = 0; i < 10000; i++) last = comm_engine_submit(e, count_job, &count);   /* more than the ring */
  check(comm_engine_wait(e, last, err, sizeof err) == 0 && count == 10000, "10000 jobs run (%d)", count);
  comm_engine_free(e);
}

/* ---- all-reduce through the engines of two ranks ---- */

typedef struct {
  Comm *c;
  float *buf;
  int64_t n;
} ArJob;

static int ar_job(void *arg, char *err, size_t errlen) {
  ArJob *j = arg;
  int rc = j->c->all_reduce(j->c, COMM_DP, j->buf, j->n, false);
  if (rc) snprintf(err, errlen, "all_reduce failed");
  return rc;
}

enum { ROUNDS = 50, LEN = 1000 };

typedef struct {
  LocalWorld *w;
  int rank;
  bool async;
  float out[ROUNDS][LEN];
  int rc;
} RankRun;

static float value(int rank, int round, int k) { return (float)((rank * 7919 + round * 104729 + k * 31) % 1000) * 1e-3f + 0.1f * rank; }

static void *rank_main(void *arg) {
  RankRun *r = arg;
  Comm *c = local_world_rank(r->w, r->rank);
  char err[256];
  CommEngine *e = r->async ? comm_engine_new(err, sizeof err) : NULL;
  if (r->async && !e) {
    r->rc = 1;
    return NULL;
  }
  static ArJob jobs[2][ROUNDS];
  int64_t t[ROUNDS];
  for (int i = 0; i < ROUNDS; i++) {
    for (int k = 0; k < LEN; k++) r->out[i][k] = value(r->rank, i, k);
    if (!r->async) {
      r->rc |= c->all_reduce(c, COMM_DP, r->out[i], LEN, false);
      continue;
    }
    jobs[r->rank][i] = (ArJob){c, r->out[i], LEN};
    t[i] = comm_engine_submit(e, ar_job, &jobs[r->rank][i]);
    volatile float busy = 0;   /* the rank's own work while the collectives run */
    for (int k = 0; k < 2000; k++) busy += (float)k;
  }
  for (int i = ROUNDS - 1; r->async && i >= 0; i--) r->rc |= comm_engine_wait(e, t[i], err, sizeof err);
  comm_engine_free(e);
  return NULL;
}

static void run_world(RankRun *runs, bool async) {
  int64_t mesh[COMM_AXES] = {2, 1, 1, 1, 1};
  char err[256];
  LocalWorld *w = local_world_new(mesh, err, sizeof err);
  if (!w) {
    check(false, "local world: %s", err);
    return;
  }
  pthread_t th[2];
  for (int r = 0; r < 2; r++) {
    runs[r].w = w;
    runs[r].rank = r;
    runs[r].async = async;
    runs[r].rc = 0;
    pthread_create(&th[r], NULL, rank_main, &runs[r]);
  }
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  local_world_free(w);
}

static void test_all_reduce(void) {
  static RankRun sync_runs[2], async_runs[2];
  run_world(sync_runs, false);
  run_world(async_runs, true);
  check(!sync_runs[0].rc && !sync_runs[1].rc && !async_runs[0].rc && !async_runs[1].rc, "all-reduces succeed");
  bool same = true;
  for (int r = 0; r < 2; r++) same &= !memcmp(sync_runs[r].out, async_runs[r].out, sizeof sync_runs[r].out);
  check(same, "%d all-reduces through the engines are bitwise the synchronous ones on both ranks", ROUNDS);
  bool summed = true;
  for (int i = 0; i < ROUNDS; i++)
    for (int k = 0; k < LEN; k++) summed &= async_runs[0].out[i][k] == value(0, i, k) + value(1, i, k);
  check(summed, "and are the sums");
}

int main(void) {
  test_order();
  test_failure();
  test_many();
  test_all_reduce();
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
