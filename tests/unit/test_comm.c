/* tests/unit/test_comm.c — the in-process communicator: rank <-> coordinates, every
   collective on every axis of a 2x2x2 mesh (dp, tp, pp) against a direct computation,
   the same result on every rank, and an abort that frees ranks stuck in a collective. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/comm/comm.h"
#include "tests/unit/check.h"

static int64_t mesh[COMM_AXES] = {2, 2, 1, 2, 1};   /* dp tp cp pp ep */
static LocalWorld *world;
#define N 6

/* The value rank r holds at k: distinct per rank and element. */
static float val(int r, int64_t k) { return (float)(r * 100 + k); }

static int bad[64];

static void *run_rank(void *arg) {
  int r = (int)(intptr_t)arg;
  Comm *c = local_world_rank(world, r);
  for (int axis = 0; axis < COMM_AXES; axis++) {
    int size = (int)mesh[axis];
    /* the members of my group, in coordinate order */
    int members[8];
    for (int i = 0; i < size; i++) {
      int co[COMM_AXES];
      memcpy(co, c->coord, sizeof co);
      co[axis] = i;
      members[i] = mesh_rank_of(mesh, co);
    }
    float buf[N], out[8 * N], in[8 * N];
    for (int k = 0; k < N; k++) buf[k] = val(r, k);
    if (c->all_reduce(c, axis, buf, N, false)) bad[r]++;
    for (int k = 0; k < N; k++) {
      float want = 0;
      for (int i = 0; i < size; i++) want += val(members[i], k);
      if (buf[k] != want) bad[r]++;
    }
    for (int k = 0; k < N; k++) buf[k] = val(r, k);
    if (c->all_reduce(c, axis, buf, N, true)) bad[r]++;
    for (int k = 0; k < N; k++) {
      float want = val(members[0], k);
      for (int i = 1; i < size; i++) want = val(members[i], k) > want ? val(members[i], k) : want;
      if (buf[k] != want) bad[r]++;
    }
    for (int k = 0; k < N; k++) buf[k] = val(r, k);
    if (c->all_gather(c, axis, buf, out, N)) bad[r]++;
    for (int i = 0; i < size; i++)
      for (int k = 0; k < N; k++) if (out[i * N + k] != val(members[i], k)) bad[r]++;
    for (int k = 0; k < size * N; k++) in[k] = val(r, k);
    if (c->reduce_scatter(c, axis, in, out, N)) bad[r]++;
    for (int k = 0; k < N; k++) {
      float want = 0;
      for (int i = 0; i < size; i++) want += val(members[i], c->coord[axis] * N + k);
      if (out[k] != want) bad[r]++;
    }
    if (c->all_to_all(c, axis, in, out, N)) bad[r]++;
    for (int i = 0; i < size; i++)   /* chunk i of out came from member i's chunk `me` */
      for (int k = 0; k < N; k++) if (out[i * N + k] != val(members[i], c->coord[axis] * N + k)) bad[r]++;
  }
  if (c->barrier(c)) bad[r]++;
  return NULL;
}

static void *stuck_rank(void *arg) {
  Comm *c = arg;
  float x = 1;
  intptr_t rc = c->all_reduce(c, COMM_DP, &x, 1, false);   /* its partner never comes */
  return (void *)rc;
}

int main(void) {
  char err[256];
  /* rank <-> coordinates: tp fastest, then cp, ep, dp, pp outermost */
  int co[COMM_AXES];
  mesh_coords_of(mesh, 5, co);   /* 5 = pp 1, dp 0, tp 1 */
  CHECK(co[COMM_PP] == 1 && co[COMM_DP] == 0 && co[COMM_TP] == 1, "coords of rank 5: pp %d dp %d tp %d", co[COMM_PP],
        co[COMM_DP], co[COMM_TP]);
  for (int r = 0; r < 8; r++) {
    mesh_coords_of(mesh, r, co);
    CHECK(mesh_rank_of(mesh, co) == r, "rank %d round-trips", r);
  }
  mesh_coords_of(mesh, 1, co);
  CHECK(co[COMM_TP] == 1 && co[COMM_DP] == 0, "ranks 0 and 1 are one tensor-parallel pair");
  world = local_world_new(mesh, err, sizeof err);
  pthread_t th[8];
  for (int r = 0; r < 8; r++) pthread_create(&th[r], NULL, run_rank, (void *)(intptr_t)r);
  for (int r = 0; r < 8; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < 8; r++) CHECK(bad[r] == 0, "rank %d: %d wrong values in its collectives", r, bad[r]);
  local_world_free(world);

  int64_t two[COMM_AXES] = {2, 1, 1, 1, 1};
  world = local_world_new(two, err, sizeof err);
  pthread_t t;
  pthread_create(&t, NULL, stuck_rank, local_world_rank(world, 0));
  struct timespec ts = {0, 50 * 1000 * 1000};
  nanosleep(&ts, NULL);
  local_world_abort(world);
  void *rc;
  pthread_join(t, &rc);
  CHECK((intptr_t)rc == 1, "a rank waiting for a partner that failed returns an error after abort");
  local_world_free(world);
  int64_t badmesh[COMM_AXES] = {0, 1, 1, 1, 1};
  CHECK(local_world_new(badmesh, err, sizeof err) == NULL, "a mesh axis of size 0 is refused: %s", err);
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail != 0;
}
