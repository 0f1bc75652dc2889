/* safetensors reader/writer and the runtime's shared file helpers. See safetensors.h. */
#include "runtime/io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "runtime/io/seterr.h"

/* Names are printed with at most this many characters so a hostile name cannot bury the
 * rest of the message. */
#define NM "%.200s"


/* ---- dtypes ---------------------------------------------------------------------------- */

static const char *const dtype_names[ST_DTYPE_COUNT] = {
    "BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16",
    "I32", "U32", "F32", "F64", "I64", "U64"};
static const int dtype_sizes[ST_DTYPE_COUNT] = {1, 1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8};

const char *st_dtype_name(StDType t) {
  return ((unsigned)t < ST_DTYPE_COUNT) ? dtype_names[t] : "?";
}

int st_dtype_size(StDType t) { return ((unsigned)t < ST_DTYPE_COUNT) ? dtype_sizes[t] : 0; }

int st_dtype_parse(const char *s, StDType *out) {
  for (int i = 0; s && i < ST_DTYPE_COUNT; i++)
    if (strcmp(s, dtype_names[i]) == 0) {
      *out = (StDType)i;
      return 0;
    }
  return -1;
}

int64_t st_numel(int rank, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++)
    if (shape[i] < 0 || __builtin_mul_overflow(n, shape[i], &n)) return -1;
  return n;
}

/* prod(shape) * size in bytes, or -1 on a negative dim or overflow. */
static int64_t shape_bytes(StDType t, int rank, const int64_t *shape) {
  int64_t n = st_numel(rank, shape), b;
  if (n < 0 || __builtin_mul_overflow(n, (int64_t)st_dtype_size(t), &b)) return -1;
  return b;
}

static const char *shape_str(char *buf, size_t len, int rank, const int64_t *shape) {
  size_t k = (size_t)snprintf(buf, len, "[");
  for (int i = 0; i < rank && k < len; i++)
    k += (size_t)snprintf(buf + k, len - k, "%s%" PRId64, i ? "," : "", shape[i]);
  if (k < len) snprintf(buf + k, len - k, "]");
  return buf;
}

static const char *json_type_name(const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "an object";
  case JSON_ARRAY: return "an array";
  case JSON_STRING: return "a string";
  case JSON_INTEGER: return "an integer";
  case JSON_REAL: return "a real number";
  case JSON_TRUE: case JSON_FALSE: return "a boolean";
  default: return "null";
  }
}

static uint64_t get_le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* ---- reader ---------------------------------------------------------------------------- */

typedef struct {
  StTensor t;
  int64_t begin, end;
  int idx; /* header order, to make the sort deterministic for equal ranges */
} Entry;

static int entry_cmp(const void *pa, const void *pb) {
  const Entry *a = pa, *b = pb;
  if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
  if (a->end != b->end) return a->end < b->end ? -1 : 1;
  return a->idx - b->idx;
}

/* Validates one header entry and fills e (except data). */
static int parse_entry(const char *path, const char *name, json_t *v, Entry *e, char *err,
                       size_t errlen) {
  if (!json_is_object(v)) {
    seterr(err, errlen, "%s: tensor '" NM "': entry is %s, not an object with dtype, shape "
           "and data_offsets", path, name, json_type_name(v));
    return 2;
  }
  static const char *const fields[3] = {"dtype", "shape", "data_offsets"};
  static const json_type types[3] = {JSON_STRING, JSON_ARRAY, JSON_ARRAY};
  static const char *const tnames[3] = {"a string", "an array", "an array"};
  json_t *f[3];
  for (int i = 0; i < 3; i++) {
    f[i] = json_object_get(v, fields[i]);
    if (!f[i]) {
      seterr(err, errlen, "%s: tensor '" NM "': entry lacks '%s'", path, name, fields[i]);
      return 2;
    }
    if (json_typeof(f[i]) != types[i]) {
      seterr(err, errlen, "%s: tensor '" NM "': '%s' must be %s, got %s", path, name,
             fields[i], tnames[i], json_type_name(f[i]));
      return 2;
    }
  }
  const char *ds = json_string_value(f[0]);
  if (st_dtype_parse(ds, &e->t.dtype) != 0) {
    seterr(err, errlen, "%s: tensor '" NM "': unknown dtype '%.40s'; loom reads BOOL U8 I8 "
           "F8_E5M2 F8_E4M3 I16 U16 F16 BF16 I32 U32 F32 F64 I64 U64", path, name, ds);
    return 2;
  }
  size_t rank = json_array_size(f[1]);
  if (rank > ST_MAX_RANK) {
    seterr(err, errlen, "%s: tensor '" NM "': rank %zu is over the maximum of %d", path, name,
           rank, ST_MAX_RANK);
    return 2;
  }
  e->t.rank = (int)rank;
  for (size_t i = 0; i < rank; i++) {
    json_t *d = json_array_get(f[1], i);
    if (!json_is_integer(d)) {
      seterr(err, errlen, "%s: tensor '" NM "': shape[%zu] is %s, not an integer", path,
             name, i, json_type_name(d));
      return 2;
    }
    e->t.shape[i] = json_integer_value(d);
    if (e->t.shape[i] < 0) {
      seterr(err, errlen, "%s: tensor '" NM "': shape[%zu] is negative (%" PRId64 ")", path,
             name, i, e->t.shape[i]);
      return 2;
    }
  }
  char sb[256];
  int64_t need = shape_bytes(e->t.dtype, e->t.rank, e->t.shape);
  if (need < 0) {
    seterr(err, errlen, "%s: tensor '" NM "': %s %s holds more bytes than a 64-bit size "
           "(overflow)", path, name, ds, shape_str(sb, sizeof sb, e->t.rank, e->t.shape));
    return 2;
  }
  json_t *o0 = json_array_get(f[2], 0), *o1 = json_array_get(f[2], 1);
  if (json_array_size(f[2]) != 2 || !json_is_integer(o0) || !json_is_integer(o1)) {
    seterr(err, errlen, "%s: tensor '" NM "': data_offsets must be two integers [begin, end]",
           path, name);
    return 2;
  }
  e->begin = json_integer_value(o0);
  e->end = json_integer_value(o1);
  if (e->begin < 0 || e->end < 0 || e->begin > e->end) {
    seterr(err, errlen, "%s: tensor '" NM "': data_offsets [%" PRId64 ", %" PRId64 "] must be "
           "non-negative with begin <= end", path, name, e->begin, e->end);
    return 2;
  }
  if (e->end - e->begin != need) {
    seterr(err, errlen, "%s: tensor '" NM "': data_offsets [%" PRId64 ", %" PRId64 "] hold %"
           PRId64 " bytes but %s %s needs %" PRId64 "; the file is corrupt or was written by "
           "a broken tool", path, name, e->begin, e->end, e->end - e->begin, ds,
           shape_str(sb, sizeof sb, e->t.rank, e->t.shape), need);
    return 2;
  }
  e->t.nbytes = (uint64_t)need;
  return 0;
}

static int parse_meta(const char *path, json_t *m, StFile *out, char *err, size_t errlen) {
  if (json_is_null(m)) return 0; /* the reference implementation reads null as "none" */
  if (!json_is_object(m)) {
    seterr(err, errlen, "%s: __metadata__ is %s; it must be an object of string values",
           path, json_type_name(m));
    return 2;
  }
  size_t n = json_object_size(m);
  out->meta_keys = calloc(n + 1, sizeof(char *));
  out->meta_values = calloc(n + 1, sizeof(char *));
  if (!out->meta_keys || !out->meta_values) goto oom;
  const char *k;
  json_t *v;
  json_object_foreach(m, k, v) {
    if (!json_is_string(v)) {
      seterr(err, errlen, "%s: __metadata__ key '" NM "' has %s as value; metadata values must "
             "be strings", path, k, json_type_name(v));
      return 2;
    }
    char *ks = strdup(k), *vs = strdup(json_string_value(v));
    if (!ks || !vs) {
      free(ks);
      free(vs);
      goto oom;
    }
    out->meta_keys[out->n_meta] = ks;
    out->meta_values[out->n_meta] = vs;
    out->n_meta++;
  }
  return 0;
oom:
  seterr(err, errlen, "%s: out of memory reading __metadata__", path);
  return 1;
}

/* Checks that the sorted ranges tile [0, last_end) exactly; returns last_end or -1. */
static int64_t check_tiling(const char *path, const Entry *e, int n, char *err,
                            size_t errlen) {
  int64_t pos = 0;
  const Entry *prev = NULL; /* the tensor whose data ends at pos */
  for (int i = 0; i < n; i++) {
    if (e[i].begin > pos) {
      seterr(err, errlen, "%s: data bytes [%" PRId64 ", %" PRId64 ") belong to no tensor (gap "
             "before tensor '" NM "'); tensors must be stored back to back from offset 0",
             path, pos, e[i].begin, e[i].t.name);
      return -1;
    }
    if (e[i].begin < pos) {
      seterr(err, errlen, "%s: tensor '" NM "' data_offsets [%" PRId64 ", %" PRId64 "] overlap "
             "tensor '" NM "' which ends at %" PRId64 "; the file is corrupt", path,
             e[i].t.name, e[i].begin, e[i].end, prev ? prev->t.name : "?", pos);
      return -1;
    }
    if (e[i].end > pos) prev = &e[i];
    pos = e[i].end;
  }
  return pos;
}

/* The whole of PATH memory-mapped read-only (an empty file maps nothing: buf points at a
   static byte). */
static int map_file(const char *path, uint8_t **buf, size_t *size, char *err, size_t errlen) {
  static uint8_t empty;
  /* O_NONBLOCK: a FIFO opens at once (and is refused below) instead of waiting for a writer */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  struct stat sb;
  if (fd < 0 || fstat(fd, &sb) != 0) {
    seterr(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    return 1;
  }
  if (!S_ISREG(sb.st_mode)) {
    seterr(err, errlen, "%s: not a regular file", path);
    close(fd);
    return 1;
  }
  *size = (size_t)sb.st_size;
  *buf = &empty;
  if (*size) {
    void *m = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      seterr(err, errlen, "%s: cannot map: %s", path, strerror(errno));
      close(fd);
      return 1;
    }
    *buf = m;
  }
  close(fd);
  return 0;
}

static int st_open(const char *path, StFile *out, bool mapped, char *err, size_t errlen);

int st_read(const char *path, StFile *out, char *err, size_t errlen) { return st_open(path, out, false, err, errlen); }
int st_map(const char *path, StFile *out, char *err, size_t errlen) { return st_open(path, out, true, err, errlen); }

static int st_open(const char *path, StFile *out, bool mapped, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  json_t *root = NULL;
  Entry *ents = NULL;
  int ne = 0, rc;
  out->mapped = mapped;
  rc = mapped ? map_file(path, &out->buf, &out->size, err, errlen) : rt_read_file(path, &out->buf, &out->size, err, errlen);
  if (rc != 0) {
    out->buf = NULL;
    goto fail;
  }
  rc = 1;
  if (!(out->path = strdup(path))) {
    seterr(err, errlen, "%s: out of memory", path);
    goto fail;
  }
  rc = 2;
  if (out->size < 8) {
    seterr(err, errlen, "%s: file is %zu bytes, shorter than the 8-byte header length; it is "
           "not a safetensors file or is truncated", path, out->size);
    goto fail;
  }
  uint64_t hlen = get_le64(out->buf);
  if (hlen > ST_MAX_HEADER_BYTES) {
    seterr(err, errlen, "%s: header length %" PRIu64 " is over the 100 MB limit; this is not a "
           "safetensors file or its first 8 bytes are corrupt", path, hlen);
    goto fail;
  }
  if (hlen > out->size - 8) {
    seterr(err, errlen, "%s: header length %" PRIu64 " runs past the end of the file (%zu "
           "bytes); the file is truncated or not a safetensors file", path, hlen, out->size);
    goto fail;
  }
  json_error_t je;
  root = json_loadb((const char *)out->buf + 8, (size_t)hlen,
                    JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
  if (!root) {
    enum json_error_code code = json_error_code(&je);
    if (code == json_error_duplicate_key)
      seterr(err, errlen, "%s: header line %d column %d: a key appears twice (%s); tensor "
             "names and __metadata__ keys must be unique", path, je.line, je.column, je.text);
    else if (code == json_error_out_of_memory)
      rc = 1, seterr(err, errlen, "%s: out of memory parsing the header", path);
    else
      seterr(err, errlen, "%s: header is not valid JSON: line %d column %d: %s", path,
             je.line, je.column, je.text);
    goto fail;
  }
  if (!json_is_object(root)) {
    seterr(err, errlen, "%s: header is %s, not a JSON object of tensors", path,
           json_type_name(root));
    goto fail;
  }
  size_t nobj = json_object_size(root);
  if (nobj > INT32_MAX) {
    seterr(err, errlen, "%s: header lists too many tensors (%zu)", path, nobj);
    goto fail;
  }
  if (!(ents = calloc(nobj + 1, sizeof *ents))) {
    rc = 1, seterr(err, errlen, "%s: out of memory for %zu tensors", path, nobj);
    goto fail;
  }
  const char *key;
  json_t *val;
  json_object_foreach(root, key, val) {
    if (strcmp(key, "__metadata__") == 0) {
      if ((rc = parse_meta(path, val, out, err, errlen)) != 0) goto fail;
      rc = 2;
      continue;
    }
    Entry *e = &ents[ne];
    e->idx = ne;
    if (!(e->t.name = strdup(key))) {
      rc = 1, seterr(err, errlen, "%s: out of memory", path);
      goto fail;
    }
    ne++;
    if (parse_entry(path, key, val, e, err, errlen) != 0) goto fail;
  }
  qsort(ents, (size_t)ne, sizeof *ents, entry_cmp);
  int64_t last = check_tiling(path, ents, ne, err, errlen);
  if (last < 0) goto fail;
  /* hlen <= 1e8 and last <= INT64_MAX, so this cannot wrap. */
  uint64_t want = 8 + hlen + (uint64_t)last;
  if (out->size < want) {
    seterr(err, errlen, "%s: file is %zu bytes but its header says the data ends at byte %"
           PRIu64 "; the file is truncated (%" PRIu64 " bytes missing)", path, out->size, want,
           want - out->size);
    goto fail;
  }
  if (out->size > want) {
    seterr(err, errlen, "%s: file is %zu bytes but the data ends at byte %" PRIu64 "; %" PRIu64
           " trailing bytes follow the last tensor; the file is corrupt", path, out->size, want,
           (uint64_t)out->size - want);
    goto fail;
  }
  if (!(out->tensors = calloc((size_t)ne + 1, sizeof *out->tensors))) {
    rc = 1, seterr(err, errlen, "%s: out of memory", path);
    goto fail;
  }
  const uint8_t *data = out->buf + 8 + hlen;
  for (int i = 0; i < ne; i++) {
    out->tensors[i] = ents[i].t;
    out->tensors[i].data = data + ents[i].begin;
  }
  out->n = ne;
  free(ents);
  json_decref(root);
  return 0;
fail:
  for (int i = 0; i < ne; i++) free(ents[i].t.name);
  free(ents);
  if (root) json_decref(root);
  st_close(out);
  return rc;
}

const StTensor *st_find(const StFile *f, const char *name) {
  for (int i = 0; i < f->n; i++)
    if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
  return NULL;
}

void st_close(StFile *f) {
  if (!f) return;
  for (int i = 0; f->tensors && i < f->n; i++) free(f->tensors[i].name);
  for (int i = 0; i < f->n_meta; i++) {
    if (f->meta_keys) free(f->meta_keys[i]);
    if (f->meta_values) free(f->meta_values[i]);
  }
  free(f->tensors);
  free(f->meta_keys);
  free(f->meta_values);
  if (f->mapped) {
    if (f->buf && f->size) munmap(f->buf, f->size);
  } else {
    free(f->buf);
  }
  free(f->path);
  memset(f, 0, sizeof *f);
}

/* ---- writer ---------------------------------------------------------------------------- */

/* Builds the header JSON object; returns 0, 2 for bad input, 1 for out of memory. */
static int build_header(const char *path, const StTensor *ts, int n, const char *const *mk,
                        const char *const *mv, int n_meta, json_t *root, char *err,
                        size_t errlen, bool filled) {
  if (n_meta > 0) {
    json_t *meta = json_object();
    if (!meta || json_object_set_new(root, "__metadata__", meta) != 0) goto oom;
    for (int i = 0; i < n_meta; i++) {
      if (!mk[i] || !mv[i]) {
        seterr(err, errlen, "%s: metadata entry %d has a NULL key or value", path, i);
        return 2;
      }
      if (json_object_get(meta, mk[i])) {
        seterr(err, errlen, "%s: metadata key '" NM "' is given twice", path, mk[i]);
        return 2;
      }
      json_t *s = json_string(mv[i]); /* NULL also for invalid UTF-8 */
      if (!s || json_object_set_new(meta, mk[i], s) != 0) {
        seterr(err, errlen, "%s: metadata '" NM "' is not valid UTF-8", path, mk[i]);
        return 2;
      }
    }
  }
  int64_t off = 0;
  for (int i = 0; i < n; i++) {
    const StTensor *t = &ts[i];
    const char *nm = t->name ? t->name : "(null)";
    if (!t->name || strcmp(t->name, "__metadata__") == 0 || json_object_get(root, t->name)) {
      seterr(err, errlen, "%s: tensor %d: name '" NM "' is %s", path, i, nm,
             !t->name ? "missing" : !strcmp(t->name, "__metadata__") ? "reserved for metadata"
             : "used by an earlier tensor; names must be unique");
      return 2;
    }
    if ((unsigned)t->dtype >= ST_DTYPE_COUNT || t->rank < 0 || t->rank > ST_MAX_RANK) {
      seterr(err, errlen, "%s: tensor '" NM "': bad dtype %d or rank %d", path, nm,
             (int)t->dtype, t->rank);
      return 2;
    }
    char sb[256];
    int64_t need = shape_bytes(t->dtype, t->rank, t->shape);
    if (need < 0 || (uint64_t)need != t->nbytes || (need > 0 && !t->data && !filled) ||
        __builtin_add_overflow(off, need, &off)) {
      seterr(err, errlen, "%s: tensor '" NM "': %s %s needs %" PRId64 " bytes but nbytes is %"
             PRIu64 "%s", path, nm, st_dtype_name(t->dtype),
             shape_str(sb, sizeof sb, t->rank, t->shape), need, t->nbytes,
             (need > 0 && !t->data && !filled) ? " and data is NULL" : "");
      return 2;
    }
    json_t *shape = json_array();
    if (!shape) goto oom;
    for (int d = 0; d < t->rank; d++)
      if (json_array_append_new(shape, json_integer(t->shape[d])) != 0) {
        json_decref(shape);
        goto oom;
      }
    json_t *e = json_pack("{s:s, s:o, s:[I,I]}", "dtype", st_dtype_name(t->dtype), "shape",
                          shape, "data_offsets", (json_int_t)(off - need), (json_int_t)off);
    if (!e) goto oom; /* json_pack steals shape even on failure */
    if (json_object_set_new(root, t->name, e) != 0) {
      seterr(err, errlen, "%s: tensor name '" NM "' is not valid UTF-8", path, nm);
      return 2;
    }
  }
  return 0;
oom:
  seterr(err, errlen, "%s: out of memory building the header", path);
  return 1;
}

int st_write(const char *path, const StTensor *tensors, int n,
             const char *const *meta_keys, const char *const *meta_values, int n_meta,
             char *err, size_t errlen) {
  return st_write_each(path, tensors, n, meta_keys, meta_values, n_meta, NULL, NULL, err, errlen);
}

int st_write_each(const char *path, const StTensor *tensors, int n, const char *const *meta_keys,
                  const char *const *meta_values, int n_meta,
                  int (*fill)(void *arg, int i, const void **data, char *err, size_t errlen), void *arg,
                  char *err, size_t errlen) {
  if (n < 0 || n_meta < 0 || (n > 0 && !tensors) || (n_meta > 0 && (!meta_keys ||
      !meta_values))) {
    seterr(err, errlen, "%s: st_write called with n=%d, n_meta=%d and NULL arrays", path, n,
           n_meta);
    return 2;
  }
  json_t *root = json_object();
  if (!root) {
    seterr(err, errlen, "%s: out of memory", path);
    return 1;
  }
  int rc = build_header(path, tensors, n, meta_keys, meta_values, n_meta, root, err, errlen, fill != NULL);
  char *hdr = rc ? NULL : json_dumps(root, JSON_COMPACT);
  json_decref(root);
  if (rc) return rc;
  if (!hdr) {
    seterr(err, errlen, "%s: out of memory serializing the header", path);
    return 1;
  }
  /* Pad with spaces so the data buffer starts 8-byte aligned (for mmap and direct loads). */
  size_t len = strlen(hdr), padded = (len + 7) & ~(size_t)7;
  uint8_t lenb[8];
  for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)((uint64_t)padded >> (8 * i));
  static const char spaces[8] = "        ";
  RtAtomic a;
  rc = rt_atomic_open(&a, path, err, errlen);
  if (!rc) rc = rt_atomic_write(&a, lenb, 8, err, errlen);
  if (!rc) rc = rt_atomic_write(&a, hdr, len, err, errlen);
  if (!rc) rc = rt_atomic_write(&a, spaces, padded - len, err, errlen);
  for (int i = 0; !rc && i < n; i++) {
    const void *data = tensors[i].data;
    if (!data && fill) rc = fill(arg, i, &data, err, errlen);
    if (!rc) rc = rt_atomic_write(&a, data, (size_t)tensors[i].nbytes, err, errlen);
  }
  if (!rc) rc = rt_atomic_commit(&a, err, errlen);
  rt_atomic_abort(&a);
  free(hdr);
  return rc;
}

/* ---- shared file helpers --------------------------------------------------------------- */

int rt_read_file(const char *path, uint8_t **buf, size_t *size, char *err, size_t errlen) {
  *buf = NULL;
  *size = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);   /* a FIFO: refused below, not waited on */
  if (fd < 0) {
    /* A path the user named that is missing or unreadable is bad input (2); other
       failures to open are run-time failures (1). */
    int e = errno;
    seterr(err, errlen, "%s: cannot open: %s", path, strerror(e));
    return (e == ENOENT || e == EACCES || e == ENOTDIR || e == ELOOP || e == ENAMETOOLONG) ? 2 : 1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    seterr(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
    close(fd);
    return 1;
  }
  if (!S_ISREG(st.st_mode)) {
    seterr(err, errlen, "%s: cannot read: %s", path, S_ISDIR(st.st_mode) ? "it is a folder, not a file" : "not a regular file (a pipe or a device); give a file");
    close(fd);
    return 2;
  }
  size_t n = (size_t)st.st_size, got = 0;
  uint8_t *b = malloc(n ? n : 1);
  if (!b) {
    seterr(err, errlen, "%s: out of memory reading %zu bytes", path, n);
    close(fd);
    return 1;
  }
  while (got < n) {
    ssize_t r = read(fd, b + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      seterr(err, errlen, "%s: read failed at byte %zu: %s", path, got, strerror(errno));
      free(b);
      close(fd);
      return 1;
    }
    if (r == 0) break; /* shrank while reading: validation will see the short size */
    got += (size_t)r;
  }
  close(fd);
  *buf = b;
  *size = got;
  return 0;
}

int rt_atomic_open(RtAtomic *a, const char *path, char *err, size_t errlen) {
  memset(a, 0, sizeof *a);
  size_t len = strlen(path) + 32;
  a->path = strdup(path);
  a->tmp = malloc(len);
  if (!a->path || !a->tmp) {
    rt_atomic_abort(a);
    seterr(err, errlen, "%s: out of memory", path);
    return 1;
  }
  snprintf(a->tmp, len, "%s.tmp.%ld", path, (long)getpid());
  if (!(a->fp = fopen(a->tmp, "wb"))) {
    seterr(err, errlen, "%s: cannot create %s: %s; check that the directory exists and is "
           "writable", path, a->tmp, strerror(errno));
    free(a->tmp);
    a->tmp = NULL; /* nothing was created, so abort must not unlink a file of that name */
    rt_atomic_abort(a);
    return 1;
  }
  return 0;
}

int rt_atomic_write(RtAtomic *a, const void *p, size_t n, char *err, size_t errlen) {
  if (n == 0) return 0;
  if (!a->fp || fwrite(p, 1, n, a->fp) != n) {
    seterr(err, errlen, "%s: cannot write %s: %s", a->path ? a->path : "?",
           a->tmp ? a->tmp : "(not open)", strerror(errno));
    rt_atomic_abort(a);
    return 1;
  }
  return 0;
}

int rt_atomic_commit(RtAtomic *a, char *err, size_t errlen) {
  if (!a->fp) {
    seterr(err, errlen, "%s: commit of a file that is not open", a->path ? a->path : "?");
    return 1;
  }
  /* The data must be on disk before the rename makes it visible under PATH. */
  const char *what = NULL;
  int e = 0;
  if (fflush(a->fp) != 0) what = "flush", e = errno;
  else if (fsync(fileno(a->fp)) != 0) what = "fsync", e = errno;
  if (fclose(a->fp) != 0 && !what) what = "close", e = errno;
  a->fp = NULL;
  if (!what && rename(a->tmp, a->path) != 0) what = "rename", e = errno;
  if (what) {
    seterr(err, errlen, "%s: cannot %s %s: %s; the old file (if any) is unchanged", a->path,
           what, a->tmp, strerror(e));
    rt_atomic_abort(a);
    return 1;
  }
  free(a->tmp);
  a->tmp = NULL; /* renamed: nothing left to clean up */
  /* Make the rename itself durable. Some filesystems refuse fsync on a directory (EINVAL);
   * the file is complete either way, so only a real I/O error is reported. */
  char *dir = strdup(a->path);
  int rc = 0;
  if (dir) {
    char *slash = strrchr(dir, '/');
    const char *d = !slash ? "." : (slash == dir ? "/" : (*slash = 0, dir));
    int fd = open(d, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
      if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS) {
        seterr(err, errlen, "%s: written, but fsync of directory %s failed: %s", a->path, d,
               strerror(errno));
        rc = 1;
      }
      close(fd);
    }
    free(dir);
  }
  rt_atomic_abort(a);
  return rc;
}

void rt_atomic_abort(RtAtomic *a) {
  if (!a) return;
  if (a->fp) fclose(a->fp);
  if (a->tmp) unlink(a->tmp);
  free(a->tmp);
  free(a->path);
  memset(a, 0, sizeof *a);
}
