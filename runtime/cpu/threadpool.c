/* runtime/cpu/threadpool.c — see threadpool.h.
 *
 * One job at a time: the caller publishes the job and bumps a generation counter; workers
 * notice it (spinning briefly first, since steps of a training program follow each other
 * within microseconds, then sleeping on a condition variable so an idle pool costs no
 * CPU), run their part, and count down `pending`.  The caller runs part 0 itself.
 */
#include "runtime/cpu/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

/* Polling before a thread sleeps: TP_SPIN checks, each TP_YIELD-th one after a
   sched_yield, so that a waiting thread hands its core over when the machine has fewer free
   cores than threads (else a spinning waiter delays the very thread it waits for until the
   scheduler preempts it). */
#define TP_SPIN 4096
#define TP_YIELD 64

static void spin_pause(int i) {
  if (i % TP_YIELD == TP_YIELD - 1) sched_yield();
}

typedef void (*TpFn)(void *ctx, int thread, int64_t begin, int64_t end);
typedef void (*TpPlainFn)(void *ctx, int64_t begin, int64_t end);

struct ThreadPool {
  int n;
  pthread_t *threads;
  int n_started;
  pthread_mutex_t mu;
  pthread_cond_t work_cv, done_cv;
  _Atomic uint64_t gen;
  atomic_int pending;
  atomic_bool busy;
  bool stop;
  /* the current job */
  int64_t items, grain;
  bool dynamic;
  TpFn fn;
  TpPlainFn plain;
  void *ctx;
  _Atomic int64_t next;
};

static void call(ThreadPool *tp, int thread, int64_t b, int64_t e) {
  if (tp->plain) tp->plain(tp->ctx, b, e);
  else tp->fn(tp->ctx, thread, b, e);
}

static void run_part(ThreadPool *tp, int thread) {
  if (!tp->dynamic) {
    int64_t b = tp->items * thread / tp->n, e = tp->items * (thread + 1) / tp->n;
    if (e > b) call(tp, thread, b, e);
    return;
  }
  for (;;) {
    int64_t b = atomic_fetch_add(&tp->next, tp->grain);
    if (b >= tp->items) break;
    int64_t e = b + tp->grain < tp->items ? b + tp->grain : tp->items;
    call(tp, thread, b, e);
  }
}

typedef struct {
  ThreadPool *tp;
  int id;
} WorkerArg;

static void *worker(void *arg) {
  WorkerArg *wa = arg;
  ThreadPool *tp = wa->tp;
  int id = wa->id;
  free(wa);
  uint64_t seen = 0;
  for (;;) {
    for (int i = 0; i < TP_SPIN && atomic_load(&tp->gen) == seen; i++) spin_pause(i);
    if (atomic_load(&tp->gen) == seen) {
      pthread_mutex_lock(&tp->mu);
      while (atomic_load(&tp->gen) == seen && !tp->stop) pthread_cond_wait(&tp->work_cv, &tp->mu);
      pthread_mutex_unlock(&tp->mu);
    }
    if (atomic_load(&tp->gen) == seen) return NULL;   /* woken to stop */
    seen = atomic_load(&tp->gen);
    run_part(tp, id);
    if (atomic_fetch_sub(&tp->pending, 1) == 1) {
      pthread_mutex_lock(&tp->mu);
      pthread_cond_signal(&tp->done_cv);
      pthread_mutex_unlock(&tp->mu);
    }
  }
}

ThreadPool *tp_new(int n_threads) {
  if (n_threads <= 0) {
    const char *env = getenv("LOOM_THREADS");
    long v = env ? strtol(env, NULL, 10) : 0;
    if (v <= 0) v = sysconf(_SC_NPROCESSORS_ONLN);
    n_threads = v > 0 ? (v > 1024 ? 1024 : (int)v) : 1;
  }
  ThreadPool *tp = calloc(1, sizeof *tp);
  if (!tp) return NULL;
  tp->n = n_threads;
  pthread_mutex_init(&tp->mu, NULL);
  pthread_cond_init(&tp->work_cv, NULL);
  pthread_cond_init(&tp->done_cv, NULL);
  if (n_threads > 1) {
    tp->threads = calloc((size_t)n_threads - 1, sizeof(pthread_t));
    if (!tp->threads) {
      tp_free(tp);
      return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
      WorkerArg *wa = malloc(sizeof *wa);
      if (!wa) {
        tp_free(tp);
        return NULL;
      }
      wa->tp = tp;
      wa->id = i;
      if (pthread_create(&tp->threads[i - 1], NULL, worker, wa)) {
        free(wa);
        tp_free(tp);
        return NULL;
      }
      tp->n_started++;
    }
  }
  return tp;
}

void tp_free(ThreadPool *tp) {
  if (!tp) return;
  pthread_mutex_lock(&tp->mu);
  tp->stop = true;
  pthread_cond_broadcast(&tp->work_cv);
  pthread_mutex_unlock(&tp->mu);
  for (int i = 0; i < tp->n_started; i++) pthread_join(tp->threads[i], NULL);
  pthread_mutex_destroy(&tp->mu);
  pthread_cond_destroy(&tp->work_cv);
  pthread_cond_destroy(&tp->done_cv);
  free(tp->threads);
  free(tp);
}

int tp_size(const ThreadPool *tp) { return tp ? tp->n : 1; }

static void run(ThreadPool *tp, int64_t n, int64_t grain, bool dynamic, TpFn fn, TpPlainFn plain, void *ctx) {
  if (n <= 0) return;
  bool was_busy = tp ? atomic_exchange(&tp->busy, true) : true;
  if (!tp || tp->n == 1 || was_busy || (dynamic ? n <= grain : n == 1)) {
    /* Inline: one thread, a nested call, or a single chunk.  Chunks of the same shape as
       the parallel run would use are not needed: results never depend on the chunking. */
    if (plain) plain(ctx, 0, n);
    else fn(ctx, 0, 0, n);
    if (tp && !was_busy) atomic_store(&tp->busy, false);
    return;
  }
  tp->items = n;
  tp->grain = grain > 0 ? grain : 1;
  tp->dynamic = dynamic;
  tp->fn = fn;
  tp->plain = plain;
  tp->ctx = ctx;
  atomic_store(&tp->next, 0);
  atomic_store(&tp->pending, tp->n - 1);
  pthread_mutex_lock(&tp->mu);
  atomic_fetch_add(&tp->gen, 1);
  pthread_cond_broadcast(&tp->work_cv);
  pthread_mutex_unlock(&tp->mu);
  run_part(tp, 0);
  for (int i = 0; i < TP_SPIN && atomic_load(&tp->pending) > 0; i++) spin_pause(i);
  if (atomic_load(&tp->pending) > 0) {
    pthread_mutex_lock(&tp->mu);
    while (atomic_load(&tp->pending) > 0) pthread_cond_wait(&tp->done_cv, &tp->mu);
    pthread_mutex_unlock(&tp->mu);
  }
  atomic_store(&tp->busy, false);
}

void tp_run(ThreadPool *tp, int64_t n, void (*fn)(void *ctx, int64_t begin, int64_t end), void *ctx) {
  run(tp, n, 0, false, NULL, fn, ctx);
}

void tp_run_static(ThreadPool *tp, int64_t n, void (*fn)(void *ctx, int thread, int64_t begin, int64_t end),
                   void *ctx) {
  run(tp, n, 0, false, fn, NULL, ctx);
}

void tp_run_dynamic(ThreadPool *tp, int64_t n, int64_t grain,
                    void (*fn)(void *ctx, int thread, int64_t begin, int64_t end), void *ctx) {
  run(tp, n, grain, true, fn, NULL, ctx);
}
