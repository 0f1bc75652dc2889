/* tests/cuda_emu/fake_nccl_internal.h — what the two files of the NCCL double share (fake_nccl.c
 * describes the double: the segment, the waits, strict mode): the segment's layout, the
 * communicator, and the waiting, errors and barrier of fake_nccl_wait.c.  Everything here is
 * hidden: the library exports NCCL's API alone, as before the split.
 */
#ifndef LOOM_FAKE_NCCL_INTERNAL_H
#define LOOM_FAKE_NCCL_INTERNAL_H

#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define MAGIC 0x4e43434cu   /* "NCCL" */
#define MAX_RANKS 64
#define SEG_BUDGET (2u << 20) /* bytes of staging areas, and again of pipes, a segment */
#define NAME_LEN 160
#define NAME_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-"
#define SLOTS 13          /* strict mode: the sizes of a pipe's last receives posted */
#define MSG_LEN 512

enum { B_NONE, B_SEND, B_RECV, B_COLL };   /* strict mode: what a blocked rank waits for */

typedef struct {   /* strict mode: a rank's wait, written by that rank alone (ver: a seqlock) */
  _Atomic uint64_t ver, call, chk, k, tail;   /* call: calls entered; chk: confirmations */
  _Atomic uint64_t dead;                      /* the call a deadlock was found in (by any rank's look) */
  _Atomic int32_t kind, peer, fn, split;      /* peer: the root rank waited for */
} Blk;

typedef struct {
  _Atomic uint32_t magic;
  int32_t nranks;
  _Atomic int32_t attached;
  _Atomic int32_t aborted;   /* root segment: 0, or 1 + the root rank of an abort in the family */
  _Atomic uint32_t bar_count, bar_gen;
  _Atomic int32_t pid[MAX_RANKS];
  int32_t color[MAX_RANKS], key[MAX_RANKS];
  _Atomic uint32_t arrived[MAX_RANKS];   /* 1 + the barrier generation each rank last joined */
  _Atomic int32_t root_of[MAX_RANKS];    /* each rank's rank in the family's root */
  Blk blk[MAX_RANKS];                    /* root segment, strict mode: every rank's wait */
} Hdr;

typedef struct {
  _Atomic uint64_t head, tail;   /* bytes written by the sender, read by the receiver */
  _Atomic uint64_t posted;       /* receives posted by the receiver */
  _Atomic uint64_t size[SLOTS];  /* receive k's (k mod 2^24) << 40 | bytes, in slot k % SLOTS */
} RingHdr;

typedef struct {
  void *base;
  size_t len;
  _Atomic int refs;
} Map;

struct ncclComm {
  struct ncclComm *next;   /* on the list of aborted communicators */
  Map *seg, *root;         /* this one's segment; the family's root segment (the abort flag) */
  Hdr *hdr;
  RingHdr *rings;
  char *data, *ringdata;
  size_t data_bytes, ring_bytes;
  int rank, nranks, root_rank, blocking, strict;
  unsigned splits;
  uint64_t nsend[MAX_RANKS], nrecv[MAX_RANKS];   /* messages issued to / receives posted from each peer */
  _Atomic int dead, busy, err;   /* dead: aborted or destroyed; busy: calls inside; err: sticky */
  char name[NAME_LEN];
  char last[MSG_LEN];
};

/* ------------------------------------------------------------ fake_nccl_wait.c */
#pragma GCC visibility push(hidden)

extern pthread_mutex_t g_mu;   /* guards g_last and fake_nccl.c's list of aborted communicators */
extern char g_last[MSG_LEN];   /* the last error, for ncclGetLastError without a communicator */

typedef struct {
  double t0, next_peer, max;
  long ns;
} Wait;

typedef struct {
  uint64_t call, chk, k, tail, chk2;
  int node, kind, peer, fn, split;
} Rec;

typedef struct {   /* a blocked rank's looks at every rank's wait: 0, 1, 2 done */
  int look;
  Rec p[MAX_RANKS];   /* by root rank; kind 0: not blocked, or its wait changed */
} Det;

double now_s(void);
void sleep_ns(long ns);
/* Records an error (sticky: the communicator's state, first one wins) and returns its code. */
ncclResult_t note(ncclComm_t c, ncclResult_t r, int sticky, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* A wait: started (wait_init), whether the 100 ms peer check is due, a sleep of 1 us doubling
   up to 1 ms; checks: the reasons to stop waiting (the caller is inside the communicator). */
void wait_init(Wait *w);
int due(Wait *w);
void backoff(Wait *w);
ncclResult_t checks(ncclComm_t c, Wait *w, int peers);

/* A call inside the communicator (busy): enter fails with its sticky error, or when it is
   dead or its family aborted; leave ends it. */
ncclResult_t enter(ncclComm_t c);
void leave(ncclComm_t c);

/* All ranks of the communicator meet; fn: strict mode's name of the call (an index of fn_name:
   0 a collective, 1 ncclAllReduce, 2 ncclAllGather, 3 ncclReduceScatter, 4 ncclCommSplit). */
ncclResult_t barrier(ncclComm_t c, int fn);

/* Strict mode: publishes this rank's wait (see fake_nccl_wait.c), and looks for a deadlock. */
void blk_put(ncclComm_t c, int enter, int kind, int fn, int cpeer, uint64_t k, uint64_t tail);
ncclResult_t detect(ncclComm_t c, Det *d, int look);

#pragma GCC visibility pop

#endif
