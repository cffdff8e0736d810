/*
 * alloc.c - every allocation of the library goes through one set of hooks (so that tests can
 * count leaks and inject failures), plus the bump arena that holds the nodes of a step.
 * Arena invariant: blocks form a list, head is the one being filled; reset keeps only the
 * largest block so that a steady-state step allocates nothing.
 */
#define _GNU_SOURCE /* madvise's MADV_HUGEPAGE */
#include "internal.h"

#include <stdint.h>
#include <sys/mman.h>

#include <stdlib.h>
#include <string.h>

static void *sys_malloc(size_t n, void *ud) {
    (void)ud;
    return malloc(n);
}
static void *sys_realloc(void *p, size_t n, void *ud) {
    (void)ud;
    return realloc(p, n);
}
static void sys_free(void *p, void *ud) {
    (void)ud;
    free(p);
}

static loom_allocator alloc = {sys_malloc, sys_realloc, sys_free, NULL};

void loom_set_allocator(const loom_allocator *a) {
    if (a)
        alloc = *a;
    else
        alloc = (loom_allocator){sys_malloc, sys_realloc, sys_free, NULL};
}

void *loom__malloc(size_t n) {
    void *p = alloc.malloc_fn(n ? n : 1, alloc.ud);
    if (!p)
        loom__error(LOOM_ENOMEM, "out of memory allocating %zu bytes", n);
    return p;
}

void *loom__calloc(size_t count, size_t size) {
    if (size && count > SIZE_MAX / size) {
        loom__error(LOOM_ENOMEM, "allocation of %zu x %zu bytes overflows", count, size);
        return NULL;
    }
    void *p = loom__malloc(count * size);
    if (p)
        memset(p, 0, count * size);
    return p;
}

void *loom__realloc(void *p, size_t n) {
    void *q = alloc.realloc_fn(p, n ? n : 1, alloc.ud);
    if (!q)
        loom__error(LOOM_ENOMEM, "out of memory reallocating %zu bytes", n);
    return q;
}

void loom__free(void *p) {
    if (p)
        alloc.free_fn(p, alloc.ud);
}

char *loom__strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = loom__malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

loom_status loom__grow(void **ptr, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap)
        return LOOM_OK;
    int64_t n = *cap ? *cap : 16;
    while (n < need)
        n *= 2;
    void *q = loom__realloc(*ptr, (size_t)n * elem);
    if (!q)
        return LOOM_ENOMEM;
    *ptr = q;
    *cap = n;
    return LOOM_OK;
}

/* Asks the kernel to back the whole 2 MiB pages of [p, p + n) with 2 MiB pages (only advice;
 * ignored where unsupported): a step's workspace is tens of MB walked by every kernel, which
 * 4 KB pages would spread over more pages than the TLB holds. */
static void huge_pages(void *p, size_t n) {
#ifdef MADV_HUGEPAGE
    uintptr_t a = ((uintptr_t)p + (2u << 20) - 1) & ~(uintptr_t)((2u << 20) - 1);
    uintptr_t e = ((uintptr_t)p + n) & ~(uintptr_t)((2u << 20) - 1);
    if (e > a)
        (void)madvise((void *)a, e - a, MADV_HUGEPAGE);
#else
    (void)p, (void)n;
#endif
}

loom_status loom__scratch(void **buf, size_t *size, size_t need) {
    if (need <= *size)
        return LOOM_OK;
    loom__free(*buf);
    *size = 0;
    if (!(*buf = loom__malloc(need)))
        return LOOM_ENOMEM;
    *size = need;
    huge_pages(*buf, need);
    return LOOM_OK;
}

struct loom__arena_block {
    loom__arena_block *next;
    size_t size;
    _Alignas(16) unsigned char data[];
};

/* n bytes of the arena, not cleared. */
static void *arena_take(loom__arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->used + n > a->head->size) {
        size_t size = a->head ? a->head->size * 2 : 64 * 1024;
        while (size < n)
            size *= 2;
        loom__arena_block *b = loom__malloc(sizeof *b + size);
        if (!b)
            return NULL;
        b->next = a->head;
        b->size = size;
        a->head = b;
        a->used = 0;
    }
    void *p = a->head->data + a->used;
    a->used += n;
    return p;
}

void *loom__arena_alloc(loom__arena *a, size_t n) {
    void *p = arena_take(a, n);
    if (p)
        memset(p, 0, n);
    return p;
}

void *loom__arena_copy(loom__arena *a, const void *src, size_t n) {
    void *p = arena_take(a, n);
    if (p && n)
        memcpy(p, src, n);
    return p;
}

void loom__arena_reset(loom__arena *a) {
    if (!a->head)
        return;
    /* The head is the largest block (sizes double); drop the rest. */
    loom__arena_block *b = a->head->next;
    while (b) {
        loom__arena_block *next = b->next;
        loom__free(b);
        b = next;
    }
    a->head->next = NULL;
    a->used = 0;
}

void loom__arena_free(loom__arena *a) {
    loom__arena_block *b = a->head;
    while (b) {
        loom__arena_block *next = b->next;
        loom__free(b);
        b = next;
    }
    a->head = NULL;
    a->used = 0;
}
