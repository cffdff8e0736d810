/*
 * test_mpi.c - the MPI process group, run by tests/test_mpi.sh under mpirun with 1 to 4
 * processes. Every collective for sizes 0, 1, odd and large: all-reduce (sum and mean) bitwise
 * equal to a naive reduction that adds the ranks' inputs in rank order (every rank recomputes
 * every rank's input, a pure function of rank and element), broadcast from every root, all-gather
 * and barrier; a repeated all-reduce is bitwise identical; rank and world are MPI's.
 * With an argument, a fault for test_mpi.sh: `hang` (rank 1 never enters the collective the
 * others wait in) or `abort` (rank 1 aborts the group): either must end every process at once.
 */
#include "harness.h"

#include <unistd.h>

static float input(int rank, int64_t i) {
    return (float)test_rand(100 + (uint64_t)rank, (uint64_t)i, -1, 1);
}

static void check_sizes(loom_comm *c) {
    int w = loom_comm_world(c), me = loom_comm_rank(c);
    int64_t sizes[] = {0, 1, 7, 1000003};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        int64_t n = sizes[k];
        float *buf = malloc(sizeof(float) * (size_t)(n + 1)),
              *again = malloc(sizeof(float) * (size_t)(n + 1));
        for (int mean = 0; mean < 2; mean++) {
            for (int rep = 0; rep < 2; rep++) {
                float *b = rep ? again : buf;
                for (int64_t i = 0; i < n; i++)
                    b[i] = input(me, i);
                ASSERT_EQ(loom_comm_allreduce(c, b, n, mean ? LOOM_REDUCE_MEAN : LOOM_REDUCE_SUM),
                          LOOM_OK);
            }
            for (int64_t i = 0; i < n; i++) {
                float v = input(0, i);
                for (int r = 1; r < w; r++)
                    v += input(r, i);
                if (mean)
                    v /= (float)w;
                if (memcmp(&v, &buf[i], sizeof v) != 0)
                    FAILF("%d ranks, %lld elements, %s: element %lld is %.9g on rank %d, expected "
                          "%.9g",
                          w, (long long)n, mean ? "mean" : "sum", (long long)i, buf[i], me, v);
            }
            ASSERT(n == 0 || memcmp(buf, again, sizeof(float) * (size_t)n) == 0);
        }
        for (int root = 0; root < w; root++) {
            for (int64_t i = 0; i < n; i++)
                buf[i] = input(me, i);
            ASSERT_EQ(loom_comm_broadcast(c, buf, n, root), LOOM_OK);
            for (int64_t i = 0; i < n; i++)
                if (buf[i] != input(root, i))
                    FAILF("broadcast from %d, %lld elements: element %lld on rank %d", root,
                          (long long)n, (long long)i, me);
        }
        float *all = malloc(sizeof(float) * (size_t)(n * w + 1));
        for (int64_t i = 0; i < n; i++)
            buf[i] = input(me, i);
        ASSERT_EQ(loom_comm_allgather(c, buf, n, all), LOOM_OK);
        for (int r = 0; r < w; r++)
            for (int64_t i = 0; i < n; i++)
                if (all[r * n + i] != input(r, i))
                    FAILF("all-gather, %lld elements: rank %d's element %lld on rank %d",
                          (long long)n, r, (long long)i, me);
        ASSERT_EQ(loom_comm_barrier(c), LOOM_OK);
        free(all), free(buf), free(again);
    }
}

int main(int argc, char **argv) {
    loom_group *g = loom_group_mpi_new(argc > 1 ? 1.0 : 0);
    if (!g) {
        fprintf(stderr, "%s\n", loom_last_error());
        return 1;
    }
    const char *env_rank = getenv("OMPI_COMM_WORLD_RANK"),
               *env_size = getenv("OMPI_COMM_WORLD_SIZE");
    int me = env_rank ? atoi(env_rank) : 0, world = env_size ? atoi(env_size) : 1;
    loom_comm *c = loom_group_comm(g, me);
    if (!c || loom_comm_rank(c) != me || loom_comm_world(c) != world || !loom_mpi_launcher()) {
        fprintf(stderr, "rank %d of %d: the group says %d of %d, launcher %s\n", me, world,
                c ? loom_comm_rank(c) : -1, c ? loom_comm_world(c) : -1,
                loom_mpi_launcher() ? loom_mpi_launcher() : "none");
        return 1;
    }
    if (argc > 1) { /* a fault: rank 1 hangs outside the collective, or aborts the group */
        float x = 1;
        if (me == 1 && !strcmp(argv[1], "hang"))
            sleep(30);
        else if (me == 1)
            loom_comm_abort(c, "fault injected by test_mpi abort");
        loom_comm_allreduce(c, &x, 1, LOOM_REDUCE_SUM);
        sleep(30); /* not reached: the job has been aborted */
        return 0;
    }
    harness_current = "mpi_collectives";
    check_sizes(c);
    if (!harness_failed)
        fprintf(stderr, "ok   rank %d of %d: every collective, sizes 0, 1, 7, 1000003\n", me,
                world);
    loom_group_free(g);
    return HARNESS_EXIT();
}
