/*
 * main.c - the `loom` command: its subcommands (`train` and `eval` parse their options in
 * args.c), usage and `info`. Every bad argument gets one line and exit status 2.
 */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char commands[] =
    "usage: loom train RECIPE [options]   train a built-in recipe (fmnist-mlp, fmnist-cnn)\n"
    "       loom train shakespeare-gpt [options]   a character-level GPT on a text (nanoGPT's\n"
    "                                     shakespeare-char run; options below)\n"
    "       loom sample shakespeare-gpt --init FILE [options]   text from trained weights\n"
    "       loom eval shakespeare-gpt --init FILE [options]     their validation loss\n"
    "       loom eval RECIPE --init FILE  test accuracy of a weights file (loom's or PyTorch's)\n"
    "       loom train|sample|eval hf --init DIR [options]   a Hugging Face folder (GPT-2,\n"
    "                                     Llama): fine-tuned and saved back, sampled, evaluated\n"
    "       loom plot LOGDIR [-o FILE.svg] [--log-scale]   a run's losses and accuracy (SVG)\n"
    "       loom info                     version, backends, BLAS, dataset location\n"
    "       loom cache clear              remove compiled kernels and decompressed datasets\n"
    "       loom COMMAND --help           that command's options\n";

/* The checkpoint options of every training command. */
#define CHECKPOINT_OPTIONS                                                                       \
    "  --checkpoint-dir DIR  write DIR/step-NNNNNN.safetensors (weights, optimizer state, the\n" \
    "                      run's position) after each evaluation and at the end\n"               \
    "  --checkpoint-every N  every N steps instead (and at the end)\n"                           \
    "  --keep K            keep the newest K checkpoints and the best (default: all)\n"          \
    "  --monitor M         val_loss (default) or val_acc: what the best checkpoint is best by\n" \
    "  --resume DIR|FILE   continue the run of a checkpoint (a directory's newest) exactly\n"

static const char train_options[] =
    "train options (loom train RECIPE, loom eval RECIPE):\n"
    "  --epochs N          passes over the training set (default 1)\n"
    "  --steps N           stop after N optimizer steps (default: all)\n"
    "  --batch N           batch size (default 128)\n"
    "  --accumulate N      N batches (micro-batches) per optimizer step, gradients summed and\n"
    "                      all-reduced once (default 1); --steps and the schedule count steps\n"
    "  --lr X              learning rate (default 0.05 for sgd, 0.001 for adamw)\n"
    "  --momentum X        SGD momentum (default 0.9)\n"
    "  --nesterov          SGD with Nesterov momentum\n"
    "  --optimizer NAME    sgd or adamw (default sgd)\n"
    "  --weight-decay X    L2 penalty for sgd, decoupled decay for adamw (default 0)\n"
    "  --decay-matrices-only  weight decay on parameters of 2 dims or more only (nanoGPT's)\n"
    "  --beta1 X, --beta2 X  AdamW's moment decays (default 0.9, 0.999)\n"
    "  --warmup-steps N    linear learning-rate warm-up over the first N steps (default 0)\n"
    "  --decay-steps N     cosine learning-rate decay down to --min-lr at step N (default: none)\n"
    "  --min-lr X          the learning rate after --decay-steps, at most --lr (default 0)\n"
    "  --clip-norm X       clip the gradients' global norm to X (default and 0: no clipping)\n"
    "  --seed N            seed of initialisation and shuffling (default 0)\n"
    "  --data DIR          Fashion-MNIST directory (default $LOOM_DATA or the Debian path)\n"
    "  --no-shuffle        take batches in file order\n"
    "  --drop-last         drop the final short batch of each epoch\n"
    "  --init FILE         initial weights (safetensors, PyTorch state_dict names)\n"
    "  --save FILE         write the trained weights (safetensors) after training\n"
    "  --log-dir DIR       write DIR/metrics.csv, a whole row at a time, and a TensorBoard\n"
    "                      event file of the same scalars\n"
    "  --log-errors stop|warn  a log write that fails stops the run (stop, the default) or\n"
    "                      warns once and trains on without the log (warn)\n"
    "  --devices N|auto    data-parallel devices of this process (1 to 256), by default one per\n"
    "                      core it may run on (under mpirun, per process: give each the same);\n"
    "                      auto: the split of those cores into devices of several cores that\n"
    "                      runs this model's first steps fastest (each split timed on 8 or\n"
    "                      more steps, the choice printed: give it to repeat the run bitwise)\n"
    "  --cores-per-device N|auto  the cores each device spans (1 to 64, default 1): they\n"
    "                      split its kernels' outputs, the results bitwise those of one core;\n"
    "                      without --devices N, one device per N cores; auto: the cores it\n"
    "                      may run on over --devices (one device of them all without it)\n"
    "  --dist auto|local|mpi  across the processes of an MPI job (auto: when started by\n"
    "                      mpirun or mpiexec), or this process alone\n"
    "  --timeout S         seconds before a stuck step fails every device (default 60, at most\n"
    "                      1e6)\n"
    "  --detect-anomaly    stop a step at its loss, before its update, when the loss is NaN\n"
    "                      or infinite (without it training stops after that step)\n"
    "  --limit-eval N      evaluate on the first N test samples only (default: all)\n"
    "  --quiet             no progress (on a terminal a bar redrawn in place, else a line\n"
    "                      every 100 steps)\n" CHECKPOINT_OPTIONS;

static const char gpt_options[] =
    "shakespeare-gpt options (loom train|eval|sample shakespeare-gpt; defaults: nanoGPT's CPU\n"
    "run of shakespeare-char):\n"
    "  --data FILE         UTF-8 text, plain or gzip'd, at most 1 GiB (default: the project's\n"
    "                      Tiny Shakespeare)\n"
    "  --layers N --heads N --width N --context N   the model (4, 4, 128, 64)\n"
    "  --steps N --batch N (2000, 12)   --accumulate N (1: batches per optimizer step)\n"
    "  --lr X (1e-3)   --warmup-steps N (100)\n"
    "  --decay-steps N (--steps)   --min-lr X (1e-4)   --weight-decay X (0.1, matrices only)\n"
    "  --clip-norm X (1.0; 0: none)   --beta2 X (0.99)   --dropout X (0)   --eval-interval N\n"
    "  (250)   --seed N   --no-shuffle   --devices N|auto   --cores-per-device N|auto\n"
    "  --timeout S   --init FILE   --quiet\n"
    "  --save FILE   --log-dir DIR (metrics.csv and a TensorBoard event file)   --log-errors\n"
    "  stop|warn\n" CHECKPOINT_OPTIONS
    "  sample: --tokens N (500)  --temperature X (0.8)  --top-k N (200)  --start TEXT (newline)\n";

static const char hf_options[] =
    "hf: a Hugging Face model folder (loom train|eval|sample hf --init DIR):\n"
    "  --init DIR          config.json (GPT-2 or Llama), model.safetensors or its shards\n"
    "                      (float32, float16, bfloat16), tokenizer.json (BPE: byte-level or\n"
    "                      SentencePiece's)\n"
    "  --data FILE         the text, cut by the tokenizer (default: Tiny Shakespeare); its\n"
    "                      first 90% of tokens trains, the last 10% validates\n"
    "  --context N         the windows (default: the model's positions)\n"
    "  --save DIR          the trained folder: transformers' from_pretrained loads it\n"
    "  sample: --prompt TEXT --num-samples N --temperature X (0: greedy) --top-k N --tokens N\n"
    "  the options of shakespeare-gpt below but the model's shape (from config.json) and\n"
    "  --dropout (none); docs/huggingface.md\n";

static const char cache_help[] =
    "usage: loom cache clear   remove the compiled kernels, decompressed datasets and tokenized\n"
    "                          texts of $XDG_CACHE_HOME/loom (or ~/.cache/loom); a compile in\n"
    "                          progress keeps its files\n";

static const char plot_help[] =
    "usage: loom plot LOGDIR [-o FILE.svg] [--log-scale]   the training loss, validation loss and\n"
    "                          accuracy of LOGDIR/metrics.csv (a run's --log-dir) against the "
    "step,\n"
    "                          as one SVG file (default LOGDIR/metrics.svg); --log-scale: the\n"
    "                          loss on a log scale\n";

static const char info_help[] =
    "usage: loom info   version, backends, BLAS, the C compiler and dataset location\n";

/* `loom COMMAND ... --help`: that command's options on stdout; false if argv asks no help. */
static bool help(int argc, char **argv) {
    bool asked = false;
    for (int i = 2; i < argc && !asked; i++)
        asked = !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
    if (!asked)
        return false;
    const char *c = argv[1];
    bool gpt = argc > 2 && !strcmp(argv[2], "shakespeare-gpt");
    if (argc > 2 && !strcmp(argv[2], "hf")) {
        printf("usage: loom %s hf --init DIR [options]\n\n%s\n%s", c, hf_options, gpt_options);
        return true;
    }
    if (!strcmp(c, "cache"))
        fputs(cache_help, stdout);
    else if (!strcmp(c, "info"))
        fputs(info_help, stdout);
    else if (!strcmp(c, "plot"))
        fputs(plot_help, stdout);
    else if (!strcmp(c, "sample") || gpt)
        printf("usage: loom %s shakespeare-gpt [options]\n\n%s", c, gpt_options);
    else if (!strcmp(c, "train") || !strcmp(c, "eval"))
        printf("usage: loom %s RECIPE [options]   (RECIPE: fmnist-mlp, fmnist-cnn; see `loom %s "
               "shakespeare-gpt --help` for the GPT)\n\n%s",
               c, c, train_options);
    else
        return false;
    return true;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        FILE *out = argc < 2 ? stderr : stdout;
        fprintf(out, "%s\n%s\n%s", commands, train_options, gpt_options);
        return argc < 2 ? 2 : 0;
    }
    if (help(argc, argv))
        return 0;
    if (loom_env_check()) /* (LOOM_FAULT: by the devices, which know how many there are) */
        return cli_fail("%s", loom_last_error()), 2;
    if (!strcmp(argv[1], "cache") && argc == 3 && !strcmp(argv[2], "clear")) {
        int64_t files, bytes;
        if (loom_cache_clear(&files, &bytes))
            return cli_fail("cache clear: %s", loom_last_error());
        printf("removed %lld cached files (%.1f MiB)\n", (long long)files,
               (double)bytes / 1048576.0);
        return 0;
    }
    if (!strcmp(argv[1], "plot"))
        return cli_plot(argc, argv);
    if (!strcmp(argv[1], "info")) {
        char buf[2048];
        loom_info(buf, sizeof buf);
        fputs(buf, stdout);
        return 0;
    }
    if ((!strcmp(argv[1], "train") || !strcmp(argv[1], "sample") || !strcmp(argv[1], "eval")) &&
        argc > 2 && (!strcmp(argv[2], "shakespeare-gpt") || !strcmp(argv[2], "hf")))
        return cli_gpt(argc, argv);
    if (!strcmp(argv[1], "train") || !strcmp(argv[1], "eval")) {
        train_opts o;
        cli_quiet_others(true);
        int rc = cli_parse_train(argc, argv, !strcmp(argv[1], "eval"), &o);
        rc = rc ? rc : cli_recipe_of(&o);
        cli_quiet_others(false);
        return rc ? rc : cli_train(&o);
    }
    cli_fail("unknown command '%s' (expected train, eval, sample, plot, info or cache clear; see "
             "loom --help)",
             argv[1]);
    return 2;
}
