/* runtime/exec/pieces.c — whole tensors and the pieces the ranks of a mesh hold: the whole
   type of a per-rank value, copies between a whole tensor and a rank's piece.  The executors and their pipeline walkers call down into it (it was
   in exec_ref.c, which its pipeline walker then called back). */
#include <string.h>

#include "runtime/exec/exec.h"
#include "runtime/exec/exec_mesh.h"
#include "runtime/exec/exec_ref.h"

Type whole_type(const Module *m, const Type *local) {
  Type t = *local;
  if (m->local)
    for (int a = 0; a < AX_COUNT; a++)
      if (t.sh.kind[a] == SH_S) t.dims[t.sh.dim[a]] *= m->mesh.size[a];
  memset(&t.sh, 0, sizeof t.sh);
  return t;
}

/* ---- whole <-> per-rank pieces ---- */

/* Copies between a whole tensor and one rank's piece: along every split dim the rank
   holds chunk coord[axis].  to_piece: whole -> piece, else piece -> whole. */
void move_piece(const Mesh *mesh, Tensor *whole, Tensor *piece, const int coord[AX_COUNT], bool to_piece) {
  const Type *lt = &piece->type;
  /* Along a dim split by several axes, a larger axis index is the outer split (the shard
     pass's convention): the offset sums coordinate x extent from the innermost out. */
  int64_t off[IR_MAX_RANK] = {0}, extent[IR_MAX_RANK];
  for (int d = 0; d < lt->rank; d++) extent[d] = lt->dims[d];
  for (int a = 0; a < AX_COUNT; a++)
    if (lt->sh.kind[a] == SH_S) {
      int d = lt->sh.dim[a];
      off[d] += coord[a] * extent[d];
      extent[d] *= mesh->size[a];
    }
  int64_t idx[IR_MAX_RANK] = {0};
  for (int64_t k = 0; k < piece->n; k++) {
    int64_t w = 0;   /* the element's position in the whole tensor */
    for (int d = 0; d < lt->rank; d++) w = w * whole->type.dims[d] + idx[d] + off[d];
    if (to_piece) {
      if (piece->f) piece->f[k] = whole->f[w];
      else piece->i[k] = whole->i[w];
    } else {
      if (piece->f) whole->f[w] = piece->f[k];
      else whole->i[w] = piece->i[k];
    }
    for (int d = lt->rank - 1; d >= 0 && ++idx[d] == lt->dims[d]; d--) idx[d] = 0;
  }
}

void piece_placement(const Type *local, RtGlobal *out) {
  memset(out, 0, sizeof *out);
  out->ir_rank = (int8_t)local->rank;
  out->n = 1;
  for (int d = 0; d < local->rank && d < 8; d++) out->piece_dims[d] = local->dims[d], out->n *= local->dims[d];
  for (int a = 0; a < AX_COUNT && a < 5; a++)
    if (local->sh.kind[a] == SH_S) out->split[a] = (int8_t)(local->sh.dim[a] + 1);
}

/* The micro-batch's piece a rank holds (exec_mesh.h), here below the mesh executor and the
   pipeline walker, which both split by it. */
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
