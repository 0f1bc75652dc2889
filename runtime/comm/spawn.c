/* runtime/comm/spawn.c — one process per rank on this node, supervised (see spawn.h).
 *
 * Everything a child needs (its environment, argv) is built before fork, so the child runs
 * only async-signal-safe calls between fork and execve (the parent may have threads: OpenBLAS
 * starts its own).  All signals are blocked around fork, so none of the supervisor's handlers
 * runs in a child; the child resets them and restores the caller's mask before execve.  Each
 * child reports a failed execve through a close-on-exec pipe, so "cannot run X" is the
 * supervisor's error rather than N ranks exiting 127.
 *
 * Waiting: SIGCHLD, SIGINT and SIGTERM handlers write the signal's number into a non-blocking
 * self-pipe, which the loop polls (whichever thread the kernel delivers a signal to, the
 * handler runs and the loop wakes); each wake-up reaps the ranks with waitpid(WNOHANG).  The
 * poll has a timeout (1 s; 10 ms while stopping, when it also watches the process groups of
 * exited ranks, which send no SIGCHLD here), so a lost wake-up costs a second, never a hang.
 */
#include "runtime/comm/spawn.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <math.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* Removed from the inherited environment: the variables set per rank, and other launchers'. */
static const char *const DROPPED[] = {
  "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
  "LOOM_SPAWNED", "LOOM_QUIET_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
  "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "PMI_SIZE",
};
enum { NVARS = 9 };   /* the most set per rank */

typedef struct {
  pid_t pid;           /* 0: not started */
  bool live;           /* started and not reaped */
  char **envp;
  char vars[6][32];   /* "NAME=number" */
} Rank;

static const int SIGS[3] = {SIGCHLD, SIGINT, SIGTERM};
static volatile sig_atomic_t wake_fd = -1;

static void on_signal(int sig) {
  int saved = errno;
  unsigned char b = (unsigned char)sig;
  if (wake_fd >= 0) {
    ssize_t n = write(wake_fd, &b, 1);   /* a full pipe already holds a wake-up */
    (void)n;
  }
  errno = saved;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static bool dropped(const char *kv) {
  for (size_t i = 0; i < sizeof DROPPED / sizeof DROPPED[0]; i++) {
    size_t n = strlen(DROPPED[i]);
    if (!strncmp(kv, DROPPED[i], n) && kv[n] == '=') return true;
  }
  return false;
}

/* A TCP port that was free on 127.0.0.1 a moment ago (rank 0 binds it soon after). */
static int free_port(char *err, size_t errlen) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &len)) {
    snprintf(err, errlen, "no free TCP port on 127.0.0.1 for MASTER_PORT: %s", strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
  }
  close(fd);
  return ntohs(a.sin_port);
}

/* fork + execve of one rank.  Returns its pid (*exec_errno: execve's errno, 0 when it ran), or
   -1 with errno when fork failed. */
static pid_t start_rank(const char *exe, char *const *argv, char **envp, pid_t parent, const bool *was_ignored,
                        int *exec_errno) {
  int ep[2];
  *exec_errno = 0;
  if (pipe(ep)) return -1;
  fcntl(ep[0], F_SETFD, FD_CLOEXEC);
  fcntl(ep[1], F_SETFD, FD_CLOEXEC);
  sigset_t all, prev;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &prev);
  pid_t pid = fork();
  if (pid == 0) {   /* the child: async-signal-safe calls only */
    close(ep[0]);
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);   /* the supervisor died before prctl */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    for (int i = 0; i < 3; i++) {
      sa.sa_handler = was_ignored[i] && SIGS[i] != SIGCHLD ? SIG_IGN : SIG_DFL;   /* as exec would */
      sigaction(SIGS[i], &sa, NULL);
    }
    sigprocmask(SIG_SETMASK, &prev, NULL);
    execve(exe, argv, envp);
    int e = errno;
    ssize_t n = write(ep[1], &e, sizeof e);
    (void)n;
    _exit(127);
  }
  int fork_errno = errno;
  pthread_sigmask(SIG_SETMASK, &prev, NULL);
  close(ep[1]);
  if (pid < 0) {
    close(ep[0]);
    errno = fork_errno;
    return -1;
  }
  setpgid(pid, pid);   /* also here, so the group exists whichever runs first */
  int e = 0;
  ssize_t n;
  while ((n = read(ep[0], &e, sizeof e)) < 0 && errno == EINTR) {}
  close(ep[0]);
  if (n == (ssize_t)sizeof e) *exec_errno = e;
  return pid;
}

static void signal_groups(const Rank *r, int world, int sig) {
  for (int i = 0; i < world; i++)
    if (r[i].pid > 0) killpg(r[i].pid, sig);
}

/* Whether any rank's process group still has a live process in it (what a rank started).
   From /proc, since a zombie still counts for killpg(pg, 0) and the PID 1 of a container
   may never reap the orphans; killpg when /proc cannot be read. */
static bool groups_alive(const Rank *r, int world) {
  DIR *d = opendir("/proc");
  if (!d) {
    for (int i = 0; i < world; i++)
      if (r[i].pid > 0 && (killpg(r[i].pid, 0) == 0 || errno == EPERM)) return true;
    return false;
  }
  bool alive = false;
  struct dirent *e;
  while (!alive && (e = readdir(d))) {
    char path[300], buf[512], state = 0;
    int pgrp = 0;
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    buf[n > 0 ? n : 0] = 0;
    char *p = strrchr(buf, ')');   /* "pid (comm) state ppid pgrp ..." */
    if (!p || sscanf(p + 1, " %c %*d %d", &state, &pgrp) != 2 || state == 'Z' || state == 'X') continue;
    for (int i = 0; i < world && !alive; i++) alive = r[i].pid > 0 && pgrp == r[i].pid;
  }
  closedir(d);
  return alive;
}

int spawn_local(const SpawnSpec *spec, char *err, size_t errlen) {
  if (errlen) err[0] = 0;
  int world = spec->world;
  if (world < 1 || world > SPAWN_MAX_WORLD || !spec->argv || !spec->argv[0]) {
    snprintf(err, errlen, "spawn_local: %d processes (1 to %d) of %s", world, SPAWN_MAX_WORLD,
             spec->argv && spec->argv[0] ? "a program" : "no argv");
    return 1;
  }
  FILE *log = spec->log ? spec->log : stderr;
  double grace = spec->grace_s > 0 ? spec->grace_s : 5;
  const char *exe = spec->exe ? spec->exe : "/proc/self/exe";
  int port = free_port(err, errlen);
  if (port < 0) return 1;

  size_t nenv = 0;
  while (environ && environ[nenv]) nenv++;
  Rank *r = calloc((size_t)world, sizeof *r);
  for (int i = 0; r && i < world; i++) {
    if (!(r[i].envp = malloc((nenv + NVARS + 1) * sizeof(char *)))) break;
    size_t k = 0;
    for (size_t j = 0; j < nenv; j++)
      if (!dropped(environ[j])) r[i].envp[k++] = environ[j];
    static const char *const NAME[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_PORT"};
    int value[] = {i, world, i, world, 0, port};
    for (int j = 0; j < 6; j++) {
      snprintf(r[i].vars[j], sizeof r[i].vars[j], "%s=%d", NAME[j], value[j]);
      r[i].envp[k++] = r[i].vars[j];
    }
    r[i].envp[k++] = (char *)"MASTER_ADDR=127.0.0.1";
    r[i].envp[k++] = (char *)"LOOM_SPAWNED=1";
    if (spec->quiet_others && i != 0) r[i].envp[k++] = (char *)"LOOM_QUIET_RANK=1";
    r[i].envp[k] = NULL;
  }
  bool have_env = r != NULL;
  for (int i = 0; r && i < world; i++) have_env = have_env && r[i].envp;
  int wake[2] = {-1, -1};
  if (!have_env || pipe(wake)) {
    snprintf(err, errlen, "spawn_local: %s", have_env ? strerror(errno) : "out of memory");
    for (int i = 0; r && i < world; i++) free(r[i].envp);
    free(r);
    return 1;
  }
  for (int i = 0; i < 2; i++) {
    fcntl(wake[i], F_SETFD, FD_CLOEXEC);
    fcntl(wake[i], F_SETFL, O_NONBLOCK);
  }

  /* The handlers: SIGCHLD always, SIGINT and SIGTERM unless this process ignores them. */
  struct sigaction old[3], sa;
  bool was_ignored[3], installed[3];
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  wake_fd = wake[1];
  for (int i = 0; i < 3; i++) {
    sigaction(SIGS[i], NULL, &old[i]);
    was_ignored[i] = !(old[i].sa_flags & SA_SIGINFO) && old[i].sa_handler == SIG_IGN;
    installed[i] = SIGS[i] == SIGCHLD || !was_ignored[i];
    if (installed[i]) sigaction(SIGS[i], &sa, NULL);
  }

  int status = 0, live = 0, asked = 0;   /* asked: the signal that started a stop (0: none, or a failure) */
  bool stopping = false, killed = false, patient = false;   /* patient: waiting for a signal's clean stop */
  double deadline = 0;
  fflush(NULL);   /* what the caller printed comes before what the ranks print */
  for (int i = 0; i < world; i++) {
    int exec_errno;
    pid_t pid = start_rank(exe, spec->argv, r[i].envp, getpid(), was_ignored, &exec_errno);
    if (pid < 0 || exec_errno) {
      snprintf(err, errlen, "cannot start rank %d of %d (%s): %s", i, world, exe,
               strerror(pid < 0 ? errno : exec_errno));
      if (pid > 0) waitpid(pid, NULL, 0);
      status = 1;
      stopping = true;
      signal_groups(r, i, SIGTERM);
      deadline = now_s() + grace;
      break;
    }
    r[i].pid = pid;
    r[i].live = true;
    live++;
  }

  struct pollfd pfd = {.fd = wake[0], .events = POLLIN};
  for (;;) {
    unsigned char buf[64];
    ssize_t n;
    int got = 0;
    while ((n = read(wake[0], buf, sizeof buf)) > 0)
      for (ssize_t k = 0; k < n; k++)
        if (buf[k] == SIGINT || buf[k] == SIGTERM) got = buf[k];
    if (got && !stopping) {
      fprintf(log, "loom: got %s, passing it on to the ranks\n", got == SIGINT ? "SIGINT" : "SIGTERM");
      fflush(log);
      status = 128 + got;
      stopping = true;
      asked = got;
      patient = true;
      /* no deadline: the ranks finish their step and write a checkpoint (runtime/stop.h); a
         rank that ends otherwise, or a second signal, ends the wait */
      deadline = INFINITY;
      signal_groups(r, world, got);
    } else if (got && !killed) {   /* a second one: no more grace */
      signal_groups(r, world, SIGKILL);
      killed = true;
    }
    for (int i = 0; i < world; i++) {
      int st;
      if (!r[i].live || waitpid(r[i].pid, &st, WNOHANG) != r[i].pid) continue;
      r[i].live = false;
      live--;
      bool clean = WIFEXITED(st) && (WEXITSTATUS(st) == 0 || (asked && WEXITSTATUS(st) == 128 + asked));
      if (clean || (stopping && !patient)) continue;
      if (stopping) {   /* a rank that did not stop cleanly: the others' second signal, at once */
        if (!(WIFSIGNALED(st) && WTERMSIG(st) == asked)) {   /* the signal itself ended it: nothing to say */
          fprintf(log, "loom: rank %d (pid %ld) %s while stopping; stopping the others at once\n", i, (long)r[i].pid,
                  WIFSIGNALED(st) ? "was killed by a signal" : "failed");
          fflush(log);
        }
        signal_groups(r, world, SIGTERM);
        deadline = now_s() + grace;
        patient = false;
        continue;
      }
      if (WIFSIGNALED(st)) {
        fprintf(log, "loom: rank %d (pid %ld) was killed by signal %d (%s)\n", i, (long)r[i].pid, WTERMSIG(st),
                strsignal(WTERMSIG(st)));
        status = 128 + WTERMSIG(st);
      } else {
        fprintf(log, "loom: rank %d (pid %ld) exited with status %d\n", i, (long)r[i].pid, WEXITSTATUS(st));
        status = WEXITSTATUS(st);
      }
      fflush(log);
      stopping = true;
      deadline = now_s() + grace;
      signal_groups(r, world, SIGTERM);   /* exited ranks' groups too: what they left running */
    }
    if (live == 0 && (!stopping || killed || !groups_alive(r, world))) break;
    if (stopping && !killed && now_s() >= deadline) {
      signal_groups(r, world, SIGKILL);
      killed = true;
      continue;
    }
    if (poll(&pfd, 1, stopping ? 10 : 1000) < 0 && errno != EINTR) {
      struct timespec ts = {0, 10 * 1000 * 1000};   /* cannot happen; never spin */
      nanosleep(&ts, NULL);
    }
  }

  for (int i = 0; i < 3; i++)
    if (installed[i]) sigaction(SIGS[i], &old[i], NULL);
  wake_fd = -1;
  close(wake[0]);
  close(wake[1]);
  for (int i = 0; i < world; i++) free(r[i].envp);
  free(r);
  return status;
}
