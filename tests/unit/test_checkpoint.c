/* Unit tests for runtime/checkpoint: round trip, choice of the newest complete step,
 * refusal of damaged checkpoints, writers killed with SIGKILL at random moments, and sharded
 * checkpoints (ckpt_save_shards with its ranks as threads, read back in other layouts). */
#include "runtime/io/checkpoint.h"

#include <dirent.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "tests/unit/check.h"

static char root[64];

static const char *P(const char *fmt, const char *a, const char *b) {
  static char buf[8][1100]; /* a few transient paths at once (room for a 512-byte path and a name); test scaffolding only */
  static int k;
  k = (k + 1) % 8;
  snprintf(buf[k], sizeof buf[k], fmt, a, b);
  return buf[k];
}

static void rm_rf(const char *p) {
  struct stat st;
  if (lstat(p, &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    DIR *d = opendir(p);
    struct dirent *e;
    while (d && (e = readdir(d))) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      char q[1024];
      snprintf(q, sizeof q, "%s/%s", p, e->d_name);
      rm_rf(q);
    }
    if (d) closedir(d);
  }
  remove(p);
}

static int exists(const char *p) {
  struct stat st;
  return stat(p, &st) == 0;
}

/* Entries of DIR that a writer uses on the side (temp folders and files, moved-aside steps). */
static int side_entries(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  int n = 0;
  while (d && (e = readdir(d))) n += strstr(e->d_name, ".tmp.") || strstr(e->d_name, ".old.");
  if (d) closedir(d);
  return n;
}

/* Small model: two params and their Adam moments, values depending on a seed. */
typedef struct {
  float w[12], b[5], s; /* [3,4], [5], scalar */
  float m[12], v[12];
  CkptTensor params[3], state[2];
} Small;

static void small_init(Small *m, float seed) {
  for (int i = 0; i < 12; i++) m->w[i] = seed + i * 0.25f, m->m[i] = -seed * i, m->v[i] = 1e-8f * i;
  for (int i = 0; i < 5; i++) m->b[i] = seed / (i + 1);
  m->s = seed;
  m->params[0] = (CkptTensor){"h.0.attn.c_attn.weight", 2, {3, 4}, m->w};
  m->params[1] = (CkptTensor){"h.0.attn.c_attn.bias", 1, {5}, m->b};
  m->params[2] = (CkptTensor){"scale", 0, {0}, &m->s};
  m->state[0] = (CkptTensor){"adam_m.h.0.attn.c_attn.weight", 2, {3, 4}, m->m};
  m->state[1] = (CkptTensor){"adam_v.h.0.attn.c_attn.weight", 2, {3, 4}, m->v};
}

static int save_small(const char *dir, int64_t step, float seed) {
  Small m;
  small_init(&m, seed);
  char js[128], err[512] = "";
  snprintf(js, sizeof js, "{\"step\": %lld, \"data\": [0, 64], \"rng\": 42}", (long long)step);
  int rc = ckpt_save(dir, step, m.params, 3, m.state, 2, js, err, sizeof err);
  if (rc) fprintf(stderr, "ckpt_save: %s\n", err);
  return rc;
}

static int tensor_is(const StFile *f, const char *name, const float *data, int64_t numel) {
  const StTensor *t = st_find(f, name);
  return t && t->dtype == ST_F32 && t->nbytes == (uint64_t)numel * 4 &&
         !memcmp(t->data, data, (size_t)numel * 4);
}

static void test_crc(void) {
  CHECK(ckpt_crc32c(0, "123456789", 9) == 0xE3069283u);
  CHECK(ckpt_crc32c(0, "", 0) == 0);
  /* chaining equals one pass, across the 8-byte fast path boundary */
  const char *s = "The quick brown fox jumps over the lazy dog";
  CHECK(ckpt_crc32c(ckpt_crc32c(0, s, 13), s + 13, strlen(s) - 13) == ckpt_crc32c(0, s, strlen(s)));
  CHECK(ckpt_crc32c(0, s, strlen(s)) == 0x22620404u);
}

static void test_roundtrip(void) {
  char dir[256], sd[300];
  snprintf(dir, sizeof dir, "%s/rt/nested", root); /* parents are created */
  snprintf(sd, sizeof sd, "%s/step_00000012", dir);
  CHECK(save_small(dir, 12, 1.5f) == 0);
  CHECK(exists(P("%s/%s", sd, "DONE")));
  CHECK(side_entries(dir) == 0 && side_entries(sd) == 0);
  Checkpoint c;
  char err[512] = "";
  int rc = ckpt_load(sd, &c, err, sizeof err);
  CHECK(rc == 0);
  if (rc) fprintf(stderr, "%s\n", err);
  Small m;
  small_init(&m, 1.5f);
  CHECK(c.step == 12);
  CHECK(c.params.n == 3 && c.state.n == 2);
  CHECK(tensor_is(&c.params, "h.0.attn.c_attn.weight", m.w, 12));
  CHECK(tensor_is(&c.params, "h.0.attn.c_attn.bias", m.b, 5));
  CHECK(tensor_is(&c.params, "scale", &m.s, 1));
  CHECK(st_find(&c.params, "scale") && st_find(&c.params, "scale")->rank == 0);
  const StTensor *w = st_find(&c.params, "h.0.attn.c_attn.weight");
  CHECK(w && w->rank == 2 && w->shape[0] == 3 && w->shape[1] == 4);
  CHECK(tensor_is(&c.state, "adam_m.h.0.attn.c_attn.weight", m.m, 12));
  CHECK(tensor_is(&c.state, "adam_v.h.0.attn.c_attn.weight", m.v, 12));
  CHECK(c.state_json && !strcmp(c.state_json, "{\"step\": 12, \"data\": [0, 64], \"rng\": 42}"));
  ckpt_free(&c);
  ckpt_free(&c); /* zeroed: safe again */

  /* Saving the same step again replaces it, leaving no side folders. */
  CHECK(save_small(dir, 12, 2.5f) == 0);
  CHECK(ckpt_load(sd, &c, err, sizeof err) == 0);
  small_init(&m, 2.5f);
  CHECK(tensor_is(&c.params, "h.0.attn.c_attn.weight", m.w, 12));
  ckpt_free(&c);
  CHECK(side_entries(dir) == 0 && side_entries(sd) == 0);

  /* Bad arguments are refused before anything is written. */
  Small s;
  small_init(&s, 0);
  CHECK_ERR(ckpt_save(dir, 13, s.params, 3, s.state, 2, "{not json", err, sizeof err), 2, err,
            "not valid JSON");
  s.params[1].rank = -1;
  CHECK_ERR(ckpt_save(dir, 13, s.params, 3, s.state, 2, "{}", err, sizeof err), 2, err,
            "h.0.attn.c_attn.bias");
  s.params[1].rank = 1;
  s.params[1].name = s.params[0].name;
  CHECK_ERR(ckpt_save(dir, 13, s.params, 3, s.state, 2, "{}", err, sizeof err), 2, err,
            "unique");
  CHECK(!exists(P("%s/%s", dir, "step_00000013")));
  CHECK_ERR(ckpt_save(dir, -1, s.params, 3, s.state, 2, "{}", err, sizeof err), 2, err, "step");
}

static void test_latest(void) {
  char dir[256], err[512] = "", sd[512];
  snprintf(dir, sizeof dir, "%s/latest", root);
  int64_t step = -1;
  CHECK_ERR(ckpt_latest(dir, sd, sizeof sd, &step, err, sizeof err), 2, err,
            "No such file or directory; pass the --save-dir folder");
  CHECK(save_small(dir, 1, 1) == 0);
  CHECK(save_small(dir, 5, 5) == 0);
  CHECK(save_small(dir, 3, 3) == 0);
  /* newer but unfinished: a step folder without DONE, and a writer's temp folder with one */
  CHECK(mkdir(P("%s/%s", dir, "step_00000009"), 0777) == 0);
  CHECK(save_small(P("%s/%s", root, "latest_tmp"), 7, 7) == 0);
  CHECK(rename(P("%s/%s", root, "latest_tmp/step_00000007"),
               P("%s/%s", dir, "step_00000007.tmp.4242")) == 0);
  CHECK(mkdir(P("%s/%s", dir, "notes"), 0777) == 0);
  int rc = ckpt_latest(dir, sd, sizeof sd, &step, err, sizeof err);
  CHECK(rc == 0 && step == 5 && !strcmp(sd, P("%s/%s", dir, "step_00000005")));
  CHECK(strstr(err, "skipped 1 checkpoint folder without a DONE marker (newest step 9"));
  /* a step folder itself */
  rc = ckpt_latest(P("%s/%s", dir, "step_00000003"), sd, sizeof sd, &step, err, sizeof err);
  CHECK(rc == 0 && step == 3 && err[0] == 0);
  CHECK_ERR(ckpt_latest(P("%s/%s", dir, "step_00000009"), sd, sizeof sd, &step, err, sizeof err),
            2, err, "incomplete checkpoint: the writer did not finish");
  CHECK_ERR(ckpt_latest(P("%s/%s/", dir, "step_00000009"), sd, sizeof sd, &step, err, sizeof err),
            2, err, "incomplete checkpoint");
  rc = ckpt_latest(P("%s/", dir, ""), sd, sizeof sd, &step, err, sizeof err); /* trailing slash */
  CHECK(rc == 0 && step == 5 && !strcmp(sd, P("%s/%s", dir, "step_00000005")));
  /* no complete one at all */
  char empty[256];
  snprintf(empty, sizeof empty, "%s/latest_empty", root);
  CHECK(mkdir(empty, 0777) == 0 && mkdir(P("%s/%s", empty, "step_00000002"), 0777) == 0);
  CHECK_ERR(ckpt_latest(empty, sd, sizeof sd, &step, err, sizeof err), 2, err,
            "no complete checkpoint");
  char tiny[8];
  CHECK_ERR(ckpt_latest(dir, tiny, sizeof tiny, &step, err, sizeof err), 1, err, "too long");

  /* prune keeps the newest complete ones and leaves unfinished folders alone */
  CHECK(ckpt_prune(dir, 2, err, sizeof err) == 0);
  CHECK(exists(P("%s/%s", dir, "step_00000005")) && exists(P("%s/%s", dir, "step_00000003")));
  CHECK(!exists(P("%s/%s", dir, "step_00000001")));
  CHECK(exists(P("%s/%s", dir, "step_00000009")));
  CHECK_ERR(ckpt_prune(dir, 0, err, sizeof err), 2, err, "at least 1");
}

/* Overwrites one byte of a file at OFF from its end (OFF >= 1). */
static void flip_byte_from_end(const char *p, long off) {
  FILE *f = fopen(p, "r+b");
  if (!f || fseek(f, -off, SEEK_END) != 0) {
    fprintf(stderr, "cannot open %s\n", p);
    exit(1);
  }
  int c = fgetc(f);
  fseek(f, -off, SEEK_END);
  fputc(c ^ 0x01, f);
  fclose(f);
}

static void test_damage(void) {
  char dir[256], err[512] = "";
  snprintf(dir, sizeof dir, "%s/damage", root);
  Checkpoint c;
  for (int s = 1; s <= 4; s++) CHECK(save_small(dir, s, (float)s) == 0);
  /* truncated model */
  const char *m = P("%s/%s", dir, "step_00000001/model.safetensors");
  struct stat st;
  CHECK(stat(m, &st) == 0 && truncate(m, st.st_size - 4) == 0);
  CHECK_ERR(ckpt_load(P("%s/%s", dir, "step_00000001"), &c, err, sizeof err), 2, err,
            "model.safetensors is corrupt");
  CHECK(strstr(err, "truncated"));
  CHECK(c.params.buf == NULL && c.state_json == NULL);
  /* one flipped bit in the optimizer's data: still a valid safetensors file */
  const char *o = P("%s/%s", dir, "step_00000002/optimizer.safetensors");
  flip_byte_from_end(o, 3);
  StFile f;
  CHECK(st_read(o, &f, err, sizeof err) == 0);
  st_close(&f);
  CHECK_ERR(ckpt_load(P("%s/%s", dir, "step_00000002"), &c, err, sizeof err), 2, err,
            "optimizer.safetensors is corrupt: checksum mismatch");
  CHECK(strstr(err, "changed or damaged after it was written"));
  /* a damaged header: the checksum is named rather than the parse error */
  const char *h = P("%s/%s", dir, "step_00000003/model.safetensors");
  FILE *fp = fopen(h, "r+b");
  fseek(fp, 8, SEEK_SET);
  fputc('[', fp);
  fclose(fp);
  CHECK_ERR(ckpt_load(P("%s/%s", dir, "step_00000003"), &c, err, sizeof err), 2, err,
            "checksum mismatch");
  /* state.json changed */
  const char *sj = P("%s/%s", dir, "step_00000004/state.json");
  flip_byte_from_end(sj, 2);
  CHECK_ERR(ckpt_load(P("%s/%s", dir, "step_00000004"), &c, err, sizeof err), 2, err,
            "state.json is corrupt: checksum mismatch");
  /* DONE deleted */
  CHECK(save_small(dir, 5, 5) == 0);
  CHECK(ckpt_load(P("%s/%s", dir, "step_00000005"), &c, err, sizeof err) == 0);
  ckpt_free(&c);
  CHECK(unlink(P("%s/%s", dir, "step_00000005/DONE")) == 0);
  CHECK_ERR(ckpt_load(P("%s/%s", dir, "step_00000005"), &c, err, sizeof err), 2, err,
            "incomplete checkpoint: the writer did not finish");
  /* a file deleted */
  CHECK(save_small(dir, 6, 6) == 0);
  CHECK(unlink(P("%s/%s", dir, "step_00000006/optimizer.safetensors")) == 0);
  CHECK_ERR(ckpt_load(P("%s/%s", dir, "step_00000006"), &c, err, sizeof err), 2, err,
            "optimizer.safetensors is missing");
  /* a damaged DONE */
  CHECK(save_small(dir, 7, 7) == 0);
  flip_byte_from_end(P("%s/%s", dir, "step_00000007/DONE"), 2); /* the closing brace */
  CHECK_ERR(ckpt_load(P("%s/%s", dir, "step_00000007"), &c, err, sizeof err), 2, err,
            "DONE marker is unreadable or damaged");
}

/* ---- sharded checkpoints: ckpt_save_shards' ranks as threads meeting at a barrier ---- */

enum { MAX_WORLD = 4, MAX_PIECES = 4 };

typedef struct {
  pthread_barrier_t bar;
  uint8_t slot[MAX_WORLD][256];
} Meet;

typedef struct {
  const char *name, *split, *experts;   /* experts: "loom.experts.<name>" (NULL: none) */
  int rank;
  int64_t shape[2];
  const float *data;
} Piece;

typedef struct {
  const char *coord;
  int n;
  Piece p[MAX_PIECES];
} Shard;

typedef struct {
  Meet *meet;
  int rank, world, rc;
  const char *dir, *mesh;
  int64_t step;
  const Shard *shard;
  char err[1024];
} Rank;

static int meet_gather(void *arg, const void *mine, void *all, size_t bytes, char *err, size_t errlen) {
  Rank *r = arg;
  if (bytes > sizeof r->meet->slot[0]) {
    snprintf(err, errlen, "gather of %zu bytes", bytes);
    return 1;
  }
  memcpy(r->meet->slot[r->rank], mine, bytes);
  pthread_barrier_wait(&r->meet->bar);
  for (int q = 0; q < r->world; q++) memcpy((uint8_t *)all + (size_t)q * bytes, r->meet->slot[q], bytes);
  pthread_barrier_wait(&r->meet->bar);
  return 0;
}

static int one_gather(void *arg, const void *mine, void *all, size_t bytes, char *err, size_t errlen) {
  memcpy(all, mine, bytes);   /* world 1 */
  return 0;
}

static void *rank_main(void *arg) {
  Rank *r = arg;
  const Shard *sh = r->shard;
  StTensor t[MAX_PIECES];
  const char *keys[2 + 2 * MAX_PIECES], *vals[2 + 2 * MAX_PIECES];
  char kbuf[2 * MAX_PIECES][128];
  int nm = 0;
  keys[nm] = "loom.mesh", vals[nm++] = r->mesh;
  keys[nm] = "loom.coord", vals[nm++] = sh->coord;
  for (int i = 0; i < sh->n; i++) {
    const Piece *p = &sh->p[i];
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
  char js[64];
  snprintf(js, sizeof js, "{\"step\": %lld}", (long long)r->step);
  r->rc = ckpt_save_shards(r->dir, r->step, r->rank, r->world, t, sh->n, keys, vals, nm, js,
                           r->world == 1 ? one_gather : meet_gather, r, r->err, sizeof r->err);
  return NULL;
}

/* Writes step `step` of a sharded checkpoint under dir: rank k (a thread, or the caller when
   world is 1) writes shards[k]; 0 when every rank succeeded. */
static int save_sharded(const char *dir, int64_t step, const char *mesh, int world, const Shard *shards) {
  Meet meet;
  Rank r[MAX_WORLD];
  pthread_t tid[MAX_WORLD];
  pthread_barrier_init(&meet.bar, NULL, (unsigned)world);
  for (int k = 0; k < world; k++) {
    r[k] = (Rank){&meet, k, world, 0, dir, mesh, step, &shards[k], ""};
    if (world == 1) rank_main(&r[k]);
    else if (pthread_create(&tid[k], NULL, rank_main, &r[k])) return -1;
  }
  for (int k = 0; world > 1 && k < world; k++) pthread_join(tid[k], NULL);
  pthread_barrier_destroy(&meet.bar);
  int rc = 0;
  for (int k = 0; k < world; k++)
    if (r[k].rc) {
      fprintf(stderr, "ckpt_save_shards, rank %d: %s\n", k, r[k].err);
      rc = r[k].rc;
    }
  return rc;
}

static int floats_are(const float *a, const float *b, int n) { return !memcmp(a, b, sizeof(float) * (size_t)n); }

/* Rewrites DONE of a step folder: "shards" set to `shards` (unless < 0), the entry `drop` removed. */
static void edit_done(const char *sd, int shards, const char *drop) {
  char path[600];
  snprintf(path, sizeof path, "%s/DONE", sd);
  json_t *root = json_load_file(path, 0, NULL);
  if (!root) {
    fprintf(stderr, "cannot read %s\n", path);
    exit(1);
  }
  if (shards >= 0) json_object_set_new(root, "shards", json_integer(shards));
  if (drop) json_object_del(json_object_get(root, "files"), drop);
  if (json_dump_file(root, path, JSON_INDENT(2))) exit(1);
  json_decref(root);
}

static void test_sharded(void) {
  char dir[256], sd[512], err[1024] = "";
  snprintf(dir, sizeof dir, "%s/sharded", root);
  /* w [2,4] split over dp=2 along dim 0 (a row per rank); b [3] replicated, written by
     rank 0 alone; a stack of 2 experts [2,3] split along dim 0 too */
  const float w[8] = {0, 1, 2, 3, 10, 11, 12, 13}, b[3] = {-1, -2, -3}, x[6] = {5, 6, 7, 8, 9, 10};
  const Shard dp2[2] = {{"0,0,0,0,0", 3, {{"w", "1,0,0,0,0", NULL, 2, {1, 4}, w}, {"b", "0,0,0,0,0", NULL, 1, {3}, b},
                                          {"moe.experts.x", "1,0,0,0,0", "2", 2, {1, 3}, x}}},
                        {"1,0,0,0,0", 2, {{"w", "1,0,0,0,0", NULL, 2, {1, 4}, w + 4},
                                          {"moe.experts.x", "1,0,0,0,0", "2", 2, {1, 3}, x + 3}}}};
  CHECK(save_sharded(dir, 7, "2,1,1,1,1", 2, dp2) == 0);
  int64_t step = -1;
  CHECK(ckpt_latest(dir, sd, sizeof sd, &step, err, sizeof err) == 0 && step == 7);
  CHECK(!strcmp(sd, P("%s/%s", dir, "step_00000007")));
  CHECK(exists(P("%s/%s", sd, "shard-00000-of-00002.safetensors")) &&
        exists(P("%s/%s", sd, "shard-00001-of-00002.safetensors")) && !exists(P("%s/%s", sd, "model.safetensors")));
  CHECK(side_entries(dir) == 0);
  Checkpoint c;
  int rc = ckpt_load(sd, &c, err, sizeof err);
  CHECK(rc == 0);
  if (rc) fprintf(stderr, "%s\n", err);
  if (!rc) {
    CHECK(c.n_shards == 2 && c.step == 7 && c.params.n == 0 && c.state.n == 0);
    CHECK(c.state_json && !strcmp(c.state_json, "{\"step\": 7}"));
    float got[8];
    memset(got, 0, sizeof got);
    CHECK(ckpt_shards_read_range(&c, "w", 0, 8, got, err, sizeof err) == 0 && floats_are(got, w, 8));
    CHECK(ckpt_shards_read_range(&c, "w", 3, 3, got, err, sizeof err) == 0 && floats_are(got, w + 3, 3));
    CHECK(ckpt_shards_read_range(&c, "b", 0, 3, got, err, sizeof err) == 0 && floats_are(got, b, 3));
    /* another layout: w split over tp=2 along dim 1, the piece of coordinate 1 (columns 2-3) */
    RtGlobal g;
    memset(&g, 0, sizeof g);
    snprintf(g.name, sizeof g.name, "w");
    g.n = 4, g.rank = g.ir_rank = 2;
    g.shape[0] = 2, g.shape[1] = 4;
    g.piece_dims[0] = 2, g.piece_dims[1] = 2;
    g.split[1] = 2;
    const int64_t mesh_tp[5] = {1, 2, 1, 1, 1};
    const int coord_tp[5] = {0, 1, 0, 0, 0};
    const float want_tp[4] = {2, 3, 12, 13};
    memset(got, 0, sizeof got);
    rc = ckpt_shards_read_piece(&c, "w", &g, mesh_tp, coord_tp, got, err, sizeof err);
    CHECK(rc == 0 && floats_are(got, want_tp, 4));
    if (rc) fprintf(stderr, "%s\n", err);
    /* dp=2 x tp=2, tp the outer split of dim 1 as well: (dp 1, tp 0) holds column 1 */
    g.n = 2, g.piece_dims[1] = 1, g.split[0] = 2;
    const int64_t mesh_dt[5] = {2, 2, 1, 1, 1};
    const int coord_dt[5] = {1, 0, 0, 0, 0};
    const float want_dt[2] = {1, 11};
    CHECK(ckpt_shards_read_piece(&c, "w", &g, mesh_dt, coord_dt, got, err, sizeof err) == 0 && floats_are(got, want_dt, 2));
    /* an expert's view: its range of the stack */
    char stack[128];
    int64_t e = -1, per = -1;
    CHECK(ckpt_shards_expert(&c, "moe.experts.1.x.weight", stack, sizeof stack, &e, &per) == 0);
    CHECK(!strcmp(stack, "moe.experts.x") && e == 1 && per == 3);
    CHECK(ckpt_shards_read_range(&c, stack, e * per, per, got, err, sizeof err) == 0 && floats_are(got, x + 3, 3));
    CHECK(ckpt_shards_expert(&c, "moe.experts.2.x.weight", stack, sizeof stack, &e, &per) == -1);   /* of 2 */
    CHECK(ckpt_shards_expert(&c, "moe.experts.01.x.weight", stack, sizeof stack, &e, &per) == -1);
    CHECK(ckpt_shards_expert(&c, "w", stack, sizeof stack, &e, &per) == -1);
    /* what the shards do not hold */
    CHECK_ERR(ckpt_shards_read_range(&c, "v", 0, 1, got, err, sizeof err), 2, err, "hold no tensor 'v'");
    CHECK_ERR(ckpt_shards_read_range(&c, "w", 6, 4, got, err, sizeof err), 2, err, "hold 2 of the 4 elements");
  }
  ckpt_free(&c);

  /* world 1, with a gather that only copies */
  const Shard one[1] = {{"0,0,0,0,0", 1, {{"w", "0,0,0,0,0", NULL, 2, {2, 4}, w}}}};
  CHECK(save_sharded(dir, 8, "1,1,1,1,1", 1, one) == 0);
  CHECK(ckpt_load(P("%s/%s", dir, "step_00000008"), &c, err, sizeof err) == 0 && c.n_shards == 1);
  float got[8] = {0};
  CHECK(ckpt_shards_read_range(&c, "w", 0, 8, got, err, sizeof err) == 0 && floats_are(got, w, 8));
  ckpt_free(&c);

  /* damage: a shard missing, a byte changed, DONE with "shards": 0 or without a shard */
  for (int s = 1; s <= 4; s++) CHECK(save_sharded(dir, 10 + s, "2,1,1,1,1", 2, dp2) == 0);
  snprintf(sd, sizeof sd, "%s/step_00000011", dir);
  CHECK(unlink(P("%s/%s", sd, "shard-00001-of-00002.safetensors")) == 0);
  CHECK_ERR(ckpt_load(sd, &c, err, sizeof err), 2, err, "shard-00001-of-00002.safetensors is missing");
  CHECK(c.n_shards == 0 && c.shards == NULL);
  snprintf(sd, sizeof sd, "%s/step_00000012", dir);
  flip_byte_from_end(P("%s/%s", sd, "shard-00000-of-00002.safetensors"), 5);
  CHECK_ERR(ckpt_load(sd, &c, err, sizeof err), 2, err, "shard-00000-of-00002.safetensors is corrupt: checksum mismatch");
  snprintf(sd, sizeof sd, "%s/step_00000013", dir);
  edit_done(sd, 0, NULL);
  CHECK_ERR(ckpt_load(sd, &c, err, sizeof err), 2, err, "DONE marker is damaged (\"shards\" is not a positive count)");
  snprintf(sd, sizeof sd, "%s/step_00000014", dir);
  edit_done(sd, -1, "shard-00001-of-00002.safetensors");
  CHECK_ERR(ckpt_load(sd, &c, err, sizeof err), 2, err, "DONE marker is damaged (a file entry lacks");

  /* placements that cannot be: a mesh of another size than the shards, one coordinate twice,
     pieces that claim the same elements (leaving others to none), wholes that disagree */
  char bad[256];
  snprintf(bad, sizeof bad, "%s/sharded_bad", root);
  CHECK(save_sharded(bad, 1, "4,1,1,1,1", 2, dp2) == 0);
  CHECK_ERR(ckpt_load(P("%s/%s", bad, "step_00000001"), &c, err, sizeof err), 2, err,
            "loom.mesh 4,1,1,1,1 is not a mesh of 2 ranks");
  const Shard twice[2] = {dp2[0], {"0,0,0,0,0", 1, {{"w", "1,0,0,0,0", NULL, 2, {1, 4}, w}}}};
  CHECK(save_sharded(bad, 2, "2,1,1,1,1", 2, twice) == 0);
  CHECK_ERR(ckpt_load(P("%s/%s", bad, "step_00000002"), &c, err, sizeof err), 2, err,
            "loom.coord 0,0,0,0,0 is another shard's too");
  /* dp=2 x tp=2: (dp 0, tp 1) claims dp coordinate 0's row of w as well; row 1 is nowhere */
  const Shard overlap[4] = {{"0,0,0,0,0", 1, {{"w", "1,0,0,0,0", NULL, 2, {1, 4}, w}}},
                            {"1,0,0,0,0", 0, {{0}}},
                            {"0,1,0,0,0", 1, {{"w", "1,0,0,0,0", NULL, 2, {1, 4}, w}}},
                            {"1,1,0,0,0", 0, {{0}}}};
  CHECK(save_sharded(bad, 3, "2,2,1,1,1", 4, overlap) == 0);
  rc = ckpt_load(P("%s/%s", bad, "step_00000003"), &c, err, sizeof err);
  CHECK(rc == 0);
  if (!rc) CHECK_ERR(ckpt_shards_read_range(&c, "w", 0, 8, got, err, sizeof err), 2, err, "element 0 of 'w' more than once");
  ckpt_free(&c);
  const Shard disagree[2] = {{"0,0,0,0,0", 1, {{"w", "1,0,0,0,0", NULL, 2, {1, 4}, w}}},
                             {"1,0,0,0,0", 1, {{"w", "0,0,0,0,0", NULL, 2, {1, 4}, w + 4}}}};
  CHECK(save_sharded(bad, 4, "2,1,1,1,1", 2, disagree) == 0);
  rc = ckpt_load(P("%s/%s", bad, "step_00000004"), &c, err, sizeof err);
  CHECK(rc == 0);
  if (!rc) CHECK_ERR(ckpt_shards_read_range(&c, "w", 0, 8, got, err, sizeof err), 2, err, "the shards disagree on its shape");
  ckpt_free(&c);
  /* a split outside the tensor's dims, a 0-element piece along a split, a whole too large */
  const Shard odd[2] = {{"0,0,0,0,0", 2, {{"w", "3,0,0,0,0", NULL, 2, {1, 4}, w}, {"z", "2,0,0,0,0", NULL, 2, {0, 3}, w}}},
                        {"1,0,0,0,0", 1, {{"big", "2,0,0,0,0", NULL, 2, {0, INT64_MAX / 2 + 1}, w}}}};
  CHECK(save_sharded(bad, 5, "2,1,1,1,1", 2, odd) == 0);
  rc = ckpt_load(P("%s/%s", bad, "step_00000005"), &c, err, sizeof err);
  CHECK(rc == 0);
  if (!rc) {
    CHECK_ERR(ckpt_shards_read_range(&c, "w", 0, 8, got, err, sizeof err), 2, err, "placement outside its mesh or its dims");
    CHECK_ERR(ckpt_shards_read_range(&c, "z", 0, 1, got, err, sizeof err), 2, err, "hold 0 of the 1 elements");
    CHECK_ERR(ckpt_shards_read_range(&c, "big", 0, 1, got, err, sizeof err), 2, err, "too large to index");
  }
  ckpt_free(&c);
}

/* A writer killed at a random moment must never leave a folder that ckpt_latest picks and
 * ckpt_load refuses. Each round forks a child that saves a ~48 MB checkpoint (sometimes
 * replacing an existing step) and kills it with SIGKILL after a random delay. */
static void test_killed_writer(void) {
  char dir[256];
  snprintf(dir, sizeof dir, "%s/kill", root);
  enum { N = 4 << 20 };
  float *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b), *c = malloc(N * sizeof *c);
  for (int i = 0; i < N; i++) a[i] = (float)i, b[i] = -(float)i, c[i] = 0.5f * i;
  CkptTensor params[] = {{"wte.weight", 2, {1024, N / 1024}, a}, {"ln_f.bias", 1, {7}, b}};
  CkptTensor state[] = {{"adam_m.wte.weight", 2, {1024, N / 1024}, b},
                        {"adam_v.wte.weight", 2, {1024, N / 1024}, c}};
  char err[512] = "", sd[512];
  /* one complete checkpoint to start from, timed to scale the kill moments */
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  CHECK(ckpt_save(dir, 0, params, 2, state, 2, "{\"step\": 0}", err, sizeof err) == 0);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  long full_us = (t1.tv_sec - t0.tv_sec) * 1000000L + (t1.tv_nsec - t0.tv_nsec) / 1000;
  unsigned rng = 12345u; /* fixed seed: the same moments on every run */
  int rounds = 10, finished = 0, bad = 0;
  for (int r = 1; r <= rounds; r++) {
    rng = rng * 1103515245u + 12345u;
    long delay = (long)((rng >> 8) % (unsigned long)(full_us + full_us / 4 + 1));
    int64_t step = (r % 3 == 0) ? r - 1 : r; /* every third round rewrites the last step */
    pid_t pid = fork();
    if (pid == 0) {
      char js[64];
      snprintf(js, sizeof js, "{\"step\": %lld}", (long long)step);
      int rc = ckpt_save(dir, step, params, 2, state, 2, js, NULL, 0);
      _exit(rc);
    }
    usleep((useconds_t)delay);
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    finished += WIFEXITED(status);
    int64_t st;
    int rc = ckpt_latest(dir, sd, sizeof sd, &st, err, sizeof err);
    CHECK(rc == 0);
    if (rc == 0) {
      Checkpoint ck;
      rc = ckpt_load(sd, &ck, err, sizeof err);
      if (rc) {
        bad++;
        fprintf(stderr, "round %d (killed after %ld us): latest %s fails to load: %s\n", r,
                delay, sd, err);
      } else {
        const StTensor *t = st_find(&ck.params, "wte.weight");
        CHECK(t && t->nbytes == (uint64_t)N * 4 && !memcmp(t->data, a, (size_t)N * 4));
        CHECK(st == ck.step);
      }
      ckpt_free(&ck);
    }
  }
  CHECK(bad == 0);
  printf("killed-writer: %d rounds, full save %ld us, %d finished before the kill\n", rounds,
         full_us, finished);
  free(a);
  free(b);
  free(c);
}

int main(void) {
  snprintf(root, sizeof root, "/tmp/loom_ckpt_XXXXXX");
  if (!mkdtemp(root)) {
    perror("mkdtemp");
    return 1;
  }
  test_crc();
  test_roundtrip();
  test_latest();
  test_damage();
  test_sharded();
  test_killed_writer();
  rm_rf(root);
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail != 0;
}
