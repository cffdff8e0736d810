/*
 * test_data.c - IDX reading (plain and gzip'd) with every malformed case reported by file, byte
 * offset and expectation; the missing-dataset message; the loader's batching, per-epoch shuffling
 * from (seed, epoch), and the final short batch kept or dropped.
 */
#include "harness.h"

#include <dirent.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

static void be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}

/* Writes an IDX file (gzip'd if gz) of `n` samples of h x w (or labels if h == 0). */
static void write_idx(const char *path, bool gz, uint32_t magic, int n, int h, int w, size_t cut,
                      int label_value) {
    unsigned char buf[4096];
    size_t k = 0;
    be32(buf, magic), k = 4;
    be32(buf + k, (uint32_t)n), k += 4;
    if (h) {
        be32(buf + k, (uint32_t)h), k += 4;
        be32(buf + k, (uint32_t)w), k += 4;
    }
    int per = h ? h * w : 1;
    for (int i = 0; i < n * per; i++)
        buf[k++] = (unsigned char)(h ? (i * 37) % 256 : (label_value >= 0 ? label_value : i % 10));
    if (cut)
        k = cut;
    if (gz) {
        gzFile f = gzopen(path, "wb");
        gzwrite(f, buf, (unsigned)k);
        gzclose(f);
    } else {
        FILE *f = fopen(path, "wb");
        fwrite(buf, 1, k, f);
        fclose(f);
    }
}

TEST(idx_reads_plain_and_gzip) {
    char img[512], lab[512];
    test_tmp(img, sizeof img, "ok-images.gz");
    test_tmp(lab, sizeof lab, "ok-labels");
    write_idx(img, true, 0x803, 5, 3, 4, 0, -1);
    write_idx(lab, false, 0x801, 5, 0, 0, 0, -1);
    loom_dataset *d = NULL;
    ASSERT_EQ(loom_dataset_load_idx(img, lab, 10, &d), LOOM_OK);
    ASSERT_EQ(loom_dataset_count(d), 5);
    ASSERT_EQ(loom_dataset_sample_ndim(d), 3);
    ASSERT_EQ(loom_dataset_sample_shape(d)[1], 3);
    ASSERT_EQ(loom_dataset_sample_shape(d)[2], 4);
    loom_loader *l = loom_loader_new(d, &(loom_loader_config){.batch_size = 5, .no_shuffle = true});
    loom_batch b;
    ASSERT(loom_loader_next(l, &b));
    ASSERT_EQ(b.n, 5);
    ASSERT(b.x[13] == (float)((13 * 37) % 256) / 255.0f);
    ASSERT_EQ(b.y[3], 3);
    loom_loader_free(l);
    loom_dataset_free(d);
}

typedef struct {
    uint32_t magic;
    size_t cut;
    int label_value;
    int nlabels;
    const char *expect;
} bad_case;

TEST(idx_errors_name_file_offset_and_expectation) {
    const bad_case cases[] = {
        {0x1234, 0, -1, 5, "bad IDX magic 0x00001234 at byte 0, expected 0x00000803"},
        {0x801, 0, -1, 5, "expected 0x00000803 (unsigned bytes, 3 dims)"},
        {0x803, 30, -1, 5, "truncated: expected 60 bytes of data at byte 16, found 14"},
        {0x803, 10, -1, 5, "truncated: expected 12 bytes of IDX dimensions at byte 4, found 6"},
        {0x803, 0, 12, 5, "label 12 at byte 8 is not below 10 classes"},
        {0x803, 0, -1, 4, "has 4 labels but"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char img[512], lab[512];
        test_tmp(img, sizeof img, "bad-images.gz");
        test_tmp(lab, sizeof lab, "bad-labels");
        write_idx(img, true, cases[i].magic, 5, 3, 4, cases[i].cut, -1);
        write_idx(lab, false, 0x801, cases[i].nlabels, 0, 0, 0, cases[i].label_value);
        loom_dataset *d = (loom_dataset *)1;
        ASSERT_EQ(loom_dataset_load_idx(img, lab, 10, &d), LOOM_EFORMAT);
        ASSERT(d == NULL);
        ASSERT_STR_CONTAINS(loom_last_error(), cases[i].expect);
        ASSERT_STR_CONTAINS(loom_last_error(), i == 4 || i == 5 ? "bad-labels" : "bad-images.gz");
    }
}

/* The largest single allocation the library asks for, through the allocator hooks. */
static size_t largest_alloc;
static void *track_malloc(size_t n, void *ud) {
    (void)ud;
    largest_alloc = n > largest_alloc ? n : largest_alloc;
    return malloc(n);
}
static void *track_realloc(void *p, size_t n, void *ud) {
    (void)ud;
    largest_alloc = n > largest_alloc ? n : largest_alloc;
    return realloc(p, n);
}
static void track_free(void *p, void *ud) {
    (void)ud;
    free(p);
}

/* A 16-byte header alone (gzip'd or plain) with the given dims. */
static void write_header(const char *path, bool gz, uint32_t d0, uint32_t d1, uint32_t d2) {
    unsigned char h[16];
    be32(h, 0x803), be32(h + 4, d0), be32(h + 8, d1), be32(h + 12, d2);
    if (gz) {
        gzFile f = gzopen(path, "wb");
        gzwrite(f, h, 16);
        gzclose(f);
    } else {
        FILE *f = fopen(path, "wb");
        fwrite(h, 1, 16, f);
        fclose(f);
    }
}

/* Headers that lie: dims whose product overflows 64 bits (65536 x 2^28 x 2^20 wrapped to 0 and
 * loaded as an empty dataset), and a header claiming 8 GiB with no data after it, which must be
 * refused as truncated without the library asking for memory it could not fill (at most the
 * 1 MiB first buffer of a gzip'd file). A directory and a FIFO are refused at once, not read. */
TEST(idx_headers_that_lie_are_refused_before_allocating) {
    char img[512], lab[512];
    test_tmp(lab, sizeof lab, "lie-labels");
    write_idx(lab, false, 0x801, 5, 0, 0, 0, -1);
    loom_dataset *d = NULL;
    for (int gz = 0; gz < 2; gz++) {
        test_tmp(img, sizeof img, gz ? "lie-images.gz" : "lie-images");
        write_header(img, gz, 65536, 1u << 28, 1u << 20);
        ASSERT_EQ(loom_dataset_load_idx(img, lab, 10, &d), LOOM_EFORMAT);
        ASSERT_STR_CONTAINS(loom_last_error(), "more than 2^33 elements");
        write_header(img, gz, 32768, 512, 512); /* 8 GiB claimed */
        largest_alloc = 0;
        loom_set_allocator(&(loom_allocator){track_malloc, track_realloc, track_free, NULL});
        loom_status s = loom_dataset_load_idx(img, lab, 10, &d);
        loom_set_allocator(NULL);
        ASSERT_EQ(s, LOOM_EFORMAT);
        ASSERT_STR_CONTAINS(loom_last_error(), "truncated");
        if (largest_alloc > (2u << 20))
            FAILF("%s: the library asked for %zu bytes for a file of 16", img, largest_alloc);
    }
    char dir[512];
    test_tmp(dir, sizeof dir, "lie-dir");
    mkdir(dir, 0777);
    ASSERT(loom_dataset_load_idx(dir, lab, 10, &d) != LOOM_OK);
    ASSERT_STR_CONTAINS(loom_last_error(), "is a directory, expected a regular file");
    test_tmp(img, sizeof img, "lie-fifo");
    unlink(img);
    ASSERT_EQ(mkfifo(img, 0666), 0);
    ASSERT(loom_dataset_load_idx(img, lab, 10, &d) != LOOM_OK); /* would block on a FIFO */
    ASSERT_STR_CONTAINS(loom_last_error(), "is a FIFO, expected a regular file");
    unlink(img);
}

/* Cached copies in dir; the newest one's path into entry. */
static int count_idx(const char *dir, char *entry, size_t size) {
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, ".idx"))
            n++, snprintf(entry, size, "%s/%s", dir, e->d_name);
    if (d)
        closedir(d);
    return n;
}

static bool newest_idx(const char *dir, char *entry, size_t size) {
    DIR *d = opendir(dir);
    struct dirent *e;
    struct timespec best = {0, 0};
    bool found = false;
    while (d && (e = readdir(d))) {
        char path[1200];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (!strstr(e->d_name, ".idx") || stat(path, &st) != 0)
            continue;
        if (!found || st.st_mtim.tv_sec > best.tv_sec ||
            (st.st_mtim.tv_sec == best.tv_sec && st.st_mtim.tv_nsec > best.tv_nsec))
            best = st.st_mtim, found = true, snprintf(entry, size, "%s", path);
    }
    if (d)
        closedir(d);
    return found;
}

/* A large gzip'd IDX file is inflated once: later loads read its decompressed copy from the cache
 * (same values), and a damaged copy falls back to the source and is rewritten. */
TEST(large_idx_files_are_cached_decompressed) {
    char img[512], lab[512], cache[512], entry[1300], dir[600];
    test_tmp(cache, sizeof cache, "idx-cache");
    setenv("XDG_CACHE_HOME", cache, 1); /* where the copy goes unless LOOM_DATA_CACHE says */
    const char *where = getenv("LOOM_DATA_CACHE");
    if (where)
        snprintf(dir, sizeof dir, "%s", where);
    else
        snprintf(dir, sizeof dir, "%s/loom/data", cache);
    int before = count_idx(dir, entry, sizeof entry);
    test_tmp(img, sizeof img, "big-images.gz");
    test_tmp(lab, sizeof lab, "big-labels");
    enum { N = 3000, H = 28, W = 28 };
    gzFile f = gzopen(img, "wb0"); /* stored, not deflated: > 1 MiB on disk */
    unsigned char hdr[16];
    be32(hdr, 0x803), be32(hdr + 4, N), be32(hdr + 8, H), be32(hdr + 12, W);
    gzwrite(f, hdr, 16);
    for (int i = 0; i < N * H * W; i++) {
        unsigned char v = (unsigned char)((i * 131) % 251);
        gzwrite(f, &v, 1);
    }
    gzclose(f);
    write_idx(lab, false, 0x801, N, 0, 0, 0, 3);
    loom_dataset *a = NULL, *b = NULL, *c = NULL;
    ASSERT_EQ(loom_dataset_load_idx(img, lab, 10, &a), LOOM_OK);
    ASSERT_EQ(loom_dataset_load_idx(img, lab, 10, &b), LOOM_OK);
    ASSERT_EQ(count_idx(dir, entry, sizeof entry), before + 1);
    ASSERT(newest_idx(dir, entry, sizeof entry));
    ASSERT(truncate(entry, 100) == 0); /* damaged: the source is read again */
    ASSERT_EQ(loom_dataset_load_idx(img, lab, 10, &c), LOOM_OK);
    loom_loader *la =
        loom_loader_new(a, &(loom_loader_config){.batch_size = N, .no_shuffle = true});
    loom_loader *lb =
        loom_loader_new(b, &(loom_loader_config){.batch_size = N, .no_shuffle = true});
    loom_loader *lc =
        loom_loader_new(c, &(loom_loader_config){.batch_size = N, .no_shuffle = true});
    loom_batch ba, bb, bc;
    ASSERT(loom_loader_next(la, &ba) && loom_loader_next(lb, &bb) && loom_loader_next(lc, &bc));
    ASSERT(!memcmp(ba.x, bb.x, sizeof(float) * N * H * W));
    ASSERT(!memcmp(ba.x, bc.x, sizeof(float) * N * H * W));
    ASSERT(ba.x[1000] == (float)((1000 * 131) % 251) / 255.0f);
    loom_loader_free(la), loom_loader_free(lb), loom_loader_free(lc);
    loom_dataset_free(a), loom_dataset_free(b), loom_dataset_free(c);
    unsetenv("XDG_CACHE_HOME");
}

TEST(missing_dataset_says_what_to_do) {
    loom_dataset *d;
    ASSERT_EQ(loom_dataset_fmnist("/nonexistent/dir", "train", &d), LOOM_ENOTFOUND);
    ASSERT_STR_CONTAINS(loom_last_error(), "apt-get install dataset-fashion-mnist");
    ASSERT_STR_CONTAINS(loom_last_error(), "--data");
    ASSERT_EQ(loom_dataset_fmnist(NULL, "validation", &d), LOOM_EINVAL);
}

TEST(loader_shuffles_per_epoch_and_covers_each_sample_once) {
    enum { N = 103 };
    float x[N];
    int32_t y[N];
    for (int i = 0; i < N; i++)
        x[i] = (float)i, y[i] = i % 10;
    int64_t s[1] = {1};
    loom_dataset *d = loom_dataset_from_arrays(N, 1, s, x, y);
    loom_loader *l = loom_loader_new(d, &(loom_loader_config){.batch_size = 10, .seed = 5});
    loom_loader *l2 = loom_loader_new(d, &(loom_loader_config){.batch_size = 10, .seed = 5});
    ASSERT_EQ(loom_loader_batches(l), 11);
    int order[2][N];
    for (int e = 0; e < 2; e++) {
        int seen[N] = {0}, k = 0, batches = 0;
        loom_batch b, b2;
        loom_loader_start_epoch(l, e);
        loom_loader_start_epoch(l2, e);
        while (loom_loader_next(l, &b)) {
            ASSERT(loom_loader_next(l2, &b2));
            ASSERT(!memcmp(b.x, b2.x, sizeof(float) * (size_t)b.n)); /* same (seed, epoch) */
            batches++;
            ASSERT_EQ(b.n, batches == 11 ? 3 : 10); /* the final short batch is kept */
            for (int64_t i = 0; i < b.n; i++) {
                seen[(int)b.x[i]]++;
                order[e][k++] = (int)b.x[i];
            }
        }
        for (int i = 0; i < N; i++)
            ASSERT_EQ(seen[i], 1);
    }
    ASSERT(memcmp(order[0], order[1], sizeof order[0]) != 0); /* epochs differ */
    /* without a call, the end of epoch 1 leads into epoch 2: (seed, 2)'s order */
    ASSERT_EQ(loom_loader_epoch(l), 2);
    loom_batch b3, b4;
    ASSERT(loom_loader_next(l, &b3));
    loom_loader_start_epoch(l2, 2);
    ASSERT(loom_loader_next(l2, &b4));
    ASSERT(!memcmp(b3.x, b4.x, sizeof(float) * 10));
    loom_loader_free(l);
    loom_loader_free(l2);
    l = loom_loader_new(
        d, &(loom_loader_config){.batch_size = 10, .drop_last = true, .no_shuffle = true});
    ASSERT_EQ(loom_loader_batches(l), 10);
    loom_batch b;
    int batches = 0;
    while (loom_loader_next(l, &b)) {
        ASSERT_EQ(b.x[0], batches * 10); /* file order */
        batches++;
    }
    ASSERT_EQ(batches, 10);
    loom_loader_free(l);
    loom_dataset_free(d);
}

/* Batches are assembled one ahead by the loader's thread: the batch in hand is never written
 * while it is held, labels travel with their samples, and restarting an epoch in the middle (with
 * a batch being assembled) starts it from its first batch. */
TEST(loader_assembles_ahead_without_touching_the_batches_in_hand) {
    enum { N = 1000, B = 64 };
    float *x = malloc(sizeof(float) * N * 8);
    int32_t y[N];
    for (int i = 0; i < N; i++) {
        for (int k = 0; k < 8; k++)
            x[i * 8 + k] = (float)i;
        y[i] = i % 7;
    }
    int64_t s[1] = {8};
    loom_dataset *d = loom_dataset_from_arrays(N, 1, s, x, y);
    loom_loader *l = loom_loader_new(d, &(loom_loader_config){.batch_size = B, .seed = 3});
    loom_loader *ref = loom_loader_new(d, &(loom_loader_config){.batch_size = B, .seed = 3});
    loom_batch b, r, prev = {0};
    static float held[2][B * 8]; /* this batch and the one before it (a submitted step's) */
    for (int step = 0; step < 5; step++) {
        ASSERT(loom_loader_next(l, &b));
        memcpy(held[step % 2], b.x, sizeof(float) * (size_t)(b.n * 8));
        struct timespec ts = {0, 2000000}; /* the next batch is being assembled meanwhile */
        nanosleep(&ts, NULL);
        ASSERT(!memcmp(held[step % 2], b.x, sizeof(float) * (size_t)(b.n * 8)));
        ASSERT(step == 0 || !memcmp(held[(step + 1) % 2], prev.x, sizeof(float) * (size_t)(B * 8)));
        ASSERT(step == 0 || prev.x != b.x);
        for (int64_t i = 0; i < b.n; i++)
            ASSERT_EQ(b.y[i], (int32_t)b.x[i * 8] % 7);
        prev = b;
    }
    loom_loader_start_epoch(l, 0); /* mid-epoch, with a batch in flight */
    for (int step = 0; step < 3; step++) {
        ASSERT(loom_loader_next(l, &b));
        ASSERT(loom_loader_next(ref, &r));
        ASSERT_EQ(b.n, r.n);
        ASSERT(!memcmp(b.x, r.x, sizeof(float) * (size_t)(b.n * 8)));
        ASSERT(!memcmp(b.y, r.y, sizeof(int32_t) * (size_t)b.n));
    }
    loom_loader_free(l);
    loom_loader_free(ref);
    loom_dataset_free(d);
    free(x);
}

/* The CPUs of a /proc Cpus_allowed_list ("0-1,3") as a mask (those below 64; ~0 past them). */
static uint64_t cpu_mask(const char *s) {
    uint64_t m = 0;
    while (*s >= '0' && *s <= '9') {
        char *e;
        long lo = strtol(s, &e, 10), hi = lo;
        if (*e == '-')
            hi = strtol(e + 1, &e, 10);
        for (long c = lo; c <= hi; c++)
            m |= c < 64 ? 1ull << c : ~0ull;
        s = *e == ',' ? e + 1 : e;
    }
    return m;
}

/* The CPUs the thread of this process named `name` may run on ("" for the process's own), 0 if
 * there is no such thread. */
static uint64_t thread_cpus(const char *name) {
    char path[512], line[256];
    DIR *dir = *name ? opendir("/proc/self/task") : NULL;
    struct dirent *e = NULL;
    uint64_t m = 0;
    while (!m && (!*name || (dir && (e = readdir(dir))))) {
        FILE *f = NULL;
        if (*name) {
            snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
            f = fopen(path, "r");
            bool named = f && fgets(line, sizeof line, f) && !strncmp(line, name, strlen(name)) &&
                         line[strlen(name)] == '\n';
            if (f)
                fclose(f);
            if (!named)
                continue;
            snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
        } else {
            snprintf(path, sizeof path, "/proc/self/status");
        }
        f = fopen(path, "r");
        while (f && fgets(line, sizeof line, f))
            if (!strncmp(line, "Cpus_allowed_list:", 18))
                m = cpu_mask(line + 18 + strspn(line + 18, " \t"));
        if (f)
            fclose(f);
        if (!*name)
            break;
    }
    if (dir)
        closedir(dir);
    return m;
}

/* A device's thread holds its CPU: a loader's thread keeps to the others (woken there, it would
 * preempt the step), and has them all again once the devices are gone. */
TEST(loader_thread_keeps_off_a_devices_cpu) {
    uint64_t all = thread_cpus("");
    if (__builtin_popcountll(all) < 2 || all == ~0ull) {
        fprintf(stderr, "skip %s: needs 2 to 64 CPUs and /proc\n", harness_current);
        return;
    }
    enum { N = 1000, B = 64 };
    static float x[N];
    int32_t y[N] = {0};
    int64_t s[1] = {1};
    loom_dataset *d = loom_dataset_from_arrays(N, 1, s, x, y);
    loom_devices *devs = loom_devices_new(&(loom_devices_config){.count = 1});
    loom_loader *l = loom_loader_new(d, &(loom_loader_config){.batch_size = B});
    loom_batch b;
    ASSERT(devs && l && loom_loader_next(l, &b)); /* its first batch made with the device up */
    uint64_t dev = thread_cpus("loom-device0"), ld = thread_cpus("loom-loader");
    ASSERT_EQ(dev, all & -all); /* pinned to the first CPU */
    ASSERT_EQ(ld, all & ~dev);
    loom_devices_free(devs);
    for (int k = 0; k < 2; k++) /* the batch assembled now starts after the devices are gone */
        ASSERT(loom_loader_next(l, &b));
    ASSERT_EQ(thread_cpus("loom-loader"), all);
    loom_loader_free(l);
    loom_dataset_free(d);
}

/* So does the thread that runs the devices' steps (it polls for their end): woken onto a
 * device's CPU it waited there for the device's own polling to end. Its CPUs come back when the
 * devices are freed. */
TEST(stepping_thread_keeps_off_a_devices_cpu) {
    uint64_t all = thread_cpus("");
    if (__builtin_popcountll(all) < 2 || all == ~0ull) {
        fprintf(stderr, "skip %s: needs 2 to 64 CPUs and /proc\n", harness_current);
        return;
    }
    loom_devices *devs = loom_devices_new(&(loom_devices_config){.count = 1});
    loom_graph *g = loom_graph_new(NULL);
    ASSERT(devs && g && loom_graph_set_devices(g, devs) == LOOM_OK);
    ASSERT_EQ(thread_cpus(""), all); /* nothing taken before a step */
    float x[4] = {-1, 2, -3, 4};
    loom_tensor *y = loom_relu(g, loom_input(g, LOOM_F32, 1, (int64_t[]){4}, x));
    loom_output(y);
    ASSERT(loom_graph_run(g) == LOOM_OK);
    ASSERT_EQ(((const float *)loom_tensor_data(y))[1], 2.0f);
    uint64_t dev = thread_cpus("loom-device0");
    ASSERT_EQ(dev, all & -all);
    ASSERT_EQ(thread_cpus(""), all & ~dev);
    loom_graph_free(g);
    loom_devices_free(devs);
    ASSERT_EQ(thread_cpus(""), all);
}

int main(void) {
    RUN(idx_reads_plain_and_gzip);
    RUN(idx_headers_that_lie_are_refused_before_allocating);
    RUN(idx_errors_name_file_offset_and_expectation);
    RUN(large_idx_files_are_cached_decompressed);
    RUN(missing_dataset_says_what_to_do);
    RUN(loader_shuffles_per_epoch_and_covers_each_sample_once);
    RUN(loader_assembles_ahead_without_touching_the_batches_in_hand);
    RUN(loader_thread_keeps_off_a_devices_cpu);
    RUN(stepping_thread_keeps_off_a_devices_cpu);
    return HARNESS_EXIT();
}
