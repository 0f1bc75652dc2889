/* runtime/cpu/cpu_mesh.c — the builtins whose result depends on the rank: collectives over a
   mesh axis (through the program's Comm, runtime/comm/comm.h), shard_slice / shard_pad, and the
   pieces of a vocabulary-parallel embedding and cross-entropy.  Each does what the op of
   the same name does in the reference executor (ir/interp.c, ir/interp_ops.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cpu/cpu_kernels.h"

static const char *const axis_names[COMM_AXES] = {"dp", "tp", "cp", "pp", "ep"};

/* The rank's coordinate on `axis` (0 without a Comm). */
static int64_t coord_of(const Comm *comm, int64_t axis) { return comm ? comm->coord[axis] : 0; }

/* Moves chunk c of n along a dim (outer, m, inner) between layouts:
   to_chunks: x[o][c*m + j][i] -> buf[c][o][j][i];  else the reverse. */
static void rechunk(float *dst, const float *src, int64_t n, int64_t outer, int64_t m, int64_t inner, bool to_chunks) {
  for (int64_t c = 0; c < n; c++)
    for (int64_t o = 0; o < outer; o++) {
      const int64_t a = ((o * n + c) * m) * inner, b = ((c * outer + o) * m) * inner;
      if (to_chunks) memcpy(dst + b, src + a, sizeof(float) * (size_t)(m * inner));
      else memcpy(dst + a, src + b, sizeof(float) * (size_t)(m * inner));
    }
}

static int need_comm(const Comm *comm, int64_t axis, int64_t size, const RtStep *st, char *err, size_t errlen) {
  if (size == 1) return 0;
  if (!comm) {
    snprintf(err, errlen, "%s runs over %s=%lld ranks, but the program runs as one rank (give it the mesh)", st->label,
             axis_names[axis], (long long)size);
    return 2;
  }
  if (comm->mesh[axis] != size) {
    snprintf(err, errlen, "%s runs over %s=%lld ranks, but the mesh has %s=%lld", st->label, axis_names[axis],
             (long long)size, axis_names[axis], (long long)comm->mesh[axis]);
    return 2;
  }
  return 0;
}

void cpu_coll_unwrap(const RtStep *start, RtStep *out) {
  *out = *start;
  out->which = (int)start->i[0];
  memmove(out->i, start->i + 2, sizeof(int64_t) * (RT_MAX_INTS - 2));
  out->i[RT_MAX_INTS - 2] = out->i[RT_MAX_INTS - 1] = 0;
}

/* ---------------------------------------------------------------- checks */

int cpu_mesh_builtin_check(const RtStep *st, char *err, size_t errlen) {
  const int64_t *i = st->i;
  const RtBuf *b = st->bufs;
  char what[160] = "";
  if (st->which == RT_B_COLL_START || st->which == RT_B_COLL_WAIT) {
    if (st->n_in != 1 || st->n_out != 1) snprintf(what, sizeof what, "wants one input and one output");
    else if (i[st->which == RT_B_COLL_START ? 1 : 0] < 0 || i[st->which == RT_B_COLL_START ? 1 : 0] >= RT_MAX_HANDLES)
      snprintf(what, sizeof what, "handle out of range (0 to %d)", RT_MAX_HANDLES - 1);
    else if (st->which == RT_B_COLL_START && (i[0] < RT_B_ALL_REDUCE || i[0] > RT_B_ALL_TO_ALL))
      snprintf(what, sizeof what, "starts builtin %lld, which is not a collective", (long long)i[0]);
    if (what[0]) {
      snprintf(err, errlen, "builtin %s (%s): %s", rt_builtin_name(st->which), st->label, what);
      return 2;
    }
    if (st->which == RT_B_COLL_WAIT) return 0;
    RtStep sync;
    cpu_coll_unwrap(st, &sync);
    return cpu_mesh_builtin_check(&sync, err, errlen);
  }
  int64_t nx = b[0].n, ny = st->n_in + st->n_out > 1 ? b[st->n_in].n : 0;
  for (int k = 0; k < 9; k++)
    if (i[k] < 0) snprintf(what, sizeof what, "negative size");
  switch ((RtBuiltin)st->which) {
  case RT_B_TARGET_PICK:
    if (i[2] > COMM_AXES) snprintf(what, sizeof what, "vocab axis out of range");
    else if (b[0].n != rt_smul(i[0], i[1]) || b[0].is_int || b[1].n != i[0] || !b[1].is_int || b[2].n != i[0] || b[2].is_int)
      snprintf(what, sizeof what, "wants x f32[rows*V], targets int32[rows] -> y f32[rows]");
    break;
  case RT_B_ONEHOT:
    if (i[2] > COMM_AXES) snprintf(what, sizeof what, "vocab axis out of range");
    else if (b[0].n != i[0] || !b[0].is_int || b[1].n != rt_smul(i[0], i[1]) || b[1].is_int)
      snprintf(what, sizeof what, "wants targets int32[rows] -> y f32[rows*V]");
    break;
  case RT_B_ALL_REDUCE:
    if (i[1] >= COMM_AXES || i[2] < 1) snprintf(what, sizeof what, "axis or size out of range");
    else if (nx != i[0] || ny != i[0]) snprintf(what, sizeof what, "x and y must hold n elements");
    break;
  case RT_B_ALL_GATHER:
  case RT_B_REDUCE_SCATTER: {
    int64_t piece = rt_smul(rt_smul(i[2], i[3]), i[4]), whole = rt_smul(piece, i[1]);
    bool gather = st->which == RT_B_ALL_GATHER;
    if (i[0] >= COMM_AXES || i[1] < 1) snprintf(what, sizeof what, "axis or size out of range");
    else if (nx != (gather ? piece : whole) || ny != (gather ? whole : piece))
      snprintf(what, sizeof what, "buffer sizes do not match outer x mid x inner");
    break;
  }
  case RT_B_ALL_TO_ALL:
    if (i[0] >= COMM_AXES || i[1] < 1) snprintf(what, sizeof what, "axis or size out of range");
    else if (nx != rt_smul(rt_smul(i[2], i[1]), rt_smul(i[3], i[4])) || ny != rt_smul(rt_smul(i[5], i[1]), rt_smul(i[6], i[7])) || nx != ny)
      snprintf(what, sizeof what, "buffer sizes do not match the split and concat dims");
    break;
  case RT_B_SHARD_SLICE:
  case RT_B_SHARD_PAD: {
    int64_t piece = rt_smul(rt_smul(i[3], i[4]), i[5]), whole = rt_smul(piece, i[2]);
    bool slice = st->which == RT_B_SHARD_SLICE;
    if (i[0] >= COMM_AXES || i[1] < 1 || i[2] < 1 || i[1] % i[2])
      snprintf(what, sizeof what, "axis, size or parts out of range (parts must divide size)");
    else if (nx != (slice ? whole : piece) || ny != (slice ? piece : whole) || b[0].is_int != b[1].is_int)
      snprintf(what, sizeof what, "buffer sizes do not match outer x mid x inner");
    break;
  }
  case RT_B_ALL_TO_ALLV:   /* i: axis, size, S, D, rows, El */
    if (i[0] >= COMM_AXES || i[1] < 1 || i[5] < 1) snprintf(what, sizeof what, "axis, size or experts out of range");
    else if (nx != rt_smul(i[2], i[3]) || b[0].is_int || !b[1].is_int || !b[2].is_int || b[1].n != rt_smul(i[1], i[5]) ||
             b[2].n != b[1].n || b[3].n != rt_smul(i[4], i[3]) || b[3].is_int)
      snprintf(what, sizeof what, "wants x f32[S*D], send and recv int32[size*El] -> y f32[rows*D]");
    break;
  case RT_B_SEND:
  case RT_B_RECV:   /* i: n, axis, size, peer, tag */
    if (i[1] >= COMM_AXES || i[2] < 1 || i[3] >= i[2]) snprintf(what, sizeof what, "axis, size or peer out of range");
    else if (nx != i[0] || b[0].is_int) snprintf(what, sizeof what, "the buffer must hold n f32 elements");
    break;
  default: snprintf(what, sizeof what, "not a mesh builtin"); break;
  }
  if (!what[0] && st->which >= RT_B_ALL_REDUCE && st->which <= RT_B_ALL_TO_ALL && (b[0].is_int || b[1].is_int))
    snprintf(what, sizeof what, "collectives move f32 values");
  if (what[0]) {
    snprintf(err, errlen, "builtin %s (%s): %s", rt_builtin_name(st->which), st->label, what);
    return 2;
  }
  return 0;
}

/* ---------------------------------------------------------------- run */

int cpu_mesh_builtin_run(ThreadPool *tp, Comm *comm, const RtStep *st, void *const *bufs, char *err, size_t errlen) {
  RtStep sync;
  if (st->which == RT_B_COLL_START) {   /* no communication thread: the collective runs now */
    cpu_coll_unwrap(st, &sync);
    st = &sync;
  }
  const int64_t *i = st->i;
  int rc = 0;
  switch ((RtBuiltin)st->which) {
  case RT_B_TARGET_PICK: {
    const float *x = bufs[0];
    const int32_t *t = bufs[1];
    float *y = bufs[2];
    int64_t V = i[1], off = i[2] ? coord_of(comm, i[2] - 1) * V : 0;
    for (int64_t r = 0; r < i[0]; r++) {
      int64_t id = (int64_t)t[r] - off;
      y[r] = id >= 0 && id < V ? x[r * V + id] : 0.0f;
    }
    return 0;
  }
  case RT_B_ONEHOT: {
    const int32_t *t = bufs[0];
    float *y = bufs[1];
    int64_t V = i[1], off = i[2] ? coord_of(comm, i[2] - 1) * V : 0;
    cpu_fill(tp, y, false, 0, i[0] * V);
    for (int64_t r = 0; r < i[0]; r++) {
      int64_t id = (int64_t)t[r] - off;
      if (id >= 0 && id < V) y[r * V + id] = 1.0f;
    }
    return 0;
  }
  case RT_B_SHARD_SLICE:
  case RT_B_SHARD_PAD: {
    int64_t size = i[1], parts = i[2], outer = i[3], mid = i[4], inner = i[5];
    int64_t chunk = coord_of(comm, i[0]) / (size / parts);
    bool slice = st->which == RT_B_SHARD_SLICE;
    char *x = bufs[0], *y = bufs[1];   /* 4-byte elements, f32 or int32 */
    if (parts == 1) {   /* the whole dim: a copy (the buffers may be one) */
      if (x != y) memmove(y, x, 4 * (size_t)(outer * mid * inner));
      return 0;
    }
    if (!slice) memset(y, 0, 4 * (size_t)(outer * parts * mid * inner));
    for (int64_t o = 0; o < outer; o++) {
      int64_t whole = ((o * parts + chunk) * mid) * inner, part = (o * mid) * inner;
      if (slice) memcpy(y + 4 * part, x + 4 * whole, 4 * (size_t)(mid * inner));
      else memcpy(y + 4 * whole, x + 4 * part, 4 * (size_t)(mid * inner));
    }
    return 0;
  }
  case RT_B_COLL_WAIT: return 0;   /* its start has run it */
  case RT_B_ALL_TO_ALLV: {   /* over the flat all_to_all: n chunks of S rows each way (ir/interp.c's) */
    int64_t n = i[1], S = i[2], D = i[3], rows = i[4], el = i[5], sent = 0, got = 0;
    const float *x = bufs[0];
    const int32_t *sc = bufs[1], *rcv = bufs[2];
    float *y = bufs[3];
    for (int64_t g = 0; g < n * el; g++) {
      if (sc[g] < 0 || rcv[g] < 0) { snprintf(err, errlen, "%s: negative counts", st->label); return 2; }
      sent += sc[g], got += rcv[g];
    }
    if (sent > S || got > rows) {
      snprintf(err, errlen, "%s: %lld rows to send of %lld, %lld to receive into %lld", st->label, (long long)sent,
               (long long)S, (long long)got, (long long)rows);
      return 2;
    }
    if (n > 1 && (rc = need_comm(comm, i[0], n, st, err, errlen))) return rc;
    float *buf = calloc((size_t)(2 * n * S * D + 1), sizeof(float));
    if (!buf) goto oom;
    float *snd = buf, *got_b = buf + n * S * D;
    int64_t at = 0;
    for (int64_t j = 0; j < n; j++) {
      int64_t c = 0;
      for (int64_t e = 0; e < el; e++) c += sc[j * el + e];
      memcpy(snd + j * S * D, x + at * D, sizeof(float) * (size_t)(c * D));
      at += c;
    }
    if (n > 1) rc = comm->all_to_all(comm, (int)i[0], snd, got_b, S * D);
    else memcpy(got_b, snd, sizeof(float) * (size_t)(S * D));
    at = 0;
    for (int64_t k = 0; !rc && k < n; k++) {
      int64_t c = 0;
      for (int64_t e = 0; e < el; e++) c += rcv[k * el + e];
      memcpy(y + at * D, got_b + k * S * D, sizeof(float) * (size_t)(c * D));
      at += c;
    }
    if (!rc) memset(y + at * D, 0, sizeof(float) * (size_t)((rows - at) * D));
    free(buf);
    if (rc) snprintf(err, errlen, "all_to_allv over %s failed (another rank stopped)", axis_names[i[0]]);
    return rc ? 1 : 0;
  }
  case RT_B_SEND:
  case RT_B_RECV: {   /* i: n, axis, size, peer, tag, rel */
    bool send = st->which == RT_B_SEND;
    if ((rc = need_comm(comm, i[1], i[2], st, err, errlen))) return rc;
    if (i[2] == 1 || (send && !comm->send) || (!send && !comm->recv)) {
      snprintf(err, errlen, "%s: point-to-point over %s=%lld needs a mesh whose communicator has %s", st->label,
               axis_names[i[1]], (long long)i[2], send ? "send" : "recv");
      return 2;
    }
    int64_t peer = i[5] ? (comm->coord[i[1]] + i[3]) % i[2] : i[3];   /* rel: a ring (context parallelism) */
    if (send) rc = comm->send(comm, (int)i[1], (int)peer, i[4], bufs[0], i[0]);
    else rc = comm->recv(comm, (int)i[1], (int)peer, i[4], bufs[0], i[0]);
    if (rc) snprintf(err, errlen, "%s with the rank at %s=%lld failed (another rank stopped)", rt_builtin_name(st->which),
                     axis_names[i[1]], (long long)peer);
    return rc ? 1 : 0;
  }
  default: break;
  }
  /* collectives */
  int64_t axis = st->which == RT_B_ALL_REDUCE ? i[1] : i[0], size = st->which == RT_B_ALL_REDUCE ? i[2] : i[1];
  if ((rc = need_comm(comm, axis, size, st, err, errlen))) return rc;
  const float *x = bufs[0];
  float *y = bufs[1], *tmp = NULL;
  int64_t nx = st->bufs[0].n, ny = st->bufs[1].n;
  if (size == 1) {   /* one rank on the axis: the identity */
    if (x != y) memcpy(y, x, sizeof(float) * (size_t)ny);
    return 0;
  }
  switch ((RtBuiltin)st->which) {
  case RT_B_ALL_REDUCE:
    if (x != y) memcpy(y, x, sizeof(float) * (size_t)ny);
    rc = comm->all_reduce(comm, (int)axis, y, ny, i[3] != 0);
    break;
  case RT_B_ALL_GATHER:   /* rank r's piece lands at chunk r of the dim */
    if (!(tmp = malloc(sizeof(float) * (size_t)ny))) goto oom;
    rc = comm->all_gather(comm, (int)axis, x, tmp, nx);
    if (!rc) rechunk(y, tmp, size, i[2], i[3], i[4], false);
    break;
  case RT_B_REDUCE_SCATTER:   /* rank r keeps the sum of chunk r */
    if (!(tmp = malloc(sizeof(float) * (size_t)nx))) goto oom;
    rechunk(tmp, x, size, i[2], i[3], i[4], true);
    rc = comm->reduce_scatter(comm, (int)axis, tmp, y, ny);
    break;
  case RT_B_ALL_TO_ALL:
    /* calloc: GCC cannot see that rechunk fills the send half (-Wmaybe-uninitialized) */
    if (!(tmp = calloc(2 * (size_t)nx, sizeof(float)))) goto oom;
    rechunk(tmp, x, size, i[2], i[3], i[4], true);
    rc = comm->all_to_all(comm, (int)axis, tmp, tmp + nx, nx / size);
    if (!rc) rechunk(y, tmp + nx, size, i[5], i[6], i[7], false);
    break;
  default: snprintf(err, errlen, "unknown mesh builtin %d", st->which); return 2;
  }
  free(tmp);
  if (rc) snprintf(err, errlen, "%s over %s failed (another rank stopped)", rt_builtin_name(st->which),
                   axis_names[axis]);
  return rc ? 1 : 0;
oom:
  snprintf(err, errlen, "out of memory in %s", rt_builtin_name(st->which));
  return 1;
}
