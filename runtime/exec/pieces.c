/* runtime/exec/pieces.c — the micro-batch's piece a rank of a mesh holds, below the mesh
   executor and the pipeline walker, which both split by it. */
#include <string.h>

#include "runtime/exec/exec_mesh.h"

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
