/* ---------------------------------------------------------------- attention on Hopper (sm_90a)
   The FlashAttention-3 layout of the forward (docs/attention.md "Hopper"): warpgroup MMA
   (wgmma.mma_async m64nNk16, f32 accumulators) on operands in shared memory described by
   matrix descriptors, loads by the tensor-copy engine (TMA: cp.async.bulk.tensor from tensor
   maps) completing on mbarriers, and a warp-specialized pipeline: one producer thread copies
   Q once and K, V tiles into a ring of stages; two consumer warpgroups (64 query rows each)
   wait for a stage's "full" barrier, run S = Q K^T (wgmma, both operands in shared memory),
   the online softmax in registers (attention_tc.cuh's, base 2), O += P V (wgmma, P from
   registers in the accumulator's own layout, V through a transposed descriptor), and arrive
   on the stage's "empty" barrier, which the producer waits for before it copies the stage
   again.
   Opt-in (LOOM_CUDA_WGMMA=1 when lowering, lower_attn.c): the layouts are checked only
   against the emulated device's reading of the PTX ISA (tests/cuda_emu/emu_sm90.h) until a
   GPU runs tests/gpu/OWED.md's check.  Built for an architecture without sm_90a's features
   the kernel traps (the lowering cannot see the device; the variable is for sm_90a only).

   Shared memory (from a 1024-byte boundary: the 128-byte swizzle's repeating pattern): Q as
   D / 64 blocks of [128 rows][64 columns], then per stage K and V as D / 64 blocks of [64
   keys][64 columns], then the mbarriers.  A row of a block is 128 bytes; its 16-byte unit u
   sits at unit u ^ (row % 8) (the 128-byte swizzle, which the descriptors name).
   The copies: one tensor copy per 64-column block of a tile (D 128: two), from a tensor map
   the runtime built once when it loaded the program (runtime/cuda/cuda_tmap.c, from the
   step's tmaps and i[RT_TMAP_INT..], program.h): the tensor as [B][rows][heads][D] (dims
   innermost first {D, heads, rows, B}), a box of {64, 1, tile rows, 1}, the 128-byte swizzle done by
   the copy engine, and elements past the tensor's end (rows past T or S) filled with zeros
   (the kernels mask those rows and keys as before).  The maps reach the kernel as its second
   parameter (const __grid_constant__ LoomTmaps: parameter space, read by the copies through
   its generic address). */

/* A tensor map: CUtensorMap's 128 opaque bytes, 64-byte aligned (the NVRTC programs do not
   include cuda.h); a kernel that copies by tensor maps takes four (map k: buffer k's) */
struct alignas(64) LoomTmap {
  unsigned long long opaque[16];
};
struct LoomTmaps {
  LoomTmap m[4];
};
#ifndef LOOM_TMAP_KERNEL   /* after such a kernel's wrapper (the emulated device marks it) */
#define LOOM_TMAP_KERNEL(name)
#endif

#if defined(LOOM_EMU) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LOOM_SM90 1
#else
#define LOOM_SM90 0
#endif

/* mbarriers (a 64-bit object in shared memory, by its shared address) */
LOOM_DEV void loom_mbar_init(unsigned bar, unsigned count) {
#if defined(LOOM_EMU)
  loom_emu_mbar_init(bar, count);
#elif LOOM_SM90
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
/* the inits visible to the other threads and to the copy engine (before a __syncthreads) */
LOOM_DEV void loom_mbar_init_fence() {
#if !defined(LOOM_EMU) && LOOM_SM90
  asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
LOOM_DEV void loom_mbar_arrive(unsigned bar) {
#if defined(LOOM_EMU)
  loom_emu_mbar_arrive(bar, 0);
#elif LOOM_SM90
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
/* the phase also waits for bytes more of completed copies, then this thread arrives */
LOOM_DEV void loom_mbar_expect_tx(unsigned bar, unsigned bytes) {
#if defined(LOOM_EMU)
  loom_emu_mbar_arrive(bar, bytes);
#elif LOOM_SM90
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
/* until the phase of this parity has completed */
LOOM_DEV void loom_mbar_wait(unsigned bar, unsigned parity) {
#if defined(LOOM_EMU)
  while (!loom_emu_mbar_try_wait(bar, parity)) {
  }
#elif LOOM_SM90
  unsigned done = 0;
  while (!done)
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
#endif
}
/* Tensor copy: the box of map at coordinates (c0 innermost .. c3) global -> shared at dst
   (1024-byte aligned: the swizzle's pattern starts there), the map's swizzle applied and
   elements out of the tensor zero, completing on bar with the box's bytes */
LOOM_DEV void loom_tma_load4(unsigned dst, const LoomTmap *map, int c0, int c1, int c2, int c3, unsigned bar) {
#if defined(LOOM_EMU)
  const int c[4] = {c0, c1, c2, c3};
  loom_emu_tensor_copy(dst, map, c, 4, bar);
#elif LOOM_SM90
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"((unsigned long long)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
#endif
}
/* the map into the copy engine's descriptor cache ahead of the first copy */
LOOM_DEV void loom_tma_prefetch(const LoomTmap *map) {
#if !defined(LOOM_EMU) && LOOM_SM90
  asm volatile("prefetch.tensormap [%0];\n" ::"l"((unsigned long long)map) : "memory");
#else
  (void)map;
#endif
}

/* A ring of st stages' mbarriers from bar: full[s] at bar + 8 s (the producer's arrive with
   the tile's bytes), empty[s] at bar + 8 (st + s) (an arrival from each of the consumers'
   threads once done with the stage), and once, the block's first load's (Q, or K and V);
   then the fence that shows them to the other threads and the copy engine (one thread, before
   a __syncthreads) */
LOOM_DEV void loom_ring_init(unsigned bar, int st, unsigned consumers, unsigned once) {
  for (int s = 0; s < st; s++) {
    loom_mbar_init(bar + 8 * s, 1);
    loom_mbar_init(bar + 8 * (st + s), consumers);
  }
  loom_mbar_init(once, 1);
  loom_mbar_init_fence();
}

/* wgmma: fence (before the first mma_async and after the thread touches the registers an
   mma_async reads or writes), commit the issued ones as a group, wait until at most N
   groups are in flight */
LOOM_DEV void loom_wgmma_fence() {
#if defined(LOOM_EMU)
  loom_emu_wgmma_fence();
#elif LOOM_SM90
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
LOOM_DEV void loom_wgmma_commit() {
#if defined(LOOM_EMU)
  loom_emu_wgmma_commit();
#elif LOOM_SM90
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
LOOM_DEV void loom_wgmma_wait() {
#if defined(LOOM_EMU)
  loom_emu_wgmma_wait(N);
#elif LOOM_SM90
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
/* c, which every thread of the warpgroup must compute the same (a branch around a wgmma):
   the emulated device checks that they do */
LOOM_DEV bool loom_wg_uniform(bool c) {
#if defined(LOOM_EMU)
  return loom_emu_wg_uniform(c);
#else
  return c;
#endif
}
/* the compiler keeps n accumulators in registers, unread and unmoved, across an mma_async */
LOOM_DEV void loom_wg_regs(float *x, int n) {
#if !defined(LOOM_EMU)
  for (int i = 0; i < n; i++) asm volatile("" : "+f"(x[i])::"memory");
#endif
}
/* the A fragments of RS mma_asyncs stay in their registers until the wait_group after them */
LOOM_DEV void loom_wg_keep(unsigned *x, int n) {
#if !defined(LOOM_EMU)
  for (int i = 0; i < n; i++) asm volatile("" : "+r"(x[i])::"memory");
#endif
}
/* named barriers 1-15 (0 is __syncthreads's): bar.sync waits until count threads (a multiple
   of 32) have arrived at barrier ID, bar.arrive arrives without waiting.  The id a constant:
   with an id in a register ptxas reserves all 16 barriers ("used 16 barriers"). */
template <int ID>
LOOM_DEV void loom_bar_sync(unsigned count) {
#if defined(LOOM_EMU)
  loom_emu_bar(ID, count, true);
#else
  asm volatile("bar.sync %0, %1;\n" ::"n"(ID), "r"(count) : "memory");
#endif
}
template <int ID>
LOOM_DEV void loom_bar_arrive(unsigned count) {
#if defined(LOOM_EMU)
  loom_emu_bar(ID, count, false);
#else
  asm volatile("bar.arrive %0, %1;\n" ::"n"(ID), "r"(count) : "memory");
#endif
}

/* setmaxnreg (FlashAttention-3's register reallocation): the executing warpgroup's per-thread
   register limit lowered (INC false: the registers go back to the block's pool) or raised to N
   (waits until the pool has them).  Warpgroup-wide (.sync.aligned: all 128 threads, none
   exited), N a multiple of 8 in [24, 256]. */
template <int N, bool INC>
LOOM_DEV void loom_setmaxnreg() {
  static_assert(N >= 24 && N <= 256 && N % 8 == 0, "setmaxnreg takes a multiple of 8 in [24, 256]");
#if defined(LOOM_EMU)
  loom_emu_setmaxnreg(N, INC);
#elif LOOM_SM90
  if (INC) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
  else asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

/* A matrix descriptor: start address, leading and stride byte offsets, the 128-byte swizzle
   (mode 1), base offset 0 (every swizzle pattern starts on a 1024-byte boundary) */
LOOM_DEV unsigned long long loom_wg_desc(unsigned addr, unsigned lbo, unsigned sbo) {
  return (unsigned long long)((addr & 0x3ffffu) >> 4) | (unsigned long long)(lbo >> 4) << 16 |
         (unsigned long long)(sbo >> 4) << 32 | 1ull << 62;
}

/* d advanced by off bytes (a multiple of 16): its start address field, the low word's 14 bits,
   does not carry out (shared addresses below 256 KB), so the add is the low word's only */
LOOM_DEV unsigned long long loom_wg_desc_add(unsigned long long d, unsigned off) {
  return (d & ~0xffffffffull) | (unsigned)((unsigned)d + (off >> 4));
}

#define LOOM_F4(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define LOOM_F16(d, i) LOOM_F4(d, i), LOOM_F4(d, i + 4), LOOM_F4(d, i + 8), LOOM_F4(d, i + 12)
#define LOOM_F32(d, i) LOOM_F16(d, i), LOOM_F16(d, i + 16)
#define LOOM_WG_D32                                                                                                    \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "     \
  "%24, %25, %26, %27, %28, %29, %30, %31}"
#define LOOM_WG_D64                                                                                                    \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "     \
  "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, " \
  "%47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define LOOM_WG_SS64(TY)                                                                                               \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY      \
               " " LOOM_WG_D32 ", %32, %33, p, 1, 1, 0, 0;\n}\n"                                                       \
               : LOOM_F32(d, 0)                                                                                        \
               : "l"(da), "l"(db), "r"(scale_d))
#define LOOM_WG_D16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define LOOM_WG_SS32(TY)                                                                                               \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\nwgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY      \
               " " LOOM_WG_D16 ", %16, %17, p, 1, 1, 0, 0;\n}\n"                                                       \
               : LOOM_F16(d, 0)                                                                                        \
               : "l"(da), "l"(db), "r"(scale_d))
#define LOOM_WG_D8 "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define LOOM_WG_SS16(TY)                                                                                               \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\nwgmma.mma_async.sync.aligned.m64n16k16.f32." TY "." TY      \
               " " LOOM_WG_D8 ", %8, %9, p, 1, 1, 0, 0;\n}\n"                                                         \
               : LOOM_F4(d, 0), LOOM_F4(d, 4)                                                                          \
               : "l"(da), "l"(db), "r"(scale_d))
#define LOOM_WG_RS64(TY)                                                                                               \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY      \
               " " LOOM_WG_D32 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                                          \
               : LOOM_F32(d, 0)                                                                                        \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1))
#define LOOM_WG_RS128(TY)                                                                                              \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\nwgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY     \
               " " LOOM_WG_D64 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                          \
               : LOOM_F32(d, 0), LOOM_F32(d, 32)                                                                       \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1))

/* d[32] (64 x 64, f32) = A B (+ d when scale_d): A 64 x 16 K-major, B 16 x 64 K-major (B's
   rows of 16 are its columns' k: the keys' rows of K), both by descriptor */
template <bool BF>
LOOM_DEV void loom_wgmma_ss64(float *d, unsigned long long da, unsigned long long db, int scale_d) {
#if defined(LOOM_EMU)
  loom_emu_wgmma(d, 64, nullptr, da, db, scale_d, 0, 0, BF);
#elif LOOM_SM90
  if (BF) LOOM_WG_SS64("bf16");
  else LOOM_WG_SS64("f16");
#endif
}
/* the same, 64 x 32 (d[16]) */
template <bool BF>
LOOM_DEV void loom_wgmma_ss32(float *d, unsigned long long da, unsigned long long db, int scale_d) {
#if defined(LOOM_EMU)
  loom_emu_wgmma(d, 32, nullptr, da, db, scale_d, 0, 0, BF);
#elif LOOM_SM90
  if (BF) LOOM_WG_SS32("bf16");
  else LOOM_WG_SS32("f16");
#endif
}
/* the same, 64 x 16 (d[8]) */
template <bool BF>
LOOM_DEV void loom_wgmma_ss16(float *d, unsigned long long da, unsigned long long db, int scale_d) {
#if defined(LOOM_EMU)
  loom_emu_wgmma(d, 16, nullptr, da, db, scale_d, 0, 0, BF);
#elif LOOM_SM90
  if (BF) LOOM_WG_SS16("bf16");
  else LOOM_WG_SS16("f16");
#endif
}
/* 64 x N, N 16 or 32 (d[N / 2]) */
template <bool BF, int N>
LOOM_DEV void loom_wgmma_ss(float *d, unsigned long long da, unsigned long long db, int scale_d) {
  static_assert(N == 16 || N == 32, "loom_wgmma_ss: N 16 or 32");
  if (N == 16) loom_wgmma_ss16<BF>(d, da, db, scale_d);
  else loom_wgmma_ss32<BF>(d, da, db, scale_d);
}
/* d[N / 2] (64 x N, f32) += A B: A 64 x 16 from registers (a[4], mma.sync's A fragment per
   warp), B 16 x N N-major (imm-trans-b: V's rows of head dims) by descriptor */
template <bool BF, int N>
LOOM_DEV void loom_wgmma_rs(float *d, const unsigned a[4], unsigned long long db) {
#if defined(LOOM_EMU)
  loom_emu_wgmma(d, N, a, 0, db, 1, 0, 1, BF);
#elif LOOM_SM90
  if (N == 64) {
    if (BF) LOOM_WG_RS64("bf16");
    else LOOM_WG_RS64("f16");
  } else {
    if (BF) LOOM_WG_RS128("bf16");
    else LOOM_WG_RS128("f16");
  }
#endif
}

/* Forward on wgmma, q k v all bf16 or all f16, D 64 or 128, no sliding window (the lowering
   keeps those on loom_attn_fwd_tc).  Outputs exactly loom_attn_fwd_tc's: out, and with
   i[8] = 1 each row's L2 (base-2 log-sum-exp; +inf for a row with no key) and O in f32 for the
   one-pass backward.  384 threads: warpgroup 0 the producer (setmaxnreg down to 24; its
   thread 0 copies, the rest leave), warpgroups 1 and 2 (setmaxnreg up to 240) the consumers
   of query rows m0 + 64 (wg - 1) ...  Rows past T and keys past S arrive as zeros (the
   tensor maps' fill: masked keys get p = 0, rows past T are not stored).  Three stages of 64
   keys (the consumers hold two, pipelined: below).  P enters P V as attention_tc.cuh's
   kernels have it (the input format, with LOOM_ATTN_SPLIT its remainder too).
   grid (B*H, ceil(T/128)); dynamic smem 1024 + 128*D*2 + 3 stages * 2 * 64*D*2 + 56 bytes.
   bufs: q k v -> out [L2 O];  i: B, T, H, D, S, KV, causal, window (0)[, save];  f: scale;
   t: tensor maps of q k v (box rows 128, 64, 64) */
#ifndef LOOM_FWD_WG_PRODUCER_REGS   /* the forward's setmaxnreg counts (below) */
#define LOOM_FWD_WG_PRODUCER_REGS 24
#endif
#ifndef LOOM_FWD_WG_CONSUMER_REGS
#define LOOM_FWD_WG_CONSUMER_REGS 240
#endif
template <class SQ, class SK, class SV, class SO, int D>
LOOM_DEV void loom_attn_fwd_wg(const LoomArgs &a, const LoomTmaps &t) {
#if LOOM_SM90
  static_assert(D == 64 || D == 128, "the wgmma forward takes head sizes 64 and 128");
  constexpr bool BF = SQ::is_bf16;
  constexpr int BM = 128, BN = 64, ST = 3, NT = BN / 8, ND = D / 8, KD = D / 16, KN = BN / 16, U = D / 64;
  constexpr unsigned QB = BM * 128, KB = BN * 128, TILE = BN * D * 2;   /* a 64-column block of Q, of a tile; a tile */
  extern __shared__ float loom_smem[];
  const unsigned raw = loom_smem_addr(loom_smem), sQ = (raw + 1023u) & ~1023u, sKV = sQ + BM * D * 2;
  const unsigned sBar = sKV + ST * 2 * TILE, qbar = sBar + 16 * ST;   /* full[s] at sBar + 8 s, empty[s] after them */
  const int T = (int)a.i[1], H = (int)a.i[2], S = (int)a.i[4], KV = (int)a.i[5];
  const bool causal = a.i[6] != 0;
  const float c2 = (float)a.f[0] * 1.4426950408889634f;
  const int bh = blockIdx.x, b = bh / H, h = bh - b * H, kvh = h / (H / KV);
  const int n_tiles = (T + BM - 1) / BM, m0 = (n_tiles - 1 - (int)blockIdx.y) * BM;   /* long rows first */
  const int n_end = causal ? (S < m0 + BM ? S : m0 + BM) : S, nk = n_end > 0 ? (n_end + BN - 1) / BN : 0;
  /* the warpgroup through a shuffle: ptxas then knows it is the same across the warp, so the
     producer/consumer split is not a divergent path around the wgmmas (without it ptxas
     serializes them: "program dependence on compiler-inserted WG.AR in divergent path") */
  const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
  if (tid == 0) loom_ring_init(sBar, ST, 2 * 128, qbar);
  __syncthreads();
  /* 384 threads at 168 registers (65536 / 384, rounded down to 8): the producer warpgroup,
     which needs few, gives (168 - 24) x 128 back, and each consumer warpgroup takes (240 -
     168) x 128 of them: 24 + 2 x 240 = 3 x 168.  The whole warpgroup executes its setmaxnreg
     (warpgroup-wide), then the producer's other 127 threads leave. */
  if (wg == 0) {   /* the producer: one thread (tensor maps 0 1 2: q k v as [B][T or S][heads][D]) */
    loom_setmaxnreg<LOOM_FWD_WG_PRODUCER_REGS, false>();
    if (tid != 0) return;
    loom_tma_prefetch(&t.m[0]);
    loom_tma_prefetch(&t.m[1]);
    loom_tma_prefetch(&t.m[2]);
    loom_mbar_expect_tx(qbar, BM * D * 2);
    #pragma unroll
    for (int c = 0; c < U; c++) loom_tma_load4(sQ + c * QB, &t.m[0], 64 * c, h, m0, b, qbar);
    for (int it = 0; it < nk; it++) {
      const int s = it % ST, n0 = it * BN;
      const unsigned full = sBar + 8 * s, sK = sKV + s * 2 * TILE;
      loom_mbar_wait(sBar + 8 * (ST + s), ((it / ST) & 1) ^ 1);   /* the stage's previous use is done */
      loom_mbar_expect_tx(full, 2 * TILE);
      #pragma unroll
      for (int c = 0; c < U; c++) {
        loom_tma_load4(sK + c * KB, &t.m[1], 64 * c, kvh, n0, b, full);
        loom_tma_load4(sK + TILE + c * KB, &t.m[2], 64 * c, kvh, n0, b, full);
      }
    }
    return;
  }
  loom_setmaxnreg<LOOM_FWD_WG_CONSUMER_REGS, true>();
  const int cw = wg - 1, l = tid & 127, warp = l >> 5, lane = l & 31, t2 = (lane & 3) * 2;
  const int rw = m0 + 64 * cw + 16 * warp, r0 = rw + (lane >> 2), r1 = r0 + 8;   /* the warp's first row; this thread's two */
  const int wg_last = m0 + 64 * cw + 63;
  float o[ND][4], mrow[2] = {-LOOM_INF, -LOOM_INF}, lsum[2] = {0.0f, 0.0f};
  #pragma unroll
  for (int d = 0; d < ND; d++)
    #pragma unroll
    for (int e = 0; e < 4; e++) o[d][e] = 0.0f;
  int kmax[2];   /* the keys rows r0 and r1 see: [0, kmax) */
  #pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    const int row = hr ? r1 : r0;
    kmax[hr] = causal && row + 1 < S ? row + 1 : S;
  }
  /* n0 < this (and n0 + BN <= S): no key of the warpgroup's rows masked (per warpgroup; per
     warp it is the same: tiles of 64) */
  const int interior_end = causal ? m0 + 64 * cw + 1 - BN : S - BN + 1;
  /* the tiles this warpgroup's rows see: a prefix of the block's (causal: none past its last row) */
  const int nkw = causal && wg_last / BN + 1 < nk ? wg_last / BN + 1 : nk;
  loom_mbar_wait(qbar, 0);
  /* FlashAttention-3's pipelining within a warpgroup: tile j's S = Q K^T is issued with tile
     j-1's O += P V behind it, and the softmax of S runs while P V is in flight; o is rescaled
     by tile j's alpha once P V has landed.  The operations on o are the unpipelined loop's in
     its order (o = 0, then for each tile: o *= alpha, o += P V: here +PV(j-1) then *alpha(j),
     the first tile's alpha multiplying zeros), so the bits are the same.  A stage is given
     back when both its products are done: K after S, V after P V, so tile j-1's once P V
     lands; with tile j's stage held meanwhile, three stages let the producer copy one ahead. */
  unsigned hi[KN][4], lo[KN][4];   /* the previous tile's P (and its remainder), as P V's A */
  auto scores = [&](float (&sc)[NT][4], unsigned sK) {   /* issue S = Q K^T */
    #pragma unroll
    for (int kk = 0; kk < KD; kk++)
      loom_wgmma_ss64<BF>(&sc[0][0], loom_wg_desc(sQ + (kk >> 2) * QB + cw * 64 * 128 + (kk & 3) * 32, 16, 1024),
                          loom_wg_desc(sK + (kk >> 2) * KB + (kk & 3) * 32, 16, 1024), kk > 0);
    loom_wgmma_commit();
  };
  auto pv = [&](unsigned sK) {   /* issue o += P V (V's keys 16 kk ..: 8-key groups 1024 bytes apart) */
    #pragma unroll
    for (int kk = 0; kk < KN; kk++) {
      const unsigned long long dv = loom_wg_desc(sK + TILE + kk * 16 * 128, KB, 1024);
      if (LOOM_ATTN_SPLIT) loom_wgmma_rs<BF, D>(&o[0][0], lo[kk], dv);
      loom_wgmma_rs<BF, D>(&o[0][0], hi[kk], dv);
    }
    loom_wgmma_commit();
  };
  /* the mask (a literal EDGE at each call, as loom_attn_fwd_tc's), the softmax, P packed */
  auto softmax = [&](const bool EDGE, int n0, float (&sc)[NT][4], float (&alpha)[2]) {
    if (EDGE)
      #pragma unroll
      for (int j = 0; j < NT; j++)
        #pragma unroll
        for (int e = 0; e < 4; e++)
          if (n0 + 8 * j + t2 + (e & 1) >= kmax[e >> 1]) sc[j][e] = -LOOM_INF;
    loom_softmax_stats<NT>(sc, mrow, lsum, alpha, c2, EDGE);
  };
  /* FlashAttention-3's ping-pong between the two consumer warpgroups: each issues its
     products in turns, warpgroup 1's (cw 0) first, then 2's, then 1's..., so that one's
     softmax runs while the other's products occupy the tensor cores.  A turn begins with
     bar.sync on the warpgroup's own named barrier (1 + cw) and ends, its wgmmas issued, with
     bar.arrive on the other's (2 - cw), 256 threads each: the syncing warpgroup's 128 and the
     other's 128.  Both take nk + 1 turns (tile it's S with tile it-1's P V; the
     last P V; a warpgroup whose rows see fewer tiles, cw 0 under the causal mask, takes empty
     ones), warpgroup 2 arrives once before its first and not after its last, so every phase
     completes and none is left open.  A stage's full barrier is waited before the turn: the
     turn is never held on a copy.  A turn ends once its S has landed (its P V may be in
     flight): the other's products queue behind that P V on the tensor cores while this
     warpgroup's softmax runs. */
  auto turn_begin = [&]() {
    if (cw == 0) loom_bar_sync<1>(256);
    else loom_bar_sync<2>(256);
  };
  auto turn_end = [&]() {   /* (not after warpgroup 2's last turn, nk) */
    if (cw == 0) loom_bar_arrive<2>(256);
    else loom_bar_arrive<1>(256);
  };
  if (cw == 1 && nk > 0) loom_bar_arrive<1>(256);   /* warpgroup 1's first turn */
  for (int it = 0; it < nkw; it++) {
    const int st = it % ST, n0 = it * BN;
    const unsigned sK = sKV + st * 2 * TILE;
    float sc[NT][4], alpha[2];
    loom_mbar_wait(sBar + 8 * st, (it / ST) & 1);
    turn_begin();
    loom_wgmma_fence();
    scores(sc, sK);
    if (it > 0) pv(sKV + ((it - 1) % ST) * 2 * TILE);
    if (it > 0) loom_wgmma_wait<1>();   /* S has landed; P V may still be in flight */
    else loom_wgmma_wait<0>();
    turn_end();   /* (it < nk: not the last turn.  After S lands: a bar.arrive between S's
                     issue and its wait makes ptxas serialize the wgmmas, C7514) */
    loom_wg_regs(&sc[0][0], 4 * NT);
    if (n0 < interior_end && n0 + BN <= S) softmax(false, n0, sc, alpha);
    else softmax(true, n0, sc, alpha);
    loom_wgmma_wait<0>();   /* P V too */
    loom_wg_regs(&o[0][0], 4 * ND);
    loom_wg_keep(&hi[0][0], 4 * KN);
    loom_wg_keep(&lo[0][0], 4 * KN);
    if (it > 0) loom_mbar_arrive(sBar + 8 * (ST + (it - 1) % ST));
    loom_rescale<ND>(o, alpha);
    #pragma unroll
    for (int kk = 0; kk < KN; kk++) loom_frag_pack<BF>(sc, 2 * kk, hi[kk], lo[kk]);
  }
  if (nkw > 0) {   /* the last tile's P V: turn nkw */
    turn_begin();
    loom_wgmma_fence();
    pv(sKV + ((nkw - 1) % ST) * 2 * TILE);
    if (!(cw == 1 && nkw == nk)) turn_end();
    loom_wgmma_wait<0>();
    loom_wg_regs(&o[0][0], 4 * ND);
    loom_wg_keep(&hi[0][0], 4 * KN);
    loom_wg_keep(&lo[0][0], 4 * KN);
    loom_mbar_arrive(sBar + 8 * (ST + (nkw - 1) % ST));
  }
  for (int it = nkw > 0 ? nkw + 1 : 0; it <= nk; it++) {   /* empty turns */
    turn_begin();
    if (!(cw == 1 && it == nk)) turn_end();
  }
  /* (the tiles after the turns: warpgroup 2's turns wait for no stage these hold, the ring
     having three and these being at most one, the tile past cw 0's rows) */
  for (int it = nkw; it < nk; it++) {   /* the tiles past this warpgroup's rows: seen, given back */
    loom_mbar_wait(sBar + 8 * (it % ST), (it / ST) & 1);
    loom_mbar_arrive(sBar + 8 * (ST + it % ST));
  }
  const bool save = a.i[8] != 0;
  float *Lsave = (float *)a.buf[4], *Osave = (float *)a.buf[5];
  typename SO::T *out = LOOM_OUT(SO, 3);
  loom_fwd_finish<SO, ND>(out, save ? Lsave : nullptr, Osave, o, mrow, lsum, c2, r0, r1, T, b, h, bh, t2, H * D, D);
#else
  (void)a;
  (void)t;
  __trap();   /* LOOM_CUDA_WGMMA=1's kernels need an sm_90a device (docs/attention.md) */
#endif
}

/* Backward part 2 (dk, dv) on wgmma: loom_attn_bwd_dkdv_tc's arithmetic in the forward's
   pipeline.  256 threads: warpgroup 0 the producer (thread 0 copies K and V of the block's 64
   keys once, then per item, a query head sharing the kv head and a query tile of 64, its Q
   and dO into a ring of stages: three at D 64, two at D 128), warpgroup 1 the consumer: S^T = K Q^T and dP^T = V dO^T
   (wgmma, all four in shared memory, K-major), P^T = 2^(S^T c2 - L2) and dS^T = P^T (dP^T -
   Dsum) scale in registers (L2 and Dsum read from global memory by each thread for its query
   columns), dV += P^T dO and dK += dS^T Q (wgmma, P^T and dS^T from registers as the
   forward's P, dO and Q through N-major descriptors).  The same sums in the same order as
   loom_attn_bwd_dkdv_tc (its query tiles of 32 at D 128 are the same k16 steps).  No window
   (the lowering keeps those on the mma.sync kernel).
   grid (B*KV, ceil(S/64)); dynamic smem 1024 + 2*64*D*2 + ST stages * 2*64*D*2 + 8 (2 ST + 1) bytes.
   bufs: dout q k v L2 Dsum -> dk dv;  i: B, T, H, D, S, KV, causal, window (0);  f: scale;
   t: tensor maps of dout q k v (box rows 64; queries past T and keys past S arrive as zeros) */
/* setmaxnreg for dk/dv, off (0): the lowering binds the Hopper kernels to 1 block an SM
   (steps.c: __launch_bounds__(256, 1)), where the kernel starts at 255 registers and the
   consumer can be given no more.  Set to 232 only with the wrapper's bound (256, 2): the kernel
   then starts at 128, the producer gives 104 x 128 back and the consumer takes 232 (24 + 232 =
   2 x 128), two blocks an SM.  D 64 compiles so to 198 registers, no spills (docs/attention.md
   "Hopper"); not wired into the lowering yet (D 128 takes 240, over 232). */
#ifndef LOOM_KV_WG_CONSUMER_REGS
#define LOOM_KV_WG_CONSUMER_REGS 0
#endif
template <class SDO, class SQ, class SK, class SV, class SDK, class SDV, int D>
LOOM_DEV void loom_attn_bwd_dkdv_wg(const LoomArgs &a, const LoomTmaps &t) {
#if LOOM_SM90
  static_assert(D == 64 || D == 128, "the wgmma backward takes head sizes 64 and 128");
  constexpr bool BF = SQ::is_bf16;
  constexpr bool PIPE = true;   /* pipelined (below) */
  constexpr int BN = 64, BM = 64, ST = PIPE ? 3 : 2, W = PIPE && D == 128 ? 16 : 32, NS = BM / W, NW = W / 8, KW = W / 16, ND = D / 8, KD = D / 16, U = D / 64;
  constexpr unsigned BLK = 64 * 128, TILE = 64 * D * 2;   /* a 64-row, 64-column block; a 64-row tile */
  extern __shared__ float loom_smem[];
  const unsigned raw = loom_smem_addr(loom_smem), sK = (raw + 1023u) & ~1023u, sV = sK + TILE, sQO = sV + TILE;
  const unsigned sBar = sQO + ST * 2 * TILE, kvbar = sBar + 16 * ST;   /* full[s], empty[s], then K and V's */
  const int T = (int)a.i[1], H = (int)a.i[2], S = (int)a.i[4], KV = (int)a.i[5], G = H / KV;
  const bool causal = a.i[6] != 0;
  const float scale = (float)a.f[0], c2 = scale * 1.4426950408889634f;
  const int bk = blockIdx.x, b = bk / KV, kvh = bk - b * KV, n0 = (int)blockIdx.y * BN;
  const int m_start = causal ? (n0 / BM) * BM : 0, nm = T > m_start ? (T - m_start + BM - 1) / BM : 0, n_items = G * nm;
  /* (the warpgroup through a shuffle: the forward says why) */
  const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
  if (tid == 0) loom_ring_init(sBar, ST, 128, kvbar);
  __syncthreads();
  if (wg == 0) {   /* the producer: one thread (tensor maps 0 1 2 3: dout q k v, as the forward's) */
    if (LOOM_KV_WG_CONSUMER_REGS) loom_setmaxnreg<24, false>();
    if (tid != 0) return;
    for (int m = 0; m < 4; m++) loom_tma_prefetch(&t.m[m]);
    loom_mbar_expect_tx(kvbar, 2 * TILE);
    #pragma unroll
    for (int c = 0; c < U; c++) {
      loom_tma_load4(sK + c * BLK, &t.m[2], 64 * c, kvh, n0, b, kvbar);
      loom_tma_load4(sV + c * BLK, &t.m[3], 64 * c, kvh, n0, b, kvbar);
    }
    for (int it = 0; it < n_items; it++) {
      const int s = it % ST, h = kvh * G + it / nm, m0 = m_start + (it % nm) * BM;
      const unsigned full = sBar + 8 * s, sQ = sQO + s * 2 * TILE;
      loom_mbar_wait(sBar + 8 * (ST + s), ((it / ST) & 1) ^ 1);
      loom_mbar_expect_tx(full, 2 * TILE);
      #pragma unroll
      for (int c = 0; c < U; c++) {
        loom_tma_load4(sQ + c * BLK, &t.m[1], 64 * c, h, m0, b, full);
        loom_tma_load4(sQ + TILE + c * BLK, &t.m[0], 64 * c, h, m0, b, full);
      }
    }
    return;
  }
  if (LOOM_KV_WG_CONSUMER_REGS) loom_setmaxnreg<LOOM_KV_WG_CONSUMER_REGS ? LOOM_KV_WG_CONSUMER_REGS : 24, true>();
  const int l = tid & 127, warp = l >> 5, lane = l & 31, g = lane >> 2, t2 = (lane & 3) * 2;
  const int kw = n0 + 16 * warp, k0 = kw + g, k1 = k0 + 8;   /* the warp's first key; this thread's two */
  const float *Lin = (const float *)a.buf[4], *Din = (const float *)a.buf[5];
  float dK[ND][4], dV[ND][4];
  #pragma unroll
  for (int d = 0; d < ND; d++)
    #pragma unroll
    for (int e = 0; e < 4; e++) dK[d][e] = dV[d][e] = 0.0f;
  loom_mbar_wait(kvbar, 0);
  /* An item in slices of W queries (S^T and dP^T of a slice: W / 2 registers each, so D 128's
     accumulators, 128 registers, fit beside them); the sums' order is the tile's.  Pipelined
     as dq (FlashAttention-3's intra-warpgroup overlap): a slice's S^T and dP^T are issued with
     the previous slice's dV += P^T dO and dK += dS^T Q behind them (the previous item's last
     slice, across items), and its P^T and dS^T are computed while those products are in
     flight.  dV's and dK's products are the unpipelined loop's in its order, so the bits are
     the same.  An item's stage is given back once its last slice's products retire (during
     the next item's first slice): the consumer holds two stages then, hence the third.
     Slices of 32 at D 64 (202 registers against 157 unpipelined: one block an SM either way,
     256 threads above 128), of 16 at D 128: halves there take 255 registers and spill 52
     bytes (the previous half's P^T and dS^T fragments, 32 registers with their remainders,
     live beside the next half's S^T and dP^T); quarters take 240, no spills, for m64n16
     products in S^T and dP^T (docs/attention.md "Hopper"). */
  unsigned hs[KW][4], ls[KW][4], hd[KW][4], ld[KW][4];   /* P^T, dS^T (and remainders) as A */
  auto kv_issue = [&](unsigned sQ, unsigned hq) {   /* dV += P^T dO, dK += dS^T Q over a half's queries, 16 at a time */
    #pragma unroll
    for (int kk = 0; kk < KW; kk++) {
      const unsigned qo = hq + kk * 16 * 128;
      const unsigned long long bq = loom_wg_desc_add(loom_wg_desc(sQ, BLK, 1024), qo), bo = loom_wg_desc_add(bq, TILE);
      if (LOOM_ATTN_SPLIT) loom_wgmma_rs<BF, D>(&dV[0][0], ls[kk], bo);
      loom_wgmma_rs<BF, D>(&dV[0][0], hs[kk], bo);
      if (LOOM_ATTN_SPLIT) loom_wgmma_rs<BF, D>(&dK[0][0], ld[kk], bq);
      loom_wgmma_rs<BF, D>(&dK[0][0], hd[kk], bq);
    }
    loom_wgmma_commit();
  };
  auto kv_done = [&]() {   /* after the wait that retires dV's and dK's products */
    loom_wg_regs(&dV[0][0], 4 * ND);
    loom_wg_regs(&dK[0][0], 4 * ND);
    loom_wg_keep(&hs[0][0], 4 * KW);
    loom_wg_keep(&ls[0][0], 4 * KW);
    loom_wg_keep(&hd[0][0], 4 * KW);
    loom_wg_keep(&ld[0][0], 4 * KW);
  };
  /* P^T and dS^T of a half (a literal EDGE at each call) */
  /* L2 and Dsum of this thread's query columns of a slice (a row each for j and e & 1; loaded
     while the slice's products are in flight) */
  auto stats = [&](int half, int m0, const float *Lr, const float *Dr, float (&Lv)[NW][2], float (&Dv)[NW][2]) {
    #pragma unroll
    for (int j = 0; j < NW; j++)
      #pragma unroll
      for (int c = 0; c < 2; c++) {
        const int r = W * half + 8 * j + t2 + c, t = m0 + r;
        const int rv = t < T ? r : 0;   /* loads without a branch (row m0 < T is there) */
        Lv[j][c] = t < T ? Lr[rv] : 0.0f;
        Dv[j][c] = t < T ? Dr[rv] : 0.0f;
      }
  };
  /* P^T and dS^T of a slice (a literal EDGE at each call) */
  auto dscore = [&](const bool EDGE, int half, int m0, const float (&Lv)[NW][2], const float (&Dv)[NW][2],
                    float (&s)[NW][4], float (&dp)[NW][4]) {
    #pragma unroll
    for (int j = 0; j < NW; j++)
      #pragma unroll
      for (int e = 0; e < 4; e++) {
        const int t = m0 + W * half + 8 * j + t2 + (e & 1);
        float p = loom_ex2(__fmaf_rn(s[j][e], c2, -Lv[j][e & 1]));
        if (EDGE && ((causal && t < (e >> 1 ? k1 : k0)) || t >= T)) p = 0.0f;
        s[j][e] = p;
        dp[j][e] = p * (dp[j][e] - Dv[j][e & 1]) * scale;
      }
  };
  /* (no item is wholly before the block's keys: m_start is n0, BM and BN being the same) */
  for (int it = 0; it < n_items; it++) {
    const int st = it % ST, h = kvh * G + it / nm, m0 = m_start + (it % nm) * BM;
    const long long lb = ((long long)b * H + h) * T + m0;
    const unsigned sQ = sQO + st * 2 * TILE;
    loom_mbar_wait(sBar + 8 * st, (it / ST) & 1);
    {
      /* unmasked when no query of the tile is before the block's last key and none past T:
         the same for the whole warpgroup (a wgmma's branch must be; checked as the forward's) */
      const bool edge = !loom_wg_uniform(m0 + BM <= T && (!causal || m0 >= n0 + BN - 1));
      #pragma unroll
      for (int half = 0; half < NS; half++) {
        const unsigned hq = half * W * 128;   /* the slice's first query row */
        float s[NW][4], dp[NW][4], Lv[NW][2], Dv[NW][2];
        stats(half, m0, Lin + lb, Din + lb, Lv, Dv);
        loom_wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < KD; kk++) {
          const unsigned ko = (kk >> 2) * BLK + (kk & 3) * 32;
          const unsigned long long dq = loom_wg_desc_add(loom_wg_desc(sQ, 16, 1024), hq + ko);
          loom_wgmma_ss<BF, W>(&s[0][0], loom_wg_desc_add(loom_wg_desc(sK, 16, 1024), ko), dq, kk > 0);
          loom_wgmma_ss<BF, W>(&dp[0][0], loom_wg_desc_add(loom_wg_desc(sV, 16, 1024), ko), loom_wg_desc_add(dq, TILE), kk > 0);
        }
        loom_wgmma_commit();
        /* the products pending: the previous half's, of this item (half 1) or the previous one's */
        const bool pend = PIPE && (half > 0 || it > 0);
        const int pst = half > 0 ? st : (it + ST - 1) % ST;
        if (pend) kv_issue(sQO + pst * 2 * TILE, (half > 0 ? half - 1 : NS - 1) * W * 128u);
        if (pend) loom_wgmma_wait<1>();   /* S^T and dP^T have landed; dV's, dK's may be in flight */
        else loom_wgmma_wait<0>();
        loom_wg_regs(&s[0][0], 4 * NW);
        loom_wg_regs(&dp[0][0], 4 * NW);
        if (edge) dscore(true, half, m0, Lv, Dv, s, dp);
        else dscore(false, half, m0, Lv, Dv, s, dp);
        if (pend) {
          loom_wgmma_wait<0>();   /* the previous half's products too */
          kv_done();
          if (half == 0) loom_mbar_arrive(sBar + 8 * (ST + pst));   /* the previous item's last: its stage is free */
        }
        #pragma unroll
        for (int kk = 0; kk < KW; kk++) {
          loom_frag_pack<BF>(s, 2 * kk, hs[kk], ls[kk]);
          loom_frag_pack<BF>(dp, 2 * kk, hd[kk], ld[kk]);
        }
        if (!PIPE) {   /* this half's products at once */
          loom_wgmma_fence();
          kv_issue(sQ, hq);
          loom_wgmma_wait<0>();
          kv_done();
        }
      }
      if (!PIPE) loom_mbar_arrive(sBar + 8 * (ST + st));
    }
  }
  if (PIPE && n_items > 0) {   /* the last item's second half's products */
    const int pst = (n_items - 1) % ST;
    loom_wgmma_fence();
    kv_issue(sQO + pst * 2 * TILE, (NS - 1) * W * 128u);
    loom_wgmma_wait<0>();
    kv_done();
    loom_mbar_arrive(sBar + 8 * (ST + pst));
  }
  typename SDK::T *dk = LOOM_OUT(SDK, 6);
  typename SDV::T *dv = LOOM_OUT(SDV, 7);
  loom_kv_grads_store<SDK, SDV, ND>(dk, dv, dK, dV, k0, k1, S, b, kvh, t2, (long long)KV * D, D);
#else
  (void)a;
  (void)t;
  __trap();   /* LOOM_CUDA_WGMMA=1's kernels need an sm_90a device (docs/attention.md) */
#endif
}

/* Backward part 1 (dq) on wgmma, the one-pass form only (the forward saved L2 and O; the
   lowering keeps the two-pass dq on loom_attn_bwd_dq_tc): loom_attn_bwd_dq_tc's arithmetic in
   dk/dv's pipeline mirrored.  256 threads: warpgroup 0 the producer (thread 0 copies the block's
   64 query rows of Q and dO once, then the key tiles' K and V into a ring of three stages at D 128, two at D 64),
   warpgroup 1 the consumer: S = Q K^T and dP = dO V^T (wgmma, all four in shared memory,
   K-major), dS = 2^(S c2 - L2) (dP - Dsum) scale in registers, dQ += dS K (wgmma, dS from
   registers as the forward's P, K through an N-major descriptor as the forward's V).  Key
   tiles of 64 at both D (the mma.sync kernel takes 32 at D 128): dQ's k16 steps, the sums of
   S and dP and the masks are the same in the same order, so the bits are.  No window.
   grid (B*H, ceil(T/64)); dynamic smem 1024 + 2*64*D*2 + ST stages * 2*64*D*2 + 8 (2 ST + 1) bytes.
   bufs: dout q k v L2 O -> dq Dsum;  i: B, T, H, D, S, KV, causal, window (0), 1;  f: scale;
   t: tensor maps of dout q k v (box rows 64; rows past T and keys past S arrive as zeros) */
template <class SDO, class SQ, class SK, class SV, class SDQ, int D>
LOOM_DEV void loom_attn_bwd_dq_wg(const LoomArgs &a, const LoomTmaps &t) {
#if LOOM_SM90
  static_assert(D == 64 || D == 128, "the wgmma backward takes head sizes 64 and 128");
  constexpr bool BF = SQ::is_bf16;
  /* pipelined at D 128 only (below) */
  constexpr bool PIPE = D == 128;
  constexpr int BM = 64, BN = 64, ST = PIPE ? 3 : 2, NT = BN / 8, ND = D / 8, KD = D / 16, KN = BN / 16, U = D / 64;
  constexpr unsigned BLK = 64 * 128, TILE = 64 * D * 2;   /* a 64-row, 64-column block; a 64-row tile */
  extern __shared__ float loom_smem[];
  const unsigned raw = loom_smem_addr(loom_smem), sQ = (raw + 1023u) & ~1023u, sO = sQ + TILE, sKV = sO + TILE;
  const unsigned sBar = sKV + ST * 2 * TILE, qbar = sBar + 16 * ST;   /* full[s], empty[s], then Q and dO's */
  const int T = (int)a.i[1], H = (int)a.i[2], S = (int)a.i[4], KV = (int)a.i[5];
  const bool causal = a.i[6] != 0;
  const float scale = (float)a.f[0], c2 = scale * 1.4426950408889634f;
  const int bh = blockIdx.x, b = bh / H, h = bh - b * H, kvh = h / (H / KV);
  const int n_tiles = (T + BM - 1) / BM, m0 = (n_tiles - 1 - (int)blockIdx.y) * BM;   /* long rows first */
  const int n_end = causal ? (S < m0 + BM ? S : m0 + BM) : S, nk = n_end > 0 ? (n_end + BN - 1) / BN : 0;
  const int qs = H * D;
  const unsigned short *dout = LOOM_IN(SDO, 0) + ((long long)b * T * H + h) * D;   /* (its rows' Dsum) */
  /* (the warpgroup through a shuffle: the forward says why) */
  const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
  if (tid == 0) loom_ring_init(sBar, ST, 128, qbar);
  __syncthreads();
  if (wg == 0) {   /* the producer: one thread (tensor maps 0 1 2 3: dout q k v, as dk/dv's) */
    if (tid != 0) return;
    for (int m = 0; m < 4; m++) loom_tma_prefetch(&t.m[m]);
    loom_mbar_expect_tx(qbar, 2 * TILE);
    #pragma unroll
    for (int c = 0; c < U; c++) {   /* rows past T: zeros (not stored) */
      loom_tma_load4(sQ + c * BLK, &t.m[1], 64 * c, h, m0, b, qbar);
      loom_tma_load4(sO + c * BLK, &t.m[0], 64 * c, h, m0, b, qbar);
    }
    for (int it = 0; it < nk; it++) {
      const int s = it % ST, n0 = it * BN;
      const unsigned full = sBar + 8 * s, sK = sKV + s * 2 * TILE;
      loom_mbar_wait(sBar + 8 * (ST + s), ((it / ST) & 1) ^ 1);
      loom_mbar_expect_tx(full, 2 * TILE);
      #pragma unroll
      for (int c = 0; c < U; c++) {   /* keys past S: zeros (masked) */
        loom_tma_load4(sK + c * BLK, &t.m[2], 64 * c, kvh, n0, b, full);
        loom_tma_load4(sK + TILE + c * BLK, &t.m[3], 64 * c, kvh, n0, b, full);
      }
    }
    return;
  }
  const int l = tid & 127, warp = l >> 5, lane = l & 31, t2 = (lane & 3) * 2;
  const int r0 = m0 + 16 * warp + (lane >> 2), r1 = r0 + 8;   /* this thread's two rows */
  float mrow[2], dsum[2], acc[ND][4];   /* mrow: the rows' L2 */
  loom_dq_saved_stats<BF, KD>(dout, (const float *)a.buf[5], (const float *)a.buf[4], dsum, mrow, r0, r1, T, b, h, bh,
                              t2, qs, H * D, D);
  #pragma unroll
  for (int d = 0; d < ND; d++)
    #pragma unroll
    for (int e = 0; e < 4; e++) acc[d][e] = 0.0f;
  int kmax[2];   /* the keys rows r0 and r1 see: [0, kmax) */
  #pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    const int row = hr ? r1 : r0;
    kmax[hr] = causal && row + 1 < S ? row + 1 : S;
  }
  /* n0 < this (and n0 + BN <= S): no key of the block's rows masked (per warpgroup, as the
     forward's) */
  const int interior_end = causal ? m0 + 1 - BN : S - BN + 1;
  loom_mbar_wait(qbar, 0);
  /* At D 128 pipelined as the forward (FlashAttention-3's intra-warpgroup overlap): tile it's
     S and dP are issued with tile it-1's dQ += dS K behind them, and dS of tile it is computed
     while that product is in flight.  dQ's products are the unpipelined loop's in its order
     (tile it-1's before tile it's), so the bits are the same.  The consumer holds two stages
     (K of tile it-1 for dQ, K and V of tile it), hence the third.  Not at D 64: there it takes
     162 registers against 122 and a third stage, one block an SM against two (whose
     warpgroups overlap each other's products already); at D 128 it is one block either way
     (205 registers against 157; docs/attention.md "Hopper"). */
  unsigned hi[KN][4], lo[KN][4];   /* dS (and its remainder) as dQ's A: the previous tile's (PIPE) */
  auto dq_issue = [&](unsigned sK) {   /* dQ += dS K (K's keys 16 kk ..: as the forward's V) */
    #pragma unroll
    for (int kk = 0; kk < KN; kk++) {
      const unsigned long long dk = loom_wg_desc(sK + kk * 16 * 128, BLK, 1024);
      if (LOOM_ATTN_SPLIT) loom_wgmma_rs<BF, D>(&acc[0][0], lo[kk], dk);
      loom_wgmma_rs<BF, D>(&acc[0][0], hi[kk], dk);
    }
    loom_wgmma_commit();
  };
  auto dq_done = [&]() {   /* after the wait that retires dQ's product */
    loom_wg_regs(&acc[0][0], 4 * ND);
    loom_wg_keep(&hi[0][0], 4 * KN);
    loom_wg_keep(&lo[0][0], 4 * KN);
  };
  auto dscore = [&](const bool EDGE, int n0, float (&sc)[NT][4], float (&dp)[NT][4]) {   /* a literal EDGE */
    #pragma unroll
    for (int j = 0; j < NT; j++)
      #pragma unroll
      for (int e = 0; e < 4; e++) {
        const int hr = e >> 1;
        if (EDGE && n0 + 8 * j + t2 + (e & 1) >= kmax[hr]) sc[j][e] = -LOOM_INF;
        sc[j][e] = loom_ex2(__fmaf_rn(sc[j][e], c2, -mrow[hr])) * (dp[j][e] - dsum[hr]) * scale;
      }
  };
  for (int it = 0; it < nk; it++) {
    const int st = it % ST, n0 = it * BN;
    const unsigned sK = sKV + st * 2 * TILE, sV = sK + TILE;
    float sc[NT][4], dp[NT][4];
    loom_mbar_wait(sBar + 8 * st, (it / ST) & 1);
    loom_wgmma_fence();
    #pragma unroll
    for (int kk = 0; kk < KD; kk++) {
      const unsigned ko = (kk >> 2) * BLK + (kk & 3) * 32;
      loom_wgmma_ss64<BF>(&sc[0][0], loom_wg_desc(sQ + ko, 16, 1024), loom_wg_desc(sK + ko, 16, 1024), kk > 0);
      loom_wgmma_ss64<BF>(&dp[0][0], loom_wg_desc(sO + ko, 16, 1024), loom_wg_desc(sV + ko, 16, 1024), kk > 0);
    }
    loom_wgmma_commit();
    if (PIPE && it > 0) dq_issue(sKV + ((it - 1) % ST) * 2 * TILE);
    if (PIPE && it > 0) loom_wgmma_wait<1>();   /* S and dP have landed; dQ's product may be in flight */
    else loom_wgmma_wait<0>();
    loom_wg_regs(&sc[0][0], 4 * NT);
    loom_wg_regs(&dp[0][0], 4 * NT);
    /* (the same for the whole warpgroup, checked as the forward's) */
    if (loom_wg_uniform(n0 < interior_end && n0 + BN <= S)) dscore(false, n0, sc, dp);
    else dscore(true, n0, sc, dp);
    if (PIPE) {
      loom_wgmma_wait<0>();   /* dQ's product too */
      dq_done();
      if (it > 0) loom_mbar_arrive(sBar + 8 * (ST + (it - 1) % ST));
    }
    #pragma unroll
    for (int kk = 0; kk < KN; kk++) loom_frag_pack<BF>(sc, 2 * kk, hi[kk], lo[kk]);
    if (!PIPE) {   /* this tile's dQ += dS K at once */
      loom_wgmma_fence();
      dq_issue(sK);
      loom_wgmma_wait<0>();
      dq_done();
      loom_mbar_arrive(sBar + 8 * (ST + st));
    }
  }
  if (PIPE && nk > 0) {   /* the last tile's dQ += dS K */
    loom_wgmma_fence();
    dq_issue(sKV + ((nk - 1) % ST) * 2 * TILE);
    loom_wgmma_wait<0>();
    dq_done();
    loom_mbar_arrive(sBar + 8 * (ST + (nk - 1) % ST));
  }
  loom_dq_finish<SDQ, ND>(LOOM_OUT(SDQ, 6), nullptr, (float *)a.buf[7], acc, mrow, dsum, nk > 0, r0, r1, T, b, h, bh, t2,
                          H * D, D);
#else
  (void)a;
  (void)t;
  __trap();   /* LOOM_CUDA_WGMMA=1's kernels need an sm_90a device (docs/attention.md) */
#endif
}
