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
 * DONE is the first section as given.
 * Flag bit 1 set: a sharded checkpoint (checkpoint.h, "sharded checkpoints"): the sections
 * are DONE, state.json and up to 4 shards, written as shard-0000k-of-0000N.safetensors with
 * N the number of shard sections; bit 0 then writes DONE as ckpt_save_shards does (version 2,
 * "shards": N, state.json and every shard with its size and CRC-32C), so that mutations reach
 * ckpt_load_shards, the placement metadata and the merging of the pieces' runs.  The stand-in
 * executor assembles its whole views from them (restore_shards: ckpt_shards_read_range,
 * ckpt_shards_expert) or, with flag bit 2 set too, takes its pieces itself (load_shards:
 * ckpt_shards_read_piece of both halves of a dp=2 split of each tensor); with flag bit 3 set
 * too, the parameter is the view "moe.experts.1.w.weight" (expert 1 of a stack
 * "moe.experts.w": ckpt_shards_expert's range).  Bit 1 clear: the format above, whatever the
 * other bits, byte for byte as before.
 * tests/fuzz/make_seeds.c writes the seeds.
 * Invariant: a refusal has a message; an accepted resume continues to --steps 4.
 * LOOM_FUZZ_VERBOSE=1 prints what each input came to (a refusal's message, or the values). */
#include <sys/stat.h>

#include "runtime/io/checkpoint.h"
#include "runtime/io/tokens.h"
#include "runtime/trainer.h"
#include "tests/fuzz/fuzz_util.h"

#define SEP "\n@@loom-fuzz-file@@\n"
static const char *const FILES[4] = {"DONE", "state.json", "model.safetensors", "optimizer.safetensors"};
enum { MAX_SHARDS = 4, MAX_SECTIONS = 2 + MAX_SHARDS };

static float w[4], m[4];
static RtTensor params[1] = {{"w", 1, {4}, w, NULL}}, state[1] = {{"adam_m.w", 1, {4}, m, NULL}};

static int grad_step(void *self, const int32_t *in, const int32_t *tg, float *loss, char *err, size_t errlen) {
  *loss = 0.5f;
  return 0;
}
static int opt_step(void *self, float lr, float t, float *norm, char *err, size_t errlen) {
  *norm = 1.0f;
  return 0;
}

/* A CUDA rank's way in: each view's pieces of a dp=2 split along dim 0 (both ranks' halves). */
static int load_pieces(void *self, const Checkpoint *c, char *err, size_t errlen) {
  RtTensor *views[2] = {&params[0], &state[0]};
  for (int v = 0; v < 2; v++)
    for (int r = 0; r < 2; r++) {
      RtGlobal g;
      memset(&g, 0, sizeof g);
      snprintf(g.name, sizeof g.name, "%s", views[v]->name);
      g.n = 2;
      g.rank = g.ir_rank = 1;
      g.shape[0] = 4;
      g.piece_dims[0] = 2;
      g.split[0] = 1;
      const int64_t mesh[5] = {2, 1, 1, 1, 1};
      const int coord[5] = {r, 0, 0, 0, 0};
      int rc = ckpt_shards_read_piece(c, g.name, &g, mesh, coord, views[v]->data + 2 * r, err, errlen);
      if (rc) return rc;
    }
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
  const int sharded = data[0] >> 1 & 1, max_sections = sharded ? MAX_SECTIONS : 4;
  const uint8_t *sec[MAX_SECTIONS] = {0};
  size_t len[MAX_SECTIONS] = {0};
  int n = 0;
  const uint8_t *at = data + 1, *end = data + size;
  const size_t seplen = strlen(SEP);
  while (n < max_sections) {
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
  /* the step folder's files: the whole format's, or state.json and the shards */
  const int n_shards = sharded && n > 2 ? n - 2 : 0;
  char names[MAX_SECTIONS][64];
  for (int i = 0; i < max_sections; i++) {
    if (!sharded || i < 2) snprintf(names[i], sizeof names[i], "%s", FILES[i]);
    else snprintf(names[i], sizeof names[i], "shard-%05d-of-%05d.safetensors", i - 2, n_shards);
  }
  char path[700];
  for (int i = 0; i < 4; i++) {
    snprintf(path, sizeof path, "%s/%s", step_dir, FILES[i]);
    unlink(path);
  }
  for (int world = 1; world <= MAX_SHARDS; world++)
    for (int k = 0; k < world; k++) {
      snprintf(path, sizeof path, "%s/shard-%05d-of-%05d.safetensors", step_dir, k, world);
      unlink(path);
    }
  for (int i = 1; i < n; i++) {
    snprintf(path, sizeof path, "%s/%s", step_dir, names[i]);
    FILE *f = fopen(path, "wb");
    if (!f || (len[i] && fwrite(sec[i], 1, len[i], f) != len[i]) || fclose(f)) abort();
  }
  snprintf(path, sizeof path, "%s/DONE", step_dir);
  if (data[0] & 1) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (!sharded) {
      fprintf(f, "{\"format\": \"loom-checkpoint\", \"version\": 1, \"step\": 3, \"checksum\": \"crc32c\", \"files\": {");
      for (int i = 1; i < 4; i++)
        fprintf(f, "%s\"%s\": {\"bytes\": %zu, \"crc32c\": \"%08x\"}", i > 1 ? ", " : "", FILES[i], i < n ? len[i] : 0,
                i < n ? ckpt_crc32c(0, sec[i], len[i]) : 0u);
    } else {
      fprintf(f, "{\"format\": \"loom-checkpoint\", \"version\": 2, \"step\": 3, \"checksum\": \"crc32c\", "
              "\"shards\": %d, \"files\": {", n_shards);
      for (int i = 1; i < 2 + n_shards; i++)
        fprintf(f, "%s\"%s\": {\"bytes\": %zu, \"crc32c\": \"%08x\"}", i > 1 ? ", " : "", names[i], i < n ? len[i] : 0,
                i < n ? ckpt_crc32c(0, sec[i], len[i]) : 0u);
    }
    fprintf(f, "}}\n");
    if (fclose(f)) abort();
  } else if (n > 0) {
    FILE *f = fopen(path, "wb");
    if (!f || (len[0] && fwrite(sec[0], 1, len[0], f) != len[0]) || fclose(f)) abort();
  }

  memset(w, 0, sizeof w);   /* what this input restores, not the last one's */
  memset(m, 0, sizeof m);
  Executor ex = {0};
  ex.batch = 1;
  ex.seq = 4;
  ex.grad_step = grad_step;
  ex.optimizer_step = opt_step;
  ex.n_params = 1;
  ex.params = params;
  ex.n_state = 1;
  ex.state = state;
  if (sharded && data[0] & 4) ex.load_shards = load_pieces;
  params[0].name = sharded && data[0] & 8 ? "moe.experts.1.w.weight" : "w";   /* a view of a stack of experts */
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
  int rc = train_run(&ex, &o, &r, err, sizeof err);
  if (getenv("LOOM_FUZZ_VERBOSE"))   /* what each input came to (checking the seeds) */
    fprintf(stderr, "fuzz_checkpoint: %s%s w = %g %g %g %g, adam_m.w = %g %g %g %g\n", rc ? "refused: " : "resumed",
            rc ? err : ";", w[0], w[1], w[2], w[3], m[0], m[1], m[2], m[3]);
  if (rc) fuzz_check_message("resume", err);
  else if (r.n != 4) fuzz_fail("a resumed run ended after %lld steps, not 4", (long long)r.n);
  train_result_free(&r);
  return 0;
}
