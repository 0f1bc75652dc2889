/* safetensors reader and writer.
 *
 * File layout: 8-byte little-endian u64 N, N bytes of JSON header, then the data buffer.
 * The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end)} with
 * offsets relative to the start of the data buffer, plus an optional "__metadata__"
 * object of string -> string.
 *
 * Errors are values: functions return 0 on success, 2 when the input is malformed and 1
 * for run-time failures (cannot open, cannot write, out of memory), and write a one-line
 * message naming the file, the place and the problem into err (if err is not NULL).
 */
#ifndef LOOM_RUNTIME_SAFETENSORS_H
#define LOOM_RUNTIME_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define ST_MAX_RANK 8
/* Same limit as the reference implementation: a bigger header is an attack or corruption. */
#define ST_MAX_HEADER_BYTES 100000000ull

typedef enum {
  ST_BOOL, ST_U8, ST_I8, ST_F8_E5M2, ST_F8_E4M3, ST_I16, ST_U16, ST_F16, ST_BF16,
  ST_I32, ST_U32, ST_F32, ST_F64, ST_I64, ST_U64, ST_DTYPE_COUNT
} StDType;

const char *st_dtype_name(StDType t);            /* "F32" etc.; "?" when out of range */
int st_dtype_size(StDType t);                    /* bytes per element; 0 when out of range */
int st_dtype_parse(const char *s, StDType *out); /* 0 ok, -1 unknown */

typedef struct {
  char *name;
  StDType dtype;
  int rank;                     /* 0 = scalar */
  int64_t shape[ST_MAX_RANK];
  uint64_t nbytes;              /* prod(shape) * st_dtype_size(dtype) */
  const void *data;             /* into the file buffer (reader) or caller memory (writer) */
} StTensor;

typedef struct {
  char *path;
  uint8_t *buf; size_t size;    /* the whole file, read into memory (or mapped: st_map) */
  bool mapped;
  int n; StTensor *tensors;     /* sorted by data offset (file order) */
  int n_meta; char **meta_keys; char **meta_values;  /* __metadata__ */
} StFile;

/* Reads and fully validates PATH. On failure *out is left zeroed.
 * The data buffer starts at an 8-byte aligned address when the writer padded the header
 * (this writer and HF's do); a tensor is aligned to its element size only if the tensors
 * before it keep it so. */
int st_read(const char *path, StFile *out, char *err, size_t errlen);
/* The same with the file memory-mapped (read-only, private) instead of read: only the pages
   of the tensors used are read from disk (a rank reading its slices of a large checkpoint). */
int st_map(const char *path, StFile *out, char *err, size_t errlen);
const StTensor *st_find(const StFile *f, const char *name);  /* NULL if absent */
void st_close(StFile *f);  /* safe on a zeroed or partially filled StFile; zeroes it */

/* Number of elements of a tensor shape; -1 if a dim is negative or the product overflows. */
int64_t st_numel(int rank, const int64_t *shape);

/* Writes tensors in the given order, header padded with spaces to a multiple of 8,
 * optional metadata (n_meta may be 0). Each tensor's nbytes must equal prod(shape)*size
 * (data may be NULL only when nbytes is 0). Atomic: writes PATH.tmp.<pid>, fflush+fsync,
 * renames over PATH and fsyncs the directory; a failure never leaves a partial file. */
int st_write(const char *path, const StTensor *tensors, int n,
             const char *const *meta_keys, const char *const *meta_values, int n_meta,
             char *err, size_t errlen);
/* st_write with each tensor whose data is NULL filled just before it is written: fill(arg, i,
   &data) gives tensor i's bytes (valid until the next call), so a writer never holds every
   tensor at once (a mesh's --out gathers one at a time).  0, or fill's or the write's code. */
int st_write_each(const char *path, const StTensor *tensors, int n, const char *const *meta_keys,
                  const char *const *meta_values, int n_meta,
                  int (*fill)(void *arg, int i, const void **data, char *err, size_t errlen), void *arg,
                  char *err, size_t errlen);

/* ---- File helpers shared by the runtime's readers and writers (tokens.c uses them). */

/* Reads the whole of PATH into a malloc'd buffer (*buf is non-NULL even for an empty file).
 * Returns 0, or 1 with a message. */
int rt_read_file(const char *path, uint8_t **buf, size_t *size, char *err, size_t errlen);

/* Atomic replacement of a file: open writes PATH.tmp.<pid>, commit flushes, fsyncs, renames
 * over PATH and fsyncs the directory; abort (or a failed write/commit) removes the temp file. */
typedef struct {
  FILE *fp;
  char *path;
  char *tmp;
} RtAtomic;
int rt_atomic_open(RtAtomic *a, const char *path, char *err, size_t errlen);
int rt_atomic_write(RtAtomic *a, const void *p, size_t n, char *err, size_t errlen);
int rt_atomic_commit(RtAtomic *a, char *err, size_t errlen);
void rt_atomic_abort(RtAtomic *a);  /* safe after commit or on a zeroed RtAtomic */

#endif
