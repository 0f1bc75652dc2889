/* runtime/cuda/cuda_api.c — see cuda_api.h. */
#define LOOM_CUDA_INTERNAL 1
#include "runtime/cuda/cuda_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LOOM_STR2(x) #x
#define LOOM_STR(x) LOOM_STR2(x)

void cuda_arch_name(int major, int minor, char *out, size_t n) {
  /* Architecture-specific targets ("a") exist from Hopper on; they are what a cubin built
     for this exact device should use. */
  snprintf(out, n, "sm_%d%d%s", major, minor, major >= 9 ? "a" : "");
}

void *cuda_dlopen_first(const char *env_var, const char *const *names, int n_names, char *why, size_t n) {
  const char *forced = env_var ? getenv(env_var) : NULL;
  char tried[1024] = "";
  size_t used = 0;
  if (forced && *forced) {
    names = &forced;
    n_names = 1;
  }
  for (int i = 0; i < n_names; i++) {
    void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h) return h;
    const char *e = dlerror();
    int w = snprintf(tried + used, sizeof tried - used, "%s%s", used ? "; " : "", e ? e : names[i]);
    if (w > 0) used = used + (size_t)w < sizeof tried ? used + (size_t)w : sizeof tried - 1;
  }
  if (why) snprintf(why, n, "%s%s%s", tried, forced && *forced ? ", set by " : "", forced && *forced ? env_var : "");
  return NULL;
}

#ifdef LOOM_HAVE_CUDA_HEADERS

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

typedef struct {
  bool tried, ok;
  void *handle;
  char msg[1024];
} LibState;

static LibState drv_state, lt_state;
static CudaDriverApi drv;
static CublasLtApi lt;

const char *cuda_result_name(int r) {
  switch ((CUresult)r) {
#define N(x) \
  case x: return #x;
    N(CUDA_SUCCESS) N(CUDA_ERROR_INVALID_VALUE) N(CUDA_ERROR_OUT_OF_MEMORY) N(CUDA_ERROR_NOT_INITIALIZED)
    N(CUDA_ERROR_DEINITIALIZED) N(CUDA_ERROR_NO_DEVICE) N(CUDA_ERROR_INVALID_DEVICE) N(CUDA_ERROR_STUB_LIBRARY)
    N(CUDA_ERROR_DEVICE_UNAVAILABLE) N(CUDA_ERROR_INVALID_IMAGE) N(CUDA_ERROR_INVALID_CONTEXT)
    N(CUDA_ERROR_NO_BINARY_FOR_GPU) N(CUDA_ERROR_INVALID_PTX) N(CUDA_ERROR_UNSUPPORTED_PTX_VERSION)
    N(CUDA_ERROR_NOT_FOUND) N(CUDA_ERROR_NOT_READY) N(CUDA_ERROR_ILLEGAL_ADDRESS)
    N(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES) N(CUDA_ERROR_LAUNCH_TIMEOUT) N(CUDA_ERROR_LAUNCH_FAILED)
    N(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH) N(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE)
    N(CUDA_ERROR_INVALID_HANDLE) N(CUDA_ERROR_ILLEGAL_INSTRUCTION) N(CUDA_ERROR_MISALIGNED_ADDRESS)
    N(CUDA_ERROR_SYSTEM_NOT_READY) N(CUDA_ERROR_UNKNOWN)
#undef N
  default: return NULL;
  }
}

int cuda_cu_fail(CUresult r, const char *call, const char *where, char *err, size_t errlen) {
  if (r == CUDA_SUCCESS) return 0;
  const char *name = NULL, *str = NULL;
  /* The driver names its errors; a stub library or a broken driver may not. */
  if (drv.cuGetErrorName && drv.cuGetErrorName(r, &name) != CUDA_SUCCESS) name = NULL;
  if (drv.cuGetErrorString && drv.cuGetErrorString(r, &str) != CUDA_SUCCESS) str = NULL;
  if (!name) name = cuda_result_name(r);
  char num[32];
  if (!name) {
    snprintf(num, sizeof num, "CUDA error %d", (int)r);
    name = num;
  }
  snprintf(err, errlen, "%s: %s%s%s%s%s%s", call, name, str ? " (" : "", str ? str : "", str ? ")" : "",
           where && *where ? " " : "", where ? where : "");
  return 1;
}

int cuda_lt_fail(cublasStatus_t s, const char *call, const char *where, char *err, size_t errlen) {
  if (s == CUBLAS_STATUS_SUCCESS) return 0;
  const char *name = lt.cublasLtGetStatusName ? lt.cublasLtGetStatusName(s) : NULL;
  const char *str = lt.cublasLtGetStatusString ? lt.cublasLtGetStatusString(s) : NULL;
  snprintf(err, errlen, "%s: %s%s%s%s%s%s (status %d)", call, name ? name : "cuBLAS error", str ? " (" : "",
           str ? str : "", str ? ")" : "", where && *where ? " " : "", where ? where : "", (int)s);
  return 1;
}

/* dlsym every name into the table; on a missing one, a message naming it. */
static bool resolve(void *h, void **slots, const char *const *names, int n, const char *lib, char *msg, size_t len) {
  for (int i = 0; i < n; i++) {
    dlerror();
    void *f = dlsym(h, names[i]);
    if (!f) {
      snprintf(msg, len, "%s lacks %s (too old?)", lib, names[i]);
      return false;
    }
    slots[i] = f;
  }
  return true;
}

#define LOOM_API_NAME(f) LOOM_STR(f),
#define LOOM_API_COUNT(f) +1

static void load_driver_locked(void) {
  if (drv_state.tried) return;
  drv_state.tried = true;
  static const char *const libs[] = {"libcuda.so.1"};
  char why[800];
  drv_state.handle = cuda_dlopen_first("LOOM_LIBCUDA", libs, 1, why, sizeof why);
  if (!drv_state.handle) {
    snprintf(drv_state.msg, sizeof drv_state.msg, "no NVIDIA driver found (%s): use --backend cpu", why);
    return;
  }
  static const char *const names[] = {LOOM_CU_FUNCS(LOOM_API_NAME)};
  enum { N_CU = 0 LOOM_CU_FUNCS(LOOM_API_COUNT) };
  void *slots[N_CU];
  if (!resolve(drv_state.handle, slots, names, N_CU, "the NVIDIA driver (libcuda.so.1)", drv_state.msg,
               sizeof drv_state.msg)) {
    dlclose(drv_state.handle);
    drv_state.handle = NULL;
    return;
  }
  /* The table is the functions in LOOM_CU_FUNCS order, each a pointer. */
  memcpy(&drv, slots, sizeof slots);
  _Static_assert(sizeof slots == offsetof(CudaDriverApi, driver_version), "driver table layout");
  CUresult r = drv.cuInit(0);
  if (r != CUDA_SUCCESS) {
    char m[600];
    cuda_cu_fail(r, "cuInit", "", m, sizeof m);
    const char *hint = r == CUDA_ERROR_STUB_LIBRARY ? "the libcuda loaded is the CUDA toolkit's stub, not a driver"
                       : r == CUDA_ERROR_NO_DEVICE  ? "no CUDA device is visible (CUDA_VISIBLE_DEVICES?)"
                                                    : "the NVIDIA driver cannot start";
    snprintf(drv_state.msg, sizeof drv_state.msg, "%s (%s): use --backend cpu", hint, m);
    memset(&drv, 0, sizeof drv);
    dlclose(drv_state.handle);
    drv_state.handle = NULL;
    return;
  }
  int v = 0;
  if (drv.cuDriverGetVersion(&v) == CUDA_SUCCESS) drv.driver_version = v;
  dlerror();
  drv.cuTensorMapEncodeTiled = (__typeof__(drv.cuTensorMapEncodeTiled))dlsym(drv_state.handle, "cuTensorMapEncodeTiled");
  drv_state.ok = true;
}

const CudaDriverApi *cuda_driver(char *err, size_t errlen) {
  pthread_mutex_lock(&mu);
  load_driver_locked();
  bool ok = drv_state.ok;
  if (!ok && err) snprintf(err, errlen, "%s", drv_state.msg);
  pthread_mutex_unlock(&mu);
  return ok ? &drv : NULL;
}

static void load_lt_locked(void) {
  if (lt_state.tried) return;
  lt_state.tried = true;
  /* A driver older than CUDA 13 cannot run libcublasLt 13: prefer 12 there. */
  bool old = drv_state.ok && drv.driver_version > 0 && drv.driver_version < 13000;
  const char *libs[] = {old ? "libcublasLt.so.12" : "libcublasLt.so.13", old ? "libcublasLt.so.13" : "libcublasLt.so.12",
                        "libcublasLt.so"};
  char why[800];
  lt_state.handle = cuda_dlopen_first("LOOM_LIBCUBLASLT", libs, 3, why, sizeof why);
  if (!lt_state.handle) {
    snprintf(lt_state.msg, sizeof lt_state.msg, "cuBLASLt not found (%s): install the CUDA toolkit's libcublas or use --backend cpu",
             why);
    return;
  }
  static const char *const names[] = {LOOM_LT_FUNCS(LOOM_API_NAME)};
  enum { N_LT = 0 LOOM_LT_FUNCS(LOOM_API_COUNT) };
  void *slots[N_LT];
  if (!resolve(lt_state.handle, slots, names, N_LT, "libcublasLt", lt_state.msg, sizeof lt_state.msg)) {
    dlclose(lt_state.handle);
    lt_state.handle = NULL;
    return;
  }
  _Static_assert(sizeof slots == sizeof(CublasLtApi), "cuBLASLt table layout");
  memcpy(&lt, slots, sizeof slots);
  lt_state.ok = true;
}

const CublasLtApi *cuda_cublaslt(char *err, size_t errlen) {
  pthread_mutex_lock(&mu);
  load_lt_locked();
  bool ok = lt_state.ok;
  if (!ok && err) snprintf(err, errlen, "%s", lt_state.msg);
  pthread_mutex_unlock(&mu);
  return ok ? &lt : NULL;
}

size_t cuda_cublaslt_version(char *err, size_t errlen) {
  const CublasLtApi *l = cuda_cublaslt(err, errlen);
  return l ? l->cublasLtGetVersion() : 0;
}

void cuda_api_unload(void) {
  pthread_mutex_lock(&mu);
  /* A library that loaded stays mapped (the driver keeps threads of its own): only the
     tables are forgotten, and the next load finds it again. */
  memset(&drv_state, 0, sizeof drv_state);
  memset(&lt_state, 0, sizeof lt_state);
  memset(&drv, 0, sizeof drv);
  memset(&lt, 0, sizeof lt);
  pthread_mutex_unlock(&mu);
}

int cuda_device_count(int *count, char *err, size_t errlen) {
  *count = 0;
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d) return 1;
  return cuda_cu_fail(d->cuDeviceGetCount(count), "cuDeviceGetCount", "", err, errlen);
}

int cuda_available(char *why, size_t n) {
  char m[1024];
  int count = 0;
  if (cuda_device_count(&count, m, sizeof m)) {
    if (why) snprintf(why, n, "%s", m);
    return 0;
  }
  if (count < 1) {
    if (why) snprintf(why, n, "the NVIDIA driver sees no device (CUDA_VISIBLE_DEVICES?): use --backend cpu");
    return 0;
  }
  if (why && n) why[0] = 0;
  return 1;
}

int cuda_device_query(int device, CudaDeviceInfo *info, char *err, size_t errlen) {
  memset(info, 0, sizeof *info);
  int count;
  if (cuda_device_count(&count, err, errlen)) return 1;
  if (device < 0 || device >= count) {
    snprintf(err, errlen, "no CUDA device %d (the driver sees %d)", device, count);
    return 1;
  }
  const CudaDriverApi *d = &drv;
  CUdevice dev;
  int rc = cuda_cu_fail(d->cuDeviceGet(&dev, device), "cuDeviceGet", "", err, errlen);
  if (!rc) rc = cuda_cu_fail(d->cuDeviceGetName(info->name, (int)sizeof info->name, dev), "cuDeviceGetName", "", err, errlen);
  if (!rc)
    rc = cuda_cu_fail(d->cuDeviceGetAttribute(&info->major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
                      "cuDeviceGetAttribute", "(compute capability)", err, errlen);
  if (!rc)
    rc = cuda_cu_fail(d->cuDeviceGetAttribute(&info->minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
                      "cuDeviceGetAttribute", "(compute capability)", err, errlen);
  if (!rc)
    rc = cuda_cu_fail(d->cuDeviceGetAttribute(&info->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
                      "cuDeviceGetAttribute", "(multiprocessors)", err, errlen);
  if (!rc)
    rc = cuda_cu_fail(
        d->cuDeviceGetAttribute(&info->max_smem_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev),
        "cuDeviceGetAttribute", "(shared memory)", err, errlen);
  size_t total = 0;
  if (!rc) rc = cuda_cu_fail(d->cuDeviceTotalMem(&total, dev), "cuDeviceTotalMem", "", err, errlen);
  if (rc) return 1;
  info->index = device;
  info->total_mem = total;
  info->driver_version = d->driver_version;
  cuda_arch_name(info->major, info->minor, info->arch, sizeof info->arch);
  /* Free memory needs a context: only asked when one of this device is current. */
  CUcontext cur = NULL;
  CUdevice cur_dev;
  size_t fr = 0, tot = 0;
  if (d->cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur && d->cuCtxGetDevice(&cur_dev) == CUDA_SUCCESS &&
      cur_dev == dev && d->cuMemGetInfo(&fr, &tot) == CUDA_SUCCESS)
    info->free_mem = fr;
  return 0;
}

int cuda_device_retain(int device, void **ctx, char *err, size_t errlen) {
  *ctx = NULL;
  int count;
  if (cuda_device_count(&count, err, errlen)) return 1;
  if (device < 0 || device >= count) {
    snprintf(err, errlen, "no CUDA device %d (the driver sees %d)", device, count);
    return 1;
  }
  const CudaDriverApi *d = &drv;
  CUdevice dev;
  CUcontext c;
  char where[64];
  snprintf(where, sizeof where, "(device %d)", device);
  if (cuda_cu_fail(d->cuDeviceGet(&dev, device), "cuDeviceGet", where, err, errlen)) return 1;
  CUresult r = d->cuDevicePrimaryCtxRetain(&c, dev);
  if (r == CUDA_ERROR_ILLEGAL_ADDRESS || r == CUDA_ERROR_LAUNCH_FAILED || r == CUDA_ERROR_ILLEGAL_INSTRUCTION ||
      r == CUDA_ERROR_MISALIGNED_ADDRESS || r == CUDA_ERROR_HARDWARE_STACK_ERROR) {
    /* A kernel fault earlier in this process left the primary context in a sticky error
       (someone else, NCCL's runtime say, still holds it): reset it and try once more. */
    d->cuDevicePrimaryCtxReset(dev);
    r = d->cuDevicePrimaryCtxRetain(&c, dev);
    if (r != CUDA_SUCCESS) {
      const char *name = NULL;
      d->cuGetErrorName(r, &name);
      snprintf(err, errlen,
               "device %d is unusable after an earlier kernel fault in this process (%s, and a context reset did not "
               "clear it): CUDA needs the process restarted",
               device, name ? name : "a sticky error");
      return 1;
    }
  }
  if (cuda_cu_fail(r, "cuDevicePrimaryCtxRetain", where, err, errlen)) return 1;
  if (cuda_cu_fail(d->cuCtxSetCurrent(c), "cuCtxSetCurrent", where, err, errlen)) {
    d->cuDevicePrimaryCtxRelease(dev);
    return 1;
  }
  *ctx = c;
  return 0;
}

void cuda_device_release(int device) {
  const CudaDriverApi *d = cuda_driver(NULL, 0);
  CUdevice dev;
  if (d && d->cuDeviceGet(&dev, device) == CUDA_SUCCESS) d->cuDevicePrimaryCtxRelease(dev);
}

int cuda_device_recover(int device) {
  const CudaDriverApi *d = cuda_driver(NULL, 0);
  CUdevice dev;
  if (!d || d->cuDeviceGet(&dev, device) != CUDA_SUCCESS) return 0;
  return d->cuDevicePrimaryCtxReset(dev) == CUDA_SUCCESS;
}

int cuda_set_current(void *ctx, char *err, size_t errlen) {
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d) return 1;
  return cuda_cu_fail(d->cuCtxSetCurrent((CUcontext)ctx), "cuCtxSetCurrent", "", err, errlen);
}

#else /* no CUDA headers at build time */

#define NO_CUDA "this loom was built without the CUDA headers (cuda.h): use --backend cpu"

int cuda_available(char *why, size_t n) {
  if (why) snprintf(why, n, "%s", NO_CUDA);
  return 0;
}
int cuda_device_count(int *count, char *err, size_t errlen) {
  *count = 0;
  snprintf(err, errlen, "%s", NO_CUDA);
  return 1;
}
int cuda_device_query(int device, CudaDeviceInfo *info, char *err, size_t errlen) {
  memset(info, 0, sizeof *info);
  snprintf(err, errlen, "%s", NO_CUDA);
  return 1;
}
size_t cuda_cublaslt_version(char *err, size_t errlen) {
  snprintf(err, errlen, "%s", NO_CUDA);
  return 0;
}
int cuda_device_retain(int device, void **ctx, char *err, size_t errlen) {
  *ctx = NULL;
  snprintf(err, errlen, "%s", NO_CUDA);
  return 1;
}
void cuda_device_release(int device) { (void)device; }
int cuda_device_recover(int device) { return 0 * device; }
int cuda_set_current(void *ctx, char *err, size_t errlen) {
  snprintf(err, errlen, "%s", NO_CUDA);
  return 1;
}
void cuda_api_unload(void) {}

#endif
