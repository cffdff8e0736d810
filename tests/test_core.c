/*
 * test_core.c - core facilities: the status table, the thread-local error text, the allocation
 * hooks (used here to count leaks and to inject failures), and Philox-4x32-10 against the
 * known-answer vectors published with Random123 (kat_vectors), and a device's team of cores
 * (loom__team_for: every index once, the bounds aligned).
 */
#include "../src/core/internal.h"
#include "harness.h"

#include <time.h>

TEST(status_names_and_messages) {
    ASSERT(!strcmp(loom_status_name(LOOM_OK), "OK"));
    ASSERT(!strcmp(loom_status_name(LOOM_EFORMAT), "EFORMAT"));
    ASSERT(!strcmp(loom_status_str(LOOM_ENOMEM), "out of memory"));
    ASSERT(!strcmp(loom_status_name((loom_status)-1000), "UNKNOWN"));
}

TEST(philox_known_answers) {
    /* Random123 kat_vectors, philox4x32 10 rounds: counter words, key words, expected output.
     * loom's counter = (counter lo, counter hi, stream lo, stream hi) and key = seed. */
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (int i = 0; i < 3; i++) {
        const uint32_t *k = kat[i];
        uint32_t out[4];
        loom_philox((uint64_t)k[5] << 32 | k[4], (uint64_t)k[3] << 32 | k[2],
                    (uint64_t)k[1] << 32 | k[0], out);
        for (int w = 0; w < 4; w++)
            if (out[w] != k[6 + w])
                FAILF("vector %d word %d: %08x, expected %08x", i, w, out[w], k[6 + w]);
    }
}

TEST(uniform_floats_are_in_range_and_keyed) {
    double sum = 0;
    for (uint64_t i = 0; i < 100000; i++) {
        float u = loom_rand_uniform(7, 3, i);
        ASSERT(u >= 0.0f && u < 1.0f);
        sum += u;
    }
    ASSERT_NEAR(sum / 100000, 0.5, 0.01);
    ASSERT(loom_rand_uniform(7, 3, 5) == loom_rand_uniform(7, 3, 5));
    ASSERT(loom_rand_uniform(7, 3, 5) != loom_rand_uniform(8, 3, 5));
    ASSERT(loom_rand_uniform(7, 3, 5) != loom_rand_uniform(7, 4, 5));
}

static long live_allocs;
static long fail_after = -1;
static void *count_malloc(size_t n, void *ud) {
    (void)ud;
    if (fail_after == 0)
        return NULL;
    if (fail_after > 0)
        fail_after--;
    live_allocs++;
    return malloc(n);
}
static void *count_realloc(void *p, size_t n, void *ud) {
    (void)ud;
    if (fail_after == 0)
        return NULL;
    if (!p)
        live_allocs++;
    return realloc(p, n);
}
static void count_free(void *p, void *ud) {
    (void)ud;
    if (p)
        live_allocs--;
    free(p);
}

/* Builds and runs a small training step; returns the run's status. */
static loom_status small_step(void) {
    loom_model *m = loom_model_new();
    if (!m)
        return LOOM_ENOMEM;
    loom_layer layers[] = {LOOM_LINEAR(4, 3), LOOM_RELU, LOOM_LINEAR(3, 2), LOOM_END};
    loom_sequential *s = loom_sequential_new(m, layers);
    loom_optim *o = s ? loom_sgd_new(m, &(loom_optim_config){.lr = 0.1, .momentum = 0.9}) : NULL;
    loom_graph *g = o ? loom_graph_new(m) : NULL;
    loom_status st = LOOM_ENOMEM;
    if (g) {
        float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        int32_t y[2] = {0, 1};
        int64_t sx[2] = {2, 4}, sy[1] = {2};
        loom_sequential_init(s, 1);
        for (int step = 0; step < 2; step++) {
            loom_graph_reset(g);
            loom_tensor *logits = loom_sequential_forward(g, s, loom_input(g, LOOM_F32, 2, sx, x));
            loom_tensor *loss = loom_cross_entropy(g, logits, loom_input(g, LOOM_I32, 1, sy, y));
            loom_backward(g, loss);
            loom_optim_step(g, o);
            st = loom_graph_run(g);
            if (st)
                break;
        }
    }
    loom_graph_free(g);
    loom_optim_free(o);
    loom_sequential_free(s);
    loom_model_free(m);
    return st;
}

TEST(no_leaks_and_failed_allocations_are_reported) {
    loom_set_allocator(&(loom_allocator){count_malloc, count_realloc, count_free, NULL});
    live_allocs = 0;
    loom_status st = small_step();
    long leaked = live_allocs;
    /* Fail each allocation in turn: every run must fail cleanly (no crash) and free everything. */
    int failures_seen = 0;
    for (long k = 0; k < 200; k++) {
        live_allocs = 0;
        fail_after = k;
        loom_status s = small_step();
        fail_after = -1;
        if (live_allocs != 0) {
            loom_set_allocator(NULL);
            FAILF("failing allocation %ld leaked %ld blocks", k, live_allocs);
        }
        failures_seen += s != LOOM_OK;
    }
    loom_set_allocator(NULL);
    ASSERT_EQ(st, LOOM_OK);
    ASSERT_EQ(leaked, 0);
    ASSERT(failures_seen > 10);
}

typedef struct {
    int64_t n, align;
    int size;
    int *hits;     /* per index */
    int seen[8];   /* calls per worker */
    int bad_bound; /* bounds not a multiple of align (n excepted) */
    loom__team *t;
} team_case;

static void team_range(void *ctx, int64_t lo, int64_t hi, int w) {
    team_case *c = ctx;
    __atomic_fetch_add(&c->seen[w], 1, __ATOMIC_RELAXED);
    if ((lo % c->align && lo != c->n) || (hi % c->align && hi != c->n))
        __atomic_fetch_add(&c->bad_bound, 1, __ATOMIC_RELAXED);
    for (int64_t i = lo; i < hi; i++)
        __atomic_fetch_add(&c->hits[i], 1, __ATOMIC_RELAXED);
    unsigned char *s = loom__team_scratch(c->t, w);
    if (w > 0 && s)
        s[4095] = (unsigned char)w; /* (ASan: the whole reserve is there) */
}

/* A device's cores split [0, n) among them: every index exactly once, each range's bounds (but n)
 * multiples of the alignment, each core at most once a job; over many jobs in a row (the helpers
 * polling) and after pauses (asleep); a team of one, or none, runs the whole range here. */
TEST(a_team_of_cores_covers_every_index_once) {
    for (int size = 1; size <= 3; size++) {
        loom__team *t = loom__team_new(size, NULL, "test");
        ASSERT(t != NULL);
        ASSERT_EQ(loom__team_size(t), size);
        ASSERT(loom__team_reserve(t, 4096));
        ASSERT(loom__team_scratch(t, 0) == NULL);
        const int64_t ns[] = {0, 1, 5, 16, 17, 100, 1000, 4099};
        for (int job = 0; job < 300; job++) {
            team_case c = {.n = ns[job % 8], .align = job % 3 == 0 ? 16 : 1, .size = size, .t = t};
            c.hits = calloc((size_t)c.n + 1, sizeof *c.hits);
            if (job % 50 == 49) /* long enough for the helpers to sleep */
                nanosleep(&(struct timespec){0, 3000000}, NULL);
            loom__team_for(job % 7 == 6 ? NULL : t, c.n, c.align, team_range, &c);
            for (int64_t i = 0; i < c.n; i++)
                if (c.hits[i] != 1)
                    FAILF("team of %d, n %lld: index %lld run %d times", size, (long long)c.n,
                          (long long)i, c.hits[i]);
            for (int w = 0; w < 8; w++)
                ASSERT(c.seen[w] <= 1);
            ASSERT_EQ(c.bad_bound, 0);
            free(c.hits);
        }
        loom__team_free(t);
    }
    loom__team_free(NULL);
}

int main(void) {
    RUN(status_names_and_messages);
    RUN(philox_known_answers);
    RUN(uniform_floats_are_in_range_and_keyed);
    RUN(no_leaks_and_failed_allocations_are_reported);
    RUN(a_team_of_cores_covers_every_index_once);
    return HARNESS_EXIT();
}
