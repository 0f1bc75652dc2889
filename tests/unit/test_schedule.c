/* tests/unit/test_schedule.c — ir/schedule.h: the pipeline schedules against the
 * playbook's formulas and their own invariants.
 *
 * For every schedule, pp in {2, 4, 8}, grad_accum in {1, 2, 4, 8, 16} (where the schedule
 * accepts it):
 *   - every rank runs exactly the F, B (and W) of its chunks for every micro-batch, once;
 *   - the simulation with F = B = W = 1 finishes (no deadlock);
 *   - the bubble: (p-1)/m for afab and 1f1b, (p-1)/(v m) interleaved (v = 2, 4), and ZB-H1's
 *     (p-1)/(3m) at m >= p (below it no schedule can hide the fill: then it must at least
 *     beat 1f1b's);  dualpipev below 1f1b's;
 *   - memory: afab holds all m micro-batches on every rank, 1f1b at most p - r on rank r,
 *     zb-h1 at most p - r counting the ones waiting for W.
 * Refusals: interleaved with m not a multiple of p, --pp-virtual with 1f1b, dualpipev with
 * v != 2, one rank.  A list with two actions swapped so a rank waits for itself is reported
 * as a deadlock naming the rank; the trace file has one track per rank.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/schedule.h"

#include "tests/unit/check.h"

static double unit[256][3];

static void one(int kind, int p, int v, int m) {
  Schedule s;
  char err[1024];
  const char *nm = pipe_kind_names[kind];
  if (schedule_build(kind, p, v, m, &s, err, sizeof err)) {
    check(false, "%s p=%d v=%d m=%d: %s", nm, p, v, m, err);
    return;
  }
  /* Every action of every chunk of the rank, once. */
  int kinds = s.split_bw ? 3 : 2;
  for (int r = 0; r < p; r++) {
    int *seen = calloc((size_t)(s.chunks * m * 3), sizeof(int));
    bool own = true;
    for (int i = 0; i < s.n[r]; i++) {
      const Action *a = &s.acts[r][i];
      own &= schedule_chunk_rank(kind, p, v, a->chunk) == r;
      seen[(a->mb * s.chunks + a->chunk) * 3 + a->kind]++;
    }
    bool once = s.n[r] == v * m * kinds;
    for (int c = 0; c < s.chunks; c++)
      if (schedule_chunk_rank(kind, p, v, c) == r)
        for (int mb = 0; mb < m; mb++)
          for (int k = 0; k < kinds; k++) once &= seen[(mb * s.chunks + c) * 3 + k] == 1;
    check(own && once, "%s p=%d v=%d m=%d rank %d: every action of its chunks once (%d actions)", nm, p, v, m, r, s.n[r]);
    free(seen);
  }
  SimResult sim;
  if (schedule_simulate(&s, (const double (*)[3])unit, &sim, err, sizeof err)) {
    check(false, "%s p=%d v=%d m=%d: %s", nm, p, v, m, err);
    schedule_free(&s);
    return;
  }
  double f = schedule_bubble_formula(kind, p, v, m), b1 = schedule_bubble_formula(PIPE_1F1B, p, 1, m);
  if (kind == PIPE_ZBH1 && m < p)
    check(sim.bubble < b1 - 1e-9, "zb-h1 p=%d m=%d: bubble %.4f below 1f1b's %.4f", p, m, sim.bubble, b1);
  else if (f >= 0)
    check(fabs(sim.bubble - f) < 1e-9, "%s p=%d v=%d m=%d: bubble %.6f, formula %.6f", nm, p, v, m, sim.bubble, f);
  else
    check(sim.bubble < b1, "%s p=%d m=%d: bubble %.4f below 1f1b's %.4f", nm, p, m, sim.bubble, b1);
  for (int r = 0; r < p; r++) {
    int held = sim.peak_f[r] + (s.split_bw ? 0 : 0), cap = p - r < m ? p - r : m;
    if (kind == PIPE_AFAB) check(held == m, "afab p=%d m=%d rank %d holds %d (want %d)", p, m, r, held, m);
    if (kind == PIPE_1F1B) check(held == cap, "1f1b p=%d m=%d rank %d holds %d (want %d)", p, m, r, held, cap);
  }
  sim_result_free(&sim, p);
  schedule_free(&s);
}

static void refused(int kind, int p, int v, int m, const char *needle) {
  Schedule s;
  char err[1024] = "";
  int rc = schedule_build(kind, p, v, m, &s, err, sizeof err);
  check(rc == IR_EINPUT && strstr(err, needle), "%s p=%d v=%d m=%d refused with '%s': got rc %d '%s'",
        pipe_kind_names[kind], p, v, m, needle, rc, err);
  if (!rc) schedule_free(&s);
}

int main(void) {
  for (int c = 0; c < 256; c++) unit[c][0] = unit[c][1] = unit[c][2] = 1;
  int ps[] = {2, 4, 8}, ms[] = {1, 2, 4, 8, 16};
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 5; j++) {
      int p = ps[i], m = ms[j];
      one(PIPE_AFAB, p, 1, m);
      one(PIPE_1F1B, p, 1, m);
      one(PIPE_ZBH1, p, 1, m);
      one(PIPE_DUALPIPEV, p, 2, m);
      if (m % p == 0) {
        one(PIPE_INTERLEAVED, p, 2, m);
        one(PIPE_INTERLEAVED, p, 4, m);
      }
    }
  /* zb-h1's memory bound: p - r held counting those waiting for W. */
  {
    Schedule s;
    char err[512];
    SimResult sim;
    if (!schedule_build(PIPE_ZBH1, 4, 1, 8, &s, err, sizeof err) &&
        !schedule_simulate(&s, (const double (*)[3])unit, &sim, err, sizeof err)) {
      for (int r = 0; r < 4; r++)
        check(sim.peak_f[r] <= 4 - r, "zb-h1 p=4 m=8 rank %d holds %d forwards (at most %d)", r, sim.peak_f[r], 4 - r);
      sim_result_free(&sim, 4);
      schedule_free(&s);
    }
  }
  refused(PIPE_INTERLEAVED, 4, 2, 6, "multiple of 4");
  refused(PIPE_INTERLEAVED, 2, 1, 4, "--pp-virtual 2");
  refused(PIPE_1F1B, 2, 2, 4, "--pp-virtual 2 needs the interleaved");
  refused(PIPE_DUALPIPEV, 2, 3, 4, "exactly 2 chunks");
  refused(PIPE_AFAB, 1, 1, 4, "2 to 64 pp ranks");
  /* A broken list: rank 1's first two actions swapped so it runs B0 before F0 arrives. */
  {
    Schedule s;
    char err[1024] = "";
    SimResult sim;
    schedule_build(PIPE_1F1B, 2, 1, 2, &s, err, sizeof err);
    Action t = s.acts[1][0];
    s.acts[1][0] = s.acts[1][1];
    s.acts[1][1] = t;
    int rc = schedule_simulate(&s, (const double (*)[3])unit, &sim, err, sizeof err);
    check(rc == IR_EINPUT && strstr(err, "deadlock") && strstr(err, "pp rank 1"), "swapped 1f1b list: deadlock on rank 1: '%s'", err);
    schedule_free(&s);
  }
  /* The trace: one thread-name record and one complete event per action. */
  {
    Schedule s;
    char err[512];
    SimResult sim;
    schedule_build(PIPE_1F1B, 4, 1, 4, &s, err, sizeof err);
    schedule_simulate(&s, (const double (*)[3])unit, &sim, err, sizeof err);
    const char *path = "/tmp/loom_test_schedule_trace.json";
    int rc = schedule_write_trace(path, &s, sim.start, sim.end, "test", err, sizeof err);
    FILE *f = fopen(path, "r");
    int names = 0, events = 0;
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
      names += strstr(line, "\"thread_name\"") != NULL;
      events += strstr(line, "\"ph\":\"X\"") != NULL;
    }
    if (f) fclose(f);
    check(!rc && names == 4 && events == 4 * 8, "trace: %d tracks (4), %d events (32)", names, events);
    remove(path);
    sim_result_free(&sim, 4);
    schedule_free(&s);
  }
  printf("test_schedule: %d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
