/*
 * main.c - the `loom` command: its subcommands (`train` and `eval` parse their options in
 * args.c), usage and `info`. Every bad argument gets one line and exit status 2.
 */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: loom train RECIPE [options]   train a built-in recipe (fmnist-mlp, fmnist-cnn)\n"
    "       loom train shakespeare-gpt [options]   a character-level GPT on a text (nanoGPT's\n"
    "                                     shakespeare-char run; options below)\n"
    "       loom sample shakespeare-gpt --init FILE [options]   text from trained weights\n"
    "       loom eval shakespeare-gpt --init FILE [options]     their validation loss\n"
    "       loom eval RECIPE --init FILE  test accuracy of a weights file (loom's or PyTorch's)\n"
    "       loom info                     version, backends, BLAS, dataset location\n"
    "       loom cache clear              remove compiled kernels and decompressed datasets\n"
    "\n"
    "train options:\n"
    "  --epochs N          passes over the training set (default 1)\n"
    "  --steps N           stop after N optimizer steps (default: all)\n"
    "  --batch N           batch size (default 128)\n"
    "  --lr X              learning rate (default 0.05 for sgd, 0.001 for adamw)\n"
    "  --momentum X        SGD momentum (default 0.9)\n"
    "  --nesterov          SGD with Nesterov momentum\n"
    "  --optimizer NAME    sgd or adamw (default sgd)\n"
    "  --weight-decay X    L2 penalty for sgd, decoupled decay for adamw (default 0)\n"
    "  --decay-matrices-only  weight decay on parameters of 2 dims or more only (nanoGPT's)\n"
    "  --beta1 X, --beta2 X  AdamW's moment decays (default 0.9, 0.999)\n"
    "  --warmup-steps N    linear learning-rate warm-up over the first N steps (default 0)\n"
    "  --decay-steps N     cosine learning-rate decay down to --min-lr at step N (default: none)\n"
    "  --min-lr X          the learning rate after --decay-steps (default 0)\n"
    "  --clip-norm X       clip the gradients' global norm to X (default: no clipping)\n"
    "  --seed N            seed of initialisation and shuffling (default 0)\n"
    "  --data DIR          Fashion-MNIST directory (default $LOOM_DATA or the Debian path)\n"
    "  --no-shuffle        take batches in file order\n"
    "  --drop-last         drop the final short batch of each epoch\n"
    "  --init FILE         initial weights (safetensors, PyTorch state_dict names)\n"
    "  --save FILE         write the trained weights (safetensors) after training\n"
    "  --log-dir DIR       write DIR/metrics.csv\n"
    "  --devices N|auto    data-parallel devices of this process, one per core it may run on\n"
    "                      by default (auto; under mpirun, per process: give each the same)\n"
    "  --dist auto|local|mpi  across the processes of an MPI job (auto: when started by\n"
    "                      mpirun or mpiexec), or this process alone\n"
    "  --timeout S         seconds before a stuck step fails every device (default 60)\n"
    "  --detect-anomaly    stop a step at its loss, before its update, when the loss is NaN\n"
    "                      or infinite (without it training stops after that step)\n"
    "\n"
    "shakespeare-gpt options (defaults: nanoGPT's CPU run of shakespeare-char):\n"
    "  --data FILE         UTF-8 text, plain or gzip'd (default: the project's Tiny Shakespeare)\n"
    "  --layers N --heads N --width N --context N   the model (4, 4, 128, 64)\n"
    "  --steps N --batch N (2000, 12)   --lr X (1e-3)   --warmup-steps N (100)\n"
    "  --decay-steps N (--steps)   --min-lr X (1e-4)   --weight-decay X (0.1, matrices only)\n"
    "  --clip-norm X (1.0)   --beta2 X (0.99)   --dropout X (0)   --eval-interval N (250)\n"
    "  --seed N   --no-shuffle   --devices N|auto   --timeout S   --init FILE   --save FILE\n"
    "  sample: --tokens N (500)  --temperature X (0.8)  --top-k N (200)  --start TEXT (newline)\n";

/* This process's rank as an MPI launcher's environment gives it (-1: none). */
static int launcher_rank(void) {
    const char *vars[3] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};
    for (int i = 0; i < 3; i++)
        if (getenv(vars[i]))
            return atoi(getenv(vars[i]));
    return -1;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "cache") && argc == 3 && !strcmp(argv[2], "clear")) {
        int64_t files, bytes;
        if (loom_cache_clear(&files, &bytes))
            return cli_fail("cache clear: %s", loom_last_error());
        printf("removed %lld cached files (%.1f MiB)\n", (long long)files,
               (double)bytes / 1048576.0);
        return 0;
    }
    if (!strcmp(argv[1], "info")) {
        char buf[2048];
        loom_info(buf, sizeof buf);
        fputs(buf, stdout);
        return 0;
    }
    if ((!strcmp(argv[1], "train") || !strcmp(argv[1], "sample") || !strcmp(argv[1], "eval")) &&
        argc > 2 && !strcmp(argv[2], "shakespeare-gpt"))
        return cli_gpt(argc, argv);
    if (!strcmp(argv[1], "train") || !strcmp(argv[1], "eval")) {
        train_opts o;
        /* under an MPI launcher every process parses the same arguments: process 0 alone says
         * what is wrong with them (one line for the job) */
        FILE *quiet = launcher_rank() > 0 ? fopen("/dev/null", "w") : NULL;
        if (quiet)
            cli_set_errors(quiet);
        int rc = cli_parse_train(argc, argv, !strcmp(argv[1], "eval"), &o);
        if (quiet)
            cli_set_errors(NULL), fclose(quiet);
        return rc ? rc : cli_train(&o);
    }
    cli_fail("unknown command '%s' (expected train, eval, info or cache clear; see loom --help)",
             argv[1]);
    return 2;
}
