/* codegen/cuda/steps.c — the step builders every CUDA lowering file shares: a value's buffer
 * (cl_buf_of), a new step and its buffers, scratch, launch shapes, the kernel symbols of the
 * translation unit (builtin templates instantiated per storage dtype, fused kernel bodies
 * compiled once per distinct body), and a call of a fused kernel as its step(s).
 *
 * lower.c (the op dispatcher), lower_gemm.c, lower_fuse.c and lower_mesh.c all build steps
 * through these; this file calls none of them, so the lowering files form no loop (issue 30:
 * these lived in lower.c, and every family split out of it called back into its parent).
 * What a family needs from another family goes through the Lower state (the value aliases
 * lower_fuse.c records, read here by cl_buf_of) or the dispatcher hook L->lower_op.
 */
#include "codegen/cuda/cuda_internal.h"
#include "codegen/lower_common.h"
#include "runtime/cuda/nvrtc.h"

int cl_fail(Lower *L, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = cg_vfail(L->err, L->errlen, L->f, L->op, fmt, ap);
  va_end(ap);
  return rc;
}

/* The storage of a dtype in memory on CUDA; -1 when unsupported. */
int cl_storage_of(DType dt) {
  switch (dt) {
  case DT_F32: return RT_ST_F32;
  case DT_BF16: return RT_ST_BF16;
  case DT_F16: return RT_ST_F16;
  case DT_F8E4M3: return RT_ST_F8E4M3;
  case DT_F8E5M2: return RT_ST_F8E5M2;
  case DT_I32: return RT_ST_I32;
  case DT_BOOL: return RT_ST_BOOL;
  default: return -1;
  }
}

bool cl_env_on(const char *name) {
  const char *e = getenv(name);
  return e && *e && strcmp(e, "0");
}

int cl_st_size(int st) {
  switch (st) {
  case RT_ST_BF16:
  case RT_ST_F16: return 2;
  case RT_ST_F8E4M3:
  case RT_ST_F8E5M2:
  case RT_ST_BOOL: return 1;
  default: return 4;
  }
}

static char st_letter(int st) {
  static const char l[] = {[RT_ST_F32] = 'f', [RT_ST_I32] = 'i', [RT_ST_BF16] = 'b',
                           [RT_ST_F16] = 'h', [RT_ST_F8E4M3] = 'e', [RT_ST_F8E5M2] = 'm',
                           [RT_ST_BOOL] = 'o'};
  return l[st];
}

static const char *st_struct(int st) {
  static const char *const s[] = {[RT_ST_F32] = "loom_sf32", [RT_ST_I32] = "loom_si32", [RT_ST_BF16] = "loom_sbf16",
                                  [RT_ST_F16] = "loom_sf16", [RT_ST_F8E4M3] = "loom_sf8e4m3",
                                  [RT_ST_F8E5M2] = "loom_sf8e5m2", [RT_ST_BOOL] = "loom_sbool"};
  return s[st];
}


static const char *vname(const Value *v) {
  return v->kind == VAL_GLOBAL ? v->global->name : v->name ? v->name : "?";
}

/* A value that lower_fuse.c placed elsewhere (value_buf: a parameter's cast read from its bf16
   copy, and reshapes of it) */
bool cl_weight_copy_buf(const Lower *L, const Value *v, RtBuf *b) {
  if (!L->value_has || v->kind == VAL_GLOBAL || v->id < 0 || v->id > L->n_values || !L->value_has[v->id]) return false;
  *b = L->value_buf[v->id];
  return true;
}

/* L->op is the cast of a parameter with a bf16 copy (lower_fuse.c's plan): no step; its
   result reads the copy. */
bool cl_weight_copy_call(Lower *L) {
  const Value *r = L->op->n_results == 1 ? L->op->results[0] : NULL;
  return r && weight_cast_of_param(L->op) >= 0 && L->value_has && r->kind != VAL_GLOBAL && L->value_has[r->id] &&
         L->value_buf[r->id].region == RT_REGION_PARAMS;
}

/* The buffer of a value: a global's region, or the function's arena. */
int cl_buf_of(Lower *L, const Value *v, RtBuf *b) {
  if (cl_weight_copy_buf(L, v, b)) return 0;   /* a parameter's cast, read from its bf16 copy (lower_fuse.c) */
  memset(b, 0, sizeof *b);
  int st = cl_storage_of(v->type.dtype);
  if (st < 0)
    return cl_fail(L, "value %s%s is %s: the CUDA backend holds only f32, bf16, f16, f8, i32 and bool tensors in memory",
                 v->kind == VAL_GLOBAL ? "$" : "%", vname(v), dtype_name(v->type.dtype));
  b->n = type_numel(&v->type);
  b->is_int = !dtype_is_float(v->type.dtype);
  b->round = RT_ROUND_NONE;   /* kernels store each dtype natively */
  b->storage = (uint8_t)st;
  if (v->kind == VAL_GLOBAL) {
    b->region = (uint8_t)L->global_region[v->global->index];
    b->offset = L->global_offset[v->global->index];
    return 0;
  }
  if (L->view && v->kind != VAL_GLOBAL && v->id >= 0 && v->id < L->n_view && L->view[v->id].n && !L->view_ld[v->id]) {
    *b = L->view[v->id];   /* a contiguous part of another value (lower_gemm.c, views) */
    return 0;
  }
  b->region = RT_REGION_ARENA;
  if (v == L->moved_value) {   /* held in scratch for a while (lower_gemm.c: a bias gradient) */
    b->offset = L->moved_offset;
    return 0;
  }
  if (v->offset < 0) return cl_fail(L, "value %%%s has no arena offset; run the memory-plan pass first", vname(v));
  if (v->offset % 64)
    return cl_fail(L, "value %%%s is at offset %lld, not 64-byte aligned", vname(v), (long long)v->offset);
  int64_t bytes = (int64_t)cl_st_size(st) * b->n;
  if (v->offset + bytes > L->f->arena_bytes)
    return cl_fail(L, "value %%%s (%lld bytes at %lld) does not fit in the arena of %lld bytes (was memory-plan run "
                 "with target CUDA?)", vname(v), (long long)bytes, (long long)v->offset, (long long)L->f->arena_bytes);
  b->offset = v->offset;
  return 0;
}

bool cl_overlap(const RtBuf *a, const RtBuf *b) {
  int64_t ea = a->offset + cl_st_size(a->storage) * a->n, eb = b->offset + cl_st_size(b->storage) * b->n;
  return a->region == b->region && a->offset < eb && b->offset < ea;
}

/* ---------------------------------------------------------------- kernel symbols */

static int find_symbol(const Lower *L, const char *name) {
  for (int i = 0; i < L->n_names; i++)
    if (!strcmp(L->names[i], name)) return i;
  return -1;
}

/* A kernel NVRTC compiles in a program of its own, at full optimization (the tensor-core
   attention and grouped matmuls: seconds each); the others are memory-bound, compiled
   together at --Ofast-compile (runtime/cuda/nvrtc.h: nvrtc_compile_programs). */
static bool heavy_kernel(const char *name) {
  static const char *const prefixes[] = {"loom_attn_fwd", "loom_attn_dq", "loom_attn_dkdv", "loom_attnblk_",
                                         "loom_gmm_"};
  for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++)
    if (!strncmp(name, prefixes[i], strlen(prefixes[i]))) return true;
  return false;
}

/* Adds a symbol (its text appended to the translation unit after a marker saying which
   NVRTC program it may go to); returns its index or -1. */
static int add_symbol(Lower *L, const char *name, const char *text) {
  int i = find_symbol(L, name);
  if (i >= 0) return i;
  if (strlen(name) >= KNAME) {
    cl_fail(L, "internal error: kernel name %s is longer than %d characters", name, KNAME - 1);
    return -1;
  }
  if (L->n_names == L->cap_names) {
    int cap = L->cap_names ? 2 * L->cap_names : 64;
    char(*names)[KNAME] = realloc(L->names, sizeof *names * (size_t)cap);
    if (!names) {
      cl_fail(L, "out of memory");
      return -1;
    }
    L->names = names;
    L->cap_names = cap;
  }
  snprintf(L->names[L->n_names], KNAME, "%s", name);
  str_add(&L->text, "%s%s %s */\n%s", NVRTC_UNIT_MARK, heavy_kernel(name) ? "heavy" : "light", name, text);
  return L->n_names++;
}

/* A builtin kernel: an extern "C" wrapper of a prelude template.  With tmaps, the kernel
   also takes the step's tensor maps (program.h's RT_TMAP_INT), as a parameter in parameter
   space (__grid_constant__: the tensor copies read them there), and the template (a, t).
   Those (the Hopper kernels) are bound to at least 1 block an SM: ptxas then starts the kernel
   at the bound's register count (65536 / threads), which setmaxnreg needs (without it ptxas
   says C7508 "'setmaxnreg' ignored; unable to determine register count at entry"). */
static int builtin_symbol(Lower *L, const char *name, int max_threads, const char *call, bool tmaps) {
  int i = find_symbol(L, name);
  if (i >= 0) return i;
  Str t = {0};
  if (tmaps)
    str_add(&t, "extern \"C\" __global__ void __launch_bounds__(%d, 1) %s(LoomArgs a, const __grid_constant__ LoomTmaps t) "
                "{ %s(a, t); }\nLOOM_TMAP_KERNEL(%s)\n", max_threads, name, call, name);
  else
    str_add(&t, "extern \"C\" __global__ void __launch_bounds__(%d) %s(LoomArgs a) { %s(a); }\n", max_threads, name, call);
  if (t.oom) {
    cl_fail(L, "out of memory");
    return -1;
  }
  i = add_symbol(L, name, t.s);
  str_free(&t);
  return i;
}

int cl_builtin_symbol(Lower *L, const char *name, int max_threads, const char *call) {
  return builtin_symbol(L, name, max_threads, call, false);
}

static uint64_t fnv(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

/* Compiles kernel func fi (once; identical bodies share one symbol). */
int cl_fused_kernel(Lower *L, int fi) {
  if (L->fused_symbol[fi] >= 0) return 0;
  const Func *k = L->m->funcs.items[fi];
  Str body = {0}, fin = {0};
  CudaKernelInfo *info = &L->fused_info[fi];
  if (cuda_kernel_body(k, &body, &fin, info, L->err, L->errlen)) {
    str_free(&body);
    str_free(&fin);
    return IR_EINPUT;
  }
  /* the key: launch bounds and body */
  Str key = {0};
  uint32_t threads = info->block[0] * info->block[1] * info->block[2];
  str_add(&key, "__launch_bounds__(%u) %s", threads, body.s);
  str_free(&body);
  if (key.oom) {
    str_free(&fin);
    return cl_fail(L, "out of memory");
  }
  uint64_t h = fnv(key.s);
  L->fused_fin[fi] = -1;
  for (int b = 0; b < L->n_bodies; b++)
    if (L->body_hash[b] == h && !strcmp(L->bodies[b], key.s)) {
      L->fused_symbol[fi] = L->body_symbol[b];
      L->fused_fin[fi] = L->body_fin[b];
      str_free(&key);
      str_free(&fin);
      return 0;
    }
  char name[KNAME];
  snprintf(name, sizeof name, "k%d_%s", L->n_bodies, k->name);   /* truncated at 31: the number keeps it unique */
  for (char *c = name; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9'))) *c = '_';
  Str t = {0};
  str_add(&t, "\n/* kernel @%s: N = %lld, %s */\nextern \"C\" __global__ void %.*s %s", k->name, (long long)info->N,
           info->mode == CK_ELEMENTWISE ? "elementwise" : info->mode == CK_SERIAL ? "reductions, a thread per output"
           : info->mode == CK_ROW ? "reductions, a block per output" : "reductions, 32 outputs per block",
           (int)(strchr(key.s, ' ') - key.s), key.s, name);
  str_add(&t, "(LoomArgs a) %s", strchr(key.s, ' ') + 1);
  int sym = t.oom ? -1 : add_symbol(L, name, t.s);
  str_free(&t);
  int fsym = -1;
  if (sym >= 0 && info->split > 1) {
    /* its finish kernel: f<n>_<func> */
    name[0] = 'f';
    str_add(&t, "\n/* kernel @%s, finish: the %lld parts of each of its %lld reduction outputs, in order */\n"
             "extern \"C\" __global__ void __launch_bounds__(%u) %s(LoomArgs a) %s", k->name, (long long)info->split,
             (long long)info->out_n, info->fin_block, name, fin.s ? fin.s : "{}\n");
    fsym = t.oom ? -1 : add_symbol(L, name, t.s);
    str_free(&t);
    if (fsym < 0) sym = -1;
  }
  str_free(&fin);
  if (sym < 0) {
    str_free(&key);
    return L->err[0] ? IR_EINPUT : cl_fail(L, "out of memory");
  }
  int nb = L->n_bodies + 1;
  char **bodies = realloc(L->bodies, sizeof *bodies * (size_t)nb);
  if (bodies) L->bodies = bodies;
  uint64_t *hashes = realloc(L->body_hash, sizeof *hashes * (size_t)nb);
  if (hashes) L->body_hash = hashes;
  int *syms = realloc(L->body_symbol, sizeof *syms * (size_t)nb);
  if (syms) L->body_symbol = syms;
  int *fins = realloc(L->body_fin, sizeof *fins * (size_t)nb);
  if (fins) L->body_fin = fins;
  if (!bodies || !hashes || !syms || !fins) {
    str_free(&key);
    return cl_fail(L, "out of memory");
  }
  L->bodies[L->n_bodies] = key.s;   /* owned now */
  L->body_hash[L->n_bodies] = h;
  L->body_fin[L->n_bodies] = fsym;
  L->body_symbol[L->n_bodies++] = sym;
  L->fused_symbol[fi] = sym;
  L->fused_fin[fi] = fsym;
  return 0;
}

/* ---------------------------------------------------------------- steps */


RtStep *cl_new_step(Lower *L, Steps *s, RtStepKind kind, int which, const char *suffix) {
  if (which < 0) return NULL;
  RtStep *st = cg_new_step(&s->items, &s->n, &s->cap, L->op, kind, which, suffix);
  if (!st) {
    cl_fail(L, "out of memory");
    return NULL;
  }
  st->grid[0] = st->grid[1] = st->grid[2] = 1;
  st->block[0] = st->block[1] = st->block[2] = 1;
  return st;
}

/* Buffers: the given values as inputs, then the op's results (if results) as outputs. */
int cl_set_bufs(Lower *L, RtStep *st, const Value *const *in, int n_in, bool results) {
  const Op *op = L->op;
  int n_out = results ? op->n_results : 0;
  if (n_in + n_out > RT_MAX_BUFS)
    return cl_fail(L, "needs %d buffers; a step holds at most %d (RT_MAX_BUFS)", n_in + n_out, RT_MAX_BUFS);
  st->n_in = n_in;
  st->n_out = n_out;
  for (int i = 0; i < n_in; i++)
    if (cl_buf_of(L, in[i], &st->bufs[i])) return IR_EINPUT;
  for (int i = 0; i < n_out; i++)
    if (cl_buf_of(L, op->results[i], &st->bufs[n_in + i])) return IR_EINPUT;
  return 0;
}

int cl_set_operand_bufs(Lower *L, RtStep *st) {
  return cl_set_bufs(L, st, (const Value *const *)L->op->operands, L->op->n_operands, true);
}

/* Appends an output buffer of n f32 in the scratch region (at byte `at` of it). */
int cl_add_scratch(Lower *L, RtStep *st, int64_t at, int64_t n) {
  if (st->n_in + st->n_out >= RT_MAX_BUFS) return cl_fail(L, "needs more than %d buffers (RT_MAX_BUFS)", RT_MAX_BUFS);
  RtBuf *b = &st->bufs[st->n_in + st->n_out++];
  memset(b, 0, sizeof *b);
  b->region = RT_REGION_ARENA;
  b->storage = RT_ST_F32;
  b->round = RT_ROUND_NONE;
  b->offset = cg_align64(L->f->arena_bytes) + at;
  b->n = n;
  if (at + 4 * n > L->scratch) L->scratch = cg_align64(at + 4 * n);
  return 0;
}

/* The same for n i32 (the routing's counts and offsets). */
int cl_add_scratch_i32(Lower *L, RtStep *st, int64_t at, int64_t n) {
  if (cl_add_scratch(L, st, at, n)) return IR_EINPUT;
  RtBuf *b = &st->bufs[st->n_in + st->n_out - 1];
  b->storage = RT_ST_I32;
  b->is_int = 1;
  return 0;
}

int cl_push_int(Lower *L, RtStep *st, int *n, int64_t v) {
  if (*n >= RT_MAX_INTS) return cl_fail(L, "needs more than %d integer parameters (RT_MAX_INTS)", RT_MAX_INTS);
  st->i[(*n)++] = v;
  return 0;
}

int64_t cl_prod_dims(const Type *t, int from, int to) {
  int64_t p = 1;
  for (int d = from; d < to; d++) p *= t->dims[d];
  return p;
}

int64_t cl_last_dim(const Type *t) { return t->rank ? t->dims[t->rank - 1] : 1; }

uint32_t cl_clamp_grid(int64_t blocks, int64_t max) {
  if (blocks < 1) return 1;
  return (uint32_t)(blocks > max ? max : blocks);
}

/* Grid-stride elementwise launch over n items. */
void cl_launch_ew(RtStep *st, int64_t n) {
  st->block[0] = 256;
  st->grid[0] = cl_clamp_grid((n + 255) / 256, 65536);
}

/* One block per row of D elements. */
uint32_t cl_row_threads(int64_t D) {
  if (D <= 32) return 32;
  if (D <= 64) return 64;
  if (D <= 256) return 128;
  if (D <= 4096) return 256;
  return 512;
}
void cl_launch_rows(RtStep *st, int64_t rows, int64_t D) {
  st->block[0] = cl_row_threads(D);
  st->grid[0] = cl_clamp_grid(rows, 1 << 20);
}

/* Storage letters of the step's buffers listed in idx[] (-1 ends). */
static void letters(const RtStep *st, const int *idx, char *out) {
  int n = 0;
  for (; idx[n] >= 0; n++) out[n] = st_letter(st->bufs[idx[n]].storage);
  out[n] = 0;
}

/* "loom_sbf16, loom_sf32, ..." of the same buffers. */
static void structs(const RtStep *st, const int *idx, char *out, size_t cap) {
  size_t n = 0;
  out[0] = 0;
  for (int k = 0; idx[k] >= 0; k++)
    n += (size_t)snprintf(out + n, cap - n, "%s%s", k ? ", " : "", st_struct(st->bufs[idx[k]].storage));
}

/* Instantiates template `tmpl` on the storage of bufs idx[] (+ extra template arguments) as
   kernel "loom_<base>_<letters><suffix>", sets st->which.  A step with tensor maps
   (st->tmaps > 0, set before) gets the wrapper that takes them. */
int cl_instantiate(Lower *L, RtStep *st, const char *base, const char *tmpl, const int *idx, const char *extra,
                       const char *suffix, int max_threads) {
  char lt[RT_MAX_BUFS + 1], ss[512], name[96], call[700];
  letters(st, idx, lt);
  structs(st, idx, ss, sizeof ss);
  snprintf(name, sizeof name, "loom_%s_%s%s", base, lt, suffix);
  snprintf(call, sizeof call, "%s<%s%s%s>", tmpl, ss, extra && *extra ? ", " : "", extra ? extra : "");
  if (strlen(name) >= KNAME) return cl_fail(L, "internal error: kernel name %s too long", name);
  st->which = builtin_symbol(L, name, max_threads, call, st->tmaps > 0);
  return st->which < 0 ? IR_EINPUT : 0;
}

/* Raw data movement, by element size. */
int cl_instantiate_raw(Lower *L, RtStep *st, const char *base, const char *tmpl, int size) {
  char name[64], call[128];
  snprintf(name, sizeof name, "loom_%s_%d", base, size);
  snprintf(call, sizeof call, "%s<loom_sraw%d>", tmpl, size);
  st->which = cl_builtin_symbol(L, name, 1024, call);
  return st->which < 0 ? IR_EINPUT : 0;
}

bool cl_all_float(const RtStep *st) {
  for (int i = 0; i < st->n_in + st->n_out; i++)
    if (st->bufs[i].storage == RT_ST_I32) return false;
  return true;
}

int cl_lower_call(Lower *L, Steps *s) {
  const Op *op = L->op;
  const Func *k = op->callee;
  int fi = -1;
  for (int i = 0; i < L->m->funcs.n; i++)
    if (L->m->funcs.items[i] == k) fi = i;
  if (fi < 0 || !k->is_kernel) return cl_fail(L, "calls @%s, which is not a kernel func of this module", k->name);
  if (cl_weight_copy_call(L)) return 0;   /* the cast of a parameter with a bf16 copy: no step (lower_fuse.c) */
  if (cl_fused_kernel(L, fi)) return IR_EINPUT;
  const CudaKernelInfo *info = &L->fused_info[fi];
  bool split = info->split > 1;
  RtStep *st = cl_new_step(L, s, RT_STEP_KERNEL, L->fused_symbol[fi], "");
  if (!st || cl_set_operand_bufs(L, st)) return IR_EINPUT;
  if (split) snprintf(st->label + strlen(st->label), sizeof st->label - strlen(st->label), " (parts)");
  st->i[0] = info->N;
  st->i[1] = info->out_n;
  st->i[2] = info->count;
  memcpy(st->block, info->block, sizeof st->block);
  st->grid[0] = cl_clamp_grid((info->work + info->per_block - 1) / info->per_block, 65536);
  /* In place only element for element: an N-element result over an N-element argument at
     the same offset (each point reads its arguments before it stores). */
  int64_t N = info->N;
  for (int o = st->n_in; o < st->n_in + st->n_out; o++) {
    const Value *ret = k->rets.items[o - st->n_in];
    /* a reduction of size-1 dims (count 1) writes output o at point o: element for element too */
    bool elementwise = !(ret->kind == VAL_RESULT && op_info(ret->def->kind)->cls == CLASS_REDUCTION) || info->count == 1;
    for (int i = 0; i < st->n_in + st->n_out; i++) {
      if (i == o || !cl_overlap(&st->bufs[i], &st->bufs[o])) continue;
      bool exact = i < st->n_in && elementwise && st->bufs[i].offset == st->bufs[o].offset && st->bufs[i].n == N &&
                   st->bufs[o].n == N && cl_st_size(st->bufs[i].storage) == cl_st_size(st->bufs[o].storage);
      if (!exact)
        return cl_fail(L, "result %d shares memory with %s %d; a kernel may only write an N-element result (not a "
                     "reduction) over an N-element argument of the same element size at the same offset",
                     o - st->n_in, i < st->n_in ? "argument" : "result", i < st->n_in ? i : i - st->n_in);
    }
  }
  if (!split) return 0;
  /* a split reduction: the parts go to scratch; the finish kernel combines them */
  if (cl_add_scratch(L, st, 0, (info->scratch_bytes + 3) / 4)) return IR_EINPUT;
  RtBuf parts = st->bufs[st->n_in + st->n_out - 1];
  RtBuf reds[RT_MAX_BUFS];
  int n_red = 0;
  for (int r = 0; r < k->rets.n; r++) {
    const Value *ret = k->rets.items[r];
    if (ret->kind == VAL_RESULT && op_info(ret->def->kind)->cls == CLASS_REDUCTION) reds[n_red++] = st->bufs[st->n_in + r];
  }
  st = cl_new_step(L, s, RT_STEP_KERNEL, L->fused_fin[fi], "");
  if (!st) return IR_EINPUT;
  snprintf(st->label + strlen(st->label), sizeof st->label - strlen(st->label), " (sum of parts)");
  st->n_in = 1;
  st->bufs[0] = parts;
  st->n_out = n_red;
  memcpy(st->bufs + 1, reds, sizeof(RtBuf) * (size_t)n_red);
  st->i[0] = info->out_n;
  st->i[1] = info->split;
  st->block[0] = info->fin_block;
  st->grid[0] = cl_clamp_grid((info->fin_work + info->fin_block - 1) / info->fin_block, 65536);
  return 0;
}


/* Uses of v as an operand of f's ops or as a result of f. */
int cl_uses(const Func *f, const Value *v) {
  int n = 0;
  for (int i = 0; i < f->ops.n; i++) {
    const Op *op = f->ops.items[i];
    for (int k = 0; k < op->n_operands; k++) n += op->operands[k] == v;
  }
  for (int r = 0; r < f->rets.n; r++) n += f->rets.items[r] == v;
  return n;
}

/* seq_axis (rope and the attention blocks: the sequence split over a mesh axis) as program.h
   has it: the axis + 1, 0 when the sequence is whole. */
int cl_seq_axis1(Lower *L, int64_t *axis1) {
  const Attr *a = op_attr(L->op, "seq_axis");
  int axis = a && a->s && a->s[0] ? mesh_axis_parse(a->s) : -1;
  if (axis < 0 && a && a->s && a->s[0]) return cl_fail(L, "seq_axis '%s' is not a mesh axis", a->s);
  *axis1 = axis + 1;
  return 0;
}
