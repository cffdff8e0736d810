/*
 * test_dist.c - the local process group: all-reduce (sum, mean), broadcast, all-gather and
 * barrier for sizes 0, 1, odd, 16, 33 and large on 1 to 8 ranks (more threads than cores), checked
 * against a naive reduction in the same rank order (so bitwise); an abort wakes every rank; the
 * watchdog names the rank that never arrived, well inside its deadline.
 */
#include "harness.h"

#include <pthread.h>
#include <time.h>

typedef struct {
    loom_group *g;
    int rank;
    int64_t n;
    float *buf, *out, *bcast;
    loom_status st[5];
    int skip; /* rank that never enters (watchdog test), -1 for none */
    char msg[256];
} job;

static float value(int rank, int64_t i) {
    return (float)((i * 7 + rank * 13) % 101) * 0.37f - 5.0f + (float)rank * 1e-3f;
}

static void *worker(void *arg) {
    job *j = arg;
    loom_comm *c = loom_group_comm(j->g, j->rank);
    if (j->rank == j->skip)
        return NULL;
    j->st[0] = loom_comm_allreduce(c, j->buf, j->n, LOOM_REDUCE_SUM);
    snprintf(j->msg, sizeof j->msg, "%s", j->st[0] ? loom_last_error() : "");
    j->st[1] = loom_comm_broadcast(c, j->bcast, j->n, loom_comm_world(c) - 1);
    j->st[2] = loom_comm_allgather(c, j->bcast, j->n > 3 ? 3 : j->n, j->out);
    j->st[3] = loom_comm_barrier(c);
    for (int64_t i = 0; i < j->n; i++)
        j->bcast[i] = value(j->rank, i);
    j->st[4] = loom_comm_allreduce(c, j->bcast, j->n, LOOM_REDUCE_MEAN);
    return NULL;
}

static void run_world(int world, int64_t n, int *bad) {
    loom_group *g = loom_group_local_new(world, 30);
    pthread_t th[8];
    job jobs[8];
    for (int r = 0; r < world; r++) {
        jobs[r] = (job){g,
                        r,
                        n,
                        malloc(sizeof(float) * (size_t)(n + 1)),
                        malloc(sizeof(float) * (size_t)(3 * world + 1)),
                        malloc(sizeof(float) * (size_t)(n + 1)),
                        {0},
                        -1,
                        ""};
        for (int64_t i = 0; i < n; i++)
            jobs[r].buf[i] = value(r, i), jobs[r].bcast[i] = (float)(r * 1000) + (float)i;
        pthread_create(&th[r], NULL, worker, &jobs[r]);
    }
    for (int r = 0; r < world; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < world; r++) {
        for (int k = 0; k < 5; k++)
            *bad += jobs[r].st[k] != LOOM_OK;
        for (int64_t i = 0; i < n; i++) {
            float sum = value(0, i);
            for (int q = 1; q < world; q++)
                sum += value(q, i);
            *bad += jobs[r].buf[i] != sum;                  /* sum, bitwise */
            *bad += jobs[r].bcast[i] != sum / (float)world; /* mean */
        }
        for (int q = 0; q < world; q++) /* all-gather of the broadcast values */
            for (int64_t i = 0; i < (n > 3 ? 3 : n); i++)
                *bad +=
                    jobs[r].out[q * (n > 3 ? 3 : n) + i] != (float)((world - 1) * 1000) + (float)i;
    }
    for (int r = 0; r < world; r++)
        free(jobs[r].buf), free(jobs[r].out), free(jobs[r].bcast);
    loom_group_free(g);
}

TEST(collectives_match_naive_reduction) {
    const int64_t sizes[] = {0, 1, 7, 16, 33, 1000003}; /* whole and ragged 16-element chunks */
    for (int world = 1; world <= 8; world++)
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
            int bad = 0;
            run_world(world, sizes[s], &bad);
            if (bad)
                FAILF("world %d, n %lld: %d mismatches", world, (long long)sizes[s], bad);
        }
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

TEST(watchdog_names_the_missing_rank) {
    loom_group *g = loom_group_local_new(3, 0.3);
    pthread_t th[3];
    job jobs[3];
    float buf[3][4] = {{0}}, out[3][12], bc[3][4];
    double t0 = now();
    for (int r = 0; r < 3; r++) {
        jobs[r] = (job){g, r, 4, buf[r], out[r], bc[r], {0}, 1, ""};
        pthread_create(&th[r], NULL, worker, &jobs[r]);
    }
    for (int r = 0; r < 3; r++)
        pthread_join(th[r], NULL);
    double dt = now() - t0;
    ASSERT(dt < 5.0); /* deadline 0.3 s */
    ASSERT(jobs[0].st[0] == LOOM_ETIMEDOUT || jobs[0].st[0] == LOOM_EABORTED);
    ASSERT(jobs[2].st[0] == LOOM_ETIMEDOUT || jobs[2].st[0] == LOOM_EABORTED);
    ASSERT(jobs[0].st[4] != LOOM_OK && jobs[2].st[4] != LOOM_OK); /* the group stays failed */
    for (int r = 0; r < 3; r += 2)
        ASSERT_STR_CONTAINS(jobs[r].msg, "in collective #1 for device(s) 1 (at #0)");
    loom_group_free(g);
}

static void *abort_worker(void *arg) {
    job *j = arg;
    loom_comm *c = loom_group_comm(j->g, j->rank);
    if (j->rank == 0) {
        loom_comm_abort(c, "device 0 failed: injected");
        return NULL;
    }
    j->st[0] = loom_comm_allreduce(c, j->buf, j->n, LOOM_REDUCE_SUM);
    snprintf((char *)j->out, 64, "%s", loom_last_error());
    return NULL;
}

TEST(abort_wakes_every_rank) {
    loom_group *g = loom_group_local_new(4, 60);
    pthread_t th[4];
    job jobs[4];
    float buf[4][4] = {{0}}, msg[4][16];
    double t0 = now();
    for (int r = 0; r < 4; r++) {
        jobs[r] = (job){g, r, 4, buf[r], msg[r], NULL, {0}, -1, ""};
        pthread_create(&th[r], NULL, abort_worker, &jobs[r]);
    }
    for (int r = 0; r < 4; r++)
        pthread_join(th[r], NULL);
    ASSERT(now() - t0 < 5.0); /* not the 60 s deadline */
    for (int r = 1; r < 4; r++) {
        ASSERT_EQ(jobs[r].st[0], LOOM_EABORTED);
        ASSERT_STR_CONTAINS((const char *)jobs[r].out, "device 0 failed: injected");
    }
    loom_group_free(g);
}

int main(void) {
    RUN(collectives_match_naive_reduction);
    RUN(watchdog_names_the_missing_rank);
    RUN(abort_wakes_every_rank);
    return HARNESS_EXIT();
}
