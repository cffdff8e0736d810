/*
 * share.c - the sharing mode's choice (loom_devices_config.share): under LOOM_SHARE_AUTO a program
 * that allows sharing runs its first steps both ways and keeps the faster (devices.h).
 */
#include "devices.h"

#include <stdlib.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The step just ended was its trial's: its time (the slowest device's) recorded, and once both
 * ways have their steps, the faster kept. */
void loom__share_timed(loom_devices *D) {
    share_trial *t = D->trying;
    double slowest = 0;
    for (int i = 0; i < D->n; i++)
        slowest = D->dev[i].busy > slowest ? D->dev[i].busy : slowest;
    int at = t->steps % SHARE_STEPS - SHARE_WARM;
    if (at >= 0)
        t->t[D->trying_mode][at] = slowest;
    if (++t->steps == 2 * SHARE_STEPS)
        t->mode =
            median(t->t[1], SHARE_STEPS - SHARE_WARM) < median(t->t[0], SHARE_STEPS - SHARE_WARM);
}

/* Whether program p (which allows it) runs on the shared slabs (loom_devices_config.share). A
 * program without updates shares them where the replicas are behind (they would need making
 * first) and reads its own replica where it is up to date (in its own core's cache). A model m
 * whose parameters and optimizer state pass SHARE_LARGE bytes shares without a trial: no core's
 * cache keeps a replica of it, and each replica would cost that memory again (a 125M-parameter
 * model under AdamW: 1.5 GB a device). */
bool loom__share_choose(loom_devices *D, const loom__program *p, const loom_model *m) {
    D->trying = NULL; /* (a step whose submit failed was never timed) */
    if (D->c.share != LOOM_SHARE_AUTO)
        return D->c.share == LOOM_SHARE_ALWAYS;
    if (m && (double)sizeof(float) * (double)(m->len[LOOM_SLAB_PARAM] + m->len[LOOM_SLAB_STATE]) >
                 SHARE_LARGE)
        return true;
    if (!p->own)
        return D->behind;
    share_trial *t = &D->trials[0];
    for (int k = 0; k < SHARE_TRIALS; k++) {
        if (D->trials[k].hash == p->hash) {
            t = &D->trials[k];
            break;
        }
        if (D->trials[k].used < t->used)
            t = &D->trials[k];
    }
    if (t->hash != p->hash)
        *t = (share_trial){.hash = p->hash, .mode = -1};
    t->used = D->step;
    if (t->mode >= 0)
        return t->mode;
    D->trying = t;
    D->trying_mode = t->steps >= SHARE_STEPS; /* replicas first, then shared */
    return D->trying_mode;
}
