/* runtime/io/checkpoint_shards.c — sharded checkpoints: every rank of a multi-process mesh
 * writes its own pieces (see checkpoint.h, "sharded checkpoints"), and any layout reads them
 * back: a piece of any placement, or a range of the whole tensor, is assembled from the
 * writers' pieces by intersecting runs of whole-tensor indices (rt_piece_runs: both lists
 * ascend, so one merge pass per source piece). */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/io/checkpoint.h"
#include "runtime/io/checkpoint_internal.h"
#include "runtime/io/seterr.h"

/* ---------------------------------------------------------------- runs */

typedef struct {
  int64_t w, p, n;
} Run;

typedef struct {
  Run *r;
  int64_t n, cap;
  int oom;
} Runs;

static void add_run(int64_t w, int64_t p, int64_t n, void *arg) {
  Runs *rs = arg;
  if (rs->oom) return;
  if (rs->n > 0) {   /* merge with the previous one when contiguous in both */
    Run *last = &rs->r[rs->n - 1];
    if (last->w + last->n == w && last->p + last->n == p) {
      last->n += n;
      return;
    }
  }
  if (rs->n == rs->cap) {
    int64_t cap = rs->cap ? 2 * rs->cap : 64;
    Run *r = realloc(rs->r, sizeof *r * (size_t)cap);
    if (!r) {
      rs->oom = 1;
      return;
    }
    rs->r = r, rs->cap = cap;
  }
  rs->r[rs->n++] = (Run){w, p, n};
}

/* Copies the elements both run lists hold from src (f32, unaligned) to out; returns how many.
   The whole-tensor intervals copied go to `seen` (merged when contiguous), so that the caller
   can tell two shards that hold the same elements apart from a complete cover. */
static int64_t merge_copy(const Runs *t, const Runs *s, const uint8_t *src, float *out, Runs *seen) {
  int64_t i = 0, j = 0, copied = 0;
  while (i < t->n && j < s->n) {
    const Run *a = &t->r[i], *b = &s->r[j];
    int64_t lo = a->w > b->w ? a->w : b->w, hi = a->w + a->n < b->w + b->n ? a->w + a->n : b->w + b->n;
    if (lo < hi) {
      memcpy(out + a->p + (lo - a->w), src + 4 * (size_t)(b->p + (lo - b->w)), 4 * (size_t)(hi - lo));
      copied += hi - lo;
      add_run(lo, lo, hi - lo, seen);
    }
    if (a->w + a->n <= b->w + b->n) i++;
    else j++;
  }
  return copied;
}

static int cmp_run(const void *x, const void *y) {
  int64_t a = ((const Run *)x)->w, b = ((const Run *)y)->w;
  return (a > b) - (a < b);
}

/* The first element that two of the intervals share, or -1 (sorts them). */
static int64_t first_overlap(Runs *seen) {
  if (seen->n > 1) qsort(seen->r, (size_t)seen->n, sizeof *seen->r, cmp_run);
  for (int64_t i = 1; i < seen->n; i++)
    if (seen->r[i].w < seen->r[i - 1].w + seen->r[i - 1].n) return seen->r[i].w;
  return -1;
}

/* ---------------------------------------------------------------- metadata */

static const char *meta(const StFile *f, const char *key) {
  for (int i = 0; i < f->n_meta; i++)
    if (!strcmp(f->meta_keys[i], key)) return f->meta_values[i];
  return NULL;
}

static int parse_ints(const char *s, int64_t *out, int n) {
  for (int i = 0; i < n; i++) {
    char *end;
    if (!s) return -1;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || (i < n - 1 ? *end != ',' : *end != 0)) return -1;
    out[i] = v;
    s = end + 1;
  }
  return 0;
}

/* A shard's mesh and coordinates ("loom.mesh", "loom.coord": 5 integers each); -1 when
   either is missing or malformed.  ckpt_load_shards checks them against each other. */
static int shard_place(const StFile *f, int64_t mesh[5], int64_t coord[5]) {
  return parse_ints(meta(f, "loom.mesh"), mesh, 5) || parse_ints(meta(f, "loom.coord"), coord, 5) ? -1 : 0;
}

static void dims_text(int rank, const int64_t *d, char *out, size_t n) {
  size_t k = (size_t)snprintf(out, n, "[");
  for (int i = 0; i < rank && k < n; i++) k += (size_t)snprintf(out + k, n - k, "%s%" PRId64, i ? "," : "", d[i]);
  if (k < n) snprintf(out + k, n - k, "]");
}

/* The whole tensor a piece belongs to: its rank and dims. */
typedef struct {
  int rank;
  int64_t dims[ST_MAX_RANK], n;
} Whole;

static int too_large(const StFile *f, const StTensor *t, char *err, size_t errlen) {
  char shape[160];
  dims_text(t->rank, t->shape, shape, sizeof shape);
  seterr(err, errlen, "%s: tensor '%s' of shape %s, split over the mesh as loom.split says, makes a whole tensor too "
         "large to index: a damaged shard", f->path, t->name, shape);
  return 2;
}

/* The placement of shard f's tensor t: the piece's runs in the whole tensor, and the whole's
   dims (the piece's times the sizes of the axes that split them, each within int64). */
static int source_runs(const StFile *f, const StTensor *t, Runs *rs, Whole *whole, char *err, size_t errlen) {
  char key[600];
  snprintf(key, sizeof key, "loom.split.%s", t->name);
  int64_t mesh[5], coord64[5], split[5];
  if (shard_place(f, mesh, coord64) || parse_ints(meta(f, key), split, 5) || t->dtype != ST_F32) {
    seterr(err, errlen, "%s: tensor '%s' lacks its placement (loom.mesh, loom.coord, %s) or is not F32: not a loom "
           "shard, or a damaged one", f->path, t->name, key);
    return 2;
  }
  RtGlobal g;
  memset(&g, 0, sizeof g);
  g.ir_rank = (int8_t)t->rank;
  g.n = st_numel(t->rank, t->shape);
  int coord[5];
  whole->rank = t->rank;
  for (int d = 0; d < t->rank; d++) g.piece_dims[d] = whole->dims[d] = t->shape[d];
  for (int a = 0; a < 5; a++) {
    if (split[a] < 0 || split[a] > t->rank || mesh[a] < 1 || mesh[a] > 1 << 20 || coord64[a] < 0 ||
        coord64[a] >= mesh[a]) {
      seterr(err, errlen, "%s: tensor '%s' has a placement outside its mesh or its dims (loom.split %" PRId64 ",%" PRId64
             ",%" PRId64 ",%" PRId64 ",%" PRId64 " for rank %d)", f->path, t->name, split[0], split[1], split[2],
             split[3], split[4], t->rank);
      return 2;
    }
    g.split[a] = (int8_t)split[a];
    coord[a] = (int)coord64[a];
    if (split[a] && __builtin_mul_overflow(whole->dims[split[a] - 1], mesh[a], &whole->dims[split[a] - 1]))
      return too_large(f, t, err, errlen);
  }
  whole->n = 1;
  for (int d = 0; d < t->rank; d++)
    if (__builtin_mul_overflow(whole->n, whole->dims[d], &whole->n)) return too_large(f, t, err, errlen);
  rs->n = 0;
  rt_piece_runs(&g, mesh, coord, add_run, rs);
  if (rs->oom) {
    seterr(err, errlen, "out of memory");
    return 1;
  }
  return 0;
}

/* Fills the target runs from every shard's piece of `name`: the pieces must be of one whole
   tensor, hold no element twice, and together hold every element asked for. */
static int read_runs(const Checkpoint *c, const char *name, const Runs *t, float *out, int64_t want, char *err,
                     size_t errlen) {
  Runs s = {0}, seen = {0};
  int64_t copied = 0;
  Whole whole = {-1, {0}, 0};
  int found = 0, rc = 0, first = -1;
  for (int k = 0; k < c->n_shards && !rc; k++) {
    const StTensor *st = st_find(&c->shards[k], name);
    if (!st) continue;
    found++;
    Whole w;
    if ((rc = source_runs(&c->shards[k], st, &s, &w, err, errlen))) break;
    if (whole.rank >= 0 && (w.rank != whole.rank || memcmp(w.dims, whole.dims, sizeof(int64_t) * (size_t)w.rank))) {
      char a[160], b[160];
      dims_text(w.rank, w.dims, a, sizeof a);
      dims_text(whole.rank, whole.dims, b, sizeof b);
      seterr(err, errlen, "%s: tensor '%s' is a piece of a whole of shape %s, in %s of %s: the shards disagree on "
             "its shape or its split over the mesh", c->shards[k].path, name, a, c->shards[first].path, b);
      rc = 2;
      break;
    }
    if (whole.rank < 0) whole = w, first = k;
    copied += merge_copy(t, &s, st->data, out, &seen);
    if (seen.oom) {
      seterr(err, errlen, "out of memory");
      rc = 1;
    }
  }
  int64_t twice = rc || !found ? -1 : first_overlap(&seen);
  free(s.r);
  free(seen.r);
  if (!rc && !found) {
    seterr(err, errlen, "the checkpoint's %d shards hold no tensor '%s'; it belongs to another model", c->n_shards, name);
    rc = 2;
  } else if (!rc && twice >= 0) {
    seterr(err, errlen, "the checkpoint's shards hold element %" PRId64 " of '%s' more than once: two shards claim "
           "the same piece (their loom.coord or loom.split is damaged)", twice, name);
    rc = 2;
  } else if (!rc && copied != want) {
    seterr(err, errlen, "the checkpoint's shards hold %" PRId64 " of the %" PRId64 " elements of '%s' asked for; a "
           "shard is missing or the checkpoint belongs to another model", copied, want, name);
    rc = 2;
  }
  return rc;
}

int ckpt_shards_read_range(const Checkpoint *c, const char *name, int64_t w0, int64_t count, float *out, char *err,
                           size_t errlen) {
  Run r = {w0, 0, count};
  Runs t = {&r, 1, 1, 0};
  return count > 0 ? read_runs(c, name, &t, out, count, err, errlen) : 0;
}

int ckpt_shards_read_piece(const Checkpoint *c, const char *name, const RtGlobal *dst, const int64_t mesh[5],
                           const int coord[5], float *out, char *err, size_t errlen) {
  Runs t = {0};
  rt_piece_runs(dst, mesh, coord, add_run, &t);
  int rc = t.oom ? (seterr(err, errlen, "out of memory"), 1) : read_runs(c, name, &t, out, dst->n, err, errlen);
  free(t.r);
  return rc;
}

/* e when view is rt_expert_name(stack, e) for some e >= 0, else -1 (read off the view's name:
   no walk over the experts a damaged count could make endless). */
static int64_t expert_index(const char *stack, const char *view) {
  const char *at = NULL;
  for (const char *p = strstr(stack, ".experts."); p; p = strstr(p + 1, ".experts.")) at = p;
  if (!at) return -1;
  size_t pre = (size_t)(at - stack) + 9;
  if (strncmp(view, stack, pre) || view[pre] < '0' || view[pre] > '9') return -1;
  errno = 0;
  char *end, buf[600];
  long long e = strtoll(view + pre, &end, 10);
  if (errno || rt_expert_name(stack, e, buf, sizeof buf) || strcmp(buf, view)) return -1;
  return e;
}

int ckpt_shards_expert(const Checkpoint *c, const char *view, char *stack, size_t n, int64_t *e, int64_t *per) {
  if (!c->n_shards) return -1;
  const StFile *f = &c->shards[0];
  for (int i = 0; i < f->n_meta; i++) {
    if (strncmp(f->meta_keys[i], "loom.experts.", 13)) continue;
    const char *name = f->meta_keys[i] + 13;
    int64_t E, k = expert_index(name, view);
    if (k < 0 || parse_ints(f->meta_values[i], &E, 1) || E < 1 || k >= E) continue;
    /* the whole stack's elements, from any shard's piece of it */
    for (int s = 0; s < c->n_shards; s++) {
      const StTensor *t = st_find(&c->shards[s], name);
      Runs rs = {0};
      Whole whole;
      char err[256];
      int bad = !t || source_runs(&c->shards[s], t, &rs, &whole, err, sizeof err);
      free(rs.r);
      if (bad) continue;
      if (whole.n % E) break;   /* not a stack of E experts: a damaged count */
      snprintf(stack, n, "%s", name);
      *e = k;
      *per = whole.n / E;
      return 0;
    }
  }
  return -1;
}

/* ---------------------------------------------------------------- load */

/* The shards of one mesh: each says the same "loom.mesh", whose ranks are as many as the
   shards, and its own "loom.coord" on it. */
static int check_places(const Checkpoint *c, char *err, size_t errlen) {
  int64_t mesh0[5], mesh[5], coord[5], ranks = 1;
  uint8_t *taken = NULL;
  int rc = 0;
  for (int k = 0; k < c->n_shards && !rc; k++) {
    const char *path = c->shards[k].path;
    if (shard_place(&c->shards[k], mesh, coord)) {
      seterr(err, errlen, "%s lacks its place on the mesh (\"loom.mesh\" and \"loom.coord\", 5 integers each): "
             "not a shard of a loom checkpoint, or a damaged one", path);
      rc = 2;
      break;
    }
    if (k == 0) {
      memcpy(mesh0, mesh, sizeof mesh);
      for (int a = 0; a < 5 && !rc; a++)
        if (mesh[a] < 1 || mesh[a] > c->n_shards || (ranks *= mesh[a]) > c->n_shards) rc = 2;
      if (rc || ranks != c->n_shards) {
        seterr(err, errlen, "%s: loom.mesh %s is not a mesh of %d ranks, one per shard that DONE lists", path,
               meta(&c->shards[k], "loom.mesh"), c->n_shards);
        rc = 2;
        break;
      }
      if (!(taken = calloc((size_t)c->n_shards, 1))) {
        seterr(err, errlen, "out of memory");
        rc = 1;
        break;
      }
    } else if (memcmp(mesh, mesh0, sizeof mesh)) {
      seterr(err, errlen, "%s: loom.mesh %s differs from %s's (%s): the shards are not of one mesh", path,
             meta(&c->shards[k], "loom.mesh"), c->shards[0].path, meta(&c->shards[0], "loom.mesh"));
      rc = 2;
      break;
    }
    int64_t at = 0;
    for (int a = 0; a < 5 && at >= 0; a++)
      at = coord[a] < 0 || coord[a] >= mesh[a] ? -1 : at * mesh[a] + coord[a];
    if (at < 0 || taken[at]) {
      seterr(err, errlen, "%s: loom.coord %s is %s", path, meta(&c->shards[k], "loom.coord"),
             at < 0 ? "outside its mesh" : "another shard's too: two shards claim one rank's place");
      rc = 2;
      break;
    }
    taken[at] = 1;
  }
  free(taken);
  return rc;
}

int ckpt_load_shards(const char *stepdir, const Done *d, Checkpoint *c, char *err, size_t errlen) {
  if (!(c->shards = calloc((size_t)d->n_shards, sizeof *c->shards))) {
    seterr(err, errlen, "%s: out of memory", stepdir);
    return 1;
  }
  c->n_shards = d->n_shards;
  for (int k = 0; k < d->n_shards; k++) {
    char name[64];
    ckpt_shard_name(k, d->n_shards, name, sizeof name);
    char *path = ckpt_pjoin(stepdir, name);
    if (!path) {
      seterr(err, errlen, "%s: out of memory", stepdir);
      return 1;
    }
    struct stat st;
    int rc = 0;
    if (stat(path, &st) != 0) {
      seterr(err, errlen, "%s is missing: %s; the folder was changed after the checkpoint was written", path,
             strerror(errno));
      rc = 2;
    } else if ((uint64_t)st.st_size != d->sh_size[k]) {
      seterr(err, errlen, "%s is corrupt: it is %" PRIu64 " bytes but DONE recorded %" PRIu64 "; the file was truncated or "
             "changed after it was written", path, (uint64_t)st.st_size, d->sh_size[k]);
      rc = 2;
    } else if (!(rc = st_map(path, &c->shards[k], err, errlen))) {
      /* every byte checked: the shard is read once here (mapped, so it stays in the page cache) */
      uint32_t crc = ckpt_crc32c(0, c->shards[k].buf, c->shards[k].size);
      if (crc != d->sh_crc[k]) {
        seterr(err, errlen, "%s is corrupt: checksum mismatch (crc32c %08" PRIx32 ", DONE recorded %08" PRIx32 "); the "
               "file was changed or damaged after it was written", path, crc, d->sh_crc[k]);
        rc = 2;
      }
    }
    free(path);
    if (rc) return rc;
  }
  return check_places(c, err, errlen);
}

/* ---------------------------------------------------------------- save */

/* Every rank's status (and optionally more bytes), so that all return the same verdict. */
typedef struct {
  int32_t rc;
  uint32_t crc;
  uint64_t size;
  int64_t tag;
} Report;

static int exchange(CkptAllGather gather, void *arg, const Report *mine, Report *all, char *err, size_t errlen) {
  return gather(arg, mine, all, sizeof *mine, err, errlen) ? 1 : 0;
}

static char *done_text(int64_t step, int world, const Report *all, uint64_t state_size, uint32_t state_crc) {
  json_t *files = json_object();
  json_t *root = json_pack("{s:s, s:i, s:I, s:s, s:i, s:o}", "format", "loom-checkpoint", "version", 2, "step",
                           (json_int_t)step, "checksum", "crc32c", "shards", world, "files", files);
  if (!root) return NULL;
  for (int k = 0; k <= world; k++) {
    char hex[9], name[64];
    snprintf(hex, sizeof hex, "%08" PRIx32, k < world ? all[k].crc : state_crc);
    if (k < world) ckpt_shard_name(k, world, name, sizeof name);
    else snprintf(name, sizeof name, "state.json");
    if (json_object_set_new(files, name, json_pack("{s:I, s:s}", "bytes", (json_int_t)(k < world ? all[k].size : state_size),
                                                   "crc32c", hex))) {
      json_decref(root);
      return NULL;
    }
  }
  char *s = json_dumps(root, JSON_INDENT(2));
  json_decref(root);
  return s;
}

/* Rank 0's part after every shard is on disk: state.json, the rename, DONE. */
static int commit(const char *save_dir, int64_t step, const char *tmp, const char *fin, const char *old, int world,
                  const Report *all, const char *state_json, char *err, size_t errlen) {
  char *path = ckpt_pjoin(tmp, "state.json"), *done = NULL, *text = NULL;
  uint64_t size = 0;
  uint32_t crc = 0;
  int rc = path ? 0 : 1, moved_old = 0;
  if (rc) seterr(err, errlen, "out of memory");
  if (!rc) rc = ckpt_write_text(path, state_json, err, errlen);
  if (!rc) rc = ckpt_file_digest(path, &size, &crc, err, errlen);
  if (!rc) rc = ckpt_fsync_dir(tmp, err, errlen);
  if (!rc && ckpt_is_dir(fin)) {   /* an earlier checkpoint of this step: aside, then ours in */
    if (ckpt_is_dir(old)) (void)ckpt_remove_step_dir(old, err, errlen);
    if (rename(fin, old) != 0) {
      seterr(err, errlen, "%s: cannot move the existing checkpoint aside to %s: %s", fin, old, strerror(errno));
      rc = 1;
    }
    moved_old = !rc;
  }
  if (!rc && rename(tmp, fin) != 0) {
    seterr(err, errlen, "%s: cannot rename %s to it: %s", fin, tmp, strerror(errno));
    if (moved_old) (void)rename(old, fin);
    rc = 1;
  }
  if (!rc) rc = ckpt_fsync_dir(save_dir, err, errlen);
  if (!rc && moved_old) {
    char ignored[256];
    (void)ckpt_remove_step_dir(old, ignored, sizeof ignored);
  }
  if (!rc && (!(text = done_text(step, world, all, size, crc)) || !(done = ckpt_pjoin(fin, "DONE")))) {
    seterr(err, errlen, "out of memory");
    rc = 1;
  }
  if (!rc) rc = ckpt_write_text(done, text, err, errlen);
  free(path);
  free(done);
  free(text);
  return rc;
}

int ckpt_save_shards(const char *save_dir, int64_t step, int rank, int world, const StTensor *pieces, int n,
                     const char *const *meta_keys, const char *const *meta_values, int n_meta, const char *state_json,
                     CkptAllGather gather, void *arg, char *err, size_t errlen) {
  if (err && errlen) err[0] = 0;
  Report *all = calloc((size_t)world, sizeof *all);
  if (!all) {
    seterr(err, errlen, "out of memory");
    return 1;
  }
  char name[64], tmpname[96], oldname[96], shard[64];
  snprintf(name, sizeof name, "step_%08" PRId64, step);
  /* 1. the folder: rank 0 makes SAVE_DIR/step_X.tmp.<its pid> */
  Report me = {0, 0, 0, (int64_t)getpid()};
  int rc = 0;
  char *tmp = NULL, *fin = NULL, *old = NULL, *path = NULL;
  if (rank == 0) {
    snprintf(tmpname, sizeof tmpname, "%s.tmp.%ld", name, (long)getpid());
    char *t = ckpt_pjoin(save_dir, tmpname);
    me.rc = !t ? 1 : ckpt_mkdir_p(save_dir, err, errlen);
    if (!me.rc && ckpt_is_dir(t)) me.rc = ckpt_remove_step_dir(t, err, errlen);
    if (!me.rc && mkdir(t, 0777) != 0) {
      seterr(err, errlen, "%s: cannot create directory: %s", t, strerror(errno));
      me.rc = 1;
    }
    free(t);
  }
  if ((rc = exchange(gather, arg, &me, all, err, errlen))) goto out;
  if (all[0].rc) {
    if (rank) seterr(err, errlen, "rank 0 could not create the checkpoint folder in %s (its message above)", save_dir);
    rc = all[0].rc;
    goto out;
  }
  snprintf(tmpname, sizeof tmpname, "%s.tmp.%ld", name, (long)all[0].tag);
  snprintf(oldname, sizeof oldname, "%s.old.%ld", name, (long)all[0].tag);
  ckpt_shard_name(rank, world, shard, sizeof shard);
  tmp = ckpt_pjoin(save_dir, tmpname), fin = ckpt_pjoin(save_dir, name), old = ckpt_pjoin(save_dir, oldname);
  path = tmp ? ckpt_pjoin(tmp, shard) : NULL;
  /* 2. every rank's shard, on disk (st_write: fsync'd), and its size and checksum */
  me = (Report){0, 0, 0, 0};
  if (!tmp || !fin || !old || !path) {
    seterr(err, errlen, "out of memory");
    me.rc = 1;
  }
  if (!me.rc && n < 0) me.rc = 1;   /* this rank failed before: it says so (err holds why) */
  if (!me.rc) me.rc = st_write(path, pieces, n, meta_keys, meta_values, n_meta, err, errlen);
  if (!me.rc) me.rc = ckpt_file_digest(path, &me.size, &me.crc, err, errlen);
  if ((rc = exchange(gather, arg, &me, all, err, errlen))) goto out;
  for (int k = 0; k < world && !rc; k++)
    if (all[k].rc) {
      if (k != rank) seterr(err, errlen, "rank %d could not write its shard of checkpoint step %" PRId64, k, step);
      rc = all[k].rc;
    }
  /* 3. rank 0 commits; everyone learns how it went */
  me = (Report){rc, 0, 0, 0};
  if (!rc && rank == 0) me.rc = commit(save_dir, step, tmp, fin, old, world, all, state_json, err, errlen);
  if (rank == 0 && (rc || me.rc)) {
    char ignored[256];
    (void)ckpt_remove_step_dir(tmp, ignored, sizeof ignored);
  }
  Report *verdict = calloc((size_t)world, sizeof *verdict);
  if (!verdict) {
    seterr(err, errlen, "out of memory");
    rc = 1;
    goto out;
  }
  int xrc = exchange(gather, arg, &me, verdict, err, errlen);
  if (!rc) rc = xrc ? xrc : verdict[0].rc;
  if (!xrc && verdict[0].rc && rank && !err[0])
    seterr(err, errlen, "rank 0 could not commit checkpoint step %" PRId64 " (its message above)", step);
  free(verdict);
out:
  free(all);
  free(tmp);
  free(fin);
  free(old);
  free(path);
  return rc;
}
