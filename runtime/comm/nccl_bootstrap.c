/* runtime/comm/nccl_bootstrap.c — how the processes of an NCCL world find each other
 * (comm_nccl.h, start-up steps 1 and 2): the launch variables (nccl_bootstrap_from_env) and
 * the ncclUniqueId's TCP rendezvous on MASTER_ADDR:MASTER_PORT (nccl_rendezvous).  Needs no
 * NCCL and no GPU; split from comm_nccl.c, which creates the communicators. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "runtime/fail.h"
#include "runtime/comm/comm_nccl.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

/* ================================================================== bootstrap variables */

static const char *env_first(const char *const *names, int n) {
  for (int i = 0; i < n; i++) {
    const char *v = getenv(names[i]);
    if (v && *v) return v;
  }
  return NULL;
}

static int parse_int(const char *s, const char *what, int lo, int hi, int *out, char *err, size_t errlen) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return rt_fail(err, errlen, 2, "%s=%s is not a number in [%d, %d]", what, s, lo, hi);
  *out = (int)v;
  return 0;
}

int nccl_bootstrap_from_env(NcclBootstrap *b, char *err, size_t errlen) {
  memset(b, 0, sizeof *b);
  b->device = -1;
  b->timeout_s = 600;
  b->world = 1;
  static const char *const rank_v[] = {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"};
  static const char *const world_v[] = {"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"};
  static const char *const local_v[] = {"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"};
  const char *r = env_first(rank_v, 4), *w = env_first(world_v, 4), *l = env_first(local_v, 4);
  const char *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT"), *t = getenv("LOOM_NCCL_TIMEOUT");
  const char *id = getenv("NCCL_COMM_ID");
  if (w && parse_int(w, "WORLD_SIZE", 1, 1 << 20, &b->world, err, errlen)) return 2;
  if (r && parse_int(r, "RANK", 0, b->world - 1, &b->rank, err, errlen)) return 2;
  if (!r && b->world > 1) return rt_fail(err, errlen, 2, "WORLD_SIZE is %d but RANK is not set", b->world);
  if (l && parse_int(l, "LOCAL_RANK", 0, 1 << 16, &b->device, err, errlen)) return 2;
  if (t) {
    char *end;
    b->timeout_s = strtod(t, &end);
    if (end == t || *end || !(b->timeout_s > 0)) return rt_fail(err, errlen, 2, "LOOM_NCCL_TIMEOUT=%s is not a positive number of seconds", t);
  }
  b->use_comm_id = id && *id;
  snprintf(b->addr, sizeof b->addr, "%s", addr && *addr ? addr : "127.0.0.1");
  b->port = 29500;
  if (port && parse_int(port, "MASTER_PORT", 1, 65535, &b->port, err, errlen)) return 2;
  if (b->world > 1 && !b->use_comm_id && (!addr || !*addr || !port || !*port))
    return rt_fail(err, errlen, 2,
                "a world of %d ranks needs MASTER_ADDR and MASTER_PORT (rank 0's host and a free port) or NCCL_COMM_ID",
                b->world);
  return 0;
}

/* ================================================================== rendezvous (TCP) */

#define RDZV_MAGIC "LOOMRDZ1"
enum { ST_OK = 0, ST_WORLD = 1, ST_RANK = 2, ST_DUP = 3 };
enum { HELLO_BYTES = 16, REPLY_BYTES = 16 + NCCL_ID_BYTES };

static int ms_left(double deadline) {
  double left = deadline - now_s();
  return left <= 0 ? 0 : left > 1e6 ? 1000000000 : (int)(left * 1000) + 1;
}

/* Reads or writes exactly n bytes before the deadline.  0 ok, -1 closed or failed, -2 timeout. */
static int io_full(int fd, void *buf, size_t n, bool wr, double deadline) {
  size_t done = 0;
  while (done < n) {
    struct pollfd p = {fd, wr ? POLLOUT : POLLIN, 0};
    int ms = ms_left(deadline);
    if (!ms) return -2;
    int pr = poll(&p, 1, ms);
    if (pr < 0 && errno == EINTR) continue;
    if (pr < 0) return -1;
    if (pr == 0) return -2;
    ssize_t k = wr ? send(fd, (char *)buf + done, n - done, MSG_NOSIGNAL) : recv(fd, (char *)buf + done, n - done, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (k <= 0) return -1;
    done += (size_t)k;
  }
  return 0;
}

static void put_u32(unsigned char *p, uint32_t v) {
  uint32_t n = htonl(v);
  memcpy(p, &n, 4);
}

static uint32_t get_u32(const unsigned char *p) {
  uint32_t n;
  memcpy(&n, p, 4);
  return ntohl(n);
}

static int listen_on(int port, char *err, size_t errlen) {
  int one = 1, zero = 0, fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {   /* dual stack: IPv4 and IPv6 clients alike */
    struct sockaddr_in6 a6;
    memset(&a6, 0, sizeof a6);
    a6.sin6_family = AF_INET6;
    a6.sin6_addr = in6addr_any;
    a6.sin6_port = htons((uint16_t)port);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    if (bind(fd, (struct sockaddr *)&a6, sizeof a6) == 0 && listen(fd, 128) == 0) return fd;
    close(fd);
  }
  fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -rt_fail(err, errlen, 1, "rank 0: socket: %s", strerror(errno));
  struct sockaddr_in a4;
  memset(&a4, 0, sizeof a4);
  a4.sin_family = AF_INET;
  a4.sin_addr.s_addr = htonl(INADDR_ANY);
  a4.sin_port = htons((uint16_t)port);
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (struct sockaddr *)&a4, sizeof a4) || listen(fd, 128)) {
    int e = errno;
    close(fd);
    return -rt_fail(err, errlen, 1, "rank 0: cannot listen on port %d for the rendezvous: %s (is MASTER_PORT in use?)", port,
                 strerror(e));
  }
  return fd;
}

static int serve(int port, int world, const unsigned char id[NCCL_ID_BYTES], double timeout_s, char *err,
                 size_t errlen) {
  int lfd = listen_on(port, err, errlen);
  if (lfd < 0) return 1;
  double deadline = now_s() + timeout_s;
  bool *seen = calloc((size_t)world, 1);
  if (!seen) {
    close(lfd);
    return rt_fail(err, errlen, 1, "out of memory");
  }
  int served = 0, rc = 0;
  while (served < world - 1 && !rc) {
    struct pollfd p = {lfd, POLLIN, 0};
    int ms = ms_left(deadline);
    int pr = ms ? poll(&p, 1, ms) : 0;
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) {   /* timeout: name who is missing */
      char missing[256] = "";
      size_t used = 0;
      int n_missing = 0;
      for (int r = 1; r < world; r++)
        if (!seen[r] && n_missing++ < 16) {
          int w = snprintf(missing + used, sizeof missing - used, "%s%d", used ? ", " : "", r);
          if (w > 0 && used + (size_t)w < sizeof missing) used += (size_t)w;
        }
      rc = rt_fail(err, errlen, 1, "rank 0: rendezvous on port %d: rank%s %s%s did not arrive within %g s (%d of %d did)", port,
                n_missing > 1 ? "s" : "", missing, n_missing > 16 ? ", ..." : "", timeout_s, served + 1, world);
      break;
    }
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0) continue;
    /* A client has a few seconds to say who it is; a stray connection cannot stall us. */
    double cd = now_s() + 5 < deadline ? now_s() + 5 : deadline;
    unsigned char hello[HELLO_BYTES], reply[REPLY_BYTES];
    if (io_full(fd, hello, sizeof hello, false, cd) || memcmp(hello, RDZV_MAGIC, 8)) {
      close(fd);   /* not one of ours */
      continue;
    }
    uint32_t r = get_u32(hello + 8), w = get_u32(hello + 12);
    uint32_t st = w != (uint32_t)world ? ST_WORLD : r < 1 || r >= (uint32_t)world ? ST_RANK : seen[r] ? ST_DUP : ST_OK;
    memset(reply, 0, sizeof reply);
    memcpy(reply, RDZV_MAGIC, 8);
    put_u32(reply + 8, st);
    put_u32(reply + 12, (uint32_t)world);
    if (st == ST_OK) memcpy(reply + 16, id, NCCL_ID_BYTES);
    int wr = io_full(fd, reply, sizeof reply, true, cd);
    close(fd);
    if (st == ST_WORLD)
      rc = rt_fail(err, errlen, 2, "rank 0: rank %u says the world has %u ranks; rank 0 has WORLD_SIZE %d", r, w, world);
    else if (st == ST_RANK)
      rc = rt_fail(err, errlen, 2, "rank 0: a process says it is rank %u of a world of %d", r, world);
    else if (st == ST_DUP)
      rc = rt_fail(err, errlen, 2, "rank 0: two processes say they are rank %u (RANK set twice?)", r);
    else if (!wr) {
      seen[r] = true;
      served++;
    }
  }
  free(seen);
  close(lfd);
  return rc;
}

/* One connection attempt to addr:port within the deadline; the socket or -1. */
static int try_connect(const struct addrinfo *ai, double deadline) {
  int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0) return -1;
  int fl = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, fl | O_NONBLOCK);
  int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
  if (r < 0 && errno == EINPROGRESS) {
    struct pollfd p = {fd, POLLOUT, 0};
    int ms = ms_left(deadline);
    if (ms > 1000) ms = 1000;
    int e = 0;
    socklen_t el = sizeof e;
    if (poll(&p, 1, ms) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) == 0 && e == 0) r = 0;
    else errno = e ? e : ETIMEDOUT;
  }
  if (r < 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

static int fetch(const char *addr, int port, int rank, int world, unsigned char id[NCCL_ID_BYTES], double timeout_s,
                 char *err, size_t errlen) {
  double deadline = now_s() + timeout_s;
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port);
  int fd = -1, last_errno = 0;
  char last[256] = "no attempt";
  while (fd < 0) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int g = getaddrinfo(addr, ps, &hints, &res);
    if (g) snprintf(last, sizeof last, "%s", gai_strerror(g));
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
      fd = try_connect(ai, deadline);
      if (fd < 0) last_errno = errno;
    }
    if (res) freeaddrinfo(res);
    if (fd >= 0) break;
    if (!g) snprintf(last, sizeof last, "%s", strerror(last_errno));
    if (!ms_left(deadline))
      return rt_fail(err, errlen, 1, "rank %d: could not reach rank 0 at %s:%d within %g s (%s)", rank, addr, port, timeout_s,
                  last);
    sleep_s(0.05);   /* rank 0 may not be listening yet */
  }
  unsigned char hello[HELLO_BYTES], reply[REPLY_BYTES];
  memcpy(hello, RDZV_MAGIC, 8);
  put_u32(hello + 8, (uint32_t)rank);
  put_u32(hello + 12, (uint32_t)world);
  int rc = io_full(fd, hello, sizeof hello, true, deadline);
  if (!rc) rc = io_full(fd, reply, sizeof reply, false, deadline);
  close(fd);
  if (rc == -2) return rt_fail(err, errlen, 1, "rank %d: rank 0 at %s:%d did not answer within %g s", rank, addr, port, timeout_s);
  if (rc || memcmp(reply, RDZV_MAGIC, 8))
    return rt_fail(err, errlen, 1, "rank %d: the rendezvous at %s:%d failed (is something else on that port?)", rank, addr, port);
  uint32_t st = get_u32(reply + 8), w0 = get_u32(reply + 12);
  if (st == ST_WORLD)
    return rt_fail(err, errlen, 2, "rank %d: WORLD_SIZE is %d here but %u on rank 0", rank, world, w0);
  if (st == ST_DUP) return rt_fail(err, errlen, 2, "rank %d: another process already claimed rank %d", rank, rank);
  if (st != ST_OK) return rt_fail(err, errlen, 2, "rank %d: rank 0 refused rank %d of a world of %d", rank, rank, world);
  memcpy(id, reply + 16, NCCL_ID_BYTES);
  return 0;
}

int nccl_rendezvous(const char *addr, int port, int rank, int world, unsigned char id[NCCL_ID_BYTES], double timeout_s,
                    char *err, size_t errlen) {
  if (world < 1 || rank < 0 || rank >= world) return rt_fail(err, errlen, 2, "rank %d of a world of %d", rank, world);
  if (port < 1 || port > 65535) return rt_fail(err, errlen, 2, "rendezvous port %d is not a TCP port", port);
  if (world == 1) return 0;
  return rank == 0 ? serve(port, world, id, timeout_s, err, errlen)
                   : fetch(addr, port, rank, world, id, timeout_s, err, errlen);
}

