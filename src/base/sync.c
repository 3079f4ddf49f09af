#include "base/sync.h"

#include <time.h>

int sync_cond_init_monotonic(pthread_cond_t *cond) {
    pthread_condattr_t attr;
    int rc = pthread_condattr_init(&attr);
    if (rc) return rc;
    rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (!rc) rc = pthread_cond_init(cond, &attr);
    pthread_condattr_destroy(&attr);
    return rc;
}

int sync_cond_wait_ms(pthread_cond_t *cond, pthread_mutex_t *lock, unsigned ms) {
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    long long ns = deadline.tv_nsec + (long long)ms * 1000000LL;
    deadline.tv_sec += (time_t)(ns / 1000000000LL);
    deadline.tv_nsec = (long)(ns % 1000000000LL);
    return pthread_cond_timedwait(cond, lock, &deadline);
}

void sync_set_flag_and_wake(pthread_mutex_t *lock, pthread_cond_t *cond, int *flag) {
    pthread_mutex_lock(lock);
    *flag = 1;
    pthread_cond_broadcast(cond);
    pthread_mutex_unlock(lock);
}
