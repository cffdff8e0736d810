/*
 * gpt.c - `loom train shakespeare-gpt` and `loom sample shakespeare-gpt`: nanoGPT's
 * shakespeare-char run (a character-level GPT, loom_gpt_*, on a text, loom_text_*) with its
 * recipe as defaults (4 layers, 4 heads, width 128, context 64, batch 12, 2000 steps, AdamW lr
 * 1e-3 with betas 0.9 and 0.99, weight decay 0.1 on matrices, 100 warm-up steps, cosine to 1e-4,
 * clipping at 1.0), data-parallel on the devices; and sampling from trained weights.
 * `loom train|sample|eval hf --init DIR` is the same run on a Hugging Face folder (loom_hf_*): its
 * model, its tokenizer.json cutting the text, and the folder written back by --save.
 */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static const char *default_text(void) {
    return LOOM_TEXT_DIR "/tinyshakespeare.txt.gz";
}

/* The model's shape and the batch against the bounds: the batch's rows x context, the blocks'
 * weights (12 width^2 a layer; the embeddings are bounded once the vocabulary is known, by
 * loom_gpt_new: at most 2^31 parameters), heads dividing width. 0, or 1 after one line. */
static int check_shape(gpt_opts *o, bool divides) {
    int64_t rows = o->batch > VAL_ROWS ? o->batch : VAL_ROWS, elems;
    if (!cli_mul("--batch x --context", rows, o->shape.context, CLI_MAX_BATCH_ELEMS, &elems))
        return 1;
    int64_t w2, layer, params;
    if (!cli_mul("--width x --width", o->shape.width, o->shape.width, INT64_MAX, &w2) ||
        !cli_mul("12 x --width^2", 12, w2, INT64_MAX, &layer) ||
        !cli_mul("--layers x 12 --width^2 (parameters)", o->shape.layers, layer, (int64_t)1 << 31,
                 &params))
        return 1;
    if (divides && o->shape.width % o->shape.heads != 0)
        return cli_fail("--heads: %lld do not divide --width %lld", (long long)o->shape.heads,
                        (long long)o->shape.width);
    return 0;
}

int cli_gpt_parse(int argc, char **argv, gpt_opts *o) {
    *o = (gpt_opts){.sample = !strcmp(argv[1], "sample"),
                    .eval = !strcmp(argv[1], "eval"),
                    .hf = argc > 2 && !strcmp(argv[2], "hf"),
                    .num_samples = 1,
                    .shape = {.context = 64, .layers = 4, .heads = 4, .width = 128},
                    .steps = 2000,
                    .batch = 12,
                    .warmup = 100,
                    .decay = -1,
                    .eval_interval = 250,
                    .tokens = 500,
                    .top_k = 200,
                    .lr = 1e-3,
                    .min_lr = 1e-4,
                    .weight_decay = 0.1,
                    .clip = 1.0,
                    .beta2 = 0.99,
                    .temperature = 0.8,
                    .start = "\n"};
    /* the options with a value: integers and numbers, each with its least value */
    const struct {
        const char *flag;
        int64_t min, max, *dst;
    } ints[] = {{"--layers", 1, 1024, &o->shape.layers},
                {"--heads", 1, 4096, &o->shape.heads},
                {"--width", 1, 65536, &o->shape.width},
                {"--context", 1, 65536, &o->shape.context},
                {"--steps", 1, CLI_MAX_COUNT, &o->steps},
                {"--batch", 1, CLI_MAX_SIZE, &o->batch},
                {"--warmup-steps", 0, CLI_MAX_COUNT, &o->warmup},
                {"--decay-steps", 1, CLI_MAX_COUNT, &o->decay},
                {"--eval-interval", 1, CLI_MAX_COUNT, &o->eval_interval},
                {"--tokens", 1, (int64_t)1 << 30, &o->tokens},
                {"--top-k", 1, (int64_t)1 << 30, &o->top_k},
                {"--num-samples", 1, 1 << 20, &o->num_samples},
                {"--devices", 1, 256, &o->devices},
                {"--accumulate", 1, 65536, &o->accumulate},
                {"--cores-per-device", 1, 64, &o->cores}};
    const struct {
        const char *flag;
        double min, max, *dst;
    } nums[] = {{"--lr", 1e-30, 1e30, &o->lr},
                {"--min-lr", 0, 1e30, &o->min_lr},
                {"--weight-decay", 0, 1e30, &o->weight_decay},
                {"--clip-norm", 0, 1e30, &o->clip},
                {"--beta2", 0, 1e30, &o->beta2},
                {"--dropout", 0, 1e30, &o->dropout},
                {"--temperature", 0, 1e30, &o->temperature},
                {"--timeout", 1e-3, LOOM_MAX_TIMEOUT, &o->timeout}};
    const struct {
        const char *flag, **dst;
    } strs[] = {{"--data", &o->data},   {"--init", &o->init},    {"--save", &o->save},
                {"--start", &o->start}, {"--prompt", &o->start}, {"--log-dir", &o->log_dir}};
    for (int i = 3; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = false, known = false;
        if (!strcmp(f, "--no-shuffle") || !strcmp(f, "--quiet")) {
            *(f[2] == 'n' ? &o->no_shuffle : &o->quiet) = true;
            continue;
        }
        if (!strcmp(f, "--log-errors")) {
            if (!v || (strcmp(v, "stop") != 0 && strcmp(v, "warn") != 0))
                return cli_fail("--log-errors: expected stop or warn, got '%s'", v ? v : ""), 2;
            o->log_warn = !strcmp(v, "warn");
            i++;
            continue;
        }
        if (!strcmp(f, "--devices") && v && !strcmp(v, "auto"))
            known = ok = true, o->devices = CLI_DEVICES_AUTO;
        if (!strcmp(f, "--cores-per-device") && v && !strcmp(v, "auto"))
            known = ok = true, o->cores = LOOM_CORES_AUTO;
        for (size_t k = 0; !known && k < sizeof ints / sizeof *ints; k++)
            if ((known = !strcmp(f, ints[k].flag))) {
                ok = cli_int(f, v, ints[k].min, ints[k].max, ints[k].dst);
                o->given |= k < 4 ? 1u << k : 0; /* (the four of the model's shape first) */
            }
        for (size_t k = 0; !known && k < sizeof nums / sizeof *nums; k++)
            if ((known = !strcmp(f, nums[k].flag)))
                ok = cli_num(f, v, nums[k].min, nums[k].max, nums[k].dst);
        for (size_t k = 0; !known && k < sizeof strs / sizeof *strs; k++)
            if ((known = !strcmp(f, strs[k].flag))) {
                bool text = strs[k].dst == &o->start; /* (may be empty: then refused later) */
                if (!(ok = v && (*v || text)))
                    cli_fail("%s: expected %s", f, text ? "text" : "a path");
                *strs[k].dst = v;
            }
        int ck = known ? 0 : cli_ckpt_opt(f, v, &o->ck);
        if (ck)
            known = true, ok = ck > 0;
        if (!known && !strcmp(f, "--seed")) {
            int64_t n = 0;
            known = true;
            if ((ok = cli_int(f, v, 0, INT64_MAX, &n)))
                o->seed = (uint64_t)n;
        }
        if (!known)
            return cli_fail("%s: unknown option '%s' (see loom --help)", argv[1], f), 2;
        if (!ok)
            return 2;
        i++;
    }
    /* the bounds now; whether --heads divides --width once --init's shape is known, when some of
     * it comes from the file (shape_of_init checks them all again then) */
    if (check_shape(o, !(o->init && o->given != 15)))
        return 2;
    if (o->min_lr > o->lr)
        return cli_fail("--min-lr: expected at most --lr (%g), got %g", o->lr, o->min_lr), 2;
    if (o->beta2 >= 1)
        return cli_fail("--beta2: expected a number < 1, got %g", o->beta2), 2;
    if (o->dropout >= 1)
        return cli_fail("--dropout: expected a number below 1, got %g", o->dropout), 2;
    if (o->decay < 0)
        o->decay = o->steps > o->warmup ? o->steps : o->warmup + 1;
    if (o->decay <= o->warmup)
        return cli_fail("--decay-steps: expected more than --warmup-steps (%lld), got %lld",
                        (long long)o->warmup, (long long)o->decay),
               2;
    if (o->hf && (o->given & 7))
        return cli_fail("hf: --layers, --heads and --width come from --init's config.json"), 2;
    if (o->hf && o->dropout > 0)
        return cli_fail("--dropout: hf fine-tunes without dropout"), 2;
    if (o->hf && !o->init)
        return cli_fail("%s hf: expected --init DIR, a Hugging Face model folder", argv[1]), 2;
    if (cli_ckpt_check(&o->ck, o->hf ? NULL : o->init))
        return 2;
    if ((o->sample || o->eval) && (o->ck.dir || o->ck.resume || o->log_dir))
        return cli_fail("%s: takes --init FILE, not checkpoint or log options", argv[1]), 2;
    if (o->ck.monitor_acc)
        return cli_fail("--monitor: shakespeare-gpt's evaluation measures val_loss only"), 2;
    if ((o->sample || o->eval) && !o->init)
        return cli_fail("%s: expected --init FILE with trained weights", argv[1]), 2;
    if (o->num_samples > 1 && !o->sample)
        return cli_fail("--num-samples: for sample only"), 2;
    return 0;
}

typedef struct {
    loom_text *text;
    loom_model *m;
    loom_gpt *gpt;
    loom_hf *hf;         /* hf: the folder's model (in place of gpt) */
    loom_tokenizer *tok; /* hf: its tokenizer, which cuts the text */
    /* training and evaluation (run_devices): the devices, the validation graphs, and room for
     * max(batch, VAL_ROWS) windows of inputs and targets */
    loom_devices *d;
    loom_graph *full, *tail;
    int32_t *x, *y;
    cli_items it; /* the configuration: compared across processes, kept in checkpoints */
} gpt_run;

static void run_free(gpt_run *r) {
    loom_graph_free(r->full);
    loom_graph_free(r->tail);
    loom_devices_free(r->d);
    free(r->x), free(r->y);
    loom_gpt_free(r->gpt);
    loom_hf_free(r->hf);
    loom_model_free(r->m);
    loom_text_free(r->text);
    loom_tokenizer_free(r->tok);
}

static loom_tensor *forward(gpt_run *r, loom_graph *g, loom_tensor *idx) {
    return r->hf ? loom_hf_forward(g, r->hf, idx) : loom_gpt_forward(g, r->gpt, idx);
}

static void set_train(gpt_run *r, bool train, uint64_t seed, int64_t step) {
    if (r->hf)
        loom_hf_set_train(r->hf, train, seed, step);
    else
        loom_gpt_set_train(r->gpt, train, seed, step);
}

static char *vocabulary(const loom_text *t);

/* Whether every process of an MPI job runs this configuration (the text compared by its size and
 * vocabulary, paths may differ between machines). 0, or 2 after process 0's line. */
static int agree(gpt_opts *o, gpt_run *r) {
    cli_items *it = &r->it;
    it->n = 0;
    const loom_gpt_config *c = &o->shape;
    cli_item(it, "command", "%s", o->sample ? "sample" : o->eval ? "eval" : "train");
    if (!o->hf) { /* (hf: the folder's model, below) */
        cli_item(it, "--layers", "%lld", (long long)c->layers);
        cli_item(it, "--heads", "%lld", (long long)c->heads);
        cli_item(it, "--width", "%lld", (long long)c->width);
    }
    cli_item(it, "--context", "%lld", (long long)c->context);
    cli_item(it, "--steps", "%lld", (long long)o->steps);
    cli_item(it, "--batch", "%lld", (long long)o->batch);
    cli_item(it, "--accumulate", "%lld", (long long)(o->accumulate > 1 ? o->accumulate : 1));
    cli_item(it, "--warmup-steps", "%lld", (long long)o->warmup);
    cli_item(it, "--decay-steps", "%lld", (long long)o->decay);
    cli_item(it, "--eval-interval", "%lld", (long long)o->eval_interval);
    cli_item(it, "--lr", "%.17g", o->lr);
    cli_item(it, "--min-lr", "%.17g", o->min_lr);
    cli_item(it, "--weight-decay", "%.17g", o->weight_decay);
    cli_item(it, "--clip-norm", "%.17g", o->clip);
    cli_item(it, "--beta2", "%.17g", o->beta2);
    cli_item(it, "--dropout", "%.17g", o->dropout);
    cli_item(it, "--seed", "%llu", (unsigned long long)o->seed);
    cli_item(it, "--no-shuffle", "%d", o->no_shuffle);
    cli_item(it, "--timeout", "%.17g", o->timeout);
    cli_item(it, "--init", "%s", o->init ? "given" : "none");
    if (o->hf) /* (the folder's model: its size, the vocabulary its tokenizer's) */
        cli_item(it, "--init's model", "%lld parameters, vocabulary %lld",
                 (long long)loom_model_numel(r->m), (long long)loom_hf_vocab(r->hf));
    char *vocab = vocabulary(r->text);
    uint64_t h = 1469598103934665603ull; /* FNV-1a of the vocabulary */
    for (const char *s = vocab ? vocab : ""; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    free(vocab);
    cli_item(it, "--data", "%lld %s, vocabulary of %lld (hash %016llx)",
             (long long)(loom_text_count(r->text, false) + loom_text_count(r->text, true)),
             o->hf ? "tokens" : "characters", (long long)loom_text_vocab(r->text),
             (unsigned long long)h);
    return cli_agree(r->d, it);
}

/* The devices (--devices, --timeout), the validation graphs on them, the batch buffers. */
static int run_devices(gpt_opts *o, gpt_run *r) {
    size_t rows = (size_t)(o->batch > VAL_ROWS ? o->batch : VAL_ROWS);
    r->x = malloc(sizeof(int32_t) * rows * (size_t)o->shape.context);
    r->y = malloc(sizeof(int32_t) * rows * (size_t)o->shape.context);
    r->d = loom_devices_new(&(loom_devices_config){
        .count = (int)o->devices, .cores = (int)o->cores, .timeout_s = o->timeout});
    r->full = loom_graph_new(r->m), r->tail = loom_graph_new(r->m);
    if (!r->x || !r->y || !r->d || !r->full || !r->tail || loom_graph_set_devices(r->full, r->d) ||
        loom_graph_set_devices(r->tail, r->d))
        return cli_fail("%s", *loom_last_error() ? loom_last_error() : "out of memory");
    return agree(o, r);
}

/* The text's vocabulary, its characters in token order as UTF-8 (malloc'd; NULL: no memory). */
static char *vocabulary(const loom_text *t) {
    int64_t v = loom_text_vocab(t);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)v);
    char *s = malloc(4 * (size_t)v + 1);
    for (int64_t i = 0; tok && i < v; i++)
        tok[i] = (int32_t)i;
    if (tok && s)
        loom_text_decode(t, tok, v, s, 4 * (size_t)v + 1);
    free(tok);
    if (!tok)
        free(s), s = NULL;
    return s;
}

/* The length of the UTF-8 character at s (1 for a byte that starts none). */
static int char_len(const char *s) {
    unsigned c = (unsigned char)*s;
    int n = c < 0x80             ? 1
            : (c & 0xE0) == 0xC0 ? 2
            : (c & 0xF0) == 0xE0 ? 3
            : (c & 0xF8) == 0xF0 ? 4
                                 : 1;
    for (int i = 1; i < n; i++)
        if (!s[i])
            return i;
    return n;
}

/* Whether --init's weights were trained on the data's vocabulary: loom's weights carry theirs
 * ("vocabulary" in the safetensors metadata), compared character by character; weights without
 * it (PyTorch's) are taken with a warning. 0, or 1 after one line naming the first difference. */
static int check_vocabulary(const gpt_run *r, const char *init) {
    const char *theirs = loom_model_meta(r->m, "vocabulary");
    char *ours = vocabulary(r->text);
    if (!ours)
        return cli_fail("--init: out of memory");
    int rc = 0;
    if (!theirs) {
        fprintf(stderr,
                "loom: --init: %s records no vocabulary (not loom's weights?): taken to be "
                "the %lld characters of the data\n",
                init, (long long)loom_text_vocab(r->text));
    } else if (strcmp(theirs, ours) != 0) {
        const char *a = theirs, *b = ours;
        int64_t k = 0;
        while (*a && *b && char_len(a) == char_len(b) && !memcmp(a, b, (size_t)char_len(a)))
            a += char_len(a), b += char_len(b), k++;
        char wa[8] = "(none)", wb[8] = "(none)";
        if (*a)
            snprintf(wa, sizeof wa, "'%.*s'", char_len(a), a);
        if (*b)
            snprintf(wb, sizeof wb, "'%.*s'", char_len(b), b);
        rc = cli_fail("--init: %s was trained on another vocabulary: token %lld is %s there, %s in "
                      "the data",
                      init, (long long)k, wa, wb);
    }
    free(ours);
    return rc;
}

/* hf: the folder's tokenizer and model (--init DIR), the text cut by the tokenizer; the context
 * the model's unless --context asks for a shorter one. */
static int run_new_hf(gpt_opts *o, gpt_run *r) {
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", o->init);
    if (loom_tokenizer_load(path, &r->tok))
        return cli_fail("--init: %s", loom_last_error());
    if (!(r->m = loom_model_new()) || loom_hf_open(o->init, r->m, &r->hf))
        return cli_fail("--init: %s", r->m ? loom_last_error() : "out of memory");
    int64_t ids = loom_tokenizer_vocab(r->tok), vocab = loom_hf_vocab(r->hf);
    int64_t most = loom_hf_context(r->hf);
    if (ids > vocab)
        return cli_fail("--init: %s has ids up to %lld, but config.json's vocabulary is %lld", path,
                        (long long)ids - 1, (long long)vocab);
    if (o->given & 8 && o->shape.context > most)
        return cli_fail("--context: %lld, longer than the model's %lld positions",
                        (long long)o->shape.context, (long long)most);
    if (!(o->given & 8))
        o->shape.context = most;
    if (check_shape(o, false))
        return 2;
    const char *data = o->data ? o->data : default_text();
    if (loom_text_load_tokenized(data, r->tok, &r->text))
        return cli_fail("--data: %s", loom_last_error());
    int64_t ntrain = loom_text_count(r->text, false), nval = loom_text_count(r->text, true);
    if (!o->sample && (o->shape.context >= ntrain || o->shape.context >= nval))
        return cli_fail("--context: %lld tokens, longer than the text's training split (%lld) or "
                        "validation split (%lld) (give a shorter --context)",
                        (long long)o->shape.context, (long long)ntrain, (long long)nval);
    return 0;
}

/* The text, the model of the options' shape, and --init's weights. */
static int run_new(gpt_opts *o, gpt_run *r) {
    memset(r, 0, sizeof *r);
    if (o->hf)
        return run_new_hf(o, r);
    const char *path = o->data ? o->data : default_text();
    if (loom_text_load(path, &r->text))
        return cli_fail("--data: %s", loom_last_error());
    loom_gpt_config c = o->shape;
    c.vocab = loom_text_vocab(r->text), c.dropout = o->dropout;
    int64_t ntrain = loom_text_count(r->text, false), nval = loom_text_count(r->text, true);
    if (!o->sample && (c.context >= ntrain || c.context >= nval))
        return cli_fail("--context: %lld tokens, longer than the text's training split (%lld) or "
                        "validation split (%lld)",
                        (long long)c.context, (long long)ntrain, (long long)nval);
    r->m = loom_model_new();
    if (!(r->gpt = loom_gpt_new(r->m, &c)))
        return cli_fail("%s", loom_last_error());
    loom_gpt_init(r->gpt, o->seed);
    if (o->init && loom_model_load(r->m, o->init))
        return cli_fail("--init: %s", loom_last_error());
    if (o->init && check_vocabulary(r, o->init))
        return 1;
    return 0;
}

/* The mean loss over the whole validation split, in non-overlapping windows of the context (every
 * token counted once, whatever the devices). */
static double val_loss(gpt_run *r, int64_t T) {
    int64_t n = loom_text_count(r->text, true);
    int64_t windows = (n - 1) / T, per = VAL_ROWS;
    int32_t *x = r->x, *y = r->y;
    double total = 0;
    set_train(r, false, 0, 0); /* (dropout off) */
    for (int64_t w0 = 0; w0 < windows; w0 += per) {
        int64_t rows = windows - w0 < per ? windows - w0 : per, shape[2] = {rows, T};
        for (int64_t k = 0; k < rows; k++) {
            loom_text_tokens(r->text, true, (w0 + k) * T, T, x + k * T);
            loom_text_tokens(r->text, true, (w0 + k) * T + 1, T, y + k * T);
        }
        loom_graph *g = rows == per ? r->full : r->tail;
        loom_graph_reset(g);
        loom_tensor *xi = loom_input_batch(g, LOOM_I32, 2, shape, x);
        loom_tensor *yi = loom_input_batch(g, LOOM_I32, 2, shape, y);
        loom_tensor *loss = loom_cross_entropy(g, forward(r, g, xi), yi);
        loom_output(loss);
        if (loom_graph_run(g))
            return NAN;
        total += loom_item(loss) * (double)rows;
    }
    return total / (double)windows;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A training run's state beside gpt_run: its optimizer and step graph, the steps done, the
 * validation losses (the last and the best), and the newest checkpoint (step and path). */
typedef struct {
    loom_optim *opt;
    loom_graph *g;
    cli_log *log; /* --log-dir's metrics.csv and TensorBoard file (process 0's) */
    bool talk;    /* process 0 of the job: prints, saves, checkpoints, logs */
    int64_t step, ckpt_step;
    double last_val, best;
    char ckpt[4200];
} gpt_train;

/* What may differ when a run is resumed: the rest shapes it. */
static const char *const may_change[] = {"--steps", "--eval-interval", "--timeout", "--init", NULL};

/* A checkpoint after t->step steps (none when one is there), with the validation loss just
 * measured (NaN: none). */
static int checkpoint(gpt_opts *o, gpt_run *r, gpt_train *t, double monitored) {
    if (!o->ck.dir || t->ckpt_step == t->step)
        return 0;
    loom_run_position at = {.step = t->step,
                            .epoch = -1, /* (windows keyed by the step: no epochs) */
                            .batch = -1,
                            .monitor = "val_loss",
                            .best = t->best,
                            .val_loss = t->last_val,
                            .val_accuracy = NAN,
                            .world = loom_devices_world(r->d)};
    if (loom_run_position_set(r->m, &at))
        return cli_fail("%s", loom_last_error());
    if (cli_ckpt_write(&o->ck, r->m, t->opt, t->step, monitored, t->talk, t->ckpt, sizeof t->ckpt))
        return 1;
    t->ckpt_step = t->step;
    return 0;
}

/* --resume: the checkpoint's weights, optimizer state and step, once its configuration is found
 * to be this run's. */
static int resume(gpt_opts *o, gpt_run *r, gpt_train *t) {
    if (loom_checkpoint_resume(o->ck.resume, r->m, t->opt, &t->step, t->ckpt, sizeof t->ckpt))
        return cli_fail("--resume: %s", loom_last_error());
    int bad = cli_resume_check(r->m, &r->it, t->ckpt, may_change);
    if (bad)
        return bad;
    loom_run_position at;
    if (loom_run_position_get(r->m, &at))
        return cli_fail("--resume: %s: %s", t->ckpt, loom_last_error());
    t->best = at.best, t->last_val = at.val_loss;
    t->ckpt_step = t->step;
    if (t->talk)
        printf("loom: resuming from %s: step %lld of %lld\n", t->ckpt, (long long)t->step,
               (long long)o->steps);
    return 0;
}

/* hf's --save DIR: made (with its parents) and writable, before any training. 0, or 1. */
static int check_save_dir(const char *dir) {
    char path[4200];
    size_t n = strlen(dir);
    if (n >= 4000)
        return cli_fail("--save: a path of %zu bytes, expected fewer", n);
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(path, 0777);
            *p = '/';
        }
    if (mkdir(path, 0777) != 0 && errno != EEXIST)
        return cli_fail("--save: cannot create the folder %s: %s", dir, strerror(errno));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    return cli_check_save(path);
}

/* The model, devices, optimizer and step graph of a training run; its checkpoint when resumed;
 * the configuration and vocabulary in the model's metadata (for every file it writes). */
static int train_setup(gpt_opts *o, gpt_run *r, gpt_train *t) {
    int rc = run_new(o, r);
    if (!rc && o->save)
        rc = o->hf ? check_save_dir(o->save) : cli_check_save(o->save);
    if (!rc)
        rc = run_devices(o, r);
    if (rc)
        return rc;
    t->opt = loom_adamw_new(r->m, &(loom_optim_config){.lr = o->lr,
                                                       .beta2 = o->beta2,
                                                       .weight_decay = o->weight_decay,
                                                       .warmup_steps = o->warmup,
                                                       .decay_steps = o->decay,
                                                       .min_lr = o->min_lr,
                                                       .clip_norm = o->clip});
    t->g = loom_graph_new(r->m);
    if (!t->opt || !t->g || loom_graph_set_devices(t->g, r->d))
        return cli_fail("%s", loom_last_error());
    loom_optim_decay_matrices_only(t->opt, o->weight_decay);
    t->talk = loom_devices_process(r->d) == 0;
    if (o->ck.resume && (rc = resume(o, r, t)))
        return rc;
    char *vocab = o->hf ? NULL : vocabulary(r->text);
    if ((!o->hf && !vocab) || (vocab && loom_model_set_meta(r->m, "vocabulary", vocab)) ||
        cli_config_meta(r->m, &r->it))
        rc = cli_fail("%s", o->hf || vocab ? loom_last_error() : "out of memory");
    free(vocab);
    if (!rc && t->talk && o->log_dir &&
        !(t->log = cli_log_open(o->log_dir, "step,loss,lr,tokens_per_s,val_loss\n", o->log_warn,
                                o->ck.resume ? t->step : -1)))
        rc = 1;
    return rc;
}

/* Step t->step's row and scalars: its loss, learning rate and `rate` tokens a second. */
static int log_step(gpt_train *t, double loss, double rate) {
    double lr = loom_optim_lr_at(t->opt, t->step - 1);
    return cli_log_row(t->log, "%lld,%.6f,%g,%.1f,\n", (long long)t->step, loss, lr, rate) ||
           cli_log_scalar(t->log, "train/loss", t->step, loss) ||
           cli_log_scalar(t->log, "train/lr", t->step, lr) ||
           cli_log_scalar(t->log, "train/tokens_per_s", t->step, rate);
}

/* Optimizer step s (from 0): its --accumulate micro-batches of text windows, each keyed by seed
 * and its own index (s with one, s x N + k with N), dropout keyed the same; their gradients
 * summed, the update with the last; the mean of their losses into *loss. */
static int train_step(gpt_opts *o, gpt_run *r, gpt_train *t, int64_t s, double *loss) {
    int64_t T = o->shape.context, B = o->batch, shape[2] = {B, T};
    int64_t A = o->accumulate > 1 ? o->accumulate : 1;
    loom_graph *g = t->g;
    *loss = 0;
    for (int64_t k = 0; k < A; k++) {
        int64_t key = s * A + k;
        if (loom_text_batch(r->text, key, B, T, o->seed, !o->no_shuffle, r->x, r->y))
            return cli_fail("%s", loom_last_error());
        loom_graph_reset(g);
        set_train(r, true, o->seed, key);
        loom_tensor *xi = loom_input_batch(g, LOOM_I32, 2, shape, r->x);
        loom_tensor *yi = loom_input_batch(g, LOOM_I32, 2, shape, r->y);
        loom_tensor *l = loom_cross_entropy(g, forward(r, g, xi), yi);
        if (A > 1)
            loom_backward_accumulate(g, l, 1.0 / (double)A, k == 0, k == A - 1);
        else
            loom_backward(g, l);
        if (k == A - 1)
            loom_optim_step(g, t->opt);
        if (loom_graph_run(g))
            return cli_fail("step %lld: %s", (long long)s + 1, loom_last_error());
        *loss += loom_item(l) / (double)A;
    }
    t->step = s + 1;
    return 0;
}

/* --devices auto's trial (cli_choose_split): the run's first steps on D devices of C cores. */
static int trial(void *ctx, int D, int C, double *dt) {
    gpt_opts o = *(const gpt_opts *)ctx;
    o.devices = D, o.cores = C;
    o.quiet = true, o.save = NULL, o.log_dir = NULL, o.ck = (ckpt_opts){0};
    gpt_run r = {0};
    gpt_train t = {.ckpt_step = -1, .last_val = NAN, .best = NAN};
    int rc = train_setup(&o, &r, &t);
    for (int64_t s = 0; !rc && cli_trial_more(dt, s); s++) {
        double ts = now(), loss;
        rc = train_step(&o, &r, &t, s, &loss);
        dt[s] = now() - ts;
    }
    loom_graph_free(t.g);
    loom_optim_free(t.opt);
    run_free(&r);
    return rc;
}

static int train(gpt_opts *o) {
    gpt_run r = {0};
    gpt_train t = {.ckpt_step = -1, .last_val = NAN, .best = NAN};
    int rc = cli_choose_split(trial, o, &o->devices, &o->cores);
    if (!rc)
        rc = train_setup(o, &r, &t);
    int64_t T = o->shape.context, every = o->ck.every;
    cli_catch_stop();
    cli_stop_agree(rc ? NULL : r.d);
    char cores[32] = "";
    if (!rc && loom_devices_cores(r.d) > 1)
        snprintf(cores, sizeof cores, " of %d cores", loom_devices_cores(r.d));
    if (!rc && t.talk && o->hf)
        printf("%s: context %lld, vocabulary %lld, %lld parameters; %d device(s)%s, batch %lld, "
               "%lld steps\n",
               o->init, (long long)T, (long long)loom_text_vocab(r.text),
               (long long)loom_model_numel(r.m), loom_devices_world(r.d), cores,
               (long long)o->batch, (long long)o->steps);
    else if (!rc && t.talk)
        printf("shakespeare-gpt: %lld layers, %lld heads, width %lld, context %lld, vocabulary "
               "%lld, %lld parameters; %d device(s)%s, batch %lld, %lld steps\n",
               (long long)o->shape.layers, (long long)o->shape.heads, (long long)o->shape.width,
               (long long)T, (long long)loom_text_vocab(r.text), (long long)loom_model_numel(r.m),
               loom_devices_world(r.d), cores, (long long)o->batch, (long long)o->steps);
    fflush(stdout); /* (the banner now, where stdout is a pipe or a file: training began) */
    double sum = 0, t0 = now(), t_interval = t0, eval_s = 0, loss = 0;
    int64_t counted = 0;
    cli_progress bar;
    cli_progress_init(&bar, o->quiet || !t.talk, "tokens", 0);
    for (int64_t s = t.step; !rc && s < o->steps && !cli_stopping(); s++) {
        double ts = now();
        if ((rc = train_step(o, &r, &t, s, &loss)))
            break;
        /* the step's tokens and product flops: its micro-batches' (each a run of t.g) */
        int64_t A = o->accumulate > 1 ? o->accumulate : 1;
        double dt = now() - ts, rate = (double)(o->batch * T * A) / (dt + 1e-12);
        if ((rc = log_step(&t, loss, rate)))
            break;
        sum += loss, counted++;
        loom_metrics gm;
        loom_graph_metrics(t.g, &gm);
        cli_progress_step(&bar, &(cli_step){"step", t.step, o->steps, t.step, o->steps, loss, rate,
                                            gm.flops * (double)A, dt});
        bool eval = t.step % o->eval_interval == 0 || t.step == o->steps;
        bool due = every ? t.step % every == 0 : eval;
        if (!eval) {
            rc = due ? checkpoint(o, &r, &t, NAN) : 0;
            continue;
        }
        double te = now(), ms = 1e3 * (te - t_interval) / (double)counted;
        double v = t.last_val = val_loss(&r, T);
        eval_s += now() - te;
        if (isnan(v)) {
            rc = cli_fail("validation after step %lld: %s", (long long)t.step, loom_last_error());
            break;
        }
        t.best = isnan(t.best) || v < t.best ? v : t.best;
        if (t.talk)
            cli_progress_line(
                &bar, "step %lld: train loss %.4f, val loss %.4f, lr %.3g, %.1f ms a step\n",
                (long long)t.step, sum / (double)counted, v, loom_optim_lr(t.opt), ms);
        sum = 0, counted = 0, t_interval = now();
        rc = cli_log_row(t.log, "%lld,,,,%.6f\n", (long long)t.step, v) ||
             cli_log_scalar(t.log, "val/loss", t.step, v) || cli_log_flush(t.log);
        rc = rc ? rc : due ? checkpoint(o, &r, &t, v) : 0;
    }
    cli_progress_end(&bar);
    if (!rc) /* at the end, or where a signal stopped the run */
        rc = checkpoint(o, &r, &t, cli_stop_signal() ? NAN : t.last_val);
    if (!rc && cli_stop_signal()) /* (across processes: they all stopped after this step) */
        rc = cli_stop_report(t.talk, t.step, t.ckpt, o->ck.dir,
                             o->save ? "no weights saved" : "nothing else written");
    cli_stop_agree(NULL);
    if (!rc && t.talk) {
        printf("val loss: %.4f\n", t.last_val);
        printf("%lld steps in %.1f s (evaluation %.1f s of it)\n", (long long)o->steps, now() - t0,
               eval_s);
        printf("summary: %lld steps in %.1f s; best val loss %.4f; %s%s\n", (long long)t.step,
               now() - t0, t.best, o->ck.dir ? "checkpoint " : "no checkpoint (--checkpoint-dir)",
               o->ck.dir ? t.ckpt : "");
    }
    if (!rc && o->save && t.talk &&
        (o->hf ? loom_hf_save(r.hf, o->save) : loom_model_save(r.m, o->save)))
        rc = cli_fail("--save: %s", loom_last_error());
    if (cli_log_close(t.log) && !rc)
        rc = 1;
    loom_graph_free(t.g);
    loom_optim_free(t.opt);
    run_free(&r);
    return rc;
}

/* The next token from logits (vocab) at temperature, among the top k, by u uniform in [0, 1). */
static int32_t pick(const float *logits, int64_t vocab, double temperature, int64_t k, double u,
                    double *p) {
    if (temperature == 0) { /* greedy: the first of the largest, as torch.argmax */
        int64_t best = 0;
        for (int64_t i = 1; i < vocab; i++)
            best = logits[i] > logits[best] ? i : best;
        return (int32_t)best;
    }
    double kth = INFINITY;
    if (k < vocab) { /* the k-th largest logit: those below it are out */
        for (int64_t i = 0; i < vocab; i++)
            p[i] = logits[i];
        for (int64_t n = 0; n < k; n++) {
            int64_t best = -1;
            for (int64_t i = 0; i < vocab; i++)
                if (p[i] > -INFINITY && (best < 0 || p[i] > p[best]))
                    best = i;
            kth = p[best], p[best] = -INFINITY;
        }
    }
    double mx = -INFINITY, sum = 0;
    for (int64_t i = 0; i < vocab; i++)
        mx = fmax(mx, logits[i]);
    for (int64_t i = 0; i < vocab; i++) {
        p[i] = k < vocab && logits[i] < kth ? 0 : exp((logits[i] - mx) / temperature);
        sum += p[i];
    }
    double c = 0;
    for (int64_t i = 0; i < vocab; i++)
        if ((c += p[i] / sum) > u)
            return (int32_t)i;
    return (int32_t)(vocab - 1);
}

/* What decoding toks[0, n) adds to the *printed bytes already on stdout (decoded whole: a
 * tokenizer's first space is dropped once, a character may span tokens). */
static void show(const gpt_run *r, const int32_t *toks, int64_t n, size_t *printed) {
    size_t len = r->tok ? loom_tokenizer_decode(r->tok, toks, n, NULL, 0) : 4 * (size_t)n;
    char *buf = malloc(len + 1);
    if (!buf)
        return;
    len = r->tok ? loom_tokenizer_decode(r->tok, toks, n, buf, len + 1)
                 : loom_text_decode(r->text, toks, n, buf, len + 1);
    if (len > *printed)
        fwrite(buf + *printed, 1, len - *printed, stdout);
    *printed = len;
    fflush(stdout);
    free(buf);
}

static int sample(gpt_opts *o) {
    gpt_run r;
    int rc = run_new(o, &r);
    int64_t T = o->shape.context, n = 0, start = 0, bytes = 0;
    int64_t V = rc ? 0 : r.hf ? loom_hf_vocab(r.hf) : loom_text_vocab(r.text);
    int32_t *toks = NULL, *win = NULL;
    double *p = NULL;
    if (!rc && !cli_mul("--tokens + --start", 3 * (int64_t)strlen(o->start) + o->tokens + 17,
                        sizeof(int32_t), INT64_MAX / 2, &bytes))
        rc = 2;
    if (!rc && (!(toks = malloc((size_t)bytes)) || !(win = malloc(sizeof(int32_t) * (size_t)T)) ||
                !(p = malloc(sizeof(double) * (size_t)(V + 1)))))
        rc = cli_fail("--tokens: out of memory for %lld tokens", (long long)o->tokens);
    if (!rc && loom_text_encode(r.text, o->start, toks, &n))
        rc = cli_fail("--start: %s", loom_last_error());
    if (!rc && n == 0)
        rc = cli_fail("--start: expected at least one character to start from");
    loom_graph *g = rc ? NULL : loom_graph_new(r.m);
    if (!rc)
        cli_catch_stop();
    start = n;
    size_t printed = 0;
    for (int64_t i = 0; !rc && i < o->tokens * o->num_samples && !cli_stopping(); i++) {
        if (i % o->tokens == 0) { /* a sample begins: the prompt again (nanoGPT's separator) */
            if (i)
                fputs("\n---------------\n", stdout);
            n = start, printed = 0;
            show(&r, toks, n, &printed);
        }
        /* the last T tokens (fewer at first: then padded after, which causal attention ignores) */
        int64_t len = n < T ? n : T, shape[2] = {1, T};
        memset(win, 0, sizeof(int32_t) * (size_t)T);
        memcpy(win, toks + n - len, sizeof(int32_t) * (size_t)len);
        loom_graph_reset(g);
        loom_tensor *logits = forward(&r, g, loom_input(g, LOOM_I32, 2, shape, win));
        loom_output(logits);
        if (loom_graph_run(g)) {
            rc = cli_fail("sample: %s", loom_last_error());
            break;
        }
        const float *l = (const float *)loom_tensor_data(logits) + (len - 1) * V;
        toks[n++] = pick(l, V, o->temperature, o->top_k,
                         loom_rand_uniform(o->seed, 4ull << 32, (uint64_t)i), p);
        show(&r, toks, n, &printed);
    }
    if (!rc)
        fputc('\n', stdout);
    if (!rc && cli_stop_signal())
        rc = 128 + cli_stop_signal();
    loom_graph_free(g);
    run_free(&r);
    free(toks), free(win), free(p);
    return rc;
}

/* `loom eval shakespeare-gpt --init FILE`: the validation loss of weights (loom's or PyTorch's). */
static int eval(gpt_opts *o) {
    gpt_run r;
    int rc = run_new(o, &r);
    if (!rc)
        rc = run_devices(o, &r);
    double v = rc ? NAN : val_loss(&r, o->shape.context);
    if (!rc && isnan(v))
        rc = cli_fail("eval: %s", loom_last_error());
    if (!rc && loom_devices_process(r.d) == 0)
        printf("val loss: %.4f\n", v);
    run_free(&r);
    return rc;
}

/* The model's shape from the configuration that --init's file records (loom's weights and
 * checkpoints keep it as "config.--layers" ...), for each of the four options not given; a
 * given one that differs from the file's is refused. 0, or 2 after one line. */
static int shape_of_init(gpt_opts *o) {
    static const char *const flags[4] = {"--layers", "--heads", "--width", "--context"};
    static const int64_t max[4] = {1024, 4096, 65536, 65536};
    int64_t *dst[4] = {&o->shape.layers, &o->shape.heads, &o->shape.width, &o->shape.context};
    loom_tensor_file *f;
    if (loom_tensor_file_read_header(o->init, &f)) /* (--init's load says why, naming the file) */
        return check_shape(o, true) ? 2 : 0;
    int rc = 0;
    for (int k = 0; k < 4 && !rc; k++) {
        char key[32], where[80];
        snprintf(key, sizeof key, "config.%s", flags[k]);
        snprintf(where, sizeof where, "%s (the configuration of --init's file)", key);
        const char *v = loom_tensor_file_meta(f, key);
        int64_t x;
        if (!v)
            continue;
        if (!cli_int(where, v, 1, max[k], &x))
            rc = 2;
        else if (o->given & (1u << k) && x != *dst[k])
            rc = 1 + cli_fail("%s: %lld here, but %s was trained with %s %lld (leave it out to "
                              "take the file's)",
                              flags[k], (long long)*dst[k], o->init, flags[k], (long long)x);
        else
            *dst[k] = x;
    }
    loom_tensor_file_free(f);
    return rc ? rc : check_shape(o, true) ? 2 : 0;
}

int cli_gpt(int argc, char **argv) {
    gpt_opts o;
    cli_quiet_others(true);
    int rc = cli_gpt_parse(argc, argv, &o);
    if (!rc && o.init && !o.hf)
        rc = shape_of_init(&o);
    cli_quiet_others(false);
    if (rc)
        return rc;
    if ((o.sample || o.eval) && o.devices == CLI_DEVICES_AUTO)
        o.devices = 0; /* (evaluation: one device a core) */
    return o.sample ? sample(&o) : o.eval ? eval(&o) : train(&o);
}
