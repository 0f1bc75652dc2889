/* tests/fuzz/make_seeds.c — writes the seed files of the binary formats with loom's own
 * writers, so that every seed is a file loom really makes (plus a few damaged ones, as the
 * CLI tests make them).  Run once; the output is checked in:
 *
 *   cmake --build build --target fuzz_make_seeds loom
 *   build/loom compile tests/golden/gpt2-tiny/train_spec.json --backend cpu -o /tmp/exe-cpu
 *   build/loom compile tests/golden/llama-tiny/train_spec.json --backend cpu --mesh dp=2 -o /tmp/exe-mesh
 *   build/loom compile tests/golden/gpt2-tiny/train_spec.json --backend cuda --arch sm_90a -o /tmp/exe-cuda
 *   build/fuzz_make_seeds tests/fuzz/corpus --regressions ../regressions/payload /tmp/exe-cpu /tmp/exe-mesh /tmp/exe-cuda
 *
 * Remake the payload seeds and regressions whenever the payload or program format changes:
 * unit.test_cpu_exec fails until then (every seed must load as the runner loads it).
 * Writes corpus/safetensors/, corpus/tokens/, corpus/checkpoint/ (in fuzz_checkpoint.c's
 * container format: whole checkpoints by ckpt_save, sharded ones by ckpt_save_shards with
 * its ranks as threads) and corpus/payload/ (the tail of each executable given: payload and
 * trailer, offset 0) and, with --regressions DIR (relative to OUT_DIR), the payload
 * regressions remade from the next executable (a cpu one) by mutating its program. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/io/checkpoint.h"
#include "runtime/io/safetensors.h"
#include "runtime/io/tokens.h"
#include "tests/fuzz/payload_layout.h"
#include "tools/tools.h"

static const char *out_dir;
static char err[2048];

static void die(const char *what) {
  fprintf(stderr, "make_seeds: %s: %s\n", what, err);
  exit(1);
}

static char *path_of(const char *sub, const char *name) {
  static char p[4096];
  snprintf(p, sizeof p, "%s/%s", out_dir, sub);
  mkdir(p, 0755);
  snprintf(p, sizeof p, "%s/%s/%s", out_dir, sub, name);
  return p;
}

static uint8_t *slurp(const char *path, size_t *n) {
  uint8_t *b;
  if (rt_read_file(path, &b, n, err, sizeof err)) die(path);
  return b;
}

static void put(const char *sub, const char *name, const void *p, size_t n) {
  FILE *f = fopen(path_of(sub, name), "wb");
  if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f)) {
    snprintf(err, sizeof err, "cannot write");
    die(name);
  }
}

static void safetensors_seeds(void) {
  float a[6] = {1, 2, 3, 4, 5, 6}, b[4] = {0.5f, -1, 2, 0}, s = 3;
  uint16_t h[3] = {0x3f80, 0x4000, 0xbf80};
  StTensor t[4] = {{"a", ST_F32, 2, {2, 3}, sizeof a, a},
                   {"model.layers.0.b", ST_F32, 1, {4}, sizeof b, b},
                   {"scalar", ST_F32, 0, {0}, sizeof s, &s},
                   {"half", ST_BF16, 1, {3}, sizeof h, h}};
  const char *mk[1] = {"format"}, *mv[1] = {"pt"};
  if (st_write(path_of("safetensors", "four_tensors.safetensors"), t, 4, mk, mv, 1, err, sizeof err)) die("st_write");
  if (st_write(path_of("safetensors", "empty.safetensors"), t, 0, NULL, NULL, 0, err, sizeof err)) die("st_write");
  size_t n;
  uint8_t *f = slurp(path_of("safetensors", "four_tensors.safetensors"), &n);
  put("safetensors", "truncated.safetensors", f, n - 5);
  uint8_t huge[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{', '}'};
  put("safetensors", "header_length_huge.safetensors", huge, sizeof huge);
  uint8_t notjson[16] = {8, 0, 0, 0, 0, 0, 0, 0, 'n', 'o', 't', ' ', 'j', 's', 'o', 'n'};
  put("safetensors", "header_not_json.safetensors", notjson, sizeof notjson);
  free(f);
}

static void token_seeds(void) {
  uint32_t tok[20];
  for (int i = 0; i < 20; i++) tok[i] = (uint32_t)(i * 37 % 256);
  if (tok_write(path_of("tokens", "u16_20.bin"), tok, 20, 2, err, sizeof err)) die("tok_write");
  if (tok_write(path_of("tokens", "u32_20.bin"), tok, 20, 4, err, sizeof err)) die("tok_write");
  if (tok_write(path_of("tokens", "u16_0.bin"), tok, 0, 2, err, sizeof err)) die("tok_write");
  tok[3] = 300;   /* outside a 256 vocabulary */
  if (tok_write(path_of("tokens", "u16_vocab_300.bin"), tok, 20, 2, err, sizeof err)) die("tok_write");
  size_t n;
  uint8_t *f = slurp(path_of("tokens", "u16_20.bin"), &n);
  put("tokens", "truncated.bin", f, n - 3);
  free(f);
}

static void sharded_checkpoint_seeds(const char *js);

static void checkpoint_seeds(void) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/.ckpt-tmp", out_dir);
  float w[4] = {1, 2, 3, 4}, m[4] = {0.1f, 0.2f, 0.3f, 0.4f};
  CkptTensor p = {"w", 1, {4}, w}, s = {"adam_m.w", 1, {4}, m};
  const char *js = "{\"step\": 3, \"data\": {\"shard\": 0, \"pos\": 12}, \"seed\": 1337, \"losses\": [5.5, 5.25, "
                   "5.0], \"grad_norms\": [1, 0.9, 0.8], \"lrs\": [0.001, 0.001, 0.001], \"settings\": {}}";
  if (ckpt_save(dir, 3, &p, 1, &s, 1, js, err, sizeof err)) die("ckpt_save");
  static const char *const files[4] = {"DONE", "state.json", "model.safetensors", "optimizer.safetensors"};
  for (int flag = 0; flag < 2; flag++) {
    char *buf = NULL;
    size_t len = 0;
    FILE *o = open_memstream(&buf, &len);
    fputc(flag, o);
    for (int i = 0; i < 4; i++) {
      char fp[4200];
      snprintf(fp, sizeof fp, "%s/step_00000003/%s", dir, files[i]);
      size_t n;
      uint8_t *f = slurp(fp, &n);
      if (i) fputs("\n@@loom-fuzz-file@@\n", o);
      fwrite(f, 1, n, o);
      free(f);
    }
    fclose(o);
    put("checkpoint", flag ? "step3_done_regenerated" : "step3_done_as_saved", buf, len);
    free(buf);
  }
  char cmd[4300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd)) fprintf(stderr, "make_seeds: could not remove %s\n", dir);
  sharded_checkpoint_seeds(js);
}

/* ---- sharded checkpoints: ckpt_save_shards' ranks as threads meeting at a barrier ---- */

enum { MAX_WORLD = 4, MAX_PIECES = 3 };

typedef struct {
  const char *name, *split, *experts;   /* experts: "loom.experts.<name>" (NULL: none) */
  int rank;
  int64_t shape[2];
  float data[8];
} SeedPiece;

typedef struct {
  const char *coord;
  int n;
  SeedPiece p[MAX_PIECES];
} SeedShard;

typedef struct {
  pthread_barrier_t bar;
  uint8_t slot[MAX_WORLD][256];
} Meet;

typedef struct {
  Meet *meet;
  int rank, world, rc;
  const char *dir, *mesh, *state_json;
  const SeedShard *shard;
  char err[1024];
} SeedRank;

static int meet_gather(void *arg, const void *mine, void *all, size_t bytes, char *e, size_t elen) {
  SeedRank *r = arg;
  if (bytes > sizeof r->meet->slot[0]) {
    snprintf(e, elen, "gather of %zu bytes", bytes);
    return 1;   /* never: ckpt_save_shards exchanges a small report */
  }
  memcpy(r->meet->slot[r->rank], mine, bytes);
  pthread_barrier_wait(&r->meet->bar);
  for (int q = 0; q < r->world; q++) memcpy((uint8_t *)all + (size_t)q * bytes, r->meet->slot[q], bytes);
  pthread_barrier_wait(&r->meet->bar);
  return 0;
}

static void *seed_rank(void *arg) {
  SeedRank *r = arg;
  const SeedShard *sh = r->shard;
  StTensor t[MAX_PIECES];
  const char *keys[2 + 2 * MAX_PIECES], *vals[2 + 2 * MAX_PIECES];
  char kbuf[2 * MAX_PIECES][128];
  int nm = 0;
  keys[nm] = "loom.mesh", vals[nm++] = r->mesh;
  keys[nm] = "loom.coord", vals[nm++] = sh->coord;
  for (int i = 0; i < sh->n; i++) {
    const SeedPiece *p = &sh->p[i];
    int64_t numel = 1;
    for (int d = 0; d < p->rank; d++) numel *= p->shape[d];
    t[i] = (StTensor){(char *)p->name, ST_F32, p->rank, {p->shape[0], p->shape[1]}, (uint64_t)numel * 4, p->data};
    snprintf(kbuf[2 * i], sizeof kbuf[0], "loom.split.%s", p->name);
    keys[nm] = kbuf[2 * i], vals[nm++] = p->split;
    if (p->experts) {
      snprintf(kbuf[2 * i + 1], sizeof kbuf[0], "loom.experts.%s", p->name);
      keys[nm] = kbuf[2 * i + 1], vals[nm++] = p->experts;
    }
  }
  r->rc = ckpt_save_shards(r->dir, 3, r->rank, r->world, t, sh->n, keys, vals, nm, r->state_json, meet_gather, r,
                           r->err, sizeof r->err);
  return NULL;
}

/* Writes a step-3 sharded checkpoint of `world` ranks under dir, then the seed files NAME-FLAGS
   for each flag byte given (its DONE as saved, or regenerated by the harness: bit 0). */
static void sharded_seed(const char *name, const char *mesh, int world, const SeedShard *shards, const int *flags,
                         int n_flags, const char *js) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/.ckpt-shards-tmp", out_dir);
  Meet meet;
  pthread_barrier_init(&meet.bar, NULL, (unsigned)world);
  SeedRank r[MAX_WORLD];
  pthread_t tid[MAX_WORLD];
  for (int k = 0; k < world; k++) {
    r[k] = (SeedRank){&meet, k, world, 0, dir, mesh, js, &shards[k], ""};
    if (pthread_create(&tid[k], NULL, seed_rank, &r[k])) die("pthread_create");
  }
  for (int k = 0; k < world; k++) pthread_join(tid[k], NULL);
  pthread_barrier_destroy(&meet.bar);
  for (int k = 0; k < world; k++)
    if (r[k].rc) {
      snprintf(err, sizeof err, "%s", r[k].err);
      die("ckpt_save_shards");
    }
  for (int f = 0; f < n_flags; f++) {
    char *buf = NULL;
    size_t len = 0;
    FILE *o = open_memstream(&buf, &len);
    fputc(flags[f], o);
    for (int i = 0; i < 2 + world; i++) {
      char fp[4200], shard[64];
      snprintf(shard, sizeof shard, "shard-%05d-of-%05d.safetensors", i - 2, world);
      snprintf(fp, sizeof fp, "%s/step_00000003/%s", dir, i == 0 ? "DONE" : i == 1 ? "state.json" : shard);
      size_t n;
      uint8_t *b = slurp(fp, &n);
      if (i) fputs("\n@@loom-fuzz-file@@\n", o);
      fwrite(b, 1, n, o);
      free(b);
    }
    fclose(o);
    char seed[128];
    snprintf(seed, sizeof seed, "%s-%d", name, flags[f]);
    put("checkpoint", seed, buf, len);
    free(buf);
  }
  char cmd[4300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd)) fprintf(stderr, "make_seeds: could not remove %s\n", dir);
}

/* fuzz_checkpoint's flag byte: bit 0 DONE regenerated, bit 1 sharded, bit 2 the executor reads
   its pieces (load_shards), bit 3 its parameter is expert 1 of the stack "moe.experts.w". */
static void sharded_checkpoint_seeds(const char *js) {
  /* "w" [4] and "adam_m.w" [4] split over dp=2 along dim 0: rows 0-1 and 2-3 */
  const SeedShard dp2[2] = {
      {"0,0,0,0,0", 2, {{"w", "1,0,0,0,0", NULL, 1, {2}, {1, 2}}, {"adam_m.w", "1,0,0,0,0", NULL, 1, {2}, {0.1f, 0.2f}}}},
      {"1,0,0,0,0", 2, {{"w", "1,0,0,0,0", NULL, 1, {2}, {3, 4}}, {"adam_m.w", "1,0,0,0,0", NULL, 1, {2}, {0.3f, 0.4f}}}}};
  sharded_seed("sharded_dp2", "2,1,1,1,1", 2, dp2, (int[]){2, 3, 7}, 3, js);
  /* "w" replicated (written by coordinate 0 only), "adam_m.w" split */
  const SeedShard repl[2] = {
      {"0,0,0,0,0", 2, {{"w", "0,0,0,0,0", NULL, 1, {4}, {1, 2, 3, 4}}, {"adam_m.w", "1,0,0,0,0", NULL, 1, {2}, {0.1f, 0.2f}}}},
      {"1,0,0,0,0", 1, {{"adam_m.w", "1,0,0,0,0", NULL, 1, {2}, {0.3f, 0.4f}}}}};
  sharded_seed("sharded_replicated", "2,1,1,1,1", 2, repl, (int[]){3, 7}, 2, js);
  /* four ranks, dp=2 x tp=2: "w" split along dim 0 by both (tp the outer split: rank (d, t)
     holds element d + 2t), "adam_m.w" by tp alone (held by dp coordinate 0) */
  const SeedShard four[4] = {
      {"0,0,0,0,0", 2, {{"w", "1,1,0,0,0", NULL, 1, {1}, {1}}, {"adam_m.w", "0,1,0,0,0", NULL, 1, {2}, {0.1f, 0.2f}}}},
      {"1,0,0,0,0", 1, {{"w", "1,1,0,0,0", NULL, 1, {1}, {2}}}},
      {"0,1,0,0,0", 2, {{"w", "1,1,0,0,0", NULL, 1, {1}, {3}}, {"adam_m.w", "0,1,0,0,0", NULL, 1, {2}, {0.3f, 0.4f}}}},
      {"1,1,0,0,0", 1, {{"w", "1,1,0,0,0", NULL, 1, {1}, {4}}}}};
  sharded_seed("sharded_dp2_tp2", "2,2,1,1,1", 4, four, (int[]){3}, 1, js);
  /* a stack of 2 experts [2,4] split over ep=2 (with bit 3 the parameter is expert 1's view) */
  const SeedShard ep2[2] = {
      {"0,0,0,0,0", 2, {{"moe.experts.w", "0,0,0,0,1", "2", 2, {1, 4}, {9, 9, 9, 9}},
                        {"adam_m.w", "0,0,0,0,0", NULL, 1, {4}, {0.1f, 0.2f, 0.3f, 0.4f}}}},
      {"0,0,0,0,1", 1, {{"moe.experts.w", "0,0,0,0,1", "2", 2, {1, 4}, {1, 2, 3, 4}}}}};
  sharded_seed("sharded_ep2_experts", "1,1,1,1,2", 2, ep2, (int[]){11}, 1, js);
}

/* The payload of a compiled executable, rebuilt with offset 0 and the large parts that are
   not lowered programs (the LLVM IR, the IR, a cubin) emptied: the harness does not read
   them, and small seeds fuzz faster.  The programs (the training one and a cpu executable's
   decode program) are kept whole: the harness loads them (payload_layout.h). */
static void put_u64(FILE *o, uint64_t v) {
  for (int i = 0; i < 8; i++) fputc((int)(v >> (8 * i)) & 255, o);
}

/* Writes a payload seed (offset 0) of p's parts, part `swap` replaced by bytes[0, nb) when
   bytes is not NULL, to SUB/NAME (SUB: a folder under out_dir, or a path). */
static void write_payload(const Payload *p, const PayloadLayout *l, int swap, const unsigned char *bytes, size_t nb,
                          const char *sub, const char *name) {
  char *buf = NULL;
  size_t len = 0;
  FILE *o = open_memstream(&buf, &len);
  put_u64(o, (uint64_t)p->n_parts);
  for (int i = 0; i < p->n_parts; i++) {
    bool keep = i == 0 || i == l->program || i == l->decode || p->sizes[i] < 256;
    const void *data = i == swap && bytes ? bytes : p->parts[i];
    size_t n = i == swap && bytes ? nb : p->sizes[i];
    put_u64(o, keep ? n : 0);
    if (keep) fwrite(data, 1, n, o);
  }
  uint64_t size = (uint64_t)ftell(o);
  fwrite("LOOMPAY1", 1, 8, o);
  put_u64(o, 0);
  put_u64(o, size);
  fclose(o);
  put(sub, name, buf, len);
  free(buf);
}

/* The inputs that once failed (tests/fuzz/README.md's table), remade from a cpu executable's
   program so that they pass rt_program_load and reach the checks they were found in:
   mutations of the program's fields, saved again with rt_program_save. */
static void payload_regressions(const Payload *p, const PayloadLayout *l, const char *sub) {
  enum { STEP_COUNTS, GLOBAL_OFFSET, BUILTIN_PRODUCT, REGION_SUM, COUNTS_PAST_INPUT, N_REG };
  static const char *const names[N_REG] = {"step_buffer_count_overflow", "global_offset_overflow",
                                           "builtin_size_product_overflow", "harness_region_sum_overflow",
                                           "counts_past_the_input_oom"};
  for (int r = 0; r < N_REG; r++) {
    RtProgram prog;
    if (rt_program_load(p->parts[l->program], p->sizes[l->program], &prog, err, sizeof err)) die(names[r]);
    RtFunc *f = &prog.funcs[0];
    switch (r) {
    case STEP_COUNTS:   /* n_in + n_out overflowed int in the buffer-count check */
      f->steps[0].n_in = f->steps[0].n_out = 0x7fffffff;
      break;
    case GLOBAL_OFFSET:   /* offset + 4 * n overflowed int64 */
      prog.globals[0].offset = INT64_MAX - 64;
      break;
    case BUILTIN_PRODUCT: {   /* i[0] * i[1] * ... overflowed in the builtin checks */
      bool done = false;
      for (int fi = 0; fi < prog.n_funcs && !done; fi++)
        for (int k = 0; k < prog.funcs[fi].n_steps && !done; k++) {
          RtStep *st = &prog.funcs[fi].steps[k];
          if (st->kind != RT_STEP_BUILTIN) continue;
          for (int j = 0; j < 4; j++) st->i[j] = INT64_MAX / 3;
          done = true;
        }
      if (!done) {
        snprintf(err, sizeof err, "no builtin step in the program");
        die(names[r]);
      }
      break;
    }
    case REGION_SUM:   /* the harness's own sum of region and arena sizes overflowed */
      for (int k = 0; k < RT_REGION_COUNT; k++) prog.region_bytes[k] = 4 << 20;
      for (int fi = 0; fi < prog.n_funcs; fi++) prog.funcs[fi].arena_bytes = 4 << 20;
      break;
    default: break;
    }
    unsigned char *bytes;
    size_t nb;
    if (rt_program_save(&prog, &bytes, &nb, err, sizeof err)) die(names[r]);
    rt_program_free(&prog);
    if (r == COUNTS_PAST_INPUT) {   /* a function count far past the bytes (asked for gigabytes) */
      int32_t big = 1 << 20;
      memcpy(bytes + 12, &big, 4);   /* after the magic (8) and the step size (4): n_funcs */
    }
    write_payload(p, l, l->program, bytes, nb, sub, names[r]);
    free(bytes);
  }
}

static void payload_seed(const char *exe, int k, const char *regressions) {
  size_t n;
  uint8_t *b = slurp(exe, &n);
  Payload p;
  memset(&p, 0, sizeof p);
  if (payload_parse(&p, b, n, err, sizeof err)) die(exe);
  PayloadLayout l = payload_layout(&p);
  if (!l.kind) {
    snprintf(err, sizeof err, "%d parts: not a layout the runner reads (tests/fuzz/payload_layout.h)", p.n_parts);
    die(exe);
  }
  char name[64];
  snprintf(name, sizeof name, "executable_%d.payload", k);
  write_payload(&p, &l, -1, NULL, 0, "payload", name);
  if (regressions && l.cpu) payload_regressions(&p, &l, regressions);
  free(b);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: fuzz_make_seeds OUT_DIR [--regressions DIR] [COMPILED_EXECUTABLE...]\n");
    return 2;
  }
  out_dir = argv[1];
  mkdir(out_dir, 0755);
  safetensors_seeds();
  token_seeds();
  checkpoint_seeds();
  const char *reg = NULL;   /* the payload regressions, from the first cpu executable */
  int k = 1;
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "--regressions") && i + 1 < argc) {
      reg = argv[++i];
      continue;
    }
    payload_seed(argv[i], k++, reg);
    reg = NULL;
  }
  return 0;
}
