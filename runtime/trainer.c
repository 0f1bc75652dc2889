/* runtime/trainer.c — the training loop: data, schedule, accumulation, logging,
   checkpoints, and resume that continues bit for bit. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/io/checkpoint.h"
#include "runtime/io/data.h"
#include "runtime/io/safetensors.h" /* rt_read_file, RtAtomic */
#include "runtime/stop.h"
#include "runtime/trainer.h"

#include <signal.h>
#include <unistd.h>

#include <sys/resource.h>

double train_lr_at(const TrainOptions *o, int64_t s) {
  if (s < o->warmup) return o->lr * (double)(s + 1) / (double)o->warmup;
  int64_t span = o->steps - o->warmup;
  double r = (double)(s - o->warmup) / (double)(span > 1 ? span : 1);
  if (r > 1) r = 1;
  return o->min_lr + 0.5 * (1.0 + cos(M_PI * r)) * (o->lr - o->min_lr);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void train_result_free(TrainResult *r) {
  free(r->val_losses);
  free(r->losses);
  free(r->grad_norms);
  free(r->lrs);
  memset(r, 0, sizeof *r);
}

static json_t *float_array(const float *v, int64_t n) {
  json_t *a = json_array();
  for (int64_t i = 0; i < n; i++) json_array_append_new(a, json_real(v[i]));
  return a;
}

/* state.json: everything besides tensors that an exact resume needs. */
static char *state_json(const TrainOptions *o, const TrainResult *r, int64_t step, int shard, int64_t pos) {
  json_t *s = json_object();
  json_object_set_new(s, "step", json_integer(step));
  json_t *d = json_object();
  json_object_set_new(d, "shard", json_integer(shard));
  json_object_set_new(d, "pos", json_integer(pos));
  json_object_set_new(s, "data", d);
  json_object_set_new(s, "seed", json_integer((json_int_t)o->seed));
  json_object_set_new(s, "losses", float_array(r->losses, step));
  json_object_set_new(s, "grad_norms", float_array(r->grad_norms, step));
  json_object_set_new(s, "lrs", float_array(r->lrs, step));
  json_t *settings = o->settings_json ? json_loads(o->settings_json, 0, NULL) : NULL;
  if (settings) json_object_set_new(s, "settings", settings);
  /* %.9g keeps every f32 exact; REAL_PRECISION 17 would too, for doubles. */
  char *text = json_dumps(s, JSON_INDENT(1) | JSON_REAL_PRECISION(9));
  json_decref(s);
  return text;
}

static int save(Executor *ex, const TrainOptions *o, const TrainResult *r, int64_t step, DataLoader *dl, char *err,
                size_t errlen) {
  if (ex->save_shards) {   /* every rank its own pieces */
    int shard;
    int64_t pos;
    data_get_position(dl, &shard, &pos);
    char *js = state_json(o, r, step, shard, pos);
    int rc = js ? ex->save_shards(ex->self, o->save_dir, step, js, err, errlen) : 1;
    if (!js) snprintf(err, errlen, "out of memory writing a checkpoint");
    if (!rc && o->log) fprintf(o->log, "checkpoint: step %lld saved in %s (a shard per rank)\n", (long long)step, o->save_dir);
    free(js);
    return rc;
  }
  if (ex->sync_out && ex->sync_out(ex->self, err, errlen)) return 1;
  if (o->not_writer) return 0;
  int shard;
  int64_t pos;
  data_get_position(dl, &shard, &pos);
  CkptTensor *p = calloc((size_t)ex->n_params + 1, sizeof *p), *st = calloc((size_t)ex->n_state + 1, sizeof *st);
  char *js = state_json(o, r, step, shard, pos);
  int rc = 1;
  if (p && st && js) {
    for (int i = 0; i < ex->n_params; i++) {
      const RtTensor *t = &ex->params[i];
      p[i] = (CkptTensor){t->name, t->rank, {0}, t->data};
      memcpy(p[i].shape, t->shape, sizeof t->shape);
    }
    for (int i = 0; i < ex->n_state; i++) {
      const RtTensor *t = &ex->state[i];
      st[i] = (CkptTensor){t->name, t->rank, {0}, t->data};
      memcpy(st[i].shape, t->shape, sizeof t->shape);
    }
    rc = ckpt_save(o->save_dir, step, p, ex->n_params, st, ex->n_state, js, err, errlen);
  } else {
    snprintf(err, errlen, "out of memory writing a checkpoint");
  }
  if (!rc && o->log) fprintf(o->log, "checkpoint: step %lld saved in %s\n", (long long)step, o->save_dir);
  free(p);
  free(st);
  free(js);
  return rc;
}

/* Copies tensors of a checkpoint file into the executor's buffers, by name. */
static int restore(const StFile *f, RtTensor *ts, int n, const char *what, const char *dir, char *err, size_t errlen) {
  for (int i = 0; i < n; i++) {
    const StTensor *t = st_find(f, ts[i].name);
    int64_t count = 1;
    for (int d = 0; d < ts[i].rank; d++) count *= ts[i].shape[d];
    bool ok = t && t->dtype == ST_F32 && t->rank == ts[i].rank;
    for (int d = 0; ok && d < t->rank; d++) ok = t->shape[d] == ts[i].shape[d];
    if (!ok) {
      snprintf(err, errlen, "%s: %s %s '%s' (or its shape); the checkpoint belongs to another model or layout", dir,
               t ? "has a different" : "lacks", what, ts[i].name);
      return 2;
    }
    memcpy(ts[i].data, t->data, sizeof(float) * (size_t)count);
  }
  return 0;
}

/* The whole views from a sharded checkpoint: each assembled from the ranks' pieces (a stack
   of experts' view from its expert's range of the stack). */
static int restore_shards(const Checkpoint *c, RtTensor *ts, int n, const char *dir, char *err, size_t errlen) {
  for (int i = 0; i < n; i++) {
    int64_t count = 1, e = 0, per = 0;
    for (int d = 0; d < ts[i].rank; d++) count *= ts[i].shape[d];
    char stack[600];
    int rc;
    if (!ckpt_shards_expert(c, ts[i].name, stack, sizeof stack, &e, &per))
      rc = ckpt_shards_read_range(c, stack, e * per, count, ts[i].data, err, errlen);
    else rc = ckpt_shards_read_range(c, ts[i].name, 0, count, ts[i].data, err, errlen);
    if (rc) {
      char m[1024];
      snprintf(m, sizeof m, "%s: %s", dir, err);
      snprintf(err, errlen, "%s", m);
      return rc;
    }
  }
  return 0;
}

static int read_floats(json_t *root, const char *key, float *out, int64_t n) {
  json_t *a = json_object_get(root, key);
  if (!json_is_array(a) || (int64_t)json_array_size(a) != n) return -1;
  for (int64_t i = 0; i < n; i++) {
    json_t *v = json_array_get(a, (size_t)i);
    if (!json_is_number(v)) return -1;
    out[i] = (float)json_number_value(v);
  }
  return 0;
}

/* The settings that make a resumed run the continuation of the saved one (state.json's
   "settings"): a difference changes the schedule or the data order under the run. */
static const char *const COMPARED[] = {"steps", "batch", "seq", "grad_accum", "lr", "min_lr", "warmup", "weight_decay",
                                       "beta1", "beta2", "eps", "grad_clip", "precision", "seed"};

static void value_text(json_t *v, char *out, size_t n) {
  if (json_is_string(v)) snprintf(out, n, "%s", json_string_value(v));
  else if (json_is_integer(v)) snprintf(out, n, "%lld", (long long)json_integer_value(v));
  else if (json_is_real(v)) snprintf(out, n, "%.9g", json_real_value(v));
  else snprintf(out, n, "?");
}

/* Compares the checkpoint's settings with this run's: every difference listed ("--steps 7 ->
   9"); refused (2) unless o->allow_changes, which prints them as notes. */
static int compare_settings(const TrainOptions *o, json_t *state, const char *dir, char *err, size_t errlen) {
  json_t *was = json_object_get(state, "settings");
  json_t *now = o->settings_json ? json_loads(o->settings_json, 0, NULL) : NULL;
  char list[1536] = "";
  size_t k = 0;
  int n = 0;
  for (size_t i = 0; was && now && i < sizeof COMPARED / sizeof COMPARED[0]; i++) {
    json_t *a = json_object_get(was, COMPARED[i]), *b = json_object_get(now, COMPARED[i]);
    if (!a || !b || json_equal(a, b)) continue;
    char at[64], bt[64], flag[32];
    value_text(a, at, sizeof at);
    value_text(b, bt, sizeof bt);
    snprintf(flag, sizeof flag, "--%s", COMPARED[i]);
    for (char *c = flag; *c; c++) *c = *c == '_' ? '-' : *c;
    if (k < sizeof list) k += (size_t)snprintf(list + k, sizeof list - k, "%s%s %s -> %s", n ? ", " : "", flag, at, bt);
    n++;
  }
  json_decref(now);
  if (!n) return 0;
  if (!o->allow_changes) {
    snprintf(err, errlen, "%s: this run's settings differ from the checkpoint's (%s); resume with the settings it was "
             "saved with, or add --allow-changes to continue with the new ones", dir, list);
    return 2;
  }
  if (o->log) fprintf(o->log, "note: --allow-changes: continuing with changed settings: %s\n", list);
  return 0;
}

/* A checkpoint folder that will load: the newest complete one of o->resume, or, when that is
   damaged (a file that disagrees with DONE, a DONE unreadable), the newest older one that
   loads, with a note per folder skipped.  A step folder named itself is taken or refused. */
static int pick_checkpoint(const TrainOptions *o, char *dir, size_t n, Checkpoint *c, char *err, size_t errlen) {
  int64_t below = INT64_MAX, step;
  char skipped[2048] = "";
  for (;;) {
    int rc = ckpt_latest_below(o->resume, below, dir, n, &step, err, errlen);
    if (rc) {
      if (skipped[0])   /* nothing older loads either: what was wrong with the newer ones */
        snprintf(err, errlen, "%s: no checkpoint here loads: %s; train from the start or pass another --resume folder",
                 o->resume, skipped);
      return rc;
    }
    if (err[0] && o->log) fprintf(o->log, "note: %s\n", err);
    rc = ckpt_load(dir, c, err, errlen);
    if (!rc && c->step != step) {   /* DONE's step is not the folder's name */
      snprintf(err, errlen, "%s: its DONE records step %lld, not the folder's (a copy of another step)", dir,
               (long long)c->step);
      ckpt_free(c);
      rc = 2;
    }
    if (rc != 2 || !strcmp(dir, o->resume)) return rc;   /* a step folder asked for by name: no fallback */
    if (o->log) fprintf(o->log, "note: skipped a damaged checkpoint: %s\n", err);
    size_t k = strlen(skipped);
    snprintf(skipped + k, sizeof skipped - k, "%s%s", k ? "; " : "", err);
    below = step;
  }
}

static int resume(Executor *ex, const TrainOptions *o, TrainResult *r, DataLoader *dl, char *used, size_t used_n,
                  char *err, size_t errlen) {
  char dir[4096];
  Checkpoint c;
  int rc = pick_checkpoint(o, dir, sizeof dir, &c, err, errlen);
  if (rc) return rc;
  snprintf(used, used_n, "%s", dir);
  json_error_t je;
  json_t *s = json_loads(c.state_json, 0, &je);
  rc = compare_settings(o, s, dir, err, errlen);
  bool pieces = c.n_shards && ex->load_shards;   /* the executor takes its pieces itself */
  if (!rc && pieces) rc = ex->load_shards(ex->self, &c, err, errlen);
  else if (!rc && c.n_shards) {
    rc = restore_shards(&c, ex->params, ex->n_params, dir, err, errlen);
    if (!rc) rc = restore_shards(&c, ex->state, ex->n_state, dir, err, errlen);
  } else if (!rc) {
    rc = restore(&c.params, ex->params, ex->n_params, "parameter", dir, err, errlen);
    if (!rc) rc = restore(&c.state, ex->state, ex->n_state, "optimizer tensor", dir, err, errlen);
  }
  if (!rc) {
    json_t *d = json_object_get(s, "data");
    int64_t saved = json_integer_value(json_object_get(s, "step"));
    json_t *shard = json_object_get(d, "shard"), *pos = json_object_get(d, "pos");
    if (!s || saved != c.step || !json_is_object(d)) {
      snprintf(err, errlen, "%s/state.json: missing or inconsistent 'step' or 'data'", dir);
      rc = 2;
    } else if (!json_is_integer(shard) || !json_is_integer(pos) || json_integer_value(shard) < 0 ||
               json_integer_value(shard) >= o->n_data || json_integer_value(pos) < 0) {
      /* read as 64 bits and range-checked before any narrowing: 2^32 is not shard 0 */
      snprintf(err, errlen, "%s/state.json: data position shard %lld, pos %lld does not fit the %d data shard%s given; "
               "resume with the same --data as the run that saved it", dir, (long long)json_integer_value(shard),
               (long long)json_integer_value(pos), o->n_data, o->n_data == 1 ? "" : "s");
      rc = 2;
    } else if (c.step > o->steps) {
      snprintf(err, errlen, "%s is at step %lld, past --steps %lld; ask for more steps to continue", dir,
               (long long)c.step, (long long)o->steps);
      rc = 2;
    } else if (read_floats(s, "losses", r->losses, c.step) || read_floats(s, "grad_norms", r->grad_norms, c.step) ||
               read_floats(s, "lrs", r->lrs, c.step)) {
      snprintf(err, errlen, "%s/state.json: loss history does not cover %lld steps", dir, (long long)c.step);
      rc = 2;
    } else {
      rc = data_set_position(dl, (int)json_integer_value(shard), json_integer_value(pos), err, errlen);
      r->first_step = c.step;
      if (!rc && ex->sync_in && !pieces) rc = ex->sync_in(ex->self, err, errlen);
      if (!rc && o->log) fprintf(o->log, "resumed from %s (step %lld)\n", dir, (long long)c.step);
    }
  }
  json_decref(s);
  ckpt_free(&c);
  return rc;
}

/* ---- validation ---- */

/* The mean loss over the first windows of the val shards (the same every time). */
static int validate(Executor *ex, DataLoader *vl, int64_t windows, int32_t *inputs, int32_t *targets, float *out,
                    char *err, size_t errlen) {
  double sum = 0;
  if (data_set_position(vl, 0, 0, err, errlen)) return 2;
  for (int64_t w = 0; w < windows; w++) {
    float loss;
    data_next(vl, inputs, targets);
    int rc = ex->eval_step(ex->self, inputs, targets, &loss, err, errlen);
    if (rc) return rc;
    sum += loss;
  }
  *out = (float)(sum / (double)windows);
  return 0;
}

/* ---- metrics (JSON Lines) ---- */

static void put_num(FILE *f, const char *key, double v) {
  if (isfinite(v)) fprintf(f, ",\"%s\":%.9g", key, v);
  else fprintf(f, ",\"%s\":null", key);
}

/* A resumed run keeps the lines of steps up to its checkpoint and drops the later ones (a
   run that went past the checkpoint before it stopped), so every step has one line. */
static int metrics_trim(const char *path, int64_t upto, char *err, size_t errlen) {
  uint8_t *buf;
  size_t size;
  FILE *probe = fopen(path, "rb");
  if (!probe) return 0;   /* nothing to keep */
  fclose(probe);
  int rc = rt_read_file(path, &buf, &size, err, errlen);
  if (rc) return rc;
  RtAtomic a;
  rc = rt_atomic_open(&a, path, err, errlen);
  for (size_t at = 0; !rc && at < size;) {
    const uint8_t *nl = memchr(buf + at, '\n', size - at);
    size_t len = nl ? (size_t)(nl - (buf + at)) + 1 : size - at;
    json_t *line = json_loadb((const char *)buf + at, len, JSON_DISABLE_EOF_CHECK, NULL);
    json_t *step = json_object_get(line, "step");
    if (nl && json_is_integer(step) && json_integer_value(step) <= upto) rc = rt_atomic_write(&a, buf + at, len, err, errlen);
    json_decref(line);
    at += len;
  }
  if (!rc) rc = rt_atomic_commit(&a, err, errlen);
  rt_atomic_abort(&a);
  free(buf);
  return rc;
}

static void format_eta(char *out, size_t n, double s) {
  if (!isfinite(s) || s < 0) s = 0;
  long t = (long)(s + 0.5);
  if (t >= 3600) snprintf(out, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
  else if (t >= 60) snprintf(out, n, "%ldm%02lds", t / 60, t % 60);
  else snprintf(out, n, "%lds", t);
}

/* ---- mixture of experts: the expert load of each step ---- */

typedef struct {
  int n;
  RtTensor *t[512];   /* moe_load.l<N>, in layer order */
  float *vals;        /* the last read, every layer's counts one after another */
  double worst;       /* max over layers of max/mean tokens per expert (NAN: not read) */
} Loads;

static int loads_find(const Executor *ex, Loads *L) {
  int64_t total = 0;
  L->n = 0;
  L->worst = NAN;
  for (int i = 0; i < ex->n_state && L->n < 512; i++)
    if (!strncmp(ex->state[i].name, "moe_load.l", 10) && ex->state[i].rank == 1)
      L->t[L->n++] = &ex->state[i], total += ex->state[i].shape[0];
  L->vals = L->n ? calloc((size_t)total, sizeof(float)) : NULL;
  return L->n && !L->vals ? 1 : 0;
}

static bool loads_live(const Executor *ex, const TrainOptions *o, const Loads *L) {
  return L->n && (!ex->sync_out || o->log_experts);
}

/* Zeroes the counts (the executor's own copies too, through sync_in). */
static int loads_zero(Executor *ex, const TrainOptions *o, Loads *L, char *err, size_t errlen) {
  if (!loads_live(ex, o, L)) return 0;
  for (int k = 0; k < L->n; k++) memset(L->t[k]->data, 0, sizeof(float) * (size_t)L->t[k]->shape[0]);
  return ex->sync_in && ex->sync_in(ex->self, err, errlen) ? 1 : 0;
}

/* Reads the step's counts into L->vals and their worst max/mean, then zeroes them. */
/* The busiest expert's tokens over the mean (NAN: no tokens). */
static double max_over_mean(const float *v, int64_t n) {
  double sum = 0, max = 0;
  for (int64_t e = 0; e < n; e++) sum += v[e], max = v[e] > max ? v[e] : max;
  return sum > 0 ? max / (sum / (double)n) : NAN;
}

static int loads_read(Executor *ex, const TrainOptions *o, Loads *L, char *err, size_t errlen) {
  L->worst = NAN;
  if (!loads_live(ex, o, L)) return 0;
  if (ex->sync_out && ex->sync_out(ex->self, err, errlen)) return 1;
  float *v = L->vals;
  for (int k = 0; k < L->n; k++) {
    const RtTensor *t = L->t[k];
    memcpy(v, t->data, sizeof(float) * (size_t)t->shape[0]);
    double r = max_over_mean(v, t->shape[0]);
    if (!isnan(r) && (isnan(L->worst) || r > L->worst)) L->worst = r;
    v += t->shape[0];
  }
  return loads_zero(ex, o, L, err, errlen);
}

/* --log-experts: a line per layer, tokens per expert and max/mean. */
static void loads_print(FILE *f, const Loads *L) {
  const float *v = L->vals;
  for (int k = 0; k < L->n; k++) {
    const RtTensor *t = L->t[k];
    fprintf(f, "  experts %-5s", t->name + 9);
    for (int64_t e = 0; e < t->shape[0]; e++) fprintf(f, " %.0f", v[e]);
    fprintf(f, " | max/mean %.2f\n", max_over_mean(v, t->shape[0]));
    v += t->shape[0];
  }
}

static void loads_json(FILE *f, const Loads *L) {
  const float *v = L->vals;
  fprintf(f, ",\"expert_load\":[");
  for (int k = 0; k < L->n; k++) {
    fprintf(f, k ? ",[" : "[");
    for (int64_t e = 0; e < L->t[k]->shape[0]; e++) fprintf(f, e ? ",%.0f" : "%.0f", v[e]);
    fputc(']', f);
    v += L->t[k]->shape[0];
  }
  fputc(']', f);
}

/* The folder that holds step folder `dir` (a resumed run's save dir). */
static void parent_dir(const char *dir, char *out, size_t n) {
  snprintf(out, n, "%s", dir);
  size_t l = strlen(out);
  while (l > 1 && out[l - 1] == '/') out[--l] = 0;
  char *slash = strrchr(out, '/');
  if (!slash) snprintf(out, n, ".");
  else if (slash == out) out[1] = 0;
  else *slash = 0;
}

/* Locks o->save_dir for this run and removes dead writers' leftovers there. */
static int take_save_dir(const TrainOptions *o, bool resumed_from, int *lock_fd, char *err, size_t errlen) {
  int rc = ckpt_lock(o->save_dir, lock_fd, err, errlen);
  if (rc) return rc;
  ckpt_clean_tmp(o->save_dir, o->log);
  if (resumed_from && o->log)
    fprintf(o->log, "checkpoints go on into %s, the folder it resumed from (--save-dir D writes elsewhere)\n", o->save_dir);
  return 0;
}

/* ---- the loop ---- */

typedef struct {
  Executor *ex;
  const TrainOptions *o;
  TrainResult *r;
  DataLoader *dl, *vl;
  Loads *loads;
  FILE *metrics;
  int32_t *inputs, *targets;
  float *mb_losses;
  int64_t G, B, T, val_every, val_windows;
  double start, first_loss, comm_total;
  double last_arrival;   /* overlapped steps: when the last one's results came in */
  int64_t end;           /* the step after the last one run */
  int stopped;           /* the signal that ended the run early */
} Loop;

/* Everything after step s's results are in: its record, validation, the step line and the
   metrics, the loss checks, a checkpoint, a stop.  in_flight: the step after it is already
   issued (then no validation or checkpoint is due here: the loop finishes s first when one
   is). *stop: a signal ended the run after this step. */
static int report_step(Loop *L, int64_t s, float loss, float norm, double dt, bool in_flight, bool *stop, char *err,
                       size_t errlen) {
  const TrainOptions *o = L->o;
  TrainResult *r = L->r;
  int rc = 0;
  float lr = (float)train_lr_at(o, s);
  if ((rc = loads_read(L->ex, o, L->loads, err, errlen))) return rc;
  r->losses[s] = loss;
  r->grad_norms[s] = norm;
  r->lrs[s] = lr;
  r->n = s + 1;
  if (s == r->first_step) L->first_loss = loss;
  char comm[96] = "";
  double comm_mean = NAN;
  if (L->ex->comm_wait_ms) {   /* exposed communication: ranks blocked on collectives */
    double most;
    L->ex->comm_wait_ms(L->ex->self, &comm_mean, &most);
    L->comm_total += comm_mean;
    snprintf(comm, sizeof comm, " | comm wait %.1f ms (max %.1f)", comm_mean, most);
  }
  float val = NAN;
  if (o->n_val > 0 && ((s + 1) % L->val_every == 0 || s + 1 == o->steps)) {
    if ((rc = validate(L->ex, L->vl, L->val_windows, L->inputs, L->targets, &val, err, errlen))) return rc;
    if ((rc = loads_zero(L->ex, o, L->loads, err, errlen))) return rc;   /* the forward's counts are not the next step's */
    r->val_losses[s] = val;
    if (L->ex->comm_wait_ms) {   /* the validation's waits are not the next step's */
      double m0, m1;
      L->ex->comm_wait_ms(L->ex->self, &m0, &m1);
    }
  }
  double elapsed = now_s() - L->start, eta = elapsed / (double)(s + 1 - r->first_step) * (double)(o->steps - s - 1);
  double mfu = o->flops_per_step > 0 && o->peak_flops > 0 ? o->flops_per_step / dt / o->peak_flops : NAN;
  if (o->log) {
    char vs[32] = "", ms[32] = "", es[32], xs[40] = "";
    if (!isnan(val)) snprintf(vs, sizeof vs, " | val %.4f", val);
    if (!isnan(mfu)) snprintf(ms, sizeof ms, " | mfu %.1f%%", 100 * mfu);
    if (!isnan(L->loads->worst)) snprintf(xs, sizeof xs, " | experts max/mean %.2f", L->loads->worst);
    format_eta(es, sizeof es, eta);
    fprintf(o->log, "step %5lld/%lld | loss %.4f%s | lr %.3e | norm %.3f | %8.1f ms | %9.0f tok/s%s%s | eta %s%s\n",
            (long long)(s + 1), (long long)o->steps, loss, vs, lr, norm, dt * 1e3, (double)(L->G * L->B * L->T) / dt, ms, xs, es,
            comm);
    if (o->log_experts && !isnan(L->loads->worst)) loads_print(o->log, L->loads);
  }
  if (L->metrics) {
    /* the line is made in memory and written at once; a failed write is cut back off, so
       the file holds whole lines only (a reader never sees half a JSON object) */
    FILE *file = L->metrics;
    char *line = NULL;   /* the fields go into it through mem */
    size_t line_n = 0;
    FILE *mem = open_memstream(&line, &line_n);
    if (!mem) {
      snprintf(err, errlen, "out of memory");
      return 1;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    fprintf(mem, "{\"step\":%lld", (long long)(s + 1));
    put_num(mem, "loss", loss);
    if (!isnan(val)) put_num(mem, "val_loss", val);
    put_num(mem, "lr", lr);
    put_num(mem, "grad_norm", norm);
    put_num(mem, "tokens_per_s", (double)(L->G * L->B * L->T) / dt);
    put_num(mem, "step_ms", dt * 1e3);
    if (!isnan(mfu)) put_num(mem, "mfu", mfu);
    if (!isnan(comm_mean)) put_num(mem, "comm_wait_ms", comm_mean);
    if (!isnan(L->loads->worst)) {
      put_num(mem, "expert_max_mean", L->loads->worst);
      loads_json(mem, L->loads);
    }
    fprintf(mem, ",\"tokens\":%lld", (long long)((s + 1) * L->G * L->B * L->T));
    put_num(mem, "elapsed_s", elapsed);
    put_num(mem, "eta_s", eta);
    put_num(mem, "max_rss_mb", (double)ru.ru_maxrss / 1024.0);
    fprintf(mem, ",\"time\":%lld}\n", (long long)time(NULL));
    fclose(mem);
    long at = ftell(file);
    bool bad = fwrite(line, 1, line_n, file) != line_n;
    bad = fflush(file) != 0 || bad;
    free(line);
    if (bad) {
      if (at >= 0 && ftruncate(fileno(file), at) == 0) clearerr(file);
      snprintf(err, errlen, "%s: cannot write the metrics log (disk full?); it holds the whole lines of the steps before",
               o->metrics_path);
      return 1;
    }
  }
  if (!isfinite(loss) || !isfinite(norm)) {
    snprintf(err, errlen, "the %s became %s at step %lld; lower the learning rate (--lr) or check the data",
             isfinite(loss) ? "gradient norm" : "loss", isnan(isfinite(loss) ? norm : loss) ? "nan" : "infinite",
             (long long)(s + 1));
    return 1;
  }
  bool last = s + 1 == o->steps, saved = false;
  if (o->save_dir && ((o->save_every > 0 && (s + 1) % o->save_every == 0) || last)) {
    if ((rc = save(L->ex, o, r, s + 1, L->dl, err, errlen))) return rc;
    saved = true;
  }
  /* SIGINT / SIGTERM: this step is done; every rank stops after the same one */
  int sig = train_stop_signal();
  if (L->ex->agree_stop && (rc = L->ex->agree_stop(L->ex->self, sig, &sig, err, errlen))) return rc;
  if (sig && !last && !in_flight) {   /* (a step in flight: after that one, which the loop finishes first) */
    L->stopped = sig;
    L->end = s + 1;
    if (o->save_dir && !saved && (rc = save(L->ex, o, r, s + 1, L->dl, err, errlen))) return rc;
    *stop = true;
  }
  return 0;
}

/* A step after which something reads the state (a checkpoint, validation, the end): the loop
   finishes it before the next is issued. */
static bool state_read_after(const Loop *L, int64_t s) {
  const TrainOptions *o = L->o;
  return s + 1 == o->steps || (o->n_val > 0 && (s + 1) % L->val_every == 0) ||
         (o->save_dir && o->save_every > 0 && (s + 1) % o->save_every == 0);
}

/* Waits for the oldest step in flight, s (issued from t0 to t1), and reports it. */
static int finish_step(Loop *L, int64_t s, double t0, double t1, bool in_flight, bool *stop, char *err, size_t errlen) {
  float norm = 0, loss_sum = 0;
  int rc = L->ex->finish_step(L->ex->self, L->mb_losses, &norm, err, errlen);
  if (rc) return rc;
  for (int64_t g = 0; g < L->G; g++) loss_sum += L->mb_losses[g];
  /* the step's time: from when the device could start it (issued, and the step before done)
     to its results, so that overlapped steps add up to the wall time; or the issue's own time
     where it was longer (a device that runs the step as it is issued: the emulated one, or
     one that went call by call) */
  double now = now_s(), dt = now - (t0 > L->last_arrival ? t0 : L->last_arrival);
  if (t1 - t0 > dt) dt = t1 - t0;
  L->last_arrival = now;
  return report_step(L, s, loss_sum / (float)L->G, norm, dt, in_flight, stop, err, errlen);
}

static const char *signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal"; }

int train_run(Executor *ex, const TrainOptions *opt, TrainResult *r, char *err, size_t errlen) {
  TrainOptions local = *opt;   /* save_dir may become the folder a run resumed from */
  const TrainOptions *o = &local;
  char resumed[4096] = "", resumed_dir[4096];
  int lock_fd = -1;
  int64_t pending = -1;   /* overlap: a step issued and not yet finished */
  double pending_t0 = 0, pending_t1 = 0;
  Loop L;
  Loads loads = {0};   /* mixture of experts: the expert load of each step */
  memset(r, 0, sizeof *r);
  err[0] = 0;
  int64_t B = ex->batch, T = ex->seq, G = o->grad_accum > 0 ? o->grad_accum : 1;
  r->losses = calloc((size_t)o->steps + 1, sizeof(float));
  r->grad_norms = calloc((size_t)o->steps + 1, sizeof(float));
  r->lrs = calloc((size_t)o->steps + 1, sizeof(float));
  int64_t rows = ex->pipeline_step || ex->whole_step ? G : 1;   /* a pipeline (a whole step) takes them at once */
  int32_t *inputs = malloc(sizeof(int32_t) * (size_t)(rows * B * T)), *targets = malloc(sizeof(int32_t) * (size_t)(rows * B * T));
  float *mb_losses = malloc(sizeof(float) * (size_t)G);
  DataLoader dl, vl;
  memset(&dl, 0, sizeof dl);
  memset(&vl, 0, sizeof vl);
  FILE *metrics = NULL;
  int rc = 0;
  if (!r->losses || !r->grad_norms || !r->lrs || !inputs || !targets || !mb_losses) {
    snprintf(err, errlen, "out of memory");
    rc = 1;
    goto done;
  }
  int64_t val_windows = 0, val_every = o->val_every > 0 ? o->val_every : (o->steps >= 10 ? o->steps / 10 : 1);
  if (o->n_val > 0) {
    if (!ex->eval_step) {
      snprintf(err, errlen, "validation (--val-data) is not available with this executor (it has no forward-only "
               "step); drop --val-data");
      rc = 2;
      goto done;
    }
    r->val_losses = malloc(sizeof(float) * (size_t)(o->steps + 1));
    if (!r->val_losses) {
      snprintf(err, errlen, "out of memory");
      rc = 1;
      goto done;
    }
    for (int64_t k = 0; k <= o->steps; k++) r->val_losses[k] = NAN;
    if ((rc = data_open(&vl, o->val_data, o->n_val, B, T, o->vocab, err, errlen))) {
      size_t k = strlen(err);
      snprintf(err + k, errlen - k, " (a validation shard, --val-data)");
      goto done;
    }
    /* --val-tokens: at most what the validation shards hold (more would repeat them, and a
       hostile count would run for ever); windows rounded up without overflowing */
    int64_t held = 0;
    for (int i = 0; i < vl.n_shards; i++) held += vl.shards[i].count;
    if (o->val_tokens > held) {
      snprintf(err, errlen, "--val-tokens %lld: the validation shards (--val-data) hold %lld tokens; give at most %lld "
               "(or leave it out: 10 micro-batches)", (long long)o->val_tokens, (long long)held, (long long)held);
      rc = 2;
      goto done;
    }
    val_windows = o->val_tokens > 0 ? o->val_tokens / (B * T) + (o->val_tokens % (B * T) != 0) : 10;
  }
  /* one writer per save dir, locked before anything is read (a dead writer's unfinished
     folders go); a resumed run without one goes on saving where it came from */
  if (o->save_dir && !o->not_writer && (rc = take_save_dir(o, false, &lock_fd, err, errlen))) goto done;
  if ((rc = data_open(&dl, o->data, o->n_data, B, T, o->vocab, err, errlen))) goto done;
  if (o->resume && (rc = resume(ex, o, r, &dl, resumed, sizeof resumed, err, errlen))) goto done;
  if (!o->save_dir && resumed[0]) {
    parent_dir(resumed, resumed_dir, sizeof resumed_dir);
    local.save_dir = resumed_dir;
    if (access(o->save_dir, W_OK)) {   /* someone else's checkpoints, read-only: use them, write none
                                          (every rank of a mesh decides alike: one file system) */
      if (o->log) fprintf(o->log, "note: %s is not writable: this run writes no checkpoints (give --save-dir D)\n",
                          o->save_dir);
      local.save_dir = NULL;
    } else if (!o->not_writer && (rc = take_save_dir(o, true, &lock_fd, err, errlen))) {
      goto done;
    }
  }
  if (o->metrics_path) {
    if (r->first_step > 0 && (rc = metrics_trim(o->metrics_path, r->first_step, err, errlen))) goto done;
    if (!(metrics = fopen(o->metrics_path, r->first_step > 0 ? "a" : "w"))) {
      snprintf(err, errlen, "%s: cannot open the metrics log for writing (--log); check the folder exists and is "
               "writable", o->metrics_path);
      rc = 2;
      goto done;
    }
  }
  if (loads_find(ex, &loads)) {
    snprintf(err, errlen, "out of memory");
    rc = 1;
    goto done;
  }
  /* the whole views hold the truth before the counts' sync_in writes every global back (a
     mesh's views are filled only by a sync_out or a resume) */
  if (loads_live(ex, o, &loads) && ex->sync_out && (rc = ex->sync_out(ex->self, err, errlen))) goto done;
  if ((rc = loads_zero(ex, o, &loads, err, errlen))) goto done;
  L = (Loop){.ex = ex, .o = o, .r = r, .dl = &dl, .vl = &vl, .loads = &loads, .metrics = metrics, .inputs = inputs,
             .targets = targets, .mb_losses = mb_losses, .G = G, .B = B, .T = T, .val_every = val_every,
             .val_windows = val_windows, .start = now_s(), .first_loss = NAN, .end = o->steps};
  /* Overlap (an executor with issue_step): step s+1 is issued before step s is waited for,
     so the device runs while the host reads a loss, logs and loads the next batch.  Not with
     per-step reads of the executor's state (the expert loads of a copying executor) */
  bool overlap = ex->issue_step && ex->finish_step && ex->whole_step && !loads_live(ex, o, &loads);
  train_stop_arm(o->log != NULL);
  for (int64_t s = r->first_step; s < o->steps; s++) {
    double t0 = now_s();
    float loss_sum = 0, norm = 0;
    bool stop = false;
    if (overlap) {
      for (int64_t g = 0; g < G; g++) data_next(&dl, inputs + g * B * T, targets + g * B * T);
      if ((rc = ex->issue_step(ex->self, G, inputs, targets, (float)train_lr_at(o, s), (float)(s + 1), err, errlen)))
        goto done;
      double t1 = now_s();
      if (pending >= 0 && (rc = finish_step(&L, pending, pending_t0, pending_t1, true, &stop, err, errlen))) {
        pending = s;   /* drained below */
        goto done;
      }
      pending = s, pending_t0 = t0, pending_t1 = t1;
      /* step s stays in flight unless its state is read next or a signal asks to stop after it */
      if (!state_read_after(&L, s) && !train_stop_signal()) continue;
      pending = -1;
      if ((rc = finish_step(&L, s, t0, t1, false, &stop, err, errlen))) goto done;
      if (stop) break;
      continue;
    }
    if (ex->whole_step) {
      for (int64_t g = 0; g < G; g++) data_next(&dl, inputs + g * B * T, targets + g * B * T);
      if ((rc = ex->whole_step(ex->self, G, inputs, targets, (float)train_lr_at(o, s), (float)(s + 1), mb_losses, &norm,
                               err, errlen)))
        goto done;
      for (int64_t g = 0; g < G; g++) loss_sum += mb_losses[g];
    } else if (ex->pipeline_step) {
      for (int64_t g = 0; g < G; g++) data_next(&dl, inputs + g * B * T, targets + g * B * T);
      if ((rc = ex->pipeline_step(ex->self, G, inputs, targets, mb_losses, err, errlen))) goto done;
      for (int64_t g = 0; g < G; g++) loss_sum += mb_losses[g];
    } else {
      for (int64_t g = 0; g < G; g++) {
        float loss;
        data_next(&dl, inputs, targets);
        if ((rc = ex->grad_step(ex->self, inputs, targets, &loss, err, errlen))) goto done;
        loss_sum += loss;
      }
    }
    float loss = loss_sum / (float)G, lr = (float)train_lr_at(o, s);
    if (!ex->whole_step && (rc = ex->optimizer_step(ex->self, lr, (float)(s + 1), &norm, err, errlen))) goto done;
    double dt = now_s() - t0;
    if ((rc = report_step(&L, s, loss, norm, dt, false, &stop, err, errlen))) goto done;
    if (stop) break;
  }
  int64_t end = L.end;
  int stopped = L.stopped;
  double first_loss = L.first_loss, comm_total = L.comm_total;
  r->n = end;
  r->seconds = now_s() - L.start;
  if (!stopped && ex->sync_out && !ex->stream_param && (rc = ex->sync_out(ex->self, err, errlen))) goto done;
  if (o->log && end > r->first_step) {
    int64_t run = end - r->first_step;
    fprintf(o->log, "done: %lld steps in %.2f s | loss %.4f -> %.4f | %.1f ms/step | %.0f tok/s\n", (long long)run,
            r->seconds, first_loss, r->losses[end - 1], r->seconds * 1e3 / (double)run,
            (double)(run * G * B * T) / r->seconds);
    if (ex->comm_wait_ms)
      fprintf(o->log, "comm wait: %.1f ms/step on average over ranks (%.1f%% of the step): time ranks were blocked on "
              "collectives, not hidden behind compute\n", comm_total / (double)run,
              100.0 * comm_total / (r->seconds * 1e3));
  }
  if (stopped) {   /* the caller prints err; 130 / 143 as a shell reports a process the signal ended */
    if (o->save_dir)
      snprintf(err, errlen, "stopped by %s after step %lld of %lld; the checkpoint of step %lld is in %s: continue with "
               "the same command and --resume %s", signal_name(stopped), (long long)end, (long long)o->steps,
               (long long)end, o->save_dir, o->save_dir);
    else
      snprintf(err, errlen, "stopped by %s after step %lld of %lld; nothing saved (give --save-dir D to write a "
               "checkpoint when stopped)", signal_name(stopped), (long long)end, (long long)o->steps);
    rc = 128 + stopped;
  }
done:
  if (pending >= 0) {   /* a step still in flight after a failure: let it land before anything is freed */
    float norm;
    char e2[256];
    ex->finish_step(ex->self, mb_losses, &norm, e2, sizeof e2);
  }
  train_stop_disarm();
  ckpt_unlock(lock_fd);
  free(loads.vals);
  if (metrics && fclose(metrics) && !rc) {
    snprintf(err, errlen, "%s: cannot write the metrics log", o->metrics_path);
    rc = 1;
  }
  data_close(&vl);
  data_close(&dl);
  free(inputs);
  free(mb_losses);
  free(targets);
  return rc;
}

int rt_views_add(RtTensor *out, int *n, const char *name, int rank, const int64_t *shape, float *data, bool experts) {
  int k = rt_views_of(rank, shape, experts);
  if (k == 1 && !(experts && rank >= 2)) {
    RtTensor v = {name, rank, {0}, data, NULL};
    for (int d = 0; d < rank; d++) v.shape[d] = shape[d];
    out[(*n)++] = v;
    return 0;
  }
  int64_t per = 1;
  for (int d = 1; d < rank; d++) per *= shape[d];
  for (int e = 0; e < k; e++) {
    char buf[512];
    RtTensor v = {NULL, rank - 1, {0}, data ? data + e * per : NULL, NULL};
    if (rt_expert_name(name, e, buf, sizeof buf) || !(v.owned_name = strdup(buf))) return -1;
    v.name = v.owned_name;
    for (int d = 1; d < rank; d++) v.shape[d - 1] = shape[d];
    out[(*n)++] = v;
  }
  return 0;
}

void rt_views_free(RtTensor *v, int n) {
  for (int i = 0; v && i < n; i++) {
    free(v[i].owned_name);
    v[i].owned_name = NULL;
  }
}
