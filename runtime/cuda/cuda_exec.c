/* runtime/cuda/cuda_exec.c — see cuda_exec.h.
 * About 1,300 lines on purpose: the program's checks, memory, modules, launches, graphs and
 * transfers all reach into CudaProgram's private state (LOOM_CUDA_INTERNAL); the GEMM steps'
 * plans and algorithm timing are in cuda_gemm.c. */
#define LOOM_CUDA_INTERNAL 1
#include "runtime/fail.h"
#include "runtime/cuda/cuda_exec.h"
#include "runtime/cuda/nvrtc.h"
#include "runtime/cuda/cuda_tmap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cpu/cpu_kernels.h"   /* rt_round: the one definition of every narrow format */

/* ================================================================== pure helpers */

void cuda_pack_args(const RtStep *st, const uint64_t base[RT_REGION_COUNT], CudaLoomArgs *out) {
  memset(out, 0, sizeof *out);
  int nb = st->n_in + st->n_out;
  if (nb < 0) nb = 0;
  if (nb > RT_MAX_BUFS) nb = RT_MAX_BUFS;
  for (int k = 0; k < nb; k++) {
    const RtBuf *b = &st->bufs[k];
    uint64_t a = b->region < RT_REGION_COUNT ? base[b->region] + (uint64_t)b->offset : 0;
    out->buf[k] = (void *)(uintptr_t)a;
  }
  for (int k = 0; k < RT_MAX_INTS; k++) out->i[k] = (long long)st->i[k];
  for (int k = 0; k < 4; k++) out->f[k] = st->f[k];
}

/* A float format with `eb` exponent and `mb` mantissa bits, bias, and inf/NaN as in IEEE
   (has_inf) or as e4m3fn (no inf; all ones is NaN). */
typedef struct {
  int eb, mb, bias;
  bool has_inf;
} MiniFmt;
static const MiniFmt F16 = {5, 10, 15, true}, E4M3 = {4, 3, 7, false}, E5M2 = {5, 2, 15, true};

/* v must be representable (rt_round'ed to the format). */
static uint32_t mini_encode(float v, MiniFmt f) {
  uint32_t sign = signbit(v) ? 1u << (f.eb + f.mb) : 0, emax = (1u << f.eb) - 1, mmask = (1u << f.mb) - 1;
  if (isnan(v)) return f.has_inf ? sign | emax << f.mb | 1u << (f.mb - 1) : sign | emax << f.mb | mmask;
  if (isinf(v)) return f.has_inf ? sign | emax << f.mb : sign | emax << f.mb | (mmask - 1);   /* e4m3: saturate */
  float a = fabsf(v);
  if (a == 0) return sign;
  int e;
  frexpf(a, &e);
  int E = e - 1;
  if (E >= 1 - f.bias) {
    uint32_t m = (uint32_t)ldexpf(a, f.mb - E) - (1u << f.mb);
    return sign | (uint32_t)(E + f.bias) << f.mb | (m & mmask);
  }
  return sign | ((uint32_t)ldexpf(a, f.mb - (1 - f.bias)) & mmask);
}

static float mini_decode(uint32_t b, MiniFmt f) {
  uint32_t emax = (1u << f.eb) - 1, mmask = (1u << f.mb) - 1;
  bool neg = (b >> (f.eb + f.mb)) & 1;
  uint32_t E = (b >> f.mb) & emax, m = b & mmask;
  float v;
  if (f.has_inf && E == emax) v = m ? NAN : INFINITY;
  else if (!f.has_inf && E == emax && m == mmask) v = NAN;
  else if (E) v = ldexpf(1.0f + ldexpf((float)m, -f.mb), (int)E - f.bias);
  else v = ldexpf((float)m, 1 - f.bias - f.mb);
  return neg ? -v : v;
}

static uint16_t to_bf16(float x) {
  float r = rt_round(RT_ROUND_BF16, x);
  uint32_t u;
  memcpy(&u, &r, 4);
  if (isnan(x)) return (uint16_t)((u >> 16) | 0x7FC0);   /* a NaN whose payload is in the low bits stays NaN */
  return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float r;
  memcpy(&r, &u, 4);
  return r;
}

void cuda_f32_to_storage(RtStorage s, const float *in, void *out, int64_t n) {
  if (n <= 0) return;
  switch (s) {
  case RT_ST_F32:
  case RT_ST_I32: memcpy(out, in, 4 * (size_t)n); break;
  case RT_ST_BF16:
    for (int64_t k = 0; k < n; k++) ((uint16_t *)out)[k] = to_bf16(in[k]);
    break;
  case RT_ST_F16:
    for (int64_t k = 0; k < n; k++) ((uint16_t *)out)[k] = (uint16_t)mini_encode(rt_round(RT_ROUND_F16, in[k]), F16);
    break;
  case RT_ST_F8E4M3:
    for (int64_t k = 0; k < n; k++) ((uint8_t *)out)[k] = (uint8_t)mini_encode(rt_round(RT_ROUND_F8E4M3, in[k]), E4M3);
    break;
  case RT_ST_F8E5M2:
    for (int64_t k = 0; k < n; k++) ((uint8_t *)out)[k] = (uint8_t)mini_encode(rt_round(RT_ROUND_F8E5M2, in[k]), E5M2);
    break;
  case RT_ST_BOOL:   /* in holds int32 0/1, as every integer on the host side */
    for (int64_t k = 0; k < n; k++) ((uint8_t *)out)[k] = ((const int32_t *)(const void *)in)[k] != 0;
    break;
  }
}

void cuda_storage_to_f32(RtStorage s, const void *in, float *out, int64_t n) {
  if (n <= 0) return;
  switch (s) {
  case RT_ST_F32:
  case RT_ST_I32: memcpy(out, in, 4 * (size_t)n); break;
  case RT_ST_BF16:
    for (int64_t k = 0; k < n; k++) out[k] = from_bf16(((const uint16_t *)in)[k]);
    break;
  case RT_ST_F16:
    for (int64_t k = 0; k < n; k++) out[k] = mini_decode(((const uint16_t *)in)[k], F16);
    break;
  case RT_ST_F8E4M3:
    for (int64_t k = 0; k < n; k++) out[k] = mini_decode(((const uint8_t *)in)[k], E4M3);
    break;
  case RT_ST_F8E5M2:
    for (int64_t k = 0; k < n; k++) out[k] = mini_decode(((const uint8_t *)in)[k], E5M2);
    break;
  case RT_ST_BOOL:
    for (int64_t k = 0; k < n; k++) ((int32_t *)(void *)out)[k] = ((const uint8_t *)in)[k];
    break;
  }
}

static RtStorage storage_of_round(int round) {
  switch (round) {
  case RT_ROUND_BF16: return RT_ST_BF16;
  case RT_ROUND_F16: return RT_ST_F16;
  case RT_ROUND_F8E4M3: return RT_ST_F8E4M3;
  case RT_ROUND_F8E5M2: return RT_ST_F8E5M2;
  default: return RT_ST_F32;
  }
}

/* A buffer naming the first element of global gl (the storage evidence), or NULL. */
static const RtBuf *global_evidence(const RtProgram *p, const RtGlobal *gl) {
  for (int f = 0; f < p->n_funcs; f++) {
    const RtFunc *fn = &p->funcs[f];
    for (int a = 0; a < fn->n_args && a < RT_MAX_FUNC_IO; a++)
      if (fn->args[a].region == gl->region && fn->args[a].offset == gl->offset && !fn->args[a].is_int) return &fn->args[a];
    for (int a = 0; a < fn->n_rets && a < RT_MAX_FUNC_IO; a++)
      if (fn->rets[a].region == gl->region && fn->rets[a].offset == gl->offset && !fn->rets[a].is_int) return &fn->rets[a];
    for (int s = 0; s < fn->n_steps && fn->steps; s++) {
      const RtStep *st = &fn->steps[s];
      /* the counts are not checked yet (cuda_program_check asks this first): clamp them */
      int64_t nb = rt_sadd(st->n_in < 0 ? 0 : st->n_in, st->n_out < 0 ? 0 : st->n_out);
      for (int b = 0; b < nb && b < RT_MAX_BUFS; b++)
        if (st->bufs[b].region == gl->region && st->bufs[b].offset == gl->offset && !st->bufs[b].is_int && st->bufs[b].n > 0)
          return &st->bufs[b];
    }
  }
  return NULL;
}

RtStorage cuda_global_storage(const RtProgram *p, int g) {
  const RtGlobal *gl = &p->globals[g];
  const RtBuf *b = global_evidence(p, gl);
  return b ? (RtStorage)b->storage : storage_of_round(gl->round);
}


/* ------------------------------------------------------------------ checking */

static int check_buf(void *ctx, const RtProgram *p, int func, const RtBuf *b, const char *what, char *err,
                     size_t errlen) {
  const char *fn = p->funcs[func].name;
  int sz = b->storage <= RT_ST_BOOL ? cuda_storage_size((RtStorage)b->storage) : 0;
  if (!sz) return rt_fail(err, errlen, 2, "@%s: %s: buffer has an unknown storage (%d)", fn, what, b->storage);
  if (b->is_int != (b->storage == RT_ST_I32 || b->storage == RT_ST_BOOL))
    return rt_fail(err, errlen, 2, "@%s: %s: %s buffer held as %s", fn, what, b->is_int ? "an integer" : "a float",
                cuda_storage_name((RtStorage)b->storage));
  if (b->region >= RT_REGION_COUNT || b->round > RT_ROUND_F8E5M2 || b->offset < 0 || b->offset % sz ||
      !rt_fits(b->offset, b->n, sz, rt_region_size(p, func, b->region)))
    return rt_fail(err, errlen, 2,
                "@%s: %s: buffer (region %d, offset %lld, %lld %s elements) is outside its region or misaligned", fn,
                what, b->region, (long long)b->offset, (long long)b->n, cuda_storage_name((RtStorage)b->storage));
  return 0;
}

static bool gemm_type_ok(RtStorage s) { return s == RT_ST_F32 || s == RT_ST_BF16 || s == RT_ST_F16; }

static int check_gemm(const RtStep *st, char *err, size_t errlen) {
  const int64_t *i = st->i;
  int64_t epi = i[RT_GEMM_EPI_INT];
  bool bias = epi & RT_GEMM_EPI_BIAS, gelu = epi & RT_GEMM_EPI_GELU, cin = epi & RT_GEMM_EPI_C,
       bgrad = epi & RT_GEMM_EPI_BGRAD, dgelu = epi & RT_GEMM_EPI_DGELU;
  bool bgrada = bgrad && !dgelu;   /* B's column sums (BGRADA), else the result's (DGELU_BGRAD) */
  if (epi < 0 || epi > 31 || (gelu && !bias) || (bgrada && epi != RT_GEMM_EPI_BGRAD) ||
      (dgelu && (epi & ~(RT_GEMM_EPI_DGELU | RT_GEMM_EPI_BGRAD))) ||
      (epi && (i[0] != 1 || (i[RT_GEMM_BETA_INT] && !bgrada))) || (bgrada && i[5]))
    return rt_fail(err, errlen, 2,
                "GEMM %s: epilogue flags %lld (a GELU needs the bias; a bias gradient of B goes alone, with tb = 0; "
                "GELU's backward goes alone or with the bias gradient; epilogues take batch 1 and beta 0, but for the "
                "bias gradient of B)",
                st->label, (long long)epi);
  if (st->n_in != 2 + bias + cin + dgelu || st->n_out != 1 + gelu + bgrad)
    return rt_fail(err, errlen, 2, "GEMM %s: needs buffers A B%s%s%s -> C%s%s", st->label, bias ? " bias" : "",
                dgelu ? " pre-activation" : "", cin ? " residual" : "", gelu ? " pre-activation" : "",
                bgrad ? " bias-gradient" : "");
  for (int k = 0; k < 9; k++)
    if (i[k] < 0) return rt_fail(err, errlen, 2, "GEMM %s: negative size or stride (i[%d])", st->label, k);
  if (i[4] > 1 || i[5] > 1) return rt_fail(err, errlen, 2, "GEMM %s: ta and tb must be 0 or 1", st->label);
  if (i[RT_GEMM_BETA_INT] != 0 && i[RT_GEMM_BETA_INT] != 1)
    return rt_fail(err, errlen, 2, "GEMM %s: beta (i[%d]) must be 0 or 1", st->label, RT_GEMM_BETA_INT);
  if (i[0] > INT32_MAX) return rt_fail(err, errlen, 2, "GEMM %s: batch count over 2^31", st->label);
  for (int k = 1; k <= 3; k++)
    if (i[k] > (INT64_C(1) << 40)) return rt_fail(err, errlen, 2, "GEMM %s: dimension i[%d] too large", st->label, k);
  RtStorage a = (RtStorage)st->bufs[0].storage, bt = (RtStorage)st->bufs[1].storage,
            c = (RtStorage)st->bufs[st->n_in].storage;
  if (!gemm_type_ok(a) || a != bt || !(c == a || c == RT_ST_F32))
    return rt_fail(err, errlen, 2,
                "GEMM %s: operands %s x %s -> %s are not supported on CUDA (f32, bf16 or f16 operands of one type; the "
                "result in that type or f32)",
                st->label, cuda_storage_name(a), cuda_storage_name(bt), cuda_storage_name(c));
  if (st->bufs[st->n_in].round != RT_ROUND_NONE && storage_of_round(st->bufs[2].round) != c)
    return rt_fail(err, errlen, 2, "GEMM %s: the result is held as %s but rounded to another format: store it in that format",
                st->label, cuda_storage_name(c));
  int64_t batch = i[0], M = i[1], N = i[2], K = i[3];
  int64_t need[3] = {rt_smul(M, K), rt_smul(K, N), rt_smul(M, N)}, stride[3] = {i[6], i[7], i[8]};
  /* an operand with a row stride (a view): (rows - 1) * ld + cols elements, batch 1 */
  for (int k = 0; k < 2; k++) {
    int64_t ld = i[RT_GEMM_LDA_INT + k];
    int64_t rows = k == 0 ? (i[4] ? K : M) : (i[5] ? N : K), cols = k == 0 ? (i[4] ? M : K) : (i[5] ? K : N);
    if (ld < 0 || (ld && (ld < cols || batch != 1)))
      return rt_fail(err, errlen, 2, "GEMM %s: row stride %lld of operand %d is below its %lld columns or on a batch", st->label,
                  (long long)ld, k, (long long)cols);
    if (ld && rows > 0) need[k] = rt_smul(rows - 1, ld) + cols;
  }
  int64_t ldc = i[RT_GEMM_LDC_INT];
  if (ldc < 0 || (ldc && (ldc < N || batch != 1 || (epi & (RT_GEMM_EPI_C | RT_GEMM_EPI_GELU | RT_GEMM_EPI_DGELU)))))
    return rt_fail(err, errlen, 2, "GEMM %s: row stride %lld of C is below its %lld columns, on a batch or with a matrix epilogue",
                st->label, (long long)ldc, (long long)N);
  if (ldc && M > 0) need[2] = rt_smul(M - 1, ldc) + N;
  const RtBuf *ops[3] = {&st->bufs[0], &st->bufs[1], &st->bufs[st->n_in]};
  for (int k = 0; k < 3; k++)
    if (batch > 0 && need[k] > 0 &&   /* (batch - 1) * stride + need <= n, without overflow */
        (need[k] > ops[k]->n || (stride[k] > 0 && batch - 1 > (ops[k]->n - need[k]) / stride[k])))
      return rt_fail(err, errlen, 2, "GEMM %s: operand %d reaches outside its buffer", st->label, k);
  /* the epilogue's buffers: the bias [N] in C's type or f32; the residual and the
     pre-activation [M, N] in C's type */
  const RtBuf *b = bias ? &st->bufs[2] : NULL, *r = cin ? &st->bufs[2 + bias] : NULL,
              *x = gelu ? &st->bufs[st->n_in + 1] : dgelu ? &st->bufs[2] : NULL;
  if ((b && (b->n < N || (b->storage != c && b->storage != RT_ST_F32))) || (r && (r->n < M * N || r->storage != c)) ||
      (x && (x->n < M * N || x->storage != c)))
    return rt_fail(err, errlen, 2, "GEMM %s: an epilogue buffer is too small or of another type than the result", st->label);
  /* the bias gradient [N] in the operands' type, C's or f32 */
  const RtBuf *g = bgrad ? &st->bufs[st->n_in + 1] : NULL;
  if (g && (g->n < N || (g->storage != a && g->storage != c && g->storage != RT_ST_F32)))
    return rt_fail(err, errlen, 2, "GEMM %s: the bias gradient buffer is too small or of another type than the operands, the "
                "result or f32", st->label);
  return 0;
}

/* A global's storage (cuda_global_storage) sets its element size and alignment. */
static int check_global(void *ctx, const RtProgram *p, int g, char *err, size_t errlen) {
  const RtGlobal *gl = &p->globals[g];
  RtStorage s = cuda_global_storage(p, g);
  int sz = cuda_storage_size(s);
  if (gl->region <= RT_REGION_ARENA || gl->region >= RT_REGION_COUNT || !sz || s == RT_ST_I32 || gl->offset < 0 ||
      gl->offset % sz || !rt_fits(gl->offset, gl->n, sz, p->region_bytes[gl->region]) || gl->rank < 0 || gl->rank > 8)
    return rt_fail(err, errlen, 2, "global $%s (%d, %s) is outside its region or misaligned", gl->name, g,
                cuda_storage_name(s));
  return 0;
}

static int check_step(void *ctx, const RtProgram *p, const RtStep *st, char *msg, size_t n) {
  switch (st->kind) {
  case RT_STEP_KERNEL: {
    if (st->which < 0 || st->which >= p->n_kernels) return rt_fail(msg, n, 2, "names no kernel of the module");
    uint64_t threads = st->block[0] > 1024 || st->block[1] > 1024 || st->block[2] > 1024
                           ? UINT64_MAX   /* no product to wrap around */
                           : (uint64_t)st->block[0] * st->block[1] * st->block[2];
    if (!st->grid[0] || !st->grid[1] || !st->grid[2] || !threads || threads > 1024 || st->grid[1] > 65535 ||
        st->grid[2] > 65535 || st->block[2] > 64)
      return rt_fail(msg, n, 2, "bad launch dimensions grid %ux%ux%u block %ux%ux%u", st->grid[0], st->grid[1],
                  st->grid[2], st->block[0], st->block[1], st->block[2]);
    return cuda_tmap_check(st, msg, n);
  }
  case RT_STEP_GEMM: return check_gemm(st, msg, n);
  case RT_STEP_BUILTIN: return cuda_mesh_step_ok(st, msg, n) ? 0 : 2;
  }
  return rt_fail(msg, n, 2, "an unknown kind");
}

int cuda_program_check(const RtProgram *p, char *err, size_t errlen) {
  RtChecker ck = {NULL, check_global, check_buf, check_step};
  int rc = rt_program_check(p, &ck, err, errlen);
  if (rc) return rc;
  /* A global's storage is that of the buffers naming it: they must agree. */
  for (int g = 0; g < p->n_globals; g++) {
    const RtGlobal *gl = &p->globals[g];
    RtStorage s = cuda_global_storage(p, g);
    for (int f = 0; f < p->n_funcs; f++)
      for (int k = 0; k < p->funcs[f].n_steps; k++) {
        const RtStep *st = &p->funcs[f].steps[k];
        for (int b = 0; b < st->n_in + st->n_out; b++)
          if (st->bufs[b].region == gl->region && st->bufs[b].offset == gl->offset && st->bufs[b].n > 0 &&
              st->bufs[b].storage != s)
            return rt_fail(err, errlen, 2, "global $%s is held as %s but step %d of @%s (%s) reads it as %s", gl->name,
                        cuda_storage_name(s), k, p->funcs[f].name, st->label,
                        cuda_storage_name((RtStorage)st->bufs[b].storage));
      }
  }
  return 0;
}

#define DEFAULT_WORKSPACE ((size_t)32 << 20)

void cuda_program_memory_plan(const RtProgram *p, size_t workspace_bytes, CudaMemory *m) {
  memset(m, 0, sizeof *m);
  bool gemms = false;
  for (int f = 0; f < p->n_funcs; f++) {
    if (p->funcs[f].arena_bytes > m->max_arena) m->max_arena = p->funcs[f].arena_bytes;
    for (int s = 0; s < p->funcs[f].n_steps; s++) gemms |= p->funcs[f].steps[s].kind == RT_STEP_GEMM;
  }
  m->arenas = m->max_arena;   /* one arena, shared: a call's temporaries live only during the call */
  for (int r = 1; r < RT_REGION_COUNT; r++) m->regions += p->region_bytes[r];
  m->workspace = gemms ? (int64_t)(workspace_bytes ? workspace_bytes : DEFAULT_WORKSPACE) : 0;
  m->total = m->arenas + m->regions + m->workspace;
}

void cuda_options_default(CudaOptions *o) {
  memset(o, 0, sizeof *o);
  const char *t = getenv("LOOM_TF32"), *s = getenv("LOOM_CUDA_SYNC"), *pr = getenv("LOOM_PROFILE");
  o->tf32 = t && *t && strcmp(t, "0");
  o->sync_each_step = s && *s && strcmp(s, "0");
  o->profile = pr && *pr && strcmp(pr, "0");
  const char *g = getenv("LOOM_CUDA_GRAPH");
  o->graphs = !(g && !strcmp(g, "0"));
  const char *tu = getenv("LOOM_CUDA_GEMM_TUNE");
  o->gemm_tune = !(tu && (!*tu || !strcmp(tu, "0")));
  o->gemm_tune_verbose = tu && !strcmp(tu, "verbose");
  /* the training loop issues step N+1 before it waits for step N's loss unless asked not to;
     LOOM_CUDA_SYNC=1 (a fault named at its step) implies the synchronous steps too */
  const char *ss = getenv("LOOM_CUDA_SYNC_STEP");
  o->sync_step = (ss && *ss && strcmp(ss, "0")) || o->sync_each_step;
}

int cuda_find_func(const CudaProgram *cp, const char *name) {
  if (!cp->p) return -1;
  for (int f = 0; f < cp->p->n_funcs; f++)
    if (!strcmp(cp->p->funcs[f].name, name)) return f;
  return -1;
}

int cuda_program_init(CudaProgram *cp, const RtProgram *p, const void *image, size_t n, int device, char *err,
                      size_t errlen) {
  CudaOptions o;
  cuda_options_default(&o);
  return cuda_program_init_opts(cp, p, image, n, device, &o, err, errlen);
}

#ifdef LOOM_HAVE_CUDA_HEADERS
/* ================================================================== on the device */

#include "runtime/cuda/cuda_gemm.h"   /* the GEMM steps: plans, runs, the algorithms' timing */

#define CU(fn, args, where) cuda_cu_fail(d->fn args, #fn, where, err, errlen)
#define LT(fn, args, where) cuda_lt_fail(l->fn args, #fn, where, err, errlen)

static int dev_alloc(CudaProgram *cp, uint64_t *out, int64_t bytes, const char *what, char *err, size_t errlen) {
  const CudaDriverApi *d = cuda_driver(err, errlen);
  *out = 0;
  if (bytes <= 0) return 0;
  CUdeviceptr p = 0;
  CUresult r = d->cuMemAlloc(&p, (size_t)bytes);
  if (r != CUDA_SUCCESS) {
    char where[640];
    size_t fr = 0, tot = 0;
    d->cuMemGetInfo(&fr, &tot);
    snprintf(where, sizeof where, "allocating %s (%.1f MiB; %.1f of %.1f MiB free on %s)", what,
             (double)bytes / 1048576.0, (double)fr / 1048576.0, (double)tot / 1048576.0, cp->info.name);
    return cuda_cu_fail(r, "cuMemAlloc", where, err, errlen);
  }
  *out = (uint64_t)p;
  return CU(cuMemsetD8Async, (p, 0, (size_t)bytes, (CUstream)cp->stream), what);
}

static bool looks_binary(const unsigned char *b, size_t n) {
  if (n >= 4 && b[0] == 0x7F && b[1] == 'E' && b[2] == 'L' && b[3] == 'F') return true;   /* cubin */
  if (n >= 4 && b[0] == 0x50 && b[1] == 0xED && b[2] == 0x55 && b[3] == 0xBA) return true; /* fatbin */
  return false;
}

static int load_module(CudaProgram *cp, const void *image, size_t n, char *err, size_t errlen) {
  const CudaDriverApi *d = cuda_driver(err, errlen);
  /* a bundle of several NVRTC programs' cubins (nvrtc.h): a module each */
  _Static_assert(sizeof cp->modules / sizeof *cp->modules >= NVRTC_MAX_PROGRAMS, "a module per program");
  const unsigned char *parts[NVRTC_MAX_PROGRAMS];
  size_t sizes[NVRTC_MAX_PROGRAMS];
  int count = nvrtc_bundle_parts(image, n, parts, sizes, NVRTC_MAX_PROGRAMS);
  if (count < 0) return rt_fail(err, errlen, 2, "the program's CUDA module (%zu bytes) is a damaged bundle", n);
  if (count > 1) {
    for (int i = 0; i < count; i++) {
      int rc = load_module(cp, parts[i], sizes[i], err, errlen);
      if (rc) return rc;
    }
    return 0;
  }
  const unsigned char *b = image;
  char *copy = NULL;
  const void *img = image;
  if (!looks_binary(b, n) && (n == 0 || b[n - 1] != 0)) {   /* PTX text must end in a NUL */
    copy = malloc(n + 1);
    if (!copy) return rt_fail(err, errlen, 1, "out of memory");
    memcpy(copy, image, n);
    copy[n] = 0;
    img = copy;
  }
  enum { LOG_BYTES = 8192 };
  char *jit_log = calloc(1, LOG_BYTES);
  CUjit_option opts[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void *vals[2] = {jit_log, (void *)(uintptr_t)(jit_log ? LOG_BYTES - 1 : 0)};
  CUmodule m = NULL;
  CUresult r = d->cuModuleLoadDataEx(&m, img, jit_log ? 2 : 0, opts, vals);
  free(copy);
  int rc = 0;
  if (r != CUDA_SUCCESS) {
    char where[1024];
    snprintf(where, sizeof where, "loading the program's CUDA module (%zu bytes, for %s %s)%s%.400s", n, cp->info.name,
             cp->info.arch, jit_log && jit_log[0] ? ": " : "", jit_log ? jit_log : "");
    rc = cuda_cu_fail(r, "cuModuleLoadData", where, err, errlen);
  }
  free(jit_log);
  if (!rc) cp->modules[cp->n_modules++] = m;
  return rc;
}

static int load_kernels(CudaProgram *cp, char *err, size_t errlen) {
  const CudaDriverApi *d = cuda_driver(err, errlen);
  const RtProgram *p = cp->p;
  cp->fns = calloc((size_t)(p->n_kernels ? p->n_kernels : 1), sizeof(void *));
  if (!cp->fns) return rt_fail(err, errlen, 1, "out of memory");
  for (int k = 0; k < p->n_kernels; k++) {
    char name[sizeof p->kernel_names[0] + 1];
    memcpy(name, p->kernel_names[k], sizeof p->kernel_names[0]);
    name[sizeof p->kernel_names[0]] = 0;
    CUfunction fn = NULL;
    char where[128];
    snprintf(where, sizeof where, "(kernel %s, #%d, is not in the CUDA module)", name, k);
    for (int m = 0; m < cp->n_modules - 1 && !fn; m++)   /* the last module says why it is missing */
      if (d->cuModuleGetFunction(&fn, (CUmodule)cp->modules[m], name) != CUDA_SUCCESS) fn = NULL;
    if (!fn && CU(cuModuleGetFunction, (&fn, (CUmodule)cp->modules[cp->n_modules - 1], name), where)) return 1;
    cp->fns[k] = fn;
    /* Launch limits of this kernel, checked once against every step that launches it. */
    uint32_t smem = 0, threads = 0;
    for (int f = 0; f < p->n_funcs; f++)
      for (int s = 0; s < p->funcs[f].n_steps; s++) {
        const RtStep *st = &p->funcs[f].steps[s];
        if (st->kind != RT_STEP_KERNEL || st->which != k) continue;
        if (st->smem > smem) smem = st->smem;
        uint32_t t = st->block[0] * st->block[1] * st->block[2];
        if (t > threads) threads = t;
      }
    snprintf(where, sizeof where, "(kernel %s)", name);
    if (smem > 48 * 1024) {
      if ((int)smem > cp->info.max_smem_optin)
        return rt_fail(err, errlen, 2, "kernel %s asks for %u bytes of shared memory; %s allows %d", name, smem,
                    cp->info.name, cp->info.max_smem_optin);
      if (CU(cuFuncSetAttribute, (fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)smem), where)) return 1;
    }
    int max_threads = 0;
    if (CU(cuFuncGetAttribute, (&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn), where)) return 1;
    if (threads > (uint32_t)max_threads)
      return rt_fail(err, errlen, 2, "kernel %s is launched with %u threads per block; compiled it allows %d (registers?)",
                  name, threads, max_threads);
  }
  return 0;
}

static int profile_init(CudaProgram *cp, char *err, size_t errlen);

int cuda_program_init_opts(CudaProgram *cp, const RtProgram *p, const void *image, size_t n, int device,
                           const CudaOptions *opt, char *err, size_t errlen) {
  memset(cp, 0, sizeof *cp);
  cp->p = p;
  cp->device = -1;
  if (opt) cp->opt = *opt;
  else cuda_options_default(&cp->opt);
  int rc = cuda_program_check(p, err, errlen);
  if (rc) {
    cp->p = NULL;
    return rc;
  }
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d) {
    cp->p = NULL;
    return 1;
  }
  if (cuda_device_query(device, &cp->info, err, errlen) || cuda_device_retain(device, &cp->ctx, err, errlen)) {
    cp->p = NULL;
    return 1;
  }
  cp->device = device;
  size_t nf = (size_t)(p->n_funcs ? p->n_funcs : 1);
  CudaMemory plan;
  cuda_program_memory_plan(p, cp->opt.workspace_bytes, &plan);
  cp->plans = calloc(nf, sizeof *cp->plans);
  cp->gstorage = calloc((size_t)(p->n_globals ? p->n_globals : 1), sizeof *cp->gstorage);
  rc = cp->plans && cp->gstorage ? 0 : rt_fail(err, errlen, 1, "out of memory");
  for (int f = 0; !rc && f < p->n_funcs; f++)
    if (!(cp->plans[f] = calloc((size_t)(p->funcs[f].n_steps ? p->funcs[f].n_steps : 1), sizeof(CudaGemmPlan *))))
      rc = rt_fail(err, errlen, 1, "out of memory");
  for (int g = 0; !rc && g < p->n_globals; g++) cp->gstorage[g] = cuda_global_storage(p, g);
  /* Host staging: the largest function's arguments, or its results, in their storage. */
  for (int f = 0; !rc && f < p->n_funcs; f++) {
    size_t in = 0, out = 0;
    for (int a = 0; a < p->funcs[f].n_args; a++)
      in += ((size_t)p->funcs[f].args[a].n * (size_t)cuda_storage_size((RtStorage)p->funcs[f].args[a].storage) + 63) / 64 * 64;
    for (int a = 0; a < p->funcs[f].n_rets; a++)
      out += ((size_t)p->funcs[f].rets[a].n * (size_t)cuda_storage_size((RtStorage)p->funcs[f].rets[a].storage) + 63) / 64 * 64;
    if (in > cp->staging_bytes) cp->staging_bytes = in;
    if (out > cp->staging_bytes) cp->staging_bytes = out;
  }
  if (!rc && !(cp->staging = malloc(cp->staging_bytes ? cp->staging_bytes : 64))) rc = rt_fail(err, errlen, 1, "out of memory");
  CUstream stream = NULL;
  if (!rc) rc = CU(cuStreamCreate, (&stream, CU_STREAM_NON_BLOCKING), "");
  cp->stream = stream;
  if (!rc && p->n_kernels > 0) {
    if (!image || !n) rc = rt_fail(err, errlen, 2, "the program has %d kernels but no CUDA module", p->n_kernels);
    else rc = load_module(cp, image, n, err, errlen);
    if (!rc) rc = load_kernels(cp, err, errlen);
  }
  static const char *const region_name[RT_REGION_COUNT] = {"the arena", "the parameters", "the gradient accumulators",
                                                            "the optimizer state"};
  for (int r = 1; !rc && r < RT_REGION_COUNT; r++)
    if (!(rc = dev_alloc(cp, &cp->regions[r], p->region_bytes[r], region_name[r], err, errlen)))
      cp->mem.regions += p->region_bytes[r];
  /* One arena for every function, as the memory plan (loom ir --memory) counts it: calls
     never overlap (each ends with a synchronization after copying its results out), and no
     function keeps anything in its arena from one call to the next. */
  if (!rc && (rc = dev_alloc(cp, &cp->arena, plan.max_arena, "the arena", err, errlen)) == 0)
    cp->mem.arenas = cp->mem.max_arena = plan.max_arena;
  if (!rc) rc = cuda_tmaps_build(cp, err, errlen);   /* the addresses are fixed from here on */
  if (!rc && plan.workspace > 0) {
    const CublasLtApi *l = cuda_cublaslt(err, errlen);
    cublasLtHandle_t h = NULL;
    rc = l ? 0 : 1;
    if (!rc && LT(cublasLtCreate, (&h), "")) {
      char m[700];
      snprintf(m, sizeof m, "%s (the driver supports CUDA %d.%d; cuBLASLt %zu)", err, d->driver_version / 1000,
               d->driver_version % 1000 / 10, l->cublasLtGetVersion());
      snprintf(err, errlen, "%s", m);
      rc = 1;
    }
    cp->lt = h;
    if (!rc && !(rc = dev_alloc(cp, &cp->workspace, plan.workspace, "the cuBLASLt workspace", err, errlen)))
      cp->mem.workspace = plan.workspace;
  }
  for (int f = 0; !rc && f < p->n_funcs; f++)
    for (int s = 0; !rc && s < p->funcs[f].n_steps; s++)
      if (p->funcs[f].steps[s].kind == RT_STEP_GEMM) rc = cuda_plan_gemm(cp, f, s, &cp->plans[f][s], err, errlen);
  if (!rc && cp->opt.gemm_tune) rc = cuda_tune_gemms(cp, err, errlen);
  if (!rc && cp->opt.profile) rc = profile_init(cp, err, errlen);
  if (!rc && !(cp->graph = calloc(nf, sizeof *cp->graph))) rc = rt_fail(err, errlen, 1, "out of memory");
  if (!rc && !(cp->graph_off = calloc(nf, sizeof *cp->graph_off))) rc = rt_fail(err, errlen, 1, "out of memory");
  if (!rc) rc = CU(cuStreamSynchronize, ((CUstream)cp->stream), "(initializing the program's memory)");
  cp->f_copies = cuda_find_func(cp, RT_FUNC_WEIGHT_COPIES);
  cp->copies_stale = true;
  cp->f_first = cuda_find_func(cp, RT_FUNC_FIRST_GRAD_STEP);
  cp->f_grad = cuda_find_func(cp, "grad_step");
  cp->f_opt = cuda_find_func(cp, "optimizer_step");
  if (cp->f_grad < 0 || cp->f_opt < 0) cp->f_first = -1;
  cp->grads_stale = cp->grads_held = false;   /* allocated as zeros */
  cp->mem.total = cp->mem.arenas + cp->mem.regions + cp->mem.workspace;
  if (!rc && cuda_device_query(device, &cp->info, err, errlen)) rc = 1;   /* free memory, now */
  if (rc) cuda_program_free(cp);
  return rc;
}

static void step_slots_free(CudaProgram *cp, const CudaDriverApi *d);

void cuda_program_free(CudaProgram *cp) {
  if (!cp->p) return;
  const CudaDriverApi *d = cuda_driver(NULL, 0);
  const CublasLtApi *l = cp->lt ? cuda_cublaslt(NULL, 0) : NULL;
  bool spoiled = false;
  if (d && cp->ctx) {
    d->cuCtxSetCurrent((CUcontext)cp->ctx);
    if (cp->stream) d->cuStreamSynchronize((CUstream)cp->stream);   /* errors here change nothing: free anyway */
    spoiled = cp->broken && d->cuCtxSynchronize() != CUDA_SUCCESS;
  }
  cuda_mesh_free(cp);
  for (int f = 0; d && cp->graph && f < cp->p->n_funcs; f++)
    if (cp->graph[f]) d->cuGraphExecDestroy((CUgraphExec)cp->graph[f]);
  free(cp->graph);
  free(cp->graph_off);
  if (d && cp->step_graph) d->cuGraphExecDestroy((CUgraphExec)cp->step_graph);
  if (d && cp->step_io) d->cuMemFree((CUdeviceptr)cp->step_io);
  step_slots_free(cp, d);
  for (int k = 0; k < CUDA_STEP_SLOTS; k++) {
    if (d && cp->step_slot[k].done) d->cuEventDestroy((CUevent)cp->step_slot[k].done);
    free(cp->step_slot[k].res);
  }
  for (int e = 0; d && cp->prof_ev && e < cp->n_prof_ev; e++)
    if (cp->prof_ev[e]) d->cuEventDestroy((CUevent)cp->prof_ev[e]);
  free(cp->prof_ev);
  for (int f = 0; cp->prof_ms && f < cp->p->n_funcs; f++) free(cp->prof_ms[f]);
  free(cp->prof_ms);
  free(cp->prof_calls);
  for (int f = 0; cp->plans && f < cp->p->n_funcs; f++) {
    for (int s = 0; cp->plans[f] && s < cp->p->funcs[f].n_steps; s++) cuda_plan_free(l, cp->plans[f][s]);
    free(cp->plans[f]);
  }
  free(cp->plans);
  cuda_tmaps_free(cp);
  if (d && cp->ctx) {
    if (l && cp->lt) l->cublasLtDestroy((cublasLtHandle_t)cp->lt);
    if (cp->arena) d->cuMemFree((CUdeviceptr)cp->arena);
    for (int r = 1; r < RT_REGION_COUNT; r++)
      if (cp->regions[r]) d->cuMemFree((CUdeviceptr)cp->regions[r]);
    if (cp->workspace) d->cuMemFree((CUdeviceptr)cp->workspace);
    if (cp->stream) d->cuStreamDestroy((CUstream)cp->stream);
    for (int m = 0; m < cp->n_modules; m++) d->cuModuleUnload((CUmodule)cp->modules[m]);
  }
  /* A fault spoiled the context for the whole process: drop our reference, then reset it
     (others may hold it: NCCL's CUDA runtime does until exit), so the next user gets a fresh one. */
  if (cp->device >= 0 && cp->ctx) cuda_device_release(cp->device);
  if (spoiled) cuda_device_recover(cp->device);
  free(cp->fns);
  free(cp->gstorage);
  free(cp->staging);
  memset(cp, 0, sizeof *cp);
}

/* The profile's events and times (CudaOptions.profile). */
static int profile_init(CudaProgram *cp, char *err, size_t errlen) {
  const CudaDriverApi *d = cuda_driver(err, errlen);
  int most = 0, nf = cp->p->n_funcs;
  for (int f = 0; f < nf; f++)
    if (cp->p->funcs[f].n_steps > most) most = cp->p->funcs[f].n_steps;
  cp->prof_ev = calloc((size_t)most + 1, sizeof *cp->prof_ev);
  cp->prof_ms = calloc((size_t)(nf ? nf : 1), sizeof *cp->prof_ms);
  cp->prof_calls = calloc((size_t)(nf ? nf : 1), sizeof *cp->prof_calls);
  if (!cp->prof_ev || !cp->prof_ms || !cp->prof_calls) return rt_fail(err, errlen, 1, "out of memory");
  for (int f = 0; f < nf; f++)
    if (!(cp->prof_ms[f] = calloc((size_t)cp->p->funcs[f].n_steps + 1, sizeof(float)))) return rt_fail(err, errlen, 1, "out of memory");
  for (int e = 0; e <= most; e++) {
    CUevent ev = NULL;
    if (CU(cuEventCreate, (&ev, CU_EVENT_DEFAULT), "(the profile's events)")) return 1;
    cp->prof_ev[cp->n_prof_ev++] = ev;
  }
  return 0;
}

/* After a profiled call's synchronization: every step's time. */
static int profile_read(CudaProgram *cp, int f, char *err, size_t errlen) {
  const CudaDriverApi *d = cuda_driver(err, errlen);
  int n = cp->p->funcs[f].n_steps;
  for (int s = 0; s < n; s++) {
    float ms = 0;
    if (CU(cuEventElapsedTime, (&ms, (CUevent)cp->prof_ev[s], (CUevent)cp->prof_ev[s + 1]), "(reading the profile)")) return 1;
    cp->prof_ms[f][s] = ms;
  }
  cp->prof_calls[f]++;
  return 0;
}

const float *cuda_profile_ms(const CudaProgram *cp, int f) {
  return cp->prof_calls && f >= 0 && f < cp->p->n_funcs && cp->prof_calls[f] ? cp->prof_ms[f] : NULL;
}

static int launch(CudaProgram *cp, int f, int s, const char *where, char *err, size_t errlen) {
  const CudaDriverApi *d = cuda_driver(err, errlen);
  const RtStep *st = &cp->p->funcs[f].steps[s];
  uint64_t base[RT_REGION_COUNT];
  for (int r = 0; r < RT_REGION_COUNT; r++) base[r] = r == RT_REGION_ARENA ? cp->arena : cp->regions[r];
  CudaLoomArgs args;
  cuda_pack_args(st, base, &args);
  if (st->coord_at && st->coord_at <= RT_MAX_INTS && st->coord_axis < 5) args.i[st->coord_at - 1] = cp->coord[st->coord_axis];
  void *params[2] = {&args, (void *)cuda_tmaps_of(cp, f, s)};   /* the second for a kernel that takes tensor maps */
  return CU(cuLaunchKernel,
            ((CUfunction)cp->fns[st->which], st->grid[0], st->grid[1], st->grid[2], st->block[0], st->block[1],
             st->block[2], st->smem, (CUstream)cp->stream, params, NULL),
            where);
}

static int run_step(CudaProgram *cp, int func, int s, char *err, size_t errlen) {
  char where[256];
  cuda_step_where(cp, func, s, where, sizeof where);
  const RtStep *st = &cp->p->funcs[func].steps[s];
  return st->kind == RT_STEP_GEMM      ? cuda_run_gemm(cp, func, s, where, err, errlen)
         : st->kind == RT_STEP_BUILTIN ? cuda_mesh_step(cp, func, s, where, err, errlen)
                                       : launch(cp, func, s, where, err, errlen);
}

/* CUDA graphs (CudaOptions.graphs): function f's steps are captured once into a graph; every
   call launches it, one launch instead of one per step.  The steps' parameters are the same at
   every call (fixed addresses: the arena, the regions, the workspace; i[] and f[]), so the
   graph is valid for the program's life.  Not for steps on other streams (a mesh's NCCL calls,
   a pipeline's transfers), nor when each step is timed or synchronized. */
static bool graphed(const CudaProgram *cp, int f) {
  if (!cp->opt.graphs || !cp->graph || cp->graph_off[f] || cp->comm || cp->pipe_slot || cp->prof_ev ||
      cp->opt.sync_each_step)
    return false;
  const RtFunc *fn = &cp->p->funcs[f];
  for (int s = 0; s < fn->n_steps; s++)
    if (fn->steps[s].kind == RT_STEP_BUILTIN) return false;
  return fn->n_steps > 0;
}

/* Ends the stream's capture and, when the captured launches all went well (ok), instantiates
   it: the runnable graph, or NULL where the driver refused either (the caller runs step by
   step from then on). */
static CUgraphExec end_capture(const CudaDriverApi *d, CUstream stream, bool ok) {
  CUgraph g = NULL;
  CUresult r = d->cuStreamEndCapture(stream, &g);
  CUgraphExec exec = NULL;
  if (ok && r == CUDA_SUCCESS && g) r = d->cuGraphInstantiate(&exec, g, 0);
  if (g) d->cuGraphDestroy(g);
  if (r != CUDA_SUCCESS && exec) {
    d->cuGraphExecDestroy(exec);
    exec = NULL;
  }
  return exec;
}

/* Captures function f's steps into cp->graph[f].  A capture the driver refuses (an operation
   it cannot record) is not an error: the function runs step by step from then on
   (graph_off); the steps ran nowhere during the capture. */
static int capture(CudaProgram *cp, int f, char *err, size_t errlen) {
  const CudaDriverApi *d = cuda_driver(err, errlen);
  CUstream stream = (CUstream)cp->stream;
  char where[256];
  snprintf(where, sizeof where, "capturing @%s into a CUDA graph", cp->p->funcs[f].name);
  if (CU(cuStreamBeginCapture, (stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), where)) return 1;
  char step_err[512] = "";
  int rc = 0;
  for (int s = 0; !rc && s < cp->p->funcs[f].n_steps; s++) rc = run_step(cp, f, s, step_err, sizeof step_err);
  CUgraphExec exec = end_capture(d, stream, rc == 0);
  if (!exec) cp->graph_off[f] = true;
  cp->graph[f] = exec;
  return 0;
}

int cuda_program_call(CudaProgram *cp, int func, void *const *args, void **rets, char *err, size_t errlen) {
  return cuda_program_call_dev(cp, func, args, NULL, rets, NULL, err, errlen);
}

/* The gradients after @optimizer_step (which no longer zeroes them: codegen/cuda/lower_grads.c)
   are stale: zeroed here, on the stream, before anything but the first micro-batch's
   @grad_step reads them. */
static int grads_zero(CudaProgram *cp, char *err, size_t errlen) {
  if (!cp->grads_stale) return 0;
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d || cuda_set_current(cp->ctx, err, errlen)) return 1;
  size_t bytes = (size_t)cp->p->region_bytes[RT_REGION_GRADS];
  if (bytes && CU(cuMemsetD8Async, ((CUdeviceptr)cp->regions[RT_REGION_GRADS], 0, bytes, (CUstream)cp->stream),
                  "(zeroing the gradients)"))
    return 1;
  cp->grads_stale = false;
  return 0;
}

static bool reads_grads(const CudaProgram *cp, int f) {
  const RtFunc *fn = &cp->p->funcs[f];
  for (int s = 0; s < fn->n_steps; s++)
    for (int b = 0; b < fn->steps[s].n_in + fn->steps[s].n_out; b++)
      if (fn->steps[s].bufs[b].region == RT_REGION_GRADS) return true;
  return false;
}

int cuda_dev_alloc(CudaProgram *cp, uint64_t *addr, int64_t bytes, const char *what, char *err, size_t errlen) {
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d || cuda_set_current(cp->ctx, err, errlen)) return 1;
  return dev_alloc(cp, addr, bytes, what, err, errlen);
}

void cuda_dev_free(CudaProgram *cp, uint64_t addr) {
  const CudaDriverApi *d = cuda_driver(NULL, 0);
  if (d && addr && cp->ctx) {
    d->cuCtxSetCurrent((CUcontext)cp->ctx);
    d->cuMemFree((CUdeviceptr)addr);
  }
}

int cuda_program_call_dev(CudaProgram *cp, int func, void *const *args, const uint64_t *dargs, void **rets,
                          const uint64_t *drets, char *err, size_t errlen) {
  if (!cp->p) return rt_fail(err, errlen, 2, "the CUDA program is not initialized");
  if (func < 0 || func >= cp->p->n_funcs) return rt_fail(err, errlen, 2, "no function #%d in the program", func);
  if (cp->broken) return rt_fail(err, errlen, 1, "the CUDA program failed earlier; free it and start again");
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d || cuda_set_current(cp->ctx, err, errlen)) return 1;
  int rc = 0;
  if (cp->f_first >= 0 && cp->grads_stale) {   /* the gradients after @optimizer_step: written, or zeroed first */
    if (func == cp->f_grad) func = cp->f_first;
    else if (func != cp->f_first && reads_grads(cp, func)) rc = grads_zero(cp, err, errlen);
  }
  const RtFunc *fn = &cp->p->funcs[func];
  CUstream stream = (CUstream)cp->stream;
  char where[256];
  /* the bf16 copies of the parameters, after the host wrote them (or anything else) */
  if (!rc && cp->copies_stale && cp->f_copies >= 0 && func != cp->f_copies) {
    for (int s = 0; !rc && s < cp->p->funcs[cp->f_copies].n_steps; s++) rc = run_step(cp, cp->f_copies, s, err, errlen);
    if (rc) {
      cp->broken = true;
      d->cuStreamSynchronize(stream);
      return rc;
    }
    cp->copies_stale = false;
  }
  snprintf(where, sizeof where, "copying the arguments of @%s", fn->name);
  size_t off = 0;
  for (int a = 0; !rc && a < fn->n_args; a++) {
    const RtBuf *b = &fn->args[a];
    size_t bytes = (size_t)b->n * (size_t)cuda_storage_size((RtStorage)b->storage);
    if (dargs && dargs[a]) {   /* already on the device, in the argument's storage */
      if (bytes) rc = CU(cuMemcpyDtoDAsync, ((CUdeviceptr)cuda_buf_addr(cp, func, b), (CUdeviceptr)dargs[a], bytes, stream), where);
      continue;
    }
    cuda_f32_to_storage((RtStorage)b->storage, args[a], cp->staging + off, b->n);
    if (bytes)
      rc = CU(cuMemcpyHtoDAsync, ((CUdeviceptr)cuda_buf_addr(cp, func, b), cp->staging + off, bytes, stream), where);
    off += (bytes + 63) / 64 * 64;
  }
  bool prof = cp->prof_ev != NULL;
  if (!rc && graphed(cp, func)) {
    if (!cp->graph[func]) rc = capture(cp, func, err, errlen);
    snprintf(where, sizeof where, "launching the CUDA graph of @%s", fn->name);
    if (!rc && cp->graph[func]) rc = CU(cuGraphLaunch, ((CUgraphExec)cp->graph[func], stream), where);
  }
  for (int s = 0; !rc && !cp->graph[func] && s < fn->n_steps; s++) {
    if (prof && (rc = CU(cuEventRecord, ((CUevent)cp->prof_ev[s], stream), where))) break;
    rc = run_step(cp, func, s, err, errlen);
    if (!rc && cp->opt.sync_each_step) rc = CU(cuStreamSynchronize, (stream), where);
  }
  if (!rc && prof) rc = CU(cuEventRecord, ((CUevent)cp->prof_ev[fn->n_steps], stream), "(the profile's last event)");
  off = 0;
  snprintf(where, sizeof where, "copying the results of @%s", fn->name);
  for (int r = 0; !rc && r < fn->n_rets; r++) {
    const RtBuf *b = &fn->rets[r];
    size_t bytes = (size_t)b->n * (size_t)cuda_storage_size((RtStorage)b->storage);
    if (drets && drets[r] && bytes)
      rc = CU(cuMemcpyDtoDAsync, ((CUdeviceptr)drets[r], (CUdeviceptr)cuda_buf_addr(cp, func, b), bytes, stream), where);
    else if (rets[r] && bytes)
      rc = CU(cuMemcpyDtoHAsync, (cp->staging + off, (CUdeviceptr)cuda_buf_addr(cp, func, b), bytes, stream), where);
    off += (bytes + 63) / 64 * 64;
  }
  if (!rc) {
    snprintf(where, sizeof where, "after @%s (a kernel or GEMM of it failed; LOOM_CUDA_SYNC=1 names the step)", fn->name);
    rc = cp->comm ? cuda_mesh_sync(cp, where, err, errlen) : CU(cuStreamSynchronize, (stream), where);
  }
  if (!rc && prof) rc = profile_read(cp, func, err, errlen);
  off = 0;
  for (int r = 0; !rc && r < fn->n_rets; r++) {
    const RtBuf *b = &fn->rets[r];
    size_t bytes = (size_t)b->n * (size_t)cuda_storage_size((RtStorage)b->storage);
    if (rets[r] && !(drets && drets[r])) cuda_storage_to_f32((RtStorage)b->storage, cp->staging + off, rets[r], b->n);
    off += (bytes + 63) / 64 * 64;
  }
  if (rc) {
    cp->broken = true;
    /* Let queued work finish (or fail) before anyone frees what it uses. */
    d->cuStreamSynchronize(stream);
  }
  if (!rc && cp->f_first >= 0 && (func == cp->f_first || func == cp->f_grad)) cp->grads_stale = false, cp->grads_held = true;
  if (!rc && cp->f_first >= 0 && func == cp->f_opt) cp->grads_stale = true, cp->grads_held = false;
  return rc;
}

/* ---- one CUDA graph a training step (cuda_program_step) ----
   step_io holds, 64-byte aligned each: per micro-batch its tokens and targets (in @grad_step's
   argument storages), @optimizer_step's lr and t, then (the outputs, from step_in on) each
   micro-batch's loss and the gradient norm.  The graph moves them with device copies (no host
   copy can be captured); the host copies them in before the launch and out after it. */
static size_t io_bytes(const RtBuf *b) { return ((size_t)b->n * (size_t)cuda_storage_size((RtStorage)b->storage) + 63) / 64 * 64; }

static bool step_graph_wanted(CudaProgram *cp, int fg, int fo) {
  const char *e = getenv("LOOM_CUDA_STEP_GRAPH");
  if ((e && !strcmp(e, "0")) || cp->step_graph_off || !graphed(cp, fg) || !graphed(cp, fo)) return false;
  const RtFunc *g = &cp->p->funcs[fg], *o = &cp->p->funcs[fo];
  return g->n_args == 2 && g->n_rets >= 1 && o->n_args == 2 && o->n_rets >= 1;
}

/* The slots' host images (page-locked where the driver gives them) and events. */
static void step_slots_free(CudaProgram *cp, const CudaDriverApi *d) {
  for (int k = 0; k < CUDA_STEP_SLOTS; k++) {
    if (cp->step_slot[k].pinned && d) d->cuMemFreeHost(cp->step_slot[k].host);
    else if (!cp->step_slot[k].pinned) free(cp->step_slot[k].host);
    cp->step_slot[k].host = NULL;
    cp->step_slot[k].pinned = false;
  }
}

/* step_io and its slots' host images for n micro-batches (kept while n stays; not while a
   step is in flight, whose copies use them) */
static int step_io_init(CudaProgram *cp, int fg, int fo, int64_t n, char *err, size_t errlen) {
  const RtFunc *g = &cp->p->funcs[fg], *o = &cp->p->funcs[fo];
  size_t in = (size_t)n * (io_bytes(&g->args[0]) + io_bytes(&g->args[1])) + io_bytes(&o->args[0]) + io_bytes(&o->args[1]);
  size_t all = in + (size_t)n * io_bytes(&g->rets[0]) + io_bytes(&o->rets[0]);
  if (cp->step_io && cp->step_graph_n == n) return 0;
  if (cp->step_count)
    return rt_fail(err, errlen, 2, "a training step of %lld micro-batches issued while one of %lld is in flight; wait for it "
                   "first", (long long)n, (long long)cp->step_graph_n);
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d) return 1;
  if (cp->step_graph) d->cuGraphExecDestroy((CUgraphExec)cp->step_graph);
  cp->step_graph = NULL;
  if (cp->step_io) d->cuMemFree((CUdeviceptr)cp->step_io);
  cp->step_io = 0;
  step_slots_free(cp, d);
  for (int k = 0; k < CUDA_STEP_SLOTS; k++) {
    void *h = NULL;
    /* page-locked: a copy from or to pageable memory may wait for the stream, which would
       make the host wait for step N before step N+1 is issued */
    if (d->cuMemAllocHost(&h, all) == CUDA_SUCCESS && h) cp->step_slot[k].pinned = true;
    else h = malloc(all);
    if (!(cp->step_slot[k].host = h)) return rt_fail(err, errlen, 1, "out of memory");
    if (!cp->step_slot[k].done && CU(cuEventCreate, ((CUevent *)&cp->step_slot[k].done, CU_EVENT_DISABLE_TIMING),
                                     "(the training step's events)"))
      return 1;
  }
  CUdeviceptr at = 0;
  if (CU(cuMemAlloc, (&at, all), "(the training step's inputs and outputs)")) return 1;
  cp->step_io = (uint64_t)at;
  cp->step_in = in;
  cp->step_bytes = all;
  cp->step_graph_n = n;
  return 0;
}

/* The step's launches on the stream (captured into the graph): per micro-batch its tokens and
   targets into @grad_step's arguments, its steps, its loss out; then lr and t, @optimizer_step's
   steps, the norm out. */
static int step_issue(CudaProgram *cp, int fg, int fo, int64_t n, char *err, size_t errlen) {
  const CudaDriverApi *d = cuda_driver(err, errlen);
  CUstream stream = (CUstream)cp->stream;
  const RtFunc *g = &cp->p->funcs[fg], *o = &cp->p->funcs[fo];
  const char *where = "(the training step's graph)";
  size_t in = 0, out = cp->step_in;
  int rc = 0;
  for (int64_t m = 0; !rc && m < n; m++) {
    for (int a = 0; !rc && a < 2; a++) {
      size_t bytes = (size_t)g->args[a].n * (size_t)cuda_storage_size((RtStorage)g->args[a].storage);
      if (bytes)
        rc = CU(cuMemcpyDtoDAsync, ((CUdeviceptr)cuda_buf_addr(cp, fg, &g->args[a]), (CUdeviceptr)(cp->step_io + in), bytes, stream), where);
      in += io_bytes(&g->args[a]);
    }
    /* the first micro-batch writes the gradients, whatever they held (the same buffers) */
    int f = m == 0 && fg == cp->f_grad && cp->f_first >= 0 ? cp->f_first : fg;
    for (int s = 0; !rc && s < cp->p->funcs[f].n_steps; s++) rc = run_step(cp, f, s, err, errlen);
    size_t bytes = (size_t)g->rets[0].n * (size_t)cuda_storage_size((RtStorage)g->rets[0].storage);
    if (!rc && bytes)
      rc = CU(cuMemcpyDtoDAsync, ((CUdeviceptr)(cp->step_io + out), (CUdeviceptr)cuda_buf_addr(cp, fg, &g->rets[0]), bytes, stream), where);
    out += io_bytes(&g->rets[0]);
  }
  for (int a = 0; !rc && a < 2; a++) {
    size_t bytes = (size_t)o->args[a].n * (size_t)cuda_storage_size((RtStorage)o->args[a].storage);
    if (bytes) rc = CU(cuMemcpyDtoDAsync, ((CUdeviceptr)cuda_buf_addr(cp, fo, &o->args[a]), (CUdeviceptr)(cp->step_io + in), bytes, stream), where);
    in += io_bytes(&o->args[a]);
  }
  for (int s = 0; !rc && s < o->n_steps; s++) rc = run_step(cp, fo, s, err, errlen);
  size_t bytes = (size_t)o->rets[0].n * (size_t)cuda_storage_size((RtStorage)o->rets[0].storage);
  if (!rc && bytes)
    rc = CU(cuMemcpyDtoDAsync, ((CUdeviceptr)(cp->step_io + out), (CUdeviceptr)cuda_buf_addr(cp, fo, &o->rets[0]), bytes, stream), where);
  return rc;
}

/* Captures the step's graph; a capture the driver refuses is not an error: the step goes call
   by call from then on (step_graph_off). */
static void step_capture(CudaProgram *cp, int fg, int fo, int64_t n) {
  const CudaDriverApi *d = cuda_driver(NULL, 0);
  CUstream stream = (CUstream)cp->stream;
  char e[512] = "";
  if (!d || d->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) != CUDA_SUCCESS) {
    cp->step_graph_off = true;
    return;
  }
  int rc = step_issue(cp, fg, fo, n, e, sizeof e);
  CUgraphExec exec = end_capture(d, stream, rc == 0);
  if (!exec) cp->step_graph_off = true;
  cp->step_graph = exec;
}

int cuda_program_step_issue(CudaProgram *cp, int f_grad, int f_opt, int64_t n, const int32_t *inputs,
                            const int32_t *targets, float lr, float t, char *err, size_t errlen) {
  if (!cp->p) return rt_fail(err, errlen, 2, "the CUDA program is not initialized");
  if (f_grad < 0 || f_grad >= cp->p->n_funcs || f_opt < 0 || f_opt >= cp->p->n_funcs || n < 1 ||
      cp->p->funcs[f_grad].n_rets < 1 || cp->p->funcs[f_grad].rets[0].n != 1 || cp->p->funcs[f_opt].n_rets < 1 ||
      cp->p->funcs[f_opt].rets[0].n != 1)
    return rt_fail(err, errlen, 2, "the program has no @grad_step -> loss and @optimizer_step -> grad_norm");
  if (cp->broken) return rt_fail(err, errlen, 1, "the CUDA program failed earlier; free it and start again");
  if (cp->step_count >= CUDA_STEP_SLOTS)
    return rt_fail(err, errlen, 2, "%d training steps are in flight already; wait for one first", CUDA_STEP_SLOTS);
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d || cuda_set_current(cp->ctx, err, errlen)) return 1;
  const RtFunc *g = &cp->p->funcs[f_grad], *o = &cp->p->funcs[f_opt];
  int64_t ntok = g->n_args == 2 ? g->args[0].n : 0;
  bool graph = step_graph_wanted(cp, f_grad, f_opt) && g->args[1].n == ntok && !(cp->f_first >= 0 && cp->grads_held);
  if (graph) {
    int rc = step_io_init(cp, f_grad, f_opt, n, err, errlen);
    if (rc == 2) return rc;   /* a step of another size in flight: the caller's mistake */
    graph = !rc;
  }
  int k = (cp->step_head + cp->step_count) % CUDA_STEP_SLOTS;
  if (!graph) {   /* call by call: the same launches, complete now; the results wait in the slot */
    if (cp->step_slot[k].res_cap < n + 1) {
      float *r = realloc(cp->step_slot[k].res, sizeof(float) * (size_t)(n + 1));
      if (!r) return rt_fail(err, errlen, 1, "out of memory");
      cp->step_slot[k].res = r;
      cp->step_slot[k].res_cap = n + 1;
    }
    float *res = cp->step_slot[k].res;
    void *rets[RT_MAX_FUNC_IO] = {0};
    int rc = 0;
    for (int64_t m = 0; !rc && m < n; m++) {
      void *args[2] = {(void *)(inputs + m * ntok), (void *)(targets + m * ntok)};
      rets[0] = &res[m];
      rc = cuda_program_call(cp, f_grad, args, rets, err, errlen);
    }
    void *oargs[2] = {&lr, &t};
    rets[0] = &res[n];
    if (!rc) rc = cuda_program_call(cp, f_opt, oargs, rets, err, errlen);
    if (rc) return rc;
    cp->step_slot[k].direct = true;
    cp->step_slot[k].n = n, cp->step_slot[k].fg = f_grad, cp->step_slot[k].fo = f_opt;
    cp->step_count++;
    return 0;
  }
  CUstream stream = (CUstream)cp->stream;
  unsigned char *host = cp->step_slot[k].host;
  int rc = 0;
  if (cp->copies_stale && cp->f_copies >= 0) {   /* the bf16 copies, after the host wrote a global */
    for (int s = 0; !rc && s < cp->p->funcs[cp->f_copies].n_steps; s++) rc = run_step(cp, cp->f_copies, s, err, errlen);
    if (!rc) cp->copies_stale = false;
  }
  /* this slot's image is free: the step that used it last was waited for */
  size_t off = 0;
  for (int64_t m = 0; m < n; m++)
    for (int a = 0; a < 2; a++) {
      cuda_f32_to_storage((RtStorage)g->args[a].storage, (const float *)(const void *)((a ? targets : inputs) + m * ntok),
                          host + off, g->args[a].n);
      off += io_bytes(&g->args[a]);
    }
  const float *oin[2] = {&lr, &t};
  for (int a = 0; a < 2; a++) {
    cuda_f32_to_storage((RtStorage)o->args[a].storage, oin[a], host + off, o->args[a].n);
    off += io_bytes(&o->args[a]);
  }
  if (!rc) rc = CU(cuMemcpyHtoDAsync, ((CUdeviceptr)cp->step_io, host, cp->step_in, stream), "(the training step's inputs)");
  if (!rc && !cp->step_graph) step_capture(cp, f_grad, f_opt, n);
  if (!rc && cp->step_graph)
    rc = CU(cuGraphLaunch, ((CUgraphExec)cp->step_graph, stream), "launching the CUDA graph of the training step");
  else if (!rc)
    rc = step_issue(cp, f_grad, f_opt, n, err, errlen);   /* refused: the same launches, one by one */
  if (!rc)
    rc = CU(cuMemcpyDtoHAsync, (host + cp->step_in, (CUdeviceptr)(cp->step_io + cp->step_in), cp->step_bytes - cp->step_in,
                                stream), "(the training step's losses)");
  if (!rc) rc = CU(cuEventRecord, ((CUevent)cp->step_slot[k].done, stream), "(the training step's event)");
  if (rc) {
    cp->broken = true;
    d->cuStreamSynchronize(stream);
    return rc;
  }
  cp->step_slot[k].direct = false;
  cp->step_slot[k].n = n, cp->step_slot[k].fg = f_grad, cp->step_slot[k].fo = f_opt;
  cp->step_count++;
  if (cp->f_first >= 0 && f_opt == cp->f_opt) cp->grads_stale = true, cp->grads_held = false;   /* @optimizer_step leaves them */
  return 0;
}

int cuda_program_step_wait(CudaProgram *cp, float *losses, float *grad_norm, char *err, size_t errlen) {
  if (!cp->p) return rt_fail(err, errlen, 2, "the CUDA program is not initialized");
  if (!cp->step_count) return rt_fail(err, errlen, 2, "no training step is in flight to wait for");
  int k = cp->step_head;
  int64_t n = cp->step_slot[k].n;
  cp->step_head = (k + 1) % CUDA_STEP_SLOTS;
  cp->step_count--;
  if (cp->step_slot[k].direct) {
    memcpy(losses, cp->step_slot[k].res, sizeof(float) * (size_t)n);
    *grad_norm = cp->step_slot[k].res[n];
    return 0;
  }
  if (cp->broken) return rt_fail(err, errlen, 1, "the CUDA program failed earlier; free it and start again");
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d || cuda_set_current(cp->ctx, err, errlen)) return 1;
  int rc = CU(cuEventSynchronize, ((CUevent)cp->step_slot[k].done),
              "after the training step (a kernel or GEMM of it failed; LOOM_CUDA_SYNC=1 names the step)");
  if (rc) {
    cp->broken = true;
    d->cuStreamSynchronize((CUstream)cp->stream);
    return rc;
  }
  const RtFunc *g = &cp->p->funcs[cp->step_slot[k].fg], *o = &cp->p->funcs[cp->step_slot[k].fo];
  const unsigned char *host = cp->step_slot[k].host;
  size_t off = cp->step_in;
  for (int64_t m = 0; m < n; m++) {
    cuda_storage_to_f32((RtStorage)g->rets[0].storage, host + off, &losses[m], 1);
    off += io_bytes(&g->rets[0]);
  }
  cuda_storage_to_f32((RtStorage)o->rets[0].storage, host + off, grad_norm, 1);
  return 0;
}

/* The synchronous step: issued, then waited for (nothing else may be in flight, so that the
   results are this step's). */
int cuda_program_step(CudaProgram *cp, int f_grad, int f_opt, int64_t n, const int32_t *inputs, const int32_t *targets,
                      float lr, float t, float *losses, float *grad_norm, char *err, size_t errlen) {
  if (cp->step_count)
    return rt_fail(err, errlen, 2, "a training step is in flight: wait for it before a synchronous one");
  int rc = cuda_program_step_issue(cp, f_grad, f_opt, n, inputs, targets, lr, t, err, errlen);
  return rc ? rc : cuda_program_step_wait(cp, losses, grad_norm, err, errlen);
}

/* Host <-> device copy of n elements of storage s at addr, converting from/to f32 (int32). */
static int xfer(CudaProgram *cp, uint64_t addr, RtStorage s, int64_t n, float *out, const float *in, const char *what,
                char *err, size_t errlen) {
  if (!cp->p) return rt_fail(err, errlen, 2, "the CUDA program is not initialized");
  if (cp->broken) return rt_fail(err, errlen, 1, "the CUDA program failed earlier; free it and start again");
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d || cuda_set_current(cp->ctx, err, errlen)) return 1;
  size_t bytes = (size_t)n * (size_t)cuda_storage_size(s);
  if (!bytes) return 0;
  void *tmp = malloc(bytes);
  if (!tmp) return rt_fail(err, errlen, 1, "out of memory %s", what);
  CUstream stream = (CUstream)cp->stream;
  int rc;
  if (in) {
    cuda_f32_to_storage(s, in, tmp, n);
    rc = CU(cuMemcpyHtoDAsync, ((CUdeviceptr)addr, tmp, bytes, stream), what);
  } else {
    rc = CU(cuMemcpyDtoHAsync, (tmp, (CUdeviceptr)addr, bytes, stream), what);
  }
  if (!rc) rc = CU(cuStreamSynchronize, (stream), what);
  if (!rc && out) cuda_storage_to_f32(s, tmp, out, n);
  free(tmp);
  return rc;
}

static int global_xfer(CudaProgram *cp, int g, float *out, const float *in, char *err, size_t errlen) {
  if (!cp->p || g < 0 || g >= cp->p->n_globals) return rt_fail(err, errlen, 2, "no global #%d in the program", g);
  const RtGlobal *gl = &cp->p->globals[g];
  char what[320];
  snprintf(what, sizeof what, "(%s global $%s)", in ? "writing" : "reading", gl->name);
  if (gl->region == RT_REGION_GRADS && grads_zero(cp, err, errlen)) return 1;   /* stale: zeros, as the program says */
  if (gl->region == RT_REGION_GRADS && in) cp->grads_held = true;
  return xfer(cp, cp->regions[gl->region] + (uint64_t)gl->offset, cp->gstorage[g], gl->n, out, in, what, err, errlen);
}

int cuda_global_read(CudaProgram *cp, int g, float *out, char *err, size_t errlen) {
  return global_xfer(cp, g, out, NULL, err, errlen);
}

int cuda_global_write(CudaProgram *cp, int g, const float *in, char *err, size_t errlen) {
  cp->copies_stale = true;   /* the parameters' bf16 copies are rewritten before the next call */
  return global_xfer(cp, g, NULL, in, err, errlen);
}

static int buf_xfer(CudaProgram *cp, int func, const RtBuf *b, void *out, const void *in, char *err, size_t errlen) {
  if (!cp->p || func < 0 || func >= cp->p->n_funcs) return rt_fail(err, errlen, 2, "no function #%d in the program", func);
  char what[200];
  snprintf(what, sizeof what, "(%s a buffer of @%s)", in ? "writing" : "reading", cp->p->funcs[func].name);
  if (check_buf(NULL, cp->p, func, b, "buffer", err, errlen)) return 2;
  return xfer(cp, cuda_buf_addr(cp, func, b), (RtStorage)b->storage, b->n, out, in, what, err, errlen);
}

int cuda_buf_read(CudaProgram *cp, int func, const RtBuf *b, void *out, char *err, size_t errlen) {
  return buf_xfer(cp, func, b, out, NULL, err, errlen);
}

int cuda_buf_write(CudaProgram *cp, int func, const RtBuf *b, const void *in, char *err, size_t errlen) {
  return buf_xfer(cp, func, b, NULL, in, err, errlen);
}

int cuda_globals_init(CudaProgram *cp, uint64_t seed, char *err, size_t errlen) {
  if (!cp->p) return rt_fail(err, errlen, 2, "the CUDA program is not initialized");
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d || cuda_set_current(cp->ctx, err, errlen)) return 1;
  cp->copies_stale = true;
  cp->grads_stale = cp->grads_held = false;   /* zeroed below */
  for (int g = 0; g < cp->p->n_globals; g++) {
    const RtGlobal *gl = &cp->p->globals[g];
    if (gl->init == RT_INIT_ZEROS) {   /* Adam's moments, gradients: zero bytes in every storage, on the device */
      char what[320];
      snprintf(what, sizeof what, "(zeroing global $%s)", gl->name);
      size_t bytes = (size_t)gl->n * (size_t)cuda_storage_size(cp->gstorage[g]);
      CUdeviceptr at = (CUdeviceptr)(cp->regions[gl->region] + (uint64_t)gl->offset);
      if (bytes && CU(cuMemsetD8Async, (at, 0, bytes, (CUstream)cp->stream), what)) return 1;
      continue;
    }
    float *t = malloc(sizeof(float) * (size_t)(gl->n ? gl->n : 1));
    if (!t) return rt_fail(err, errlen, 1, "out of memory initializing $%s", gl->name);
    rt_global_init_values(gl, seed, t);
    int rc = cuda_global_write(cp, g, t, err, errlen);
    free(t);
    if (rc) return rc;
  }
  return CU(cuStreamSynchronize, ((CUstream)cp->stream), "(initializing the globals)");
}

#else /* built without the CUDA headers */

#define NO_CUDA "this loom was built without the CUDA headers (cuda.h): use --backend cpu"

int cuda_program_init_opts(CudaProgram *cp, const RtProgram *p, const void *image, size_t n, int device,
                           const CudaOptions *opt, char *err, size_t errlen) {
  memset(cp, 0, sizeof *cp);
  return rt_fail(err, errlen, 1, "%s", NO_CUDA);
}
void cuda_program_free(CudaProgram *cp) { memset(cp, 0, sizeof *cp); }
int cuda_program_call(CudaProgram *cp, int func, void *const *args, void **rets, char *err, size_t errlen) {
  return rt_fail(err, errlen, cp->p ? 1 : 2, "%s", NO_CUDA);
}
int cuda_program_call_dev(CudaProgram *cp, int func, void *const *args, const uint64_t *dargs, void **rets,
                          const uint64_t *drets, char *err, size_t errlen) {
  return rt_fail(err, errlen, cp->p ? 1 : 2, "%s", NO_CUDA);
}
int cuda_dev_alloc(CudaProgram *cp, uint64_t *addr, int64_t bytes, const char *what, char *err, size_t errlen) {
  *addr = 0;
  return rt_fail(err, errlen, 1, "%s", NO_CUDA);
}
void cuda_dev_free(CudaProgram *cp, uint64_t addr) { (void)cp, (void)addr; }
int cuda_global_read(CudaProgram *cp, int g, float *out, char *err, size_t errlen) { return rt_fail(err, errlen, 1, "%s", NO_CUDA); }
int cuda_global_write(CudaProgram *cp, int g, const float *in, char *err, size_t errlen) {
  return rt_fail(err, errlen, 1, "%s", NO_CUDA);
}
int cuda_buf_read(CudaProgram *cp, int func, const RtBuf *b, void *out, char *err, size_t errlen) {
  return rt_fail(err, errlen, 1, "%s", NO_CUDA);
}
int cuda_buf_write(CudaProgram *cp, int func, const RtBuf *b, const void *in, char *err, size_t errlen) {
  return rt_fail(err, errlen, 1, "%s", NO_CUDA);
}
int cuda_globals_init(CudaProgram *cp, uint64_t seed, char *err, size_t errlen) { return rt_fail(err, errlen, 1, "%s", NO_CUDA); }
int cuda_program_step_issue(CudaProgram *cp, int f_grad, int f_opt, int64_t n, const int32_t *inputs,
                            const int32_t *targets, float lr, float t, char *err, size_t errlen) {
  return rt_fail(err, errlen, 1, "%s", NO_CUDA);
}
int cuda_program_step_wait(CudaProgram *cp, float *losses, float *grad_norm, char *err, size_t errlen) {
  return rt_fail(err, errlen, 1, "%s", NO_CUDA);
}
int cuda_program_step(CudaProgram *cp, int f_grad, int f_opt, int64_t n, const int32_t *inputs, const int32_t *targets,
                      float lr, float t, float *losses, float *grad_norm, char *err, size_t errlen) {
  return rt_fail(err, errlen, 1, "%s", NO_CUDA);
}

#endif

/* ================================================================== the device (runtime/device.h) */

static int dev_call(RtDevice *d, int func, void *const *args, void **rets, char *err, size_t errlen) {
  return cuda_program_call(d->impl, func, args, rets, err, errlen);
}
static int dev_read(RtDevice *d, int g, float *out, char *err, size_t errlen) {
  return cuda_global_read(d->impl, g, out, err, errlen);
}
static int dev_write(RtDevice *d, int g, const float *in, char *err, size_t errlen) {
  return cuda_global_write(d->impl, g, in, err, errlen);
}

/* one CUDA graph a training step (cuda_program_step) */
static int dev_step(RtDevice *d, int f_grad, int f_opt, int64_t n, const int32_t *inputs, const int32_t *targets, float lr,
                    float t, float *losses, float *grad_norm, char *err, size_t errlen) {
  return cuda_program_step(d->impl, f_grad, f_opt, n, inputs, targets, lr, t, losses, grad_norm, err, errlen);
}

/* the same in two halves: the training loop issues step N+1 before it waits for step N */
static int dev_step_issue(RtDevice *d, int f_grad, int f_opt, int64_t n, const int32_t *inputs, const int32_t *targets,
                          float lr, float t, char *err, size_t errlen) {
  return cuda_program_step_issue(d->impl, f_grad, f_opt, n, inputs, targets, lr, t, err, errlen);
}
static int dev_step_wait(RtDevice *d, float *losses, float *grad_norm, char *err, size_t errlen) {
  return cuda_program_step_wait(d->impl, losses, grad_norm, err, errlen);
}

/* device memory a caller keeps between calls (a pipeline's stash), and calls that read and
   write it in place (cuda_program_call_dev) */
static int dev_buf_alloc(RtDevice *d, int64_t bytes, uint64_t *addr, char *err, size_t errlen) {
  return cuda_dev_alloc(d->impl, addr, bytes, "a pipeline stash", err, errlen);
}
static void dev_buf_free(RtDevice *d, uint64_t addr) { cuda_dev_free(d->impl, addr); }
static int dev_call_dev(RtDevice *d, int func, void *const *args, const uint64_t *dargs, void **rets, const uint64_t *drets,
                        char *err, size_t errlen) {
  return cuda_program_call_dev(d->impl, func, args, dargs, rets, drets, err, errlen);
}

void cuda_device(RtDevice *d, CudaProgram *cp) {
  *d = (RtDevice){.p = cp->p, .kind = "CUDA", .impl = cp, .call = dev_call, .read = dev_read, .write = dev_write,
                  .host = NULL, .close = NULL, .step = dev_step, .buf_alloc = dev_buf_alloc, .buf_free = dev_buf_free,
                  .call_dev = dev_call_dev};
  if (!cp->opt.sync_step && !cp->comm) d->step_issue = dev_step_issue, d->step_wait = dev_step_wait;
}
