/* tests/fuzz/fuzz_checkpoint.c — checkpoint folders, through the real resume path: train_run
 * with --resume on a save dir holding one step folder (ckpt_latest, ckpt_load: DONE, the
 * CRC-32C checks, both safetensors files, state.json; then restoring parameters, moments,
 * history and the data position) with a stand-in executor whose model is one parameter "w"
 * [4] and one moment "adam_m.w" [4].
 *
 * Input: one flag byte, then the files separated by the line "@@loom-fuzz-file@@":
 * DONE, state.json, model.safetensors, optimizer.safetensors (a missing section: the file
 * is absent).  Flag bit 0 set: DONE is written afresh from the other files (sizes and
 * CRC-32C right, step 3), so that mutations reach the readers behind the checksum; clear:
 * DONE is the first section as given.  tests/fuzz/make_seeds.c writes the seeds.
 * Invariant: a refusal has a message; an accepted resume continues to --steps 4. */
#include <sys/stat.h>

#include "runtime/io/checkpoint.h"
#include "runtime/io/tokens.h"
#include "runtime/trainer.h"
#include "tests/fuzz/fuzz_util.h"

#define SEP "\n@@loom-fuzz-file@@\n"
static const char *const FILES[4] = {"DONE", "state.json", "model.safetensors", "optimizer.safetensors"};

static float w[4], m[4];
static RtTensor params[1] = {{"w", 1, {4}, w}}, state[1] = {{"adam_m.w", 1, {4}, m}};

static int grad_step(void *self, const int32_t *in, const int32_t *tg, float *loss, char *err, size_t errlen) {
  *loss = 0.5f;
  return 0;
}
static int opt_step(void *self, float lr, float t, float *norm, char *err, size_t errlen) {
  *norm = 1.0f;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  static char save[512], step_dir[600], shard[600];
  if (!save[0]) {
    snprintf(save, sizeof save, "%s/ckpt", fuzz_tmp());
    snprintf(step_dir, sizeof step_dir, "%s/step_00000003", save);
    snprintf(shard, sizeof shard, "%s/data.bin", fuzz_tmp());
    uint32_t toks[64];
    for (int i = 0; i < 64; i++) toks[i] = (uint32_t)(i * 7 % 256);
    char err[512];
    if (mkdir(save, 0700) || mkdir(step_dir, 0700) || tok_write(shard, toks, 64, 2, err, sizeof err)) abort();
  }
  /* split */
  const uint8_t *sec[4] = {0};
  size_t len[4] = {0};
  int n = 0;
  const uint8_t *at = data + 1, *end = data + size;
  const size_t seplen = strlen(SEP);
  while (n < 4) {
    const uint8_t *hit = NULL;
    for (const uint8_t *p = at; p + seplen <= end; p++)
      if (!memcmp(p, SEP, seplen)) {
        hit = p;
        break;
      }
    sec[n] = at;
    len[n] = (size_t)((hit ? hit : end) - at);
    n++;
    if (!hit) break;
    at = hit + seplen;
  }
  char path[700];
  for (int i = 0; i < 4; i++) {
    snprintf(path, sizeof path, "%s/%s", step_dir, FILES[i]);
    unlink(path);
  }
  for (int i = 1; i < n; i++) {
    snprintf(path, sizeof path, "%s/%s", step_dir, FILES[i]);
    FILE *f = fopen(path, "wb");
    if (!f || (len[i] && fwrite(sec[i], 1, len[i], f) != len[i]) || fclose(f)) abort();
  }
  snprintf(path, sizeof path, "%s/DONE", step_dir);
  if (data[0] & 1) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    fprintf(f, "{\"format\": \"loom-checkpoint\", \"version\": 1, \"step\": 3, \"checksum\": \"crc32c\", \"files\": {");
    for (int i = 1; i < 4; i++)
      fprintf(f, "%s\"%s\": {\"bytes\": %zu, \"crc32c\": \"%08x\"}", i > 1 ? ", " : "", FILES[i], i < n ? len[i] : 0,
              i < n ? ckpt_crc32c(0, sec[i], len[i]) : 0u);
    fprintf(f, "}}\n");
    if (fclose(f)) abort();
  } else if (n > 0) {
    FILE *f = fopen(path, "wb");
    if (!f || (len[0] && fwrite(sec[0], 1, len[0], f) != len[0]) || fclose(f)) abort();
  }

  Executor ex = {0};
  ex.batch = 1;
  ex.seq = 4;
  ex.grad_step = grad_step;
  ex.optimizer_step = opt_step;
  ex.n_params = 1;
  ex.params = params;
  ex.n_state = 1;
  ex.state = state;
  const char *paths[1] = {shard};
  TrainOptions o = {0};
  o.steps = 4;
  o.grad_accum = 1;
  o.lr = 1e-3;
  o.data = paths;
  o.n_data = 1;
  o.vocab = 256;
  o.resume = save;
  o.settings_json = "{}";
  TrainResult r;
  char err[2048] = "";
  if (train_run(&ex, &o, &r, err, sizeof err)) fuzz_check_message("resume", err);
  else if (r.n != 4) fuzz_fail("a resumed run ended after %lld steps, not 4", (long long)r.n);
  train_result_free(&r);
  return 0;
}
