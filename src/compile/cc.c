/*
 * cc.c - the system C compiler and the disk cache of compiled kernels. A program's source is
 * keyed by the hash of its text, the compiler's identity and flags and loom's version; the shared
 * object lives at $XDG_CACHE_HOME/loom/<key>.so (or ~/.cache/loom). Builds go to a temporary name
 * and are renamed into place, so processes compiling the same program at once all succeed. Each
 * entry ends in a trailer, "loomsum1" and the 64-bit hash of every byte before it, that is checked
 * before the entry is given to dlopen: a truncated or damaged file (dlopen of a short ELF file
 * dies of SIGBUS) is rebuilt, as is one that fails to load or whose embedded key differs.
 */
#include "internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* -ffp-contract=off: the interpreter's arithmetic, operation for operation (no fused
 * multiply-adds), so results are bitwise the same; -fno-trapping-math: comparisons may be
 * if-converted into vector selects (the values do not change, only whether an FP exception
 * could be raised, which loom never reads), so branch-free functions such as loom_erff
 * (graph/opmath.h) run as vector code; -fno-math-errno: sqrt needs no errno check around it
 * (a negative operand's NaN is the same), so an update with one vectorizes;
 * -mprefer-vector-width=512: loops in 16 float lanes where the CPU has AVX-512, not gcc's
 * default 8 (GELU's forward and backward measured 25% and 10% faster; each element's arithmetic
 * is the same, so are the values) */
#define CC_FLAGS                                                                                 \
    "-O3 -march=native -mprefer-vector-width=512 -std=c11 -ffp-contract=off -fno-trapping-math " \
    "-fno-math-errno -fPIC "                                                                     \
    "-shared -w"
#define MAX_ARGS      64 /* words of $CC and CC_FLAGS together, and the file names */
/* The trailer's magic; also in the compiler identity, so entries of other formats are not found
 * (and not called damaged). */
#define TRAILER       "loomsum1"
#define TRAILER_BYTES 16
#define MAX_ENTRY     (256 << 20) /* bytes: no program's kernels come near */

static char identity[512];
static bool have_cc;

static const char *compiler(void) {
    const char *cc = getenv("CC");
    return cc && *cc ? cc : "cc";
}

/* The words of s (split on blanks, as make splits $CC: no quoting) appended to argv[*n..], in
 * buf (room for strlen(s) + 1); false if they are more than MAX_ARGS in all. */
static bool split_words(const char *s, char *buf, char **argv, int *n) {
    strcpy(buf, s);
    char *save = NULL; /* (strtok_r: threads may build kernels at once) */
    for (char *w = strtok_r(buf, " \t\n", &save); w; w = strtok_r(NULL, " \t\n", &save)) {
        if (*n >= MAX_ARGS - 1)
            return false;
        argv[(*n)++] = w;
    }
    argv[*n] = NULL;
    return true;
}

/* Runs argv (no shell: an argument vector, the program looked up in PATH) with stdout to fd
 * out_fd and stderr to the file err_path (both /dev/null when -1 / NULL) and waits for it; its
 * exit status, or -1 if it could not be started or did not exit. */
static int spawn_wait(char *const *argv, int out_fd, const char *err_path) {
    posix_spawn_file_actions_t fa;
    if (posix_spawn_file_actions_init(&fa) != 0)
        return -1;
    int rc = 0;
    if (out_fd >= 0)
        rc |= posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
    else
        rc |= posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    rc |= posix_spawn_file_actions_addopen(&fa, 2, err_path ? err_path : "/dev/null",
                                           O_WRONLY | O_CREAT | O_TRUNC, 0666);
    pid_t pid;
    int status = -1;
    if (rc == 0 && posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ) == 0) {
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
        status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    posix_spawn_file_actions_destroy(&fa);
    return status;
}

/* The first line that `$CC --version` prints into line (empty when it fails); its status. */
static int cc_version(char *line, size_t size) {
    char words[600], *argv[MAX_ARGS];
    int n = 0, fds[2], status = -1;
    line[0] = 0;
    if (strlen(compiler()) >= sizeof words - 1 || !split_words(compiler(), words, argv, &n) ||
        n == 0 || n + 1 >= MAX_ARGS || pipe(fds) != 0)
        return -1;
    argv[n++] = "--version", argv[n] = NULL;
    fcntl(fds[0], F_SETFD, FD_CLOEXEC);
    status = spawn_wait(argv, fds[1], NULL);
    close(fds[1]);
    FILE *f = fdopen(fds[0], "r");
    if (!f || !fgets(line, (int)size, f))
        line[0] = 0;
    if (f)
        fclose(f);
    else
        close(fds[0]);
    return status;
}

static void probe(void) {
    char line[256];
    have_cc = cc_version(line, sizeof line) == 0 && line[0];
    line[strcspn(line, "\n")] = 0;
    snprintf(identity, sizeof identity, "%s | %s | %s | %s", compiler(), line, CC_FLAGS, TRAILER);
    if (!have_cc)
        loom__log(LOOM_LOG_WARN, "no C compiler ('%s --version' failed): kernels are interpreted",
                  compiler());
}

const char *loom__cc_identity(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, probe);
    return have_cc ? identity : NULL;
}

static bool write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f)
        return false;
    bool ok = fputs(text, f) >= 0;
    return (fclose(f) == 0) && ok;
}

/* The whole of regular file path (at most MAX_ENTRY bytes) in a new buffer, its size in *size;
 * NULL if it cannot be read. */
static unsigned char *slurp(const char *path, int64_t *size) {
    int fd;
    if (loom__open_regular(path, &fd, size))
        return NULL;
    unsigned char *buf = *size > 0 && *size <= MAX_ENTRY ? loom__malloc((size_t)*size) : NULL;
    if (buf && loom__read_at(fd, path, buf, (size_t)*size, 0, "a kernel cache entry"))
        loom__free(buf), buf = NULL;
    close(fd);
    return buf;
}

static uint64_t body_hash(const unsigned char *buf, size_t n) {
    loom__hash h;
    loom__hash_init(&h);
    loom__hash_large(&h, buf, n);
    return loom__hash_final(&h);
}

bool loom__cc_entry_intact(const char *path) {
    int64_t size;
    unsigned char *buf = slurp(path, &size);
    bool ok = false;
    if (buf && size >= TRAILER_BYTES) {
        const unsigned char *t = buf + size - TRAILER_BYTES;
        uint64_t want = 0;
        for (int i = 0; i < 8; i++)
            want |= (uint64_t)t[8 + i] << (8 * i);
        ok = memcmp(t, TRAILER, 8) == 0 && body_hash(buf, (size_t)size - TRAILER_BYTES) == want;
    }
    loom__free(buf);
    return ok;
}

/* Appends the trailer to a freshly built entry; false if it cannot. */
static bool seal(const char *path) {
    int64_t size;
    unsigned char *buf = slurp(path, &size), t[TRAILER_BYTES];
    if (!buf)
        return false;
    uint64_t h = body_hash(buf, (size_t)size);
    loom__free(buf);
    memcpy(t, TRAILER, 8);
    for (int i = 0; i < 8; i++)
        t[8 + i] = (unsigned char)(h >> (8 * i));
    FILE *f = fopen(path, "ab");
    bool ok = f && fwrite(t, 1, TRAILER_BYTES, f) == TRAILER_BYTES;
    return (f && fclose(f) == 0) && ok;
}

/* Loads path and checks its embedded key; NULL (closed) if it is not the wanted build. */
static void *open_checked(const char *path, uint64_t key) {
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl)
        return NULL;
    const char *k = dlsym(dl, "loom_key");
    char want[17];
    snprintf(want, sizeof want, "%016llx", (unsigned long long)key);
    if (!k || strcmp(k, want) != 0) {
        dlclose(dl);
        return NULL;
    }
    return dl;
}

static void dump(const char *src, uint64_t key) {
    const char *dir = loom__getenv()->dump;
    if (!dir)
        return;
    char path[4096];
    mkdir(dir, 0777);
    snprintf(path, sizeof path, "%s/%016llx.c", dir, (unsigned long long)key);
    if (!write_file(path, src))
        loom__log(LOOM_LOG_WARN, "LOOM_DUMP: cannot write %s", path);
}

/* Runs $CC CC_FLAGS -o so c -lm, its messages into log; true if it exits 0. */
static bool compile(const char *so, const char *c, const char *log) {
    char words[1200], buf[1200], *argv[MAX_ARGS];
    int n = 0;
    if (snprintf(words, sizeof words, "%s %s", compiler(), CC_FLAGS) >= (int)sizeof words ||
        !split_words(words, buf, argv, &n) || n + 5 > MAX_ARGS)
        return false;
    const char *tail[] = {"-o", so, c, "-lm", NULL};
    for (int i = 0; i < 5; i++)
        argv[n++] = (char *)(uintptr_t)tail[i];
    return spawn_wait(argv, -1, log) == 0;
}

/* Compiles src into dir/<key>.so through temporary names (<key>.so.tmp.<pid>.<tag>, and the
 * same for the source and the compiler's log, which `loom cache clear` leaves to a writer that
 * runs); false with a logged reason. A build whose temporary files went while it ran is tried
 * once more. */
static bool build(const char *dir, const char *src, uint64_t key) {
    char so[4200], c[4200], c_tmp[4300], so_tmp[4300], log[4200], log_tmp[4300];
    /* temporary names of this process and thread: those of a killed build of this key are
     * removed first */
    unsigned long tag = (unsigned long)(uintptr_t)&tag >> 4;
    snprintf(so, sizeof so, "%s/%016llx.so", dir, (unsigned long long)key);
    snprintf(c, sizeof c, "%s/%016llx.c", dir, (unsigned long long)key);
    snprintf(log, sizeof log, "%s/%016llx.log", dir, (unsigned long long)key);
    snprintf(c_tmp, sizeof c_tmp, "%s.tmp.%ld.%lx.c", c, (long)getpid(), tag); /* (gcc: .c) */
    snprintf(so_tmp, sizeof so_tmp, "%s.tmp.%ld.%lx", so, (long)getpid(), tag);
    snprintf(log_tmp, sizeof log_tmp, "%s.tmp.%ld.%lx", log, (long)getpid(), tag);
    loom__remove_stale_temps(so);
    loom__remove_stale_temps(c);
    loom__remove_stale_temps(log);
    bool ok = false;
    for (int attempt = 0; attempt < 2 && !ok; attempt++) {
        if (!write_file(c_tmp, src)) {
            loom__log(LOOM_LOG_WARN, "cannot write %s: kernels are interpreted", c_tmp);
            return false;
        }
        ok = compile(so_tmp, c_tmp, log_tmp) && seal(so_tmp) && rename(so_tmp, so) == 0;
        bool lost = !ok && (access(c_tmp, F_OK) != 0 || access(log_tmp, F_OK) != 0);
        unlink(c_tmp);
        unlink(so_tmp);
        if (!lost)
            break;
        loom__log(LOOM_LOG_WARN, "the files of a kernel build went while it ran: building again");
    }
    if (ok)
        unlink(log_tmp);
    else if (rename(log_tmp, log) == 0)
        loom__log(LOOM_LOG_WARN, "compiling kernels failed (see %s): they are interpreted", log);
    else
        loom__log(LOOM_LOG_WARN, "compiling kernels failed: they are interpreted");
    return ok;
}

loom_status loom__cc_load(const char *src, uint64_t key, void **dl, bool *compiled) {
    *dl = NULL;
    *compiled = false;
    if (!loom__cc_identity())
        return LOOM_EUNSUPPORTED;
    char dir[4096], so[4200];
    _Static_assert(sizeof so > sizeof dir + 24, "room for /<key>.so");
    if (!loom__cache_dir("", dir, sizeof dir)) {
        loom__log(LOOM_LOG_WARN, "cannot create the kernel cache %s: kernels are interpreted", dir);
        return LOOM_EUNSUPPORTED;
    }
    dump(src, key);
    snprintf(so, sizeof so, "%s/%016llx.so", dir, (unsigned long long)key);
    if (loom__cc_entry_intact(so) && (*dl = open_checked(so, key)))
        return LOOM_OK;
    if (access(so, F_OK) == 0) /* present but corrupt, truncated or another build: rebuild */
        loom__log(LOOM_LOG_WARN, "kernel cache entry %s is damaged: rebuilding it", so);
    if (!build(dir, src, key))
        return LOOM_EUNSUPPORTED;
    *compiled = true;
    *dl = loom__cc_entry_intact(so) ? open_checked(so, key) : NULL;
    return *dl ? LOOM_OK : LOOM_EUNSUPPORTED;
}
