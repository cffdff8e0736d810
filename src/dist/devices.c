/*
 * devices.c - data parallelism inside one process. Each device is a worker thread pinned to a
 * core, with its own gradients (device 0 uses the model's slab), its own workspace and its own
 * rank in a local process group. A graph set to run on the devices is planned once by the
 * controller (the caller's thread); every device then runs the same program on its shard of the
 * batch, and the program's SYNC nodes average the gradients.
 *
 * The parameters and the optimizer's state are the model's own slabs, shared by every device,
 * wherever the program allows it (loom__plan_owners: its updates come after a collective, write
 * only those slabs and read them only where they write): each update is then run by one device
 * for all (loom__owners balances them), so that two devices do half the update's memory
 * traffic each instead of all of it twice, and the state is held once. A program that does not
 * allow it runs on replicas of those slabs, made (broadcast and verified) when it comes.
 *
 * Failure: a device whose step fails aborts the group, which wakes every device waiting in a
 * collective; the controller waits at most the deadline (then names the devices still running),
 * returns the first real cause as "device D, step S: reason", and refuses further steps.
 */
#define _GNU_SOURCE
#include "devices.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* With a CPU to spare (fewer devices than CPUs), spin-then-sleep: a device polls for its next
 * step, and the controller (yielding) for the step's end, this long before sleeping on the
 * condition variable. A wake-up through the scheduler costs tens of microseconds on this virtual
 * machine, and an idle CPU slows the next step: 5-10% of a small model's step (bench/RESULTS.md).
 */
#define SPIN_NEXT_S 0.0005
#define SPIN_DONE_S 0.002

/* Polls until *word differs from `from`, at most `seconds`. */
static void spin_until(const uint64_t *word, uint64_t from, double seconds) {
    double end = loom__now() + seconds;
    for (int i = 1; __atomic_load_n(word, __ATOMIC_ACQUIRE) == from; i++) {
        if (i % 64 == 0 && loom__now() > end)
            return;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
}

/* A step's all-reduce. Across processes it is hierarchical: the local devices sum in shared
 * memory, device 0 of each process sums those sums across the processes (in process order) and
 * divides by every device of every process for a mean, and its result is broadcast locally; with
 * one device per process the additions are those of one process's devices, in the same order. */
static loom_status dev_allreduce(void *ctx, float *buf, int64_t n, loom_reduce_op op) {
    device *d = ctx;
    loom_devices *D = d->owner;
    double t0 = loom__now();
    loom_status s;
    if (D->nproc == 1) {
        s = loom_comm_allreduce(d->comm, buf, n, op);
    } else if (D->n == 1) { /* the processes are the devices: a mean over them is the mean */
        s = loom_comm_allreduce(D->pcomm, buf, n, op);
    } else {
        s = loom_comm_allreduce(d->comm, buf, n, LOOM_REDUCE_SUM);
        if (!s && d->index == 0)
            s = loom_comm_allreduce(D->pcomm, buf, n, LOOM_REDUCE_SUM);
        for (int64_t i = 0; !s && d->index == 0 && op == LOOM_REDUCE_MEAN && i < n; i++)
            buf[i] /= (float)D->world;
        if (!s && D->n > 1)
            s = loom_comm_broadcast(d->comm, buf, n, 0);
    }
    d->coll += loom__now() - t0;
    d->coll_bytes += n * (int64_t)sizeof(float);
    return s;
}

static float *slab_of(loom_devices *D, device *d, int s) {
    if (d->index == 0 && s == LOOM_SLAB_GRAD && D->lent && D->lent == D->model)
        return D->grads;
    return d->index == 0 || (D->share && s != LOOM_SLAB_GRAD) ? D->model->slab[s] : d->slab[s];
}

/* Device 0's gradients across processes. Where the processes' group has memory that the others
 * map (an MPI job on one machine), its all-reduce reads every process's gradients in place, so
 * device 0 keeps them there rather than in the model's slab: the model lends them
 * (loom_model.away), the host's next look at the model copies them back, and the next step after
 * it copies them in again. Elsewhere device 0 uses the model's own. */
static void loan_ended(void *lender, loom_model *m) {
    (void)m;
    ((loom_devices *)lender)->lent = NULL;
}

static void return_grads(loom_devices *D) {
    loom_model *m = D->lent;
    if (!m)
        return;
    loom__model_settle(m); /* the values come back */
    m->lender = NULL, m->lent_end = NULL;
    D->lent = NULL;
}

static void lend_grads(loom_devices *D, loom_model *m) {
    size_t need = sizeof(float) * (size_t)m->len[LOOM_SLAB_GRAD];
    if (D->nproc == 1 || need == 0)
        return;
    if (D->lent != m) {
        return_grads(D);
        if (m->lender) { /* other devices' loan ends */
            loom__model_settle(m);
            m->lent_end(m->lender, m);
            m->lender = NULL;
        }
    }
    if (need > D->grads_bytes && need != D->unshared_bytes) {
        return_grads(D);
        loom__group_unshare(D->procs, D->grads, D->grads_bytes);
        D->grads = loom__group_shared(D->procs, need);
        D->grads_bytes = D->grads ? need : 0;
        D->unshared_bytes = D->grads ? 0 : need; /* (across machines: every step would ask) */
    }
    if (!D->grads) /* (no memory to share: MPI copies them) */
        return;
    m->lender = D, m->lent_end = loan_ended, D->lent = m;
    if (!m->away[LOOM_SLAB_GRAD]) {
        memcpy(D->grads, m->slab[LOOM_SLAB_GRAD], need);
        m->away[LOOM_SLAB_GRAD] = D->grads;
    }
}

/* Compares checksum `mine` with every rank's of c: EINTERNAL naming the first that differs. */
static loom_status same_checksum(loom_comm *c, uint64_t mine, const char *unit) {
    int w = loom_comm_world(c);
    float packed[2], *all = loom__malloc(sizeof(float) * 2 * (size_t)w);
    if (!all)
        return LOOM_ENOMEM;
    memcpy(packed, &mine, sizeof mine);
    loom_status st = loom_comm_allgather(c, packed, 2, all);
    for (int r = 0; !st && r < w; r++) {
        uint64_t theirs;
        memcpy(&theirs, all + 2 * r, sizeof theirs);
        if (theirs != mine)
            st = loom__error(LOOM_EINTERNAL,
                             "replica checksum of %s %d (%016llx) differs from %s %d's (%016llx) "
                             "after the broadcast",
                             unit, r, (unsigned long long)theirs, unit, loom_comm_rank(c),
                             (unsigned long long)mine);
    }
    loom__free(all);
    return st;
}

/* Replication job: process 0's device 0's slabs (the model's) broadcast to device 0 of every
 * process, then to every device; then the checksums of every replica compared. Not the gradient
 * slab: each device's is its own (every step's backward writes it before anything reads it,
 * and between the micro-batches of an accumulated step it holds that device's sums). */
static loom_status replicate(loom_devices *D, device *d) {
    for (int s = 0; s < LOOM_SLAB_COUNT; s++) {
        if (s == LOOM_SLAB_GRAD)
            continue;
        int64_t len = D->model->len[s];
        loom_status st = D->across && D->nproc > 1 && d->index == 0
                             ? loom_comm_broadcast(D->pcomm, slab_of(D, d, s), len, 0)
                             : LOOM_OK;
        if (!st && !(D->share && s != LOOM_SLAB_GRAD)) /* (shared: the same memory) */
            st = loom_comm_broadcast(d->comm, slab_of(D, d, s), len, 0);
        if (st)
            return st;
    }
    if (D->world == 1) /* nothing to compare with */
        return LOOM_OK;
    loom__hash h;
    loom__hash_init(&h);
    for (int s = 0; s < LOOM_SLAB_COUNT; s++)
        if (s != LOOM_SLAB_GRAD)
            loom__hash_large(&h, slab_of(D, d, s), sizeof(float) * (size_t)D->model->len[s]);
    uint64_t mine = loom__hash_final(&h);
    loom_status st = D->n > 1 ? same_checksum(d->comm, mine, "device") : LOOM_OK;
    if (!st && D->across && D->nproc > 1 && d->index == 0)
        st = same_checksum(D->pcomm, mine, "process");
    return st;
}

static void run_job(loom_devices *D, device *d) {
    double t0 = loom__now();
    int gd = D->prank * D->n + d->index; /* among every process's devices */
    d->coll = 0;
    loom_status st;
    if (D->job == JOB_REPLICATE)
        st = replicate(D, d);
    else if (gd == D->fault_dev && D->step == D->fault_step && !D->fault_hang)
        st = loom__error(LOOM_EINTERNAL, "fault injected by LOOM_FAULT=%d:%lld", D->fault_dev,
                         (long long)D->fault_step);
    else if (gd == D->fault_dev && D->step == D->fault_step) {
        double hang = 2 * D->c.timeout_s + 2.0; /* past the controller's deadline and grace */
        struct timespec ts = {(time_t)hang, (long)(fmod(hang, 1.0) * 1e9)};
        nanosleep(&ts, NULL); /* a device that stops answering, then comes back */
        pthread_mutex_lock(&D->mu);
        bool gone = D->broken; /* given up on: its program may be freed by now */
        pthread_mutex_unlock(&D->mu);
        st = gone
                 ? loom__error(LOOM_EABORTED, "device %d came back after its step was given up", gd)
                 : D->prog->x->run(D->prog->x, D->prog, &d->bind);
    } else
        st = D->prog->x->run(D->prog->x, D->prog, &d->bind);
    d->st = st;
    if (st) {
        snprintf(d->msg, sizeof d->msg, "%s", loom_last_error());
        if (st != LOOM_EABORTED && st != LOOM_ETIMEDOUT) {
            char why[640];
            snprintf(why, sizeof why, "device %d, step %lld: %s", gd, (long long)D->step, d->msg);
            loom_comm_abort(d->comm, why);
        }
    }
    d->busy = loom__now() - t0;
    d->busy_total += d->busy;
    d->coll_total += d->coll;
}

static void *worker(void *arg) {
    device *d = arg;
    loom_devices *D = d->owner;
    loom__blas_init();
    uint64_t seen = 0;
    for (;;) {
        if (D->spare_cpu) /* never spin on a CPU the controller may need */
            spin_until(&D->gen, seen, SPIN_NEXT_S);
        pthread_mutex_lock(&D->mu);
        while (D->gen == seen && !D->quit)
            pthread_cond_wait(&D->go, &D->mu);
        if (D->quit) {
            pthread_mutex_unlock(&D->mu);
            return NULL;
        }
        seen = D->gen;
        pthread_mutex_unlock(&D->mu);
        run_job(D, d);
        pthread_mutex_lock(&D->mu);
        d->done = true;
        __atomic_store_n(&D->ndone, D->ndone + 1, __ATOMIC_RELEASE);
        pthread_cond_signal(&D->done);
        pthread_mutex_unlock(&D->mu);
    }
}

/* Waits for all devices until `seconds` pass; true if all finished. Called with D->mu held. */
static bool wait_done(loom_devices *D, double seconds) {
    struct timespec dl;
    loom__deadline_in(&dl, seconds);
    int rc = 0;
    while (D->ndone < (uint64_t)D->n && rc == 0)
        rc = pthread_cond_timedwait(&D->done, &D->mu, &dl); /* (any error ends the wait) */
    return D->ndone == (uint64_t)D->n;
}

/* The first real cause among the statuses of the devices that finished (all of them, after a
 * normal end), as the controller's error. */
static loom_status collect(loom_devices *D) {
    int cause = -1;
    for (int i = 0; i < D->n && cause < 0; i++)
        if (D->dev[i].done && D->dev[i].st && D->dev[i].st != LOOM_EABORTED &&
            D->dev[i].st != LOOM_ETIMEDOUT)
            cause = i;
    for (int i = 0; i < D->n && cause < 0; i++) /* then a collective's watchdog */
        if (D->dev[i].done && D->dev[i].st == LOOM_ETIMEDOUT)
            cause = i;
    for (int i = 0; i < D->n && cause < 0; i++)
        if (D->dev[i].done && D->dev[i].st)
            cause = i;
    if (cause < 0)
        return LOOM_OK;
    D->broken = true;
    device *d = &D->dev[cause];
    if (d->st == LOOM_EABORTED || d->st == LOOM_ETIMEDOUT)
        return loom__error(d->st, "%s", d->msg);
    return loom__error(d->st, "device %d, step %lld: %s", D->prank * D->n + cause,
                       (long long)D->step, d->msg);
}

/* Starts the current job on every device. */
static void start(loom_devices *D) {
    /* The thread that runs steps (it polls below) keeps to the CPUs no device holds, as the
     * loader's does, until the devices are freed. Left free, a wake-up from the condition
     * variable placed it on the device's CPU now and then (the waker's), where it waited out the
     * device's poll for its next step: 0.5 ms lost in a few percent of a small model's steps. */
    if (D->spare_cpu)
        loom__keep_off_held_cpus();
    pthread_mutex_lock(&D->mu);
    __atomic_store_n(&D->ndone, 0, __ATOMIC_RELEASE);
    for (int i = 0; i < D->n; i++)
        D->dev[i].done = false;
    D->started_at = loom__now();
    __atomic_store_n(&D->gen, D->gen + 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&D->go);
    pthread_mutex_unlock(&D->mu);
}

/* After the deadline the group is aborted and the devices get this long to come back from their
 * collectives before the step is reported as timed out (one stuck outside any is not waited for).
 */
#define GRACE_S 0.2

/* Waits for the job started, until its deadline: timeout_s after it started. */
static loom_status finish(loom_devices *D) {
    pthread_mutex_lock(&D->mu);
    if (D->spare_cpu) { /* the step may well end soon: poll a while, yielding the CPU to others */
        pthread_mutex_unlock(&D->mu);
        double end = loom__now() + SPIN_DONE_S;
        while (__atomic_load_n(&D->ndone, __ATOMIC_ACQUIRE) < (uint64_t)D->n && loom__now() < end)
            sched_yield();
        pthread_mutex_lock(&D->mu);
    }
    bool ok = wait_done(D, D->started_at + D->c.timeout_s - loom__now());
    if (!ok) { /* someone is stuck: fail the group, give those in collectives a moment */
        char msg[512];
        size_t k = (size_t)snprintf(msg, sizeof msg,
                                    "watchdog: step %lld did not finish within "
                                    "%.1f s; still running:",
                                    (long long)D->step, D->c.timeout_s);
        uint64_t lo = UINT64_MAX, hi = 0;
        for (int i = 0; i < D->n && k < sizeof msg; i++) {
            uint64_t seq = loom_comm_seq(D->dev[i].comm);
            lo = seq < lo ? seq : lo, hi = seq > hi ? seq : hi;
            if (!D->dev[i].done)
                k += (size_t)snprintf(msg + k, sizeof msg - k, " device %d (collective #%llu)",
                                      D->prank * D->n + i, (unsigned long long)seq);
        }
        if (lo < hi && k < sizeof msg) { /* the others wait in a collective these never reached */
            k += (size_t)snprintf(msg + k, sizeof msg - k, "; device(s)");
            for (int i = 0; i < D->n && k < sizeof msg; i++)
                if (loom_comm_seq(D->dev[i].comm) == lo)
                    k += (size_t)snprintf(msg + k, sizeof msg - k, " %d", D->prank * D->n + i);
            if (k < sizeof msg)
                snprintf(msg + k, sizeof msg - k, " did not reach collective #%llu",
                         (unsigned long long)lo + 1);
        }
        loom_comm_abort(D->dev[0].comm, msg);
        wait_done(D, GRACE_S);
        D->broken = true;
        loom_status st = collect(D); /* a finished device's own cause, or a collective's watchdog */
        pthread_mutex_unlock(&D->mu);
        return st && st != LOOM_EABORTED ? st : loom__error(LOOM_ETIMEDOUT, "%s", msg);
    }
    loom_status st = collect(D);
    pthread_mutex_unlock(&D->mu);
    return st;
}

/* finish(), and across processes a failure ends the job: the others would wait for this one. */
static loom_status finish_all(loom_devices *D) {
    loom_status st = finish(D);
    if (st && D->nproc > 1) {
        char why[1024];
        snprintf(why, sizeof why, "%s", loom_last_error());
        loom_comm_abort(D->pcomm, why); /* (does not return under MPI) */
    }
    return st;
}

/* Runs the current job on every device and waits, within the deadline. */
static loom_status dispatch(loom_devices *D) {
    start(D);
    return finish_all(D);
}

/* Replicas follow the model: same sizes, same values (broadcast and verified); where the
 * devices share the model's slabs (D->share) only the gradients' (the rest is the model's own). */
static loom_status ensure_replicas(loom_devices *D, loom_model *m) {
    bool share = D->share;
    lend_grads(D, m);
    bool same = D->synced_model == m && D->synced_version == m->version;
    if (same && (share || !D->behind))
        return LOOM_OK;
    /* the model changed: from process 0, checked across the processes; else (the replicas behind
     * the model's own slabs after shared steps) only here, as the processes need not agree on it */
    D->across = !same;
    for (int i = 1; i < D->n; i++)
        for (int s = 0; s < LOOM_SLAB_COUNT; s++) {
            int64_t had = D->dev[i].slab_cap[s];
            if ((!share || s == LOOM_SLAB_GRAD) &&
                loom__grow((void **)&D->dev[i].slab[s], &D->dev[i].slab_cap[s], m->len[s] + 1,
                           sizeof(float)))
                return loom__error(LOOM_ENOMEM,
                                   "device %d, step %lld: out of memory for its "
                                   "replica of the model (%lld floats)",
                                   i, (long long)D->step, (long long)m->len[s]);
            if (s == LOOM_SLAB_GRAD && D->dev[i].slab_cap[s] != had) /* (not replicated) */
                memset(D->dev[i].slab[s], 0, sizeof(float) * (size_t)D->dev[i].slab_cap[s]);
        }
    D->model = m;
    D->job = JOB_REPLICATE;
    loom_status st = dispatch(D);
    if (!st) {
        D->synced_model = m;
        D->synced_version = m->version;
        D->behind = share;
    }
    return st;
}

static loom_status prepare(loom_devices *D, loom_graph *g, loom__program *p) {
    loom__arena_reset(&D->arena); /* no step is running: the last one's bindings are done with */
    const void **src = loom__arena_alloc(&D->arena, sizeof(void *) * (size_t)(g->ninputs + 1));
    if (!src)
        return LOOM_ENOMEM;
    /* the step runs on after submit returns: it reads copies of the inputs (all but borrowed
     * ones), taken now, so that the host may change its buffers at once */
    loom_status st = loom__input_sources(g, &D->arena, true, src);
    if (st)
        return st;
    for (int i = 0; i < D->n; i++) {
        device *d = &D->dev[i];
        if (loom__scratch(&d->ws, &d->ws_size, p->ws_bytes))
            return loom__error(LOOM_ENOMEM,
                               "device %d, step %lld: out of memory for its workspace (%zu bytes)",
                               i, (long long)D->step, p->ws_bytes);
        const void **in = loom__arena_alloc(&D->arena, sizeof(void *) * (size_t)(g->ninputs + 1));
        if (!in)
            return LOOM_ENOMEM;
        if ((st = loom__bind_inputs(g, &D->arena, D->prank * D->n + i, D->world, src, in)))
            return st;
        d->bind = (loom__bind){.ws = d->ws,
                               .inputs = in,
                               .allreduce = dev_allreduce,
                               .comm = d,
                               .owner = D->share && p->own ? D->owner : NULL,
                               .device = i,
                               .team = d->team};
        for (int s = 0; s < LOOM_SLAB_COUNT; s++)
            d->bind.slab[s] = g->model ? slab_of(D, d, s) : NULL;
    }
    return LOOM_OK;
}

static void add_metrics(loom_devices *D, loom_graph *g) {
    loom_metrics *m = &g->metrics;
    double lo = 0, hi = 0, coll = 0;
    int64_t bytes = 0;
    for (int i = 0; i < D->n; i++) {
        double compute = D->dev[i].busy_total - D->dev[i].coll_total;
        lo = i == 0 || compute < lo ? compute : lo;
        hi = compute > hi ? compute : hi;
        coll += D->dev[i].coll_total;
        bytes += D->dev[i].coll_bytes;
    }
    m->devices = D->n;
    m->shared_updates = D->share && D->prog->own ? D->owner_n : 0;
    m->allreduce_bytes = bytes;
    m->collective_seconds = coll / D->n;
    m->device_compute_min = lo;
    m->device_compute_max = hi;
    m->exec_seconds += D->dev[0].busy;
}

/* Starts g's step (program p) on the devices and returns: devices_wait() ends it. A step of
 * another graph still running is waited for first (its graph keeps its status). */
static loom_status devices_submit(void *ctx, loom_graph *g, loom__program *p) {
    loom_devices *D = ctx;
    if (D->inflight)
        loom__graph_finish(D->inflight);
    if (D->holder && D->holder != g) /* its outputs stay readable: off the devices they go */
        loom__graph_keep(D->holder);
    D->holder = g;
    if (D->broken)
        return loom__error(LOOM_EABORTED, "these devices failed in an earlier step; create new "
                                          "devices to continue");
    D->step++;
    D->share = D->n > 1 && p->share && loom__share_choose(D, p, g->model);
    loom_status st = g->model ? ensure_replicas(D, g->model) : LOOM_OK;
    D->behind = D->behind || (D->share && p->own); /* (its updates go to the model's alone) */
    if (!st && D->share && p->own && D->owner_hash != p->hash) { /* who runs which update */
        D->owner_hash = 0;
        if (loom__grow((void **)&D->owner, &D->owner_cap, p->nexec + 1, sizeof(int32_t)) ||
            (D->owner_n = loom__owners(p, D->n, D->owner)) < 0)
            st = LOOM_ENOMEM;
        else
            D->owner_hash = p->hash;
    }
    if (!st)
        st = prepare(D, g, p);
    if (st)
        return st;
    D->prog = p;
    D->job = JOB_STEP;
    start(D);
    D->inflight = g;
    return LOOM_OK;
}

static loom_status devices_wait(void *ctx, loom_graph *g) {
    loom_devices *D = ctx;
    if (D->inflight != g)
        return LOOM_OK;
    loom_status st = finish_all(D);
    D->inflight = NULL;
    add_metrics(D, g);
    if (!st && D->trying)
        loom__share_timed(D);
    D->trying = NULL;
    return st;
}

static const void *devices_data(void *ctx, const loom__program *p, int32_t id, int d) {
    loom_devices *D = ctx;
    return p ? loom__addr(p, &D->dev[d].bind, id) : NULL;
}

static loom_status devices_allgather(void *ctx, const void *mine, size_t bytes, void *all) {
    loom_devices *D = ctx;
    if (D->nproc == 1) {
        memcpy(all, mine, bytes);
        return LOOM_OK;
    }
    return loom_comm_allgather(D->hcomm, mine, (int64_t)(bytes / sizeof(float)), all);
}

static void devices_forget(void *ctx, const loom_graph *g) {
    loom_devices *D = ctx;
    if (D->holder == g)
        D->holder = NULL;
}

/* The CPUs this process may run on, in order; returns how many. */
static int available_cpus(int *cpus, int max) {
    cpu_set_t set;
    int n = 0;
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return 0;
    for (int c = 0; c < CPU_SETSIZE && n < max; c++)
        if (CPU_ISSET(c, &set))
            cpus[n++] = c;
    return n;
}

/* LOOM_FAULT=D:S or D:S:hang (unset or empty: none), D one of the world's devices, S >= 1;
 * EINVAL naming the variable and what it takes otherwise. */
static loom_status parse_fault(loom_devices *D) {
    D->fault_dev = -1;
    const char *f = getenv("LOOM_FAULT");
    if (!f || !*f)
        return LOOM_OK;
    int dev = -1, used = 0;
    long long step = 0;
    bool ok = sscanf(f, "%d:%lld%n", &dev, &step, &used) == 2 &&
              (!f[used] || !strcmp(f + used, ":hang")) && dev >= 0 && dev < D->world && step >= 1;
    if (!ok)
        return loom__error(LOOM_EINVAL,
                           "LOOM_FAULT='%.64s': expected D:S or D:S:hang, D a device from 0 to %d "
                           "and S a step >= 1 (or unset)",
                           f, D->world - 1);
    D->fault_dev = dev;
    D->fault_step = step;
    D->fault_hang = f[used] != 0;
    return LOOM_OK;
}

/* Starts device d's thread pinned to its CPU, which it then holds: the library's helper threads
 * keep off it (core/cpus.c). Non-zero if it could not (no CPU, or not allowed): start it unpinned.
 */
static int start_pinned(device *d) {
    if (d->cpu < 0)
        return -1;
    pthread_attr_t attr;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(d->cpu, &set);
    if (pthread_attr_init(&attr) != 0)
        return -1;
    int rc = pthread_attr_setaffinity_np(&attr, sizeof set, &set);
    rc = rc ? rc : pthread_create(&d->thread, &attr, worker, d);
    pthread_attr_destroy(&attr);
    if (rc == 0)
        loom__cpu_hold(d->cpu, true), d->holds_cpu = true;
    return rc;
}

/* The processes these devices span (loom_dist): an MPI job's, or this process alone; this one's
 * rank among them and among those on its machine (*node_rank of *node_size). */
static loom_status join_processes(loom_devices *D, int *node_rank, int *node_size) {
    D->prank = 0, D->nproc = 1, *node_rank = 0, *node_size = 1;
    loom_dist mode = D->c.dist;
    if (mode == LOOM_DIST_LOCAL ||
        (mode == LOOM_DIST_AUTO && (!loom_mpi_launcher() || !loom__mpi_version())))
        return LOOM_OK;
    if (!(D->procs = loom__group_mpi(D->c.timeout_s, true)) ||
        !(D->hprocs = loom__group_mpi(D->c.timeout_s, false)))
        return LOOM_EUNSUPPORTED; /* (its message is the reason) */
    D->pcomm = loom__mpi_self(D->procs);
    D->hcomm = loom__mpi_self(D->hprocs);
    D->prank = loom_comm_rank(D->pcomm), D->nproc = loom_comm_world(D->pcomm);
    loom__mpi_node(D->procs, node_rank, node_size);
    return LOOM_OK;
}

/* Every process must have as many devices (the batch's shards are counted on that). */
static loom_status same_counts(loom_devices *D) {
    D->world = D->nproc * D->n;
    if (D->nproc == 1)
        return LOOM_OK;
    float mine = (float)D->n, *all = loom__malloc(sizeof(float) * (size_t)D->nproc);
    loom_status st = all ? loom_comm_allgather(D->pcomm, &mine, 1, all) : LOOM_ENOMEM;
    for (int p = 0; !st && p < D->nproc; p++)
        if (all[p] != mine)
            st = loom__error(LOOM_EINVAL,
                             "loom_devices_new: process %d has %d devices, process %d has %d: "
                             "start every process with the same number (--devices)",
                             D->prank, D->n, p, (int)all[p]);
    loom__free(all);
    return st;
}

loom_devices *loom_devices_new(const loom_devices_config *c) {
    if (loom_env_check())
        return NULL;
    loom_devices_config cfg = c ? *c : (loom_devices_config){0};
    int cpus[1024], ncpu = available_cpus(cpus, 1024);
    cfg.timeout_s = cfg.timeout_s > 0 ? cfg.timeout_s : 60.0;
    if (!(cfg.timeout_s <= LOOM_MAX_TIMEOUT)) {
        loom__error(LOOM_EINVAL, "loom_devices_new: timeout %g s (expected at most %g)",
                    cfg.timeout_s, LOOM_MAX_TIMEOUT);
        return NULL;
    }
    if (cfg.count < 0 || cfg.count > 256 || cfg.bucket_bytes < 0) {
        loom__error(LOOM_EINVAL, "loom_devices_new: %d devices (expected 1 to 256)", cfg.count);
        return NULL;
    }
    if (cfg.cores < LOOM_CORES_AUTO || cfg.cores > 64) {
        loom__error(LOOM_EINVAL,
                    "loom_devices_new: %d cores a device (expected 1 to 64, or LOOM_CORES_AUTO)",
                    cfg.cores);
        return NULL;
    }
    loom_devices *D = loom__calloc(1, sizeof *D);
    if (!D)
        return NULL;
    D->c = cfg;
    D->runner = (loom__runner){devices_submit, devices_wait, devices_data, devices_forget,
                               devices_allgather};
    D->fault_dev = -1;
    pthread_mutex_init(&D->mu, NULL);
    pthread_cond_init(&D->go, NULL);
    pthread_cond_init(&D->done, NULL);
    /* across processes, the machine's CPUs are shared with the other processes on it: by
     * default each gets its part, and its devices the CPUs after those of the processes before
     * it (where the launcher bound each process to its own CPUs, those are all it sees) */
    int node_rank, node_size;
    if (join_processes(D, &node_rank, &node_size)) {
        loom_devices_free(D);
        return NULL;
    }
    /* the cores a device spans: given, or this process's CPUs over its devices (all of them for
     * one device when neither is given) */
    int share = ncpu / node_size > 0 ? ncpu / node_size : 1;
    int C = cfg.cores == LOOM_CORES_AUTO ? share / (cfg.count ? cfg.count : 1) : cfg.cores;
    C = D->c.cores = C < 1 ? 1 : C > 64 ? 64 : C;
    int part = share / C > 0 ? share / C : 1;
    D->n = D->c.count = cfg.count ? cfg.count : ncpu > 0 ? part : 1;
    D->spare_cpu = ncpu > D->n * C * node_size;
    D->group = loom_group_local_new(D->n, cfg.timeout_s);
    D->dev = loom__calloc((size_t)D->n, sizeof *D->dev);
    if (!D->group || !D->dev || same_counts(D) || parse_fault(D)) {
        loom_devices_free(D);
        return NULL;
    }
    for (int i = 0; i < D->n; i++) {
        device *d = &D->dev[i];
        d->owner = D, d->index = i;
        int first = (node_rank * D->n + i) * C, helpers[64];
        d->cpu = cfg.no_pin || ncpu == 0 ? -1 : cpus[first % ncpu];
        for (int h = 1; h < C; h++) /* its helpers': the next ones */
            helpers[h - 1] = cfg.no_pin || ncpu == 0 ? -1 : cpus[(first + h) % ncpu];
        char name[16]; /* as top -H and the tests see it, from the moment this returns */
        snprintf(name, sizeof name, "loom-device%d", i % 1000);
        if (C > 1 && !(d->team = loom__team_new(C, helpers, name))) {
            loom_devices_free(D);
            return NULL;
        }
        d->comm = loom_group_comm(D->group, i);
        if (start_pinned(d) != 0 && pthread_create(&d->thread, NULL, worker, d) != 0) {
            loom__error(LOOM_EINTERNAL, "loom_devices_new: cannot start device %d: %s", i,
                        strerror(errno));
            loom_devices_free(D);
            return NULL;
        }
        d->started = true;
        pthread_setname_np(d->thread, name);
    }
    return D;
}

void loom_devices_free(loom_devices *D) {
    if (!D)
        return;
    if (D->inflight) /* a submitted step ends first (its graph keeps its status) */
        loom__graph_finish(D->inflight);
    if (D->holder) { /* its outputs stay readable, and it no longer calls these devices */
        loom__graph_keep(D->holder);
        D->holder->runner = NULL, D->holder->runner_ctx = NULL;
    }
    pthread_mutex_lock(&D->mu);
    D->quit = true;
    pthread_cond_broadcast(&D->go);
    bool stuck = D->ndone < (uint64_t)D->n && D->gen > 0;
    pthread_mutex_unlock(&D->mu);
    for (int i = 0; D->dev && i < D->n; i++) {
        if (!D->dev[i].started)
            continue;
        if (stuck) /* a device never came back from a step: leave it, do not hang */
            pthread_detach(D->dev[i].thread);
        else
            pthread_join(D->dev[i].thread, NULL);
        if (D->dev[i].holds_cpu)
            loom__cpu_hold(D->dev[i].cpu, false);
    }
    for (int i = 0; D->dev && i < D->n && !stuck; i++)
        loom__team_free(D->dev[i].team);
    loom__cpus_follow_holds(); /* this thread has its CPUs back, if start() took them */
    if (stuck)                 /* its memory may still be in use */
        return;
    for (int i = 0; D->dev && i < D->n; i++) {
        loom__free(D->dev[i].ws);
        for (int s = 0; s < LOOM_SLAB_COUNT; s++)
            loom__free(D->dev[i].slab[s]);
    }
    loom__free(D->owner);
    return_grads(D);
    loom__group_unshare(D->procs, D->grads, D->grads_bytes);
    loom__free(D->dev);
    loom__arena_free(&D->arena);
    loom_group_free(D->group);
    loom_group_free(D->procs);
    loom_group_free(D->hprocs);
    pthread_mutex_destroy(&D->mu);
    pthread_cond_destroy(&D->go);
    pthread_cond_destroy(&D->done);
    loom__free(D);
}

int loom_devices_count(const loom_devices *D) {
    return D->n;
}

int loom_devices_cores(const loom_devices *D) {
    return D->c.cores;
}

bool loom_devices_any(loom_devices *D, bool mine) {
    if (D->nproc == 1)
        return mine;
    float v = mine ? 1.0f : 0.0f;
    if (loom_comm_allreduce(D->hcomm, &v, 1, LOOM_REDUCE_SUM)) /* (an MPI failure ends the job) */
        return true;
    return v > 0;
}

/* The 64-bit hash of item as four floats of 16 bits each (exact in any collective). */
static void item_hash(const char *item, float *out) {
    loom__hash h;
    loom__hash_init(&h);
    loom__hash_bytes(&h, item, strlen(item));
    uint64_t v = loom__hash_final(&h);
    for (int k = 0; k < 4; k++)
        out[k] = (float)(v >> (16 * k) & 0xFFFF);
}

loom_status loom_devices_agree(loom_devices *D, const char *const *items, int n) {
    enum { MAX = 128 };
    if (!D || n < 0 || n > MAX || (n && !items))
        return loom__error(LOOM_EINVAL, "loom_devices_agree: %d items (expected 0 to %d)", n, MAX);
    if (D->nproc == 1)
        return LOOM_OK;
    float theirs[1 + 4 * MAX] = {(float)n}, mine[4], *diff = loom__calloc((size_t)D->nproc, 4);
    if (!diff)
        return loom__error(LOOM_ENOMEM, "loom_devices_agree: out of memory");
    for (int i = 0; i < n && D->prank == 0; i++)
        item_hash(items[i], theirs + 1 + 4 * i);
    loom_status st = loom_comm_broadcast(D->hcomm, theirs, 1 + 4 * MAX, 0);
    int first = -1, n0 = (int)theirs[0];
    for (int i = 0; !st && first < 0 && i < (n > n0 ? n : n0); i++) {
        if (i < n)
            item_hash(items[i], mine);
        if (i >= n || i >= n0 || memcmp(mine, theirs + 1 + 4 * i, sizeof mine) != 0)
            first = i;
    }
    float f = (float)first;
    if (!st)
        st = loom_comm_allgather(D->hcomm, &f, 1, diff);
    int rank = -1, at = -1;
    for (int r = 0; !st && r < D->nproc && rank < 0; r++)
        if (diff[r] >= 0)
            rank = r, at = (int)diff[r];
    loom__free(diff);
    if (st || rank < 0)
        return st;
    const char *item = at < n ? items[at] : "(none)";
    int len = (int)strcspn(item, "=");
    return loom__error(LOOM_EINVAL,
                       "the processes disagree: process %d's %.*s differs from process 0's "
                       "(%s here, on process %d)",
                       rank, len, item, item, D->prank);
}

void loom_devices_abort(loom_devices *D, const char *reason) {
    if (D && D->nproc > 1)
        loom_comm_abort(D->pcomm, reason);
    else if (D)
        loom_comm_abort(D->dev[0].comm, reason);
}

int loom_devices_world(const loom_devices *D) {
    return D->world;
}

int loom_devices_process(const loom_devices *D) {
    return D->prank;
}

loom_status loom_graph_set_devices(loom_graph *g, loom_devices *D) {
    if (!g || !D)
        return loom__error(LOOM_EINVAL, "loom_graph_set_devices: NULL argument");
    if (g->n > 0)
        return loom__error(LOOM_EINVAL, "loom_graph_set_devices: the step already has nodes; set "
                                        "devices before recording (after loom_graph_reset)");
    loom__graph_finish(g); /* a step submitted on the devices it leaves ends there */
    if (g->runner)
        g->runner->forget(g->runner_ctx, g);
    g->runner = &D->runner;
    g->runner_ctx = D;
    g->ndev = D->world, g->nlocal = D->n, g->dev0 = D->prank * D->n;
    g->bucket_bytes = D->c.bucket_bytes;
    g->detect_anomaly = D->c.detect_anomaly;
    return LOOM_OK;
}
