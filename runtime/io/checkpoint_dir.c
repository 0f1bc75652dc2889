/* runtime/io/checkpoint_dir.c — a save dir's lock and the leftovers of dead writers
 * (checkpoint.h: ckpt_lock, ckpt_clean_tmp). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/io/checkpoint.h"
#include "runtime/io/checkpoint_internal.h"
#include "runtime/io/seterr.h"

/* flock rather than an O_EXCL file: the kernel drops it when its holder dies however it
   dies, so a stale lock never needs a person to delete it; the pid inside is only for the
   message. */
int ckpt_lock(const char *save_dir, int *fd_out, char *err, size_t errlen) {
  *fd_out = -1;
  int rc = ckpt_mkdir_p(save_dir, err, errlen);
  if (rc) return 2;
  char *path = ckpt_pjoin(save_dir, CKPT_LOCK_NAME);
  if (!path) {
    seterr(err, errlen, "%s: out of memory", save_dir);
    return 1;
  }
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    seterr(err, errlen, "%s: cannot create the lock file: %s; check that --save-dir is writable", path, strerror(errno));
    free(path);
    return 2;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    char buf[32] = "";
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    buf[n > 0 ? n : 0] = 0;
    long pid = strtol(buf, NULL, 10);
    if (e == EWOULDBLOCK) {
      char who[48] = "another process";
      if (pid > 0) snprintf(who, sizeof who, "process %ld", pid);
      seterr(err, errlen, "%s is in use: %s is writing checkpoints there (%s holds its lock); wait for it to end or "
             "stop it, or give this run another --save-dir", save_dir, who, CKPT_LOCK_NAME);
    } else {
      seterr(err, errlen, "%s: cannot lock: %s", path, strerror(e));
    }
    close(fd);
    free(path);
    return 2;
  }
  char pid[32];
  int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)len, 0) != len) {
    seterr(err, errlen, "%s: cannot write the lock file: %s; check that --save-dir is writable", path, strerror(errno));
    close(fd);
    free(path);
    return 2;
  }
  free(path);
  *fd_out = fd;
  return 0;
}

void ckpt_unlock(int fd) {
  if (fd >= 0) close(fd);   /* closing drops the flock; the file stays, harmless */
}

/* "step_<digits>.tmp.<pid>" or "step_<digits>.old.<pid>": the pid, else -1. */
static long leftover_pid(const char *name) {
  if (strncmp(name, "step_", 5)) return -1;
  const char *s = name + 5;
  size_t d = strspn(s, "0123456789");
  if (!d || (strncmp(s + d, ".tmp.", 5) && strncmp(s + d, ".old.", 5))) return -1;
  const char *p = s + d + 5;
  if (!*p || strspn(p, "0123456789") != strlen(p) || strlen(p) > 9) return -1;
  return strtol(p, NULL, 10);
}

int ckpt_clean_tmp(const char *save_dir, FILE *log) {
  DIR *d = opendir(save_dir);
  if (!d) return 0;
  int removed = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    long pid = leftover_pid(e->d_name);
    if (pid <= 0 || pid == (long)getpid()) continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;   /* alive (or not ours to judge) */
    char *p = ckpt_pjoin(save_dir, e->d_name);
    struct stat st;
    char ignored[512];
    if (p && lstat(p, &st) == 0 && S_ISDIR(st.st_mode) && !ckpt_remove_step_dir(p, ignored, sizeof ignored)) {
      removed++;
      if (log) fprintf(log, "note: removed %s, an unfinished checkpoint of process %ld, which has ended\n", p, pid);
    }
    free(p);
  }
  closedir(d);
  return removed;
}
