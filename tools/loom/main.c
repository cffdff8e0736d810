/*
 * main.c - the `loom` command: argument parsing for `train` and `info`. Every bad argument gets
 * one line naming the flag, the value and what was expected, and exit status 2.
 */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("loom: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

static const char usage[] =
    "usage: loom train RECIPE [options]   train a built-in recipe (fmnist-mlp, fmnist-cnn)\n"
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
    "  --seed N            seed of initialisation and shuffling (default 0)\n"
    "  --data DIR          Fashion-MNIST directory (default $LOOM_DATA or the Debian path)\n"
    "  --no-shuffle        take batches in file order\n"
    "  --drop-last         drop the final short batch of each epoch\n"
    "  --init FILE         initial weights (safetensors, PyTorch state_dict names)\n"
    "  --save FILE         write the trained weights (safetensors) after training\n"
    "  --log-dir DIR       write DIR/metrics.csv\n"
    "  --devices N|auto    data-parallel devices, one per core by default (auto)\n"
    "  --timeout S         seconds before a stuck step fails every device (default 60)\n"
    "  --detect-anomaly    fail the step (naming the device) when a loss is NaN or infinite\n";

static bool parse_int(const char *flag, const char *v, int64_t min, int64_t *out) {
    char *end;
    errno = 0;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || !*v || *end || errno || x < min) {
        cli_fail("%s: expected an integer >= %lld, got '%s'", flag, (long long)min, v ? v : "");
        return false;
    }
    *out = x;
    return true;
}

static bool parse_num(const char *flag, const char *v, double min, double *out) {
    char *end;
    errno = 0;
    double x = v ? strtod(v, &end) : 0;
    if (!v || !*v || *end || errno || !(x >= min) || x != x || x > 1e30) {
        cli_fail("%s: expected a number >= %g, got '%s'", flag, min, v ? v : "");
        return false;
    }
    *out = x;
    return true;
}

/* Parses one option at argv[*i]; false (after printing the reason) on a bad one. */
static bool parse_opt(int argc, char **argv, int *i, train_opts *o) {
    const char *f = argv[*i];
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    int64_t n;
    bool ok = true, takes = true;
    if (!strcmp(f, "--epochs"))
        ok = parse_int(f, v, 1, &o->epochs);
    else if (!strcmp(f, "--steps"))
        ok = parse_int(f, v, 1, &o->steps);
    else if (!strcmp(f, "--batch"))
        ok = parse_int(f, v, 1, &o->batch);
    else if (!strcmp(f, "--devices") && v && !strcmp(v, "auto"))
        o->devices = 0;
    else if (!strcmp(f, "--devices"))
        ok = parse_int(f, v, 1, &o->devices) && (o->devices <= 256 || !cli_fail("--devices: at "
                                                                                "most 256, got %s",
                                                                                v));
    else if (!strcmp(f, "--timeout"))
        ok = parse_num(f, v, 1e-3, &o->timeout);
    else if (!strcmp(f, "--seed")) {
        if ((ok = parse_int(f, v, 0, &n)))
            o->seed = (uint64_t)n;
    } else if (!strcmp(f, "--lr"))
        ok = parse_num(f, v, 1e-30, &o->lr), o->lr_set = true;
    else if (!strcmp(f, "--momentum"))
        ok = parse_num(f, v, 0, &o->momentum);
    else if (!strcmp(f, "--weight-decay"))
        ok = parse_num(f, v, 0, &o->weight_decay);
    else if (!strcmp(f, "--optimizer")) {
        ok = v && (!strcmp(v, "sgd") || !strcmp(v, "adamw"));
        if (!ok)
            cli_fail("--optimizer: expected sgd or adamw, got '%s'", v ? v : "");
        o->optimizer = v;
    } else if (!strcmp(f, "--data") || !strcmp(f, "--init") || !strcmp(f, "--save") ||
               !strcmp(f, "--log-dir")) {
        ok = v && *v;
        if (!ok)
            cli_fail("%s: expected a path", f);
        const char **dst = !strcmp(f, "--data")   ? &o->data
                           : !strcmp(f, "--init") ? &o->init
                           : !strcmp(f, "--save") ? &o->save
                                                  : &o->log_dir;
        *dst = v;
    } else {
        takes = false;
        if (!strcmp(f, "--no-shuffle"))
            o->no_shuffle = true;
        else if (!strcmp(f, "--drop-last"))
            o->drop_last = true;
        else if (!strcmp(f, "--nesterov"))
            o->nesterov = true;
        else if (!strcmp(f, "--detect-anomaly"))
            o->detect_anomaly = true;
        else
            ok = false, cli_fail("train: unknown option '%s' (see loom --help)", f);
    }
    if (ok && takes)
        (*i)++;
    return ok;
}

static int cmd_train(int argc, char **argv, bool eval_only) {
    train_opts o = {.epochs = 1,
                    .batch = 128,
                    .lr = 0.05,
                    .momentum = 0.9,
                    .optimizer = "sgd",
                    .eval_only = eval_only};
    for (int i = 2; i < argc; i++) {
        if (argv[i][0] == '-' && argv[i][1] == '-') {
            if (!parse_opt(argc, argv, &i, &o))
                return 2;
        } else if (!o.recipe) {
            o.recipe = argv[i];
        } else {
            cli_fail("train: unexpected argument '%s' (one recipe only)", argv[i]);
            return 2;
        }
    }
    if (!o.recipe) {
        cli_fail("train: expected a recipe: fmnist-mlp or fmnist-cnn");
        return 2;
    }
    if (eval_only && !o.init) {
        cli_fail("eval: expected --init FILE with the weights to evaluate");
        return 2;
    }
    if (!strcmp(o.optimizer, "adamw") && !o.lr_set)
        o.lr = 0.001;
    return cli_train(&o);
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
    if (!strcmp(argv[1], "train") || !strcmp(argv[1], "eval"))
        return cmd_train(argc, argv, !strcmp(argv[1], "eval"));
    cli_fail("unknown command '%s' (expected train, eval, info or cache clear; see loom --help)",
             argv[1]);
    return 2;
}
