/*
 * fuzz.h - shared by the libFuzzer targets: the readers take paths, so each input is written to
 * a file of this process's own (in $TMPDIR or /tmp) and read back through the real entry point.
 */
#ifndef LOOM_FUZZ_H
#define LOOM_FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* /dev/null as a stream, opened once: where the command-line parsers' one line per bad argument
 * goes, thousands of times a second. */
static inline FILE *fuzz_devnull(void) {
    static FILE *null;
    if (!null && !(null = fopen("/dev/null", "w")))
        abort();
    return null;
}

/* The files this process wrote, removed at exit: nothing is left in $TMPDIR (/dev/shm in the
 * suite). */
static char fuzz_written[8][512];

static inline void fuzz_remove_files(void) {
    for (int i = 0; i < 8; i++)
        if (fuzz_written[i][0])
            unlink(fuzz_written[i]);
}

static inline void fuzz_remember(const char *path) {
    for (int i = 0; i < 8; i++) {
        if (!strcmp(fuzz_written[i], path))
            return;
        if (!fuzz_written[i][0]) {
            if (i == 0)
                atexit(fuzz_remove_files);
            snprintf(fuzz_written[i], sizeof fuzz_written[i], "%s", path);
            return;
        }
    }
}

/* Writes data to this process's file number `which` (with the suffix); returns its path. */
static inline const char *fuzz_file(int which, const char *suffix, const uint8_t *data,
                                    size_t size) {
    static char path[4][512];
    const char *dir = getenv("TMPDIR");
    snprintf(path[which], sizeof path[which], "%s/loom-fuzz.%ld.%d%s", dir && *dir ? dir : "/tmp",
             (long)getpid(), which, suffix);
    FILE *f = fopen(path[which], "wb");
    if (!f)
        abort(); /* the fuzzer's own setup, not the code under test */
    if (size && fwrite(data, 1, size, f) != size)
        abort();
    fclose(f);
    fuzz_remember(path[which]);
    return path[which];
}

/* The command-line targets' arguments: the input after its first byte, split at NUL bytes into
 * argv[argc...] (63 arguments at most in all, NULL after them), in buf (room for size bytes);
 * the new argc. */
static inline int fuzz_split_args(const uint8_t *data, size_t size, char *buf, char **argv,
                                  int argc) {
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = 0;
    for (size_t i = 0; i < size - 1 && argc < 63; i += strlen(buf + i) + 1)
        argv[argc++] = buf + i;
    argv[argc] = NULL;
    return argc;
}

#endif
