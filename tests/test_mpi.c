/*
 * test_mpi.c - the MPI process group, run by tests/test_mpi.sh under mpirun with 1 to 4
 * processes. Every collective for sizes 0, 1, odd and large: all-reduce (sum and mean) bitwise
 * equal to a naive reduction that adds the ranks' inputs in rank order (every rank recomputes
 * every rank's input, a pure function of rank and element), broadcast from every root, all-gather
 * and barrier, with buffers of every kind (check_sizes); a repeated all-reduce is bitwise
 * identical; rank and world are MPI's. Then devices across the processes (check_devices).
 * With `leave`, every process exits with its group and devices alive (MPI is finalized at exit
 * without crashing on their watchdogs). With another argument, a fault for test_mpi.sh: `hang`
 * (rank 1 never enters the collective the others wait in) or `abort` (rank 1 aborts the group):
 * either must end every process at once.
 */
#include "harness.h"

#include <unistd.h>

static float input(int rank, int64_t i) {
    return (float)test_rand(100 + (uint64_t)rank, (uint64_t)i, -1, 1);
}

/* Where the collectives' buffers come from: malloc, loom_group_alloc (on one machine, memory
 * every process maps: the all-reduce works in place), or the group's on every rank but rank 0
 * (the all-reduce must notice and take MPI's way on every rank). */
typedef enum { PLAIN, SHARED, MIXED } memory;
static const char *memory_name[] = {"malloc", "loom_group_alloc", "mixed"};

static float *get(loom_group *g, memory mem, int me, size_t bytes) {
    return mem == SHARED || (mem == MIXED && me > 0) ? loom_group_alloc(g, bytes) : malloc(bytes);
}

static void put(loom_group *g, memory mem, int me, float *p, size_t bytes) {
    if (mem == SHARED || (mem == MIXED && me > 0))
        loom_group_release(g, p, bytes);
    else
        free(p);
}

static void check_sizes(loom_group *g, loom_comm *c, memory mem) {
    int w = loom_comm_world(c), me = loom_comm_rank(c);
    int64_t sizes[] = {0, 1, 7, 1000003};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        int64_t n = sizes[k];
        size_t bytes = sizeof(float) * (size_t)(n + 1);
        float *buf = get(g, mem, me, bytes), *again = get(g, mem, me, bytes);
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
                    FAILF("%d ranks, %lld elements, %s, %s: element %lld is %.9g on rank %d, "
                          "expected %.9g",
                          w, (long long)n, memory_name[mem], mean ? "mean" : "sum", (long long)i,
                          buf[i], me, v);
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
        free(all);
        put(g, mem, me, buf, bytes), put(g, mem, me, again, bytes);
    }
}

static void same_models(loom_model *across, loom_model *one, int step, int world) {
    for (int p = 0; p < loom_model_count(across); p++) {
        loom_param *a = loom_model_at(across, p), *b = loom_model_at(one, p);
        size_t bytes = sizeof(float) * (size_t)loom_param_numel(a);
        if (memcmp(loom_param_grad(a), loom_param_grad(b), bytes) != 0)
            FAILF("step %d: the gradient of %s across %d processes differs from one "
                  "process's with %d devices",
                  step, loom_param_name(a), world, world);
        if (memcmp(loom_param_data(a), loom_param_data(b), bytes) != 0)
            FAILF("step %d: %s across %d processes differs from one process's", step,
                  loom_param_name(a), world);
    }
}

/* A step on devices across the processes (one device each) against the same step in one
 * process with as many devices: the gradients that loom_param_grad shows are bitwise the same,
 * step after step (device 0 keeps them where the other processes read them in place, and the
 * model's slab is their copy when the host looks); gradients the host writes (and touches) are
 * the ones the next update uses; the parameters stay bitwise the same. */
static void check_devices(int world) {
    loom_devices *across =
        loom_devices_new(&(loom_devices_config){.count = 1, .dist = LOOM_DIST_MPI, .no_pin = true});
    loom_devices *one = loom_devices_new(
        &(loom_devices_config){.count = world, .dist = LOOM_DIST_LOCAL, .no_pin = true});
    if (!across || !one || loom_devices_world(across) != world) {
        loom_devices_free(one), loom_devices_free(across);
        FAILF("devices across %d processes: %s", world, loom_last_error());
    }
    loom_model *m[2];
    loom_sequential *net[2];
    loom_optim *opt[2];
    loom_layer layers[] = {LOOM_LINEAR(5, 7), LOOM_RELU, LOOM_LINEAR(7, 3), LOOM_END};
    for (int k = 0; k < 2; k++) {
        m[k] = loom_model_new();
        net[k] = loom_sequential_new(m[k], layers);
        loom_sequential_init(net[k], 3);
        opt[k] = loom_sgd_new(m[k], &(loom_optim_config){.lr = 0.5});
    }
    enum { ROWS = 13 }; /* (not a multiple of the devices: padded shards too) */
    float x[ROWS * 5];
    int32_t y[ROWS];
    for (int step = 0; step < 4; step++) {
        for (int i = 0; i < ROWS * 5; i++)
            x[i] = (float)test_rand(40 + (uint64_t)step, (uint64_t)i, -1, 1);
        for (int i = 0; i < ROWS; i++)
            y[i] = (int32_t)((i * 7 + step) % 3);
        bool update = step >= 2; /* steps 2 and 3: the host's gradients, then an update alone */
        for (int k = 0; k < 2; k++) {
            if (update)
                for (int p = 0; p < loom_model_count(m[k]); p++) {
                    loom_param *q = loom_model_at(m[k], p);
                    float *gr = loom_param_grad(q);
                    for (int64_t i = 0; i < loom_param_numel(q); i++)
                        gr[i] =
                            (float)test_rand(60 + (uint64_t)(step * 10 + p), (uint64_t)i, -1, 1);
                    loom_model_touch(m[k]);
                }
            loom_graph *g = loom_graph_new(m[k]);
            loom_graph_set_devices(g, k ? one : across);
            if (!update) {
                loom_tensor *in = loom_input_batch(g, LOOM_F32, 2, (int64_t[]){ROWS, 5}, x);
                loom_tensor *lab = loom_input_batch(g, LOOM_I32, 1, (int64_t[]){ROWS}, y);
                loom_backward(g,
                              loom_cross_entropy(g, loom_sequential_forward(g, net[k], in), lab));
            } else {
                loom_optim_step(g, opt[k]);
            }
            if (loom_graph_run(g))
                fprintf(stderr, "FAIL step %d: %s\n", step, loom_last_error()), harness_failed++;
            loom_graph_free(g);
        }
        same_models(m[0], m[1], step, world);
    }
    for (int k = 0; k < 2; k++) {
        loom_optim_free(opt[k]);
        loom_sequential_free(net[k]);
        loom_model_free(m[k]);
    }
    loom_devices_free(one);
    loom_devices_free(across);
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
    if (argc > 1 && !strcmp(argv[1], "leave")) { /* exits with a group and devices alive */
        float x = 1;
        loom_devices_new(&(loom_devices_config){.count = 1, .dist = LOOM_DIST_MPI});
        return loom_comm_allreduce(c, &x, 1, LOOM_REDUCE_SUM) != LOOM_OK;
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
    for (memory mem = PLAIN; mem <= MIXED; mem++)
        check_sizes(g, c, mem);
    harness_current = "mpi_devices";
    check_devices(world);
    if (!harness_failed)
        fprintf(stderr,
                "ok   rank %d of %d: every collective, sizes 0, 1, 7, 1000003, buffers from "
                "malloc, loom_group_alloc and both; devices across processes\n",
                me, world);
    loom_group_free(g);
    return HARNESS_EXIT();
}
