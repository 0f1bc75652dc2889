/* runtime/cuda/nvrtc.c — NVRTC through dlopen, and the on-disk cache of compiled kernels
 * (see nvrtc.h). */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "runtime/cuda/nvrtc.h"
#include "runtime/io/diskcache.h"

void nvrtc_sha256_hex(const void *data, size_t n, char out[65]) {
  Sha256 s;
  unsigned char d[32];
  sha_init(&s);
  sha_update(&s, data, n);
  sha_final(&s, d);
  dc_hex(d, 32, out);
}

/* ------------------------------------------------------------------ loading NVRTC */

typedef int nvrtcResult_;   /* nvrtcResult: 0 = NVRTC_SUCCESS */
typedef struct nvrtcProgram_ *nvrtcProgram_;

typedef struct {
  void *lib;
  const char *(*GetErrorString)(nvrtcResult_);
  nvrtcResult_ (*Version)(int *, int *);
  nvrtcResult_ (*CreateProgram)(nvrtcProgram_ *, const char *, const char *, int, const char *const *,
                                const char *const *);
  nvrtcResult_ (*DestroyProgram)(nvrtcProgram_ *);
  nvrtcResult_ (*CompileProgram)(nvrtcProgram_, int, const char *const *);
  nvrtcResult_ (*GetProgramLogSize)(nvrtcProgram_, size_t *);
  nvrtcResult_ (*GetProgramLog)(nvrtcProgram_, char *);
  nvrtcResult_ (*GetPTXSize)(nvrtcProgram_, size_t *);
  nvrtcResult_ (*GetPTX)(nvrtcProgram_, char *);
  nvrtcResult_ (*GetCUBINSize)(nvrtcProgram_, size_t *);
  nvrtcResult_ (*GetCUBIN)(nvrtcProgram_, char *);
  int major, minor;
} NvrtcApi;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static NvrtcApi api;
static char load_error[2200];

static void *try_open(const char *path, char *tried, size_t n) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    size_t k = strlen(tried);
    if (k < n) snprintf(tried + k, n - k, "%s%s", k ? "; " : "", e ? e : path);
  }
  return h;
}

static void load_nvrtc(void) {
  char tried[2048] = "";   /* load_error holds it whole */
  void *h = NULL;
  const char *env = getenv("LOOM_LIBNVRTC");
  if (env && *env) {
    h = try_open(env, tried, sizeof tried);
  } else {
    static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so"};
    for (size_t i = 0; !h && i < sizeof names / sizeof names[0]; i++) h = try_open(names[i], tried, sizeof tried);
    const char *homes[2] = {getenv("CUDA_HOME"), "/usr/local/cuda"};
    for (int d = 0; !h && d < 2; d++) {
      if (!homes[d] || !*homes[d]) continue;
      for (size_t i = 0; !h && i < sizeof names / sizeof names[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/lib64/%s", homes[d], names[i]);
        h = try_open(path, tried, sizeof tried);
      }
    }
  }
  if (!h) {
    snprintf(load_error, sizeof load_error, "NVRTC not available (%s)", tried);
    return;
  }
  api.lib = h;
#define SYM(field, name)                                                                     \
  do {                                                                                       \
    *(void **)(&api.field) = dlsym(h, name);                                                 \
    if (!api.field) {                                                                        \
      snprintf(load_error, sizeof load_error, "NVRTC not available: the library has no %s", name); \
      return;                                                                                \
    }                                                                                        \
  } while (0)
  SYM(GetErrorString, "nvrtcGetErrorString");
  SYM(Version, "nvrtcVersion");
  SYM(CreateProgram, "nvrtcCreateProgram");
  SYM(DestroyProgram, "nvrtcDestroyProgram");
  SYM(CompileProgram, "nvrtcCompileProgram");
  SYM(GetProgramLogSize, "nvrtcGetProgramLogSize");
  SYM(GetProgramLog, "nvrtcGetProgramLog");
  SYM(GetPTXSize, "nvrtcGetPTXSize");
  SYM(GetPTX, "nvrtcGetPTX");
  SYM(GetCUBINSize, "nvrtcGetCUBINSize");
  SYM(GetCUBIN, "nvrtcGetCUBIN");
#undef SYM
  if (api.Version(&api.major, &api.minor) != 0) {
    snprintf(load_error, sizeof load_error, "NVRTC not available: nvrtcVersion failed");
    return;
  }
}

static const NvrtcApi *nvrtc_api(char *err, size_t errlen) {
  pthread_once(&load_once, load_nvrtc);
  if (load_error[0]) {
    if (err && errlen) snprintf(err, errlen, "%s", load_error);
    return NULL;
  }
  return &api;
}

int nvrtc_available(int *major, int *minor, char *why, size_t n) {
  const NvrtcApi *a = nvrtc_api(why, n);
  if (!a) return 0;
  if (major) *major = a->major;
  if (minor) *minor = a->minor;
  return 1;
}

/* ------------------------------------------------------------------ the cache */

/* Entries of runtime/io/diskcache.h; flags bit 0: the payload is a cubin (else PTX). */
#define CACHE_MAGIC "LOOMNVR1"

void nvrtc_cache_dir(char *out, size_t n) { dc_dir(out, n); }

static void cache_key(const char *source, const char *arch, const char *const *opts, int n_opts, int major, int minor,
                      unsigned char key[32]) {
  Sha256 s;
  sha_init(&s);
  char head[128];
  int k = snprintf(head, sizeof head, "loom-nvrtc-cache 1|nvrtc %d.%d|%s|%d", major, minor, arch, n_opts);
  sha_update(&s, head, (size_t)k + 1);
  for (int i = 0; i < n_opts; i++) sha_update(&s, opts[i], strlen(opts[i]) + 1);
  sha_update(&s, source, strlen(source));
  sha_final(&s, key);
}

int nvrtc_cache_path(const char *source, const char *arch, const char *const *opts, int n_opts, char *out, size_t n,
                     char *err, size_t errlen) {
  const NvrtcApi *a = nvrtc_api(err, errlen);
  if (!a) return 1;
  char dir[1024];
  dc_dir(dir, sizeof dir);
  if (!dir[0]) {
    snprintf(err, errlen, "the NVRTC cache is off (LOOM_CACHE_DIR=%s)", getenv("LOOM_CACHE_DIR") ? "off" : "");
    return 1;
  }
  unsigned char key[32];
  cache_key(source, arch, opts, n_opts, a->major, a->minor, key);
  if (dc_path(dir, key, ".bin", out, n)) {
    snprintf(err, errlen, "the cache path is too long");
    return 1;
  }
  return 0;
}

/* ------------------------------------------------------------------ compiling */

static void first_error_line(const char *log, char *out, size_t n) {
  const char *p = log ? strstr(log, "error") : NULL;
  if (!p) {
    snprintf(out, n, "%s", log && *log ? log : "(no log)");
  } else {
    while (p > log && p[-1] != '\n') p--;
    size_t len = strcspn(p, "\n");
    snprintf(out, n, "%.*s", (int)len, p);
  }
  out[strcspn(out, "\n")] = 0;
}

static int compile_now(const NvrtcApi *a, const char *source, const char *arch, const char *const *opts, int n_opts,
                       unsigned char **image, size_t *n, bool *is_cubin, char **log, char *err, size_t errlen) {
  bool cubin = strncmp(arch, "compute_", 8) != 0;
  nvrtcProgram_ prog = NULL;
  nvrtcResult_ r = a->CreateProgram(&prog, source, "loom.cu", 0, NULL, NULL);
  if (r != 0) {
    snprintf(err, errlen, "nvrtcCreateProgram: %s", a->GetErrorString(r));
    return 1;
  }
  const char **all = calloc((size_t)n_opts + 1, sizeof *all);
  char archopt[64];
  snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", arch);
  if (!all) {
    a->DestroyProgram(&prog);
    snprintf(err, errlen, "out of memory");
    return 1;
  }
  all[0] = archopt;
  for (int i = 0; i < n_opts; i++) all[i + 1] = opts[i];
  r = a->CompileProgram(prog, n_opts + 1, all);
  free(all);
  size_t log_n = 0;
  char *text = NULL;
  if (a->GetProgramLogSize(prog, &log_n) == 0 && log_n) {
    text = malloc(log_n + 1);
    if (text && a->GetProgramLog(prog, text) == 0) text[log_n] = 0;
    else if (text) text[0] = 0;
  }
  if (!text) text = calloc(1, 1);
  int rc = 0;
  if (r != 0) {
    char line[512];
    first_error_line(text, line, sizeof line);
    snprintf(err, errlen, "NVRTC could not compile loom.cu for %s (%s): %s", arch, a->GetErrorString(r), line);
    rc = 1;
  } else {
    size_t sz = 0;
    r = cubin ? a->GetCUBINSize(prog, &sz) : a->GetPTXSize(prog, &sz);
    unsigned char *img = r == 0 && sz ? malloc(sz + 1) : NULL;
    if (!img) {
      snprintf(err, errlen, "%s: %s", cubin ? "nvrtcGetCUBINSize" : "nvrtcGetPTXSize",
               r ? a->GetErrorString(r) : "out of memory or empty result");
      rc = 1;
    } else {
      r = cubin ? a->GetCUBIN(prog, (char *)img) : a->GetPTX(prog, (char *)img);
      if (r != 0) {
        snprintf(err, errlen, "%s: %s", cubin ? "nvrtcGetCUBIN" : "nvrtcGetPTX", a->GetErrorString(r));
        free(img);
        rc = 1;
      } else {
        img[sz] = 0;
        *image = img;
        *n = sz;
        *is_cubin = cubin;
      }
    }
  }
  a->DestroyProgram(&prog);
  if (log) *log = text;
  else free(text);
  return rc;
}

int nvrtc_compile_cached(const char *source, const char *arch, const char *const *opts, int n_opts,
                         unsigned char **image, size_t *n, bool *is_cubin, char **log, bool *cache_hit, char *err,
                         size_t errlen) {
  *image = NULL;
  *n = 0;
  *is_cubin = false;
  if (log) *log = NULL;
  if (cache_hit) *cache_hit = false;
  const NvrtcApi *a = nvrtc_api(err, errlen);
  if (!a) return 1;
  if (!source || !arch || !*arch || strlen(arch) > 32) {
    snprintf(err, errlen, "nvrtc_compile: no source or a bad architecture name");
    return 1;
  }
  char dir[1024], path[1200];
  dc_dir(dir, sizeof dir);
  unsigned char key[32];
  cache_key(source, arch, opts, n_opts, a->major, a->minor, key);
  bool use_cache = dir[0] && !dc_path(dir, key, ".bin", path, sizeof path);
  unsigned flags = 0;
  int lock = -1;
  bool hit = use_cache && !dc_read(path, CACHE_MAGIC, key, image, n, &flags);
  if (use_cache && !hit) {
    /* a miss: the entry's lock, so that the ranks of a mesh on this machine compile it once
       (the first compiles, the others find it when the lock is theirs) */
    lock = dc_lock(dir, key);
    hit = lock >= 0 && !dc_read(path, CACHE_MAGIC, key, image, n, &flags);
  }
  if (hit) {
    dc_unlock(lock);
    *is_cubin = flags & 1;
    if (log) *log = calloc(1, 1);
    if (cache_hit) *cache_hit = true;
    return 0;
  }
  int rc = compile_now(a, source, arch, opts, n_opts, image, n, is_cubin, log, err, errlen);
  if (!rc && use_cache) dc_write(dir, path, CACHE_MAGIC, key, *image, *n, *is_cubin ? 1u : 0u);
  dc_unlock(lock);
  return rc;
}

int nvrtc_compile(const char *source, const char *arch, const char *const *opts, int n_opts,
                  unsigned char **cubin_or_ptx, size_t *n, bool *is_cubin, char **log, char *err, size_t errlen) {
  return nvrtc_compile_cached(source, arch, opts, n_opts, cubin_or_ptx, n, is_cubin, log, NULL, err, errlen);
}

/* ------------------------------------------------------------------ bundles */

static uint64_t rd(const unsigned char *p, int bytes);

static void put_u64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

int nvrtc_bundle_parts(const unsigned char *image, size_t n, const unsigned char **parts, size_t *sizes, int max) {
  if (!image || n < 16 || memcmp(image, NVRTC_BUNDLE_MAGIC, 8)) {
    if (max > 0) {
      parts[0] = image;
      sizes[0] = n;
    }
    return 1;
  }
  uint32_t count = (uint32_t)rd(image + 8, 4);
  if (count == 0 || count > NVRTC_MAX_PROGRAMS || (uint64_t)count * 8 > n - 16) return -1;
  size_t at = 16 + (size_t)count * 8;
  for (uint32_t i = 0; i < count; i++) {
    uint64_t len = rd(image + 16 + 8 * i, 8);
    at = (at + 15) & ~(size_t)15;
    if (at > n || len == 0 || len > n - at) return -1;
    if ((int)i < max) {
      parts[i] = image + at;
      sizes[i] = (size_t)len;
    }
    at += (size_t)len;
  }
  return (int)count;
}

/* The parts, each 16-byte aligned inside the bundle (a cubin is loaded in place). */
static unsigned char *bundle_make(unsigned char *const *parts, const size_t *sizes, int count, size_t *n) {
  size_t total = 16 + (size_t)count * 8;
  for (int i = 0; i < count; i++) total = ((total + 15) & ~(size_t)15) + sizes[i];
  unsigned char *b = calloc(1, total + 1);
  if (!b) return NULL;
  memcpy(b, NVRTC_BUNDLE_MAGIC, 8);
  put_u32(b + 8, (uint32_t)count);
  size_t at = 16 + (size_t)count * 8;
  for (int i = 0; i < count; i++) {
    put_u64(b + 16 + 8 * i, sizes[i]);
    at = (at + 15) & ~(size_t)15;
    memcpy(b + at, parts[i], sizes[i]);
    at += sizes[i];
  }
  *n = total;
  return b;
}

/* ------------------------------------------------------------------ programs in parallel */

typedef struct {
  char *source;            /* the prelude and this program's units */
  bool light;              /* memory-bound kernels: the cheap optimization level */
  unsigned char *image;
  size_t n;
  bool is_cubin, hit;
  char *log;
  int rc, kernels, thread;
  double cpu;               /* CPU seconds its compile took (LOOM_NVRTC_REPORT) */
  char err[1024];
} Unit;

typedef struct {
  Unit *units;
  int n_units;
  const char *arch;
  const char *const *opts;  /* the caller's, then --Ofast-compile for light units */
  int n_opts;
  const char *fast;         /* "--Ofast-compile=min" or NULL */
  int next;                 /* the next unit to take (atomic) */
} Pool;

static double thread_cpu(void) {
  struct timespec ts;
  return clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) ? 0.0 : (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
  Pool *pool;
  int index;
} Worker;

static void *pool_worker(void *arg) {
  Pool *p = ((Worker *)arg)->pool;
  int me = ((Worker *)arg)->index;
  for (;;) {
    int u = __atomic_fetch_add(&p->next, 1, __ATOMIC_RELAXED);
    if (u >= p->n_units) break;
    Unit *x = &p->units[u];
    const char *all[40];
    int k = 0;
    for (int i = 0; i < p->n_opts && k < 39; i++) all[k++] = p->opts[i];
    if (x->light && p->fast) all[k++] = p->fast;
    double t0 = thread_cpu();
    x->thread = me;
    x->rc = nvrtc_compile_cached(x->source, p->arch, all, k, &x->image, &x->n, &x->is_cubin, &x->log, &x->hit, x->err,
                                 sizeof x->err);
    x->cpu = thread_cpu() - t0;
  }
  return NULL;
}

static int env_int(const char *name, int dflt) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  char *end;
  long x = strtol(v, &end, 10);
  return *end || x < 0 || x > 1024 ? dflt : (int)x;
}

/* Splits a marked translation unit into programs: the prelude (everything before the first
   marker) in front of each; a heavy unit alone (its cubin cached by its own text: the same
   attention kernel of another model or run is a hit), the light units together.  The
   light program comes first and the heavy ones last to first (the backward's kernels, met
   last, take longest), so the longest ones start first on the threads. */
static int split_units(const char *source, Unit **out, int *n_out) {
  static const char mark[] = NVRTC_UNIT_MARK;
  const char *first = strstr(source, mark), *start = strstr(source, NVRTC_PRELUDE_MARK);
  if (!start || start > first) start = source;
  size_t head = (size_t)(start - source), pre = (size_t)(first - start);
  int heavy = 0;
  for (const char *m = first; m; m = strstr(m + 1, mark))
    if (!strncmp(m + sizeof mark - 1, "heavy", 5)) heavy++;
  Unit *u = calloc((size_t)heavy + 1, sizeof *u);
  char **texts = calloc((size_t)heavy + 1, sizeof *texts);
  size_t *lens = calloc((size_t)heavy + 1, sizeof *lens), cap_light = head + pre + strlen(first) + 1;
  int rc = !u || !texts || !lens;
  if (!rc && !(texts[0] = malloc(cap_light))) rc = 1;
  if (!rc) {   /* the light program: the head too */
    memcpy(texts[0], source, head + pre);
    lens[0] = head + pre;
  }
  int h = 0;
  for (const char *m = first; !rc && m;) {
    const char *next = strstr(m + 1, mark), *end = next ? next : m + strlen(m);
    size_t len = (size_t)(end - m);
    if (!strncmp(m + sizeof mark - 1, "heavy", 5) && h < heavy) {
      h++;
      if (!(texts[h] = malloc(pre + len + 1))) {
        rc = 1;
        break;
      }
      memcpy(texts[h], start, pre);
      memcpy(texts[h] + pre, m, len);
      lens[h] = pre + len;
    } else {
      memcpy(texts[0] + lens[0], m, len);
      lens[0] += len;
      u[0].kernels++;
    }
    m = next;
  }
  int n = 0;
  if (!rc) {
    texts[0][lens[0]] = 0;
    if (lens[0] > head + pre) {   /* the light program, if there are light kernels */
      u[n].source = texts[0];
      u[n++].light = true;
      texts[0] = NULL;
    }
    for (int i = heavy; i >= 1; i--) {
      texts[i][lens[i]] = 0;
      u[n].kernels = 1;
      u[n++].source = texts[i];
      texts[i] = NULL;
    }
  }
  for (int i = 0; i <= heavy && texts; i++) free(texts[i]);
  free(texts);
  free(lens);
  if (rc) {
    free(u);
    return 1;
  }
  *out = u;
  *n_out = n;
  return 0;
}

int nvrtc_compile_programs(const char *source, const char *arch, const char *const *opts, int n_opts,
                           unsigned char **image, size_t *n, bool *is_cubin, char **log, bool *cache_hit, int *programs,
                           char *err, size_t errlen) {
  if (programs) *programs = 1;
  bool marked = source && strstr(source, NVRTC_UNIT_MARK);
  bool cubin = arch && strncmp(arch, "compute_", 8) != 0;
  if (!marked || !cubin || env_int("LOOM_NVRTC_SPLIT", 1) == 0 || n_opts > 30)
    return nvrtc_compile_cached(source, arch, opts, n_opts, image, n, is_cubin, log, cache_hit, err, errlen);
  *image = NULL;
  *n = 0;
  *is_cubin = false;
  if (log) *log = NULL;
  if (cache_hit) *cache_hit = false;
  const NvrtcApi *a = nvrtc_api(err, errlen);
  if (!a) return 1;
  Unit *u = NULL;
  int nu = 0;
  if (split_units(source, &u, &nu)) {
    snprintf(err, errlen, "out of memory");
    return 1;
  }
  if (nu > NVRTC_MAX_PROGRAMS) {   /* more heavy kernels than a bundle holds: one program */
    for (int i = 0; i < nu; i++) free(u[i].source);
    free(u);
    return nvrtc_compile_cached(source, arch, opts, n_opts, image, n, is_cubin, log, cache_hit, err, errlen);
  }
  /* --Ofast-compile came with NVRTC 12.8; LOOM_NVRTC_OFAST=0 compiles light kernels fully too */
  const char *fast_env = getenv("LOOM_NVRTC_OFAST");
  const char *fast = NULL;
  static char fast_opt[48];
  if (a->major * 100 + a->minor >= 1208 && !(fast_env && !strcmp(fast_env, "0"))) {
    const char *lvl = fast_env && *fast_env ? fast_env : "min";
    if (!strcmp(lvl, "min") || !strcmp(lvl, "mid") || !strcmp(lvl, "max")) {
      snprintf(fast_opt, sizeof fast_opt, "--Ofast-compile=%s", lvl);
      fast = fast_opt;
    }
  }
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int threads = env_int("LOOM_NVRTC_THREADS", cores > 0 ? (int)cores : 1);
  if (threads < 1) threads = 1;
  if (threads > nu) threads = nu;
  Pool pool = {.units = u, .n_units = nu, .arch = arch, .opts = opts, .n_opts = n_opts, .fast = fast};
  pthread_t tid[NVRTC_MAX_PROGRAMS];
  Worker w[NVRTC_MAX_PROGRAMS];
  int started = 0;
  for (int t = 0; t < threads; t++) w[t] = (Worker){&pool, t};
  for (int t = 1; t < threads; t++)
    if (!pthread_create(&tid[started], NULL, pool_worker, &w[t])) started++;
  pool_worker(&w[0]);   /* this thread works too */
  for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
  if (env_int("LOOM_NVRTC_REPORT", 0)) {   /* bench/nvrtc_compile.sh reads this */
    double busy[NVRTC_MAX_PROGRAMS] = {0}, total = 0, longest = 0;
    for (int i = 0; i < nu; i++) {
      fprintf(stderr, "nvrtc: program %d: %s, %d kernel%s, %.2f CPU s on thread %d%s\n", i, u[i].light ? "light" : "heavy",
              u[i].kernels, u[i].kernels == 1 ? "" : "s", u[i].cpu, u[i].thread, u[i].hit ? " (from the cache)" : "");
      busy[u[i].thread] += u[i].cpu;
      total += u[i].cpu;
    }
    for (int t = 0; t < threads; t++) longest = busy[t] > longest ? busy[t] : longest;
    fprintf(stderr, "nvrtc: %d programs on %d threads: %.2f CPU s in all, the busiest thread %.2f CPU s\n", nu, threads,
            total, longest);
  }
  int rc = 0;
  bool all_hit = true;
  size_t log_len = 0;
  for (int i = 0; i < nu; i++) {
    if (u[i].rc && !rc) {
      snprintf(err, errlen, "%s", u[i].err);
      rc = 1;
    }
    all_hit = all_hit && u[i].hit;
    log_len += u[i].log ? strlen(u[i].log) : 0;
  }
  if (log) {   /* the programs' logs, one after the other */
    char *text = malloc(log_len + 1);
    if (text) {
      size_t at = 0;
      for (int i = 0; i < nu; i++)
        if (u[i].log) {
          size_t k = strlen(u[i].log);
          memcpy(text + at, u[i].log, k);
          at += k;
        }
      text[at] = 0;
    }
    *log = text;
  }
  if (!rc) {
    unsigned char *parts[NVRTC_MAX_PROGRAMS];
    size_t sizes[NVRTC_MAX_PROGRAMS];
    for (int i = 0; i < nu; i++) {
      parts[i] = u[i].image;
      sizes[i] = u[i].n;
    }
    if (nu == 1) {
      *image = u[0].image;
      *n = u[0].n;
      u[0].image = NULL;
    } else if (!(*image = bundle_make(parts, sizes, nu, n))) {
      snprintf(err, errlen, "out of memory");
      rc = 1;
    }
    *is_cubin = !rc;
    if (cache_hit) *cache_hit = !rc && all_hit;
    if (programs) *programs = nu;
  }
  for (int i = 0; i < nu; i++) {
    free(u[i].source);
    free(u[i].image);
    free(u[i].log);
  }
  free(u);
  return rc;
}

/* ------------------------------------------------------------------ symbols */

static uint64_t rd(const unsigned char *p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static bool cubin_has(const unsigned char *img, size_t n, const char *name) {
  if (n < 64 || memcmp(img, "\x7f" "ELF", 4) || img[4] != 2 || img[5] != 1) return false;   /* ELF64, little endian */
  uint64_t shoff = rd(img + 0x28, 8), shentsize = rd(img + 0x3A, 2), shnum = rd(img + 0x3C, 2);
  if (shentsize < 64 || shoff > n || shnum > (n - shoff) / shentsize) return false;
  size_t name_len = strlen(name);
  for (uint64_t i = 0; i < shnum; i++) {
    const unsigned char *sh = img + shoff + i * shentsize;
    if (rd(sh + 4, 4) != 2) continue;   /* SHT_SYMTAB */
    uint64_t off = rd(sh + 0x18, 8), size = rd(sh + 0x20, 8), link = rd(sh + 0x28, 4), ent = rd(sh + 0x38, 8);
    if (ent < 24 || off > n || size > n - off || link >= shnum) continue;
    const unsigned char *st = img + shoff + link * shentsize;
    uint64_t soff = rd(st + 0x18, 8), ssize = rd(st + 0x20, 8);
    if (soff > n || ssize > n - soff) continue;
    for (uint64_t k = 0; k + ent <= size; k += ent) {
      const unsigned char *sym = img + off + k;
      uint64_t nm = rd(sym, 4);
      unsigned info = sym[4];
      if ((info & 15) != 2 || (info >> 4) != 1) continue;   /* STT_FUNC, STB_GLOBAL */
      if (nm + name_len >= ssize) continue;
      const char *s = (const char *)img + soff + nm;
      if (!memcmp(s, name, name_len) && s[name_len] == 0) return true;
    }
  }
  return false;
}

static bool ptx_has(const unsigned char *img, size_t n, const char *name) {
  size_t name_len = strlen(name);
  const char *s = (const char *)img, *end = s + n;
  for (const char *p = s; p + 7 + name_len < end; p++) {
    if (memcmp(p, ".entry ", 7)) continue;
    const char *q = p + 7;
    while (q < end && *q == ' ') q++;
    if ((size_t)(end - q) > name_len && !memcmp(q, name, name_len) &&
        (q[name_len] == '(' || q[name_len] == ' ' || q[name_len] == '\n' || q[name_len] == '\r'))
      return true;
  }
  return false;
}

bool nvrtc_image_has_kernel(const unsigned char *image, size_t n, bool is_cubin, const char *name) {
  if (!image || !name || !*name) return false;
  if (!is_cubin) return ptx_has(image, n, name);
  const unsigned char *parts[NVRTC_MAX_PROGRAMS];
  size_t sizes[NVRTC_MAX_PROGRAMS];
  int count = nvrtc_bundle_parts(image, n, parts, sizes, NVRTC_MAX_PROGRAMS);
  for (int i = 0; i < count; i++)
    if (cubin_has(parts[i], sizes[i], name)) return true;
  return false;
}
