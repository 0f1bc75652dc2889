/* Unit tests for runtime/checkpoint: round trip, choice of the newest complete step,
 * refusal of damaged checkpoints, and writers killed with SIGKILL at random moments. */
#include "runtime/io/checkpoint.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int passed, failed;

#define CHECK(cond)                                                      \
  do {                                                                   \
    if (cond) passed++;                                                  \
    else {                                                               \
      failed++;                                                          \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                    \
  } while (0)

#define CHECK_ERR(rc, want, err, sub)                                                   \
  do {                                                                                  \
    int rc_ = (rc);                                                                     \
    if (rc_ == (want) && strstr((err), (sub))) passed++;                                \
    else {                                                                              \
      failed++;                                                                         \
      fprintf(stderr, "%s:%d: want rc %d with \"%s\", got rc %d: %s\n", __FILE__,       \
              __LINE__, (want), (sub), rc_, (err));                                     \
    }                                                                                   \
  } while (0)

static char root[64];

static const char *P(const char *fmt, const char *a, const char *b) {
  static char buf[8][512]; /* a few transient paths at once; test scaffolding only */
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
            "No such file or directory; pass the --save directory");
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
  test_killed_writer();
  rm_rf(root);
  printf("%d passed, %d failed\n", passed, failed);
  return failed != 0;
}
