/* Unit tests for runtime/textdata: byte-level text -> llm.c shard, and the demo text in
 * data/ that the training demo reads. */
#include "runtime/io/data.h"
#include "runtime/io/textdata.h"
#include "runtime/io/tokens.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "tests/unit/check.h"
#include "tests/unit/files.h"

static char dir[64];

static const char *in_dir(char *buf, size_t n, const char *name) {
  snprintf(buf, n, "%s/%s", dir, name);
  return buf;
}

/* The shard holds exactly WANT as uint16 tokens, one per byte. */
static int shard_is(const char *path, const uint8_t *want, size_t n) {
  TokShard s;
  char err[512] = "";
  if (tok_open(path, &s, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 0;
  }
  int ok = s.token_bytes == 2 && s.count == (int64_t)n;
  for (size_t i = 0; ok && i < n; i++) ok = tok_get(&s, (int64_t)i) == want[i];
  /* header: magic 20240520 = 0x0134D888 little-endian, then version 1 */
  ok = ok && s.file[0] == 0x88 && s.file[1] == 0xD8 && s.file[2] == 0x34 && s.file[3] == 0x01 &&
       s.file[4] == 1;
  tok_close(&s);
  return ok;
}

static void test_roundtrip(void) {
  char a[128], b[128], e[128], out[128], err[512] = "";
  /* every byte value, including NUL and bytes that are not UTF-8 */
  uint8_t all[256 + 12];
  for (int i = 0; i < 256; i++) all[i] = (uint8_t)i;
  memcpy(all + 256, "Hello,\nworld", 12);
  put_file(in_dir(a, sizeof a, "a.txt"), all, 256);
  put_file(in_dir(b, sizeof b, "b.txt"), all + 256, 12);
  put_file(in_dir(e, sizeof e, "empty.txt"), "", 0);
  const char *paths[] = {a, e, b}; /* an empty file in between adds nothing */
  int64_t n = -1;
  in_dir(out, sizeof out, "out.bin");
  CHECK(text_to_shard(paths, 3, out, &n, err, sizeof err) == 0);
  CHECK(n == 268);
  CHECK(shard_is(out, all, 268));
  CHECK(text_bytes_to_shard(all + 256, 12, out, &n, err, sizeof err) == 0);
  CHECK(n == 12 && shard_is(out, all + 256, 12));
  /* the shard feeds the loader with the byte vocabulary */
  DataLoader d;
  const char *shards[] = {out};
  CHECK(data_open(&d, shards, 1, 1, 11, TEXT_VOCAB, err, sizeof err) == 0);
  int32_t in[11], tg[11];
  data_next(&d, in, tg);
  CHECK(in[0] == 'H' && tg[0] == 'e' && tg[10] == 'd');
  data_close(&d);
}

static void test_refusals(void) {
  char e[128], out[128], err[512] = "";
  in_dir(e, sizeof e, "empty.txt");
  in_dir(out, sizeof out, "refused.bin");
  const char *one[] = {e};
  CHECK_ERR(text_to_shard(one, 1, out, NULL, err, sizeof err), 2, err, "empty.txt is empty");
  const char *two[] = {e, e};
  CHECK_ERR(text_to_shard(two, 2, out, NULL, err, sizeof err), 2, err, "every input file is empty");
  CHECK_ERR(text_bytes_to_shard((const uint8_t *)"", 0, out, NULL, err, sizeof err), 2, err,
            "no text to write");
  const char *missing[] = {"/nonexistent/text.txt"};
  int rc = text_to_shard(missing, 1, out, NULL, err, sizeof err); /* 1 or 2: rt_read_file decides */
  CHECK(rc != 0 && strstr(err, "/nonexistent/text.txt"));
  CHECK_ERR(text_to_shard(one, 0, out, NULL, err, sizeof err), 2, err, "no text files");
  CHECK(access(out, F_OK) != 0); /* a refusal writes nothing */
  CHECK_ERR(text_bytes_to_shard((const uint8_t *)"ab", 2, "/nonexistent/dir/x.bin", NULL, err,
                                sizeof err), 1, err, "/nonexistent/dir/x.bin");
}

/* data/shakespeare.txt is the demo's training text: 100-400 KB of plain ASCII lines. */
static void test_demo_text(void) {
  char out[128], err[512] = "";
  const char *paths[] = {"data/shakespeare.txt"};
  int64_t n = 0;
  int rc = text_to_shard(paths, 1, in_dir(out, sizeof out, "demo.bin"), &n, err, sizeof err);
  CHECK(rc == 0);
  if (rc) {
    fprintf(stderr, "%s\n", err);
    return;
  }
  CHECK(n >= 100000 && n <= 400000);
  TokShard s;
  CHECK(tok_open(out, &s, err, sizeof err) == 0);
  int ascii = 1;
  for (int64_t i = 0; i < s.count; i++) {
    uint32_t t = tok_get(&s, i);
    ascii &= (t >= 32 && t < 127) || t == '\n';
  }
  CHECK(ascii);
  CHECK(s.count > 0 && tok_get(&s, s.count - 1) == '\n');
  tok_close(&s);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/loom_text_XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  test_roundtrip();
  test_refusals();
  test_demo_text();
  const char *names[] = {"a.txt", "b.txt", "empty.txt", "out.bin", "demo.bin"};
  char p[128];
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) unlink(in_dir(p, sizeof p, names[i]));
  CHECK(rmdir(dir) == 0); /* fails if a writer left a temp file behind */
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail != 0;
}
