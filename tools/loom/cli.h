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

/* --devices auto (split.c): the split of this process's CPUs into devices x cores a device that
 * runs the command's own steps fastest. trial(ctx, D, C, dt) runs the command's first training
 * steps on D devices of C cores while cli_trial_more(dt, steps ended) says so (nothing printed
 * or written: stdout is on /dev/null meanwhile), each step's seconds into dt[step] (room for
 * CLI_TRIAL_MAX): 0, or a code after one line on stderr. cli_choose_split times every split (the
 * median step after CLI_TRIAL_WARM; ties go to more devices), prints the one chosen with every
 * time and sets *devices and *cores to it; with --cores-per-device given, under an MPI launcher
 * (the processes would have to agree) or on one CPU nothing is timed: *devices 0, one device per
 * --cores-per-device cores. 0, or the trial's code. */
#define CLI_DEVICES_AUTO (-1)
#define CLI_TRIAL_WARM   2
#define CLI_TRIAL_MAX    64
typedef int (*cli_trial_fn)(void *ctx, int D, int C, double *dt);
int cli_choose_split(cli_trial_fn trial, void *ctx, int64_t *devices, int64_t *cores);
/* Whether a trial runs another step after n: until 8 steps and 0.25 s of them after the warm-up
 * ones, at most CLI_TRIAL_MAX. */
bool cli_trial_more(const double *dt, int64_t n);

/* The checkpoint options of every training command (tools/loom/ckpt.c). */
typedef struct {
    const char *dir;    /* --checkpoint-dir: where checkpoints go (NULL: none) */
    int64_t every;      /* --checkpoint-every N steps (0: at each evaluation) and at the end */
    int64_t keep;       /* --keep K: the newest K and the best (0: all) */
    bool monitor_acc;   /* --monitor val_acc (larger is better), else val_loss */
    const char *resume; /* --resume DIR|FILE: continue the run that wrote it */
} ckpt_opts;

typedef struct {
    const char *recipe;
    int64_t epochs, steps, batch;
    int64_t
        accumulate;  /* --accumulate N: micro-batches of --batch per optimizer step (0, 1: one) */
    int64_t devices; /* 0: one per --cores-per-device cores; CLI_DEVICES_AUTO: timed */
    int64_t cores;   /* --cores-per-device N|auto: the cores each device spans (0, 1: one;
                      * LOOM_CORES_AUTO) */
    int64_t limit_eval; /* --limit-eval N: evaluate on the first N test samples (0: all) */
    double timeout;     /* seconds, 0: the library's default */
    bool detect_anomaly;
    int dist; /* loom_dist: auto (0), local, mpi */
    double lr, momentum, weight_decay;
    double beta1, beta2, min_lr, clip_norm; /* AdamW's betas (0: its defaults) */
    int64_t warmup_steps, decay_steps;      /* the learning rate's schedule (loom_optim_config) */
    bool decay_matrices_only;               /* weight decay on parameters of >= 2 dims only */
    bool lr_set, nesterov, no_shuffle, drop_last;
    bool eval_only;        /* `loom eval`: test accuracy of --init weights */
    bool log_warn;         /* --log-errors warn: a log that cannot be written warns, trains on */
    bool quiet;            /* --quiet: no progress (bar or lines) */
    double *trial;         /* --devices auto's timing (cli_choose_split): the steps' seconds into
                            * trial while cli_trial_more, no evaluation, nothing written */
    const char *optimizer; /* "sgd" or "adamw" */
    uint64_t seed;
    const char *data, *init, *save, *log_dir;
    ckpt_opts ck;
} train_opts;

/* Parses `loom train|eval RECIPE [options]` (argv[0] the program, argv[1] the subcommand) into
 * *o; 0, or 2 after one line on stderr naming the bad argument. */
int cli_parse_train(int argc, char **argv, bool eval_only, train_opts *o);
/* `flag`'s value v as an integer or a number in [min, max] into *out; false after one line. */
bool cli_int(const char *flag, const char *v, int64_t min, int64_t max, int64_t *out);
bool cli_num(const char *flag, const char *v, double min, double max, double *out);
/* a * b into *out when it is at most limit (loom_size_mul); false after one line naming what
 * the two are ("--batch x --context") and the limit. */
bool cli_mul(const char *what, int64_t a, int64_t b, int64_t limit, int64_t *out);
/* The largest count an option takes (steps, epochs, tokens: 2^40), and batch or context (2^24). */
#define CLI_MAX_COUNT       ((int64_t)1 << 40)
#define CLI_MAX_SIZE        ((int64_t)1 << 24)
/* The most tokens (or samples) of one step's batch, all devices together: 2^28. */
#define CLI_MAX_BATCH_ELEMS ((int64_t)1 << 28)
/* Flag f with value v, when it is a checkpoint option: 1 (taken, v used), 0 (not one of them),
 * -1 (a bad value, after one line). cli_ckpt_check: the options together (0, or 2 after a line:
 * --keep or --checkpoint-every without --checkpoint-dir, --resume with --init). */
int cli_ckpt_opt(const char *f, const char *v, ckpt_opts *c);
int cli_ckpt_check(const ckpt_opts *c, const char *init);
/* Whether --save's path can be written, before any training: 0, or 1 after one line. */
int cli_check_save(const char *path);
/* The options of `loom train|eval|sample shakespeare-gpt` (tools/loom/gpt.c). */
typedef struct {
    bool sample, eval;
    bool hf; /* `... hf`: a Hugging Face folder (--init DIR) instead of shakespeare-gpt */
    loom_gpt_config shape;
    unsigned given; /* which of --layers, --heads, --width, --context (bits 0 to 3) were given */
    int64_t steps, batch, warmup, decay, eval_interval, devices, tokens, top_k, num_samples;
    int64_t accumulate; /* --accumulate N: micro-batches of --batch per optimizer step */
    int64_t cores;      /* --cores-per-device N|auto (0, 1: one; LOOM_CORES_AUTO) */
    double lr, min_lr, weight_decay, clip, beta2, dropout, temperature, timeout;
    uint64_t seed;
    bool no_shuffle;
    const char *data, *init, *save, *start, *log_dir;
    bool log_warn; /* --log-errors warn */
    bool quiet;    /* --quiet: no progress bar */
    ckpt_opts ck;
} gpt_opts;
/* Validation batches of the GPT: 64 windows (the short last one on a graph of its own). */
#define VAL_ROWS 64
/* Parses argv (argv[1] the command, argv[2] shakespeare-gpt or hf) into *o, every size bounded and
 * every product of sizes checked (batch rows x context, the blocks' parameters): 0, or 2 after
 * one line. Pure but for that line (tests/fuzz/fuzz_gpt_args.c). */
int cli_gpt_parse(int argc, char **argv, gpt_opts *o);
/* `loom train|sample shakespeare-gpt [options]` (tools/loom/gpt.c); the process exit code. */
int cli_gpt(int argc, char **argv);
/* `loom plot LOGDIR [-o FILE.svg] [--log-scale]` (tools/loom/plot.c); the process exit code. */
int cli_plot(int argc, char **argv);
/* Runs `loom train` (or `loom eval`) with parsed options; returns the process exit code. */
int cli_train(const train_opts *o);
/* stop.c: catches the first SIGINT or SIGTERM (cli_stopping() is then true at the next step
 * boundary: the command ends that step and exits 128 + cli_stop_signal()); with devices set by
 * cli_stop_agree (NULL: none), the processes of an MPI job decide together, at the same step
 * (each calls cli_stopping the same number of times). */
void cli_catch_stop(void);
void cli_stop_agree(loom_devices *d);
bool cli_stopping(void);
int cli_stop_signal(void);       /* 0: none */
const char *cli_stop_name(void); /* "SIGINT" or "SIGTERM" */
/* The line of a run stopped by the signal after `step` (process 0's: writer), naming the
 * checkpoint written into dir and how to continue, or (no dir) what `otherwise` says of the
 * files; returns the exit code, 128 + the signal. */
int cli_stop_report(bool writer, int64_t step, const char *ckpt, const char *dir,
                    const char *otherwise);
/* csvlog.c: DIR/metrics.csv with `header` (NULL after one line), and a TensorBoard event file; rows
 * written whole and checked: a row that cannot be written is cut off (the file ends on a whole row)
 * and the row's call returns 1 after one line, or, with warn_only, 0 after a warning once (no rows
 * after it). A run resumed after step `resumed` (-1: a new run) keeps the file's rows up to that
 * step. */
typedef struct cli_log cli_log;
cli_log *cli_log_open(const char *dir, const char *header, bool warn_only, int64_t resumed);
int cli_log_row(cli_log *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int cli_log_close(cli_log *l); /* 0, or 1 after one line; frees l (NULL: nothing) */
/* A scalar into DIR's TensorBoard event file (TensorBoard's tags: "train/loss"), and the
 * scalars buffered written out: 0, or as cli_log_row for a failure. */
int cli_log_scalar(cli_log *l, const char *tag, int64_t step, double value);
int cli_log_flush(cli_log *l);
/* A run's configuration as "name=value" items, for the processes of an MPI job to compare
 * (loom_devices_agree) before the first step. */
typedef struct {
    char s[40][200];
    const char *p[40];
    int n;
} cli_items;
void cli_item(cli_items *it, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* 0 when every process has the same items; else 2, after one line from process 0 naming the
 * first process and option that differ (every process returns, none aborts the job). */
int cli_agree(loom_devices *d, cli_items *it);
/* ckpt.c: a run's configuration in its model's metadata, written with every checkpoint and
 * weights file.
 * cli_config_meta: the configuration items as "config.<name>" (0, or 1 after a line);
 * cli_resume_check: a resumed checkpoint's (at path) against this run's: every item but those in
 * may_change (NULL-terminated) must be the same, or 2 after one line naming the first that is
 * not. */
int cli_config_meta(loom_model *m, const cli_items *it);
/* The recipe --init's file records (its config.recipe), when the command names none: 0, or 1 or
 * 2 after one line. */
int cli_recipe_of(train_opts *o);
int cli_resume_check(const loom_model *m, const cli_items *it, const char *path,
                     const char *const *may_change);
/* A checkpoint of the run after `steps` steps into --checkpoint-dir, by process 0 of the job
 * (writer; the others return 0 at once), with the monitored value (NaN: none); its path into
 * path. 0, or 1 after one line. */
int cli_ckpt_write(const ckpt_opts *c, loom_model *m, loom_optim *o, int64_t steps,
                   double monitored, bool writer, char *path, size_t cap);
/* progress.c: a training command's progress, on a terminal a bar redrawn in place (with the
 * share of the FMA peak), else a plain line every `plain_every` steps (0: none) and at each
 * epoch's end, with --quiet nothing. cli_progress_line prints a line of its own (the bar cleared
 * first); cli_progress_end clears the bar. */
typedef struct {
    const char *label;     /* "epoch 1/3" */
    int64_t i, of;         /* the steps of this epoch (or run) done, and its steps */
    int64_t step, total;   /* the run's steps done, and its last */
    double loss, rate;     /* the step's loss; samples (or tokens) a second */
    double flops, seconds; /* the step's product flops on one device, and its time */
} cli_step;
typedef struct {
    bool quiet, tty, shown;
    const char *unit; /* "samples" or "tokens" */
    int64_t plain_every, steps, first_step, last_i;
    double peak, started, drawn;
} cli_progress;
void cli_progress_init(cli_progress *p, bool quiet, const char *unit, int64_t plain_every);
void cli_progress_step(cli_progress *p, const cli_step *s);
void cli_progress_line(cli_progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cli_progress_end(cli_progress *p);
/* Prints "loom: <formatted message>" to stderr (or the stream given to cli_set_errors); returns 1
 * (the exit code for errors). */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cli_set_errors(FILE *f);
/* Under an MPI launcher every process parses the same arguments: between cli_quiet_others(true)
 * and (false), only process 0 writes what is wrong with them (one line for the job). */
void cli_quiet_others(bool on);
/* From now on cli_fail keeps its first message instead of writing it (an MPI job's process
 * reports it once, naming itself, as it ends the job: loom_devices_abort); cli_held_error gives
 * it, or NULL. */
void cli_hold_errors(void);
const char *cli_held_error(void);

#endif
