/* tests/unit/test_cuda_runtime.c — the CUDA runtime (runtime/cuda_api, cuda_exec, comm_nccl).
 *
 * Without arguments (CI, no GPU needed): the libraries' absence is reported clearly and
 * nothing crashes (a missing libcuda, the toolkit's stub libcuda, a missing cuBLASLt, NCCL
 * without a GPU); the pure parts are checked exactly: LoomArgs packing, the cuBLASLt layout
 * of a row-major GEMM (against a column-major interpretation of it), storage conversions
 * (every bf16/f16/f8 value), global initialization (bitwise cpu_globals_init), program
 * checks, the memory plan (NCCL's bootstrap variables and rendezvous: test_nccl_boot.c).
 *
 * --gpu (tests/gpu/run.sh, on a machine with a GPU): loads the PTX of tests/gpu/test_kernels.cu
 * and runs, through cuda_program_call, kernels and GEMMs (f32, bf16 -> f32 and bf16,
 * transposed, batched with a shared operand) against a C mirror; globals initialized bitwise
 * as on the CPU; the training Executor (grad/optimizer steps, sync_out/sync_in) bitwise
 * against its mirror; a missing kernel and a faulting kernel reported with their names, the
 * process going on afterwards; a one-rank NCCL world.  --no-fault leaves out the faulting
 * kernel (for compute-sanitizer).  Without a device --gpu prints SKIP lines and passes.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/comm/comm_nccl.h"
#include "runtime/cpu/cpu_exec.h"
#include "runtime/cpu/cpu_kernels.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda/cuda_exec.h"
#include "runtime/cuda/cuda_tmap.h"
#include "tests/gpu/test_kernels_ptx.h"
#include "tests/unit/check.h"
#include "tests/unit/nccl_boot_env.h"

static bool has(const char *s, const char *part) { return s && strstr(s, part) != NULL; }

static uint32_t f2u(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}

static uint64_t rng = 0x12345678;
static uint32_t next_u32(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng >> 33);
}
static float next_normal(void) {   /* roughly N(0,1), enough for test data */
  float s = 0;
  for (int k = 0; k < 12; k++) s += (float)(next_u32() & 0xFFFFFF) / 16777216.0f;
  return s - 6.0f;
}

/* ================================================================== programs */

/* Buffers laid out per region, 256-byte aligned, in native sizes. */
typedef struct {
  int64_t next[RT_REGION_COUNT];
} Lay;

static RtBuf mk(Lay *l, int region, RtStorage st, int64_t n) {
  RtBuf b;
  memset(&b, 0, sizeof b);
  b.region = (uint8_t)region;
  b.storage = (uint8_t)st;
  b.is_int = st == RT_ST_I32;
  b.round = st == RT_ST_BF16 ? RT_ROUND_BF16 : RT_ROUND_NONE;
  b.offset = l->next[region];
  b.n = n;
  l->next[region] += (n * cuda_storage_size(st) + 255) / 256 * 256;
  return b;
}

static RtStep kstep(int which, const char *label, int n_in, int n_out, const RtBuf *bufs, int64_t threads) {
  RtStep s;
  memset(&s, 0, sizeof s);
  s.kind = RT_STEP_KERNEL;
  s.which = which;
  s.n_in = n_in;
  s.n_out = n_out;
  for (int k = 0; k < n_in + n_out; k++) s.bufs[k] = bufs[k];
  snprintf(s.label, sizeof s.label, "%s", label);
  s.block[0] = threads < 128 ? (uint32_t)threads : 128;
  s.grid[0] = (uint32_t)((threads + s.block[0] - 1) / s.block[0]);
  s.grid[1] = s.grid[2] = s.block[1] = s.block[2] = 1;
  return s;
}

static RtStep gstep(const char *label, RtBuf a, RtBuf b, RtBuf c, int64_t batch, int64_t M, int64_t N, int64_t K, int ta,
                    int tb, int64_t sa, int64_t sb, int64_t sc) {
  RtStep s;
  memset(&s, 0, sizeof s);
  s.kind = RT_STEP_GEMM;
  s.n_in = 2;
  s.n_out = 1;
  s.bufs[0] = a;
  s.bufs[1] = b;
  s.bufs[2] = c;
  int64_t i[9] = {batch, M, N, K, ta, tb, sa, sb, sc};
  memcpy(s.i, i, sizeof i);
  snprintf(s.label, sizeof s.label, "%s", label);
  return s;
}

enum { K_AFFINE, K_TO_BF16, K_FAULT, K_GRAD, K_OPT, K_MISSING, N_KNAMES };
static char knames[N_KNAMES][32] = {"t_affine", "t_to_bf16", "t_fault", "t_grad", "t_opt", "t_missing"};

/* @f(A: f32[M,K], B: f32[K,N]) -> C, Cb, D, H, F:
     A2 = A * 0.5 + 0.25                     (kernel)
     C  = A2 B                               (f32 GEMM)
     Cb = bf16(C)                            (kernel)
     D  = Cb^T E^T, E a bf16 parameter [P,M] (bf16 GEMM, f32 result, both transposed)
     H  = the same with a bf16 result
     F  = A2 as [2, M/2, K] times the shared B (batched, strideB 0) */
enum { GM = 64, GN = 48, GK = 32, GP = 40 };
typedef struct {
  RtProgram p;
  RtFunc f;
  RtStep steps[6];
  RtGlobal g[1];
  RtBuf A, B, A2, C, Cb, E, D, H, F;
} GemmProg;

static void build_gemm_program(GemmProg *g) {
  memset(g, 0, sizeof *g);
  Lay l;
  memset(&l, 0, sizeof l);
  g->A = mk(&l, RT_REGION_ARENA, RT_ST_F32, GM * GK);
  g->B = mk(&l, RT_REGION_ARENA, RT_ST_F32, GK * GN);
  g->A2 = mk(&l, RT_REGION_ARENA, RT_ST_F32, GM * GK);
  g->C = mk(&l, RT_REGION_ARENA, RT_ST_F32, GM * GN);
  g->Cb = mk(&l, RT_REGION_ARENA, RT_ST_BF16, GM * GN);
  g->D = mk(&l, RT_REGION_ARENA, RT_ST_F32, GN * GP);
  g->H = mk(&l, RT_REGION_ARENA, RT_ST_BF16, GN * GP);
  g->F = mk(&l, RT_REGION_ARENA, RT_ST_F32, GM * GN);
  g->E = mk(&l, RT_REGION_PARAMS, RT_ST_BF16, GP * GM);
  RtGlobal *e = &g->g[0];
  snprintf(e->name, sizeof e->name, "e.weight");
  e->region = RT_REGION_PARAMS;
  e->offset = g->E.offset;
  e->n = g->E.n;
  e->rank = 2;
  e->shape[0] = GP;
  e->shape[1] = GM;
  e->init = RT_INIT_NORMAL;
  e->init_value = 1.0;
  e->round = RT_ROUND_BF16;
  RtBuf b0[2] = {g->A, g->A2};
  g->steps[0] = kstep(K_AFFINE, "affine %a2", 1, 1, b0, GM * GK);
  g->steps[0].i[0] = GM * GK;
  g->steps[0].f[0] = 0.5;
  g->steps[0].f[1] = 0.25;
  g->steps[1] = gstep("matmul %c", g->A2, g->B, g->C, 1, GM, GN, GK, 0, 0, 0, 0, 0);
  RtBuf b2[2] = {g->C, g->Cb};
  g->steps[2] = kstep(K_TO_BF16, "cast %cb", 1, 1, b2, GM * GN);
  g->steps[2].i[0] = GM * GN;
  g->steps[3] = gstep("matmul %d", g->Cb, g->E, g->D, 1, GN, GP, GM, 1, 1, 0, 0, 0);
  g->steps[4] = gstep("matmul %h", g->Cb, g->E, g->H, 1, GN, GP, GM, 1, 1, 0, 0, 0);
  g->steps[5] = gstep("matmul %f (batched)", g->A2, g->B, g->F, 2, GM / 2, GN, GK, 0, 0, GM / 2 * GK, 0, GM / 2 * GN);
  RtFunc *f = &g->f;
  snprintf(f->name, sizeof f->name, "f");
  f->n_steps = 6;
  f->steps = g->steps;
  f->arena_bytes = l.next[RT_REGION_ARENA];
  f->n_args = 2;
  f->args[0] = g->A;
  f->args[1] = g->B;
  f->n_rets = 5;
  f->rets[0] = g->C;
  f->rets[1] = g->Cb;
  f->rets[2] = g->D;
  f->rets[3] = g->H;
  f->rets[4] = g->F;
  g->p.n_funcs = 1;
  g->p.funcs = f;
  g->p.n_globals = 1;
  g->p.globals = g->g;
  for (int r = 1; r < RT_REGION_COUNT; r++) g->p.region_bytes[r] = l.next[r];
  g->p.n_kernels = N_KNAMES - 1;   /* t_missing only when asked */
  g->p.kernel_names = knames;
}

/* @grad_step(tokens, targets) -> loss and @optimizer_step(lr, t) -> norm over one parameter
   w[V], its gradient accumulator and a momentum (tests/gpu/test_kernels.cu t_grad, t_opt). */
enum { EV = 16, EN = 8 };
typedef struct {
  RtProgram p;
  RtFunc f[2];
  RtStep gs[1], os[1];
  RtGlobal g[3];
} ExecProg;

static void build_exec_program(ExecProg *e) {
  memset(e, 0, sizeof *e);
  Lay lg, lo;
  memset(&lg, 0, sizeof lg);
  RtBuf w = mk(&lg, RT_REGION_PARAMS, RT_ST_F32, EV), gr = mk(&lg, RT_REGION_GRADS, RT_ST_F32, EV),
        m = mk(&lg, RT_REGION_OPTIM, RT_ST_F32, EV);
  const char *names[3] = {"w", "grad.w", "adam_m.w"};
  RtBuf gb[3] = {w, gr, m};
  for (int k = 0; k < 3; k++) {
    RtGlobal *g = &e->g[k];
    snprintf(g->name, sizeof g->name, "%s", names[k]);
    g->region = gb[k].region;
    g->offset = gb[k].offset;
    g->n = EV;
    g->rank = 1;
    g->shape[0] = EV;
    g->init = k == 0 ? RT_INIT_NORMAL : RT_INIT_ZEROS;
    g->init_value = 0.5;
  }
  lo = lg;
  lo.next[RT_REGION_ARENA] = 0;
  RtBuf tok = mk(&lo, RT_REGION_ARENA, RT_ST_I32, EN), tgt = mk(&lo, RT_REGION_ARENA, RT_ST_I32, EN),
        loss = mk(&lo, RT_REGION_ARENA, RT_ST_F32, 1);
  RtBuf b1[5] = {tok, tgt, w, gr, loss};
  e->gs[0] = kstep(K_GRAD, "grad", 3, 2, b1, 1);
  e->gs[0].i[0] = EN;
  e->gs[0].i[1] = EV;
  RtFunc *f = &e->f[0];
  snprintf(f->name, sizeof f->name, "grad_step");
  f->n_steps = 1;
  f->steps = e->gs;
  f->arena_bytes = lo.next[RT_REGION_ARENA];
  f->n_args = 2;
  f->args[0] = tok;
  f->args[1] = tgt;
  f->n_rets = 1;
  f->rets[0] = loss;
  lo.next[RT_REGION_ARENA] = 0;
  RtBuf lr = mk(&lo, RT_REGION_ARENA, RT_ST_F32, 1), t = mk(&lo, RT_REGION_ARENA, RT_ST_F32, 1),
        norm = mk(&lo, RT_REGION_ARENA, RT_ST_F32, 1);
  RtBuf b2[6] = {lr, t, w, m, gr, norm};
  e->os[0] = kstep(K_OPT, "sgd-momentum", 2, 4, b2, 1);
  e->os[0].i[0] = EV;
  e->os[0].f[0] = 0.9;
  f = &e->f[1];
  snprintf(f->name, sizeof f->name, "optimizer_step");
  f->n_steps = 1;
  f->steps = e->os;
  f->arena_bytes = lo.next[RT_REGION_ARENA];
  f->n_args = 2;
  f->args[0] = lr;
  f->args[1] = t;
  f->n_rets = 1;
  f->rets[0] = norm;
  e->p.n_funcs = 2;
  e->p.funcs = e->f;
  e->p.n_globals = 3;
  e->p.globals = e->g;
  for (int r = 1; r < RT_REGION_COUNT; r++) e->p.region_bytes[r] = lg.next[r];
  e->p.n_kernels = N_KNAMES - 1;
  e->p.kernel_names = knames;
}

/* ================================================================== pure parts */

static void test_pack_args(void) {
  _Static_assert(sizeof(CudaLoomArgs) == 480, "LoomArgs is 480 bytes");
  _Static_assert(offsetof(CudaLoomArgs, i) == 128 && offsetof(CudaLoomArgs, f) == 448, "LoomArgs layout");
  RtStep st;
  memset(&st, 0, sizeof st);
  st.kind = RT_STEP_KERNEL;
  st.n_in = 2;
  st.n_out = 1;
  st.bufs[0] = (RtBuf){RT_REGION_ARENA, 0, 0, RT_ST_F32, 64, 10};
  st.bufs[1] = (RtBuf){RT_REGION_PARAMS, 0, 0, RT_ST_BF16, 4096, 10};
  st.bufs[2] = (RtBuf){RT_REGION_OPTIM, 0, 0, RT_ST_F32, 128, 10};
  st.bufs[3] = (RtBuf){RT_REGION_GRADS, 0, 0, RT_ST_F32, 512, 10};   /* beyond n_in + n_out: not passed */
  for (int k = 0; k < RT_MAX_INTS; k++) st.i[k] = (int64_t)k * 1000 - 7;
  st.i[RT_MAX_INTS - 1] = INT64_C(1) << 40;
  st.f[0] = 0.5;
  st.f[1] = -2;
  st.f[2] = 1e300;
  st.f[3] = 1e-5;
  uint64_t base[RT_REGION_COUNT] = {0x7f0000000000ull, 0x7f1000000000ull, 0x7f2000000000ull, 0x7f3000000000ull};
  CudaLoomArgs a;
  memset(&a, 0xAB, sizeof a);
  cuda_pack_args(&st, base, &a);
  CHECK((uintptr_t)a.buf[0] == 0x7f0000000000ull + 64, "buf[0] = arena + 64");
  CHECK((uintptr_t)a.buf[1] == 0x7f1000000000ull + 4096, "buf[1] = params + 4096");
  CHECK((uintptr_t)a.buf[2] == 0x7f3000000000ull + 128, "buf[2] = optim + 128");
  int nulls = 0;
  for (int k = 3; k < RT_MAX_BUFS; k++) nulls += a.buf[k] == NULL;
  CHECK(nulls == RT_MAX_BUFS - 3, "buffers after the step's are NULL (%d of %d)", nulls, RT_MAX_BUFS - 3);
  int ints = 0;
  for (int k = 0; k < RT_MAX_INTS; k++) ints += a.i[k] == (long long)st.i[k];
  CHECK(ints == RT_MAX_INTS, "i[] copied (%d of %d)", ints, RT_MAX_INTS);
  CHECK(a.f[0] == 0.5 && a.f[1] == -2 && a.f[2] == 1e300 && a.f[3] == 1e-5, "f[] copied");
  /* the byte image a kernel reads: i[k] at 128 + 8k, f[k] at 448 + 8k */
  long long i39;
  double f2;
  memcpy(&i39, (const char *)&a + 128 + 8 * 39, 8);
  memcpy(&f2, (const char *)&a + 448 + 16, 8);
  CHECK(i39 == (INT64_C(1) << 40) && f2 == 1e300, "LoomArgs byte offsets");
}

/* C = op'(A') op'(B') in the column-major terms of L, A'/B' as stored. */
static void lt_reference(const CudaGemmLayout *L, const float *Alt, const float *Blt, float *C) {
  for (int64_t j = 0; j < L->n; j++)
    for (int64_t i = 0; i < L->m; i++) {
      double s = 0;
      for (int64_t p = 0; p < L->k; p++) {
        double a = L->trans_a ? Alt[p + i * L->lda] : Alt[i + p * L->lda];
        double b = L->trans_b ? Blt[j + p * L->ldb] : Blt[p + j * L->ldb];
        s += a * b;
      }
      C[i + j * L->ldc] = (float)s;
    }
}

static void test_gemm_layout(void) {
  const int64_t M = 5, N = 3, K = 4;
  float A[20], B[12], want[15], got[15];
  for (int k = 0; k < 20; k++) A[k] = (float)(k % 7 - 3);
  for (int k = 0; k < 12; k++) B[k] = (float)(k % 5 - 2);
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      /* row-major reference: op(A)[r][p] = ta ? A[p][r] (A stored [K,M]) : A[r][p] */
      for (int64_t r = 0; r < M; r++)
        for (int64_t c = 0; c < N; c++) {
          float s = 0;
          for (int64_t p = 0; p < K; p++) s += (ta ? A[p * M + r] : A[r * K + p]) * (tb ? B[c * K + p] : B[p * N + c]);
          want[r * N + c] = s;
        }
      CudaGemmLayout L = cuda_gemm_layout(M, N, K, ta, tb);
      CHECK(L.m == N && L.n == M && L.k == K, "Lt sizes m=N n=M k=K");
      CHECK(L.trans_a == tb && L.trans_b == ta, "ta %d tb %d: Lt transposes its A by tb and its B by ta", ta, tb);
      /* Lt's op(A) is m x k, op(B) k x n, C m x n, each stored with ld >= rows */
      CHECK((L.trans_a ? L.a_cols : L.a_rows) == L.m && (L.trans_a ? L.a_rows : L.a_cols) == L.k, "A' dims");
      CHECK((L.trans_b ? L.b_cols : L.b_rows) == L.k && (L.trans_b ? L.b_rows : L.b_cols) == L.n, "B' dims");
      CHECK(L.c_rows == N && L.c_cols == M && L.ldc == N, "C' is [N,M] column-major");
      CHECK(L.lda >= L.a_rows && L.ldb >= L.b_rows, "leading dimensions");
      lt_reference(&L, B, A, got);   /* Lt's A is our B, Lt's B our A */
      CHECK(!memcmp(got, want, sizeof want), "ta %d tb %d: the column-major product is the row-major C", ta, tb);
    }
  CudaGemmLayout z = cuda_gemm_layout(0, 0, 0, 0, 0);
  CHECK(z.lda >= 1 && z.ldb >= 1 && z.ldc >= 1, "empty GEMM: leading dimensions stay >= 1");
}

static void test_storage(void) {
  CHECK(cuda_storage_size(RT_ST_F32) == 4 && cuda_storage_size(RT_ST_I32) == 4 && cuda_storage_size(RT_ST_BF16) == 2 &&
            cuda_storage_size(RT_ST_F16) == 2 && cuda_storage_size(RT_ST_F8E4M3) == 1 && cuda_storage_size(RT_ST_F8E5M2) == 1,
        "storage sizes");
  /* every value of each narrow format: decode, encode back, the same bits; decoded values are
     what rt_round produces */
  struct {
    RtStorage st;
    RtRound r;
    int bits;
  } fm[4] = {{RT_ST_BF16, RT_ROUND_BF16, 16}, {RT_ST_F16, RT_ROUND_F16, 16}, {RT_ST_F8E4M3, RT_ROUND_F8E4M3, 8},
             {RT_ST_F8E5M2, RT_ROUND_F8E5M2, 8}};
  for (int f = 0; f < 4; f++) {
    int n = 1 << fm[f].bits, bad = 0, bad_round = 0, nans = 0;
    for (int v = 0; v < n; v++) {
      unsigned char in[2], out[2];
      in[0] = (unsigned char)(v & 0xFF);
      in[1] = (unsigned char)(v >> 8);
      float x;
      cuda_storage_to_f32(fm[f].st, in, &x, 1);
      if (isnan(x)) {
        nans++;
        continue;
      }
      cuda_f32_to_storage(fm[f].st, &x, out, 1);
      if (memcmp(in, out, (size_t)fm[f].bits / 8)) bad++;
      if (f2u(rt_round(fm[f].r, x)) != f2u(x)) bad_round++;
    }
    CHECK(!bad && !bad_round, "%s: %d values do not round-trip, %d are not rt_round's", cuda_storage_name(fm[f].st), bad,
          bad_round);
    CHECK(nans > 0, "%s has NaNs", cuda_storage_name(fm[f].st));
    /* random floats over a wide range: stored then read back = rt_round */
    int mismatch = 0;
    for (int k = 0; k < 200000; k++) {
      uint32_t u = next_u32();
      float x;
      memcpy(&x, &u, 4);
      if (isnan(x)) continue;
      unsigned char b[4];
      float y;
      cuda_f32_to_storage(fm[f].st, &x, b, 1);
      cuda_storage_to_f32(fm[f].st, b, &y, 1);
      float want = rt_round(fm[f].r, x);
      if (f2u(y) != f2u(want)) mismatch++;
    }
    CHECK(!mismatch, "%s: %d random floats differ from rt_round after a store", cuda_storage_name(fm[f].st), mismatch);
  }
  /* known encodings */
  struct {
    RtStorage st;
    float x;
    unsigned bits;
  } kn[] = {{RT_ST_BF16, 1.0f, 0x3F80},     {RT_ST_F16, 1.0f, 0x3C00},       {RT_ST_F16, -2.0f, 0xC000},
            {RT_ST_F16, 65504.0f, 0x7BFF},  {RT_ST_F16, 1e6f, 0x7C00},       {RT_ST_F16, 0x1p-24f, 0x0001},
            {RT_ST_F8E4M3, 1.0f, 0x38},     {RT_ST_F8E4M3, 448.0f, 0x7E},    {RT_ST_F8E4M3, 1e6f, 0x7E},
            {RT_ST_F8E4M3, -0x1p-9f, 0x81}, {RT_ST_F8E5M2, 1.0f, 0x3C},      {RT_ST_F8E5M2, 57344.0f, 0x7B},
            {RT_ST_F8E5M2, 1e6f, 0x7C},     {RT_ST_BF16, -0.0f, 0x8000},     {RT_ST_F16, NAN, 0x7E00},
            {RT_ST_F8E4M3, NAN, 0x7F},      {RT_ST_BF16, 1.00390625f, 0x3F80}};   /* halfway: to even */
  for (size_t k = 0; k < sizeof kn / sizeof kn[0]; k++) {
    unsigned char b[2] = {0, 0};
    cuda_f32_to_storage(kn[k].st, &kn[k].x, b, 1);
    unsigned got = cuda_storage_size(kn[k].st) == 2 ? (unsigned)(b[0] | b[1] << 8) : b[0];
    CHECK(got == kn[k].bits, "%s(%g) = 0x%X, want 0x%X", cuda_storage_name(kn[k].st), (double)kn[k].x, got, kn[k].bits);
  }
  int32_t ints[3] = {-1, 7, 1 << 30}, back[3];
  unsigned char raw[12];
  cuda_f32_to_storage(RT_ST_I32, (const float *)(const void *)ints, raw, 3);
  cuda_storage_to_f32(RT_ST_I32, raw, (float *)(void *)back, 3);
  CHECK(!memcmp(ints, back, sizeof ints), "int32 passes through unchanged");
}

static void test_global_init(void) {
  RtGlobal g[3];
  memset(g, 0, sizeof g);
  const char *names[3] = {"h.0.attn.c_attn.weight", "ln_f.weight", "wte.weight"};
  int64_t off = 0;
  for (int k = 0; k < 3; k++) {
    snprintf(g[k].name, sizeof g[k].name, "%s", names[k]);
    g[k].region = RT_REGION_PARAMS;
    g[k].n = 1000 + 17 * k;
    g[k].offset = off;
    off += 4 * g[k].n;
    g[k].rank = 1;
    g[k].shape[0] = g[k].n;
  }
  g[0].init = RT_INIT_NORMAL;
  g[0].init_value = 0.02;
  g[0].round = RT_ROUND_BF16;
  g[1].init = RT_INIT_ONES;
  g[2].init = RT_INIT_NORMAL;
  g[2].init_value = 1.0;
  g[2].round = RT_ROUND_F8E4M3;
  RtProgram p;
  memset(&p, 0, sizeof p);
  p.n_globals = 3;
  p.globals = g;
  p.region_bytes[RT_REGION_PARAMS] = off;
  CpuProgram cp;
  char err[512];
  int rc = cpu_program_init(&cp, &p, NULL, 1, err, sizeof err);
  CHECK(!rc, "cpu_program_init: %s", err);
  if (rc) return;
  cpu_globals_init(&cp, 1234);
  for (int k = 0; k < 3; k++) {
    float *t = malloc(sizeof(float) * (size_t)g[k].n);
    rt_global_init_values(&g[k], 1234, t);
    CHECK(!memcmp(t, cpu_global(&cp, k), sizeof(float) * (size_t)g[k].n), "$%s: the CUDA initial values are the CPU's",
          g[k].name);
    free(t);
  }
  cpu_program_free(&cp);
  /* storage of a global: from the buffers naming it, else from its rounding */
  CHECK(cuda_global_storage(&p, 0) == RT_ST_BF16 && cuda_global_storage(&p, 1) == RT_ST_F32 &&
            cuda_global_storage(&p, 2) == RT_ST_F8E4M3,
        "global storage from rounding");
  GemmProg gp;
  build_gemm_program(&gp);
  CHECK(cuda_global_storage(&gp.p, 0) == RT_ST_BF16, "global storage from the buffers naming it");
}

static void test_check(void) {
  char err[512];
  GemmProg g;
  build_gemm_program(&g);
  int rc = cuda_program_check(&g.p, err, sizeof err);
  CHECK(!rc, "the GEMM test program is valid: %s", err);
  ExecProg e;
  build_exec_program(&e);
  rc = cuda_program_check(&e.p, err, sizeof err);
  CHECK(!rc, "the executor test program is valid: %s", err);

  build_gemm_program(&g);
  g.steps[0].kind = RT_STEP_BUILTIN;
  rc = cuda_program_check(&g.p, err, sizeof err);
  CHECK(rc == 2 && has(err, "builtin") && has(err, "affine %a2"), "a builtin is refused, naming the step: %s", err);

  build_gemm_program(&g);
  g.steps[3].bufs[0].storage = RT_ST_F32;   /* f32 x bf16 */
  g.steps[3].bufs[0].round = 0;
  rc = cuda_program_check(&g.p, err, sizeof err);
  CHECK(rc == 2 && has(err, "not supported"), "mixed GEMM operands are refused: %s", err);

  build_gemm_program(&g);
  g.steps[1].bufs[2].round = RT_ROUND_BF16;   /* f32 storage rounded to bf16 */
  rc = cuda_program_check(&g.p, err, sizeof err);
  CHECK(rc == 2 && has(err, "rounded"), "a GEMM result rounded unlike its storage is refused: %s", err);

  build_gemm_program(&g);
  g.steps[2].bufs[1].offset += 1;   /* bf16 at an odd byte */
  rc = cuda_program_check(&g.p, err, sizeof err);
  CHECK(rc == 2 && has(err, "misaligned"), "a misaligned buffer is refused: %s", err);

  build_gemm_program(&g);
  g.f.rets[0].n = 1 << 20;
  rc = cuda_program_check(&g.p, err, sizeof err);
  CHECK(rc == 2 && has(err, "outside"), "a buffer outside its region is refused: %s", err);

  build_gemm_program(&g);
  g.steps[0].grid[0] = 0;
  rc = cuda_program_check(&g.p, err, sizeof err);
  CHECK(rc == 2 && has(err, "launch dimensions"), "a step without launch dimensions is refused: %s", err);

  build_gemm_program(&g);
  g.steps[0].which = 99;
  rc = cuda_program_check(&g.p, err, sizeof err);
  CHECK(rc == 2 && has(err, "names no kernel"), "a step naming no kernel is refused: %s", err);

  build_gemm_program(&g);
  g.steps[5].i[0] = 3;   /* batch 3 reaches past A2 */
  rc = cuda_program_check(&g.p, err, sizeof err);
  CHECK(rc == 2 && has(err, "outside its buffer"), "a GEMM reaching past its operand is refused: %s", err);

  build_gemm_program(&g);
  g.f.args[0].storage = RT_ST_I32;   /* a float buffer held as int */
  rc = cuda_program_check(&g.p, err, sizeof err);
  CHECK(rc == 2 && has(err, "held as i32"), "float/int storage mismatch is refused: %s", err);

  build_gemm_program(&g);
  g.g[0].round = RT_ROUND_NONE;
  g.steps[4].bufs[1].storage = RT_ST_F16;   /* the same global read as another type */
  rc = cuda_program_check(&g.p, err, sizeof err);
  CHECK(rc == 2, "a global read in two storages is refused: %s", err);
}

/* A step's tensor maps (RtStep.tmaps, fields at program.h's RT_TMAP_INT): checked against
   its buffers. */
static void test_tmap_check(void) {
  char err[256];
  RtStep st;
  memset(&st, 0, sizeof st);
  st.n_in = 2;
  st.bufs[0] = (RtBuf){.storage = RT_ST_BF16, .n = 2 * 64 * 4 * 64};
  st.bufs[1] = (RtBuf){.storage = RT_ST_F32, .n = 2 * 64 * 4 * 64};
  int64_t good[RT_TMAP_FIELDS] = {0, 64, 4, 64, 2, 64};   /* [2][64][4][64] bf16, boxes of 64 rows */
  st.tmaps = 1;
  memcpy(&st.i[RT_TMAP_INT], good, sizeof good);
  CHECK(cuda_tmap_check(&st, err, sizeof err) == 0, "a valid tensor map: %s", err);
  st.tmaps = 0;
  st.i[RT_TMAP_INT] = 4096;   /* another kernel's int there: not a tensor map */
  CHECK(cuda_tmap_check(&st, err, sizeof err) == 0, "no tensor maps");
  struct {
    int field;
    int64_t value;
    const char *says;
  } bad[] = {{-1, 5, "at most"}, {0, 2, "lacks"}, {0, 1, "bf16 or f16"}, {4, 3, "covers"}, {1, 4, "16 bytes"},
             {5, 257, "box of 257"}, {2, 0, "dim 1"}};
  for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
    st.tmaps = (uint8_t)(bad[k].field < 0 ? bad[k].value : 1);
    memcpy(&st.i[RT_TMAP_INT], good, sizeof good);
    if (bad[k].field >= 0) st.i[RT_TMAP_INT + bad[k].field] = bad[k].value;
    err[0] = 0;
    CHECK(cuda_tmap_check(&st, err, sizeof err) == 2 && has(err, bad[k].says), "bad tensor map %zu refused (%s): %s", k,
          bad[k].says, err);
  }
}

static void test_memory_plan(void) {
  GemmProg g;
  build_gemm_program(&g);
  CudaMemory m;
  cuda_program_memory_plan(&g.p, 0, &m);
  CHECK(m.arenas == g.f.arena_bytes && m.max_arena == g.f.arena_bytes, "arenas");
  CHECK(m.regions == g.p.region_bytes[RT_REGION_PARAMS], "regions");
  CHECK(m.workspace == (32 << 20) && m.total == m.arenas + m.regions + m.workspace, "workspace and total");
  ExecProg e;
  build_exec_program(&e);
  cuda_program_memory_plan(&e.p, 0, &m);
  int64_t larger = e.f[0].arena_bytes > e.f[1].arena_bytes ? e.f[0].arena_bytes : e.f[1].arena_bytes;
  CHECK(m.workspace == 0 && m.arenas == larger && m.arenas < e.f[0].arena_bytes + e.f[1].arena_bytes,
        "no GEMM: no workspace; the functions share the larger arena");
}

static void test_arch(void) {
  char a[16];
  cuda_arch_name(9, 0, a, sizeof a);
  CHECK(!strcmp(a, "sm_90a"), "9.0 -> %s", a);
  cuda_arch_name(8, 0, a, sizeof a);
  CHECK(!strcmp(a, "sm_80"), "8.0 -> %s", a);
  cuda_arch_name(8, 6, a, sizeof a);
  CHECK(!strcmp(a, "sm_86"), "8.6 -> %s", a);
  cuda_arch_name(10, 0, a, sizeof a);
  CHECK(!strcmp(a, "sm_100a"), "10.0 -> %s", a);
}

/* ================================================================== libraries absent */

static void test_no_driver(bool gpu_present) {
  char why[1024] = "", err[1024] = "";
  if (!gpu_present) {
    int ok = cuda_available(why, sizeof why);
    CHECK(!ok && why[0] && has(why, "--backend cpu"), "cuda_available is false here and says why: %s", why);
    printf("note: cuda_available: %s\n", why);
    int count = 5;
    CHECK(cuda_device_count(&count, err, sizeof err) && count == 0 && !strcmp(err, why), "device count: %s", err);
    CudaDeviceInfo info;
    CHECK(cuda_device_query(0, &info, err, sizeof err) == 1, "device query fails: %s", err);
    GemmProg g;
    build_gemm_program(&g);
    CudaProgram cp;
    memset(&cp, 0x5A, sizeof cp);
    int rc = cuda_program_init(&cp, &g.p, test_kernels_ptx, sizeof test_kernels_ptx, 0, err, sizeof err);
    CHECK(rc == 1 && has(err, "--backend cpu") && cp.p == NULL, "cuda_program_init fails cleanly: %s", err);
    cuda_program_free(&cp);
    CHECK(cuda_program_call(&cp, 0, NULL, NULL, err, sizeof err) == 2, "a call on it is refused: %s", err);
  }
#ifdef LOOM_HAVE_CUDA_HEADERS
  if (gpu_present) {
    printf("SKIP: driver-absence checks (a GPU is present)\n");
  } else {
    /* a libcuda that is not there */
    setenv("LOOM_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    cuda_api_unload();
    int ok = cuda_available(why, sizeof why);
    CHECK(!ok && has(why, "/nonexistent/libcuda.so.1") && has(why, "LOOM_LIBCUDA") && has(why, "no NVIDIA driver"),
          "a missing driver library is named: %s", why);
    /* the toolkit's stub: loads, but cuInit says it is a stub */
    const char *stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
    if (access(stub, R_OK) == 0) {
      setenv("LOOM_LIBCUDA", stub, 1);
      cuda_api_unload();
      ok = cuda_available(why, sizeof why);
      CHECK(!ok && has(why, "stub") && has(why, "cuInit"), "the stub driver is recognized: %s", why);
      printf("note: with the stub: %s\n", why);
      GemmProg g;
      build_gemm_program(&g);
      CudaProgram cp;
      int rc = cuda_program_init(&cp, &g.p, test_kernels_ptx, sizeof test_kernels_ptx, 0, err, sizeof err);
      CHECK(rc == 1 && has(err, "stub"), "cuda_program_init with the stub fails cleanly: %s", err);
      cuda_program_free(&cp);
    } else {
      printf("SKIP: no stub libcuda at %s\n", stub);
    }
    unsetenv("LOOM_LIBCUDA");
    cuda_api_unload();
  }
  /* cuBLASLt: loads without a device where installed; a missing one is named */
  size_t v = cuda_cublaslt_version(err, sizeof err);
  CHECK(v > 0 || has(err, "cuBLASLt not found"), "cuBLASLt loads or says it is missing: %s", err);
  if (v) printf("note: cuBLASLt %zu loads without a device\n", v);
  else printf("note: %s\n", err);
  setenv("LOOM_LIBCUBLASLT", "/nonexistent/libcublasLt.so", 1);
  cuda_api_unload();
  v = cuda_cublaslt_version(err, sizeof err);
  CHECK(v == 0 && has(err, "cuBLASLt not found") && has(err, "/nonexistent/libcublasLt.so"),
        "a missing cuBLASLt is named: %s", err);
  unsetenv("LOOM_LIBCUBLASLT");
  cuda_api_unload();
#else
  int ok = cuda_available(why, sizeof why);
  CHECK(!ok && has(why, "without the CUDA headers"), "built without CUDA headers: %s", why);
#endif
}

/* ================================================================== with a GPU */

static bool close_to(float got, double want, double rel, double abs_tol) {
  return fabs((double)got - want) <= abs_tol + rel * fabs(want);
}

static int gpu_gemm_program(bool check_mem) {
  char err[2048];
  GemmProg g;
  build_gemm_program(&g);
  CudaProgram cp;
  int rc = cuda_program_init(&cp, &g.p, test_kernels_ptx, sizeof test_kernels_ptx, 0, err, sizeof err);
  CHECK(!rc, "cuda_program_init (GEMM program): %s", err);
  if (rc) return 1;
  printf("note: %s (%s, %d SMs, %.1f GiB, driver CUDA %d.%d): program memory %lld B (arena %lld, regions %lld, "
         "workspace %lld)\n",
         cp.info.name, cp.info.arch, cp.info.sm_count, (double)cp.info.total_mem / (1 << 30),
         cp.info.driver_version / 1000, cp.info.driver_version % 1000 / 10, (long long)cp.mem.total,
         (long long)cp.mem.arenas, (long long)cp.mem.regions, (long long)cp.mem.workspace);
  if (check_mem) {
    CudaMemory plan;
    cuda_program_memory_plan(&g.p, 0, &plan);
    CHECK(plan.total == cp.mem.total, "allocated memory %lld = the plan's %lld", (long long)cp.mem.total,
          (long long)plan.total);
  }
  rc = cuda_globals_init(&cp, 99, err, sizeof err);
  CHECK(!rc, "cuda_globals_init: %s", err);
  static float A[GM * GK], B[GK * GN], E[GP * GM], Ewant[GP * GM], A2[GM * GK], C[GM * GN], Cb[GM * GN], D[GN * GP],
      H[GN * GP], F[GM * GN], A2dev[GM * GK];
  for (int k = 0; k < GM * GK; k++) A[k] = next_normal();
  for (int k = 0; k < GK * GN; k++) B[k] = next_normal();
  CHECK(!cuda_global_read(&cp, 0, E, err, sizeof err), "cuda_global_read: %s", err);
  rt_global_init_values(&g.g[0], 99, Ewant);
  CHECK(!memcmp(E, Ewant, sizeof E), "the bf16 parameter holds the CPU's initial values, bitwise");
  void *args[2] = {A, B}, *rets[5] = {C, Cb, D, H, F};
  rc = cuda_program_call(&cp, 0, args, rets, err, sizeof err);
  CHECK(!rc, "cuda_program_call: %s", err);
  if (rc) {
    cuda_program_free(&cp);
    return 1;
  }
  /* the mirror */
  for (int k = 0; k < GM * GK; k++) A2[k] = A[k] * (float)0.5 + (float)0.25;
  CHECK(!cuda_buf_read(&cp, 0, &g.A2, A2dev, err, sizeof err) && !memcmp(A2, A2dev, sizeof A2),
        "the affine kernel matches the CPU bitwise %s", err);
  int bad = 0, bad_cast = 0, bad_d = 0, bad_h = 0, bad_f = 0;
  for (int r = 0; r < GM; r++)
    for (int c = 0; c < GN; c++) {
      double s = 0;
      for (int p = 0; p < GK; p++) s += (double)A2[r * GK + p] * B[p * GN + c];
      bad += !close_to(C[r * GN + c], s, 1e-5, 1e-4);
      bad_cast += f2u(Cb[r * GN + c]) != f2u(rt_round(RT_ROUND_BF16, C[r * GN + c]));
      bad_f += !close_to(F[r * GN + c], s, 1e-5, 1e-4);
    }
  for (int n = 0; n < GN; n++)
    for (int q = 0; q < GP; q++) {
      double s = 0;
      for (int m = 0; m < GM; m++) s += (double)Cb[m * GN + n] * E[q * GM + m];
      bad_d += !close_to(D[n * GP + q], s, 1e-5, 1e-3);
      bad_h += !close_to(H[n * GP + q], s, 1.0 / 128, 1e-2);
    }
  CHECK(!bad, "f32 GEMM A2 B: %d of %d wrong", bad, GM * GN);
  CHECK(!bad_cast, "bf16 cast kernel: %d of %d not rt_round's", bad_cast, GM * GN);
  CHECK(!bad_d, "bf16 GEMM Cb^T E^T -> f32: %d of %d wrong", bad_d, GN * GP);
  CHECK(!bad_h, "bf16 GEMM Cb^T E^T -> bf16: %d of %d wrong", bad_h, GN * GP);
  CHECK(!bad_f, "batched GEMM with a shared B: %d of %d wrong", bad_f, GM * GN);
  /* a second call gives the same results (plans are reused) */
  static float C2[GM * GN];
  void *rets2[5] = {C2, NULL, NULL, NULL, NULL};
  rc = cuda_program_call(&cp, 0, args, rets2, err, sizeof err);
  CHECK(!rc && !memcmp(C, C2, sizeof C), "a second call repeats the first: %s", rc ? err : "");

  /* NCCL, one rank: the bootstrap, a world communicator, size-1 axes, a barrier */
  clear_boot_env();
  int64_t mesh[COMM_AXES] = {1, 1, 1, 1, 1};
  Comm *comm = NULL;
  rc = nccl_world_new(mesh, NULL, &comm, err, sizeof err);
  if (rc && has(err, "NCCL not found")) {
    printf("SKIP: NCCL: %s\n", err);
  } else {
    CHECK(!rc && comm, "nccl_world_new (one rank): %s", err);
    if (!rc) {
      nccl_set_stream(comm, cp.stream, true, err, sizeof err);
      float *dev_c = (float *)(uintptr_t)cuda_buf_addr(&cp, 0, &g.C), *dev_f = (float *)(uintptr_t)cuda_buf_addr(&cp, 0, &g.F);
      CHECK(comm->all_reduce(comm, COMM_DP, dev_c, GM * GN, false) == 0, "all_reduce: %s", nccl_last_error(comm));
      CHECK(comm->all_gather(comm, COMM_TP, dev_c, dev_f, GM * GN) == 0, "all_gather: %s", nccl_last_error(comm));
      CHECK(comm->barrier(comm) == 0, "barrier: %s", nccl_last_error(comm));
      static float back[GM * GN];
      CHECK(!cuda_buf_read(&cp, 0, &g.F, back, err, sizeof err) && !memcmp(back, C, sizeof back),
            "one-rank all_gather copies: %s", err);
      nccl_world_free(comm);
    }
  }
  cuda_program_free(&cp);
  return 0;
}

static void gpu_executor(void) {
  char err[2048];
  ExecProg e;
  build_exec_program(&e);
  CudaProgram cp;
  int rc = cuda_program_init(&cp, &e.p, test_kernels_ptx, sizeof test_kernels_ptx, 0, err, sizeof err);
  CHECK(!rc, "cuda_program_init (executor program): %s", err);
  if (rc) return;
  CHECK(!cuda_globals_init(&cp, 7, err, sizeof err), "globals: %s", err);
  RtDevice dev;
  cuda_device(&dev, &cp);
  RtRankExec ce;
  CHECK(rt_rank_exec_init(&ce, &dev, 3, 3, err, sizeof err) == 2 && strstr(err, "cannot be 3 x 3"),
        "a batch shape that is not @grad_step's token count is refused: %s", err);
  rc = rt_rank_exec_init(&ce, &dev, 2, 4, err, sizeof err);
  CHECK(!rc && ce.ex.n_params == 1 && ce.ex.n_state == 1 && ce.ex.batch == 2 && ce.ex.sync_out && ce.ex.sync_in,
        "rt_rank_exec_init over the CUDA device: %s", err);
  if (rc) {
    cuda_program_free(&cp);
    return;
  }
  float w[EV], g[EV] = {0}, m[EV] = {0};
  rt_global_init_values(&e.g[0], 7, w);
  CHECK(!memcmp(ce.ex.params[0].data, w, sizeof w), "params hold the initial values");
  int bad = 0;
  for (int step = 1; step <= 2; step++) {
    for (int micro = 0; micro < 3; micro++) {
      int32_t tok[EN], tgt[EN];
      for (int k = 0; k < EN; k++) {
        tok[k] = (int32_t)(next_u32() % EV);
        tgt[k] = (int32_t)(next_u32() % 5);
      }
      float loss = -1, want = 0;
      rc = ce.ex.grad_step(ce.ex.self, tok, tgt, &loss, err, sizeof err);
      CHECK(!rc, "grad_step: %s", err);
      for (int k = 0; k < EN; k++) {
        float c = (float)(tgt[k] + 1) / (float)EN;
        want += w[tok[k]] * c;
        g[tok[k]] += c;
      }
      bad += f2u(loss) != f2u(want);
    }
    float norm = -1, ss = 0, lr = 0.1f;
    rc = ce.ex.optimizer_step(ce.ex.self, lr, (float)step, &norm, err, sizeof err);
    CHECK(!rc, "optimizer_step: %s", err);
    for (int k = 0; k < EV; k++) ss += g[k] * g[k];
    bad += f2u(norm) != f2u(sqrtf(ss));
    for (int k = 0; k < EV; k++) {
      m[k] = (float)0.9 * m[k] + g[k];
      w[k] = w[k] - lr * m[k];
      g[k] = 0;
    }
  }
  CHECK(!bad, "losses and norms equal the mirror bitwise (%d differ)", bad);
  CHECK(!ce.ex.sync_out(ce.ex.self, err, sizeof err), "sync_out: %s", err);
  CHECK(!memcmp(ce.ex.params[0].data, w, sizeof w) && !memcmp(ce.ex.state[0].data, m, sizeof m),
        "parameters and momentum equal the mirror bitwise");
  for (int k = 0; k < EV; k++) ce.ex.params[0].data[k] = (float)k;
  CHECK(!ce.ex.sync_in(ce.ex.self, err, sizeof err), "sync_in: %s", err);
  memset(ce.ex.params[0].data, 0, sizeof w);
  CHECK(!ce.ex.sync_out(ce.ex.self, err, sizeof err) && ce.ex.params[0].data[EV - 1] == (float)(EV - 1),
        "sync_in then sync_out round-trips");
  rt_rank_exec_free(&ce);
  cuda_program_free(&cp);
}

static void gpu_errors(bool fault) {
  char err[2048];
  /* a kernel the module lacks */
  GemmProg g;
  build_gemm_program(&g);
  g.p.n_kernels = N_KNAMES;
  CudaProgram cp;
  int rc = cuda_program_init(&cp, &g.p, test_kernels_ptx, sizeof test_kernels_ptx, 0, err, sizeof err);
  CHECK(rc && has(err, "t_missing") && has(err, "cuModuleGetFunction") && cp.p == NULL, "a missing kernel is named: %s", err);
  /* a module that is not one */
  build_gemm_program(&g);
  rc = cuda_program_init(&cp, &g.p, "this is not PTX", 15, 0, err, sizeof err);
  CHECK(rc && has(err, "cuModuleLoadData"), "a bad module is reported: %s", err);
  if (!fault) {
    printf("SKIP: the faulting kernel (--no-fault)\n");
    return;
  }
  /* a kernel that faults: the call fails naming the step (sync each step), the program
     refuses more calls, and after freeing it a new program runs */
  Lay l;
  memset(&l, 0, sizeof l);
  RtBuf x = mk(&l, RT_REGION_ARENA, RT_ST_F32, 4);
  RtStep st = kstep(K_FAULT, "the faulting step", 1, 0, &x, 1);
  st.i[0] = 8;   /* an address nobody owns */
  RtFunc f;
  memset(&f, 0, sizeof f);
  snprintf(f.name, sizeof f.name, "fault");
  f.n_steps = 1;
  f.steps = &st;
  f.arena_bytes = l.next[0];
  RtProgram p;
  memset(&p, 0, sizeof p);
  p.n_funcs = 1;
  p.funcs = &f;
  p.n_kernels = N_KNAMES - 1;
  p.kernel_names = knames;
  CudaOptions o;
  cuda_options_default(&o);
  o.sync_each_step = true;
  rc = cuda_program_init_opts(&cp, &p, test_kernels_ptx, sizeof test_kernels_ptx, 0, &o, err, sizeof err);
  CHECK(!rc, "init of the faulting program: %s", err);
  if (rc) return;
  rc = cuda_program_call(&cp, 0, NULL, NULL, err, sizeof err);
  CHECK(rc == 1 && has(err, "the faulting step") && (has(err, "ILLEGAL_ADDRESS") || has(err, "LAUNCH_FAILED")),
        "the fault names its step: %s", err);
  printf("note: fault reported as: %s\n", err);
  rc = cuda_program_call(&cp, 0, NULL, NULL, err, sizeof err);
  CHECK(rc == 1 && has(err, "failed earlier"), "a broken program refuses calls: %s", err);
  cuda_program_free(&cp);
  /* After the fault: either a fresh context runs the GEMM program (the emulated device, whose
     primary-context reset clears the fault), or the next program is refused with a message
     that says the process must be restarted, as CUDA documents for sticky errors (an H200
     with driver 580 did so even after cuDevicePrimaryCtxReset). Never a silent wrong run. */
  CudaProgram next;
  GemmProg gp;
  build_gemm_program(&gp);
  rc = cuda_program_init(&next, &gp.p, test_kernels_ptx, sizeof test_kernels_ptx, 0, err, sizeof err);
  if (rc) {
    CHECK(has(err, "restarted"), "after a fault, a new program either runs or names the restart: %s", err);
    printf("note: after the fault, a new program is refused: %s\n", err);
    return;
  }
  cuda_program_free(&next);
  printf("note: after the fault, the device was recovered in-process\n");
  int before = n_fail;
  gpu_gemm_program(false);
  CHECK(n_fail == before, "after a fault and a free, a new program runs correctly");
}

static int gpu_tests(bool fault) {
  char why[1024];
  if (!cuda_available(why, sizeof why)) {
    printf("SKIP: no GPU: %s\n", why);
    return 0;
  }
  CudaDeviceInfo info;
  char err[1024];
  CHECK(!cuda_device_query(0, &info, err, sizeof err), "device query: %s", err);
  printf("note: device 0: %s, compute capability %d.%d (%s), %.1f GiB\n", info.name, info.major, info.minor, info.arch,
         (double)info.total_mem / (1 << 30));
  gpu_gemm_program(true);
  gpu_executor();
  gpu_errors(fault);
  return 0;
}

int main(int argc, char **argv) {
  bool gpu = false, fault = true;
  for (int k = 1; k < argc; k++) {
    if (!strcmp(argv[k], "--gpu")) gpu = true;
    else if (!strcmp(argv[k], "--no-fault")) fault = false;
    else {
      fprintf(stderr, "usage: %s [--gpu [--no-fault]]\n", argv[0]);
      return 2;
    }
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  test_pack_args();
  test_gemm_layout();
  test_storage();
  test_global_init();
  test_check();
  test_tmap_check();
  test_memory_plan();
  test_arch();
  /* is there a GPU?  (the answer decides which absence checks apply) */
  char why[1024];
  bool present = cuda_available(why, sizeof why);
  test_no_driver(present);
  if (gpu) gpu_tests(fault);
  else if (present) printf("SKIP: the GPU tests need --gpu (tests/gpu/run.sh runs them)\n");
  else printf("SKIP: no GPU (%s): kernels, GEMMs, the executor and NCCL run in tests/gpu/run.sh\n", why);
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
