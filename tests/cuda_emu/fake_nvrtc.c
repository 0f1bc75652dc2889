/* tests/cuda_emu/fake_nvrtc.c — a test double of NVRTC for the emulated device.
 *
 * `loom` loads it through LOOM_LIBNVRTC.  "Compiling" a program runs g++ on the source with
 * emu.h in front and emu_tail.h behind (the device code becomes host code, see emu.h) and
 * hands back the shared object as the "cubin": an ELF file whose symbol table names the
 * kernels, so loom's checks and its on-disk cache treat it like a cubin.  The fake driver
 * (fake_cuda.c) loads it.  nvrtcVersion says 99.N, so cache entries never mix with real ones,
 * N a checksum of emu.h, emu_tail.h, emu_sm90.h and emu_tmap.h (which are not in the source
 * loom hashes), so an entry compiled by an older emulator is not loaded after they change.
 *
 * Environment: LOOM_EMU_CXX (default g++), LOOM_EMU_DIR (the directory of emu.h; default
 * the source tree's tests/cuda_emu, set at build time), LOOM_EMU_KEEP=1 keeps the temporary
 * directory and prints its path.
 */
#define _GNU_SOURCE
#include <nvrtc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef LOOM_EMU_DIR
#define LOOM_EMU_DIR "tests/cuda_emu"
#endif

typedef struct {
  char *src;
  char *log;
  unsigned char *image;
  size_t n;
} Prog;

const char *nvrtcGetErrorString(nvrtcResult r) {
  switch (r) {
  case NVRTC_SUCCESS: return "NVRTC_SUCCESS";
  case NVRTC_ERROR_OUT_OF_MEMORY: return "NVRTC_ERROR_OUT_OF_MEMORY";
  case NVRTC_ERROR_INVALID_INPUT: return "NVRTC_ERROR_INVALID_INPUT";
  case NVRTC_ERROR_INVALID_PROGRAM: return "NVRTC_ERROR_INVALID_PROGRAM";
  case NVRTC_ERROR_INVALID_OPTION: return "NVRTC_ERROR_INVALID_OPTION";
  case NVRTC_ERROR_COMPILATION: return "NVRTC_ERROR_COMPILATION";
  default: return "NVRTC_ERROR (emulated)";
  }
}

static int emu_checksum(void) {
  const char *emu = getenv("LOOM_EMU_DIR");
  if (!emu || !*emu) emu = LOOM_EMU_DIR;
  uint32_t h = 2166136261u;
  const char *files[] = {"emu.h", "emu_tail.h", "emu_sm90.h", "emu_tmap.h"};
  for (int i = 0; i < 4; i++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", emu, files[i]);
    FILE *f = fopen(path, "rb");
    if (!f) continue;
    int c;
    while ((c = fgetc(f)) != EOF) h = (h ^ (uint32_t)c) * 16777619u;
    fclose(f);
  }
  return (int)(h % 1000000u);
}

nvrtcResult nvrtcVersion(int *major, int *minor) {
  if (!major || !minor) return NVRTC_ERROR_INVALID_INPUT;
  *major = 99;
  *minor = emu_checksum();
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcCreateProgram(nvrtcProgram *prog, const char *src, const char *name, int numHeaders,
                               const char *const *headers, const char *const *includeNames) {
  (void)name, (void)headers, (void)includeNames;
  if (!prog || !src || numHeaders != 0) return NVRTC_ERROR_INVALID_INPUT;
  Prog *p = calloc(1, sizeof *p);
  if (!p || !(p->src = strdup(src))) {
    free(p);
    return NVRTC_ERROR_OUT_OF_MEMORY;
  }
  *prog = (nvrtcProgram)p;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcDestroyProgram(nvrtcProgram *prog) {
  if (!prog || !*prog) return NVRTC_ERROR_INVALID_PROGRAM;
  Prog *p = (Prog *)*prog;
  free(p->src);
  free(p->log);
  free(p->image);
  free(p);
  *prog = NULL;
  return NVRTC_SUCCESS;
}

/* `extern __shared__ T NAME[];` (dynamic shared memory) becomes `T *NAME = (T *)
   loom_emu_dyn_smem();`: every launch's block gets its own bytes (see emu.h). */
static int write_source(FILE *f, const char *src) {
  static const char key[] = "extern __shared__ ";
  const char *p = src;
  for (const char *q; (q = strstr(p, key)); p = q) {
    fwrite(p, 1, (size_t)(q - p), f);
    const char *decl = q + sizeof key - 1, *end = strstr(decl, "[];");
    const char *nl = strchr(decl, '\n');
    if (!end || (nl && nl < end)) return 1;
    const char *name = end;
    while (name > decl && name[-1] != ' ' && name[-1] != '*') name--;
    fprintf(f, "%.*s*%.*s = (%.*s*)loom_emu_dyn_smem();", (int)(name - decl), decl, (int)(end - name), name,
            (int)(name - decl), decl);
    q = end + 3;
  }
  fputs(p, f);
  return 0;
}

static char *read_all(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = len >= 0 ? malloc((size_t)len + 1) : NULL;
  if (b && fread(b, 1, (size_t)len, f) != (size_t)len) {
    free(b);
    b = NULL;
  }
  fclose(f);
  if (b) {
    b[len] = 0;
    *n = (size_t)len;
  }
  return b;
}

nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int numOptions, const char *const *options) {
  Prog *p = (Prog *)prog;
  if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
  int arch = 0;
  for (int i = 0; i < numOptions; i++) {
    const char *o = options[i];
    if (!strncmp(o, "--gpu-architecture=sm_", 22)) arch = atoi(o + 22);
    else if (!strncmp(o, "--gpu-architecture=", 19)) return NVRTC_ERROR_INVALID_OPTION;   /* PTX: not emulated */
  }
  if (arch <= 0) return NVRTC_ERROR_INVALID_OPTION;
  const char *tmproot = getenv("TMPDIR");
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/loom-emu-XXXXXX", tmproot && *tmproot ? tmproot : "/tmp");
  if (!mkdtemp(dir)) return NVRTC_ERROR_OUT_OF_MEMORY;
  char src[1100], so[1100], log[1100], cmd[4096];
  snprintf(src, sizeof src, "%s/loom.cc", dir);
  snprintf(so, sizeof so, "%s/loom.so", dir);
  snprintf(log, sizeof log, "%s/log.txt", dir);
  const char *emu = getenv("LOOM_EMU_DIR");
  if (!emu || !*emu) emu = LOOM_EMU_DIR;
  FILE *f = fopen(src, "w");
  if (!f) return NVRTC_ERROR_OUT_OF_MEMORY;
  fprintf(f, "#define __CUDA_ARCH__ %d\n#include \"%s/emu.h\"\n#line 1 \"loom.cu\"\n", arch * 10, emu);
  int bad = write_source(f, p->src);
  fprintf(f, "\n#include \"%s/emu_tail.h\"\n", emu);
  fclose(f);
  nvrtcResult r = NVRTC_SUCCESS;
  if (bad) {
    p->log = strdup("loom.cu: an `extern __shared__` declaration the emulator cannot rewrite (expected `T NAME[];`)\n");
    r = NVRTC_ERROR_COMPILATION;
  } else {
    const char *cxx = getenv("LOOM_EMU_CXX");
    /* ASan's preload must not follow us into the compiler; `env -u` rather than unsetenv:
       loom compiles several programs at once, on threads (nvrtc_compile_programs) */
    snprintf(cmd, sizeof cmd,
             "env -u LD_PRELOAD '%s' -std=c++17 -O1 -g0 -fPIC -shared -ffp-contract=off -fno-strict-aliasing -w -o '%s' "
             "'%s' > '%s' 2>&1",
             cxx && *cxx ? cxx : "g++", so, src, log);
    int st = system(cmd);
    size_t n = 0;
    p->log = read_all(log, &n);
    if (st != 0) r = NVRTC_ERROR_COMPILATION;
    else if (!(p->image = (unsigned char *)read_all(so, &p->n))) r = NVRTC_ERROR_OUT_OF_MEMORY;
  }
  if (!p->log) p->log = strdup("");
  const char *keep = getenv("LOOM_EMU_KEEP");
  if (keep && *keep == '1') {
    fprintf(stderr, "loom-emu: kept %s\n", dir);
  } else {
    unlink(src), unlink(so), unlink(log);
    rmdir(dir);
  }
  return r;
}

nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t *n) {
  Prog *p = (Prog *)prog;
  if (!p || !n) return NVRTC_ERROR_INVALID_INPUT;
  *n = p->log ? strlen(p->log) + 1 : 1;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char *out) {
  Prog *p = (Prog *)prog;
  if (!p || !out) return NVRTC_ERROR_INVALID_INPUT;
  strcpy(out, p->log ? p->log : "");
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetCUBINSize(nvrtcProgram prog, size_t *n) {
  Prog *p = (Prog *)prog;
  if (!p || !n || !p->image) return NVRTC_ERROR_INVALID_PROGRAM;
  *n = p->n;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetCUBIN(nvrtcProgram prog, char *out) {
  Prog *p = (Prog *)prog;
  if (!p || !out || !p->image) return NVRTC_ERROR_INVALID_PROGRAM;
  memcpy(out, p->image, p->n);
  return NVRTC_SUCCESS;
}

/* PTX is not emulated: only sm_XY targets compile. */
nvrtcResult nvrtcGetPTXSize(nvrtcProgram prog, size_t *n) {
  (void)prog, (void)n;
  return NVRTC_ERROR_INVALID_PROGRAM;
}
nvrtcResult nvrtcGetPTX(nvrtcProgram prog, char *out) {
  (void)prog, (void)out;
  return NVRTC_ERROR_INVALID_PROGRAM;
}
