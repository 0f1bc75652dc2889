/* tests/unit/test_nccl_boot.c — how the ranks of a mesh find each other, without a GPU (CI):
 * the bootstrap variables (torchrun, Slurm, MPI, NCCL_COMM_ID; a world of one without any),
 * NCCL refusing a world without a GPU cleanly, and the TCP rendezvous that hands rank 0's
 * ncclUniqueId to every rank (threads and processes on localhost, timeouts, mismatches,
 * duplicate ranks).  Split from test_cuda_runtime.c, which checks the CUDA runtime itself:
 * this is runtime/comm/comm_nccl.c's bootstrap, which needs neither the driver nor a program.
 */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/comm/comm_nccl.h"
#include "runtime/cuda/cuda_api.h"
#include "tests/unit/check.h"
#include "tests/unit/nccl_boot_env.h"

static bool has(const char *s, const char *part) { return s && strstr(s, part) != NULL; }

static void test_bootstrap_env(void) {
  char err[512];
  NcclBootstrap b;
  clear_boot_env();
  int rc = nccl_bootstrap_from_env(&b, err, sizeof err);
  CHECK(!rc && b.rank == 0 && b.world == 1 && b.device == -1 && b.timeout_s == 600, "no variables: a world of one");
  setenv("WORLD_SIZE", "4", 1);
  setenv("RANK", "2", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("MASTER_ADDR", "node7", 1);
  setenv("MASTER_PORT", "29511", 1);
  setenv("LOOM_NCCL_TIMEOUT", "12.5", 1);
  rc = nccl_bootstrap_from_env(&b, err, sizeof err);
  CHECK(!rc && b.rank == 2 && b.world == 4 && b.device == 1 && !strcmp(b.addr, "node7") && b.port == 29511 &&
            b.timeout_s == 12.5 && !b.use_comm_id,
        "torchrun variables: %s", rc ? err : "");
  unsetenv("MASTER_ADDR");
  rc = nccl_bootstrap_from_env(&b, err, sizeof err);
  CHECK(rc == 2 && has(err, "MASTER_ADDR"), "a world without MASTER_ADDR: %s", err);
  setenv("NCCL_COMM_ID", "node7:29600", 1);
  rc = nccl_bootstrap_from_env(&b, err, sizeof err);
  CHECK(!rc && b.use_comm_id, "NCCL_COMM_ID replaces MASTER_ADDR/PORT");
  setenv("RANK", "4", 1);
  rc = nccl_bootstrap_from_env(&b, err, sizeof err);
  CHECK(rc == 2 && has(err, "RANK"), "a rank outside the world: %s", err);
  clear_boot_env();
  setenv("SLURM_PROCID", "3", 1);
  setenv("SLURM_NTASKS", "8", 1);
  setenv("SLURM_LOCALID", "3", 1);
  setenv("MASTER_ADDR", "10.0.0.1", 1);
  setenv("MASTER_PORT", "2000", 1);
  rc = nccl_bootstrap_from_env(&b, err, sizeof err);
  CHECK(!rc && b.rank == 3 && b.world == 8 && b.device == 3, "Slurm variables: %s", rc ? err : "");
  clear_boot_env();
  setenv("WORLD_SIZE", "2", 1);
  rc = nccl_bootstrap_from_env(&b, err, sizeof err);
  CHECK(rc == 2 && has(err, "RANK"), "WORLD_SIZE without RANK: %s", err);
  clear_boot_env();
}

static void test_nccl_without_gpu(bool gpu_present) {
  char err[1024];
  int64_t mesh[COMM_AXES] = {1, 1, 1, 1, 1};
  clear_boot_env();
  int v = nccl_version(err, sizeof err);
  if (v) printf("note: NCCL %d loads without a device\n", v);
  else printf("note: %s\n", err);
  Comm *c = (Comm *)(uintptr_t)1;
  int64_t mesh2[COMM_AXES] = {2, 1, 1, 1, 1};
  int rc = nccl_world_new(mesh2, NULL, &c, err, sizeof err);
  CHECK(rc == 2 && c == NULL && has(err, "mesh has 2 ranks"), "a mesh unlike the world: %s", err);
  if (gpu_present) {
    printf("SKIP: NCCL-without-a-GPU checks (a GPU is present)\n");
    return;
  }
  c = (Comm *)(uintptr_t)1;
  rc = nccl_world_new(mesh, NULL, &c, err, sizeof err);
  CHECK(rc == 1 && c == NULL && (has(err, "NCCL needs a GPU") || has(err, "without the CUDA headers")) && has(err, "rank 0"),
        "nccl_world_new fails cleanly: %s", err);
  printf("note: nccl_world_new: %s\n", err);
  nccl_world_free(NULL);
}

/* ================================================================== rendezvous */

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  int port = -1;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

typedef struct {
  const char *addr;
  int port, rank, world, rc;
  double timeout;
  unsigned char id[NCCL_ID_BYTES];
  char err[512];
} RdzvArg;

static void *rdzv_thread(void *p) {
  RdzvArg *a = p;
  a->rc = nccl_rendezvous(a->addr, a->port, a->rank, a->world, a->id, a->timeout, a->err, sizeof a->err);
  return NULL;
}

static void fake_id(unsigned char id[NCCL_ID_BYTES], int salt) {
  for (int k = 0; k < NCCL_ID_BYTES; k++) id[k] = (unsigned char)(k * 7 + 3 + salt);
}

/* Runs ranks [0, n) of a world of `world` as threads; rank r claims claim[r] (NULL: r). */
static void run_threads(RdzvArg *a, int n, int world, int port, double timeout, const int *claim, const int *worlds) {
  pthread_t th[8];
  for (int r = 0; r < n; r++) {
    memset(&a[r], 0, sizeof a[r]);
    a[r].addr = r % 2 ? "localhost" : "127.0.0.1";
    a[r].port = port;
    a[r].rank = claim ? claim[r] : r;
    a[r].world = worlds ? worlds[r] : world;
    a[r].timeout = timeout;
    if (a[r].rank == 0) fake_id(a[r].id, 1);
  }
  /* clients first: they must wait for rank 0 to come up */
  for (int r = n - 1; r >= 0; r--) pthread_create(&th[r], NULL, rdzv_thread, &a[r]);
  for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
}

static void test_rendezvous(void) {
  unsigned char want[NCCL_ID_BYTES];
  fake_id(want, 1);
  RdzvArg a[8];
  /* four ranks as threads */
  int port = free_port();
  CHECK(port > 0, "a free port");
  run_threads(a, 4, 4, port, 20.0, NULL, NULL);
  for (int r = 0; r < 4; r++)
    CHECK(a[r].rc == 0 && !memcmp(a[r].id, want, NCCL_ID_BYTES), "rank %d of 4 has rank 0's id: %s", r, a[r].err);
  /* a world of one needs nobody */
  unsigned char id[NCCL_ID_BYTES];
  char err[512];
  CHECK(nccl_rendezvous("127.0.0.1", 1, 0, 1, id, 1.0, err, sizeof err) == 0, "world of one");

  /* two ranks as processes */
  port = free_port();
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    unsigned char got[NCCL_ID_BYTES];
    char e[512];
    int rc = nccl_rendezvous("127.0.0.1", port, 1, 2, got, 20.0, e, sizeof e);
    _exit(rc ? 2 : memcmp(got, want, NCCL_ID_BYTES) ? 3 : 0);
  }
  fake_id(id, 1);
  int rc = nccl_rendezvous("127.0.0.1", port, 0, 2, id, 20.0, err, sizeof err);
  int status = -1;
  waitpid(pid, &status, 0);
  CHECK(rc == 0, "rank 0 process served: %s", err);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank 1 process received the id (status %d)", status);

  /* a rank that never comes: rank 0 names it; the others got their id */
  port = free_port();
  run_threads(a, 2, 3, port, 1.0, NULL, NULL);
  CHECK(a[0].rc == 1 && has(a[0].err, "rank 2 did not arrive"), "missing rank named: %s", a[0].err);
  CHECK(a[1].rc == 0, "rank 1 was served: %s", a[1].err);

  /* ranks that disagree on the world size */
  port = free_port();
  int worlds[2] = {2, 3};
  run_threads(a, 2, 2, port, 10.0, NULL, worlds);
  CHECK(a[0].rc == 2 && has(a[0].err, "world has 3 ranks"), "rank 0 sees the mismatch: %s", a[0].err);
  CHECK(a[1].rc == 2 && has(a[1].err, "WORLD_SIZE is 3 here but 2"), "rank 1 sees the mismatch: %s", a[1].err);

  /* two processes claiming one rank */
  port = free_port();
  int claim[3] = {0, 1, 1};
  run_threads(a, 3, 3, port, 10.0, claim, NULL);
  CHECK(a[0].rc == 2 && has(a[0].err, "two processes say they are rank 1"), "a duplicate rank: %s", a[0].err);
  CHECK((a[1].rc == 2) != (a[2].rc == 2), "one of the two claimants is refused (%d %d)", a[1].rc, a[2].rc);

  /* nobody at the address: the client gives up at its deadline */
  port = free_port();
  rc = nccl_rendezvous("127.0.0.1", port, 1, 2, id, 0.5, err, sizeof err);
  CHECK(rc == 1 && has(err, "could not reach rank 0"), "no rank 0: %s", err);

  /* a stray connection that says nothing useful does not stop rank 0 */
  port = free_port();
  RdzvArg srv;
  memset(&srv, 0, sizeof srv);
  srv.addr = "127.0.0.1";
  srv.port = port;
  srv.world = 2;
  srv.timeout = 20;
  fake_id(srv.id, 1);
  pthread_t th;
  pthread_create(&th, NULL, rdzv_thread, &srv);
  int junk_sent = 0;
  for (int tries = 0; tries < 200 && !junk_sent; tries++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons((uint16_t)port);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
      junk_sent = send(fd, "GET / HTTP/1.0\r\n\r\n", 18, MSG_NOSIGNAL) == 18;
    } else {
      usleep(10000);
    }
    close(fd);
  }
  rc = nccl_rendezvous("127.0.0.1", port, 1, 2, id, 20.0, err, sizeof err);
  pthread_join(th, NULL);
  CHECK(junk_sent && rc == 0 && srv.rc == 0 && !memcmp(id, want, NCCL_ID_BYTES), "after a stray connection: %s / %s", err,
        srv.err);
  CHECK(nccl_rendezvous("127.0.0.1", 70000, 1, 2, id, 1.0, err, sizeof err) == 2, "a bad port is refused");
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  char why[1024];
  bool present = cuda_available(why, sizeof why);   /* a GPU changes what NCCL may do */
  test_bootstrap_env();
  test_nccl_without_gpu(present);
  test_rendezvous();
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
