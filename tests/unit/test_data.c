/* Unit tests for runtime/data: the training data loader's exact window order, checked
 * against the PyTorch goldens' train.json ("windows": [shard, pos] of each micro-batch). */
#include "runtime/io/data.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "tests/unit/check.h"

/* Replays train.json's windows through the loader and checks positions and token values
 * against an independent tok_open of each shard. */
static void test_golden(const char *dir, int n_shards_want) {
  char jp[256];
  snprintf(jp, sizeof jp, "%s/train.json", dir);
  json_error_t je;
  json_t *root = json_load_file(jp, 0, &je);
  if (!root) {
    fprintf(stderr, "%s: %s\n", jp, je.text);
    n_fail++;
    return;
  }
  int64_t B = json_integer_value(json_object_get(root, "B"));
  int64_t T = json_integer_value(json_object_get(root, "T"));
  json_t *data = json_object_get(root, "data"), *win = json_object_get(root, "windows");
  int n = (int)json_array_size(data);
  CHECK(n == n_shards_want);
  char paths[4][256];
  const char *pp[4];
  TokShard ref[4];
  for (int i = 0; i < n && i < 4; i++) {
    snprintf(paths[i], sizeof paths[i], "%s/%s", dir,
             json_string_value(json_array_get(data, i)));
    pp[i] = paths[i];
    char err[512] = "";
    CHECK(tok_open(paths[i], &ref[i], err, sizeof err) == 0);
  }
  DataLoader d;
  char err[512] = "";
  int rc = data_open(&d, pp, n, B, T, 256, err, sizeof err);
  CHECK(rc == 0);
  if (rc) {
    fprintf(stderr, "%s\n", err);
  } else {
    int64_t BT = B * T;
    int32_t *in = malloc(BT * sizeof *in), *tg = malloc(BT * sizeof *tg);
    for (size_t w = 0; w < json_array_size(win); w++) {
      int ws = (int)json_integer_value(json_array_get(json_array_get(win, w), 0));
      int64_t wp = json_integer_value(json_array_get(json_array_get(win, w), 1));
      data_next(&d, in, tg);
      int s;
      int64_t p;
      data_get_position(&d, &s, &p); /* the cursor sits right after the window taken */
      CHECK(s == ws && p - BT == wp);
      if (s != ws || p - BT != wp)
        fprintf(stderr, "  %s window %zu: want [%d,%lld], got [%d,%lld]\n", dir, w, ws,
                (long long)wp, s, (long long)(p - BT));
      int same = 1;
      for (int64_t i = 0; i < BT; i++)
        same &= in[i] == (int32_t)tok_get(&ref[ws], wp + i) &&
                tg[i] == (int32_t)tok_get(&ref[ws], wp + i + 1);
      CHECK(same);
    }
    free(in);
    free(tg);
  }
  data_close(&d);
  for (int i = 0; i < n && i < 4; i++) tok_close(&ref[i]);
  json_decref(root);
}

/* Resuming from a saved cursor must give exactly the windows an uninterrupted run gives. */
static void test_resume(void) {
  const char *pp[] = {"tests/golden/llama-tiny/train_0.bin", "tests/golden/llama-tiny/train_1.bin"};
  DataLoader a, b;
  char err[512] = "";
  CHECK(data_open(&a, pp, 2, 2, 32, 256, err, sizeof err) == 0);
  CHECK(data_open(&b, pp, 2, 2, 32, 256, err, sizeof err) == 0);
  int32_t ia[64], ta[64], ib[64], tb[64];
  for (int i = 0; i < 4; i++) data_next(&a, ia, ta);
  int s;
  int64_t p;
  data_get_position(&a, &s, &p);
  CHECK(data_set_position(&b, s, p, err, sizeof err) == 0);
  int same = 1;
  for (int i = 0; i < 7; i++) {
    data_next(&a, ia, ta);
    data_next(&b, ib, tb);
    same &= !memcmp(ia, ib, sizeof ia) && !memcmp(ta, tb, sizeof ta);
  }
  CHECK(same);
  /* A position at the very end is valid (the next call moves on); past it is not. */
  CHECK(data_set_position(&b, 0, 150, err, sizeof err) == 0);
  data_next(&b, ib, tb);
  data_get_position(&b, &s, &p);
  CHECK(s == 1 && p == 64);
  CHECK_ERR(data_set_position(&b, 0, 151, err, sizeof err), 2, err, "outside this shard");
  CHECK_ERR(data_set_position(&b, 2, 0, err, sizeof err), 2, err, "shard 2");
  CHECK_ERR(data_set_position(&b, -1, 0, err, sizeof err), 2, err, "same data files");
  data_get_position(&b, &s, &p); /* unchanged by the refusals */
  CHECK(s == 1 && p == 64);
  data_close(&a);
  data_close(&b);
}

static void test_errors(void) {
  const char *pp[] = {"tests/golden/llama-tiny/train_0.bin", "tests/golden/llama-tiny/train_1.bin"};
  DataLoader d;
  char err[512] = "";
  /* 150 tokens cannot hold 2*100+1 */
  CHECK_ERR(data_open(&d, pp, 2, 2, 100, 256, err, sizeof err), 2, err,
            "train_0.bin: shard holds 150 tokens but one batch needs B*T+1 = 201");
  CHECK(strstr(err, "--batch") && strstr(err, "--seq"));
  CHECK(d.shards == NULL && d.n_shards == 0);
  /* 2*75+1 = 151: only the first shard (150 tokens) is too small, and it is named */
  CHECK_ERR(data_open(&d, pp, 2, 2, 75, 256, err, sizeof err), 2, err, "train_0.bin");
  CHECK_ERR(data_open(&d, pp, 2, 1, 64, 10, err, sizeof err), 2, err, "vocabulary of 10");
  const char *missing[] = {"tests/golden/llama-tiny/train_0.bin", "/nonexistent/x.bin"};
  int rc = data_open(&d, missing, 2, 1, 8, 256, err, sizeof err); /* 1 or 2: tokens.c decides */
  CHECK(rc != 0 && strstr(err, "/nonexistent/x.bin") && d.shards == NULL);
  CHECK_ERR(data_open(&d, pp, 0, 1, 8, 256, err, sizeof err), 2, err, "no token shards");
  CHECK_ERR(data_open(&d, pp, 2, 0, 8, 256, err, sizeof err), 2, err, "batch 0");
  CHECK_ERR(data_open(&d, pp, 2, 1, 8, 0, err, sizeof err), 2, err, "vocabulary");
  data_close(&d); /* safe on a zeroed loader */
}

int main(void) {
  test_golden("tests/golden/llama-tiny", 2);
  test_golden("tests/golden/gpt2-tiny", 1);
  test_resume();
  test_errors();
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail != 0;
}
