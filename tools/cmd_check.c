/* tools/cmd_check.c — `loom check DIR`: a golden folder (README "Golden folders") run on
 * every backend and layout asked for, and compared with what PyTorch computed.
 *
 * Each run is the loom command a user would type (`loom eval ... --grads`, `loom train ...`),
 * started as a child process of this loom binary, so what is checked is exactly what users
 * run; its outputs are compared tensor by tensor with diff_rel_err (cmd_diff.c).  One row
 * per backend x layout x precision, one column per result:
 *   logits, loss   `loom eval` on tokens[0:B*T] against expected logits and loss
 *   grads          the same run with --grads against every grad.<name>
 *   params         `loom train` for the golden's steps: every trained parameter and the
 *                  step losses
 * f32 runs are compared with the golden; bf16 runs (training only: eval has no bf16) with
 * the same backend and layout's f32 run.  A cell shows the largest relative error
 * max|a-b| / max|b| over its tensors and the tolerance.
 * Exit: 0 all pass, 1 some cell fails (each named), 2 a bad golden folder or usage.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/cuda/cuda_api.h"
#include "runtime/io/safetensors.h"
#include "tools/tools.h"

extern char **environ;

static const char help[] =
  "usage: loom check DIR [--backend ref,cpu,cuda] [--mesh M]... [--precision fp32,bf16] [options]\n"
  "\n"
  "Runs a golden folder's forward pass, gradients and training steps on every backend and\n"
  "layout asked for, as `loom eval` and `loom train` would, and compares each result with\n"
  "the folder's expected.safetensors (computed by PyTorch).  Prints one table: backend x\n"
  "layout x precision against logits, loss, grads and trained params (+ step losses), each\n"
  "cell the largest relative error max|a-b| / max|b| over its tensors and the tolerance.\n"
  "\n"
  "A golden folder holds config.json (or spec.json), weights.safetensors, tokens.bin,\n"
  "golden.json (batch, seq, training settings) and expected.safetensors (docs/goldens.md, \"Golden\n"
  "folders\"); `loom make-golden SPEC -o DIR` writes one.\n"
  "\n"
  "options:\n"
  "  --backend LIST    comma-separated: ref, cpu, cuda (default: every backend this machine\n"
  "                    has; cuda needs a GPU, and is skipped with the reason when there is none)\n"
  "  --mesh M          also run on mesh M (repeatable): dp=2, tp=2, dp=2,tp=2; append ,sp for\n"
  "                    sequence parallelism in training (tp=2,sp).  One rank always runs.\n"
  "                    Meshes run on ref and cpu (ranks as threads).\n"
  "  --precision LIST  fp32, bf16 or both (default fp32); bf16 trains in bf16 and is compared\n"
  "                    with the same backend's fp32 run\n"
  "  --rtol-forward X  logits and loss (default 1e-5)\n"
  "  --rtol-grads X    gradients (default 1e-4)\n"
  "  --rtol-train X    trained parameters and step losses (default 1e-5)\n"
  "  --rtol-bf16 X     bf16 against fp32 (default 2e-2)\n"
  "  --threads N       threads of each run (cpu backend)\n"
  "  --keep DIR        keep every run's outputs and log in DIR (default: a temporary folder,\n"
  "                    removed at the end)\n"
  "  -h, --help        show this help\n"
  "\n"
  "Why these tolerances: the goldens are float64 results rounded to f32, so an f32 forward\n"
  "that sums in another order lands ~1e-7..1e-6 away (1e-5 leaves a decade of margin, while a\n"
  "wrong op is off by 1e-3 or more); gradients sum over every position and through more ops\n"
  "(~1e-6..1e-5 seen), hence 1e-4; trained parameters stay close to their start and AdamW\n"
  "normalizes the update, so they hold 1e-5; bf16 keeps 8 significant bits (2^-8 = 0.4% per\n"
  "rounding) and a few steps compound that to ~1%, hence 2e-2 against f32 for the step\n"
  "losses; a bf16 run's parameters may also drift from f32's by 2 x steps x lr, the most two\n"
  "AdamW runs can part (each step moves a parameter by at most ~lr, in a direction a rounding\n"
  "can flip where the gradient is near zero).  Gradients are checked on one rank (loom eval\n"
  "--grads runs one rank); a mesh's gradients are checked through its training row.\n"
  "\n"
  "exit status: 0 every cell within its tolerance, 1 some cell is not (named), 2 a bad golden\n"
  "folder (a missing file, a tensor of the wrong shape, a config that does not match the\n"
  "weights) or usage\n"
  "\n"
  "example:\n"
  "  loom check tests/golden/llama-tiny --mesh dp=2 --mesh tp=2,sp --precision fp32,bf16\n";

enum { COL_LOGITS, COL_LOSS, COL_GRADS, COL_PARAMS, N_COLS };
static const char *const col_names[N_COLS] = {"logits", "loss", "grads", "params+losses"};

typedef struct {
  double rel;          /* largest relative error max|a-b| / max|b| over the cell's tensors; NAN: not run */
  double tol;          /* rtol */
  double atol;         /* parameters of bf16 rows: AdamW's bound on two runs' drift (see help) */
  bool fail;           /* some tensor has max|a-b| > atol + tol * max|b| */
  char note[64];       /* why a cell was not run, when it says so */
  char worst[2100];    /* the tensor it came from, or why the run failed */
  bool failed_run;
} Cell;

typedef struct {
  const char *backend;
  char layout[64];     /* "1 rank" or the mesh text */
  char mesh[64];       /* --mesh value ("" for one rank) */
  bool sp;
  const char *precision;
  Cell c[N_COLS];
  char train_out[4096];   /* this row's training output (bf16 rows compare with fp32's) */
} Row;

typedef struct {
  char dir[1024], config[1100], weights[1100], tokens[1100], expected[1100], work[1100];
  const char *data[16];
  int n_data;
  int64_t batch, seq, steps, grad_accum, warmup;
  double lr, min_lr, weight_decay, beta1, beta2, eps, grad_clip;
  bool have_lr, have_min_lr, have_wd, have_b1, have_b2, have_eps, have_clip, have_ga, have_warmup;
  StFile exp;
  bool has_grads, has_train;
  int threads;
  int n_runs;
} Golden;

static bool file_ok(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* ---------------------------------------------------------------- the golden folder */

static int read_golden(Golden *g, char *err, size_t errlen) {
  struct stat st;
  if (stat(g->dir, &st) || !S_ISDIR(st.st_mode)) {
    snprintf(err, errlen, "%s: not a folder; give a golden folder (loom make-golden SPEC -o DIR writes one)", g->dir);
    return EXIT_USAGE;
  }
  snprintf(g->config, sizeof g->config, "%s/config.json", g->dir);
  if (!file_ok(g->config)) snprintf(g->config, sizeof g->config, "%s/spec.json", g->dir);
  if (!file_ok(g->config)) {
    snprintf(err, errlen, "%s: no config.json (the model's Hugging Face config) and no spec.json (a run spec)", g->dir);
    return EXIT_USAGE;
  }
  snprintf(g->weights, sizeof g->weights, "%s/weights.safetensors", g->dir);
  snprintf(g->tokens, sizeof g->tokens, "%s/tokens.bin", g->dir);
  snprintf(g->expected, sizeof g->expected, "%s/expected.safetensors", g->dir);
  const char *need[3] = {g->weights, g->tokens, g->expected};
  const char *what[3] = {"the parameters, under their Hugging Face names", "an llm.c token shard",
                         "the PyTorch results: logits, loss, grad.<name>, trained parameters, losses"};
  for (int k = 0; k < 3; k++)
    if (!file_ok(need[k])) {
      snprintf(err, errlen, "%s is missing (%s)", need[k], what[k]);
      return EXIT_USAGE;
    }
  char path[1100];
  snprintf(path, sizeof path, "%s/golden.json", g->dir);
  json_error_t je;
  json_t *j = json_load_file(path, 0, &je);
  if (!j) {
    if (!file_ok(path)) snprintf(err, errlen, "%s is missing (batch, seq and the training settings)", path);
    else snprintf(err, errlen, "%s:%d:%d: %s", path, je.line, je.column, je.text);
    return EXIT_USAGE;
  }
  int rc = 0;
  json_t *v;
#define INT_KEY(key, var, need, minimum)                                                                   \
  do {                                                                                                     \
  if ((v = json_object_get(j, key))) {                                                                     \
    if (!json_is_integer(v) || json_integer_value(v) < (minimum)) {                                        \
      snprintf(err, errlen, "%s: \"%s\" must be an integer >= %d", path, key, (int)(minimum));             \
      rc = EXIT_USAGE;                                                                                     \
    } else var = json_integer_value(v);                                                                    \
  } else if (need) {                                                                                       \
    snprintf(err, errlen, "%s: \"%s\" is missing", path, key);                                             \
    rc = EXIT_USAGE;                                                                                       \
  }                                                                                                        \
  } while (0)
#define NUM_KEY(key, var, flag)                                                                            \
  if (!rc && (v = json_object_get(j, key))) {                                                              \
    if (!json_is_number(v)) {                                                                              \
      snprintf(err, errlen, "%s: \"%s\" must be a number", path, key);                                     \
      rc = EXIT_USAGE;                                                                                     \
    } else var = json_number_value(v), flag = true;                                                        \
  }
  INT_KEY("batch", g->batch, true, 1);
  if (!rc) INT_KEY("seq", g->seq, true, 1);
  if (!rc) INT_KEY("steps", g->steps, false, 0);
  if (!rc && json_object_get(j, "grad_accum")) g->have_ga = true;
  if (!rc) INT_KEY("grad_accum", g->grad_accum, false, 1);
  if (!rc && json_object_get(j, "warmup")) g->have_warmup = true;
  if (!rc) INT_KEY("warmup", g->warmup, false, 0);
  NUM_KEY("lr", g->lr, g->have_lr)
  NUM_KEY("min_lr", g->min_lr, g->have_min_lr)
  NUM_KEY("weight_decay", g->weight_decay, g->have_wd)
  NUM_KEY("beta1", g->beta1, g->have_b1)
  NUM_KEY("beta2", g->beta2, g->have_b2)
  NUM_KEY("eps", g->eps, g->have_eps)
  NUM_KEY("grad_clip", g->grad_clip, g->have_clip)
#undef INT_KEY
#undef NUM_KEY
  json_t *d = json_object_get(j, "data");
  if (!rc && d) {
    if (!json_is_array(d) || json_array_size(d) < 1 || json_array_size(d) > 16) {
      snprintf(err, errlen, "%s: \"data\" must be a list of 1 to 16 token shards in the folder", path);
      rc = EXIT_USAGE;
    }
    for (size_t k = 0; !rc && k < json_array_size(d); k++) {
      const char *s = json_string_value(json_array_get(d, k));
      char *p = s ? malloc(strlen(g->dir) + strlen(s) + 2) : NULL;
      if (p) sprintf(p, "%s/%s", g->dir, s);
      if (!p || !file_ok(p)) {
        snprintf(err, errlen, "%s: \"data\"[%zu] %s%s%s is not a file in the folder", path, k, s ? "'" : "",
                 s ? s : "(not a string)", s ? "'" : "");
        free(p);
        rc = EXIT_USAGE;
      } else g->data[g->n_data++] = p;
    }
  }
  json_decref(j);
  if (rc) return rc;
  if (!g->n_data) g->data[g->n_data++] = strdup(g->tokens);

  if (st_read(g->expected, &g->exp, err, errlen)) return EXIT_USAGE;
  const StTensor *lg = st_find(&g->exp, "logits"), *ls = st_find(&g->exp, "loss");
  if (!lg || !ls) {
    snprintf(err, errlen, "%s: has no '%s' tensor; a golden holds logits [batch,seq,vocab] and loss []", g->expected,
             lg ? "loss" : "logits");
    return EXIT_USAGE;
  }
  /* a one-element loss [1] (numpy.ascontiguousarray of a scalar) is the scalar */
  if (ls->rank == 1 && ls->shape[0] == 1)
    for (int k = 0; k < g->exp.n; k++)
      if (&g->exp.tensors[k] == ls) g->exp.tensors[k].rank = 0;
  if (lg->rank != 3 || lg->shape[0] != g->batch || lg->shape[1] != g->seq || ls->rank != 0) {
    snprintf(err, errlen, "%s: logits is [%lld,%lld,%lld] (rank %d) and loss has rank %d, but golden.json says batch %lld x "
             "seq %lld: logits must be [%lld,%lld,vocab] and loss a scalar (or [1])", g->expected,
             (long long)(lg->rank > 0 ? lg->shape[0] : 0), (long long)(lg->rank > 1 ? lg->shape[1] : 0),
             (long long)(lg->rank > 2 ? lg->shape[2] : 0), lg->rank, ls->rank, (long long)g->batch, (long long)g->seq,
             (long long)g->batch, (long long)g->seq);
    return EXIT_USAGE;
  }
  for (int k = 0; k < g->exp.n; k++) g->has_grads |= !strncmp(g->exp.tensors[k].name, "grad.", 5);
  const StTensor *losses = st_find(&g->exp, "losses");
  g->has_train = losses != NULL && g->steps > 0;
  if (losses && (losses->rank != 1 || losses->shape[0] != g->steps)) {
    snprintf(err, errlen, "%s: losses has %lld entries but golden.json says %lld training steps", g->expected,
             (long long)(losses->rank == 1 ? losses->shape[0] : -1), (long long)g->steps);
    return EXIT_USAGE;
  }
  return 0;
}

/* ---------------------------------------------------------------- runs */

/* Runs this loom with args (argv[0] ignored), output to log; returns the exit status
   (or 1 when it could not start or died), and the last "loom: error:" line in msg. */
static int run_loom(Golden *g, char **args, const char *log, char *msg, size_t msglen) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid;
  args[0] = "loom";
  int e = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, args, environ);
  posix_spawn_file_actions_destroy(&fa);
  g->n_runs++;
  if (e) {
    snprintf(msg, msglen, "could not start loom: %s", strerror(e));
    return EXIT_RUN;
  }
  int status;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  int rc = WIFEXITED(status) ? WEXITSTATUS(status) : EXIT_RUN;
  msg[0] = 0;
  if (rc) {
    FILE *f = fopen(log, "r");
    char line[2048];
    while (f && fgets(line, sizeof line, f)) {
      line[strcspn(line, "\n")] = 0;
      if (strstr(line, "error:") || !msg[0]) snprintf(msg, msglen, "%s", line);
    }
    if (f) fclose(f);
    if (!WIFEXITED(status)) snprintf(msg, msglen, "killed by signal %d (log: %s)", WTERMSIG(status), log);
  }
  return rc;
}

/* Largest relative error over the tensors of `ref` that `want` selects, found in out. */
typedef bool (*Select)(const char *name);
static bool sel_logits(const char *n) { return !strcmp(n, "logits"); }
static bool sel_loss(const char *n) { return !strcmp(n, "loss"); }
static bool sel_grads(const char *n) { return !strncmp(n, "grad.", 5); }
/* Everything a training run writes: the parameters, losses (not the golden's diagnostics of
   one forward: a MoE model's ce_loss, aux_loss and router.* expert loads). */
static bool sel_train(const char *n) {
  return strcmp(n, "logits") && strcmp(n, "loss") && strncmp(n, "grad.", 5) && strcmp(n, "grad_norms") && strcmp(n, "lrs") &&
         strcmp(n, "ce_loss") && strcmp(n, "aux_loss") && strncmp(n, "router.", 7);
}

/* The cell over the tensors of ref that want selects, read from out.  Parameters may have
   an absolute allowance (atol_params); everything else is judged by rtol alone. */
static int compare_into(Cell *c, const char *out, const StFile *ref, Select want, double atol_params, char *err,
                        size_t errlen) {
  StFile f;
  if (st_read(out, &f, err, errlen)) return EXIT_RUN;
  c->rel = 0;
  int rc = 0;
  for (int k = 0; k < ref->n && !rc; k++) {
    const StTensor *b = &ref->tensors[k];
    if (!want(b->name)) continue;
    const StTensor *a = st_find(&f, b->name);
    char e[2048];
    double r, ab = 0, mr = 0;
    bool is_param = strcmp(b->name, "losses") != 0;
    if (!a) {
      snprintf(err, errlen, "the run wrote no '%.200s' (in %.1700s)", b->name, out);
      rc = EXIT_USAGE;
    } else if ((r = diff_rel_err(a, b, &ab, &mr, e, sizeof e)) < 0) {
      snprintf(err, errlen, "%.200s: %.1700s", b->name, e);
      rc = EXIT_USAGE;
    } else {
      double allowed = (is_param ? atol_params : 0) + c->tol * mr;
      if (!(ab <= allowed)) c->fail = true;
      if (!(r <= c->rel)) {
        c->rel = r;
        snprintf(c->worst, sizeof c->worst, "%s", b->name);
      }
    }
  }
  st_close(&f);
  return rc;
}

/* A child's argv, with room for the numbers' text. */
typedef struct {
  char *v[96];
  int n;
  char buf[24][64];
  int nb;
} Argv;

static void add(Argv *a, const char *s) {
  if (a->n < 94) a->v[a->n++] = (char *)s;
  a->v[a->n] = NULL;
}
static void addf(Argv *a, const char *flag, const char *fmt, double x) {
  add(a, flag);
  if (a->nb == 24) return;
  snprintf(a->buf[a->nb], sizeof a->buf[0], fmt, x);
  add(a, a->buf[a->nb++]);
}

/* The flags every run of a row shares, appended to a. */
static void common(Argv *a, const Golden *g, const Row *r) {
  addf(a, "--batch", "%.0f", (double)g->batch);
  addf(a, "--seq", "%.0f", (double)g->seq);
  add(a, "--backend");
  add(a, r->backend);
  if (r->mesh[0]) {
    add(a, "--mesh");
    add(a, r->mesh);
  }
  if (g->threads > 0) addf(a, "--threads", "%.0f", (double)g->threads);
}

static void fail_cells(Row *r, int from, int to, const char *why) {
  for (int c = from; c < to; c++) {
    r->c[c].failed_run = true;
    snprintf(r->c[c].worst, sizeof r->c[c].worst, "%s", why);
  }
}

/* One row: eval (+ grads), then training.  Returns 2 when the golden itself is bad (the
   first run refused the folder's files), else 0. */
static int run_row(Golden *g, Row *r, const Row *fp32, double tol[4], char *err, size_t errlen) {
  char tag[160], out[4400], log[4400], msg[2048];
  snprintf(tag, sizeof tag, "%s-%s-%s", r->backend, r->mesh[0] ? r->mesh : "1", r->precision);
  for (char *p = tag; *p; p++)
    if (*p == '=' || *p == ',') *p = '_';
  for (int c = 0; c < N_COLS; c++) r->c[c].rel = NAN;
  bool bf16 = !strcmp(r->precision, "bf16");
  if (!bf16) {
    Argv e = {0};
    add(&e, "loom");
    add(&e, "eval");
    add(&e, g->config);
    add(&e, "--weights");
    add(&e, g->weights);
    add(&e, "--tokens");
    add(&e, g->tokens);
    common(&e, g, r);
    bool grads = g->has_grads && !r->mesh[0];   /* eval --grads runs one rank */
    if (grads) add(&e, "--grads");
    if (g->has_grads && !grads) snprintf(r->c[COL_GRADS].note, sizeof r->c[COL_GRADS].note, "1 rank only");
    snprintf(out, sizeof out, "%s/%s-eval.safetensors", g->work, tag);
    snprintf(log, sizeof log, "%s/%s-eval.log", g->work, tag);
    add(&e, "--out");
    add(&e, out);
    int rc = run_loom(g, e.v, log, msg, sizeof msg);
    if (rc == EXIT_USAGE && g->n_runs == 1) {
      snprintf(err, errlen, "%s: loom eval refuses the golden's files: %s", g->dir, msg);
      return EXIT_USAGE;
    }
    if (rc) fail_cells(r, COL_LOGITS, COL_PARAMS, msg);
    else {
      Select sel[3] = {sel_logits, sel_loss, sel_grads};
      static const int tol_of[3] = {0, 0, 1};   /* logits, loss: forward; grads: grads */
      for (int c = 0; c < (grads ? 3 : 2); c++) {
        r->c[c].tol = tol[tol_of[c]];
        if (compare_into(&r->c[c], out, &g->exp, sel[c], 0, msg, sizeof msg)) {
          if (g->n_runs == 1) {
            snprintf(err, errlen, "%s: %s", g->dir, msg);
            return EXIT_USAGE;
          }
          fail_cells(r, c, c + 1, msg);
        }
      }
    }
  }
  if (!g->has_train) return 0;
  Argv tr = {0};
  add(&tr, "loom");
  add(&tr, "train");
  add(&tr, g->config);
  add(&tr, "-q");
  add(&tr, "--init");
  add(&tr, g->weights);
  add(&tr, "--data");
  for (int k = 0; k < g->n_data; k++) add(&tr, g->data[k]);
  common(&tr, g, r);
  addf(&tr, "--steps", "%.0f", (double)g->steps);
  if (g->have_ga) addf(&tr, "--grad-accum", "%.0f", (double)g->grad_accum);
  if (g->have_warmup) addf(&tr, "--warmup", "%.0f", (double)g->warmup);
  if (g->have_lr) addf(&tr, "--lr", "%.17g", g->lr);
  if (g->have_min_lr) addf(&tr, "--min-lr", "%.17g", g->min_lr);
  if (g->have_wd) addf(&tr, "--weight-decay", "%.17g", g->weight_decay);
  if (g->have_b1) addf(&tr, "--beta1", "%.17g", g->beta1);
  if (g->have_b2) addf(&tr, "--beta2", "%.17g", g->beta2);
  if (g->have_eps) addf(&tr, "--eps", "%.17g", g->eps);
  if (g->have_clip) addf(&tr, "--grad-clip", "%.17g", g->grad_clip);
  if (r->sp) {
    add(&tr, "--sequence-parallel");
    add(&tr, "true");
  }
  add(&tr, "--precision");
  add(&tr, r->precision);
  snprintf(r->train_out, sizeof r->train_out, "%s/%s-train.safetensors", g->work, tag);
  snprintf(log, sizeof log, "%s/%s-train.log", g->work, tag);
  add(&tr, "--out");
  add(&tr, r->train_out);
  int rc = run_loom(g, tr.v, log, msg, sizeof msg);
  Cell *c = &r->c[COL_PARAMS];
  c->tol = bf16 ? tol[3] : tol[2];
  if (rc) {
    if (rc == EXIT_USAGE && g->n_runs == 1) {
      snprintf(err, errlen, "%s: loom train refuses the golden's files: %s", g->dir, msg);
      return EXIT_USAGE;
    }
    fail_cells(r, COL_PARAMS, COL_PARAMS + 1, msg);
    r->train_out[0] = 0;
    return 0;
  }
  if (bf16) {   /* against the fp32 run of the same backend and layout */
    StFile ref;
    if (!fp32 || !fp32->train_out[0]) {
      fail_cells(r, COL_PARAMS, COL_PARAMS + 1, "no fp32 run to compare with (it failed)");
    } else if (st_read(fp32->train_out, &ref, msg, sizeof msg)) {
      fail_cells(r, COL_PARAMS, COL_PARAMS + 1, msg);
    } else {
      c->atol = 2.0 * (double)g->steps * (g->have_lr ? g->lr : 3e-4);
      if (compare_into(c, r->train_out, &ref, sel_train, c->atol, msg, sizeof msg)) fail_cells(r, COL_PARAMS, COL_PARAMS + 1, msg);
      st_close(&ref);
    }
  } else if (compare_into(c, r->train_out, &g->exp, sel_train, 0, msg, sizeof msg)) {
    fail_cells(r, COL_PARAMS, COL_PARAMS + 1, msg);
  }
  return 0;
}

/* ---------------------------------------------------------------- the command */

static bool in_list(const char *list, const char *word) {
  size_t n = strlen(word);
  for (const char *p = list; p && *p;) {
    const char *e = strchr(p, ',');
    size_t l = e ? (size_t)(e - p) : strlen(p);
    if (l == n && !strncmp(p, word, n)) return true;
    p = e ? e + 1 : NULL;
  }
  return false;
}

static bool list_ok(const char *list, const char *const *allowed, int n_allowed, char *bad, size_t n) {
  for (const char *p = list; p && *p;) {
    const char *e = strchr(p, ',');
    size_t l = e ? (size_t)(e - p) : strlen(p);
    bool ok = false;
    for (int k = 0; k < n_allowed; k++) ok |= strlen(allowed[k]) == l && !strncmp(p, allowed[k], l);
    if (!ok) {
      snprintf(bad, n, "%.*s", (int)l, p);
      return false;
    }
    p = e ? e + 1 : NULL;
  }
  return true;
}

static void cell_text(const Cell *c, char *buf, size_t n) {
  if (c->failed_run) snprintf(buf, n, "FAIL (run failed)");
  else if (isnan(c->rel)) snprintf(buf, n, "- %s", c->note);
  else snprintf(buf, n, "%s %.2g / %.0e%s", c->fail ? "FAIL" : "pass", c->rel, c->tol, c->atol > 0 ? "*" : "");
}

int cmd_check(int argc, char **argv) {
  Golden *g = calloc(1, sizeof *g);
  if (!g) return report(EXIT_RUN, "out of memory");
  const char *backends = NULL, *precisions = "fp32", *meshes[16], *keep = NULL, *v;
  int n_mesh = 0, rc = EXIT_OK;
  double tol[4] = {1e-5, 1e-4, 1e-5, 2e-2};
  static const char *const tol_flags[4] = {"--rtol-forward", "--rtol-grads", "--rtol-train", "--rtol-bf16"};
  Row *rows = NULL;
  int n_rows = 0;
  for (int i = 1; i < argc; i++) {
    int r;
    if (arg_flag(argv[i], "-h") || arg_flag(argv[i], "--help")) {
      fputs(help, stdout);
      goto done;
    }
    if ((r = arg_value(argc, argv, &i, "--backend", &v))) {
      if (r < 0) { rc = usage_error("check", "--backend needs a list, e.g. ref,cpu"); goto done; }
      backends = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--precision", &v))) {
      if (r < 0) { rc = usage_error("check", "--precision needs fp32, bf16 or fp32,bf16"); goto done; }
      precisions = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--mesh", &v))) {
      if (r < 0 || n_mesh == 16) { rc = usage_error("check", "--mesh needs a mesh, e.g. dp=2 or tp=2,sp (at most 16)"); goto done; }
      meshes[n_mesh++] = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--keep", &v))) {
      if (r < 0) { rc = usage_error("check", "--keep needs a folder"); goto done; }
      keep = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--threads", &v))) {
      char *end = NULL;
      long t = r > 0 ? strtol(v, &end, 10) : 0;
      if (r < 0 || *end || t < 1 || t > 1024) { rc = usage_error("check", "--threads needs a number from 1 to 1024"); goto done; }
      g->threads = (int)t;
      continue;
    }
    bool matched = false;
    for (int k = 0; k < 4 && !matched; k++)
      if ((r = arg_value(argc, argv, &i, tol_flags[k], &v))) {
        char *end = NULL;
        double x = r > 0 ? strtod(v, &end) : NAN;
        if (r < 0 || end == v || *end || !(x >= 0) || !isfinite(x)) {
          rc = usage_error("check", "%s needs a non-negative number", tol_flags[k]);
          goto done;
        }
        tol[k] = x;
        matched = true;
      }
    if (matched) continue;
    if (argv[i][0] == '-' && argv[i][1]) { rc = unknown_option("check", argv[i], help); goto done; }
    if (g->dir[0]) { rc = usage_error("check", "one golden folder at a time (got '%s' and '%s')", g->dir, argv[i]); goto done; }
    snprintf(g->dir, sizeof g->dir, "%s", argv[i]);
  }
  if (!g->dir[0]) { rc = usage_error("check", "no golden folder given"); goto done; }
  static const char *const all_backends[3] = {"ref", "cpu", "cuda"}, *const all_prec[2] = {"fp32", "bf16"};
  char bad[64];
  if (backends && !list_ok(backends, all_backends, 3, bad, sizeof bad)) {
    rc = usage_error("check", "--backend: unknown backend '%s' (ref, cpu, cuda)", bad);
    goto done;
  }
  if (!list_ok(precisions, all_prec, 2, bad, sizeof bad)) {
    rc = usage_error("check", "--precision: unknown precision '%s' (fp32, bf16)", bad);
    goto done;
  }
  for (int m = 0; m < n_mesh; m++) {
    char text[64], json[128];
    snprintf(text, sizeof text, "%s", meshes[m]);
    size_t l = strlen(text);
    if (l > 3 && !strcmp(text + l - 3, ",sp")) text[l - 3] = 0;
    if (mesh_flag_json(text, json, sizeof json)) {
      rc = usage_error("check", "--mesh '%s': write axes as dp=2,tp=2 (optionally ending in ,sp)", meshes[m]);
      goto done;
    }
  }

  char err[4096] = "";
  if ((rc = read_golden(g, err, sizeof err))) {
    report(rc, err);
    goto done;
  }
  if (keep) {
    snprintf(g->work, sizeof g->work, "%s", keep);
    mkdir(keep, 0755);
  } else {
    const char *base = getenv("TMPDIR");
    snprintf(g->work, sizeof g->work, "%s/loom-check.XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(g->work)) {
      rc = report(EXIT_RUN, "cannot make a temporary folder");
      goto done;
    }
  }

  /* Backends: the ones asked for, or every one this machine has. */
  char why[512] = "";
  bool cuda_ok = cuda_available(why, sizeof why);
  const char *use[3];
  int n_use = 0;
  printf("loom check %s: batch %lld x seq %lld, %s%lld training step%s; %s\n", g->dir, (long long)g->batch,
         (long long)g->seq, g->has_grads ? "gradients, " : "", (long long)(g->has_train ? g->steps : 0),
         g->has_train && g->steps == 1 ? "" : "s", g->config);
  for (int b = 0; b < 3; b++) {
    bool asked = backends ? in_list(backends, all_backends[b]) : true;
    if (!asked) continue;
    if (b == 2 && !cuda_ok) {
      printf("skipped: cuda: %s\n", why);
      if (backends) rc = EXIT_RUN;   /* asked for and not possible: not a pass */
      continue;
    }
    use[n_use++] = all_backends[b];
  }
  rows = calloc((size_t)(n_use * (1 + n_mesh) * 2) + 1, sizeof *rows);
  if (!rows) {
    rc = report(EXIT_RUN, "out of memory");
    goto done;
  }
  for (int b = 0; b < n_use; b++)
    for (int m = -1; m < n_mesh; m++) {
      if (m >= 0 && !strcmp(use[b], "cuda")) {
        printf("skipped: cuda --mesh %s (meshes run on ref and cpu; many GPUs are issue 15)\n", meshes[m]);
        continue;
      }
      int fp32_row = -1;
      for (int p = 0; p < 2; p++) {
        bool want = in_list(precisions, all_prec[p]);
        if (p == 0 && !want && in_list(precisions, "bf16") && g->has_train) want = true;   /* bf16's reference */
        if (!want) continue;
        Row *r = &rows[n_rows++];
        r->backend = use[b];
        r->precision = all_prec[p];
        if (m >= 0) {
          snprintf(r->mesh, sizeof r->mesh, "%s", meshes[m]);
          size_t l = strlen(r->mesh);
          if (l > 3 && !strcmp(r->mesh + l - 3, ",sp")) r->mesh[l - 3] = 0, r->sp = true;
          snprintf(r->layout, sizeof r->layout, "%s", meshes[m]);
        } else snprintf(r->layout, sizeof r->layout, "1 rank");
        fflush(stdout);
        fprintf(stderr, "check: %s %s %s ...\n", r->backend, r->layout, r->precision);
        int e = run_row(g, r, fp32_row >= 0 ? &rows[fp32_row] : NULL, tol, err, sizeof err);
        if (e) {
          rc = report(e, err);
          goto done;
        }
        if (p == 0) fp32_row = n_rows - 1;
      }
    }

  /* The table. */
  int wl = 6;
  for (int k = 0; k < n_rows; k++) wl = (int)strlen(rows[k].layout) > wl ? (int)strlen(rows[k].layout) : wl;
  printf("\n%-8s %-*s %-9s", "backend", wl, "layout", "precision");
  for (int c = 0; c < N_COLS; c++) printf("  %-20s", col_names[c]);
  printf("\n");
  int n_fail = 0;
  for (int k = 0; k < n_rows; k++) {
    const Row *r = &rows[k];
    printf("%-8s %-*s %-9s", r->backend, wl, r->layout, r->precision);
    for (int c = 0; c < N_COLS; c++) {
      char cell[64];
      cell_text(&r->c[c], cell, sizeof cell);
      printf("  %-20s", cell);
      n_fail += r->c[c].failed_run || r->c[c].fail;
    }
    printf("\n");
  }
  printf("\n(each cell: the largest max|a-b| / max|b| over its tensors / the tolerance; '-': not run; bf16 rows against "
         "the same backend and layout's fp32 run, *: parameters may also differ by 2 x steps x lr, %g here)\n",
         2.0 * (double)g->steps * (g->have_lr ? g->lr : 3e-4));
  for (int k = 0; k < n_rows; k++)
    for (int c = 0; c < N_COLS; c++) {
      const Row *r = &rows[k];
      const Cell *x = &r->c[c];
      if (x->failed_run) printf("FAIL %s %s %s %s: %s\n", r->backend, r->layout, r->precision, col_names[c], x->worst);
      else if (x->fail)
        printf("FAIL %s %s %s %s: %s relative error %.3g > %.0e%s\n", r->backend, r->layout, r->precision, col_names[c],
               x->worst, x->rel, x->tol, x->atol > 0 ? " (plus AdamW's allowance)" : "");
    }
  if (n_fail) {
    printf("loom check: %d of the cells failed (outputs and logs: %s)\n", n_fail, keep ? keep : "rerun with --keep DIR");
    rc = EXIT_RUN;
  } else if (rc == EXIT_OK) {
    printf("loom check: every cell within its tolerance (%d runs)\n", g->n_runs);
  } else {
    printf("loom check: the runs that were possible passed, but not every backend asked for could run\n");
  }

done:
  if (!keep && g->work[0]) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g->work);
    if (system(cmd)) fprintf(stderr, "loom: could not remove %s\n", g->work);
  }
  for (int k = 0; k < g->n_data; k++) free((void *)g->data[k]);
  st_close(&g->exp);
  free(rows);
  free(g);
  return rc;
}
