/* runtime/cpu/cpu_gemm.h — f32 GEMMs on the CPU whose bits do not depend on the thread count.
 *
 * OpenBLAS, left to thread a GEMM itself, cuts the work by its thread count, and with some
 * of its kernels (Zen's, in Debian's OpenBLAS 0.3.21) the cut changes the last bits of the
 * result: [64,64]x[64,256]^T, 128^3 or [2048,256]x[256,768] differ between 1 and 2 threads.
 * So loom never lets OpenBLAS thread.  cpu_gemm cuts C into tiles whose shape is a function
 * of (M, N, K) alone (cpu_gemm_tiles), and loom's own pool runs each tile as one
 * single-threaded cblas_sgemm over the whole K.  Every element of C is then computed by the
 * same call (same tile shape, same operands, same kernel, same summation order) whichever
 * thread runs it and however many there are: the result is bitwise the same for any thread
 * count, on any CPU.  (Across CPU models it is not: OpenBLAS picks its kernels by CPU; see
 * README "Determinism".)
 *
 * The tiles: 512 x 256 (or the whole dimension where it is smaller), halved along the longer
 * side while there are fewer than 8 tiles and a tile holds more than 2 MFLOP, never below 64
 * rows or columns.  Splitting C along M makes each tile pack B again, along N pack A again,
 * and each call has its own edges: on one thread the tiles cost 3-6% more GEMM time than one
 * call over C (512 x 256 the least of the shapes tried), on two they run as fast as
 * OpenBLAS's own two threads (bench/README.md, 2026-11-24).
 */
#ifndef LOOM_RUNTIME_CPU_GEMM_H
#define LOOM_RUNTIME_CPU_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/cpu/threadpool.h"

typedef struct {
  int64_t tm, tn;     /* tile rows and columns (the last tile of a row or column may be smaller) */
  int64_t ntm, ntn;   /* tiles along M and N */
} CpuGemmTiles;

CpuGemmTiles cpu_gemm_tiles(int64_t M, int64_t N, int64_t K);

/* C[b] = op(A[b]) op(B[b]) for b < batch, row-major; op(A) is [M,K] (A stored [K,M] when
   ta), op(B) is [K,N] (B stored [N,K] when tb).  sa, sb, sc: element strides between
   batches (0: one matrix shared by every batch).  K == 0 writes zeros.  Sizes must fit
   int32 (as cblas's do); runtime/cpu/cpu_exec.c checks that when a program is loaded. */
void cpu_gemm(ThreadPool *tp, int64_t batch, int64_t M, int64_t N, int64_t K, bool ta, bool tb, const float *A,
              int64_t sa, const float *B, int64_t sb, float *C, int64_t sc);

/* Sets OpenBLAS's (process-wide) thread count to 1; cpu_gemm calls it when it finds another
   count.  Idempotent and cheap. */
void cpu_gemm_blas_single(void);

#endif
