/* sync — the pthread patterns exo's background threads share: a condition variable whose timed
 * waits run on the monotonic clock (a wall-clock jump neither cuts a wait short nor stretches it),
 * and the handshake that tells a thread sleeping on one to finish. Knows nothing of what the
 * threads do; starting and joining them stays with their owner. */
#ifndef EXO_BASE_SYNC_H
#define EXO_BASE_SYNC_H

#include <pthread.h>

/* Initialises cond so that sync_cond_wait_ms measures its timeout on CLOCK_MONOTONIC.
 * Returns 0 or the pthread error. */
int sync_cond_init_monotonic(pthread_cond_t *cond);

/* With lock held, waits on cond (made by sync_cond_init_monotonic) until it is signalled or ms
 * milliseconds pass. Returns 0 when woken (which may be spurious: callers re-check their
 * condition), ETIMEDOUT when the time ran out. */
int sync_cond_wait_ms(pthread_cond_t *cond, pthread_mutex_t *lock, unsigned ms);

/* Sets *flag to 1 under lock and wakes every waiter on cond: how a thread looping on
 * `while (!flag)` is told to finish. The caller then joins it. */
void sync_set_flag_and_wake(pthread_mutex_t *lock, pthread_cond_t *cond, int *flag);

#endif
