/* runtime/comm/comm_engine.c — a rank's communication thread (comm.h): collectives run
 * there, in submission order, while the rank's own thread computes.
 *
 * The queue is a ring of COMM_RING jobs.  Jobs complete in ticket order (one thread runs
 * them one after another), so "job t is done" is "done > t", one counter under one mutex.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/comm/comm.h"

#define COMM_RING 4096

typedef struct {
  CommJobFn fn;
  void *arg;
  double begin, end;
} Job;

struct CommEngine {
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t work, done_cv;
  Job ring[COMM_RING];
  int64_t submitted, done;   /* tickets [done, submitted) are queued or running */
  bool stop;
  int rc;                    /* the first failure, of job failed_at */
  int64_t failed_at;
  char err[1024];
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *engine_main(void *arg) {
  CommEngine *e = arg;
  pthread_mutex_lock(&e->mu);
  for (;;) {
    while (e->done == e->submitted && !e->stop) pthread_cond_wait(&e->work, &e->mu);
    if (e->done == e->submitted) break;   /* stopped, nothing left */
    Job *j = &e->ring[e->done % COMM_RING];
    int failed = e->rc;
    pthread_mutex_unlock(&e->mu);
    char msg[1024] = "";
    j->begin = now_s();
    int rc = failed ? 0 : j->fn(j->arg, msg, sizeof msg);
    j->end = now_s();
    pthread_mutex_lock(&e->mu);
    if (rc && !e->rc) {
      e->rc = rc;
      e->failed_at = e->done;
      snprintf(e->err, sizeof e->err, "%s", msg);
    }
    e->done++;
    pthread_cond_broadcast(&e->done_cv);
  }
  pthread_mutex_unlock(&e->mu);
  return NULL;
}

CommEngine *comm_engine_new(char *err, size_t errlen) {
  CommEngine *e = calloc(1, sizeof *e);
  if (!e) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->work, NULL);
  pthread_cond_init(&e->done_cv, NULL);
  if (pthread_create(&e->thread, NULL, engine_main, e)) {
    snprintf(err, errlen, "cannot start a communication thread");
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->work);
    pthread_cond_destroy(&e->done_cv);
    free(e);
    return NULL;
  }
  return e;
}

int64_t comm_engine_submit(CommEngine *e, CommJobFn fn, void *arg) {
  pthread_mutex_lock(&e->mu);
  while (e->submitted - e->done >= COMM_RING && !e->stop) pthread_cond_wait(&e->done_cv, &e->mu);
  int64_t t = -1;
  if (!e->stop) {
    t = e->submitted++;
    e->ring[t % COMM_RING] = (Job){fn, arg, 0, 0};
    pthread_cond_signal(&e->work);
  }
  pthread_mutex_unlock(&e->mu);
  return t;
}

int comm_engine_wait(CommEngine *e, int64_t ticket, char *err, size_t errlen) {
  pthread_mutex_lock(&e->mu);
  if (ticket < 0 || ticket >= e->submitted) {
    pthread_mutex_unlock(&e->mu);
    snprintf(err, errlen, "waits for collective #%lld, which was never started", (long long)ticket);
    return 1;
  }
  while (e->done <= ticket) pthread_cond_wait(&e->done_cv, &e->mu);
  int rc = e->rc && e->failed_at <= ticket ? e->rc : 0;   /* jobs before the failure did their work */
  if (rc) snprintf(err, errlen, "%s", e->err);
  pthread_mutex_unlock(&e->mu);
  return rc;
}

void comm_engine_job_times(const CommEngine *e, int64_t ticket, double *begin, double *end) {
  *begin = *end = 0;
  CommEngine *m = (CommEngine *)e;
  pthread_mutex_lock(&m->mu);
  if (ticket >= 0 && ticket < e->done && e->submitted - ticket <= COMM_RING) {
    *begin = e->ring[ticket % COMM_RING].begin;
    *end = e->ring[ticket % COMM_RING].end;
  }
  pthread_mutex_unlock(&m->mu);
}

void comm_engine_free(CommEngine *e) {
  if (!e) return;
  pthread_mutex_lock(&e->mu);
  e->stop = true;
  pthread_cond_broadcast(&e->work);
  pthread_cond_broadcast(&e->done_cv);
  pthread_mutex_unlock(&e->mu);
  pthread_join(e->thread, NULL);
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->work);
  pthread_cond_destroy(&e->done_cv);
  free(e);
}
