/* tests/fuzz/fuzz_payload.c — what a compiled executable reads from its own file: the
 * payload and trailer (payload_parse, which payload_read_self runs over /proc/self/exe), the
 * settings JSON, the lowered programs (rt_program_load) of a cpu, cpu mesh, cuda or cuda mesh
 * payload (the training program, and a cpu executable's decode program; payload_layout.h), and the
 * checks both runtimes run before anything executes: cuda_program_check (what
 * cuda_program_init runs before it touches a device) and cpu_program_init's (buffers inside
 * their regions, builtin sizes, GEMM extents).  The input is the tail of an executable: payload then trailer
 * (offset 0).  Invariant: a refusal has a message; nothing reads outside the input.
 * Programs whose regions exceed 4 MiB are checked by rt_program_load only (the harness
 * would spend its time zeroing memory). */
#include "runtime/cpu/cpu_exec.h"
#include "runtime/cuda/cuda_exec.h"
#include "runtime/program.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/payload_layout.h"
#include "tools/tools.h"

#include <jansson.h>

static void dummy_kernel(char **args, int64_t b, int64_t e) { abort(); }   /* never run */

/* A lowered program's checks: rt_program_load, cuda_program_check, and on the cpu backend
   cpu_program_init's (small programs only). */
static void check_program(const uint8_t *bytes, size_t n, bool cpu) {
  char err[IR_ERR_LEN] = "";
  RtProgram prog;
  if (rt_program_load(bytes, n, &prog, err, sizeof err)) {
    fuzz_check_message("rt_program_load", err);
    return;
  }
  err[0] = 0;
  if (cuda_program_check(&prog, err, sizeof err)) fuzz_check_message("cuda_program_check", err);
  if (!cpu) {
    rt_program_free(&prog);
    return;
  }
  int64_t total = 0;
  bool small = true;
  for (int r = 0; r < RT_REGION_COUNT && small; r++) {   /* each <= 4 MiB before adding: no overflow */
    if (prog.region_bytes[r] > (4 << 20)) small = false;
    else total += prog.region_bytes[r] > 0 ? prog.region_bytes[r] : 0;
  }
  for (int f = 0; f < prog.n_funcs && small; f++)
    if (prog.funcs[f].arena_bytes > (4 << 20) || (total += prog.funcs[f].arena_bytes > 0 ? prog.funcs[f].arena_bytes : 0) > (4 << 20))
      small = false;
  if (small && prog.n_kernels >= 0 && prog.n_kernels < 100000) {
    void **fns = calloc((size_t)prog.n_kernels + 1, sizeof(void *));
    CpuKernelFn k = dummy_kernel;
    for (int i = 0; i < prog.n_kernels; i++) memcpy(&fns[i], &k, sizeof k);
    CpuProgram cp;
    err[0] = 0;
    if (cpu_program_init(&cp, &prog, fns, 1, err, sizeof err)) fuzz_check_message("cpu_program_init", err);
    else cpu_program_free(&cp);
    free(fns);
  }
  rt_program_free(&prog);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[IR_ERR_LEN] = "";
  Payload p;
  memset(&p, 0, sizeof p);
  if (payload_parse(&p, data, size, err, sizeof err)) {
    fuzz_check_message("payload_parse", err);
    return 0;
  }
  for (int i = 0; i < p.n_parts; i++)
    if (p.parts[i] < data || p.parts[i] + p.sizes[i] > data + size) fuzz_fail("part %d lies outside the input", i);
  if (p.n_parts >= 1) {
    json_t *s = json_loadb((const char *)p.parts[0], p.sizes[0], 0, NULL);
    json_decref(s);
  }
  /* the parts as the runner reads them (payload_layout.h: 2 to 8 parts) */
  PayloadLayout l = payload_layout(&p);
  if (l.program > 0) check_program(p.parts[l.program], p.sizes[l.program], l.cpu);
  if (l.decode > 0) check_program(p.parts[l.decode], p.sizes[l.decode], l.cpu);
  return 0;
}
