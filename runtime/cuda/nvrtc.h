/* runtime/cuda/nvrtc.h — CUDA C++ source -> cubin (or PTX) with NVRTC, loaded at run time, and
 * an on-disk cache of the results.
 *
 * NVRTC is never linked: the first call dlopens it (LOOM_LIBNVRTC if set, else
 * libnvrtc.so.13, libnvrtc.so, then the same names under $CUDA_HOME/lib64 and
 * /usr/local/cuda/lib64) and resolves the functions it uses.  When it cannot be loaded every
 * call fails with a sentence saying so ("NVRTC not available: ..."); nvrtc_available() asks
 * without failing.
 *
 * The cache: one file per (source, arch, options, NVRTC version), named by the SHA-256 of
 * those, in $LOOM_CACHE_DIR, else $XDG_CACHE_HOME/loom, else $HOME/.cache/loom (created
 * when missing).  LOOM_CACHE_DIR=off (or an empty value) disables it.  Files are written to a
 * temporary name and renamed into place (atomic: concurrent compilers of the same program
 * never see half a file).  Each file carries a header with the payload's size and SHA-256;
 * an entry that does not check out (truncated, corrupted, foreign) is ignored, recompiled
 * and replaced.  A cache that cannot be written is not an error (the result is still
 * returned).
 *
 * Thread-safe.  Errors: 0 on success, 1 with a message in err.
 */
#ifndef LOOM_RUNTIME_NVRTC_H
#define LOOM_RUNTIME_NVRTC_H

#include <stdbool.h>
#include <stddef.h>

/* 1 when NVRTC loads (its version in major and minor when they are not NULL), else 0 and a sentence in
   why (may be NULL). */
int nvrtc_available(int *major, int *minor, char *why, size_t n);

/* Compiles `source` (one CUDA C++ translation unit, named "loom.cu" in messages) for `arch`:
   a real architecture ("sm_80", "sm_90a") gives a cubin (*is_cubin = true), a virtual one
   ("compute_80") PTX text with its terminating NUL (*is_cubin = false).  opts are extra
   NVRTC options (e.g. "-lineinfo"); --gpu-architecture is added from arch.
   *image (malloc'd, *n bytes) is the result; *log (malloc'd, may be "", may be NULL if not
   wanted) NVRTC's log: warnings on success, the errors with "loom.cu(LINE): error: ..." when
   compilation fails (then the function returns 1 and err holds the first error line).
   *cache_hit (may be NULL) says whether the result came from the cache. */
int nvrtc_compile_cached(const char *source, const char *arch, const char *const *opts, int n_opts,
                         unsigned char **image, size_t *n, bool *is_cubin, char **log, bool *cache_hit, char *err,
                         size_t errlen);

/* The same without the cache_hit report (the interface codegen/cuda and the runtime use). */
int nvrtc_compile(const char *source, const char *arch, const char *const *opts, int n_opts,
                  unsigned char **cubin_or_ptx, size_t *n, bool *is_cubin, char **log, char *err, size_t errlen);

/* Several programs compiled in parallel (issue 32: a cold compile on all cores).  A
   translation unit marked by codegen/cuda (NVRTC_UNIT_MARK "heavy" or "light" before each
   kernel) becomes several NVRTC programs, each the prelude (everything before the first
   marker, from NVRTC_PRELUDE_MARK on) and: one heavy kernel (the tensor-core attention and grouped matmuls: their
   cubins are cached by their own text, so another model or run with the same kernel finds
   them), or all the light ones, compiled with --Ofast-compile=min (memory-bound kernels;
   NVRTC 12.8 and later).  They compile on LOOM_NVRTC_THREADS threads (default: the cores
   online), each through nvrtc_compile_cached.  One program gives its cubin as it is;
   several give a bundle (below), which nvrtc_image_has_kernel and the runtime's loader
   (cuda_exec.c: a module per part) read.  *cache_hit: every program was a hit;
   *programs (may be NULL): how many.  An unmarked source, a virtual architecture (PTX) or
   LOOM_NVRTC_SPLIT=0 compile as one program (nvrtc_compile_cached).
   LOOM_NVRTC_OFAST=0 compiles the light kernels fully too (=mid or =max: cheaper still). */
#define NVRTC_UNIT_MARK "\n/*@loom-unit "   /* then "heavy" or "light", the kernel, the comment's end */
/* Where the prelude begins (what comes before it, e.g. a comment naming the module, goes
   only into the light program, so a heavy kernel's program is the same text in every
   module); without it the prelude begins at the start. */
#define NVRTC_PRELUDE_MARK "/*@loom-prelude*/\n"
#define NVRTC_MAX_PROGRAMS 16
int nvrtc_compile_programs(const char *source, const char *arch, const char *const *opts, int n_opts,
                           unsigned char **image, size_t *n, bool *is_cubin, char **log, bool *cache_hit, int *programs,
                           char *err, size_t errlen);

/* A bundle of cubins: "LOOMCUB1", u32 count, u32 0, u64 size per part, then the parts,
   each at a 16-byte aligned offset (little endian).  nvrtc_bundle_parts gives the parts
   (pointers into image) of a bundle, or the image itself as one part when it is not a
   bundle; the count, or -1 when a bundle is damaged.  At most max are written. */
#define NVRTC_BUNDLE_MAGIC "LOOMCUB1"
int nvrtc_bundle_parts(const unsigned char *image, size_t n, const unsigned char **parts, size_t *sizes, int max);

/* The cache directory that would be used (without creating it), or "" when caching is off. */
void nvrtc_cache_dir(char *out, size_t n);
/* The file of the cache entry for these inputs (NVRTC must load: its version is part of the
   key); 0 on success. */
int nvrtc_cache_path(const char *source, const char *arch, const char *const *opts, int n_opts, char *out, size_t n,
                     char *err, size_t errlen);

/* Does a compiled image define the kernel `name` (an extern "C" __global__ function)?
   cubin: a global function symbol of the ELF; PTX: an ".entry name" directive. */
bool nvrtc_image_has_kernel(const unsigned char *image, size_t n, bool is_cubin, const char *name);

/* SHA-256 of a byte string, as 64 hex digits and a NUL (used for the cache key; exposed for
   tests). */
void nvrtc_sha256_hex(const void *data, size_t n, char out[65]);

#endif
