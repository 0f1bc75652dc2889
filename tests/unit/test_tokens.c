/* Unit tests for runtime/tokens: llm.c token shards. */
#include "runtime/io/tokens.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "tests/unit/check.h"
#include "tests/unit/files.h"

static char dir[64];
static char path[256];

static void put32(uint8_t *p, int32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)((uint32_t)v >> (8 * i));
}

/* A shard with the given header fields and `payload` bytes of tokens (values 0..). */
static void craft(int32_t magic, int32_t version, int32_t count, size_t payload) {
  uint8_t *b = xalloc(1024 + payload);
  put32(b, magic);
  put32(b + 4, version);
  put32(b + 8, count);
  put_file(path, b, 1024 + payload);
  free(b);
}

static void test_roundtrip(int token_bytes) {
  char err[512] = "";
  enum { N = 10000 }; /* more than one writer chunk */
  static uint32_t toks[N];
  uint32_t maxv = token_bytes == 2 ? 65535u : 4294967295u;
  for (int i = 0; i < N; i++) toks[i] = (uint32_t)((uint64_t)i * 2654435761u % ((uint64_t)maxv + 1));
  toks[0] = maxv;
  toks[1] = 0;
  snprintf(path, sizeof path, "%s/rt%d.bin", dir, token_bytes);
  CHECK(tok_write(path, toks, N, token_bytes, err, sizeof err) == 0);
  size_t n;
  uint8_t *raw = get_file(path, &n);
  CHECK(raw && n == 1024 + (size_t)N * token_bytes);
  /* Header bytes exactly as llm.c writes them. */
  int32_t magic = token_bytes == 2 ? 20240520 : 20240801, version = token_bytes == 2 ? 1 : 7;
  uint8_t want[12];
  put32(want, magic);
  put32(want + 4, version);
  put32(want + 8, N);
  CHECK(raw && memcmp(raw, want, 12) == 0);
  int zeros = 1;
  for (size_t i = 12; raw && i < 1024; i++) zeros &= raw[i] == 0;
  CHECK(zeros);
  CHECK(raw && raw[1024] == 0xff && raw[1025] == 0xff); /* little-endian maxv */
  free(raw);
  TokShard s;
  int rc = tok_open(path, &s, err, sizeof err);
  CHECK(rc == 0 && s.token_bytes == token_bytes && s.count == N);
  int same = 1;
  for (int i = 0; rc == 0 && i < N; i++) same &= tok_get(&s, i) == toks[i];
  CHECK(same);
  tok_close(&s);
  CHECK(s.data == NULL && s.count == 0);
  tok_close(&s);
  /* An empty shard is valid. */
  CHECK(tok_write(path, NULL, 0, token_bytes, err, sizeof err) == 0);
  CHECK(tok_open(path, &s, err, sizeof err) == 0 && s.count == 0);
  tok_close(&s);
}

static void test_rejections(void) {
  char err[512] = "";
  TokShard s;
  snprintf(path, sizeof path, "%s/bad.bin", dir);
  put_file(path, "abc", 3);
  CHECK_ERR(tok_open(path, &s, err, sizeof err), 2, err, "shorter than the 1024-byte");
  CHECK(s.data == NULL && s.path == NULL);
  craft(12345, 1, 0, 0);
  CHECK_ERR(tok_open(path, &s, err, sizeof err), 2, err, "magic number 12345");
  CHECK(strstr(err, "20240520") && strstr(err, "20240801"));
  craft(20240520, 7, 0, 0);
  CHECK_ERR(tok_open(path, &s, err, sizeof err), 2, err, "needs version 1 but the header has version 7");
  craft(20240801, 1, 0, 0);
  CHECK_ERR(tok_open(path, &s, err, sizeof err), 2, err, "needs version 7 but the header has version 1");
  craft(20240520, 1, -5, 0);
  CHECK_ERR(tok_open(path, &s, err, sizeof err), 2, err, "count is negative");
  craft(20240520, 1, 10, 19);
  CHECK_ERR(tok_open(path, &s, err, sizeof err), 2, err, "should be 1044 bytes, but it is 1043 (truncated)");
  craft(20240801, 7, 10, 41);
  CHECK_ERR(tok_open(path, &s, err, sizeof err), 2, err, "should be 1064 bytes, but it is 1065 (trailing");
  craft(20240801, 7, 2147483647, 8);
  CHECK_ERR(tok_open(path, &s, err, sizeof err), 2, err, "truncated");
  craft(20240801, 7, 10, 40);
  CHECK(tok_open(path, &s, err, sizeof err) == 0 && s.count == 10);
  tok_close(&s);
  unlink(path);
  CHECK_ERR(tok_open(path, &s, err, sizeof err), 2, err, "cannot open");   /* a missing file the user named is bad input */
}

static void test_write_refusals(void) {
  char err[512] = "";
  uint32_t toks[4] = {1, 2, 70000, 3};
  snprintf(path, sizeof path, "%s/w.bin", dir);
  CHECK_ERR(tok_write(path, toks, 4, 2, err, sizeof err), 2, err,
            "token 70000 at position 2 does not fit in 2 bytes");
  CHECK(access(path, F_OK) != 0);
  CHECK_ERR(tok_write(path, toks, 4, 3, err, sizeof err), 2, err, "must be 2 or 4");
  CHECK_ERR(tok_write(path, toks, -1, 4, err, sizeof err), 2, err, "split the data");
  CHECK_ERR(tok_write(path, toks, 3000000000LL, 4, err, sizeof err), 2, err, "split the data");
  CHECK(access(path, F_OK) != 0);
  CHECK(tok_write(path, toks, 4, 4, err, sizeof err) == 0);
  char bad[300];
  snprintf(bad, sizeof bad, "%s/missing/w.bin", dir);
  CHECK_ERR(tok_write(bad, toks, 4, 4, err, sizeof err), 1, err, "cannot create");
}

static void test_vocab(void) {
  char err[512] = "";
  uint32_t toks[100];
  for (int i = 0; i < 100; i++) toks[i] = (uint32_t)i * 7 % 1000;
  toks[56] = 1234;
  toks[80] = 5000;
  snprintf(path, sizeof path, "%s/tokens.bin", dir);
  CHECK(tok_write(path, toks, 100, 2, err, sizeof err) == 0);
  TokShard s;
  CHECK(tok_open(path, &s, err, sizeof err) == 0);
  CHECK_ERR(tok_check_vocab(&s, 1000, err, sizeof err), 2, err,
            "tokens.bin: token 1234 at position 56 is outside the model's vocabulary of 1000");
  CHECK(strstr(err, "another tokenizer"));
  CHECK(tok_check_vocab(&s, 5001, err, sizeof err) == 0);
  CHECK_ERR(tok_check_vocab(&s, 5000, err, sizeof err), 2, err, "token 5000 at position 80");
  CHECK_ERR(tok_check_vocab(&s, 0, err, sizeof err), 2, err, "must be positive");
  tok_close(&s);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/loom_tok_XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  test_roundtrip(2);
  test_roundtrip(4);
  test_rejections();
  test_write_refusals();
  test_vocab();
  DIR *d = opendir(dir);
  struct dirent *e;
  char p[512];
  int left = 0;
  while (d && (e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
      left += strstr(e->d_name, ".tmp.") != NULL; /* the atomic writer left a temp file */
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      unlink(p);
    }
  if (d) closedir(d);
  rmdir(dir);
  CHECK(left == 0);
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail != 0;
}
