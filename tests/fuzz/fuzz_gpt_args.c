/*
 * fuzz_gpt_args.c - libFuzzer target: the command line of `loom train|eval|sample
 * shakespeare-gpt`, as arbitrary argument vectors (the input split at NUL bytes; the first byte
 * picks the command), through the command's own parser (tools/loom/gpt.c) up to the point where
 * the run would allocate: an accepted vector must leave every size that is allocated from within
 * its bound (the batch and validation buffers, the blocks' parameters, the sampled tokens), and a
 * rejected one exit status 2. Never a crash, never a wrapped product. (The shape --init's file
 * records replaces the options not given, and is bounded the same way: cli_gpt.)
 */
#include "../../tools/loom/cli.h"
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* a * b, aborting (a finding) when it wraps or passes limit */
static int64_t product(int64_t a, int64_t b, int64_t limit) {
    int64_t p;
    if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &p) || p > limit)
        abort();
    return p;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cli_set_errors(fuzz_devnull());
    if (size < 1 || size > 4096)
        return 0;
    static const char *const commands[3] = {"train", "eval", "sample"};
    char *buf = malloc(size + 1), *argv[64];
    argv[0] = "loom", argv[1] = (char *)(uintptr_t)commands[data[0] % 3];
    argv[2] = "shakespeare-gpt";
    int argc = fuzz_split_args(data, size, buf, argv, 3);
    gpt_opts o;
    int rc = cli_gpt_parse(argc, argv, &o);
    if (rc != 0 && rc != 2)
        abort();
    if (rc == 0) { /* what the run allocates from these, before anything else could refuse */
        int64_t rows = o.batch > VAL_ROWS ? o.batch : VAL_ROWS, w = o.shape.width;
        product(product(rows, o.shape.context, CLI_MAX_BATCH_ELEMS), 4, INT64_MAX);
        product(o.shape.layers, product(12, product(w, w, INT64_MAX), INT64_MAX), (int64_t)1 << 31);
        product(o.tokens + (int64_t)strlen(o.start) + 1, 4, INT64_MAX);
        /* (with --init, heads dividing width is checked once the file's shape is merged) */
        bool whole = !o.init || o.given == 15;
        if (o.devices < CLI_DEVICES_AUTO || o.devices > 256 ||
            !(o.timeout >= 0 && o.timeout <= 1e6) || o.min_lr > o.lr ||
            (whole && o.shape.width % o.shape.heads != 0) || o.decay <= o.warmup)
            abort();
    }
    free(buf);
    return 0;
}
