/* Unit tests for runtime/safetensors: round trips, layout, every rejection, fuzzing. */
#include "runtime/io/safetensors.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "tests/unit/check.h"
#include "tests/unit/files.h"

static char dir[64];
static char path[256];

/* Writes a safetensors file with header `json` (length field = hlen, or strlen when hlen is
 * -1) followed by `data` zero bytes. */
static void craft(const char *p, const char *json, long long hlen, size_t data) {
  size_t jl = strlen(json), n = 8 + jl + data;
  uint8_t *b = xalloc(n);
  unsigned long long h = hlen < 0 ? jl : (unsigned long long)hlen;
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(h >> (8 * i));
  memcpy(b + 8, json, jl);
  put_file(p, b, n);
  free(b);
}

static void reject(int line, const char *json, size_t data, const char *sub) {
  char err[512] = "";
  StFile f;
  craft(path, json, -1, data);
  int rc = st_read(path, &f, err, sizeof err);
  if (getenv("LOOM_TEST_VERBOSE")) printf("  %s\n", err); /* to review the wording */
  if (rc == 2 && strstr(err, sub) && f.n == 0 && f.buf == NULL) n_pass++;
  else {
    n_fail++;
    fprintf(stderr, "%s:%d: header %s: want rc 2 with \"%s\", got rc %d: %s\n", __FILE__, line,
            json, sub, rc, err);
  }
  st_close(&f);
}
#define REJECT(json, data, sub) reject(__LINE__, json, data, sub)

static void test_dtypes(void) {
  StDType t;
  for (int i = 0; i < ST_DTYPE_COUNT; i++) {
    CHECK(st_dtype_parse(st_dtype_name((StDType)i), &t) == 0 && t == (StDType)i);
    CHECK(st_dtype_size((StDType)i) >= 1 && st_dtype_size((StDType)i) <= 8);
  }
  CHECK(st_dtype_parse("F33", &t) == -1);
  CHECK(st_dtype_size(ST_BF16) == 2 && st_dtype_size(ST_F64) == 8 && st_dtype_size(ST_BOOL) == 1);
  CHECK(strcmp(st_dtype_name(ST_F8_E4M3), "F8_E4M3") == 0);
  int64_t big[2] = {INT64_MAX / 2, 3};
  CHECK(st_numel(2, big) == -1);
  CHECK(st_numel(0, big) == 1);
}

static void test_roundtrip(void) {
  float f32[6] = {1, 2, 3, 4, 5, 6.5f};
  uint16_t bf16[3] = {0x3f80, 0x4000, 0xc000};
  int64_t scalar = -1234567890123LL;
  uint8_t boolv[3] = {1, 0, 1};
  double f64 = 3.25;
  StTensor ts[6] = {
      {.name = "h.0.attn.c_attn.weight", .dtype = ST_F32, .rank = 2, .shape = {2, 3},
       .nbytes = 24, .data = f32},
      {.name = "bf", .dtype = ST_BF16, .rank = 1, .shape = {3}, .nbytes = 6, .data = bf16},
      {.name = "scalar", .dtype = ST_I64, .rank = 0, .nbytes = 8, .data = &scalar},
      {.name = "empty", .dtype = ST_U8, .rank = 2, .shape = {0, 5}, .nbytes = 0, .data = NULL},
      {.name = "flags", .dtype = ST_BOOL, .rank = 1, .shape = {3}, .nbytes = 3, .data = boolv},
      {.name = "r8", .dtype = ST_F64, .rank = 8, .shape = {1, 1, 1, 1, 1, 1, 1, 1}, .nbytes = 8,
       .data = &f64},
  };
  const char *mk[2] = {"format", "note"}, *mv[2] = {"pt", "h\xc3\xa9llo \"quoted\""};
  char err[512] = "";
  snprintf(path, sizeof path, "%s/rt.safetensors", dir);
  CHECK(st_write(path, ts, 6, mk, mv, 2, err, sizeof err) == 0);
  StFile f;
  int rc = st_read(path, &f, err, sizeof err);
  CHECK(rc == 0);
  if (rc != 0) {
    fprintf(stderr, "  %s\n", err);
    return;
  }
  CHECK(f.n == 6 && f.n_meta == 2);
  /* File order = the order given to st_write. */
  for (int i = 0; i < f.n && i < 6; i++) {
    const StTensor *a = &f.tensors[i], *b = &ts[i];
    CHECK(strcmp(a->name, b->name) == 0);
    CHECK(a->dtype == b->dtype && a->rank == b->rank && a->nbytes == b->nbytes);
    for (int d = 0; d < b->rank; d++) CHECK(a->shape[d] == b->shape[d]);
    CHECK(b->nbytes == 0 || memcmp(a->data, b->data, b->nbytes) == 0);
    CHECK(st_find(&f, b->name) == a);
  }
  CHECK(st_find(&f, "nope") == NULL);
  CHECK(strcmp(f.meta_keys[0], "format") == 0 && strcmp(f.meta_values[0], "pt") == 0);
  CHECK(strcmp(f.meta_keys[1], "note") == 0 && strcmp(f.meta_values[1], mv[1]) == 0);
  /* Header padded with spaces to a multiple of 8; data starts 8-aligned in memory. */
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | f.buf[i];
  CHECK(hlen % 8 == 0);
  CHECK(f.buf[8 + hlen - 1] == ' ' || f.buf[8 + hlen - 1] == '}');
  CHECK(((uintptr_t)f.tensors[0].data) % 8 == 0);
  CHECK((const uint8_t *)f.tensors[0].data == f.buf + 8 + hlen);
  CHECK(f.size == 8 + hlen + 24 + 6 + 8 + 0 + 3 + 8);
  st_close(&f);
  CHECK(f.buf == NULL && f.n == 0);
  st_close(&f); /* twice is safe */

  /* Every header length modulo 8 pads correctly. */
  for (int len = 1; len <= 9; len++) {
    char name[16];
    memset(name, 'a', sizeof name);
    name[len] = 0;
    StTensor t = {.name = name, .dtype = ST_F32, .rank = 1, .shape = {1}, .nbytes = 4,
                  .data = f32};
    CHECK(st_write(path, &t, 1, NULL, NULL, 0, err, sizeof err) == 0);
    CHECK(st_read(path, &f, err, sizeof err) == 0 && f.n == 1 &&
          (f.size - 4) % 8 == 0 && ((uintptr_t)f.tensors[0].data) % 8 == 0 &&
          *(const float *)f.tensors[0].data == 1.0f);
    st_close(&f);
  }

  /* Empty tensor list, with and without metadata. */
  CHECK(st_write(path, NULL, 0, NULL, NULL, 0, err, sizeof err) == 0);
  CHECK(st_read(path, &f, err, sizeof err) == 0 && f.n == 0 && f.n_meta == 0 && f.size == 16);
  st_close(&f);
  CHECK(st_write(path, NULL, 0, mk, mv, 1, err, sizeof err) == 0);
  CHECK(st_read(path, &f, err, sizeof err) == 0 && f.n == 0 && f.n_meta == 1);
  st_close(&f);

  /* Hand-written files: order of data offsets, not header order; null metadata; extra keys. */
  craft(path, "{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]},"
              "\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,2]},"
              "\"a\":{\"dtype\":\"I16\",\"shape\":[],\"data_offsets\":[0,2],\"x\":1},"
              "\"__metadata__\":null}", -1, 4);
  rc = st_read(path, &f, err, sizeof err);
  CHECK(rc == 0 && f.n == 3 && f.n_meta == 0);
  if (rc == 0 && f.n == 3)
    CHECK(!strcmp(f.tensors[0].name, "a") && !strcmp(f.tensors[1].name, "z") &&
          !strcmp(f.tensors[2].name, "b") && f.tensors[0].rank == 0);
  st_close(&f);
}

static void test_write_errors(void) {
  char err[512] = "";
  float x[2] = {0};
  StTensor t[2] = {{.name = "a", .dtype = ST_F32, .rank = 1, .shape = {2}, .nbytes = 8, .data = x},
                   {.name = "a", .dtype = ST_F32, .rank = 1, .shape = {2}, .nbytes = 8, .data = x}};
  snprintf(path, sizeof path, "%s/w.safetensors", dir);
  CHECK_ERR(st_write(path, t, 2, NULL, NULL, 0, err, sizeof err), 2, err, "names must be unique");
  t[1].name = "__metadata__";
  CHECK_ERR(st_write(path, t, 2, NULL, NULL, 0, err, sizeof err), 2, err, "reserved");
  t[1].name = "b";
  t[1].nbytes = 4;
  CHECK_ERR(st_write(path, t, 2, NULL, NULL, 0, err, sizeof err), 2, err, "needs 8 bytes");
  t[1].nbytes = 8;
  t[1].data = NULL;
  CHECK_ERR(st_write(path, t, 2, NULL, NULL, 0, err, sizeof err), 2, err, "data is NULL");
  t[1].data = x;
  t[1].rank = 9;
  CHECK_ERR(st_write(path, t, 2, NULL, NULL, 0, err, sizeof err), 2, err, "rank 9");
  t[1].rank = 1;
  const char *k[2] = {"k", "k"}, *v[2] = {"1", "2"};
  CHECK_ERR(st_write(path, t, 2, k, v, 2, err, sizeof err), 2, err, "given twice");
  CHECK(access(path, F_OK) != 0); /* refusals created nothing */
  char bad[300];
  snprintf(bad, sizeof bad, "%s/no/such/dir/x.safetensors", dir);
  CHECK_ERR(st_write(bad, t, 2, NULL, NULL, 0, err, sizeof err), 1, err, "cannot create");
  /* A failed write keeps the old file intact. */
  CHECK(st_write(path, t, 2, NULL, NULL, 0, err, sizeof err) == 0);
  size_t n0, n1;
  uint8_t *before = get_file(path, &n0);
  t[1].nbytes = 3;
  CHECK(st_write(path, t, 2, NULL, NULL, 0, err, sizeof err) == 2);
  uint8_t *after = get_file(path, &n1);
  CHECK(before && after && n0 == n1 && memcmp(before, after, n0) == 0);
  free(before);
  free(after);
  unlink(path);
  StFile f;
  CHECK_ERR(st_read(path, &f, err, sizeof err), 2, err, "cannot open");   /* a missing file the user named is bad input */
  CHECK_ERR(st_read(dir, &f, err, sizeof err), 2, err, "a folder");
}

static void test_rejections(void) {
  char err[512] = "";
  StFile f;
  snprintf(path, sizeof path, "%s/bad.safetensors", dir);
  put_file(path, "\x08\0\0", 3);
  CHECK_ERR(st_read(path, &f, err, sizeof err), 2, err, "shorter than the 8-byte");
  put_file(path, "", 0);
  CHECK_ERR(st_read(path, &f, err, sizeof err), 2, err, "is 0 bytes");
  craft(path, "{}", 200000000, 0);
  CHECK_ERR(st_read(path, &f, err, sizeof err), 2, err, "over the 100 MB limit");
  put_file(path, "\xfe\xff\xff\xff\xff\xff\xff\xff{}", 10); /* 2^64-2: must not wrap */
  CHECK_ERR(st_read(path, &f, err, sizeof err), 2, err, "over the 100 MB limit");
  craft(path, "{}", 3, 0);
  CHECK_ERR(st_read(path, &f, err, sizeof err), 2, err, "runs past the end");

  REJECT("{\"a\":", 0, "not valid JSON: line 1 column");
  REJECT("", 0, "not valid JSON");
  REJECT("{} x", 0, "not valid JSON");
  REJECT("[1,2]", 0, "header is an array, not a JSON object");
  REJECT("42", 0, "header is an integer");
  REJECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
         "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2, "a key appears twice");
  REJECT("{\"a\":5}", 0, "entry is an integer, not an object");
  REJECT("{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "lacks 'dtype'");
  REJECT("{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, "lacks 'shape'");
  REJECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, "lacks 'data_offsets'");
  REJECT("{\"a\":{\"dtype\":1,\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "'dtype' must be a string");
  REJECT("{\"a\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 1, "'shape' must be an array");
  REJECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":{}}}", 1, "'data_offsets' must be an array");
  REJECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[\"1\"],\"data_offsets\":[0,1]}}", 1, "shape[0] is a string, not an integer");
  REJECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1.0],\"data_offsets\":[0,1]}}", 1, "shape[0] is a real");
  REJECT("{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "unknown dtype 'F33'");
  REJECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
         "rank 9 is over the maximum of 8");
  REJECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[2,-1],\"data_offsets\":[0,1]}}", 1, "shape[1] is negative");
  REJECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,1]}}", 1,
         "(overflow)");
  REJECT("{\"a\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,1]}}", 1,
         "(overflow)");
  REJECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1, "must be two integers");
  REJECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 1, "must be two integers");
  REJECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,\"1\"]}}", 1, "must be two integers");
  REJECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1, "non-negative with begin <= end");
  REJECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,0]}}", 1, "non-negative with begin <= end");
  REJECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,99999999999999999999]}}", 1,
         "not valid JSON"); /* jansson refuses integers past int64 */
  REJECT("{\"w\":{\"dtype\":\"F32\",\"shape\":[768,2304],\"data_offsets\":[0,100]}}", 100,
         "hold 100 bytes but F32 [768,2304] needs 7077888");
  REJECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
         "overlap tensor 'a' which ends at 8");
  REJECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "overlap");
  REJECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
         "\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,2]}}", 4, "overlap");
  REJECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}", 20,
         "bytes [8, 12) belong to no tensor");
  REJECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
         "bytes [0, 4) belong to no tensor");
  REJECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[3,3]}}", 3, "belong to no tensor");
  REJECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 5, "truncated (3 bytes missing)");
  REJECT("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 9, "1 trailing bytes");
  REJECT("{}", 1, "1 trailing bytes");
  REJECT("{\"a\":{\"dtype\":\"U8\",\"shape\":[9223372036854775807],"
         "\"data_offsets\":[0,9223372036854775807]}}", 0, "truncated");
  REJECT("{\"__metadata__\":[]}", 0, "__metadata__ is an array");
  REJECT("{\"__metadata__\":{\"k\":1}}", 0, "__metadata__ key 'k' has an integer as value");
  REJECT("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, "appears twice");
  REJECT("{\"a\\u0000b\":{}}", 0, "not valid JSON");
  REJECT("{\"\xff\":{}}", 0, "not valid JSON"); /* invalid UTF-8 */
  /* Deep nesting must not overflow the stack. */
  char deep[20000];
  size_t k = 0;
  deep[k++] = '{';
  deep[k++] = '"';
  deep[k++] = 'a';
  deep[k++] = '"';
  deep[k++] = ':';
  for (int i = 0; i < 9000; i++) deep[k++] = '[';
  deep[k] = 0;
  REJECT(deep, 0, "not valid JSON");
}

/* Every truncation of a valid file is rejected with 2. */
static void test_truncated(void) {
  char err[512];
  float x[4] = {1, 2, 3, 4};
  StTensor t = {.name = "t", .dtype = ST_F32, .rank = 2, .shape = {2, 2}, .nbytes = 16, .data = x};
  snprintf(path, sizeof path, "%s/tr.safetensors", dir);
  CHECK(st_write(path, &t, 1, NULL, NULL, 0, err, sizeof err) == 0);
  size_t n;
  uint8_t *b = get_file(path, &n);
  int ok = 1;
  for (size_t cut = 0; cut < n; cut++) {
    put_file(path, b, cut);
    StFile f;
    if (st_read(path, &f, err, sizeof err) != 2) ok = 0, fprintf(stderr, "cut %zu accepted\n", cut);
    st_close(&f);
  }
  CHECK(ok);
  put_file(path, b, n - 3);
  StFile f;
  CHECK_ERR(st_read(path, &f, err, sizeof err), 2, err, "truncated (3 bytes missing)");
  free(b);
}

/* Random byte flips in the length and header must give 0 or 2, never a crash (run under ASan). */
static void test_fuzz(void) {
  char err[512];
  float x[6] = {0};
  uint16_t h[4] = {0};
  StTensor t[3] = {{.name = "w", .dtype = ST_F32, .rank = 2, .shape = {2, 3}, .nbytes = 24, .data = x},
                   {.name = "h", .dtype = ST_F16, .rank = 1, .shape = {4}, .nbytes = 8, .data = h},
                   {.name = "e", .dtype = ST_I8, .rank = 1, .shape = {0}, .nbytes = 0}};
  const char *mk[1] = {"format"}, *mv[1] = {"pt"};
  snprintf(path, sizeof path, "%s/fz.safetensors", dir);
  CHECK(st_write(path, t, 3, mk, mv, 1, err, sizeof err) == 0);
  size_t n;
  uint8_t *orig = get_file(path, &n), *b = xalloc(n);
  size_t hend = n - 32; /* flips land in the 8 length bytes and the header */
  unsigned seed = 12345;
  int bad = 0, accepted = 0;
  for (int it = 0; it < 4000; it++) {
    memcpy(b, orig, n);
    int flips = 1 + (int)(rand_r(&seed) % 4);
    for (int j = 0; j < flips; j++) {
      size_t pos = (size_t)rand_r(&seed) % hend;
      b[pos] = (rand_r(&seed) & 1) ? (uint8_t)rand_r(&seed) : (uint8_t)(b[pos] ^ (1u << (rand_r(&seed) % 8)));
    }
    put_file(path, b, n);
    StFile f;
    int rc = st_read(path, &f, err, sizeof err);
    if (rc != 0 && rc != 2) bad++;
    if (rc == 0) {
      accepted++;
      /* Whatever was accepted must describe bytes inside the buffer. */
      for (int i = 0; i < f.n; i++)
        if ((const uint8_t *)f.tensors[i].data + f.tensors[i].nbytes > f.buf + f.size) bad++;
    }
    st_close(&f);
  }
  CHECK(bad == 0);
  CHECK(accepted < 4000);
  free(orig);
  free(b);
}

static void cleanup(void) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char p[512];
  while (d && (e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      unlink(p);
    }
  if (d) closedir(d);
  rmdir(dir);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/loom_st_XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  test_dtypes();
  test_roundtrip();
  test_write_errors();
  test_rejections();
  test_truncated();
  test_fuzz();
  /* No temp files of the atomic writer may be left behind. */
  DIR *d = opendir(dir);
  struct dirent *e;
  int tmps = 0;
  while (d && (e = readdir(d))) tmps += strstr(e->d_name, ".tmp.") != NULL;
  if (d) closedir(d);
  CHECK(tmps == 0);
  cleanup();
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail != 0;
}
