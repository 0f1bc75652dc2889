/* runtime/cpu/jit.c — LLVM IR text -> O2 for this host -> object code (cached on disk,
 * runtime/io/diskcache.h) -> ORC LLJIT -> kernel addresses.
 *
 * The object code is what LLJIT would have compiled from the module (the same target
 * machine: the host's CPU and features, the JIT code model, codegen level Default), emitted
 * by us so that it can be kept: a second run of the same program (a restart, a resumed run,
 * a test suite running one model many times) loads it instead of running LLVM again.  The
 * key is the IR text and everything else the code depends on (cache_key). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llvm/Config/llvm-config.h>
#include <llvm-c/Core.h>
#include <llvm-c/Error.h>
#include <llvm-c/IRReader.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include "runtime/cpu/jit.h"
#include "runtime/io/diskcache.h"

#define OPTIMIZED_MARK "loom.optimized"

struct Jit {
  LLVMOrcLLJITRef lljit;
  bool from_cache;
};

bool jit_from_cache(const Jit *jit) { return jit && jit->from_cache; }

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int init_failed;
static void init_llvm(void) {
  if (LLVMInitializeNativeTarget() || LLVMInitializeNativeAsmPrinter()) init_failed = 1;
}

/* Takes the message out of an LLVMErrorRef (consumes it). */
static int llvm_fail(LLVMErrorRef e, const char *what, char *err, size_t errlen) {
  char *msg = LLVMGetErrorMessage(e);
  snprintf(err, errlen, "%s: %s", what, msg ? msg : "unknown LLVM error");
  LLVMDisposeErrorMessage(msg);
  return 1;
}

static int parse(LLVMContextRef ctx, const char *text, LLVMModuleRef *mod, char *err, size_t errlen) {
  LLVMMemoryBufferRef buf = LLVMCreateMemoryBufferWithMemoryRangeCopy(text, strlen(text), "loom-kernels");
  char *msg = NULL;
  if (LLVMParseIRInContext(ctx, buf, mod, &msg)) {   /* takes the buffer */
    snprintf(err, errlen, "kernel LLVM IR does not parse: %s", msg ? msg : "?");
    if (msg) LLVMDisposeMessage(msg);
    return 1;
  }
  return 0;
}

/* A target machine for this host: its CPU and features, so vectors are as wide as it has. */
static int host_machine(LLVMTargetMachineRef *tm, char *err, size_t errlen) {
  char *triple = LLVMGetDefaultTargetTriple(), *msg = NULL;
  LLVMTargetRef target;
  if (LLVMGetTargetFromTriple(triple, &target, &msg)) {
    snprintf(err, errlen, "no LLVM target for %s: %s", triple, msg ? msg : "?");
    if (msg) LLVMDisposeMessage(msg);
    LLVMDisposeMessage(triple);
    return 1;
  }
  char *cpu = LLVMGetHostCPUName(), *features = LLVMGetHostCPUFeatures();
  *tm = LLVMCreateTargetMachine(target, triple, cpu, features, LLVMCodeGenLevelDefault, LLVMRelocDefault,
                                LLVMCodeModelJITDefault);
  LLVMDisposeMessage(cpu);
  LLVMDisposeMessage(features);
  LLVMDisposeMessage(triple);
  if (!*tm) {
    snprintf(err, errlen, "cannot create an LLVM target machine for this host");
    return 1;
  }
  return 0;
}

/* O2 for the host: sets the module's triple and data layout, runs default<O2>. */
static int optimize(LLVMModuleRef mod, char *err, size_t errlen) {
  LLVMTargetMachineRef tm;
  if (host_machine(&tm, err, errlen)) return 1;
  char *triple = LLVMGetTargetMachineTriple(tm);
  LLVMSetTarget(mod, triple);
  LLVMDisposeMessage(triple);
  LLVMTargetDataRef td = LLVMCreateTargetDataLayout(tm);
  char *dl = LLVMCopyStringRepOfTargetData(td);
  LLVMSetDataLayout(mod, dl);
  LLVMDisposeMessage(dl);
  LLVMDisposeTargetData(td);
  /* LLVM keeps vectors at 256 bits on AVX-512 CPUs unless a function asks for more: the
     kernels ask for 512 where the host has AVX-512F (GELU and its gradient ~25% faster on a
     Xeon; the same bits, as no kernel reassociates).  LOOM_CPU_VECTOR_BITS=256 keeps LLVM's
     choice; any other value is passed on as the preferred width. */
  const char *pw = getenv("LOOM_CPU_VECTOR_BITS");
  if (!pw || !*pw) {
    char *feat = LLVMGetTargetMachineFeatureString(tm);
    pw = feat && strstr(feat, "+avx512f") ? "512" : NULL;
    LLVMDisposeMessage(feat);
  }
  if (pw && *pw) {
    LLVMContextRef c = LLVMGetModuleContext(mod);
    for (LLVMValueRef f = LLVMGetFirstFunction(mod); f; f = LLVMGetNextFunction(f)) {
      if (LLVMIsDeclaration(f)) continue;
      LLVMAttributeRef a = LLVMCreateStringAttribute(c, "prefer-vector-width", 19, pw, (unsigned)strlen(pw));
      LLVMAddAttributeAtIndex(f, LLVMAttributeFunctionIndex, a);
    }
  }
  LLVMPassBuilderOptionsRef opts = LLVMCreatePassBuilderOptions();
  LLVMPassBuilderOptionsSetLoopVectorization(opts, 1);
  LLVMPassBuilderOptionsSetSLPVectorization(opts, 1);
  LLVMPassBuilderOptionsSetLoopInterleaving(opts, 1);
  /* No loop unrolling: on top of the vectorizer's interleaving it made the optimized module
     4x larger (gpt2-tiny: 1.9 MB of IR against 0.5 MB) and the JIT 2-3x slower (1.2 s of
     CPU against 0.5 s), with no measurable change in the kernels' time (bench-gpt2-small:
     kernels 71 / 85 ms a step unrolled, 67 / 87 not, two runs each; GEMMs and builtins are
     95% of the step) and the same bits (no kernel reassociates). */
  LLVMPassBuilderOptionsSetLoopUnrolling(opts, 0);
  LLVMErrorRef e = LLVMRunPasses(mod, "default<O2>", tm, opts);
  LLVMDisposePassBuilderOptions(opts);
  LLVMDisposeTargetMachine(tm);
  if (e) return llvm_fail(e, "optimizing kernels", err, errlen);
  LLVMContextRef ctx = LLVMGetModuleContext(mod);
  LLVMAddNamedMetadataOperand(mod, OPTIMIZED_MARK, LLVMMDNodeInContext(ctx, NULL, 0));
  return 0;
}

static bool is_optimized(LLVMModuleRef mod) { return LLVMGetNamedMetadataNumOperands(mod, OPTIMIZED_MARK) > 0; }

int jit_optimize_ir(const char *llvm_ir_text, char **optimized_text, char *err, size_t errlen) {
  *optimized_text = NULL;
  pthread_once(&init_once, init_llvm);
  if (init_failed) {
    snprintf(err, errlen, "LLVM has no native target in this build");
    return 1;
  }
  LLVMContextRef ctx = LLVMContextCreate();
  LLVMModuleRef mod = NULL;
  int rc = parse(ctx, llvm_ir_text, &mod, err, errlen);
  if (!rc && !is_optimized(mod)) rc = optimize(mod, err, errlen);
  if (!rc) {
    char *s = LLVMPrintModuleToString(mod);
    *optimized_text = strdup(s);
    LLVMDisposeMessage(s);
    if (!*optimized_text) {
      snprintf(err, errlen, "out of memory");
      rc = 1;
    }
  }
  if (mod) LLVMDisposeModule(mod);
  LLVMContextDispose(ctx);
  return rc;
}

/* ------------------------------------------------------------------ object code, cached */

#define CACHE_MAGIC "LOOMOBJ1"
/* Bump when optimize() or the target machine's options change: the key must name everything
   the object code depends on besides the inputs hashed below. */
#define CACHE_RECIPE "loom-jit-cache 1|O2 loop-vec slp-vec interleave no-unroll|codegen default|JIT code model"

static void cache_key(LLVMTargetMachineRef tm, const char *text, unsigned char key[32]) {
  char *triple = LLVMGetTargetMachineTriple(tm), *cpu = LLVMGetTargetMachineCPU(tm),
       *feat = LLVMGetTargetMachineFeatureString(tm);
  const char *pw = getenv("LOOM_CPU_VECTOR_BITS");
  Sha256 s;
  sha_init(&s);
  const char *parts[] = {CACHE_RECIPE, "LLVM " LLVM_VERSION_STRING, triple ? triple : "", cpu ? cpu : "",
                         feat ? feat : "", pw ? pw : ""};
  for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) sha_update(&s, parts[i], strlen(parts[i]) + 1);
  sha_update(&s, text, strlen(text));
  sha_final(&s, key);
  LLVMDisposeMessage(triple);
  LLVMDisposeMessage(cpu);
  LLVMDisposeMessage(feat);
}

/* Parses, optimizes (unless already optimized) and emits the object file for this host. */
static int compile_object(LLVMTargetMachineRef tm, const char *text, LLVMMemoryBufferRef *obj, char *err,
                          size_t errlen) {
  LLVMContextRef ctx = LLVMContextCreate();
  LLVMModuleRef mod = NULL;
  int rc = parse(ctx, text, &mod, err, errlen);
  if (!rc && !is_optimized(mod)) rc = optimize(mod, err, errlen);
  if (!rc) {
    char *msg = NULL;
    if (LLVMTargetMachineEmitToMemoryBuffer(tm, mod, LLVMObjectFile, &msg, obj)) {
      snprintf(err, errlen, "compiling the kernels to object code: %s", msg ? msg : "?");
      rc = 1;
    }
    if (msg) LLVMDisposeMessage(msg);
  }
  if (mod) LLVMDisposeModule(mod);
  LLVMContextDispose(ctx);
  return rc;
}

/* The object code of text: from the cache, or compiled (and then cached).  Processes that
   need one program at once compile it once (the entry's lock). */
static int object_code(const char *text, LLVMMemoryBufferRef *obj, bool *hit, char *err, size_t errlen) {
  *obj = NULL;
  *hit = false;
  LLVMTargetMachineRef tm;
  if (host_machine(&tm, err, errlen)) return 1;
  unsigned char key[32];
  cache_key(tm, text, key);
  char dir[1024], path[1200];
  dc_dir(dir, sizeof dir);
  bool use_cache = dir[0] && !dc_path(dir, key, ".o", path, sizeof path);
  unsigned char *payload = NULL;
  size_t n = 0;
  int lock = -1, rc = 0;
  if (use_cache && dc_read(path, CACHE_MAGIC, key, &payload, &n, NULL)) {
    lock = dc_lock(dir, key);   /* a miss: wait for whoever compiles it, then look again */
    if (lock >= 0) dc_read(path, CACHE_MAGIC, key, &payload, &n, NULL);
  }
  if (payload) {
    *obj = LLVMCreateMemoryBufferWithMemoryRangeCopy((const char *)payload, n, "loom-kernels.o");
    *hit = true;
    free(payload);
  } else {
    rc = compile_object(tm, text, obj, err, errlen);
    if (!rc && use_cache)
      dc_write(dir, path, CACHE_MAGIC, key, (const unsigned char *)LLVMGetBufferStart(*obj), LLVMGetBufferSize(*obj),
               0);
  }
  dc_unlock(lock);
  LLVMDisposeTargetMachine(tm);
  return rc;
}

int jit_load(const char *llvm_ir_text, const char *const *symbols, int n, void **fns_out, Jit **out, char *err,
             size_t errlen) {
  *out = NULL;
  pthread_once(&init_once, init_llvm);
  if (init_failed) {
    snprintf(err, errlen, "LLVM has no native target in this build");
    return 1;
  }
  Jit *jit = calloc(1, sizeof *jit);
  if (!jit) {
    snprintf(err, errlen, "out of memory");
    return 1;
  }
  LLVMErrorRef e;
  LLVMOrcLLJITBuilderRef builder = LLVMOrcCreateLLJITBuilder();   /* host CPU and features */
  if ((e = LLVMOrcCreateLLJIT(&jit->lljit, builder))) {
    free(jit);
    return llvm_fail(e, "creating the kernel JIT", err, errlen);
  }
  /* libm and the rest of the process resolve through this generator */
  LLVMOrcDefinitionGeneratorRef gen;
  if ((e = LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(&gen, LLVMOrcLLJITGetGlobalPrefix(jit->lljit), NULL,
                                                                NULL))) {
    jit_free(jit);
    return llvm_fail(e, "creating the process symbol generator", err, errlen);
  }
  LLVMOrcJITDylibAddGenerator(LLVMOrcLLJITGetMainJITDylib(jit->lljit), gen);

  LLVMMemoryBufferRef obj = NULL;
  int rc = object_code(llvm_ir_text, &obj, &jit->from_cache, err, errlen);
  /* the JIT owns the buffer from here, even on error */
  if (!rc && (e = LLVMOrcLLJITAddObjectFile(jit->lljit, LLVMOrcLLJITGetMainJITDylib(jit->lljit), obj)))
    rc = llvm_fail(e, "adding the kernels to the JIT", err, errlen);
  for (int i = 0; i < n && !rc; i++) {
    LLVMOrcExecutorAddress addr = 0;
    if ((e = LLVMOrcLLJITLookup(jit->lljit, &addr, symbols[i]))) {
      char what[128];
      snprintf(what, sizeof what, "kernel '%s' is not in the compiled code", symbols[i]);
      rc = llvm_fail(e, what, err, errlen);
    } else {
      fns_out[i] = (void *)(uintptr_t)addr;
    }
  }
  if (rc) {
    jit_free(jit);
    return rc;
  }
  *out = jit;
  return 0;
}

void jit_free(Jit *jit) {
  if (!jit) return;
  if (jit->lljit) {
    LLVMErrorRef e = LLVMOrcDisposeLLJIT(jit->lljit);
    if (e) LLVMConsumeError(e);
  }
  free(jit);
}
