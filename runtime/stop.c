/* runtime/stop.c — the first SIGINT / SIGTERM asks the loop to stop; a second exits (stop.h). */
#include "runtime/stop.h"

#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

/* the first signal, 0 while none; exchanged atomically (lock-free atomics are async-signal-
   safe), so that two signals handled at once on two threads are still a first and a second */
static _Atomic int got;
static struct sigaction saved[2];
static int armed;
static volatile sig_atomic_t announce;
static const int SIGS[2] = {SIGINT, SIGTERM};

static void on_stop(int sig) {
  if (atomic_exchange(&got, sig)) _exit(128 + sig);   /* the second: no more waiting (async-signal-safe) */
  /* said at once: a step can take minutes, and a user who sees nothing presses Ctrl-C again,
     which ends the run without its checkpoint */
  if (announce) {
    static const char msg_int[] = "\nSIGINT: stopping after the step in flight (Ctrl-C again: stop at once, "
                                  "without a checkpoint)\n";
    static const char msg_term[] = "\nSIGTERM: stopping after the step in flight (a second signal: stop at "
                                   "once, without a checkpoint)\n";
    ssize_t n = sig == SIGINT ? write(2, msg_int, sizeof msg_int - 1) : write(2, msg_term, sizeof msg_term - 1);
    (void)n;
  }
}

void train_stop_arm(bool say) {
  if (armed) return;
  atomic_store(&got, 0);
  announce = say;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int i = 0; i < 2; i++) {
    sigaction(SIGS[i], NULL, &saved[i]);
    /* an ignored signal stays ignored (nohup, a launcher's choice) */
    if (!(saved[i].sa_flags & SA_SIGINFO) && saved[i].sa_handler == SIG_IGN) continue;
    sigaction(SIGS[i], &sa, NULL);
  }
  armed = 1;
}

void train_stop_disarm(void) {
  if (!armed) return;
  for (int i = 0; i < 2; i++) sigaction(SIGS[i], &saved[i], NULL);
  armed = 0;
}

int train_stop_signal(void) { return atomic_load(&got); }
