/* clock — monotonic and wall-clock time in the units the rest of exo uses. */
#ifndef EXO_BASE_CLOCK_H
#define EXO_BASE_CLOCK_H

#include <stdint.h>

/* Monotonic nanoseconds: for durations and timeouts. */
uint64_t clock_now_ns(void);
/* Seconds since the Unix epoch: for timestamps shown to users (`created`). */
int64_t clock_unix_seconds(void);
/* Milliseconds since the Unix epoch. */
int64_t clock_unix_ms(void);
void clock_sleep_ms(unsigned ms);

#endif
