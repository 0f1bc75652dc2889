/* runtime/cuda/cuda_api.h — the NVIDIA driver and cuBLASLt, loaded at run time.
 *
 * loom never links libcuda or libcublasLt: the same binary builds, starts and runs its CPU
 * paths on machines with neither.  The first call that needs a library dlopens it, resolves
 * every function this runtime uses into a table (dlsym, by the exact symbol the installed
 * header's macros name, e.g. cuMemAlloc -> cuMemAlloc_v2) and keeps it for the process.
 * A missing library, a missing symbol or a failing cuInit is remembered as a message that
 * every later call returns ("no NVIDIA driver found (libcuda.so.1: cannot open shared object
 * file): use --backend cpu").  The headers (cuda.h, cublasLt.h) give types and prototypes
 * only; without them (LOOM_HAVE_CUDA_HEADERS unset) everything here reports that the build
 * has no CUDA support.
 *
 * Libraries, in the order tried (an environment variable names a file to use instead):
 *   driver     LOOM_LIBCUDA, else libcuda.so.1
 *   cuBLASLt   LOOM_LIBCUBLASLT, else libcublasLt.so.13, libcublasLt.so.12, libcublasLt.so
 *              (the .12 first when the driver is older than CUDA 13)
 * NCCL is loaded by runtime/comm/comm_nccl.c through cuda_dlopen_first.
 *
 * Everything here is thread-safe.  Errors: functions returning int give 0 on success and 1
 * with a message in err.
 */
#ifndef LOOM_RUNTIME_CUDA_API_H
#define LOOM_RUNTIME_CUDA_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
  int index;
  char name[256];
  int major, minor;        /* compute capability */
  char arch[16];           /* "sm_90a", "sm_80" (cuda_arch_name) */
  size_t total_mem;        /* bytes */
  size_t free_mem;         /* bytes free when queried (0 if it could not be asked) */
  int sm_count;
  int max_smem_optin;      /* dynamic shared memory a kernel may opt into, bytes */
  int driver_version;      /* CUDA version the driver supports, 1000*major + 10*minor */
} CudaDeviceInfo;

/* 1 when the driver loads, cuInit succeeds and there is at least one device; else 0 and a
   sentence in why (may be NULL) saying what is missing. */
int cuda_available(char *why, size_t n);
int cuda_device_count(int *count, char *err, size_t errlen);
int cuda_device_query(int device, CudaDeviceInfo *info, char *err, size_t errlen);
/* The NVRTC/ptxas architecture name for a compute capability: "sm_80", "sm_86", and the
   architecture-specific "sm_90a", "sm_100a", "sm_120a" for major >= 9 (the form that allows
   wgmma/TMA; a cubin for it runs only on that exact architecture). */
void cuda_arch_name(int major, int minor, char *out, size_t n);
/* cuBLASLt's version (e.g. 130000), or 0 with a message when it cannot be loaded.  Needs
   no device. */
size_t cuda_cublaslt_version(char *err, size_t errlen);

/* Makes `device` current on the calling thread through its primary context (retained once
   per call; release with cuda_device_release).  ctx receives the CUcontext. */
int cuda_device_retain(int device, void **ctx, char *err, size_t errlen);
void cuda_device_release(int device);
/* After a sticky error (a kernel fault) the primary context is unusable for everyone in the
   process, and libraries built on the CUDA runtime (cuBLASLt, NCCL) keep it retained, so
   releasing it does not make a fresh one: this resets the device's primary context (frees
   everything in it, in this process only) and returns 1 when the driver did. The caller
   decides that a fault spoiled it. cuda_device_retain also resets once when the retain
   itself reports a sticky error. CUDA documents such errors as needing a new process; on
   an H200 (driver 580) a reset was needed, and what it gives is what tests/gpu checks. */
int cuda_device_recover(int device);
int cuda_set_current(void *ctx, char *err, size_t errlen);

/* dlopen of the first loadable of names[] (or of getenv(env_var) when set): RTLD_NOW |
   RTLD_LOCAL.  On failure returns NULL and writes what was tried and dlerror() into why. */
void *cuda_dlopen_first(const char *env_var, const char *const *names, int n_names, char *why, size_t n);

/* Tests only: forgets the loaded tables (and what failed), so that the next call loads
   again, e.g. after changing LOOM_LIBCUDA.  Libraries stay mapped.  Nothing may be in use. */
void cuda_api_unload(void);

/* ------------------------------------------------------------------ internal tables */
/* For runtime/cuda_*.c and comm_nccl.c only (they define LOOM_CUDA_INTERNAL). */
#if defined(LOOM_CUDA_INTERNAL) && defined(LOOM_HAVE_CUDA_HEADERS)
#include <cuda.h>
#include <cublasLt.h>

#define LOOM_CU_FUNCS(X)                                                                                        \
  X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName) X(cuDeviceGetAttribute) \
  X(cuDeviceTotalMem) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuDevicePrimaryCtxReset) X(cuCtxSetCurrent)             \
  X(cuCtxGetCurrent) X(cuCtxGetDevice) X(cuCtxSynchronize) X(cuModuleLoadDataEx) X(cuModuleGetFunction) X(cuModuleUnload)         \
  X(cuFuncSetAttribute) X(cuFuncGetAttribute) X(cuMemAlloc) X(cuMemFree) X(cuMemGetInfo) X(cuMemcpyHtoDAsync)   \
  X(cuMemcpyDtoHAsync) X(cuMemcpyDtoDAsync) X(cuMemsetD8Async) X(cuStreamCreate) X(cuStreamDestroy)           \
  X(cuStreamSynchronize) X(cuStreamQuery) X(cuLaunchKernel) X(cuGetErrorString) X(cuGetErrorName)           \
  X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuStreamWaitEvent) X(cuEventElapsedTime)            \
  X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuGraphInstantiate) X(cuGraphLaunch) X(cuGraphDestroy)     \
  X(cuGraphExecDestroy) X(cuEventSynchronize) X(cuMemAllocHost) X(cuMemFreeHost)

#define LOOM_LT_FUNCS(X)                                                                                  \
  X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtGetVersion) X(cublasLtGetStatusString)                   \
  X(cublasLtGetStatusName) X(cublasLtMatmul) X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy)     \
  X(cublasLtMatmulDescSetAttribute) X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy)         \
  X(cublasLtMatrixLayoutSetAttribute) X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceDestroy) \
  X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatmulAlgoGetHeuristic)

/* A field per function, typed by the header's prototype (the field's name goes through the
   same macros as the call, so `d->cuMemAlloc(...)` calls cuMemAlloc_v2). */
#define LOOM_API_FIELD(f) __typeof__(&f) f;
typedef struct {
  LOOM_CU_FUNCS(LOOM_API_FIELD)
  int driver_version;
  /* optional (NULL when the driver lacks it): the tensor maps of sm_90's TMA (CUDA 12.0+),
     which only the programs that copy by them need (runtime/cuda/cuda_tmap.c) */
  __typeof__(&cuTensorMapEncodeTiled) cuTensorMapEncodeTiled;
} CudaDriverApi;
typedef struct {
  LOOM_LT_FUNCS(LOOM_API_FIELD)
} CublasLtApi;

/* The loaded tables (cuInit done), or NULL with the remembered message. */
const CudaDriverApi *cuda_driver(char *err, size_t errlen);
const CublasLtApi *cuda_cublaslt(char *err, size_t errlen);

/* Message for a failed driver call: "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (out of memory)
   <where>"; returns 1 (0 when r is CUDA_SUCCESS, writing nothing). */
int cuda_cu_fail(CUresult r, const char *call, const char *where, char *err, size_t errlen);
int cuda_lt_fail(cublasStatus_t s, const char *call, const char *where, char *err, size_t errlen);
/* A CUresult's name without asking the driver (for stub libraries that cannot say). */
const char *cuda_result_name(int r);
#endif

#endif
