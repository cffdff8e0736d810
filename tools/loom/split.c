/*
 * split.c - `--devices auto`: the split of this process's cores into devices of several cores
 * (devices x cores a device = its CPUs) that runs the command's own steps fastest.
 *
 * Each split is timed on the run itself: the command's first steps (8, and more while they take
 * under 0.25 s), from the same initial weights on the same batches, with nothing printed or
 * written, then thrown away; the real run then starts from the beginning on the split that won.
 * Timing replaces a rule of thumb because the answer depends on the model: two devices of one
 * core win where kernels are many and small (the CNNs), one device of two cores where the
 * weights are large or a device's batch small (the MLPs). The split changes the bits (a gradient
 * is summed over another number of shards) but not what the run computes, so the choice is
 * printed, and giving it as --devices D --cores-per-device C repeats the run bit for bit.
 */
#define _GNU_SOURCE
#include "cli.h"

#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

bool cli_trial_more(const double *dt, int64_t n) {
    double s = 0;
    for (int64_t i = CLI_TRIAL_WARM; i < n; i++)
        s += dt[i];
    return n < CLI_TRIAL_MAX && (n < 8 || s < 0.25);
}

/* The median of the steps after the warm-up ones (the first builds the program, the next warms
 * the caches), of those dt holds (a step's time is never 0). */
static double steady(const double *dt) {
    double v[CLI_TRIAL_MAX];
    int n = 0;
    for (int i = CLI_TRIAL_WARM; i < CLI_TRIAL_MAX && dt[i] > 0; i++)
        v[n++] = dt[i];
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Runs trial(ctx, D, C) with stdout on /dev/null: 0 and the steady step time into *s, or the
 * trial's code (its line is on stderr). */
static int timed(cli_trial_fn trial, void *ctx, int D, int C, double *s) {
    double dt[CLI_TRIAL_MAX] = {0};
    fflush(stdout);
    int keep = dup(STDOUT_FILENO), null = open("/dev/null", O_WRONLY);
    if (keep >= 0 && null >= 0)
        dup2(null, STDOUT_FILENO);
    int rc = trial(ctx, D, C, dt);
    fflush(stdout);
    if (keep >= 0 && null >= 0)
        dup2(keep, STDOUT_FILENO);
    if (keep >= 0)
        close(keep);
    if (null >= 0)
        close(null);
    *s = steady(dt);
    return rc;
}

static void name_split(char *buf, size_t cap, int D, int C) {
    snprintf(buf, cap, "%d device%s of %d core%s", D, D > 1 ? "s" : "", C, C > 1 ? "s" : "");
}

int cli_choose_split(cli_trial_fn trial, void *ctx, int64_t *devices, int64_t *cores) {
    if (*devices != CLI_DEVICES_AUTO)
        return 0;
    *devices = 0; /* where nothing is timed: one device per --cores-per-device cores */
    cpu_set_t set;
    int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    /* --cores-per-device given, or across processes (they would have to agree on one split):
     * the library's own rule */
    if (*cores != 0 || loom_mpi_launcher() || n < 2)
        return 0;
    char times[512] = "", name[64];
    int best_d = 0, best_c = 0;
    double best = 0;
    for (int C = 1; C <= n && C <= 64; C++) {
        int D = n / C;
        if (n % C || D > 256)
            continue;
        double s;
        int rc = timed(trial, ctx, D, C, &s);
        if (rc)
            return rc;
        if (best_d == 0 || s < best)
            best = s, best_d = D, best_c = C;
        name_split(name, sizeof name, D, C);
        size_t at = strlen(times);
        snprintf(times + at, sizeof times - at, "%s%s %.1f ms", at ? ", " : "", name, 1e3 * s);
    }
    if (best_d == 0) /* (no split of at most 256 devices of at most 64 cores) */
        return 0;
    name_split(name, sizeof name, best_d, best_c);
    printf("loom: --devices auto: %s (a step: %s; --devices %d --cores-per-device %d repeats "
           "this run)\n",
           name, times, best_d, best_c);
    fflush(stdout);
    *devices = best_d, *cores = best_c;
    return 0;
}
