/*
 * cpu.c - the CPU executor: a program's generated kernels rendered as C (codegen.c), built by the
 * system compiler or found in the disk cache (cc.c) and loaded; steps run by interp.c, which
 * calls them and runs the library kernels (products, pooling, row kernels, collectives).
 */
#include "internal.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static loom_status cpu_build(const loom__executor *x, loom__program *p, bool *compiled) {
    (void)x;
    uint64_t key;
    char *src = loom__codegen(p, &key);
    loom_status st = src ? loom__cc_load(src, key, &p->target, compiled) : LOOM_ENOMEM;
    loom__free(src);
    for (int64_t k = 0; !st && k < p->nfused; k++) {
        char name[40];
        snprintf(name, sizeof name, "loom_k%d", p->fused[k].root);
        void *sym = dlsym(p->target, name);
        memcpy(&p->fused[k].fn, &sym, sizeof sym); /* object pointer to function pointer */
        st = sym ? LOOM_OK : LOOM_EINTERNAL;
        p->fused[k].extent = loom__kernel_extent(p, &p->fused[k], &p->fused[k].work);
        if (!st && p->fused[k].epi_of >= 0) {
            snprintf(name, sizeof name, "loom_k%d_part", p->fused[k].root);
            sym = dlsym(p->target, name);
            memcpy(&p->fused[k].part, &sym, sizeof sym);
            st = sym ? LOOM_OK : LOOM_EINTERNAL;
        }
    }
    if (st && p->target) {
        dlclose(p->target);
        p->target = NULL;
    }
    return st;
}

static loom_status cpu_run(const loom__executor *x, const loom__program *p, const loom__bind *b) {
    (void)x;
    return loom__interp_run(p, b);
}

static void cpu_release(const loom__executor *x, loom__program *p) {
    (void)x;
    if (p->target)
        dlclose(p->target);
    p->target = NULL;
}

const loom__executor loom__cpu_executor = {
    .name = "cpu", .build = cpu_build, .run = cpu_run, .release = cpu_release};

bool loom__executor_runs(const loom__executor *x, const char *rule) {
    if (!x || !x->forms)
        return true;
    for (const char *const *f = x->forms; *f; f++)
        if (!strcmp(*f, rule))
            return true;
    return false;
}

static const loom__executor *default_executor;

void loom__set_executor(const loom__executor *x) {
    default_executor = x;
}

const loom__executor *loom__executor_default(void) {
    if (default_executor)
        return default_executor;
    return loom__getenv()->check ? &loom__check_executor : &loom__cpu_executor;
}
