/* runtime/exec/ref_device.h — the reference interpreter (ir/interp.c) as a device
 * (runtime/device.h): what runs `--backend ref` through the rank executor (one rank), the
 * mesh executor's threads (mesh_threads.c) and the pipeline walker's device transport
 * (exec_mesh_pipe.c), as the lowered programs run.
 *
 * Its program is desc, the module's description (codegen's cg_describe_module: functions and
 * globals in module order, with no steps); a call interprets the IR function. */
#ifndef LOOM_RUNTIME_EXEC_REF_DEVICE_H
#define LOOM_RUNTIME_EXEC_REF_DEVICE_H

#include "ir/ir.h"
#include "runtime/comm/comm.h"
#include "runtime/device.h"

/* One rank: the module, its globals (the rank's pieces; their float tensors are the device's
   host storage) and its communicator (NULL: one rank; read at every call, so that a pipeline
   may swap in the walker's tagging one). */
typedef struct {
  const Module *m;
  GlobalStore *g;
  Comm *comm;
} RefRank;

/* d over desc (borrowed): a RefRank (d->impl) whose globals are zeros (the caller initializes
   them).  A module with an integer global is refused (2): the executors hold f32 globals. */
int ref_device_open(RtDevice *d, const Module *m, const RtProgram *desc, Comm *comm, char *err, size_t errlen);

#endif
