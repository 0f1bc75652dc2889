/* tests/unit/test_spawn.c — the local launcher (runtime/comm/spawn.h), with /bin/sh scripts as
   ranks: each rank's environment (torchrun's variables set, other launchers' removed), a
   failing rank stopping the others (SIGTERM, then SIGKILL after the grace period for one that
   ignores it), a rank killed by a signal, a rank's own child killed with it, SIGTERM to the
   supervisor passed on (and ranks that stop cleanly on it waited for past the grace period),
   the caller's signal handlers restored, a killed supervisor's ranks
   gone, this program as the ranks (exe NULL), and a program that cannot be run.  Scripts
   write into $D, a temporary folder. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/comm/spawn.h"
#include "tests/unit/check.h"

/* Shell: wait until $D/name is written (so a rank fails only once the others are ready). */
#define WAIT_FOR(name) "until [ -s $D/" name " ]; do sleep 0.01; done; "

static char dir[] = "/tmp/loom_test_spawn_XXXXXX";
static char logbuf[4096];
static double elapsed;
static char err[512];

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* spawn_local of `world` ranks of sh -c script; the supervisor's lines land in logbuf. */
static int run(int world, const char *script, double grace, bool quiet_others) {
  char *const argv[] = {"sh", "-c", (char *)script, NULL};
  FILE *log = tmpfile();
  SpawnSpec s = {.world = world, .exe = "/bin/sh", .argv = argv, .grace_s = grace, .log = log, .quiet_others = quiet_others};
  double t0 = now_s();
  int rc = spawn_local(&s, err, sizeof err);
  elapsed = now_s() - t0;
  rewind(log);
  size_t n = fread(logbuf, 1, sizeof logbuf - 1, log);
  logbuf[n] = 0;
  fclose(log);
  return rc;
}

/* The contents of $D/name ("" when absent). */
static const char *slurp(const char *name) {
  static char buf[1024];
  char path[256];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  buf[0] = 0;
  FILE *f = fopen(path, "r");
  if (!f) return buf;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  return buf;
}

static long pid_in(const char *name) { return atol(slurp(name)); }

/* Gone, or a zombie no one reaps yet (PID 1 of a container may not). */
static bool is_dead(long pid) {
  if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return true;
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return true;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  char *p = strrchr(buf, ')');
  return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

/* pid is dead now or within 1 s (a SIGKILL lands asynchronously); kills it either way so
   that a failing check leaves no sleeper behind. */
static bool dead(long pid) {
  if (pid <= 0) return false;
  bool d = false;
  for (int i = 0; i < 100 && !(d = is_dead(pid)); i++) nanosleep(&(struct timespec){0, 10000000}, NULL);
  if (!d) kill((pid_t)pid, SIGKILL);
  return d;
}

static void clean(void) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -f %s/*", dir);
  if (system(cmd) != 0) printf("cannot empty %s\n", dir);
}

static volatile sig_atomic_t dummy_hits;
static void dummy(int sig) { dummy_hits += sig; }

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--child")) {   /* a rank of check 8 */
    const char *rank = getenv("RANK");
    char path[300];
    snprintf(path, sizeof path, "%s/self.%s", argv[2], rank ? rank : "none");
    FILE *f = fopen(path, "w");
    if (!f) return 9;
    const char *spawned = getenv("LOOM_SPAWNED"), *ws = getenv("WORLD_SIZE"), *quiet = getenv("LOOM_QUIET_RANK");
    fprintf(f, "%s %s %s\n", spawned ? spawned : "-", ws ? ws : "-", quiet ? quiet : "-");
    fclose(f);
    return 0;
  }
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  setenv("D", dir, 1);
  sigset_t mask0, mask1;
  sigprocmask(SIG_SETMASK, NULL, &mask0);

  /* 1. The environment of each rank; nothing printed on success. */
  setenv("SLURM_PROCID", "7", 1);
  setenv("OMPI_COMM_WORLD_RANK", "7", 1);
  setenv("RANK", "5", 1);
  setenv("LOOM_QUIET_RANK", "1", 1);
  setenv("KEEP", "kept", 1);
  int rc = run(3, "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $MASTER_PORT "
                  "$LOOM_SPAWNED ${SLURM_PROCID-unset} ${OMPI_COMM_WORLD_RANK-unset} ${PMI_RANK-unset} "
                  "${LOOM_QUIET_RANK-unset} $KEEP\" > $D/env.$RANK",
               1, true);
  CHECK(rc == 0 && !logbuf[0], "env: rc %d, log '%s' (%s)", rc, logbuf, err);
  int port0 = -1;
  for (int i = 0; i < 3; i++) {
    char name[32], addr[64], slurm[16], ompi[16], pmi[16], quiet[16], keep[16];
    int rank = -1, ws = -1, lr = -1, lws = -1, gr = -1, port = -1, spawned = -1;
    snprintf(name, sizeof name, "env.%d", i);
    const char *s = slurp(name);
    int n = sscanf(s, "%d %d %d %d %d %63s %d %d %15s %15s %15s %15s %15s", &rank, &ws, &lr, &lws, &gr, addr, &port, &spawned,
                   slurm, ompi, pmi, quiet, keep);
    if (i == 0) port0 = port;
    CHECK(n == 13 && rank == i && ws == 3 && lr == i && lws == 3 && gr == 0 && !strcmp(addr, "127.0.0.1") && port > 0 &&
              port < 65536 && port == port0 && spawned == 1 && !strcmp(slurm, "unset") && !strcmp(ompi, "unset") &&
              !strcmp(pmi, "unset") && !strcmp(quiet, i == 0 ? "unset" : "1") && !strcmp(keep, "kept"),
          "env of rank %d: '%s'", i, s);
  }
  CHECK(!strcmp(getenv("SLURM_PROCID"), "7") && !strcmp(getenv("RANK"), "5"), "the parent's environment is untouched");
  unsetenv("SLURM_PROCID");
  unsetenv("OMPI_COMM_WORLD_RANK");
  unsetenv("RANK");
  unsetenv("LOOM_QUIET_RANK");
  clean();

  /* 2. Rank 1 exits 3: the sleepers get SIGTERM (well before the grace period ends). */
  rc = run(3, "echo $$ > $D/pid.$RANK; if [ $RANK = 1 ]; then " WAIT_FOR("pid.0") WAIT_FOR("pid.2") "exit 3; fi; exec sleep 60", 2, false);
  char want[200];
  snprintf(want, sizeof want, "loom: rank 1 (pid %ld) exited with status 3\n", pid_in("pid.1"));
  CHECK(rc == 3 && elapsed < 2, "exit 3: rc %d after %.2f s (%s)", rc, elapsed, err);
  CHECK(!strcmp(logbuf, want), "exit 3: log '%s', want '%s'", logbuf, want);
  CHECK(dead(pid_in("pid.0")) && dead(pid_in("pid.2")), "exit 3: the sleepers %ld and %ld are gone", pid_in("pid.0"),
        pid_in("pid.2"));
  clean();

  /* 3. A rank that ignores SIGTERM is SIGKILLed after the grace period. */
  rc = run(2, "if [ $RANK = 1 ]; then " WAIT_FOR("pid.0") "exit 1; fi; trap '' TERM; echo $$ > $D/pid.0; sleep 60", 0.5, false);
  CHECK(rc == 1 && elapsed > 0.5 && elapsed < 2.5, "ignores TERM: rc %d after %.2f s (%s)", rc, elapsed, err);
  CHECK(dead(pid_in("pid.0")), "ignores TERM: rank 0 (%ld) is gone", pid_in("pid.0"));
  clean();

  /* 4. A rank killed by signal 9. */
  rc = run(2, "echo $$ > $D/pid.$RANK; if [ $RANK = 1 ]; then " WAIT_FOR("pid.0") "kill -9 $$; fi; exec sleep 60", 2, false);
  snprintf(want, sizeof want, "loom: rank 1 (pid %ld) was killed by signal 9 (Killed)\n", pid_in("pid.1"));
  CHECK(rc == 137 && elapsed < 2, "kill -9: rc %d after %.2f s (%s)", rc, elapsed, err);
  CHECK(!strcmp(logbuf, want), "kill -9: log '%s', want '%s'", logbuf, want);
  CHECK(dead(pid_in("pid.0")), "kill -9: rank 0 is gone");
  clean();

  /* 5. What a failed rank started dies with it, even after every rank has exited, and what
     rank 0 left running gets the grace period to finish (it takes 0.3 s after SIGTERM). */
  rc = run(2,
           "if [ $RANK = 1 ]; then sleep 60 & echo $! > $D/gc; " WAIT_FOR("ready") "exit 4; fi; sh -c 'trap "
           "\"sleep 0.3; echo done > $D/gcdone; exit 0\" TERM; echo > $D/ready; while :; do sleep 0.05; done' 2>/dev/null & exit 0",
           2, false);
  CHECK(rc == 4 && elapsed > 0.3 && elapsed < 4, "grandchild: rc %d after %.2f s (%s)", rc, elapsed, err);
  CHECK(dead(pid_in("gc")), "grandchild %ld is gone", pid_in("gc"));
  CHECK(!strcmp(slurp("gcdone"), "done\n"), "rank 0's child finished within the grace period: '%s'", slurp("gcdone"));
  clean();

  /* 6. SIGTERM to the supervisor is passed on; the caller's handlers come back (a SIGTERM
     handler, SIGCHLD ignored: the supervisor must still see its children exit). */
  struct sigaction sa, old_term, old_chld;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = dummy;
  sigaction(SIGTERM, &sa, NULL);
  sa.sa_handler = SIG_IGN;
  sigaction(SIGCHLD, &sa, NULL);
  rc = run(2, "echo $$ > $D/pid.$RANK; if [ $RANK = 1 ]; then " WAIT_FOR("pid.0") "kill -TERM $PPID; fi; exec sleep 60", 2, false);
  CHECK(rc == 143 && elapsed < 2 && strstr(logbuf, "got SIGTERM"), "SIGTERM: rc %d after %.2f s, log '%s' (%s)", rc,
        elapsed, logbuf, err);
  CHECK(dead(pid_in("pid.0")) && dead(pid_in("pid.1")), "SIGTERM: both ranks are gone");
  sigaction(SIGTERM, NULL, &old_term);
  sigaction(SIGCHLD, NULL, &old_chld);
  CHECK(old_term.sa_handler == dummy && old_chld.sa_handler == SIG_IGN && dummy_hits == 0,
        "SIGTERM: the caller's handlers are back (hits %d)", (int)dummy_hits);
  rc = run(1, "exit 0", 1, false);
  CHECK(rc == 0, "SIGCHLD ignored: rc %d (%s)", rc, err);
  sa.sa_handler = SIG_DFL;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGCHLD, &sa, NULL);
  clean();

  /* 6b. Ranks that stop cleanly on the signal (a training loop finishing its step and writing a
     checkpoint, runtime/stop.h): the supervisor waits for them past the grace period (1 s
     here, the ranks take 1.5 s), then returns 128 + the signal. */
  sa.sa_handler = dummy;
  sigaction(SIGTERM, &sa, NULL);
  rc = run(2, "trap 'sleep 1.5; echo saved > $D/stop.$RANK; exit 143' TERM; echo $$ > $D/pid.$RANK; "
              "if [ $RANK = 1 ]; then " WAIT_FOR("pid.0") "kill -TERM $PPID; fi; while :; do sleep 0.05; done", 1, false);
  CHECK(rc == 143 && elapsed >= 1.5 && !strcmp(slurp("stop.0"), "saved\n") && !strcmp(slurp("stop.1"), "saved\n") &&
        !strstr(logbuf, "while stopping"),
        "a clean stop past the grace period: rc %d after %.2f s, ranks wrote '%s' '%s', log '%s'", rc, elapsed,
        slurp("stop.0"), slurp("stop.1"), logbuf);
  sa.sa_handler = SIG_DFL;
  sigaction(SIGTERM, &sa, NULL);
  clean();

  /* 7. A supervisor that is killed takes its ranks with it (PR_SET_PDEATHSIG). */
  pid_t sup = fork();
  if (sup == 0) _exit(run(2, "echo $$ > $D/pid.$RANK; exec sleep 60", 1, false));
  for (int i = 0; i < 500 && !(pid_in("pid.0") && pid_in("pid.1")); i++) nanosleep(&(struct timespec){0, 10000000}, NULL);
  kill(sup, SIGKILL);
  waitpid(sup, NULL, 0);
  CHECK(pid_in("pid.0") && dead(pid_in("pid.0")) && dead(pid_in("pid.1")), "killed supervisor: ranks %ld and %ld are gone",
        pid_in("pid.0"), pid_in("pid.1"));
  clean();

  /* 8. exe NULL: this program; no quiet_others, no LOOM_QUIET_RANK (not even inherited). */
  setenv("LOOM_QUIET_RANK", "1", 1);
  char *const self_argv[] = {argv[0], "--child", dir, NULL};
  SpawnSpec self = {.world = 2, .argv = self_argv};
  rc = spawn_local(&self, err, sizeof err);
  CHECK(rc == 0 && !strcmp(slurp("self.0"), "1 2 -\n") && !strcmp(slurp("self.1"), "1 2 -\n"), "self: rc %d, '%s' (%s)", rc,
        slurp("self.1"), err);
  unsetenv("LOOM_QUIET_RANK");
  clean();

  /* 9. Errors of its own. */
  char *const sh_argv[] = {"sh", "-c", "exit 0", NULL};
  SpawnSpec bad = {.world = 2, .exe = "/nonexistent/loom", .argv = sh_argv, .log = stdout};
  rc = spawn_local(&bad, err, sizeof err);
  CHECK(rc == 1 && strstr(err, "cannot start rank 0") && strstr(err, "No such file"), "no program: rc %d (%s)", rc, err);
  bad.exe = "/bin/sh";
  bad.world = 0;
  rc = spawn_local(&bad, err, sizeof err);
  CHECK(rc == 1 && err[0], "world 0: rc %d (%s)", rc, err);

  sigprocmask(SIG_SETMASK, NULL, &mask1);
  bool same = true;
  for (int s = 1; s < 32; s++) same = same && sigismember(&mask0, s) == sigismember(&mask1, s);
  CHECK(same, "the signal mask is unchanged");
  rmdir(dir);
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
