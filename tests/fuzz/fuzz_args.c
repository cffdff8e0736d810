/*
 * fuzz_args.c - libFuzzer target: the command line of `loom train` / `loom eval`, as arbitrary
 * argument vectors (the input split at NUL bytes; the first byte picks train or eval), through
 * the command's own parser (tools/loom/args.c). It must never crash and must either accept the
 * options or reject them with exit status 2.
 */
#include "../../tools/loom/cli.h"
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int cli_train(const train_opts *o) { /* never reached from the parser */
    (void)o;
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cli_set_errors(fuzz_devnull());
    if (size < 1 || size > 4096)
        return 0;
    char *buf = malloc(size + 1), *argv[64];
    argv[0] = "loom", argv[1] = data[0] & 1 ? "eval" : "train";
    int argc = fuzz_split_args(data, size, buf, argv, 2);
    train_opts o;
    int rc = cli_parse_train(argc, argv, data[0] & 1, &o);
    if (rc != 0 && rc != 2)
        abort();
    free(buf);
    return 0;
}
