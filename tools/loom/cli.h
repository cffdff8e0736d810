/*
 * cli.h - shared between the loom command's files: the options of `loom train` and the
 * helpers that turn bad arguments into one clear line.
 */
#ifndef LOOM_CLI_H
#define LOOM_CLI_H

#include "loom.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct {
    const char *recipe;
    int64_t epochs, steps, batch;
    int64_t devices; /* 0: one per core */
    double timeout;  /* seconds, 0: the library's default */
    bool detect_anomaly;
    int dist; /* loom_dist: auto (0), local, mpi */
    double lr, momentum, weight_decay;
    double beta1, beta2, min_lr, clip_norm; /* AdamW's betas (0: its defaults) */
    int64_t warmup_steps, decay_steps;      /* the learning rate's schedule (loom_optim_config) */
    bool decay_matrices_only;               /* weight decay on parameters of >= 2 dims only */
    bool lr_set, nesterov, no_shuffle, drop_last;
    bool eval_only;        /* `loom eval`: test accuracy of --init weights */
    const char *optimizer; /* "sgd" or "adamw" */
    uint64_t seed;
    const char *data, *init, *save, *log_dir;
} train_opts;

/* Parses `loom train|eval RECIPE [options]` (argv[0] the program, argv[1] the subcommand) into
 * *o; 0, or 2 after one line on stderr naming the bad argument. */
int cli_parse_train(int argc, char **argv, bool eval_only, train_opts *o);
/* `flag`'s value v as an integer >= min or a number >= min into *out; false after one line. */
bool cli_int(const char *flag, const char *v, int64_t min, int64_t *out);
bool cli_num(const char *flag, const char *v, double min, double *out);
/* Whether --save's path can be written, before any training: 0, or 1 after one line. */
int cli_check_save(const char *path);
/* `loom train|sample shakespeare-gpt [options]` (tools/loom/gpt.c); the process exit code. */
int cli_gpt(int argc, char **argv);
/* Runs `loom train` (or `loom eval`) with parsed options; returns the process exit code. */
int cli_train(const train_opts *o);
/* Prints "loom: <formatted message>" to stderr (or the stream given to cli_set_errors); returns 1
 * (the exit code for errors). */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cli_set_errors(FILE *f);
/* From now on cli_fail keeps its first message instead of writing it (an MPI job's process
 * reports it once, naming itself, as it ends the job: loom_devices_abort); cli_held_error gives
 * it, or NULL. */
void cli_hold_errors(void);
const char *cli_held_error(void);

#endif
