/* runtime/comm/spawn.h — start one process per rank on this node and supervise them, as
 * `torchrun --nproc-per-node N` does, so that `loom train --mesh ...` over several GPUs of one
 * machine needs no launcher.
 *
 * Each rank is a fork + execve of a program (by default this one) with torchrun's variables
 * set (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT),
 * so launch.h reads the children as a torchrun launch; LOOM_SPAWNED=1 tells them who started
 * them.  Other launchers' variables are removed from the children's environment so that they
 * cannot contradict RANK.
 *
 * Supervision: every rank is the leader of its own process group, so the supervisor stops
 * the rank together with whatever the rank started; every rank has PR_SET_PDEATHSIG=SIGKILL,
 * so no rank outlives a supervisor that dies.  The first rank that fails (exit status not 0,
 * or killed by a signal) is reported in one line, the others get SIGTERM, then SIGKILL after
 * a grace period, and its status is returned.  Ctrl-C (SIGINT) or SIGTERM to the supervisor
 * is passed on to the ranks, and the supervisor waits, without a deadline, for them to finish
 * their step and checkpoint (runtime/stop.h); a rank that ends otherwise (killed, another exit
 * status) gets the others a second signal and the grace period; a second Ctrl-C kills them at
 * once.  The ranks are
 * not in the terminal's foreground process group, so Ctrl-C reaches only the supervisor.
 *
 * Call it from one thread at a time (it installs handlers for SIGCHLD, SIGINT and SIGTERM,
 * which write into a pipe it polls, and restores the previous ones before returning; other
 * threads may exist).  It waits only for the children it started.
 */
#ifndef LOOM_RUNTIME_COMM_SPAWN_H
#define LOOM_RUNTIME_COMM_SPAWN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

enum { SPAWN_MAX_WORLD = 4096 };

typedef struct {
  int world;                 /* processes to start, ranks 0..world-1 (1..SPAWN_MAX_WORLD) */
  const char *exe;           /* program to run; NULL: this program (/proc/self/exe) */
  char *const *argv;         /* its argv (argv[0] included), NULL-terminated */
  double grace_s;            /* after a failure, seconds between SIGTERM and SIGKILL of the others (<= 0: 5) */
  FILE *log;                 /* where the supervisor's own lines go (NULL: stderr) */
  bool quiet_others;         /* set LOOM_QUIET_RANK=1 in ranks != 0 (the caller decides what it means);
                                LOOM_QUIET_RANK is never inherited from this process */
} SpawnSpec;

/* Starts spec->world processes and waits for all of them. Each gets the environment of this
   process plus RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK=0, MASTER_ADDR=127.0.0.1,
   MASTER_PORT=<a free TCP port found by binding port 0 on 127.0.0.1>, LOOM_SPAWNED=1; the variables of
   other launchers (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK,
   PMI_RANK, PMI_SIZE) are removed from the children's environment so they do not contradict RANK.
   Returns 0 when every rank exited 0 (and prints nothing). When a rank exits non-zero or is killed
   by a signal, the supervisor writes one line naming it ("loom: rank 1 (pid 1234) exited with
   status 1" / "... was killed by signal 9 (Killed)"), sends SIGTERM to the process group of every
   rank (those still running, and what exited ranks left behind), waits up to grace_s for them to
   go, SIGKILLs what is left, reaps the ranks, and returns that first failure's exit status
   (1..255; 128+signal for a signal). If this process gets SIGINT or SIGTERM while waiting, it
   writes one line, passes the signal on to the ranks, waits for them (above) and returns
   128+that signal. Errors of its own (bad spec, no free port, fork fails, the program cannot be
   executed) return 1 with a message in err (ranks already started are stopped as on a failure). */
int spawn_local(const SpawnSpec *spec, char *err, size_t errlen);

#endif
