/*
 * cpus.c - CPUs that device threads hold. A device's thread is pinned to a CPU of its own; the
 * library's helper threads (a loader's assembler) keep to the CPUs no device holds, where any
 * are left. Otherwise a helper woken on a device's CPU preempts the step there (it has slept, so
 * the scheduler runs it first) for as long as its job takes: a loader's batch then costs a small
 * model a tenth of its throughput (bench/RESULTS.md).
 */
#define _GNU_SOURCE
#include "internal.h"

#include <pthread.h>
#include <sched.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int held[CPU_SETSIZE]; /* device threads pinned to each CPU */
static uint64_t generation;   /* bumped whenever `held` changes */

void loom__cpu_hold(int cpu, bool hold) {
    if (cpu < 0 || cpu >= CPU_SETSIZE)
        return;
    pthread_mutex_lock(&mu);
    held[cpu] += hold ? 1 : -1;
    __atomic_store_n(&generation, generation + 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&mu);
}

/* The calling thread's own CPUs (its affinity when it first asked), and the generation of
 * `held` its affinity now follows. */
static _Thread_local struct {
    bool known;
    uint64_t seen;
    cpu_set_t own;
} self;

void loom__keep_off_held_cpus(void) {
    uint64_t g = __atomic_load_n(&generation, __ATOMIC_ACQUIRE);
    if (self.known && self.seen == g)
        return;
    if (!self.known) {
        if (g == 0 || pthread_getaffinity_np(pthread_self(), sizeof self.own, &self.own) != 0)
            return; /* nothing held yet (or unknowable): stay as is */
        self.known = true;
    }
    cpu_set_t want = self.own;
    pthread_mutex_lock(&mu);
    self.seen = generation;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (held[c] > 0)
            CPU_CLR(c, &want);
    pthread_mutex_unlock(&mu);
    if (CPU_COUNT(&want) == 0) /* every CPU of ours held: share them, as before */
        want = self.own;
    pthread_setaffinity_np(pthread_self(), sizeof want, &want); /* best effort */
}

void loom__cpus_follow_holds(void) {
    if (self.known) /* a thread this file never moved is left as it is */
        loom__keep_off_held_cpus();
}
