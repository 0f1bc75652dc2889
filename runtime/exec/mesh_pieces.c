/* runtime/exec/mesh_pieces.c — see mesh_pieces.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm.h"
#include "runtime/exec/exec.h"
#include "runtime/exec/mesh_pieces.h"

int mesh_init_pieces(RtDevice *d, const int64_t mesh[5], const int coord[5], const char *init, uint64_t seed,
                     float *scratch, char *err, size_t errlen) {
  const RtProgram *p = d->p;
  /* the parameters' pieces: loaded together (one map of the file), straight into host
     storage, or into buffers of their own written to the device one at a time */
  float **pieces = calloc((size_t)p->n_globals + 1, sizeof *pieces);
  int rc = pieces ? 0 : EXIT_RUN;
  if (rc) snprintf(err, errlen, "out of memory");
  for (int k = 0; k < p->n_globals && !rc && init; k++) {
    if (p->globals[k].region != RT_REGION_PARAMS) continue;
    pieces[k] = d->host ? d->host(d, k) : malloc(sizeof(float) * (size_t)(p->globals[k].n + 1));
    if (!pieces[k]) {
      snprintf(err, errlen, "out of memory");
      rc = EXIT_RUN;
    }
  }
  if (!rc && init) rc = load_weights_pieces(p, mesh, coord, init, pieces, err, errlen);
  for (int k = 0; k < p->n_globals && !rc; k++) {
    const RtGlobal *gl = &p->globals[k];
    if (pieces[k]) {
      if (!d->host) rc = d->write(d, k, pieces[k], err, errlen);
    } else if (gl->init != RT_INIT_ZEROS) {
      float *dst = d->host ? d->host(d, k) : scratch;
      rt_global_init_piece(gl, mesh, coord, seed, dst);
      if (!d->host) rc = d->write(d, k, dst, err, errlen);
    }
    if (!d->host) free(pieces[k]), pieces[k] = NULL;
  }
  for (int k = 0; pieces && !d->host && k < p->n_globals; k++) free(pieces[k]);
  free(pieces);
  return rc;
}

void mesh_assemble(const RtGlobal *gl, const int64_t mesh[5], int world, float *const *piece_of, int owner, float *whole) {
  for (int q = 0; q < world; q++) {
    int coord[COMM_AXES];
    mesh_coords_of(mesh, q, coord);
    if (owner >= 0 && coord[COMM_PP] != owner) continue;   /* a stage that does not update it */
    rt_piece_copy(gl, mesh, coord, whole, piece_of[q], false);
  }
}

typedef struct {
  const int32_t *whole;
  int32_t *piece;
} TokenCopy;

static void token_run(int64_t w, int64_t p, int64_t n, void *arg) {
  TokenCopy *c = arg;
  memcpy(c->piece + p, c->whole + w, sizeof(int32_t) * (size_t)n);
}

void mesh_tokens_piece(const RtGlobal *place, const int64_t mesh[5], const int coord[5], const int32_t *whole,
                       int32_t *piece) {
  TokenCopy c = {whole, piece};
  rt_piece_runs(place, mesh, coord, token_run, &c);
}

int mesh_scatter(RtDevice *d, int k, const int64_t mesh[5], const int coord[5], float *whole, float *scratch, char *err,
                 size_t errlen) {
  float *dst = d->host ? d->host(d, k) : scratch;
  rt_piece_copy(&d->p->globals[k], mesh, coord, whole, dst, true);
  return d->host ? 0 : d->write(d, k, dst, err, errlen);
}
