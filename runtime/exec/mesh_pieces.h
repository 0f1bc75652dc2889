/* runtime/exec/mesh_pieces.h — a mesh rank's pieces of the globals on its device (runtime/device.h)
   and the whole tensors the trainer sees: what both mesh executors (exec_mesh.c: ranks as
   threads; exec_cuda_mesh.c: a process per GPU) do the same way, by the lowered program's
   placements (RtGlobal), whatever moves the pieces between the ranks. */
#ifndef LOOM_RUNTIME_EXEC_MESH_PIECES_H
#define LOOM_RUNTIME_EXEC_MESH_PIECES_H

#include <stdint.h>

#include "runtime/device.h"

/* The rank at coord's starting pieces on its device d: the parameters' slices of `init`
   (safetensors, HF names), or the seeded initialization's values of its pieces; globals
   initialized to zeros are left as the device starts them.  scratch holds the largest
   global (a device without host storage writes through it). */
int mesh_init_pieces(RtDevice *d, const int64_t mesh[5], const int coord[5], const char *init, uint64_t seed,
                     float *scratch, char *err, size_t errlen);
/* Global gl's whole tensor from every rank's piece (piece_of[q]: rank q's gl->n floats, rank
   q at mesh_coords_of(mesh, q)): replicated pieces are equal, rank order wins; owner >= 0 (a
   pipeline): only the ranks of that pp coordinate count. */
void mesh_assemble(const RtGlobal *gl, const int64_t mesh[5], int world, float *const *piece_of, int owner, float *whole);
/* The piece of global k the rank at coord holds, from the whole tensor, onto its device d
   (through scratch when d has no host storage). */
int mesh_scatter(RtDevice *d, int k, const int64_t mesh[5], const int coord[5], float *whole, float *scratch, char *err,
                 size_t errlen);
/* The rank at coord's piece of a whole micro-batch (int32, [batch, seq] row-major) by the
   placement of the program's token arguments, an RtGlobal's (ir_rank, split, piece_dims, n:
   piece_placement, runtime/exec/exec_ref.h, makes it from the IR type once at open). */
void mesh_tokens_piece(const RtGlobal *place, const int64_t mesh[5], const int coord[5], const int32_t *whole,
                       int32_t *piece);

#endif
