/* runtime/cpu/threadpool.h — a small pthread pool for splitting one loop across cores.
 *
 * The pool is an object the caller creates (no process-global state).  The calling thread
 * takes part in every run as thread 0, so a pool of n threads starts n-1 workers, and a
 * pool of 1 runs everything inline.
 *
 * Determinism: the runtime's kernels are written so that what an index computes never
 * depends on which thread runs it or on how [0,n) was cut (no cross-chunk reductions
 * whose order depends on the chunking), so results are bitwise the same for any thread
 * count.  The chunking itself is deterministic too: tp_run gives thread k the contiguous
 * range [n*k/T, n*(k+1)/T).
 *
 * A pool runs one loop at a time: tp_run must not be called from two threads at once.  A
 * call from inside a running loop (nesting) runs inline on the calling thread, and its fn
 * is told thread 0: code that keeps per-thread scratch must not nest.
 */
#ifndef LOOM_RUNTIME_THREADPOOL_H
#define LOOM_RUNTIME_THREADPOOL_H

#include <stdint.h>

typedef struct ThreadPool ThreadPool;

/* n_threads <= 0: the LOOM_THREADS environment variable if set to a positive number, else
   the number of online CPUs.  Returns NULL when out of memory or threads (the caller may
   fall back to tp_new(1), which starts no thread). */
ThreadPool *tp_new(int n_threads);
void tp_free(ThreadPool *tp);
int tp_size(const ThreadPool *tp);

/* Runs fn over [0, n): thread k gets the one contiguous chunk [n*k/T, n*(k+1)/T) (empty
   chunks are not called).  Returns when every chunk is done. */
void tp_run(ThreadPool *tp, int64_t n, void (*fn)(void *ctx, int64_t begin, int64_t end), void *ctx);

/* Same, but threads take chunks of `grain` indices in turn from a shared counter (load
   balance for uneven work, e.g. causal attention), and fn is told which thread runs it
   (0 <= thread < tp_size) so it can use per-thread scratch.  Which thread gets which
   chunk varies between runs: fn must compute each index independently of that. */
void tp_run_dynamic(ThreadPool *tp, int64_t n, int64_t grain,
                    void (*fn)(void *ctx, int thread, int64_t begin, int64_t end), void *ctx);

/* Static chunks as tp_run, with the thread index (per-thread scratch). */
void tp_run_static(ThreadPool *tp, int64_t n, void (*fn)(void *ctx, int thread, int64_t begin, int64_t end),
                   void *ctx);

#endif
