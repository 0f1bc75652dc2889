/* runtime/exec/train_common.c — what `loom train` and compiled training executables share:
   parameters from a seed or a checkpoint, the executor, the loop, and --out. */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>
#include <unistd.h>

#include "runtime/io/checkpoint.h"
#include "runtime/io/safetensors.h"
#include "runtime/exec/exec.h"
#include "runtime/exec/pipe_walk.h"

/* A tensor of --out streamed from the executor (Executor.stream_param). */
static int fill_param(void *arg, int i, const void **data, char *err, size_t errlen) {
  const Executor *ex = arg;
  const float *d = NULL;
  int rc = ex->stream_param(ex->self, i, &d, err, errlen);
  *data = d;
  return rc;
}

/* Removes a folder of files (a partial --out DIR/). */
static void remove_flat_dir(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char p[8192];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    unlink(p);
  }
  if (d) closedir(d);
  rmdir(dir);
}

/* An output path's folder exists and is writable (checked before step 1, so that a run does
   not train for hours and then fail to write).  dir_form: the path names a folder (--out DIR/,
   --save-dir): it or, when it does not exist yet, its parent must be a writable folder. */
static int check_output(const char *path, const char *flag, bool dir_form, char *err, size_t errlen) {
  if (!path || !*path) return 0;
  char p[4096];
  snprintf(p, sizeof p, "%s", path);
  for (size_t l = strlen(p); l > 1 && p[l - 1] == '/'; l--) p[l - 1] = 0;
  struct stat sb;
  if (dir_form && stat(p, &sb) == 0) {
    if (!S_ISDIR(sb.st_mode) || access(p, W_OK | X_OK)) {
      snprintf(err, errlen, "%s %s: %s; give a folder this process can write", flag, path,
               S_ISDIR(sb.st_mode) ? "the folder is not writable" : "not a folder");
      return EXIT_USAGE;
    }
    return 0;
  }
  if (!dir_form && stat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) {
    snprintf(err, errlen, "%s %s: a folder, where a file is to be written; give a file name", flag, path);
    return EXIT_USAGE;
  }
  char *slash = strrchr(p, '/');
  if (!slash) snprintf(p, sizeof p, ".");
  else if (slash == p) p[1] = 0;
  else *slash = 0;
  if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
    snprintf(err, errlen, "%s %s: the folder %s does not exist; create it first or give another path", flag, path, p);
    return EXIT_USAGE;
  }
  if (access(p, W_OK | X_OK)) {
    snprintf(err, errlen, "%s %s: the folder %s is not writable; give another path", flag, path, p);
    return EXIT_USAGE;
  }
  return 0;
}

/* The final parameters under their HF names (whole: the executor gathered them, or streams
   them one at a time), and per step the loss, the gradient norm before clipping and the
   learning rate. */
static int write_out(const Executor *ex, const TrainResult *res, const RunPlan *plan, char *err, size_t errlen) {
  const char *path = plan->out;
  bool stream = ex->stream_param && !hf_export_wanted(path);
  /* a Hugging Face folder takes the whole parameters at once (bf16 conversion, sharding) */
  if (ex->stream_param && !stream && ex->sync_out && ex->sync_out(ex->self, err, errlen)) return EXIT_RUN;
  FILE *log = plan->opt.log;
  int n = ex->n_params, k = 0;
  StTensor *st = calloc((size_t)n + 4, sizeof *st);
  if (!st) {
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  for (int i = 0; i < n; i++, k++) {
    const RtTensor *t = &ex->params[i];
    st[k].name = (char *)t->name;
    st[k].dtype = ST_F32;
    st[k].rank = t->rank;
    int64_t count = 1;
    for (int d = 0; d < t->rank; d++) count *= (st[k].shape[d] = t->shape[d]);
    st[k].nbytes = (uint64_t)count * 4;
    st[k].data = stream ? NULL : t->data;
  }
  if (hf_export_wanted(path)) {   /* a folder for transformers: the weights alone, metrics apart */
    char dir[4096], tmp[4200];
    snprintf(dir, sizeof dir, "%s", path);
    for (size_t l = strlen(dir); l > 1 && dir[l - 1] == '/'; l--) dir[l - 1] = 0;
    /* a new folder is written whole or not at all: in DIR.tmp.<pid>, renamed when complete */
    struct stat sb;
    bool fresh = stat(dir, &sb) != 0;
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", dir, (long)getpid());
    HfMetrics hm = {res->n, res->losses, res->grad_norms, res->lrs, res->val_losses};
    int rc = hf_export_dir(fresh ? tmp : dir, plan->spec_path, st, n, plan->out_bf16, plan->tokenizer, &hm,
                           fresh ? NULL : log, err, errlen);
    if (fresh && !rc && rename(tmp, dir)) {
      snprintf(err, errlen, "--out %s: cannot rename %s to it: %s", path, tmp, strerror(errno));
      rc = EXIT_RUN;
    }
    if (fresh && rc) remove_flat_dir(tmp);
    if (fresh && !rc && log) fprintf(log, "wrote %s/ for transformers (config.json, model.safetensors, ...)\n", dir);
    free(st);
    return rc;
  }
  if (plan->out_bf16 || plan->tokenizer) {
    free(st);
    snprintf(err, errlen, "--dtype and --tokenizer are for a Hugging Face folder: give --out DIR/ (with the slash)");
    return EXIT_USAGE;
  }
  const float *hist[3] = {res->losses, res->grad_norms, res->lrs};
  const char *names[3] = {"losses", "grad_norms", "lrs"};
  for (int h = 0; h < 3; h++, k++)
    st[k] = (StTensor){(char *)names[h], ST_F32, 1, {res->n}, (uint64_t)res->n * 4, hist[h]};
  if (res->val_losses)   /* NaN at the steps without a validation */
    st[k++] = (StTensor){"val_losses", ST_F32, 1, {res->n}, (uint64_t)res->n * 4, res->val_losses};
  int rc = st_write_each(path, st, k, NULL, NULL, 0, stream ? fill_param : NULL, (void *)ex, err, errlen);
  if (!rc && log)
    fprintf(log, "wrote %s (%d parameters, and losses, grad_norms%s and lrs [%lld])\n", path, n,
            res->val_losses ? ", val_losses" : "", (long long)res->n);
  free(st);
  return rc;
}

int train_and_write(Executor *ex, const RunPlan *plan, char *err, size_t errlen) {
  TrainResult res;
  memset(&res, 0, sizeof res);
  /* every output checked before step 1; the save dir made first (--out may lie inside it),
     then locked by train_run */
  int rc = 0;
  if (plan->opt.save_dir && !plan->opt.not_writer && ckpt_mkdir_p(plan->opt.save_dir, err, errlen)) rc = EXIT_USAGE;
  if (!rc) rc = check_output(plan->out, "--out", plan->out && hf_export_wanted(plan->out), err, errlen);
  if (!rc) rc = check_output(plan->trace_out, "--trace-out", false, err, errlen);
  if (!rc) rc = check_output(plan->opt.metrics_path, "--log", false, err, errlen);
  if (!rc) rc = train_run(ex, &plan->opt, &res, err, errlen);
  if (!rc && plan->out) rc = write_out(ex, &res, plan, err, errlen);
  if (!rc && plan->out_elsewhere && ex->stream_param) {   /* take part in the writer's gathers */
    if (hf_export_wanted(plan->out_elsewhere)) {
      rc = ex->sync_out ? ex->sync_out(ex->self, err, errlen) : 0;
    } else {
      const float *d;
      for (int i = 0; !rc && i < ex->n_params; i++) rc = ex->stream_param(ex->self, i, &d, err, errlen);
    }
  }
  train_result_free(&res);
  return rc;
}

/* After a pipelined run on walker w: the measured idle per pp rank beside the predicted
   bubble, the predicted and measured stash peaks, and the measured timeline (--trace-out). */
int pipe_walk_report(const PipeWalk *w, const int64_t *predicted, const RunPlan *plan, const char *backend, char *err,
                     size_t errlen) {
  int rc = 0;
  if (w->steps) {
    /* measured idle against the schedule's prediction with equal unit costs */
    const Schedule *s = &w->sched;
    double cost[256][3];
    for (int c = 0; c < 256; c++) cost[c][0] = cost[c][1] = cost[c][2] = 1;
    SimResult sim;
    if (s->chunks <= 256 && !schedule_simulate(s, (const double (*)[3])cost, &sim, err, errlen)) {
      if (plan->opt.log) {
        fprintf(plan->opt.log, "pipeline %s, pp=%d, %d micro-batches: predicted bubble %.3f (equal F, B, W); measured idle "
                "per rank:", pipe_kind_names[s->kind], s->p, s->m, sim.bubble);
        for (int q = 0; q < s->p; q++) {
          double busy = w->busy_us[q], span = w->span_us[q];
          fprintf(plan->opt.log, " %.3f", busy > 0 ? (span - busy) / busy : 0);
        }
        fprintf(plan->opt.log, " (idle / busy, over %lld steps)\n", (long long)w->steps);
        fprintf(plan->opt.log, "stash peak per pp rank, predicted / measured (bytes):");
        for (int q = 0; q < s->p; q++)
          fprintf(plan->opt.log, " %lld / %lld", (long long)predicted[q], (long long)w->stash_peak[pipe_walk_speaker(w, q)]);
        fputc('\n', plan->opt.log);
      }
      sim_result_free(&sim, s->p);
    }
    if (plan->trace_out) {
      rc = pipe_walk_trace(w, plan->trace_out, backend, err, errlen);
      if (!rc && plan->opt.log) fprintf(plan->opt.log, "wrote the measured timeline to %s\n", plan->trace_out);
    }
  }
  return rc;
}
