/* Atomic training checkpoints. See checkpoint.h for the layout and the commit protocol. */
#include "runtime/io/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "runtime/io/checkpoint_internal.h"
#include "runtime/io/seterr.h"

static const char *const FILES[3] = {"model.safetensors", "optimizer.safetensors",
                                     "state.json"};
enum { F_MODEL, F_OPT, F_STATE };

static int has_done(const char *dir) {
  char *p = ckpt_pjoin(dir, "DONE");
  struct stat st;
  int ok = p && stat(p, &st) == 0 && S_ISREG(st.st_mode);
  free(p);
  return ok;
}

/* "step_<digits>" exactly (at most 18 digits, so it fits int64); returns the step or -1.
 * Names such as step_00000012.tmp.123 (unfinished writes) are not steps. */
static int64_t ckpt_parse_step_name(const char *name) {
  if (strncmp(name, "step_", 5) != 0) return -1;
  const char *s = name + 5;
  size_t n = strlen(s);
  if (n == 0 || n > 18 || strspn(s, "0123456789") != n) return -1;
  return (int64_t)strtoll(s, NULL, 10);
}

/* ---- save ----------------------------------------------------------------------------- */

static int write_tensors(const char *path, const CkptTensor *ts, int n, char *err,
                         size_t errlen) {
  if (n < 0 || (n > 0 && !ts)) {
    seterr(err, errlen, "%s: %d tensors given with a NULL array", path, n);
    return 2;
  }
  StTensor *st = calloc((size_t)(n > 0 ? n : 1), sizeof *st);
  if (!st) {
    seterr(err, errlen, "%s: out of memory", path);
    return 1;
  }
  for (int i = 0; i < n; i++) {
    int64_t numel = (ts[i].rank >= 0 && ts[i].rank <= ST_MAX_RANK)
                        ? st_numel(ts[i].rank, ts[i].shape) : -1;
    if (numel < 0 || numel > INT64_MAX / 4) {
      seterr(err, errlen, "%s: tensor %d ('%s') has rank %d or a shape that is negative or "
             "too large", path, i, ts[i].name ? ts[i].name : "(null)", ts[i].rank);
      free(st);
      return 2;
    }
    st[i].name = (char *)ts[i].name; /* st_write only reads it */
    st[i].dtype = ST_F32;
    st[i].rank = ts[i].rank;
    memcpy(st[i].shape, ts[i].shape, sizeof st[i].shape);
    st[i].nbytes = (uint64_t)numel * 4; /* f32 is stored little-endian: the host order here */
    st[i].data = ts[i].data;
  }
  /* "format": "pt" lets Hugging Face loaders accept model.safetensors as it is. */
  const char *mk[] = {"format"}, *mv[] = {"pt"};
  int rc = st_write(path, st, n, mk, mv, 1, err, errlen);
  free(st);
  return rc;
}

/* DONE: the step and, for each file, its size and CRC-32C as 8 hex digits. */
static char *done_json(int64_t step, const uint64_t size[3], const uint32_t crc[3]) {
  json_t *files = json_object();
  json_t *root = json_pack("{s:s, s:i, s:I, s:s, s:o}", "format", "loom-checkpoint",
                           "version", 1, "step", (json_int_t)step, "checksum", "crc32c",
                           "files", files);
  if (!root) return NULL; /* json_pack stole files */
  for (int i = 0; i < 3; i++) {
    char hex[9];
    snprintf(hex, sizeof hex, "%08" PRIx32, crc[i]);
    if (json_object_set_new(files, FILES[i], json_pack("{s:I, s:s}", "bytes",
                                                       (json_int_t)size[i], "crc32c", hex))) {
      json_decref(root);
      return NULL;
    }
  }
  char *s = json_dumps(root, JSON_INDENT(2));
  json_decref(root);
  return s;
}

int ckpt_save(const char *save_dir, int64_t step, const CkptTensor *params, int n_params,
              const CkptTensor *state, int n_state, const char *state_json, char *err,
              size_t errlen) {
  if (err && errlen) err[0] = 0;
  if (!save_dir || !*save_dir || step < 0 || step > 999999999999999999LL) {
    seterr(err, errlen, "checkpoint: need a save directory and a step from 0 to 10^18-1 "
           "(got step %" PRId64 ")", step);
    return 2;
  }
  json_error_t je;
  json_t *js = state_json ? json_loads(state_json, 0, &je) : NULL;
  if (!js) {
    seterr(err, errlen, "%s: checkpoint state is not valid JSON (line %d: %s); this is a "
           "bug in the caller", save_dir, state_json ? je.line : 0,
           state_json ? je.text : "NULL text");
    return 2;
  }
  json_decref(js);
  int rc = ckpt_mkdir_p(save_dir, err, errlen);
  if (rc) return rc;

  char name[64], tmpname[96], oldname[96];
  snprintf(name, sizeof name, "step_%08" PRId64, step);
  snprintf(tmpname, sizeof tmpname, "%s.tmp.%ld", name, (long)getpid());
  snprintf(oldname, sizeof oldname, "%s.old.%ld", name, (long)getpid());
  char *fin = ckpt_pjoin(save_dir, name), *tmp = ckpt_pjoin(save_dir, tmpname);
  char *old = ckpt_pjoin(save_dir, oldname), *path[3] = {0}, *done = NULL;
  int renamed = 0, moved_old = 0;
  char *text = NULL;
  uint64_t size[3];
  uint32_t crc[3];
  if (!fin || !tmp || !old) goto oom;

  /* A folder of this name can only be a dead writer's whose pid we now reuse. */
  if (ckpt_is_dir(tmp) && (rc = ckpt_remove_step_dir(tmp, err, errlen))) goto out;
  if (mkdir(tmp, 0777) != 0) {
    seterr(err, errlen, "%s: cannot create directory: %s", tmp, strerror(errno));
    rc = 1;
    goto out;
  }
  for (int i = 0; i < 3; i++)
    if (!(path[i] = ckpt_pjoin(tmp, FILES[i]))) goto oom;
  if ((rc = write_tensors(path[F_MODEL], params, n_params, err, errlen)) ||
      (rc = write_tensors(path[F_OPT], state, n_state, err, errlen)) ||
      (rc = ckpt_write_text(path[F_STATE], state_json, err, errlen)))
    goto out;
  /* Checksums of what is on disk, read back, rather than of what we meant to write. */
  for (int i = 0; i < 3; i++)
    if ((rc = ckpt_file_digest(path[i], &size[i], &crc[i], err, errlen))) goto out;
  if ((rc = ckpt_fsync_dir(tmp, err, errlen))) goto out;

  /* rename() cannot replace a non-empty directory: move an existing folder of this step
   * aside (its new name is not a step name, so readers ignore it), then put ours in. */
  if (ckpt_is_dir(fin)) {
    if (ckpt_is_dir(old)) (void)ckpt_remove_step_dir(old, err, errlen); /* a dead writer's, same pid */
    if (rename(fin, old) != 0) {
      seterr(err, errlen, "%s: cannot move the existing checkpoint aside to %s: %s", fin, old,
             strerror(errno));
      rc = 1;
      goto out;
    }
    moved_old = 1;
  }
  if (rename(tmp, fin) != 0) {
    seterr(err, errlen, "%s: cannot rename %s to it: %s", fin, tmp, strerror(errno));
    if (moved_old) (void)rename(old, fin); /* put the previous one back */
    rc = 1;
    goto out;
  }
  renamed = 1;
  if ((rc = ckpt_fsync_dir(save_dir, err, errlen))) goto out;
  if (moved_old) {
    char ignored[256];
    (void)ckpt_remove_step_dir(old, ignored, sizeof ignored); /* a leftover is harmless */
  }

  /* Last: the marker that makes the folder a checkpoint. */
  if (!(text = done_json(step, size, crc)) || !(done = ckpt_pjoin(fin, "DONE"))) goto oom;
  rc = ckpt_write_text(done, text, err, errlen);
  goto out;
oom:
  seterr(err, errlen, "%s: out of memory writing checkpoint step %" PRId64, save_dir, step);
  rc = 1;
out:
  if (rc) {
    char ignored[256];
    (void)ckpt_remove_step_dir(renamed ? fin : tmp, ignored, sizeof ignored);
  }
  for (int i = 0; i < 3; i++) free(path[i]);
  free(text);
  free(done);
  free(fin);
  free(tmp);
  free(old);
  return rc;
}

/* ---- DONE marker ---------------------------------------------------------------------- */

int ckpt_read_done(const char *dir, Done *d, char *err, size_t errlen) {
  char *p = ckpt_pjoin(dir, "DONE");
  if (!p) {
    seterr(err, errlen, "%s: out of memory", dir);
    return 1;
  }
  struct stat st;
  if (stat(p, &st) != 0 && errno == ENOENT) {
    seterr(err, errlen, "%s: incomplete checkpoint: the writer did not finish (no DONE "
           "marker); resume from an older step or delete this folder", dir);
    free(p);
    return 2;
  }
  json_error_t je;
  json_t *root = json_load_file(p, 0, &je);
  int rc = 2;
  const char *why = NULL;
  if (!root) {
    seterr(err, errlen, "%s: DONE marker is unreadable or damaged (line %d: %s); the "
           "checkpoint cannot be verified, resume from an older step", dir, je.line, je.text);
    free(p);
    return 2;
  }
  json_t *files = json_object_get(root, "files");
  json_t *step = json_object_get(root, "step");
  if (!json_is_integer(step) || json_integer_value(step) < 0) why = "no valid \"step\"";
  else if (!json_is_string(json_object_get(root, "checksum")) ||
           strcmp(json_string_value(json_object_get(root, "checksum")), "crc32c"))
    why = "checksum is not \"crc32c\"";
  else if (!json_is_object(files)) why = "no \"files\" object";
  /* a sharded checkpoint (checkpoint_shards.c): state.json and "shards" shard files */
  json_t *shards = json_object_get(root, "shards");
  memset(d, 0, sizeof *d);
  if (!why && shards) {
    json_int_t ns = json_is_integer(shards) ? json_integer_value(shards) : 0;
    if (ns < 1 || ns > 1 << 20) why = "\"shards\" is not a positive count";
    else if (!(d->sh_size = calloc((size_t)ns, sizeof *d->sh_size)) || !(d->sh_crc = calloc((size_t)ns, sizeof *d->sh_crc)))
      why = "out of memory";
    else d->n_shards = (int)ns;
  }
  for (int i = 0; !why && i < 3 + d->n_shards; i++) {
    if (d->n_shards && i < 2) continue;   /* no model.safetensors, optimizer.safetensors */
    char shard[64];
    if (i >= 3) ckpt_shard_name(i - 3, d->n_shards, shard, sizeof shard);
    json_t *f = json_object_get(files, i < 3 ? FILES[i] : shard);
    json_t *b = json_object_get(f, "bytes"), *c = json_object_get(f, "crc32c");
    const char *h = json_string_value(c);
    if (!json_is_integer(b) || json_integer_value(b) < 0 || !h || strlen(h) != 8 ||
        strspn(h, "0123456789abcdefABCDEF") != 8) {
      why = "a file entry lacks \"bytes\" or an 8-digit hex \"crc32c\"";
      break;
    }
    uint64_t size = (uint64_t)json_integer_value(b);
    uint32_t crc = (uint32_t)strtoul(h, NULL, 16);
    if (i < 3) d->size[i] = size, d->crc[i] = crc;
    else d->sh_size[i - 3] = size, d->sh_crc[i - 3] = crc;
  }
  if (why) {
    seterr(err, errlen, "%s: DONE marker is damaged (%s); the checkpoint cannot be verified, "
           "resume from an older step", dir, why);
    ckpt_done_free(d);
  } else {
    d->step = json_integer_value(step);
    rc = 0;
  }
  json_decref(root);
  free(p);
  return rc;
}

void ckpt_done_free(Done *d) {
  free(d->sh_size);
  free(d->sh_crc);
  d->sh_size = NULL;
  d->sh_crc = NULL;
  d->n_shards = 0;
}

/* ---- latest --------------------------------------------------------------------------- */

int ckpt_latest(const char *path, char *stepdir, size_t n, int64_t *step, char *err,
                size_t errlen) {
  return ckpt_latest_below(path, INT64_MAX, stepdir, n, step, err, errlen);
}

int ckpt_latest_below(const char *path, int64_t below, char *stepdir, size_t n, int64_t *step, char *err,
                      size_t errlen) {
  if (err && errlen) err[0] = 0;
  struct stat st;
  int found = stat(path, &st) == 0;
  if (!found || !S_ISDIR(st.st_mode)) {
    seterr(err, errlen, "%s: %s; pass the --save directory or one of its step_* folders",
           path, !found ? strerror(errno) : "not a directory");
    return 2;
  }
  int64_t best = -1;
  char *bestname = NULL;
  if (has_done(path)) { /* a step folder itself */
    Done d;
    int rc = ckpt_read_done(path, &d, err, errlen);
    if (rc) return rc;
    best = d.step;
    ckpt_done_free(&d);
    /* a step_N folder whose DONE says another step: a link to, or a copy of, another step */
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/') len--;
    const char *base = path + len;
    while (base > path && base[-1] != '/') base--;
    char name[32];
    snprintf(name, sizeof name, "%.*s", (int)(path + len - base), base);
    int64_t named = ckpt_parse_step_name(name);
    if (named >= 0 && named != best) {
      seterr(err, errlen, "%s: the folder's name says step %" PRId64 " but its DONE records step %" PRId64
             " (a link to or a copy of another step's folder); pass that step's own folder", path, named, best);
      return 2;
    }
  } else {
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/') len--; /* "save/step_00000003/" names a step */
    const char *base = path + len;
    while (base > path && base[-1] != '/') base--;
    char name[32];
    snprintf(name, sizeof name, "%.*s", (int)(path + len - base), base);
    if (ckpt_parse_step_name(name) >= 0)
      return ckpt_read_done(path, &(Done){0}, err, errlen); /* reports the missing DONE */
    DIR *dir = opendir(path);
    if (!dir) {
      seterr(err, errlen, "%s: cannot list directory: %s", path, strerror(errno));
      return 1;
    }
    int64_t skipped = -1; /* newest folder without DONE, to mention it */
    int n_skipped = 0;
    char link[64] = "";   /* a step_* entry that is a symbolic link, to mention it */
    struct dirent *e;
    while ((e = readdir(dir))) {
      int64_t s = ckpt_parse_step_name(e->d_name);
      if (s < 0 || s >= below) continue;
      char *p = ckpt_pjoin(path, e->d_name);
      if (!p) {
        closedir(dir);
        free(bestname);
        seterr(err, errlen, "%s: out of memory", path);
        return 1;
      }
      struct stat ls;
      if (lstat(p, &ls) == 0 && S_ISLNK(ls.st_mode)) {   /* it would resume another step under this one's name */
        snprintf(link, sizeof link, "%.40s", e->d_name);   /* a step name: at most 23 characters */
      } else if (ckpt_is_dir(p) && has_done(p)) {
        if (s > best) {
          best = s;
          free(bestname);
          bestname = p;
          p = NULL;
        }
      } else if (ckpt_is_dir(p)) {
        n_skipped++;
        if (s > skipped) skipped = s;
      }
      free(p);
    }
    closedir(dir);
    if (best < 0) {
      seterr(err, errlen, "%s: no complete checkpoint (no step_* folder with a DONE marker%s"
             "); train from the start or pass another --resume folder", path,
             n_skipped ? "; the ones here were not finished by their writer" : "");
      return 2;
    }
    if (skipped > best)
      seterr(err, errlen, "%s: skipped %d checkpoint folder%s without a DONE marker (newest "
             "step %" PRId64 ", its writer did not finish); using step %" PRId64, path,
             n_skipped, n_skipped == 1 ? "" : "s", skipped, best);
    else if (link[0])
      seterr(err, errlen, "%s: skipped %s, a symbolic link (a checkpoint is a folder of its own); using step %" PRId64,
             path, link, best);
  }
  const char *out = bestname ? bestname : path;
  if ((size_t)snprintf(stepdir, n, "%s", out) >= n) {
    seterr(err, errlen, "%s: path too long for the caller's %zu-byte buffer", out, n);
    free(bestname);
    return 1;
  }
  free(bestname);
  *step = best;
  return 0;
}

/* ---- load ----------------------------------------------------------------------------- */

/* Compares a file's size and CRC with DONE. buf may be NULL: the file is then read. */
static int verify(const char *path, const uint8_t *buf, size_t size, const Done *d, int i,
                  char *err, size_t errlen) {
  uint64_t sz = size;
  uint32_t crc;
  if (buf) crc = ckpt_crc32c(0, buf, size);
  else {
    int rc = ckpt_file_digest(path, &sz, &crc, err, errlen);
    if (rc) return rc;
  }
  if (sz != d->size[i]) {
    seterr(err, errlen, "%s is corrupt: it is %" PRIu64 " bytes but DONE recorded %" PRIu64
           "; the file was truncated or changed after it was written", path, sz, d->size[i]);
    return 2;
  }
  if (crc != d->crc[i]) {
    seterr(err, errlen, "%s is corrupt: checksum mismatch (crc32c %08" PRIx32 ", DONE "
           "recorded %08" PRIx32 "); the file was changed or damaged after it was written",
           path, crc, d->crc[i]);
    return 2;
  }
  return 0;
}

static int load_st(const char *path, StFile *f, const Done *d, int i, char *err,
                   size_t errlen) {
  struct stat st;
  if (stat(path, &st) != 0) {
    seterr(err, errlen, "%s is missing: %s; the folder was changed after the checkpoint was "
           "written", path, strerror(errno));
    return 2;
  }
  if ((uint64_t)st.st_size != d->size[i]) return verify(path, NULL, 0, d, i, err, errlen);
  int rc = st_read(path, f, err, errlen);
  if (rc) {
    /* Prefer the precise diagnosis: if the bytes differ from DONE, say so. */
    char err2[512];
    int rc2 = verify(path, NULL, 0, d, i, err2, sizeof err2);
    if (rc2 == 2) seterr(err, errlen, "%s", err2);
    return rc;
  }
  rc = verify(path, f->buf, f->size, d, i, err, errlen);
  if (rc) st_close(f);
  return rc;
}

int ckpt_load(const char *stepdir, Checkpoint *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  Done d;
  int rc = ckpt_read_done(stepdir, &d, err, errlen);
  if (rc) return rc;
  char *path[3] = {0};
  uint8_t *buf = NULL;
  size_t size = 0;
  for (int i = 0; i < 3; i++)
    if (!(path[i] = ckpt_pjoin(stepdir, FILES[i]))) {
      seterr(err, errlen, "%s: out of memory", stepdir);
      rc = 1;
      goto out;
    }
  if (d.n_shards) {   /* one shard per rank of the writer (checkpoint_shards.c), memory-mapped */
    if ((rc = ckpt_load_shards(stepdir, &d, out, err, errlen))) goto out;
  } else if ((rc = load_st(path[F_MODEL], &out->params, &d, F_MODEL, err, errlen)) ||
             (rc = load_st(path[F_OPT], &out->state, &d, F_OPT, err, errlen))) {
    goto out;
  }
  struct stat st;
  if (stat(path[F_STATE], &st) != 0) {
    seterr(err, errlen, "%s is missing: %s; the folder was changed after the checkpoint was "
           "written", path[F_STATE], strerror(errno));
    rc = 2;
    goto out;
  }
  if ((rc = rt_read_file(path[F_STATE], &buf, &size, err, errlen)) ||
      (rc = verify(path[F_STATE], buf, size, &d, F_STATE, err, errlen)))
    goto out;
  uint8_t *b = realloc(buf, size + 1); /* NUL-terminate for the caller */
  if (!b) {
    seterr(err, errlen, "%s: out of memory", path[F_STATE]);
    rc = 1;
    goto out;
  }
  buf = b;
  buf[size] = 0;
  json_error_t je;
  json_t *js = json_loads((char *)buf, 0, &je);
  if (!js) {
    seterr(err, errlen, "%s: not valid JSON (line %d: %s) although its checksum matches; it "
           "was written wrong", path[F_STATE], je.line, je.text);
    rc = 2;
    goto out;
  }
  json_decref(js);
  out->state_json = (char *)buf;
  buf = NULL;
  out->step = d.step;
out:
  free(buf);
  for (int i = 0; i < 3; i++) free(path[i]);
  ckpt_done_free(&d);
  if (rc) ckpt_free(out);
  return rc;
}

void ckpt_free(Checkpoint *c) {
  if (!c) return;
  st_close(&c->params);
  st_close(&c->state);
  for (int i = 0; c->shards && i < c->n_shards; i++) st_close(&c->shards[i]);
  free(c->shards);
  free(c->state_json);
  memset(c, 0, sizeof *c);
}

/* ---- prune ---------------------------------------------------------------------------- */

typedef struct {
  int64_t step;
  char *path;
} StepDir;

static int cmp_desc(const void *a, const void *b) {
  int64_t x = ((const StepDir *)a)->step, y = ((const StepDir *)b)->step;
  return (x < y) - (x > y);
}

int ckpt_prune(const char *save_dir, int keep, char *err, size_t errlen) {
  if (keep < 1) {
    seterr(err, errlen, "%s: must keep at least 1 checkpoint, not %d", save_dir, keep);
    return 2;
  }
  DIR *dir = opendir(save_dir);
  if (!dir) {
    seterr(err, errlen, "%s: cannot list directory: %s", save_dir, strerror(errno));
    return 1;
  }
  StepDir *v = NULL;
  size_t n = 0, cap = 0;
  int rc = 0;
  struct dirent *e;
  while (!rc && (e = readdir(dir))) {
    int64_t s = ckpt_parse_step_name(e->d_name);
    if (s < 0) continue;
    char *p = ckpt_pjoin(save_dir, e->d_name);
    if (p && !(ckpt_is_dir(p) && has_done(p))) { /* unfinished folders are not ours to judge */
      free(p);
      continue;
    }
    if (p && n == cap) {
      StepDir *nv = realloc(v, (cap = cap ? 2 * cap : 16) * sizeof *v);
      if (nv) v = nv;
      else free(p), p = NULL;
    }
    if (!p) rc = 1;
    else v[n++] = (StepDir){s, p};
  }
  closedir(dir);
  if (rc) seterr(err, errlen, "%s: out of memory listing checkpoints", save_dir);
  if (n > 0) qsort(v, n, sizeof *v, cmp_desc);
  for (size_t i = (size_t)keep; !rc && i < n; i++) rc = ckpt_remove_step_dir(v[i].path, err, errlen);
  for (size_t i = 0; i < n; i++) free(v[i].path);
  free(v);
  return rc;
}
