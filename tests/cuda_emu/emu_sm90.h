/* tests/cuda_emu/emu_sm90.h — the emulated device's sm_90a instructions (included by emu.h):
 * the twins of kernels/attention_sm90.cuh's loom_* wrappers, written from the PTX ISA
 * (9.7.15 wgmma, 9.7.9.25 cp.async.bulk, 9.7.13.15 mbarrier), not from any kernel:
 *
 *   shared addresses   loom_emu_smem_addr: the byte offset of a pointer into the emulator's
 *                      shared-memory window (dynamic shared memory ends at its guard page,
 *                      so its start is 16-byte aligned only: a kernel that assumes the
 *                      swizzle atoms' 1024-byte alignment without aligning shows)
 *   mbarrier           init (count), arrive, arrive.expect_tx (tx-count += bytes, then
 *                      arrive), try_wait.parity (true when the phase of that parity has
 *                      completed: the current phase's parity differs).  A phase completes
 *                      when its pending arrivals and its tx-count are both 0; then the
 *                      phase flips and the arrivals are re-armed.  A try_wait that finds
 *                      the phase incomplete yields; a block whose threads all spin with no
 *                      event is a deadlock (emu.h's scheduler).
 *   cp.async.bulk      global -> shared, complete_tx on an mbarrier: size a positive
 *                      multiple of 16, both addresses 16-byte aligned, the destination
 *                      inside dynamic shared memory (else the launch fails).  The copy
 *                      lands late, at the first try_wait on its mbarrier: a consumer that
 *                      reads before waiting reads the 0xff fill.  A block that ends with a
 *                      copy in flight fails.  With bulk_eager set it lands at once instead:
 *                      a producer that refills a stage its consumers still read shows.
 *   cp.async.bulk.tensor  global -> shared from a tensor map (emu_tmap.h: what the fake
 *                      driver's cuTensorMapEncodeTiled encoded, checked as the driver API
 *                      documents it), tile mode, complete_tx on an mbarrier: the
 *                      instruction's dimensionality must be the map's rank; the destination
 *                      128-byte aligned (1024 with the 128-byte swizzle: the pattern's
 *                      repeat) and inside dynamic shared memory.  The box lands packed,
 *                      innermost dimension first, each 16-byte unit's address bits [4, 7)
 *                      XORed with bits [7, 10) (128B; 64B and 32B: the low 2 and 1 of
 *                      them), the wgmma descriptors' swizzle; an element whose coordinate
 *                      is outside the tensor (negative too) lands as zeros (NaN with the
 *                      map's NaN fill); complete_tx counts the whole box's bytes.  Landing
 *                      as cp.async.bulk's (late, or at once with bulk_eager); the map is
 *                      read when the copy is issued.
 *   wgmma              fence / commit_group / wait_group N / mma_async m64nNk16 f32 +=
 *                      {bf16,f16}: a warpgroup-wide operation (the 128 threads of the 4
 *                      aligned warps arrive; one that exited is an error).  A and B from
 *                      shared memory through matrix descriptors (start, leading and stride
 *                      byte offsets, swizzle none/32B/64B/128B; K-major or, with imm-trans,
 *                      MN-major: the canonical layouts of PTX ISA 9.7.15.5.1.2.1.3, the
 *                      swizzle XORing address bits [4, 4 + log2(width / 16)) with those
 *                      from bit 7), or A from registers in mma.sync's fragment layout per
 *                      warp (warp w: rows 16w..16w+15).  D: warp w's rows, n8 block j in
 *                      d[4j..4j+3] as mma.sync's C.  The result reaches the registers at
 *                      the wait_group that retires its group: until then they hold NaN (a
 *                      thread reading its accumulators early sees it); an mma_async with
 *                      no wgmma.fence since the thread's last wait_group fails.  Its
 *                      operands' shared bytes stay in flight until then: a copy issued
 *                      into them fails (check_inflight), and an mbarrier arrival
 *                      that completes a phase yields, so a waiting producer copies before
 *                      the arriving thread goes on (a stage released too early shows).  Matrix
 *                      base offsets other than 0 are not emulated (they fail).  Whether the
 *                      warpgroup reached the same mma_async instruction is not seen; a
 *                      kernel names the conditions of such branches (loom_wg_uniform),
 *                      and those are checked.  A test may have the warpgroups of the
 *                      mma_asyncs recorded in issue order (wg_trace).
 *
 *   setmaxnreg         .inc / .dec n: warpgroup-wide (a thread that exits while its
 *                      warpgroup waits in it fails), n a multiple of 8 in [24, 256], .dec
 *                      not above and .inc not below the warpgroup's limit; once every
 *                      warpgroup of the block has set one, their sum x 128 within 65536.
 *
 * Not modelled: the async proxy (fence.proxy.async is a no-op), clusters, speed.
 */
#ifndef LOOM_CUDA_EMU_SM90_H
#define LOOM_CUDA_EMU_SM90_H

#include "emu_tmap.h"

namespace loom_emu {

struct Mbar {
  unsigned addr;
  int expected, pending, tx;
  unsigned phase;
};
struct BulkCopy {
  unsigned dst, bar, bytes;
  const void *src;
  int tensor;          /* cp.async.bulk.tensor: the map and the box's first coordinates */
  int c[5];
  LoomEmuTmap map;
};
enum { MAX_READS = 16 };
struct WgPending {   /* an mma_async's result for one thread, until its group retires */
  float *d;
  int n, group;      /* group -1: not committed yet */
  float v[128];
  int nr;            /* the shared bytes its operands read [lo, hi) (those of every mma_async */
  unsigned lo[MAX_READS], hi[MAX_READS];   /* accumulating onto it): in flight until it retires */
};
enum { MAX_BARS = 64, MAX_COPIES = 1 << 16, MAX_PENDING = 24, WG = 128 };
static Mbar bars[MAX_BARS];
static int n_bars;
static BulkCopy *copies;
static bool bulk_eager;   /* copies land when issued (else at the first wait on their mbarrier) */
static int n_copies;
static WgPending (*pend)[MAX_PENDING];   /* [MAX_THREADS][MAX_PENDING] */
static int n_pend[MAX_THREADS], groups[MAX_THREADS], fenced[MAX_THREADS];
/* a warpgroup's exchange for one mma_async: its operands as the 128 threads give them */
struct Wgx {
  int arrived;
  unsigned long long da, db;
  int n, scale_d, trans_a, trans_b, rs, bf;
  int nr;                   /* the shared bytes A (from a descriptor) and B span: [lo, hi) */
  unsigned lo[2], hi[2];
  unsigned a[WG][4];
  float A[64][16], B[16][256];
};
static Wgx wgx[MAX_THREADS / WG];
/* when set (a test), the warpgroup of each wgmma.mma_async, in the order they are issued: a
   kernel's schedule between its warpgroups (the forward's ping-pong) */
static int *wg_trace, wg_trace_n, wg_trace_max;
static int wg_regs[MAX_THREADS / WG];   /* setmaxnreg's limit per warpgroup (0: the launch's, unknown) */

static void sm90_block_start() {
  n_bars = n_copies = 0;
  for (int t = 0; t < MAX_THREADS; t++) n_pend[t] = groups[t] = fenced[t] = 0;
  for (int w = 0; w < MAX_THREADS / WG; w++) wgx[w].arrived = 0, wg_regs[w] = 0;
}
static void sm90_block_end() {
  if (n_copies) fail("%s: the block ended with a bulk copy in flight (no thread waited on its mbarrier)", "cp.async.bulk");
  for (int t = 0; t < n_threads; t++)
    if (n_pend[t]) fail("%s: a thread ended with a wgmma.mma_async not retired by a wgmma.wait_group", "wgmma");
}

/* a thread that exits while the rest of its warpgroup waits in a warpgroup-wide instruction
   (wgmma, setmaxnreg: .sync.aligned) leaves them waiting forever */
static void sm90_thread_exit() {
  if (cur / WG < MAX_THREADS / WG && wgx[cur / WG].arrived > 0)
    fail("%s: a thread exited while the rest of its warpgroup waits in a warpgroup-wide instruction (wgmma, setmaxnreg)",
         "warpgroup");
}

static unsigned window_end() { return (unsigned)(smem_map_bytes - 4096); }
static unsigned window_start() { return (unsigned)(dyn_smem - smem_map); }

/* [addr, addr + bytes) inside this launch's dynamic shared memory, as a host pointer */
static unsigned char *smem_at(unsigned addr, unsigned bytes, const char *what) {
  if (addr < window_start() || addr + (unsigned long)bytes > window_end()) {
    char msg[200];
    snprintf(msg, sizeof msg, "%.80s: shared address %#x (+%u bytes) outside the launch's dynamic shared memory [%#x, %#x)",
             what, addr, bytes, window_start(), window_end());
    fail("%s", msg);
    static unsigned char scratch[1024];
    return scratch;
  }
  return smem_map + addr;
}

static Mbar *bar_at(unsigned addr, const char *what) {
  for (int i = 0; i < n_bars; i++)
    if (bars[i].addr == addr) return &bars[i];
  char msg[160];
  snprintf(msg, sizeof msg, "%.60s on shared address %#x, which no mbarrier.init initialized", what, addr);
  fail("%s", msg);
  return NULL;
}

static void bar_check_phase(Mbar *b) {
  if (b->pending == 0 && b->tx == 0) {
    b->phase++;
    b->pending = b->expected;
  }
}

/* Shared memory [dst, dst + bytes) a copy being issued may write any time from now: no
   wgmma.mma_async still in flight (issued, its group not retired by its thread's wait_group)
   may read it.  On a GPU the tensor cores may read their shared operands any time until then,
   so such a copy (a stage released to the producer before the products reading it retired) is
   a race.  (A read of a destination before its copy landed shows as the 0xff fill.) */
static void check_inflight(unsigned dst, unsigned bytes, const char *what) {
  for (int t = 0; t < n_threads; t++)
    for (int i = 0; i < n_pend[t]; i++)
      for (int r = 0; r < pend[t][i].nr; r++)
        if (dst < pend[t][i].hi[r] && pend[t][i].lo[r] < dst + bytes) {
          char msg[240];
          snprintf(msg, sizeof msg,
                   "%.40s into shared [%#x, %#x) while thread %d's wgmma.mma_async reading [%#x, %#x) is in flight (its "
                   "wait_group has not retired it: a stage released before its products retired)",
                   what, dst, dst + bytes, t, pend[t][i].lo[r], pend[t][i].hi[r]);
          fail("%s", msg);
          return;
        }
}

/* a tensor copy's box into shared memory (the map and coordinates checked when issued) */
static void tensor_land(const BulkCopy &c) {
  const LoomEmuTmap &m = c.map;
  const unsigned es = m.elem;
  unsigned n[5] = {1, 1, 1, 1, 1};   /* elements traversed per dim */
  for (int d = 0; d < m.rank; d++) n[d] = d == 0 ? m.box[0] : (m.box[d] + m.estride[d] - 1) / m.estride[d];
  unsigned char *base = smem_at(c.dst, c.bytes, "cp.async.bulk.tensor");
  unsigned off = 0;
  for (unsigned i4 = 0; i4 < n[4]; i4++)
    for (unsigned i3 = 0; i3 < n[3]; i3++)
      for (unsigned i2 = 0; i2 < n[2]; i2++)
        for (unsigned i1 = 0; i1 < n[1]; i1++)
          for (unsigned i0 = 0; i0 < n[0]; i0++, off += es) {
            const unsigned idx[5] = {i0, i1, i2, i3, i4};
            bool in = true;
            unsigned long long at = m.addr;
            for (int d = 0; d < m.rank; d++) {
              const long long g = (long long)c.c[d] + (long long)idx[d] * (d ? m.estride[d] : 1);
              if (g < 0 || (unsigned long long)g >= m.dim[d]) in = false;
              else at += (unsigned long long)g * (d ? m.stride[d - 1] : es);
            }
            unsigned a = c.dst + off;
            if (m.swizzle_bytes) a ^= ((a >> 7) & (m.swizzle_bytes / 16 - 1)) << 4;
            unsigned char *p = base + (a - c.dst);
            if (in) memcpy(p, (const void *)(uintptr_t)at, es);
            else memset(p, m.oob_nan ? 0xff : 0, es);
          }
}

/* the copies that signal mbarrier addr land: data, then complete_tx */
static void land_copies(unsigned addr) {
  int k = 0;
  for (int i = 0; i < n_copies; i++) {
    BulkCopy c = copies[i];
    if (c.bar != addr) {
      copies[k++] = c;
      continue;
    }
    if (c.tensor) tensor_land(c);
    else memcpy(smem_at(c.dst, c.bytes, "cp.async.bulk"), c.src, c.bytes);
    Mbar *b = bar_at(c.bar, "cp.async.bulk's complete_tx");
    if (b) {
      b->tx -= (int)c.bytes;
      bar_check_phase(b);
    }
    progress++;
  }
  n_copies = k;
}

/* Every thread of the current warpgroup arrives; the last to arrive runs last() first. */
static void wg_barrier(const char *what, void (*last)(Wgx *)) {
  const int w = cur / WG;
  if (n_threads < (w + 1) * WG) {
    fail("%s in a block whose threads do not fill whole warpgroups of 128", what);
    yield();
    return;
  }
  for (int t = w * WG; t < (w + 1) * WG; t++)
    if (fibers[t].state == DONE) {
      fail("%s with threads of the warpgroup exited (undefined on a GPU)", what);
      yield();
      return;
    }
  fibers[cur].state = AT_WARP;
  if (++wgx[w].arrived == WG) {
    if (last) last(&wgx[w]);
    for (int t = w * WG; t < (w + 1) * WG; t++)
      if (fibers[t].state == AT_WARP) fibers[t].state = RUN;
    wgx[w].arrived = 0;
  }
  yield();
}

/* The shared address of element (mn, k) (16-bit elements, T = 8 a 16-byte unit) of a
   wgmma operand: the canonical layouts ((8,m),(T,2k)) K-major and ((T,W,m),(8,k)) MN-major of
   the PTX ISA, then the swizzle on the address bits. */
static unsigned desc_addr(unsigned long long desc, int mn, int k, bool mn_major) {
  const unsigned start = (unsigned)(desc & 0x3fffu) << 4, lbo = (unsigned)((desc >> 16) & 0x3fffu) << 4,
                 sbo = (unsigned)((desc >> 32) & 0x3fffu) << 4;
  const unsigned mode = (unsigned)(desc >> 62), W = mode == 1 ? 8 : mode == 2 ? 4 : mode == 3 ? 2 : 1;
  unsigned off;
  if (!mn_major)   /* rows of W 16-byte units (no swizzle: one), 8-row groups SBO apart */
    off = (mn % 8) * 16 * W + (mn / 8) * sbo + (k % 8) * 2 + (k / 8) * (W == 1 ? lbo : 16);
  else if (W == 1)   /* ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)) */
    off = (mn % 8) * 2 + (mn / 8) * sbo + (k % 8) * 16 + (k / 8) * lbo;
  else   /* ((T,W,m),(8,k)):((1,T,LBO),(WT,SBO)) */
    off = (mn % 8) * 2 + (mn / 8 % W) * 16 + (mn / (8 * W)) * lbo + (k % 8) * 16 * W + (k / 8) * sbo;
  unsigned addr = start + off;
  if (W > 1) addr ^= ((addr >> 7) & (W - 1)) << 4;
  return addr;
}

/* element (mn, k) of a descriptor's operand; [*lo, *hi) widened to the bytes it occupies */
static float desc_elem(unsigned long long desc, int mn, int k, bool mn_major, bool bf, unsigned *lo, unsigned *hi) {
  const unsigned addr = desc_addr(desc, mn, k, mn_major);
  if (addr < *lo) *lo = addr;
  if (addr + 2 > *hi) *hi = addr + 2;
  unsigned short h;
  memcpy(&h, smem_at(addr, 2, "wgmma operand"), 2);
  return loom_emu_half(h, bf);
}

/* the last thread of the warpgroup to arrive decodes A (64 x 16) and B (16 x N) once */
static void wg_decode(Wgx *x) {
  if (wg_trace && wg_trace_n < wg_trace_max) wg_trace[wg_trace_n++] = (int)(x - wgx);
  if ((x->da >> 49 & 7) || (x->db >> 49 & 7)) fail("%s: a matrix base offset other than 0 (not emulated)", "wgmma");
  /* the shared bytes A (from a descriptor) and B span, [lo, hi): in flight until retired */
  x->nr = x->rs ? 1 : 2;
  x->lo[0] = x->lo[1] = ~0u, x->hi[0] = x->hi[1] = 0;
  unsigned *lo_b = &x->lo[x->nr - 1], *hi_b = &x->hi[x->nr - 1];
  for (int r = 0; r < 64; r++)
    for (int k = 0; k < 16; k++) {
      if (x->rs) {   /* warp r / 16's fragment, mma.sync's A layout */
        const int w = r / 16, rr = r % 16, lane = (rr % 8) * 4 + (k % 8) / 2, reg = rr / 8 + 2 * (k / 8);
        x->A[r][k] = loom_emu_half(x->a[w * 32 + lane][reg] >> (16 * (k % 2)), x->bf);
      } else {
        x->A[r][k] = desc_elem(x->da, r, k, x->trans_a, x->bf, &x->lo[0], &x->hi[0]);
      }
    }
  for (int k = 0; k < 16; k++)
    for (int n = 0; n < x->n; n++) x->B[k][n] = desc_elem(x->db, n, k, x->trans_b, x->bf, lo_b, hi_b);
}

/* a range into a pending result's reads: merged with one it touches, else appended (when
   full, the last grows to cover it) */
static void pend_read(WgPending *p, unsigned lo, unsigned hi) {
  for (int i = 0; i < p->nr; i++)
    if (lo <= p->hi[i] && p->lo[i] <= hi) {
      if (lo < p->lo[i]) p->lo[i] = lo;
      if (hi > p->hi[i]) p->hi[i] = hi;
      return;
    }
  if (p->nr < MAX_READS) {
    p->lo[p->nr] = lo, p->hi[p->nr++] = hi;
    return;
  }
  int i = MAX_READS - 1;   /* full: the last range grows to cover this one */
  if (lo < p->lo[i]) p->lo[i] = lo;
  if (hi > p->hi[i]) p->hi[i] = hi;
}

}  // namespace loom_emu

static inline unsigned loom_emu_smem_addr(const void *p) {
  using namespace loom_emu;
  const unsigned char *c = (const unsigned char *)p;
  if (c < dyn_smem || c >= smem_map + window_end()) {
    fail("%s: a pointer outside dynamic shared memory taken as a shared address", "cvta.to.shared");
    return 0;
  }
  return (unsigned)(c - smem_map);
}

static inline void loom_emu_mbar_init(unsigned addr, unsigned count) {
  using namespace loom_emu;
  if (addr % 8) fail("%s: mbarrier object not 8-byte aligned", "mbarrier.init");
  if (count < 1 || count > (1u << 20) - 1) fail("%s: arrival count out of [1, 2^20 - 1]", "mbarrier.init");
  smem_at(addr, 8, "mbarrier.init");
  Mbar *b = NULL;
  for (int i = 0; i < n_bars; i++)
    if (bars[i].addr == addr) b = &bars[i];
  if (!b) {
    if (n_bars == MAX_BARS) {
      fail("%s: more mbarriers than the emulator holds", "mbarrier.init");
      return;
    }
    b = &bars[n_bars++];
  }
  *b = Mbar{addr, (int)count, (int)count, 0, 0u};
  progress++;
}

static inline void loom_emu_mbar_arrive(unsigned addr, unsigned tx_bytes) {
  using namespace loom_emu;
  Mbar *b = bar_at(addr, tx_bytes ? "mbarrier.arrive.expect_tx" : "mbarrier.arrive");
  if (!b) return;
  b->tx += (int)tx_bytes;
  if (b->tx > (1 << 20) - 1) fail("%s: tx-count past 2^20 - 1", "mbarrier.arrive.expect_tx");
  if (--b->pending < 0) fail("%s: more arrivals than the phase expects", "mbarrier.arrive");
  const unsigned phase = b->phase;
  bar_check_phase(b);
  progress++;
  /* the arrival that completes a phase lets the threads waiting on it run before this one
     goes on (a GPU's other warps run meanwhile): a producer refilling a stage then copies
     while what this thread issued before it arrived is still in flight (check_inflight) */
  if (b->phase != phase) yield();
}

static inline bool loom_emu_mbar_try_wait(unsigned addr, unsigned parity) {
  using namespace loom_emu;
  land_copies(addr);
  Mbar *b = bar_at(addr, "mbarrier.try_wait.parity");
  if (!b) {
    yield();
    return true;
  }
  if ((b->phase & 1u) != (parity & 1u)) {
    progress++;
    return true;
  }
  spin_yield = 1;
  yield();
  return false;
}

static inline void loom_emu_bulk_copy(unsigned dst, const void *src, unsigned bytes, unsigned bar) {
  using namespace loom_emu;
  if (!copies) copies = (BulkCopy *)malloc(sizeof(BulkCopy) * MAX_COPIES);
  if (bytes == 0 || bytes % 16) fail("%s: size not a positive multiple of 16 bytes", "cp.async.bulk");
  if (dst % 16) fail("%s: shared destination not 16-byte aligned", "cp.async.bulk");
  loom_emu_check_align(src, 16, "cp.async.bulk global source");
  smem_at(dst, bytes, "cp.async.bulk destination");
  if (!bar_at(bar, "cp.async.bulk's mbarrier")) return;
  if (n_copies == MAX_COPIES) {
    fail("%s: more copies in flight than the emulator holds", "cp.async.bulk");
    return;
  }
  if (pend) check_inflight(dst, bytes, "cp.async.bulk");   /* issued: it may land any time now */
  BulkCopy &c = copies[n_copies++];
  c.dst = dst, c.bar = bar, c.bytes = bytes, c.src = src, c.tensor = 0;
  if (bulk_eager) land_copies(bar);
}

/* cp.async.bulk.tensor.<nc>d.shared::cluster.global.tile.mbarrier::complete_tx::bytes */
static inline void loom_emu_tensor_copy(unsigned dst, const void *map, const int *coord, int nc, unsigned bar) {
  using namespace loom_emu;
  const char *what = "cp.async.bulk.tensor";
  if (!copies) copies = (BulkCopy *)malloc(sizeof(BulkCopy) * MAX_COPIES);
  LoomEmuTmap m;
  if ((uintptr_t)map % 64) {
    fail("%s: the tensor map's address is not 64-byte aligned", what);
    return;
  }
  memcpy(&m, map, sizeof m);
  if (m.magic != LOOM_EMU_TMAP_MAGIC) {
    fail("%s: not a tensor map (cuTensorMapEncodeTiled did not write these 128 bytes)", what);
    return;
  }
  if (m.rank != nc) {
    char msg[120];
    snprintf(msg, sizeof msg, "%s.%dd on a tensor map of rank %d", what, nc, (int)m.rank);
    fail("%s", msg);
    return;
  }
  const unsigned align = m.swizzle_bytes == 128 ? 1024 : 128;
  if (dst % align) {
    char msg[120];
    snprintf(msg, sizeof msg, "%s: shared destination %#x not %u-byte aligned", what, dst, align);
    fail("%s", msg);
    return;
  }
  unsigned long long bytes = m.elem;
  for (int d = 0; d < m.rank; d++) bytes *= d == 0 ? m.box[0] : (m.box[d] + m.estride[d] - 1) / m.estride[d];
  smem_at(dst, (unsigned)bytes, "cp.async.bulk.tensor destination");
  if (!bar_at(bar, "cp.async.bulk.tensor's mbarrier")) return;
  if (n_copies == MAX_COPIES) {
    fail("%s: more copies in flight than the emulator holds", what);
    return;
  }
  if (pend) check_inflight(dst, (unsigned)bytes, what);   /* issued: it may land any time now */
  BulkCopy &c = copies[n_copies++];
  c.dst = dst, c.bar = bar, c.bytes = (unsigned)bytes, c.src = NULL, c.tensor = 1, c.map = m;
  for (int d = 0; d < 5; d++) c.c[d] = d < nc ? coord[d] : 0;
  if (bulk_eager) land_copies(bar);
}

static inline void loom_emu_wgmma_fence() { loom_emu::fenced[loom_emu::cur] = 1; }

static inline void loom_emu_wgmma_commit() {
  using namespace loom_emu;
  const int t = cur;
  groups[t]++;
  for (int i = 0; i < n_pend[t]; i++)
    if (pend[t][i].group < 0) pend[t][i].group = groups[t];
}

/* wait_group N: the thread's committed groups but the newest N retire: results to registers */
static inline void loom_emu_wgmma_wait(int N) {
  using namespace loom_emu;
  const int t = cur;
  int k = 0;
  for (int i = 0; i < n_pend[t]; i++) {
    WgPending *p = &pend[t][i];
    if (p->group >= 0 && p->group <= groups[t] - N) memcpy(p->d, p->v, sizeof(float) * p->n);
    else pend[t][k++] = *p;
  }
  n_pend[t] = k;
  fenced[t] = 0;   /* the thread may touch its registers now: the next mma_async needs a fence */
}

/* wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16}: d (N / 2 registers) = A B + (scale_d ? d : 0);
   A from registers a (rs) or descriptor da (trans_a: M-major), B from descriptor db (trans_b: N-major) */
static inline void loom_emu_wgmma(float *d, int N, const unsigned *a, unsigned long long da, unsigned long long db,
                                  int scale_d, int trans_a, int trans_b, bool bf) {
  using namespace loom_emu;
  const int t = cur, l = cur % WG, w = cur / WG;
  if (!pend) pend = (WgPending(*)[MAX_PENDING])calloc(MAX_THREADS, sizeof *pend);
  if (!fenced[t]) fail("%s without a wgmma.fence since the thread last waited (wgmma.wait_group)", "wgmma.mma_async");
  if (N < 8 || N > 256 || N % 8) fail("%s: N not a multiple of 8 in [8, 256]", "wgmma.mma_async");
  Wgx *x = &wgx[w];
  if (wgx[w].arrived == 0) {
    x->da = da, x->db = db, x->n = N, x->scale_d = scale_d, x->trans_a = trans_a, x->trans_b = trans_b;
    x->rs = a != NULL, x->bf = bf;
  } else if (x->da != da || x->db != db || x->n != N || x->scale_d != scale_d || x->trans_a != trans_a ||
             x->trans_b != trans_b || x->rs != (a != NULL) || x->bf != bf) {
    fail("%s: the threads of the warpgroup give different descriptors, shapes or flags", "wgmma.mma_async");
  }
  if (a)
    for (int r = 0; r < 4; r++) x->a[l][r] = a[r];
  wg_barrier("wgmma.mma_async", wg_decode);
  /* this thread's outputs: warp l / 32's rows, as mma.sync's C per n8 block */
  const int wq = l / 32, g = l % 32 / 4, t4 = l % 4;
  WgPending *p = NULL;
  for (int i = 0; i < n_pend[t]; i++)
    if (pend[t][i].d == d) p = &pend[t][i];   /* accumulating onto a result still in flight */
  float c[128];
  for (int i = 0; i < N / 2; i++) c[i] = !scale_d ? 0.0f : p ? p->v[i] : d[i];
  const bool onto = p != NULL;
  if (!p) {
    if (n_pend[t] == MAX_PENDING) {
      fail("%s: more results in flight than the emulator holds", "wgmma.mma_async");
      p = &pend[t][0];
    } else {
      p = &pend[t][n_pend[t]++];
    }
  }
  if (!onto) p->nr = 0;
  for (int r = 0; r < x->nr; r++) pend_read(p, x->lo[r], x->hi[r]);
  p->d = d, p->n = N / 2, p->group = -1;
  for (int i = 0; i < N / 2; i++) {
    const int row = 16 * wq + g + 8 * (i % 4 / 2), col = 8 * (i / 4) + 2 * t4 + i % 2;
    float s = 0.0f;
    for (int k = 0; k < 16; k++) s += x->A[row][k] * x->B[k][col];
    p->v[i] = c[i] + s;
    d[i] = NAN;
  }
  wg_barrier("wgmma.mma_async", NULL);
}

/* A condition every thread of the warpgroup must evaluate the same (a branch around a wgmma:
   the PTX ISA leaves a wgmma.mma_async undefined otherwise); the kernel names it with
   loom_wg_uniform, and here the 128 threads compare. */
static inline bool loom_emu_wg_uniform(bool c) {
  using namespace loom_emu;
  Wgx *x = &wgx[cur / WG];
  if (x->arrived == 0) x->n = c;
  else if (x->n != (int)c) fail("%s: the threads of a warpgroup take a branch around a wgmma differently", "wgmma");
  wg_barrier("loom_wg_uniform", NULL);   /* each thread compared as it arrived */
  return c;
}

/* setmaxnreg.{inc,dec}.sync.aligned.u32 n: warpgroup-wide (all 128 threads arrive, none exited),
   n a multiple of 8 in [24, 256]; .dec lowers the warpgroup's per-thread register limit to n
   (not above its current one), .inc raises it (not below), waiting until the block's pool holds
   the registers.  The emulator does not know the count a kernel was built with, so the pool is
   checked once every warpgroup of the block has set its limit: more than the SM's 65536
   registers asked for is an .inc that waits forever on a GPU, and fails here. */
static inline void loom_emu_setmaxnreg(unsigned n, bool inc) {
  using namespace loom_emu;
  const char *what = inc ? "setmaxnreg.inc" : "setmaxnreg.dec";
  if (n < 24 || n > 256 || n % 8) fail("%s: register count not a multiple of 8 in [24, 256]", what);
  const int w = cur / WG;
  Wgx *x = &wgx[w];
  if (x->arrived == 0) x->n = (int)n, x->scale_d = inc;
  else if (x->n != (int)n || x->scale_d != (int)inc)
    fail("%s: the threads of the warpgroup execute different setmaxnreg instructions", what);
  wg_barrier(what, NULL);
  if (wg_regs[w] && (inc ? (int)n < wg_regs[w] : (int)n > wg_regs[w])) {
    char msg[120];
    snprintf(msg, sizeof msg, "%s %u: the warpgroup's limit is %d", what, n, wg_regs[w]);
    fail("%s", msg);
  }
  wg_regs[w] = (int)n;
  int sum = 0, known = 1;
  for (int g = 0; g < (n_threads + WG - 1) / WG; g++) sum += wg_regs[g], known &= wg_regs[g] != 0;
  if (known && sum * WG > 65536) {
    char msg[160];
    snprintf(msg, sizeof msg, "%s: the block's warpgroups hold %d registers a thread, %d in all: more than an SM's 65536",
             what, sum, sum * WG);
    fail("%s", msg);
  }
}

#endif
