/* runtime/cpu/jit.h — loads the kernels of a lowered program: LLVM IR text -> native code.
 *
 * The text is what codegen/cpu writes (cpu_emit_llvm / cpu_lower): portable LLVM IR.
 * jit_load optimizes it with LLVM's O2 pipeline for the host it runs on (so the loop
 * vectorizer uses the host's vector width), compiles it to object code (kept in the on-disk
 * cache, runtime/io/diskcache.h: a second run of the same program skips LLVM), links it
 * with an ORC LLJIT, resolves libm
 * (tanhf, expf, ...) from the running process, and returns the kernels' addresses:
 *
 *     void kernel(char **args, int64_t begin, int64_t end)     (codegen/cpu/cpu.h)
 *
 * The code stays valid until jit_free.  Lives in the runtime so that a compiled training
 * executable, which links only the runtime, can load its kernels at start.
 */
#ifndef LOOM_RUNTIME_JIT_H
#define LOOM_RUNTIME_JIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/program.h"

typedef struct Jit Jit;
typedef void (*JitKernelFn)(char **args, int64_t begin, int64_t end);

/* Parses, optimizes (unless the text is already optimized: jit_optimize_ir) and compiles
   llvm_ir_text; fns_out[i] = address of symbols[i].  Returns 0, or 1 with a message. */
int jit_load(const char *llvm_ir_text, const char *const *symbols, int n, void **fns_out, Jit **out, char *err,
             size_t errlen);
void jit_free(Jit *jit);
/* Whether jit_load found the object code in the on-disk cache (runtime/io/diskcache.h). */
bool jit_from_cache(const Jit *jit);

/* The text after the O2 pipeline for this host (malloc'd): what jit_load compiles.  Shows
   whether loops were vectorized (look for `<8 x float>`).  Marks the module as optimized
   so that jit_load does not optimize it again. */
int jit_optimize_ir(const char *llvm_ir_text, char **optimized_text, char *err, size_t errlen);

/* Frees what an RtProgram owns (funcs and their steps, globals, kernel names) and zeroes
   it.  (Belongs with RtProgram in runtime/program.h; declared here until it moves.) */
/* rt_program_free (defined in jit.c) is declared in runtime/program.h. */

#endif
