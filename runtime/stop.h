/* runtime/stop.h — stopping a training run cleanly on SIGINT or SIGTERM.
 *
 * While armed, the first SIGINT or SIGTERM only records itself: the training loop finishes
 * the step in flight, writes a checkpoint when it has a save dir, prints its summary and
 * returns 128 + the signal (runtime/trainer.c).  A second one ends the process at once
 * (_exit(128 + signal)).  Outside train_run the previous dispositions hold (by default:
 * the signal ends the process, nothing being there to save).
 *
 * The handler only stores an atomic and write()s a fixed line, so it is safe whichever thread
 * the kernel picks; SA_RESTART keeps the other threads' blocking calls going.
 */
#ifndef LOOM_RUNTIME_STOP_H
#define LOOM_RUNTIME_STOP_H

#include <stdbool.h>

/* installs the handlers (and forgets an earlier stop); say: the first signal prints at once on
   stderr that the run stops after the step in flight (the rank that prints, not -q) */
void train_stop_arm(bool say);
void train_stop_disarm(void);   /* puts the previous handlers back */
int train_stop_signal(void);    /* 0, or the first SIGINT / SIGTERM received while armed */

#endif
