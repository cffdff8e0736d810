/*
 * mpi.c - the MPI implementation of the collective interface: one rank per process of an MPI job
 * (MPI_COMM_WORLD, duplicated per group). The all-reduce is the local group's algorithm over the
 * network (each rank receives everyone's share of its 1/world of the elements, MPI_Alltoallv, adds
 * them in rank order with loom__reduce_slice, and the shares are gathered back, MPI_Allgatherv),
 * so its results are bitwise those of a local group of the same world, on every rank and every
 * run, whatever algorithm MPI picks; with two ranks each element is one addition, which commutes
 * bit for bit, so MPI's own all-reduce gives those results and is used. The collectives are MPI's
 * blocking ones (its fastest); a watchdog thread keeps the deadline beside them. A rank whose
 * collective outlasts the deadline, or that aborts the group, ends the whole job with MPI_Abort
 * after one line naming it (host, pid), the collective and the reason: no rank is left blocked.
 * Built only where CMake found MPI (LOOM_HAVE_MPI); elsewhere loom_group_mpi_new says so.
 */
#define _GNU_SOURCE
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const char *loom_mpi_launcher(void) {
    if (getenv("OMPI_COMM_WORLD_SIZE"))
        return "mpirun (Open MPI)";
    if (getenv("PMI_SIZE") || getenv("PMI_RANK"))
        return "mpiexec (PMI)";
    if (getenv("PMIX_RANK"))
        return "a PMIx launcher";
    return NULL;
}

loom_group *loom_group_mpi_new(double timeout_s) {
    return loom__group_mpi(timeout_s, true);
}

#ifndef LOOM_HAVE_MPI

loom_group *loom__group_mpi(double timeout_s, bool node) {
    (void)timeout_s, (void)node;
    loom__error(LOOM_EUNSUPPORTED, "loom_group_mpi_new: this loom was built without MPI "
                                   "(install libopenmpi-dev and rebuild)");
    return NULL;
}

loom_comm *loom__mpi_comm(loom_group *g, int rank) {
    (void)g, (void)rank;
    return NULL;
}

loom_comm *loom__mpi_self(loom_group *g) {
    (void)g;
    return NULL;
}

void loom__mpi_node(const loom_group *g, int *rank, int *size) {
    (void)g;
    *rank = 0, *size = 1;
}

const char *loom__mpi_version(void) {
    return NULL;
}

#else

#    include <mpi.h>

typedef struct mpi_group {
    loom__group_head h; /* first: the interface reads it */
    MPI_Comm comm;
    loom_comm self;
    float *scratch; /* the all-reduce's received shares */
    size_t scratch_size;
    int *counts; /* 4 x world: send counts and displacements, receive counts and displacements */
    char where[300];          /* "rank R (host H, pid P)" */
    int node_rank, node_size; /* among the processes on this machine */
    loom__shm *node;          /* memory the processes share, when they are all on this machine */
    /* the watchdog: a thread that ends the job when a collective outlasts the deadline */
    pthread_t watch;
    bool watching;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    _Atomic double since;   /* when the collective running began (0: none) */
    atomic_int kind;        /* which one */
    MPI_Comm wcomm;         /* the watchdogs' own messages: where each rank is */
    bool ask;               /* threads may call MPI at once: the watchdog can ask the others */
    struct mpi_group *next; /* the groups alive (their watchdogs stop before MPI is finalized) */
} mpi_group;

enum { TAG_WHERE = 1, TAG_HERE = 2 }; /* a watchdog's question, and the answer */

static const loom__group_ops mpi_ops;
static void *watchdog(void *arg);

static mpi_group *of(loom_comm *c) {
    return (mpi_group *)(void *)c->g;
}

const char *loom__mpi_version(void) {
    static char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(v, &len);
    v[strcspn(v, ",\n")] = 0;
    return v;
}

static pthread_mutex_t alive_mu = PTHREAD_MUTEX_INITIALIZER;
static mpi_group *alive;

static void stop_watchdog(mpi_group *g) {
    if (!g->watching)
        return;
    pthread_mutex_lock(&g->mu);
    g->stop = true;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->watch, NULL);
    g->watching = false;
}

/* At exit: a group still alive (its program did not free it) keeps its watchdog off MPI first. */
static void finalize(void) {
    pthread_mutex_lock(&alive_mu);
    for (mpi_group *g = alive; g; g = g->next)
        stop_watchdog(g);
    pthread_mutex_unlock(&alive_mu);
    MPI_Finalize();
}

/* MPI once per process, with threads allowed to call it (the devices' threads do); finalized at
 * exit. */
static loom_status init_mpi(void) {
    int done = 0, provided = 0;
    MPI_Initialized(&done);
    if (!done) {
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
            return loom__error(LOOM_EUNSUPPORTED, "loom_group_mpi_new: MPI_Init_thread failed");
        atexit(finalize);
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED)
        return loom__error(LOOM_EUNSUPPORTED,
                           "loom_group_mpi_new: this MPI gives threads level %d, loom needs "
                           "MPI_THREAD_SERIALIZED or more",
                           provided);
    return LOOM_OK;
}

/* The node's shared memory (shm.c), set up by every process of `node` together: rank 0 names
 * the job, each creates its segment, maps everyone's, and removes its file. NULL on every rank
 * (they agree) where any could not: the group then works without. */
static loom__shm *join_node(MPI_Comm node, int rank, int size) {
    char job[64] = "";
    if (rank == 0)
        snprintf(job, sizeof job, "loom-%ld-%llx", (long)getpid(),
                 (unsigned long long)(loom__now() * 1e9));
    MPI_Bcast(job, sizeof job, MPI_CHAR, 0, node);
    loom__shm *n = loom__shm_new(job, rank, size);
    int ok = n != NULL, all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, node);
    if (all) {
        ok = loom__shm_attach(n, job) == LOOM_OK;
        MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, node);
    }
    loom__shm_unlink(n); /* every rank has mapped every segment, or given up */
    if (!all) {
        loom__shm_free(n);
        return NULL;
    }
    return n;
}

loom_group *loom__group_mpi(double timeout_s, bool share) {
    bool bad = !(timeout_s >= 0 && timeout_s <= LOOM_MAX_TIMEOUT);
    if (bad || init_mpi()) {
        if (bad)
            loom__error(LOOM_EINVAL, "loom_group_mpi_new: timeout %g", timeout_s);
        return NULL;
    }
    mpi_group *g = loom__calloc(1, sizeof *g);
    int world = 0, rank = 0;
    if (!g || MPI_Comm_dup(MPI_COMM_WORLD, &g->comm) != MPI_SUCCESS) {
        loom__free(g);
        loom__error(LOOM_ENOMEM, "loom_group_mpi_new: cannot set up the communicator");
        return NULL;
    }
    MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN);
    int level = 0;
    MPI_Query_thread(&level);
    g->ask = level >= MPI_THREAD_MULTIPLE && MPI_Comm_dup(g->comm, &g->wcomm) == MPI_SUCCESS;
    MPI_Comm_size(g->comm, &world);
    MPI_Comm_rank(g->comm, &rank);
    MPI_Comm node;
    g->node_rank = 0, g->node_size = 1;
    if (MPI_Comm_split_type(g->comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) ==
        MPI_SUCCESS) {
        MPI_Comm_rank(node, &g->node_rank);
        MPI_Comm_size(node, &g->node_size);
        if (share && world > 1 && g->node_size == world)
            g->node = join_node(node, g->node_rank, g->node_size);
        MPI_Comm_free(&node);
    }
    g->h = (loom__group_head){&mpi_ops, world, timeout_s > 0 ? timeout_s : 60.0};
    g->self.g = (loom_group *)(void *)g, g->self.rank = rank;
    atomic_init(&g->self.seq, 0);
    g->counts = loom__calloc(4 * (size_t)world, sizeof(int));
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    snprintf(g->where, sizeof g->where, "rank %d (host %s, pid %ld)", rank, host, (long)getpid());
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    atomic_init(&g->since, 0.0);
    atomic_init(&g->kind, 0);
    g->watching = pthread_create(&g->watch, NULL, watchdog, g) == 0;
    pthread_mutex_lock(&alive_mu);
    g->next = alive, alive = g;
    pthread_mutex_unlock(&alive_mu);
    if (!g->counts || !g->watching) {
        mpi_ops.free((loom_group *)(void *)g);
        loom__error(LOOM_ENOMEM, "loom_group_mpi_new: cannot start the watchdog");
        return NULL;
    }
    return (loom_group *)(void *)g;
}

loom_comm *loom__mpi_comm(loom_group *grp, int rank) {
    mpi_group *g = (mpi_group *)(void *)grp;
    return rank == g->self.rank ? &g->self : NULL;
}

loom_comm *loom__mpi_self(loom_group *grp) {
    return &((mpi_group *)(void *)grp)->self;
}

void loom__mpi_node(const loom_group *grp, int *rank, int *size) {
    const mpi_group *g = (const mpi_group *)(const void *)grp;
    *rank = g->node_rank, *size = g->node_size;
}

static void mpi_free(loom_group *grp) {
    mpi_group *g = (mpi_group *)(void *)grp;
    pthread_mutex_lock(&alive_mu);
    for (mpi_group **p = &alive; *p; p = &(*p)->next)
        if (*p == g) {
            *p = g->next;
            break;
        }
    stop_watchdog(g);
    pthread_mutex_unlock(&alive_mu);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized)
        MPI_Comm_free(&g->comm);
    if (!finalized && g->ask)
        MPI_Comm_free(&g->wcomm);
    loom__shm_free(g->node);
    loom__free(g->scratch);
    loom__free(g->counts);
    loom__free(g);
}

static void *mpi_shared(loom_group *grp, size_t bytes) {
    return loom__shm_alloc(((mpi_group *)(void *)grp)->node, bytes);
}

static bool mpi_unshare(loom_group *grp, void *p, size_t bytes) {
    return loom__shm_release(((mpi_group *)(void *)grp)->node, p, bytes);
}

/* Ends the job: one line naming this rank and the reason, then MPI_Abort (every rank exits). */
static void mpi_abort(loom_comm *c, const char *reason) {
    loom__log(LOOM_LOG_ERROR, "%s: %s", of(c)->where, reason);
    MPI_Abort(of(c)->comm, 1);
}

static const char *what(int kind) {
    static const char *names[] = {"all-reduce", "broadcast", "all-gather", "barrier"};
    return names[kind];
}

/* The watchdog thread: polls the collective running (if any) and ends the job when it has
 * lasted past the deadline. Blocking collectives are MPI's fastest (its non-blocking ones ran at
 * 0.6-0.7x here), so the deadline is kept from beside them. */
/* Answers the other watchdogs' questions: this rank's collective count (seq). */
static void answer(mpi_group *g) {
    int flag = 1;
    while (flag) {
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, TAG_WHERE, g->wcomm, &flag, &st);
        if (!flag)
            break;
        int dummy;
        MPI_Recv(&dummy, 1, MPI_INT, st.MPI_SOURCE, TAG_WHERE, g->wcomm, MPI_STATUS_IGNORE);
        unsigned long long seq = atomic_load(&g->self.seq);
        MPI_Send(&seq, 1, MPI_UNSIGNED_LONG_LONG, st.MPI_SOURCE, TAG_HERE, g->wcomm);
    }
}

/* The watchdog's message for a collective past its deadline: which ranks never reached it, by
 * asking their watchdogs (they answer whatever their own threads are doing) for 0.5 s. */
static void name_laggards(mpi_group *g, char *why, size_t size) {
    int w = g->h.world, me = g->self.rank, dummy = 0;
    unsigned long long mine = atomic_load(&g->self.seq), *at = loom__calloc((size_t)w, 8);
    MPI_Request *req = loom__calloc(2 * (size_t)w, sizeof *req);
    size_t k = (size_t)snprintf(why, size,
                                "watchdog: waited %.1f s in collective #%llu (%s) for the other "
                                "ranks; the job is aborted",
                                g->h.timeout, mine, what(atomic_load(&g->kind)));
    if (!g->ask || !at || !req) {
        loom__free(at), loom__free(req);
        return;
    }
    for (int r = 0; r < w; r++) {
        req[2 * r] = req[2 * r + 1] = MPI_REQUEST_NULL;
        if (r != me) {
            MPI_Isend(&dummy, 1, MPI_INT, r, TAG_WHERE, g->wcomm, &req[2 * r]);
            MPI_Irecv(&at[r], 1, MPI_UNSIGNED_LONG_LONG, r, TAG_HERE, g->wcomm, &req[2 * r + 1]);
        }
    }
    int done = 0;
    for (double end = loom__now() + 0.5; !done && loom__now() < end;) {
        answer(g); /* (another rank may be asking meanwhile) */
        MPI_Testall(2 * w, req, &done, MPI_STATUSES_IGNORE);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    const char *head[2] = {"; not reached by ", "; no answer from "};
    for (int pass = 0; pass < 2; pass++) {
        bool first = true;
        for (int r = 0; r < w && k < size; r++) {
            int got = 0;
            if (r != me)
                MPI_Test(&req[2 * r + 1], &got, MPI_STATUS_IGNORE);
            bool behind = r != me && (got || req[2 * r + 1] == MPI_REQUEST_NULL) && at[r] < mine;
            bool silent = r != me && !got && req[2 * r + 1] != MPI_REQUEST_NULL;
            if ((pass == 0 && behind) || (pass == 1 && silent)) {
                k +=
                    (size_t)snprintf(why + k, size - k, pass ? "%srank %d" : "%srank %d (at #%llu)",
                                     first ? head[pass] : ", ", r, at[r]);
                first = false;
            }
        }
    }
    loom__free(at), loom__free(req); /* (the job ends: requests left pending do not matter) */
}

static void *watchdog(void *arg) {
    mpi_group *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        struct timespec ts;
        loom__deadline_in(&ts, 0.02);
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
        if (g->stop)
            break;
        if (g->ask)
            answer(g);
        double since = atomic_load(&g->since);
        if (since > 0 && loom__now() - since > g->h.timeout) {
            char why[1024];
            name_laggards(g, why, sizeof why);
            mpi_abort(&g->self, why);
        }
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

/* Brackets a blocking collective for the watchdog. */
static void enter(loom_comm *c, int kind) {
    atomic_fetch_add(&c->seq, 1);
    atomic_store(&of(c)->kind, kind);
    atomic_store(&of(c)->since, loom__now());
}

/* Ends the bracket; an MPI error ends the job, naming the collective. */
static loom_status leave(loom_comm *c, int rc) {
    atomic_store(&of(c)->since, 0.0);
    if (rc == MPI_SUCCESS)
        return LOOM_OK;
    char err[MPI_MAX_ERROR_STRING], why[512 + MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, err, &len);
    snprintf(why, sizeof why, "collective #%llu (%s) failed: %s",
             (unsigned long long)atomic_load(&c->seq), what(atomic_load(&of(c)->kind)), err);
    mpi_abort(c, why);
    return loom__error(LOOM_EABORTED, "%s", why);
}

static loom_status too_large(int64_t n) {
    return loom__error(LOOM_ERANGE, "MPI collective of %lld floats: more than 2^31", (long long)n);
}

static loom_status mpi_allreduce(loom_comm *c, float *buf, int64_t n, loom_reduce_op op) {
    mpi_group *g = of(c);
    int w = g->h.world, me = c->rank;
    if (n > INT32_MAX)
        return too_large(n);
    if (w > 256)
        return loom__error(LOOM_EUNSUPPORTED, "MPI all-reduce over %d ranks: at most 256", w);
    if (w == 1 || n == 0) { /* (a mean over one rank is the value itself) */
        atomic_fetch_add(&c->seq, 1);
        return LOOM_OK;
    }
    enter(c, 0);
    if (g->node && loom__shm_allreduce(g->node, buf, n, op == LOOM_REDUCE_MEAN))
        return leave(c, MPI_SUCCESS); /* in place, every rank's buffer in shared memory */
    if (w == 2) { /* one addition an element, and a + b is b + a bit for bit: MPI's own sum */
        loom_status s =
            leave(c, MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, g->comm));
        for (int64_t i = 0; !s && op == LOOM_REDUCE_MEAN && i < n; i++)
            buf[i] /= 2.0f; /* (the local reduction's v /= (float)w) */
        return s;
    }
    int64_t lo, hi, mlo, mhi;
    loom__slice(n, w, me, &mlo, &mhi);
    int share = (int)(mhi - mlo);
    if (loom__scratch((void **)&g->scratch, &g->scratch_size,
                      sizeof(float) * ((size_t)share * (size_t)w + 1)))
        return leave(c, MPI_SUCCESS), LOOM_ENOMEM;
    int *sc = g->counts, *sd = sc + w, *rc = sd + w, *rd = rc + w;
    for (int r = 0; r < w; r++) {
        loom__slice(n, w, r, &lo, &hi);
        sc[r] = (int)(hi - lo), sd[r] = (int)lo; /* my elements of r's share, to r */
        rc[r] = share, rd[r] = r * share;        /* r's elements of my share */
    }
    int err = MPI_Alltoallv(buf, sc, sd, MPI_FLOAT, g->scratch, rc, rd, MPI_FLOAT, g->comm);
    if (err == MPI_SUCCESS) {
        float *rows[256];
        for (int r = 0; r < w; r++)
            rows[r] = g->scratch + (size_t)r * (size_t)share;
        loom__reduce_slice(rows, w, 0, share, op == LOOM_REDUCE_MEAN);
        memcpy(buf + mlo, rows[0], sizeof(float) * (size_t)share);
        /* every share back to everyone, in place */
        err = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, buf, sc, sd, MPI_FLOAT, g->comm);
    }
    return leave(c, err);
}

static loom_status mpi_broadcast(loom_comm *c, float *buf, int64_t n, int root) {
    if (n > INT32_MAX)
        return too_large(n);
    enter(c, 1);
    return leave(c, MPI_Bcast(buf, (int)n, MPI_FLOAT, root, of(c)->comm));
}

static loom_status mpi_allgather(loom_comm *c, const float *in, int64_t n, float *out) {
    if (n * of(c)->h.world > INT32_MAX)
        return too_large(n * of(c)->h.world);
    enter(c, 2);
    return leave(c, MPI_Allgather(in, (int)n, MPI_FLOAT, out, (int)n, MPI_FLOAT, of(c)->comm));
}

static loom_status mpi_barrier(loom_comm *c) {
    enter(c, 3);
    return leave(c, MPI_Barrier(of(c)->comm));
}

static const loom__group_ops mpi_ops = {"mpi",         mpi_allreduce, mpi_broadcast,
                                        mpi_allgather, mpi_barrier,   mpi_abort,
                                        mpi_free,      mpi_shared,    mpi_unshare};

#endif
