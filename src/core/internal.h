/*
 * core/internal.h - private declarations shared by every layer: errors and logging, allocation
 * and the bump arena, hashing, the environment (LOOM_* variables, read once) and the clock.
 * Never installed.
 */
#ifndef LOOM_CORE_INTERNAL_H
#define LOOM_CORE_INTERNAL_H

#include "loom.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#define LOOM_ASSERT(cond)                                 \
    do {                                                  \
        if (!(cond))                                      \
            loom__assert_fail(__FILE__, __LINE__, #cond); \
    } while (0)

#if defined(__GNUC__)
#    define LOOM_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#    define LOOM_PRINTF(a, b)
#endif

/* Errors: sets loom_last_error() to the formatted text and returns s. */
loom_status loom__error(loom_status s, const char *fmt, ...) LOOM_PRINTF(2, 3);
void loom__assert_fail(const char *file, int line, const char *cond);
void loom__log(loom_log_level level, const char *fmt, ...) LOOM_PRINTF(2, 3);

/* Allocation through the hooks. loom__xalloc never returns NULL silently: it sets ENOMEM. */
void *loom__malloc(size_t n);
void *loom__calloc(size_t count, size_t size);
void *loom__realloc(void *p, size_t n);
void loom__free(void *p);
char *loom__strdup(const char *s);

/* Bump arena: blocks chained, rewound in O(blocks). Pointers are 16-byte aligned. */
typedef struct loom__arena_block loom__arena_block;
typedef struct {
    loom__arena_block *head; /* current block; earlier blocks follow ->next */
    size_t used;             /* bytes used in head */
} loom__arena;
void *loom__arena_alloc(loom__arena *a, size_t n); /* zeroed; NULL when out of memory */
void loom__arena_reset(loom__arena *a);            /* keeps the largest block */
void loom__arena_free(loom__arena *a);
/* n bytes of the arena holding a copy of src (not cleared first); NULL when out of memory. */
void *loom__arena_copy(loom__arena *a, const void *src, size_t n);

/* 64-bit structural hash (FNV-1a over 8-byte words, finished by a 64-bit mixer). */
typedef struct {
    uint64_t h;
} loom__hash;
void loom__hash_init(loom__hash *h);
void loom__hash_u64(loom__hash *h, uint64_t v);
void loom__hash_bytes(loom__hash *h, const void *p, size_t n);
/* n bytes as four independent FNV lanes of 8-byte words (a byte at a time, megabytes of
 * parameters took milliseconds to checksum): a different value from hash_bytes' */
void loom__hash_large(loom__hash *h, const void *p, size_t n);
uint64_t loom__hash_final(const loom__hash *h);
/* CRC-32C of n bytes at p, continuing crc (0 to start): crc32c.c. */
uint32_t loom__crc32c(uint32_t crc, const void *p, size_t n);

/* The environment, read once per process. */
typedef struct {
    bool metrics;           /* LOOM_METRICS=1 */
    bool profile;           /* LOOM_PROFILE=1: time every kernel, print a table per program */
    bool check;             /* LOOM_CHECK=1: every kernel checked against the reference */
    const char *data;       /* LOOM_DATA, or NULL */
    const char *backend;    /* LOOM_BACKEND (interp or cpu), or NULL */
    const char *dump;       /* LOOM_DUMP: where to write generated sources and schedules */
    const char *matmul;     /* LOOM_MATMUL: "blas" selects OpenBLAS over loom's sgemm */
    const char *data_cache; /* LOOM_DATA_CACHE: where decompressed datasets go, "off": nowhere */
    int64_t fault_write;    /* LOOM_FAULT_WRITE=K: the K-th atomic write is killed halfway (0) */
} loom__env;
const loom__env *loom__getenv(void);

double loom__now(void); /* monotonic seconds */
/* The UTF-8 of code point c (0 to 0x10FFFF) into b (4 bytes at most); its length. */
int loom__utf8_put(int32_t c, char *b);
struct timespec;
/* The CLOCK_REALTIME instant `seconds` from now (clamped to [0, LOOM_MAX_TIMEOUT]), as
 * pthread_cond_timedwait takes it. */
void loom__deadline_in(struct timespec *ts, double seconds);

/* cpus.c: a device thread pinned to `cpu` holds it (hold) and lets it go (!hold); a helper
 * thread (and the thread that runs the devices' steps) calls loom__keep_off_held_cpus() before
 * each job to keep to the CPUs no device holds, where any of its own are left (else it keeps all
 * of its own); called once none are held, it gives the thread back all of its own. */
void loom__cpu_hold(int cpu, bool hold);
void loom__keep_off_held_cpus(void);
void loom__cpus_follow_holds(void); /* the same, only for a thread that has called it before */

/* team.c: the cores of one device. loom__team_new starts size - 1 helper threads (pinned to
 * cpus[0 .. size - 2] and holding them, where cpus is not NULL; named "<name>.<w>"); NULL with
 * the reason on failure. loom__team_for(t, n, align, fn, ctx) runs fn(ctx, lo, hi, w) over
 * near-equal ranges of [0, n), one a core (w: 0 the caller, 1.. the helpers), each bound but n
 * a multiple of align, and returns when all are done; on a NULL team, one core or n <= align,
 * fn(ctx, 0, n, 0) alone. fn must compute each index as it would in one range (the results may
 * not depend on the split) and not fail. A helper's scratch: loom__team_reserve (the caller,
 * between jobs) makes it at least bytes; loom__team_scratch(t, w) is helper w's (NULL for 0). */
typedef struct loom__team loom__team;
typedef void (*loom__range_fn)(void *ctx, int64_t lo, int64_t hi, int w);
loom__team *loom__team_new(int size, const int *cpus, const char *name);
void loom__team_free(loom__team *t);
int loom__team_size(const loom__team *t);
void loom__team_for(loom__team *t, int64_t n, int64_t align, loom__range_fn fn, void *ctx);
bool loom__team_reserve(loom__team *t, size_t bytes);
void *loom__team_scratch(const loom__team *t, int w);

/* fs.c: $XDG_CACHE_HOME/loom/<sub> (or ~/.cache/loom/<sub>) into out, created with its parents;
 * false if it cannot be had. */
bool loom__cache_dir(const char *sub, char *out, size_t size);
bool loom__mkdirs(char *path); /* mkdir -p */
/* Opens path for reading when it is a regular file; a directory, FIFO, socket or device is
 * refused at once (never blocked on). *fd and *size (bytes) on success; ENOTFOUND or EIO with the
 * path and what it is otherwise. */
loom_status loom__open_regular(const char *path, int *fd, int64_t *size);
/* Reads n bytes at byte `at` of fd (path names it); EIO naming `what` and where if they are not
 * all there. */
loom_status loom__read_at(int fd, const char *path, void *buf, size_t n, uint64_t at,
                          const char *what);
/* Removes the temporary files that a killed writer of `path` left (path.tmp.<pid>, or
 * path.tmp.<pid>.<anything>, with no such process); returns how many. */
int loom__remove_stale_temps(const char *path);
/* Writes the n parts (bytes) as path, atomically: into path.tmp.<pid>, fsync, rename over path,
 * fsync of its directory; after a crash at any instant path holds the old file or the new one,
 * never part of either. EIO naming the path and the reason (a full disk: ENOSPC), the temporary
 * removed and path untouched. Under LOOM_FAULT_WRITE=K the process's K-th call kills the process
 * (SIGKILL) once half the temporary is written and synced (for tests of a crash mid-write). */
typedef struct {
    const void *p;
    size_t n;
} loom__part;
loom_status loom__write_atomic(const char *path, const loom__part *parts, int n);

/* Growable array helper: ensures *cap >= need, elements of size `elem`. EN OMEM on failure. */
loom_status loom__grow(void **ptr, int64_t *cap, int64_t need, size_t elem);
/* Scratch of at least need bytes in *buf (*size of them): when smaller, freed and allocated anew,
 * not realloc'd (nothing in it outlives a use, and a copy would hold both at once). ENOMEM on
 * failure, with *buf NULL and *size 0. */
loom_status loom__scratch(void **buf, size_t *size, size_t need);

/* json.c: a JSON document as a tree. Nodes in one array (v[0] the root), children linked by index
 * (-1: none); a member's key (unescaped, NUL-terminated) in key/klen; a string's bytes
 * (unescaped, NUL-terminated, may hold NULs) and a number's source text in s/len. */
typedef enum {
    LOOM__JNULL,
    LOOM__JBOOL,
    LOOM__JNUM,
    LOOM__JSTR,
    LOOM__JARR,
    LOOM__JOBJ
} loom__jkind;
typedef struct {
    loom__jkind kind;
    bool b;
    double num;
    const char *s, *key;
    int64_t len, klen;
    int64_t child, next, count; /* first child, next sibling, number of children */
} loom__jnode;
typedef struct {
    loom__jnode *v;
    int64_t n, cap;
    char *text;  /* the text, its strings unescaped in place */
    size_t size; /* its bytes */
} loom__json;
/* Parses text (n bytes; path names it in messages): EFORMAT naming the byte and what was
 * expected, ENOMEM. loom__json_read reads a regular file of at most 2 GiB first. */
loom_status loom__json_parse(const char *text, size_t n, const char *path, loom__json *out);
loom_status loom__json_read(const char *path, loom__json *out);
void loom__json_free(loom__json *d);
const loom__jnode *loom__json_root(const loom__json *d);
const loom__jnode *loom__json_first(const loom__json *d, const loom__jnode *v);
const loom__jnode *loom__json_next(const loom__json *d, const loom__jnode *v);
/* Member `key` of object obj (the last of equal keys), or NULL (also when obj is no object). */
const loom__jnode *loom__json_get(const loom__json *d, const loom__jnode *obj, const char *key);
bool loom__json_is_str(const loom__jnode *v, const char *s);
/* Whether v is a number with an integer value below 2^53 in magnitude: then *out. */
bool loom__json_int(const loom__jnode *v, int64_t *out);
/* Member `key` of object obj set to the string value (replaced where it is, else added last);
 * key and value are not copied and must outlive d. ENOMEM; obj and every node pointer of d may
 * move. */
loom_status loom__json_set_str(loom__json *d, const loom__jnode *obj, const char *key,
                               const char *value);
/* A growing string (NUL-terminated; err once an allocation failed). */
typedef struct {
    char *s;
    int64_t len, cap;
    bool err;
} loom__strbuf;
void loom__strbuf_add(loom__strbuf *b, const char *s, size_t n);
/* v as JSON text, indented by two spaces a level (as Python's json.dump(indent=2)), numbers as
 * their source wrote them. */
void loom__json_write(loom__strbuf *b, const loom__json *d, const loom__jnode *v, int depth);

#endif
