/* tests/fuzz/payload_layout.h — which parts of a compiled executable's payload hold lowered
 * programs, by the rules the runner reads them with (tools/runner/runner.c; tools/cmd_compile.c
 * writes them): part 0 the settings, then
 *   cpu        program, LLVM IR                      (3 parts)
 *   cpu mesh   program, LLVM IR, IR (empty), "mesh"  (5)
 *   cuda       program, image, "cuda"                (4)
 *   cuda mesh  program, image, IR (empty), "cuda-mesh" (5)
 *   ref        IR                                    (2)
 * and a cpu or cpu mesh executable adds its decode program, its LLVM IR and "sample" (6 or 8).
 * Shared by the fuzz harness (fuzz_payload.c) and the unit test that keeps the checked-in
 * seeds readable (tests/unit/test_cpu_exec.c), so both follow one reading. */
#ifndef LOOM_TESTS_FUZZ_PAYLOAD_LAYOUT_H
#define LOOM_TESTS_FUZZ_PAYLOAD_LAYOUT_H

#include <stdbool.h>
#include <string.h>

#include "driver/driver.h"

typedef struct {
  const char *kind;   /* "cpu", "cpu mesh", "cuda", "cuda mesh", "ref", or NULL: no layout the runner reads */
  int program;        /* the lowered program's part, or -1 (ref) */
  int decode;         /* the decode program's part (a cpu executable that samples), or -1 */
  bool cpu;           /* the programs run on the cpu backend (cpu_program_init) */
} PayloadLayout;

static inline bool payload_part_is(const Payload *p, int i, const char *tag) {
  size_t n = strlen(tag);
  return i >= 0 && i < p->n_parts && p->sizes[i] == n && !memcmp(p->parts[i], tag, n);
}

static inline PayloadLayout payload_layout(const Payload *p) {
  PayloadLayout l = {NULL, -1, -1, false};
  int n = p->n_parts;
  bool cuda_mesh = n == 5 && payload_part_is(p, 4, "cuda-mesh");
  if (n >= 4 && payload_part_is(p, n - 1, "sample")) {
    l.decode = n - 3;
    n -= 3;
  }
  if (n == 3 || (n == 5 && !cuda_mesh)) l.kind = n == 3 ? "cpu" : "cpu mesh", l.program = 1, l.cpu = true;
  else if (n == 4 || cuda_mesh) l.kind = cuda_mesh ? "cuda mesh" : "cuda", l.program = 1, l.decode = -1;
  else if (n == 2 && l.decode < 0) l.kind = "ref";
  if (!l.cpu) l.decode = -1;
  return l;
}

#endif
