/* tests/cuda_emu/emu.h — CUDA device code on the host, for tests without a GPU.
 *
 * The fake NVRTC (fake_nvrtc.c) compiles loom's CUDA translation unit with g++ and this
 * header forced in front of it, into a shared object that the fake driver (fake_cuda.c)
 * loads as the "module".  A launch runs every block of the grid in turn; the threads of a
 * block are fibers on one OS thread, each running the kernel function until it finishes or
 * waits at a barrier:
 *   __syncthreads (and _or)         every live thread of the block arrives; exited threads
 *                                   count as arrived (as on sm_70+)
 *   __syncwarp, __shfl_xor_sync,    every live lane of the warp arrives; a warp op with a
 *   __ballot_sync, loom_emu_mma     lane that has exited is an error (undefined on a GPU)
 *   loom_emu_bar (bar.sync and      named barriers 1-15 with a thread count (PTX ISA
 *   bar.arrive a, b)                barrier.cta): the warp's lanes gather first (a warp with
 *                                   exited lanes is refused, as for the warp ops); each thread
 *                                   arrives once a phase; bar.sync waits until b threads have
 *                                   arrived at barrier a, bar.arrive does not wait; the b-th
 *                                   arrival completes the phase, releases its waiters and
 *                                   resets the barrier.  b a non-zero multiple of 32, at most
 *                                   the block's threads, the same for every arrival of a phase
 *                                   (the ISA's "same barrier name and thread count"); a
 *                                   thread's second arrival in one phase fails (the ISA:
 *                                   unpredictable before the reset).  Barrier 0 is
 *                                   __syncthreads's, emulated apart: refused with a count.
 * Fibers run in thread order (LOOM_EMU_ORDER=reverse runs them backwards: a kernel that
 * depends on the order between barriers gives other results then).  A block that cannot go
 * on (threads waiting at different barriers) is reported as a deadlock, and the launch
 * fails.  Dynamic shared memory ends at a guard page and starts filled with 0xff bytes (NaN
 * floats), so reads of unwritten shared memory and overruns show.
 *
 * What this checks: the kernels' arithmetic, indexing, reductions, barriers and launch
 * shapes, and the runtime around them.  What it cannot: speed, registers, occupancy,
 * memory-model races the barriers do not order, PTX (inline assembly needs an emulated
 * twin: loom_emu_mma below).  It is a test double, not a GPU.
 */
#ifndef LOOM_CUDA_EMU_H
#define LOOM_CUDA_EMU_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define LOOM_EMU 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __shared__ static
#define __restrict__ __restrict
#define __grid_constant__
/* after the wrapper of a kernel whose second parameter is its tensor maps (LoomTmaps,
   kernels/attention_sm90.cuh): a symbol by which the fake driver knows to pass them */
#define LOOM_TMAP_KERNEL(name) extern "C" __attribute__((visibility("default"))) const int name##_loom_tmaps = 1;

struct LoomEmuDim3 {
  unsigned x, y, z;
};
static LoomEmuDim3 threadIdx, blockIdx, blockDim, gridDim;

/* ------------------------------------------------------------------ arithmetic */
static inline float __int_as_float(int i) {
  float f;
  __builtin_memcpy(&f, &i, 4);
  return f;
}
static inline float __uint_as_float(unsigned i) {
  float f;
  __builtin_memcpy(&f, &i, 4);
  return f;
}
static inline unsigned __float_as_uint(float f) {
  unsigned i;
  __builtin_memcpy(&i, &f, 4);
  return i;
}
static inline int __float_as_int(float f) {
  int i;
  __builtin_memcpy(&i, &f, 4);
  return i;
}
/* Round-to-nearest IEEE operations: the host's, compiled with -ffp-contract=off. */
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float rsqrtf(float a) { return 1.0f / sqrtf(a); }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }

/* ------------------------------------------------------------------ the block scheduler */
namespace loom_emu {

enum { MAX_THREADS = 1024, STACK = 256 * 1024, MAX_SMEM = 232448 };
enum State { RUN, AT_BLOCK, AT_WARP, AT_NAMED, DONE };

struct Fiber {
  void *sp;
  State state;
  LoomEmuDim3 tid;
};

struct Warp {
  int arrived, lanes_live, lanes;
  uint64_t val[32];
  /* loom_emu_mma: the lanes' fragments */
  unsigned a[32][4], b[32][2];
  float c[32][4];
};

static Fiber fibers[MAX_THREADS];
static Warp warps[MAX_THREADS / 32];
static int n_threads, live, at_block, cur;
static int block_or, block_or_result;
/* named barriers (bar.sync / bar.arrive a, b): the phase's count (0: no arrival yet), its
   arrivals, and which threads have arrived in it */
struct Named {
  int count, arrived;
  unsigned char in[MAX_THREADS];
};
static Named named[16];
static void *sched_sp;
static char *stacks;                 /* MAX_THREADS stacks, each above a guard page */
static unsigned char *smem_map;      /* dynamic shared memory, a guard page after it */
static size_t smem_map_bytes;
static unsigned char *dyn_smem;      /* this launch's dynamic shared memory */
static void (*invoke)(void *fn, void *arg);   /* calls the kernel with its argument */
static void *kernel_fn, *kernel_arg;
static char error[512];
static int reverse_order;
/* sm_90 state (emu_sm90.h): a thread that found an mbarrier phase incomplete yields with
   spin_yield set; progress counts the mbarrier and copy events that can end such a wait */
static int spin_yield;
static unsigned long progress;
static void sm90_block_start();
static void sm90_block_end();
static void sm90_thread_exit();

extern "C" void loom_emu_switch(void **save_sp, void *to_sp);
__asm__(
    ".text\n"
    ".globl loom_emu_switch\n"
    ".hidden loom_emu_switch\n"
    ".type loom_emu_switch,@function\n"
    "loom_emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size loom_emu_switch, .-loom_emu_switch\n");

static void fail(const char *fmt, const char *what) {
  if (!error[0]) snprintf(error, sizeof error, fmt, what);
}

/* Back to the scheduler; returns when the scheduler runs this fiber again. */
static void yield() { loom_emu_switch(&fibers[cur].sp, sched_sp); }

static void release_block() {
  for (int t = 0; t < n_threads; t++)
    if (fibers[t].state == AT_BLOCK) fibers[t].state = RUN;
  at_block = 0;
  block_or_result = block_or;
  block_or = 0;
}

static void release_warp(int w) {
  for (int t = w * 32; t < n_threads && t < w * 32 + 32; t++)
    if (fibers[t].state == AT_WARP) fibers[t].state = RUN;
  warps[w].arrived = 0;
}

static void fiber_main() {
  invoke(kernel_fn, kernel_arg);
  Fiber *f = &fibers[cur];
  f->state = DONE;
  live--;
  warps[cur / 32].lanes_live--;
  if (at_block > 0 && at_block == live) release_block();
  Warp *w = &warps[cur / 32];
  if (w->arrived > 0) fail("%s: a lane exited while the rest of its warp waits in a warp operation", "warp");
  sm90_thread_exit();
  loom_emu_switch(&f->sp, sched_sp);
  abort();   /* never resumed */
}

static void *fiber_stack_top(int t) {
  /* 16-aligned top, less 8: at fiber_main's entry rsp + 8 is 16-aligned, as after a call.
     Each top lower by a different multiple of 64 bytes (under 64 KiB): tops STACK apart would
     all fall in the same cache sets, and a block's threads, run one after another, would
     evict each other's frames at every switch. */
  char *top = stacks + (size_t)(t + 1) * STACK - (size_t)((unsigned)t * 613u % 1024u) * 64;
  void **sp = (void **)(top - 8);
  *--sp = (void *)fiber_main;      /* loom_emu_switch's ret */
  for (int r = 0; r < 6; r++) *--sp = 0;   /* rbp rbx r12 r13 r14 r15 */
  return sp;
}

static int init() {
  if (stacks) return 0;
  size_t bytes = (size_t)MAX_THREADS * STACK;
  void *s = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (s == MAP_FAILED) return 1;
  for (int t = 0; t < MAX_THREADS; t++) mprotect((char *)s + (size_t)t * STACK, 4096, PROT_NONE);
  smem_map_bytes = (MAX_SMEM + 4095) / 4096 * 4096 + 4096;
  void *m = mmap(NULL, smem_map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return 1;
  mprotect((char *)m + smem_map_bytes - 4096, 4096, PROT_NONE);
  stacks = (char *)s;
  smem_map = (unsigned char *)m;
  const char *o = getenv("LOOM_EMU_ORDER");
  reverse_order = o && !strcmp(o, "reverse");
  return 0;
}

static int run_block(int nthreads) {
  n_threads = live = nthreads;
  at_block = 0;
  block_or = block_or_result = 0;
  for (int b = 0; b < 16; b++)
    if (named[b].count) named[b].count = named[b].arrived = 0, memset(named[b].in, 0, sizeof named[b].in);
  for (int w = 0; w < (nthreads + 31) / 32; w++) {
    warps[w].arrived = 0;
    warps[w].lanes = warps[w].lanes_live = nthreads - w * 32 < 32 ? nthreads - w * 32 : 32;
  }
  for (int t = 0; t < nthreads; t++) {
    Fiber *f = &fibers[t];
    f->state = RUN;
    f->tid.x = (unsigned)t % blockDim.x;
    f->tid.y = (unsigned)t / blockDim.x % blockDim.y;
    f->tid.z = (unsigned)t / (blockDim.x * blockDim.y);
    f->sp = fiber_stack_top(t);
  }
  sm90_block_start();
  while (live > 0 && !error[0]) {
    int ran = 0, busy = 0;
    const unsigned long progress0 = progress;
    for (int k = 0; k < nthreads && !error[0]; k++) {
      int t = reverse_order ? nthreads - 1 - k : k;
      if (fibers[t].state != RUN) continue;
      cur = t;
      threadIdx = fibers[t].tid;
      spin_yield = 0;
      loom_emu_switch(&sched_sp, fibers[t].sp);
      ran++;
      busy += !spin_yield;
    }
    /* every thread that ran only found its mbarrier phase incomplete, and nothing changed */
    int nb = 0, nw = 0, nn = 0;
    if (((ran && !busy && progress == progress0) || (!ran && live > 0)) && !error[0])
      for (int t = 0; t < nthreads; t++)
        nb += fibers[t].state == AT_BLOCK, nw += fibers[t].state == AT_WARP, nn += fibers[t].state == AT_NAMED;
    if (ran && !busy && progress == progress0 && !error[0])
      snprintf(error, sizeof error,
               "deadlock in block (%u,%u,%u): %d threads wait on mbarrier phases that cannot complete, %d at named "
               "barriers (%d of %d threads live)",
               blockIdx.x, blockIdx.y, blockIdx.z, ran, nn, live, nthreads);
    if (!ran && live > 0 && !error[0]) {
      char nb_at[200] = "";   /* the named barriers' arrivals */
      for (int b = 1, n = 0; b < 16; b++)
        if (named[b].count && n < (int)sizeof nb_at - 40)
          n += snprintf(nb_at + n, sizeof nb_at - n, "%s%d: %d of %d", n ? ", " : " (barrier ", b, named[b].arrived,
                        named[b].count);
      if (nb_at[0]) strcat(nb_at, " arrived)");
      snprintf(error, sizeof error,
               "deadlock in block (%u,%u,%u): %d threads wait at __syncthreads, %d at a warp operation and %d at "
               "named barriers%s (%d of %d threads live)",
               blockIdx.x, blockIdx.y, blockIdx.z, nb, nw, nn, nb_at, live, nthreads);
    }
  }
  if (!error[0]) sm90_block_end();
  return error[0] ? 1 : 0;
}

/* Every lane of the current warp arrives; returns when all have. */
static void warp_barrier(const char *what) {
  Warp *w = &warps[cur / 32];
  if (w->lanes_live != w->lanes) {
    fail("%s with lanes of the warp exited (undefined on a GPU)", what);
    yield();
    return;
  }
  fibers[cur].state = AT_WARP;
  if (++w->arrived == w->lanes_live) release_warp(cur / 32);
  yield();
}

}  // namespace loom_emu

/* A launch of fn(arg) (through call): 0, or 1 with a message in err.  emu_tail.h exports
   it for the fake driver, typed by the translation unit's LoomArgs. */
static int loom_emu_launch_with(void (*call)(void *, void *), void *fn, void *arg, const unsigned grid[3],
                                const unsigned block[3], unsigned smem, char *err, size_t errlen) {
  using namespace loom_emu;
  error[0] = 0;
  unsigned nthreads = block[0] * block[1] * block[2];
  if (init()) {
    snprintf(err, errlen, "the emulator could not map its stacks");
    return 1;
  }
  if (nthreads == 0 || nthreads > MAX_THREADS || smem > MAX_SMEM) {
    snprintf(err, errlen, "launch of %u threads with %u bytes of shared memory: out of the device's limits", nthreads, smem);
    return 1;
  }
  blockDim = LoomEmuDim3{block[0], block[1], block[2]};
  gridDim = LoomEmuDim3{grid[0], grid[1], grid[2]};
  size_t sb = (smem + 15) / 16 * 16;
  dyn_smem = smem_map + smem_map_bytes - 4096 - sb;
  invoke = call;
  kernel_fn = fn;
  kernel_arg = arg;
  for (unsigned z = 0; z < grid[2]; z++)
    for (unsigned y = 0; y < grid[1]; y++)
      for (unsigned x = 0; x < grid[0]; x++) {
        blockIdx = LoomEmuDim3{x, y, z};
        memset(dyn_smem, 0xff, sb);
        if (run_block((int)nthreads)) {
          snprintf(err, errlen, "block (%u,%u,%u): %s", x, y, z, error);
          return 1;
        }
      }
  return 0;
}

static inline void *loom_emu_dyn_smem() { return loom_emu::dyn_smem; }

/* LOOM_CHECK_ALIGN of the prelude: a wide access at an address that is not a multiple of its
   size faults on a GPU. */
static inline void loom_emu_check_align(const void *p, unsigned n, const char *what) {
  if ((uintptr_t)p % n == 0) return;
  char msg[200];
  snprintf(msg, sizeof msg, "a %u-byte access at %p (%.100s), not %u-byte aligned: a misaligned-address fault on a GPU",
           n, p, what, n);
  loom_emu::fail("%s", msg);
}

/* ------------------------------------------------------------------ atomics and fences
   Blocks run one after another and a block's threads one at a time: an atomic is a plain
   read-modify-write, a fence orders nothing that is not already ordered. */
static inline unsigned atomicAdd(unsigned *p, unsigned v) {
  unsigned old = *p;
  *p = old + v;
  return old;
}
static inline void __threadfence() {}

/* ------------------------------------------------------------------ barriers and warp ops */
static inline void __syncthreads() {
  using namespace loom_emu;
  fibers[cur].state = AT_BLOCK;
  if (++at_block == live) release_block();
  yield();
}
static inline int __syncthreads_or(int pred) {
  using namespace loom_emu;
  block_or |= pred != 0;
  __syncthreads();
  return block_or_result;
}
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
  (void)mask;
  loom_emu::warp_barrier("__syncwarp");
}

/* bar.sync a, b (wait) and bar.arrive a, b: named barrier a (1-15), b threads (the header says
   what is checked) */
static inline void loom_emu_bar(unsigned id, unsigned count, bool wait) {
  using namespace loom_emu;
  const char *what = wait ? "bar.sync" : "bar.arrive";
  char msg[200];
  msg[0] = 0;
  if (id == 0 || id > 15)
    snprintf(msg, sizeof msg, "%s %u, %u: barrier id not in 1-15 (0 is __syncthreads's, emulated apart)", what, id, count);
  else if (count == 0 || count % 32 || count > (unsigned)(n_threads + 31) / 32 * 32)
    snprintf(msg, sizeof msg, "%s %u, %u: thread count not a non-zero multiple of 32 within the block's %d threads", what,
             id, count, n_threads);
  if (msg[0]) {
    fail("%s", msg);
    yield();
    return;
  }
  warp_barrier(what);   /* the warp's lanes, then each arrives */
  Named *b = &named[id];
  if (b->count == 0) b->count = (int)count;
  else if (b->count != (int)count)
    snprintf(msg, sizeof msg, "%s %u, %u: this phase of the barrier was arrived at with thread count %d", what, id, count,
             b->count);
  else if (b->in[cur])
    snprintf(msg, sizeof msg, "%s %u, %u: thread %d arrives again before the barrier completed (unpredictable)", what, id,
             count, cur);
  if (msg[0]) {
    fail("%s", msg);
    yield();
    return;
  }
  b->in[cur] = 1;
  if (++b->arrived == b->count) {   /* complete: the waiters go on, the barrier resets */
    for (int t = 0; t < n_threads; t++)
      if (b->in[t] && fibers[t].state == AT_NAMED) fibers[t].state = RUN;
    b->count = b->arrived = 0;
    memset(b->in, 0, sizeof b->in);
    progress++;
    return;
  }
  if (wait) {
    fibers[cur].state = AT_NAMED;
    yield();
  }
}

template <class T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  using namespace loom_emu;
  (void)mask;
  (void)width;
  static_assert(sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
  Warp *w = &warps[cur / 32];
  int lane = cur % 32, src = lane ^ lane_mask;
  uint64_t bits = 0;
  __builtin_memcpy(&bits, &v, sizeof v);
  w->val[lane] = bits;
  warp_barrier("__shfl_xor_sync");
  if (src < w->lanes) bits = w->val[src];
  warp_barrier("__shfl_xor_sync");
  T r;
  __builtin_memcpy(&r, &bits, sizeof r);
  return r;
}
template <class T>
static inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  using namespace loom_emu;
  (void)mask;
  (void)width;
  Warp *w = &warps[cur / 32];
  int lane = cur % 32;
  uint64_t bits = 0;
  __builtin_memcpy(&bits, &v, sizeof v);
  w->val[lane] = bits;
  warp_barrier("__shfl_sync");
  if (src_lane >= 0 && src_lane < w->lanes) bits = w->val[src_lane];
  warp_barrier("__shfl_sync");
  T r;
  __builtin_memcpy(&r, &bits, sizeof r);
  return r;
}
static inline unsigned __ballot_sync(unsigned mask, int pred) {
  using namespace loom_emu;
  Warp *w = &warps[cur / 32];
  w->val[cur % 32] = pred != 0;
  warp_barrier("__ballot_sync");
  unsigned r = 0;
  for (int l = 0; l < w->lanes; l++)
    if (w->val[l]) r |= 1u << l;
  warp_barrier("__ballot_sync");
  return r & mask;
}

/* mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32, per the PTX ISA's
   fragment layouts (g = lane / 4, t = lane % 4; pairs are (low, high) halves of a register):
     A 16x16 row:  a0 (g, 2t..2t+1)  a1 (g+8, 2t..2t+1)  a2 (g, 2t+8..2t+9)  a3 (g+8, 2t+8..2t+9)
     B 16x8 col:   b0 (k 2t..2t+1, n g)   b1 (k 2t+8..2t+9, n g)
     C/D 16x8:     c0 c1 (g, 2t..2t+1)   c2 c3 (g+8, 2t..2t+1)
   bf16 when is_bf16, else f16.  Products and sums in f32 (the order on a GPU differs). */
static inline float loom_emu_half(unsigned h, bool is_bf16) {
  h &= 0xffffu;
  if (is_bf16) return __uint_as_float(h << 16);
  unsigned s = (h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 1023u;
  if (e == 0) {
    float v = (float)m * 5.9604644775390625e-8f;
    return s ? -v : v;
  }
  if (e == 31) return __uint_as_float(s | 0x7f800000u | (m << 13));
  return __uint_as_float(s | ((e + 112u) << 23) | (m << 13));
}
static inline void loom_emu_mma(float d[4], const unsigned a[4], const unsigned b[2], const float c[4], bool is_bf16) {
  using namespace loom_emu;
  Warp *w = &warps[cur / 32];
  int lane = cur % 32;
  for (int r = 0; r < 4; r++) w->a[lane][r] = a[r], w->c[lane][r] = c[r];
  w->b[lane][0] = b[0];
  w->b[lane][1] = b[1];
  warp_barrier("mma.sync");
  /* This lane's rows g, g + 8 of A (from lanes 4g..4g+3) and columns 2t, 2t + 1 of B (from
     lanes 4n..4n+3 for column n): the values the whole matrices would hold there */
  int g = lane / 4, t = lane % 4;
  float Ar[2][16], Bc[2][16];
  for (int u = 0; u < 4; u++)
    for (int h = 0; h < 2; h++) {
      const int l = 4 * g + u;
      Ar[0][2 * u + h] = loom_emu_half(w->a[l][0] >> (16 * h), is_bf16);
      Ar[1][2 * u + h] = loom_emu_half(w->a[l][1] >> (16 * h), is_bf16);
      Ar[0][2 * u + 8 + h] = loom_emu_half(w->a[l][2] >> (16 * h), is_bf16);
      Ar[1][2 * u + 8 + h] = loom_emu_half(w->a[l][3] >> (16 * h), is_bf16);
      for (int c = 0; c < 2; c++) {
        const int ln = 4 * (2 * t + c) + u;
        Bc[c][2 * u + h] = loom_emu_half(w->b[ln][0] >> (16 * h), is_bf16);
        Bc[c][2 * u + 8 + h] = loom_emu_half(w->b[ln][1] >> (16 * h), is_bf16);
      }
    }
  const int rows[4] = {0, 0, 1, 1}, cols[4] = {0, 1, 0, 1};
  float out[4];
  for (int r = 0; r < 4; r++) {
    float s = 0.0f;
    for (int k = 0; k < 16; k++) s += Ar[rows[r]][k] * Bc[cols[r]][k];
    out[r] = w->c[lane][r] + s;
  }
  warp_barrier("mma.sync");
  for (int r = 0; r < 4; r++) d[r] = out[r];
}

/* ldmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared.b16 (loom_ldsm_* in attention_tc.cuh):
   lanes 8m..8m+7 give the row addresses (16-byte aligned, 8 16-bit elements each) of
   matrix m; lane l receives in r[m] row l/4, elements 2(l%4) and 2(l%4)+1 of matrix m, or
   with trans those of the transposed matrix (rows 2(l%4) and 2(l%4)+1 of column l/4). */
static inline void loom_emu_ldmatrix(unsigned *r, int count, const void *row, bool trans) {
  using namespace loom_emu;
  Warp *w = &warps[cur / 32];
  int lane = cur % 32;
  loom_emu_check_align(row, 16, "ldmatrix row address");
  w->val[lane] = (uint64_t)(uintptr_t)row;
  warp_barrier("ldmatrix");
  int g = lane / 4, t = lane % 4;
  for (int m = 0; m < count; m++) {
    unsigned short e0, e1;
    if (!trans) {
      const unsigned short *p = (const unsigned short *)(uintptr_t)w->val[8 * m + g];
      e0 = p[2 * t], e1 = p[2 * t + 1];
    } else {
      e0 = ((const unsigned short *)(uintptr_t)w->val[8 * m + 2 * t])[g];
      e1 = ((const unsigned short *)(uintptr_t)w->val[8 * m + 2 * t + 1])[g];
    }
    r[m] = (unsigned)e0 | (unsigned)e1 << 16;
  }
  warp_barrier("ldmatrix");
}

/* cp.async.cg.shared.global [dst], [src], 16, src_bytes: src_bytes (0 or 16) copied, the
   rest zeroed.  Done at once here: the commit and wait groups are no-ops (on a GPU the copy
   lands by the wait; a kernel that reads before its wait and barrier is not caught). */
static inline void loom_emu_cp_async16(void *dst, const void *src, int src_bytes) {
  loom_emu_check_align(dst, 16, "cp.async destination");
  if (src_bytes) loom_emu_check_align(src, 16, "cp.async source");
  memset(dst, 0, 16);
  if (src_bytes) memcpy(dst, src, (size_t)src_bytes);
}

/* cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32 d, hi, lo: both rounded to nearest even (f16 with
   subnormals, overflow to infinity), NaN to the canonical 0x7fff; lo in the low half.
   Written here apart from the prelude's software conversions (common.cuh) on purpose. */
static inline unsigned loom_emu_cvt_half(float x, bool is_bf16) {
  unsigned u = __float_as_uint(x), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fffu;
  if (is_bf16) return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  if (a >= 0x477ff000u) return sign | 0x7c00u;   /* 65520 and up: infinity */
  if (a < 0x38800000u) return sign | (unsigned)rintf(fabsf(x) * 16777216.0f);   /* below 2^-14: subnormal */
  unsigned h = (((a >> 23) - 112u) << 10) | ((a >> 13) & 1023u), rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return sign | h;
}
static inline unsigned loom_emu_cvt_pack(float lo, float hi, bool is_bf16) {
  return loom_emu_cvt_half(lo, is_bf16) | loom_emu_cvt_half(hi, is_bf16) << 16;
}
/* ex2.approx.ftz.f32: 2^x (the host's exp2f: within the instruction's 2 ulp), subnormal
   results flushed to zero */
static inline float loom_emu_ex2(float x) {
  float r = exp2f(x);
  return r < 1.17549435e-38f ? 0.0f : r;
}

#include "emu_sm90.h"

#endif
