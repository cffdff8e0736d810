/*
 * status.c - the status table, the thread-local detailed error message, logging and the abort
 * hook. The library never prints directly: everything goes through the log hook, whose default
 * writes one line to stderr.
 */
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static _Thread_local char last_error[1024];

const char *loom_status_name(loom_status s) {
    switch (s) {
#define NAME_CASE(name, value, msg) \
    case LOOM_##name:               \
        return #name;
        LOOM_STATUS_MAP(NAME_CASE)
#undef NAME_CASE
    }
    return "UNKNOWN";
}

const char *loom_status_str(loom_status s) {
    switch (s) {
#define STR_CASE(name, value, msg) \
    case LOOM_##name:              \
        return msg;
        LOOM_STATUS_MAP(STR_CASE)
#undef STR_CASE
    }
    return "unknown status";
}

const char *loom_last_error(void) {
    return last_error;
}

loom_status loom__error(loom_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return s;
}

static void default_log(loom_log_level level, const char *msg, void *ud) {
    (void)ud;
    if (level < LOOM_LOG_INFO)
        return;
    fprintf(stderr, "%s%s\n", level >= LOOM_LOG_WARN ? "loom: " : "", msg);
}

static loom_log_fn log_fn = default_log;
static void *log_ud;
static void (*abort_fn)(const char *, const char *);

void loom_set_log_hook(loom_log_fn fn, void *ud) {
    log_fn = fn ? fn : default_log;
    log_ud = fn ? ud : NULL;
}

void loom_set_abort_hook(void (*fn)(const char *where, const char *what)) {
    abort_fn = fn;
}

void loom__log(loom_log_level level, const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    log_fn(level, buf, log_ud);
}

void loom__assert_fail(const char *file, int line, const char *cond) {
    char where[512];
    snprintf(where, sizeof where, "%s:%d", file, line);
    loom__log(LOOM_LOG_ERROR, "internal error at %s: assertion '%s' failed", where, cond);
    if (abort_fn)
        abort_fn(where, cond);
    abort();
}

int loom__utf8_put(int32_t c, char *b) {
    if (c < 0x80)
        return b[0] = (char)c, 1;
    if (c < 0x800)
        return b[0] = (char)(0xC0 | c >> 6), b[1] = (char)(0x80 | (c & 0x3F)), 2;
    if (c < 0x10000)
        return b[0] = (char)(0xE0 | c >> 12), b[1] = (char)(0x80 | (c >> 6 & 0x3F)),
               b[2] = (char)(0x80 | (c & 0x3F)), 3;
    return b[0] = (char)(0xF0 | c >> 18), b[1] = (char)(0x80 | (c >> 12 & 0x3F)),
           b[2] = (char)(0x80 | (c >> 6 & 0x3F)), b[3] = (char)(0x80 | (c & 0x3F)), 4;
}

bool loom_size_mul(int64_t a, int64_t b, int64_t limit, int64_t *out) {
    int64_t p;
    if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &p) || p > limit)
        return false;
    *out = p;
    return true;
}

void loom__deadline_in(struct timespec *ts, double seconds) {
    clock_gettime(CLOCK_REALTIME, ts);
    /* (bounded: a deadline past time_t's range would make every timed wait fail at once) */
    seconds = seconds > 0 ? (seconds < LOOM_MAX_TIMEOUT ? seconds : LOOM_MAX_TIMEOUT) : 0;
    double t = (double)ts->tv_nsec * 1e-9 + seconds;
    ts->tv_sec += (time_t)t;
    ts->tv_nsec = (long)((t - (double)(time_t)t) * 1e9);
}

double loom__now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static loom__env env;
static char env_error[256]; /* the first variable with a value it does not take */

/* The value of variable `name` when it is one of `values` (NULL-terminated), or unset or empty
 * (NULL); otherwise NULL and env_error says so. */
static const char *one_of(const char *name, const char *const *values) {
    const char *v = getenv(name);
    if (!v || !*v)
        return NULL;
    for (int i = 0; values[i]; i++)
        if (!strcmp(v, values[i]))
            return values[i];
    if (!env_error[0]) {
        size_t k = (size_t)snprintf(env_error, sizeof env_error, "%s='%.64s': expected ", name, v);
        for (int i = 0; values[i] && k < sizeof env_error; i++)
            k += (size_t)snprintf(env_error + k, sizeof env_error - k, "%s%s",
                                  i == 0          ? ""
                                  : values[i + 1] ? ", "
                                                  : " or ",
                                  values[i]);
        if (k < sizeof env_error)
            snprintf(env_error + k, sizeof env_error - k, " (or unset)");
    }
    return NULL;
}

static void read_env(void) {
    static const char *const flag[] = {"0", "1", NULL}, *const backends[] = {"cpu", "interp", NULL},
                             *const matmuls[] = {"loom", "blas", NULL};
    const char *m = one_of("LOOM_METRICS", flag);
    env.metrics = m && !strcmp(m, "1");
    const char *pr = one_of("LOOM_PROFILE", flag);
    env.profile = pr && !strcmp(pr, "1");
    const char *ck = one_of("LOOM_CHECK", flag);
    env.check = ck && !strcmp(ck, "1");
    const char *d = getenv("LOOM_DATA");
    env.data = d && *d ? d : NULL;
    env.backend = one_of("LOOM_BACKEND", backends);
    const char *dump = getenv("LOOM_DUMP");
    env.dump = dump && *dump ? dump : NULL;
    env.matmul = one_of("LOOM_MATMUL", matmuls);
    const char *dc = getenv("LOOM_DATA_CACHE");
    env.data_cache = dc && *dc ? dc : NULL;
    const char *fw = getenv("LOOM_FAULT_WRITE");
    char *end = NULL;
    long long k = fw && *fw ? strtoll(fw, &end, 10) : 0;
    if (fw && *fw && (*end || k < 1) && !env_error[0])
        snprintf(env_error, sizeof env_error,
                 "LOOM_FAULT_WRITE='%.64s': expected a count of writes from 1 (or unset)", fw);
    env.fault_write = fw && *fw && !*end && k >= 1 ? (int64_t)k : 0;
}

const loom__env *loom__getenv(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, read_env);
    return &env;
}

loom_status loom_env_check(void) {
    loom__getenv();
    return env_error[0] ? loom__error(LOOM_EINVAL, "%s", env_error) : LOOM_OK;
}
