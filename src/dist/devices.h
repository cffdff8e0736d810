/*
 * dist/devices.h - the devices of a process (devices.c) as share.c sees them too: each device's
 * thread, replicas and bindings, and the controller's state. Never installed.
 */
#ifndef LOOM_DIST_DEVICES_H
#define LOOM_DIST_DEVICES_H

#include "../compile/internal.h"
#include "internal.h"

#include <pthread.h>

typedef struct loom__device device;

struct loom__device {
    loom_devices *owner;
    int index, cpu;
    pthread_t thread;
    bool started, holds_cpu; /* holds_cpu: its thread is pinned to cpu (core/cpus.c) */
    loom_comm *comm;
    void *ws;
    size_t ws_size;
    float *slab[LOOM_SLAB_COUNT]; /* replicas (PARAM and STATE only where a program needs
                                   * them); device 0 uses the model's slabs */
    int64_t slab_cap[LOOM_SLAB_COUNT];
    loom__bind bind;
    loom__team *team; /* its cores (loom_devices_config.cores), or NULL for one */
    loom_status st;
    char msg[512];
    bool done;         /* finished the current job (under the owner's mutex) */
    double busy, coll; /* this run: seconds in all, seconds in collectives */
    double busy_total, coll_total;
    int64_t coll_bytes; /* cumulative */
};

/* Whether the devices share the parameters and optimizer state or each update a replica gives
 * the same bits; which is faster depends on the model: a small one's replicas stay in each
 * core's cache, where shared ones cross between the cores every step, and a large optimizer
 * state's update costs twice on replicas (bench/RESULTS.md has both measured). Under
 * LOOM_SHARE_AUTO each program that allows sharing runs its first
 * 2 x SHARE_STEPS steps both ways (SHARE_WARM of each untimed) and keeps the faster by the
 * median of the rest; a few programs are remembered by hash. */
#define SHARE_STEPS  8
#define SHARE_LARGE  (256.0 * 1048576) /* bytes of parameters and state: shared at once */
#define SHARE_WARM   2
#define SHARE_TRIALS 4
typedef struct {
    uint64_t hash; /* 0: unused */
    int steps;     /* of the trial so far */
    int mode;      /* -1: trying; else 1 shared, 0 replicas */
    double t[2][SHARE_STEPS - SHARE_WARM];
    int64_t used; /* the step it was last used at (the least recently used slot is reused) */
} share_trial;

typedef enum { JOB_STEP, JOB_REPLICATE } job_kind;

struct loom_devices {
    loom_devices_config c;
    int n;
    loom_group *group;
    device *dev;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen, ndone; /* written under mu, also read without it (spinning) */
    double started_at;   /* when the current job started (its deadline counts from there) */
    bool quit, broken;
    job_kind job;
    loom__program *prog;
    loom_model *model;
    int64_t step;
    const loom_model *synced_model;
    uint64_t synced_version;
    int fault_dev;
    int64_t fault_step;
    bool fault_hang;
    loom__runner runner;
    loom_graph *inflight; /* the graph whose step the devices are running (submitted), or NULL */
    loom_graph *holder;   /* the graph whose last step's results the devices' memory holds */
    /* the processes these devices span (an MPI job; NULL: this process alone): this one's rank
     * prank of nproc, each with n devices, world in all */
    loom_group *procs;
    loom_comm *pcomm;
    int prank, nproc, world;
    /* the same processes for the host's own collectives (the loss, gathered outputs, agreeing to
     * stop): a communicator of their own, never the one device 0 may be using meanwhile */
    loom_group *hprocs;
    loom_comm *hcomm;
    /* device 0's gradients where the processes' all-reduce reads them in place (lend_grads),
     * and the model that lent them */
    float *grads;
    size_t grads_bytes;
    size_t unshared_bytes; /* a size the group had no shared memory for (not asked again) */
    loom_model *lent;
    loom__arena arena; /* that step's input bindings: its graph may be reset meanwhile */
    bool share;        /* the current job's: PARAM and STATE are the model's on every device */
    bool behind; /* devices 1..'s replicas of PARAM and STATE do not hold the model's values */
    bool across; /* the current replication's: from process 0 (the model changed), or local */
    /* which device runs each entry of the program of hash owner_hash (loom__owners), and how many
     * entries are so run: made once a program */
    int32_t *owner;
    int64_t owner_cap, owner_n;
    uint64_t owner_hash;
    share_trial trials[SHARE_TRIALS];
    share_trial *trying; /* the submitted step's trial, to be timed at its end; or NULL */
    int trying_mode;
    bool spare_cpu; /* fewer devices than CPUs: the controller may spin while a step runs */
};

/* share.c: whether program p (which allows it) runs on the shared slabs, and the end of a step
 * that was its program's trial (D->trying): its time recorded, the faster way kept once both
 * have their steps. */
bool loom__share_choose(loom_devices *D, const loom__program *p, const loom_model *m);
void loom__share_timed(loom_devices *D);

#endif
