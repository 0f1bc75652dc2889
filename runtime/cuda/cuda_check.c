/* runtime/cuda/cuda_check.c — what the CUDA backend knows of a program without a device
 * (cuda_exec.h's "pure helpers"): the kernels' one parameter (cuda_pack_args), the host's
 * conversions to and from every storage, the storage a global is held in, the program's
 * checks, the memory plan and the options from the environment.  Its own file because none
 * of it touches the driver: the tests and `loom ir` use it on machines without a GPU, and
 * the files that run a program (cuda_exec.c and the ones it names) sit on top of it. */
#define LOOM_CUDA_INTERNAL 1
#include "runtime/fail.h"
#include "runtime/cuda/cuda_exec_internal.h"
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

int cuda_check_buf(void *ctx, const RtProgram *p, int func, const RtBuf *b, const char *what, char *err,
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
  RtChecker ck = {NULL, check_global, cuda_check_buf, check_step};
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
