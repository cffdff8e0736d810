/*
 * args.c - the arguments of `loom train` and `loom eval`, parsed into train_opts. Every bad
 * argument gets one line naming the flag, the value and what was expected. Pure but for those
 * lines on stderr (tests/fuzz/fuzz_args.c runs it on arbitrary argument vectors).
 */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE *errors; /* where cli_fail writes: stderr unless cli_set_errors said otherwise */
static bool held;    /* cli_hold_errors: the first message is kept, not written */
static char first[1024];

void cli_set_errors(FILE *f) {
    errors = f;
}

/* This process's rank as an MPI launcher's environment gives it (-1: none). */
static int launcher_rank(void) {
    const char *vars[3] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};
    for (int i = 0; i < 3; i++)
        if (getenv(vars[i]))
            return atoi(getenv(vars[i]));
    return -1;
}

void cli_quiet_others(bool on) {
    static FILE *quiet;
    if (on && launcher_rank() > 0 && (quiet = fopen("/dev/null", "w")))
        cli_set_errors(quiet);
    if (!on && quiet)
        cli_set_errors(NULL), fclose(quiet), quiet = NULL;
}

void cli_hold_errors(void) {
    held = true;
}

const char *cli_held_error(void) {
    return first[0] ? first : NULL;
}

int cli_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (held) {
        if (!first[0])
            vsnprintf(first, sizeof first, fmt, ap);
    } else {
        FILE *out = errors ? errors : stderr;
        fputs("loom: ", out);
        vfprintf(out, fmt, ap);
        fputc('\n', out);
    }
    va_end(ap);
    return 1;
}

bool cli_int(const char *flag, const char *v, int64_t min, int64_t max, int64_t *out) {
    char *end;
    errno = 0;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || !*v || *end || errno || x < min || x > max) {
        cli_fail("%s: expected an integer from %lld to %lld, got '%s'", flag, (long long)min,
                 (long long)max, v ? v : "");
        return false;
    }
    *out = x;
    return true;
}

bool cli_num(const char *flag, const char *v, double min, double max, double *out) {
    char *end;
    errno = 0;
    double x = v ? strtod(v, &end) : 0;
    if (!v || !*v || *end || errno || !(x >= min && x <= max)) {
        cli_fail("%s: expected a number from %g to %g, got '%s'", flag, min, max, v ? v : "");
        return false;
    }
    *out = x;
    return true;
}

void cli_item(cli_items *it, const char *name, const char *fmt, ...) {
    if (it->n >= (int)(sizeof it->s / sizeof *it->s))
        return;
    char *s = it->s[it->n];
    int k = snprintf(s, sizeof it->s[0], "%s=", name);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s + k, sizeof it->s[0] - (size_t)k, fmt, ap);
    va_end(ap);
    it->p[it->n] = s;
    it->n++;
}

int cli_agree(loom_devices *d, cli_items *it) {
    if (!loom_devices_agree(d, it->p, it->n))
        return 0;
    if (loom_devices_process(d) == 0)
        fprintf(errors ? errors : stderr, "loom: %s\n", loom_last_error());
    return 2;
}

bool cli_mul(const char *what, int64_t a, int64_t b, int64_t limit, int64_t *out) {
    if (loom_size_mul(a, b, limit, out))
        return true;
    cli_fail("%s: %lld x %lld is more than %lld", what, (long long)a, (long long)b,
             (long long)limit);
    return false;
}

int cli_ckpt_opt(const char *f, const char *v, ckpt_opts *c) {
    if (!strcmp(f, "--checkpoint-every"))
        return cli_int(f, v, 1, CLI_MAX_COUNT, &c->every) ? 1 : -1;
    if (!strcmp(f, "--keep"))
        return cli_int(f, v, 1, CLI_MAX_COUNT, &c->keep) ? 1 : -1;
    if (!strcmp(f, "--monitor")) {
        if (!v || (strcmp(v, "val_loss") != 0 && strcmp(v, "val_acc") != 0))
            return cli_fail("--monitor: expected val_loss or val_acc, got '%s'", v ? v : ""), -1;
        c->monitor_acc = !strcmp(v, "val_acc");
        return 1;
    }
    if (strcmp(f, "--checkpoint-dir") != 0 && strcmp(f, "--resume") != 0)
        return 0;
    if (!v || !*v)
        return cli_fail("%s: expected a %s", f, f[2] == 'c' ? "directory" : "directory or file"),
               -1;
    *(f[2] == 'c' ? &c->dir : &c->resume) = v;
    return 1;
}

int cli_ckpt_check(const ckpt_opts *c, const char *init) {
    if (!c->dir && (c->every || c->keep))
        return cli_fail("%s: expected --checkpoint-dir DIR as well",
                        c->every ? "--checkpoint-every" : "--keep"),
               2;
    if (c->resume && init)
        return cli_fail("--resume: a resumed run has its weights from the checkpoint: drop --init"),
               2;
    return 0;
}

/* Parses one option at argv[*i]; false (after printing the reason) on a bad one. */
static bool parse_opt(int argc, char **argv, int *i, train_opts *o) {
    const char *f = argv[*i];
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    int64_t n;
    bool ok = true, takes = true;
    int ck = cli_ckpt_opt(f, v, &o->ck);
    if (ck)
        ok = ck > 0;
    else if (!strcmp(f, "--epochs"))
        ok = cli_int(f, v, 1, CLI_MAX_COUNT, &o->epochs);
    else if (!strcmp(f, "--steps"))
        ok = cli_int(f, v, 1, CLI_MAX_COUNT, &o->steps);
    else if (!strcmp(f, "--batch"))
        ok = cli_int(f, v, 1, CLI_MAX_SIZE, &o->batch);
    else if (!strcmp(f, "--accumulate"))
        ok = cli_int(f, v, 1, 65536, &o->accumulate);
    else if (!strcmp(f, "--limit-eval"))
        ok = cli_int(f, v, 1, CLI_MAX_COUNT, &o->limit_eval);
    else if (!strcmp(f, "--devices") && v && !strcmp(v, "auto"))
        o->devices = CLI_DEVICES_AUTO;
    else if (!strcmp(f, "--devices"))
        ok = cli_int(f, v, 1, 256, &o->devices);
    else if (!strcmp(f, "--cores-per-device") && v && !strcmp(v, "auto"))
        o->cores = LOOM_CORES_AUTO;
    else if (!strcmp(f, "--cores-per-device"))
        ok = cli_int(f, v, 1, 64, &o->cores);
    else if (!strcmp(f, "--dist")) {
        ok = v && (!strcmp(v, "auto") || !strcmp(v, "local") || !strcmp(v, "mpi"));
        if (!ok)
            cli_fail("--dist: expected auto, local or mpi, got '%s'", v ? v : "");
        else
            o->dist = !strcmp(v, "local") ? LOOM_DIST_LOCAL
                      : !strcmp(v, "mpi") ? LOOM_DIST_MPI
                                          : LOOM_DIST_AUTO;
    } else if (!strcmp(f, "--log-errors")) {
        ok = v && (!strcmp(v, "stop") || !strcmp(v, "warn"));
        if (!ok)
            cli_fail("--log-errors: expected stop or warn, got '%s'", v ? v : "");
        o->log_warn = ok && !strcmp(v, "warn");
    } else if (!strcmp(f, "--timeout"))
        ok = cli_num(f, v, 1e-3, LOOM_MAX_TIMEOUT, &o->timeout);
    else if (!strcmp(f, "--seed")) {
        if ((ok = cli_int(f, v, 0, INT64_MAX, &n)))
            o->seed = (uint64_t)n;
    } else if (!strcmp(f, "--lr"))
        ok = cli_num(f, v, 1e-30, 1e30, &o->lr), o->lr_set = true;
    else if (!strcmp(f, "--momentum"))
        ok = cli_num(f, v, 0, 1e30, &o->momentum);
    else if (!strcmp(f, "--weight-decay"))
        ok = cli_num(f, v, 0, 1e30, &o->weight_decay);
    else if (!strcmp(f, "--beta1") || !strcmp(f, "--beta2")) {
        double *b = !strcmp(f, "--beta1") ? &o->beta1 : &o->beta2;
        ok = cli_num(f, v, 1e-30, 1e30, b) &&
             (*b < 1 || !cli_fail("%s: expected a number < 1, got %s", f, v));
    } else if (!strcmp(f, "--min-lr"))
        ok = cli_num(f, v, 0, 1e30, &o->min_lr);
    else if (!strcmp(f, "--clip-norm"))
        ok = cli_num(f, v, 0, 1e30, &o->clip_norm);
    else if (!strcmp(f, "--warmup-steps"))
        ok = cli_int(f, v, 0, CLI_MAX_COUNT, &o->warmup_steps);
    else if (!strcmp(f, "--decay-steps"))
        ok = cli_int(f, v, 1, CLI_MAX_COUNT, &o->decay_steps);
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
        else if (!strcmp(f, "--decay-matrices-only"))
            o->decay_matrices_only = true;
        else if (!strcmp(f, "--detect-anomaly"))
            o->detect_anomaly = true;
        else if (!strcmp(f, "--quiet"))
            o->quiet = true;
        else
            ok = false, cli_fail("train: unknown option '%s' (see loom --help)", f);
    }
    if (ok && takes)
        (*i)++;
    return ok;
}

int cli_parse_train(int argc, char **argv, bool eval_only, train_opts *out) {
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
    if (!o.recipe && !o.init) { /* (with --init: the recipe its file records, cli_recipe_of) */
        cli_fail("train: expected a recipe: fmnist-mlp or fmnist-cnn");
        return 2;
    }
    if (eval_only && !o.init) {
        cli_fail("eval: expected --init FILE with the weights to evaluate");
        return 2;
    }
    if (cli_ckpt_check(&o.ck, o.init))
        return 2;
    if (eval_only && (o.ck.dir || o.ck.resume)) {
        cli_fail("eval: takes --init FILE, not checkpoint options");
        return 2;
    }
    if (!strcmp(o.optimizer, "adamw") && !o.lr_set)
        o.lr = 0.001;
    if (o.min_lr > o.lr) {
        cli_fail("--min-lr: expected at most --lr (%g), got %g", o.lr, o.min_lr);
        return 2;
    }
    if (o.decay_steps > 0 && o.decay_steps <= o.warmup_steps) {
        cli_fail("--decay-steps: expected more than --warmup-steps (%lld), got %lld",
                 (long long)o.warmup_steps, (long long)o.decay_steps);
        return 2;
    }
    *out = o;
    return 0;
}
