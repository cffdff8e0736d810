/*
 * fuzz.h - shared by the libFuzzer targets: the readers take paths, so each input is written to
 * a file of this process's own (in $TMPDIR or /tmp) and read back through the real entry point.
 */
#ifndef LOOM_FUZZ_H
#define LOOM_FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

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
    return path[which];
}

#endif
