/*
 * checkpoint.c - full-state checkpoints: one safetensors file holds the parameters under their
 * names (as loom_model_save writes them), the optimizer's state beside them as
 * "optimizer.<parameter>.<key>" with PyTorch's keys, and in its metadata the optimizer's kind and
 * step count with the model's own metadata (where the caller keeps the rest of a run's state).
 * A directory of checkpoints (step-NNNNNN.safetensors) has an index, DIR/index.tsv, of those it
 * keeps with their monitored values; every file, the index too, is written atomically, the
 * checkpoint before the index that lists it and files are removed only after the index that
 * drops them, so a process killed at any instant leaves the previous checkpoint and its index.
 */
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The metadata keys a checkpoint's writer sets (loom__model_take_file takes them off again). */
static const char *const own_keys[] = {"loom.checkpoint", "optimizer", "optimizer.step"};
enum { NOWN = 3 };

loom_status loom_checkpoint_save(const char *path, const loom_model *cm, loom_optim *o,
                                 int64_t steps) {
    if (!path || !cm || !o || steps < 0)
        return loom__error(LOOM_EINVAL, "loom_checkpoint_save: %s",
                           steps < 0 ? "negative step count" : "NULL argument");
    loom_model *m = (loom_model *)(uintptr_t)cm; /* (read only: settled, its state's pointers) */
    loom__model_settle(m);
    int keys = loom_optim_state_keys(o);
    int64_t n, extra = m->n * keys;
    loom__st_tensor *t = loom__model_tensors(m, extra, &n);
    char *names = t ? loom__malloc((size_t)(extra + 1) * 300) : NULL;
    loom__meta md = {0};
    loom_status s = !t || !names ? LOOM_ENOMEM : LOOM_OK;
    for (int64_t i = 0; !s && i < m->n; i++)
        for (int k = 0; k < keys; k++) {
            const loom_param *p = m->params[i];
            char *name = names + (size_t)(i * keys + k) * 300;
            snprintf(name, 300, "optimizer.%.200s.%s", p->name, loom_optim_state_key(o, k));
            t[n++] =
                (loom__st_tensor){name, p->ndim, p->shape, loom_optim_state(o, p, k), p->numel};
        }
    char step[32];
    snprintf(step, sizeof step, "%lld", (long long)steps);
    for (int64_t i = 0; !s && i < m->meta.n; i++)
        s = loom__meta_set(&md, m->meta.key[i], m->meta.val[i]);
    const char *vals[NOWN] = {"1", loom_optim_name(o), step};
    for (int k = 0; !s && k < NOWN; k++)
        s = loom__meta_set(&md, own_keys[k], vals[k]);
    if (!s)
        s = loom__safetensors_write(path, t, n, &md);
    loom__meta_free(&md);
    loom__free(names), loom__free(t);
    return s;
}

/* Whether f (read from path) is a checkpoint of m and o: its parameters (loom_model_load's rules),
 * the optimizer's kind, every parameter's state with its shape and nothing else. *steps: the
 * optimizer's step count. The first that does not match is named. */
static loom_status check(const char *path, const loom_tensor_file *f, const loom_model *m,
                         loom_optim *o, int64_t *steps) {
    const char *kind = loom_tensor_file_meta(f, "optimizer");
    const char *st = loom_tensor_file_meta(f, "optimizer.step");
    if (!loom_tensor_file_meta(f, "loom.checkpoint") || !kind || !st)
        return loom__error(LOOM_EFORMAT,
                           "%s: not a checkpoint (no optimizer state in its metadata): weights "
                           "alone start a run with --init",
                           path);
    char *end;
    errno = 0;
    long long t = strtoll(st, &end, 10);
    if (*end || !*st || t < 0 || errno)
        return loom__error(LOOM_EFORMAT, "%s: metadata optimizer.step is '%.32s', expected a count",
                           path, st);
    if (strcmp(kind, loom_optim_name(o)) != 0)
        return loom__error(LOOM_EINVAL, "%s: a checkpoint of an %s optimizer, this run's is %s",
                           path, kind, loom_optim_name(o));
    loom_status s = loom__model_check_file(m, f, path, "optimizer.");
    int keys = loom_optim_state_keys(o);
    for (int64_t i = 0; !s && i < m->n; i++)
        for (int k = 0; !s && k < keys; k++) {
            const loom_param *p = m->params[i];
            char name[300];
            snprintf(name, sizeof name, "optimizer.%.200s.%s", p->name, loom_optim_state_key(o, k));
            loom_dtype dt;
            int nd;
            const int64_t *shape;
            if (!loom_tensor_file_get(f, name, &dt, &nd, &shape))
                s = loom__error(LOOM_ENOTFOUND,
                                "%s: tensor '%s' is missing (the optimizer needs it)", path, name);
            else if (dt != LOOM_F32 || nd != p->ndim ||
                     memcmp(shape, p->shape, sizeof(int64_t) * (size_t)nd) != 0)
                s = loom__error(LOOM_ESHAPE, "%s: tensor '%s' is not f32 of its parameter's shape",
                                path, name);
        }
    for (int i = 0; !s && i < loom_tensor_file_count(f); i++) { /* no state of another kind */
        const char *name = loom_tensor_file_name(f, i), *dot = strrchr(name, '.');
        if (strncmp(name, "optimizer.", 10) != 0)
            continue;
        char param[300];
        snprintf(param, sizeof param, "%.*s", dot > name + 10 ? (int)(dot - name - 10) : 0,
                 name + 10);
        bool known = false;
        for (int k = 0; k < keys; k++)
            known = known || !strcmp(dot + 1, loom_optim_state_key(o, k));
        if (!known || !loom_model_find(m, param))
            s = loom__error(LOOM_EFORMAT,
                            "%s: tensor '%s' is optimizer state this run's %s optimizer has not",
                            path, name, loom_optim_name(o));
    }
    *steps = t;
    return s;
}

/* Copies f's parameters, state and step count into m and o (checked by check()). */
static void take(loom_tensor_file *f, loom_model *m, loom_optim *o, int64_t steps) {
    int keys = loom_optim_state_keys(o);
    for (int64_t i = 0; i < m->n; i++)
        for (int k = 0; k < keys; k++) {
            const loom_param *p = m->params[i];
            char name[300];
            snprintf(name, sizeof name, "optimizer.%.200s.%s", p->name, loom_optim_state_key(o, k));
            memcpy(loom_optim_state(o, p, k), loom_tensor_file_get(f, name, NULL, NULL, NULL),
                   sizeof(float) * (size_t)p->numel);
        }
    loom__model_take_file(m, f); /* (touches m: the devices' replicas are made again) */
    loom_optim_set_steps(o, steps);
}

loom_status loom_checkpoint_load(const char *path, loom_model *m, loom_optim *o, int64_t *steps) {
    if (!path || !m || !o)
        return loom__error(LOOM_EINVAL, "loom_checkpoint_load: NULL argument");
    loom__model_settle(m);
    loom_tensor_file *f;
    loom_status s = loom_tensor_file_read(path, &f);
    int64_t t = 0;
    if (!s && !(s = check(path, f, m, o, &t)))
        take(f, m, o, t);
    if (!s && steps)
        *steps = t;
    loom_tensor_file_free(f);
    return s;
}

/* ---- a run's position ------------------------------------------------------------------- */

static const char *const position_keys[] = {"loom.step",    "loom.epoch", "loom.batch",
                                            "loom.monitor", "loom.best",  "loom.val_loss",
                                            "loom.val_acc", "loom.world"};

loom_status loom_run_position_set(loom_model *m, const loom_run_position *p) {
    char v[8][40];
    const char *val[8];
    snprintf(v[0], sizeof v[0], "%lld", (long long)p->step);
    snprintf(v[1], sizeof v[1], "%lld", (long long)p->epoch);
    snprintf(v[2], sizeof v[2], "%lld", (long long)p->batch);
    snprintf(v[4], sizeof v[4], "%.17g", p->best);
    snprintf(v[5], sizeof v[5], "%.17g", p->val_loss);
    snprintf(v[6], sizeof v[6], "%.17g", p->val_accuracy);
    snprintf(v[7], sizeof v[7], "%d", p->world);
    for (int k = 0; k < 8; k++)
        val[k] = v[k];
    val[1] = p->epoch >= 0 ? val[1] : NULL, val[2] = p->epoch >= 0 ? val[2] : NULL;
    val[3] = p->monitor;
    loom_status s = LOOM_OK;
    for (int k = 0; k < 8 && !s; k++)
        s = loom__meta_set(&m->meta, position_keys[k], val[k]);
    return s;
}

/* Key k of m's metadata as a number into *v (absent: *v unchanged); false when not one. */
static bool meta_number(const loom_model *m, int k, double *v) {
    const char *s = loom__meta_get(&m->meta, position_keys[k]);
    char *end;
    if (!s)
        return true;
    double x = strtod(s, &end);
    if (!*s || *end)
        return false;
    *v = x;
    return true;
}

loom_status loom_run_position_get(const loom_model *m, loom_run_position *p) {
    double step = NAN, epoch = -1, batch = -1, world = 0;
    *p = (loom_run_position){.best = NAN, .val_loss = NAN, .val_accuracy = NAN};
    bool ok = meta_number(m, 0, &step) && meta_number(m, 1, &epoch) && meta_number(m, 2, &batch) &&
              meta_number(m, 4, &p->best) && meta_number(m, 5, &p->val_loss) &&
              meta_number(m, 6, &p->val_accuracy) && meta_number(m, 7, &world);
    if (!ok || !(step >= 0) || step != floor(step) || epoch != floor(epoch) ||
        batch != floor(batch) || (epoch < 0) != (batch < 0))
        return loom__error(LOOM_EFORMAT,
                           "the model's metadata holds no run position (loom.step, and loom.epoch "
                           "with loom.batch, as whole numbers)");
    p->step = (int64_t)step, p->epoch = (int64_t)epoch, p->batch = (int64_t)batch;
    p->world = (int)world;
    p->monitor = loom__meta_get(&m->meta, position_keys[3]);
    return LOOM_OK;
}

/* ---- a directory of checkpoints ------------------------------------------------------------ */

typedef struct {
    int64_t step;
    double value; /* the monitored value, NaN: none */
} slot;

/* The index's slots (step order, as written), *n of them (0: no index). EFORMAT naming the line
 * that is not "step-<N>.safetensors<TAB><N><TAB><value>". */
static loom_status read_index(const char *dir, slot **out, int64_t *n) {
    char path[4200], line[512];
    snprintf(path, sizeof path, "%s/index.tsv", dir);
    *out = NULL, *n = 0;
    FILE *fp = fopen(path, "r");
    if (!fp)
        return errno == ENOENT
                   ? LOOM_OK
                   : loom__error(LOOM_EIO, "%s: cannot open: %s", path, strerror(errno));
    int64_t cap = 0, lineno = 0;
    loom_status s = LOOM_OK;
    while (!s && fgets(line, sizeof line, fp)) {
        lineno++;
        if (line[0] == '#')
            continue;
        long long step, again;
        char value[64], nl;
        int used = 0;
        bool ok = sscanf(line, "step-%lld.safetensors\t%lld\t%63s%c%n", &step, &again, value, &nl,
                         &used) == 4 &&
                  nl == '\n' && step == again && step >= 0 && !line[used];
        char *end;
        double v = ok ? strtod(value, &end) : 0;
        if (!ok || *end)
            s = loom__error(LOOM_EFORMAT,
                            "%s line %lld: expected step-<N>.safetensors, N and the monitored "
                            "value, tab-separated",
                            path, (long long)lineno);
        else if (loom__grow((void **)out, &cap, *n + 1, sizeof **out))
            s = LOOM_ENOMEM;
        else
            (*out)[(*n)++] = (slot){step, v};
    }
    fclose(fp);
    if (s)
        loom__free(*out), *out = NULL, *n = 0;
    return s;
}

static loom_status write_index(const char *dir, const slot *sl, int64_t n) {
    char path[4200], *text = loom__malloc(160 + (size_t)n * 112);
    if (!text)
        return LOOM_ENOMEM;
    size_t k =
        (size_t)sprintf(text, "# loom checkpoints, oldest first: file, step, monitored value "
                              "(nan: none)\n");
    for (int64_t i = 0; i < n; i++)
        k += (size_t)sprintf(text + k, "step-%06lld.safetensors\t%lld\t%.17g\n",
                             (long long)sl[i].step, (long long)sl[i].step, sl[i].value);
    snprintf(path, sizeof path, "%s/index.tsv", dir);
    loom_status s = loom__write_atomic(path, &(loom__part){text, k}, 1);
    loom__free(text);
    return s;
}

/* The slot with the best value (the newest of equals; -1: none has one). */
static int64_t best_slot(const slot *sl, int64_t n, bool maximize) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++)
        if (!isnan(sl[i].value) && (best < 0 || (maximize ? sl[i].value >= sl[best].value
                                                          : sl[i].value <= sl[best].value)))
            best = i;
    return best;
}

loom_status loom_checkpoint_write(const loom_checkpoint_config *c, const loom_model *m,
                                  loom_optim *o, int64_t steps, double monitored, char *path,
                                  size_t cap) {
    if (!c || !c->dir || !*c->dir || c->keep < 0 || !path || cap == 0)
        return loom__error(LOOM_EINVAL, "loom_checkpoint_write: %s",
                           c && c->keep < 0 ? "keep < 0" : "NULL argument or directory");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", c->dir);
    if (!loom__mkdirs(dir))
        return loom__error(LOOM_EIO, "%s: cannot create the checkpoint directory: %s", dir,
                           strerror(errno));
    slot *sl;
    int64_t n, cap_sl;
    loom_status s = read_index(dir, &sl, &n);
    if (s)
        return s;
    snprintf(path, cap, "%s/step-%06lld.safetensors", dir, (long long)steps);
    if ((s = loom_checkpoint_save(path, m, o, steps))) {
        loom__free(sl);
        return s;
    }
    int64_t keep_from = 0, w = 0; /* the slots of later steps than this are of an abandoned run */
    while (keep_from < n && sl[keep_from].step < steps)
        keep_from++;
    slot *old = sl;
    int64_t nold = n;
    cap_sl = 0;
    sl = NULL;
    if (loom__grow((void **)&sl, &cap_sl, keep_from + 1, sizeof *sl)) {
        loom__free(old);
        return LOOM_ENOMEM;
    }
    for (int64_t i = 0; i < keep_from; i++)
        sl[i] = old[i];
    sl[keep_from] = (slot){steps, monitored};
    n = keep_from + 1;
    int64_t best = best_slot(sl, n, c->maximize);
    for (int64_t i = 0; i < n; i++) /* the newest `keep` (0: all) and the best */
        if (c->keep == 0 || i >= n - c->keep || i == best)
            sl[w++] = sl[i];
    s = write_index(dir, sl, w);
    for (int64_t i = 0; !s && i < nold; i++) { /* the files the index no longer lists */
        bool kept = false;
        for (int64_t k = 0; k < w; k++)
            kept = kept || sl[k].step == old[i].step;
        char gone[4200];
        snprintf(gone, sizeof gone, "%s/step-%06lld.safetensors", dir, (long long)old[i].step);
        if (!kept && unlink(gone) != 0 && errno != ENOENT)
            loom__log(LOOM_LOG_WARN, "%s: cannot remove: %s", gone, strerror(errno));
    }
    loom__free(old), loom__free(sl);
    return s;
}

/* Whether path is a directory (false, with *missing, when nothing is there). */
static bool is_dir(const char *path, bool *missing) {
    struct stat st;
    *missing = stat(path, &st) != 0 && errno == ENOENT;
    return !*missing && S_ISDIR(st.st_mode);
}

loom_status loom_checkpoint_resume(const char *where, loom_model *m, loom_optim *o, int64_t *steps,
                                   char *path, size_t cap) {
    if (!where || !*where || !m || !o || !path || cap == 0)
        return loom__error(LOOM_EINVAL, "loom_checkpoint_resume: NULL argument");
    bool missing;
    if (!is_dir(where, &missing)) {
        if (missing)
            return loom__error(LOOM_ENOTFOUND, "%s: no such checkpoint file or directory", where);
        snprintf(path, cap, "%s", where);
        return loom_checkpoint_load(where, m, o, steps);
    }
    slot *sl;
    int64_t n;
    loom_status s = read_index(where, &sl, &n);
    if (!s && n == 0)
        s = loom__error(LOOM_ENOTFOUND,
                        "%s: no checkpoint to resume from (the directory has no "
                        "index.tsv, or it lists none)",
                        where);
    loom_tensor_file *f = NULL;
    char why[1024] = "";
    for (int64_t i = n - 1; !s && i >= 0 && !f; i--) { /* the newest that reads whole */
        snprintf(path, cap, "%s/step-%06lld.safetensors", where, (long long)sl[i].step);
        if (loom_tensor_file_read(path, &f) == LOOM_OK)
            break;
        snprintf(why, sizeof why, "%s", loom_last_error());
        loom__log(LOOM_LOG_WARN, "skipping a checkpoint that cannot be read: %s", why);
    }
    if (!s && !f)
        s = loom__error(LOOM_EFORMAT,
                        "%s: none of its %lld checkpoints can be read (the oldest: %s)", where,
                        (long long)n, why);
    int64_t t = 0;
    if (!s && !(s = check(path, f, m, o, &t)))
        take(f, m, o, t);
    if (!s && steps)
        *steps = t;
    loom_tensor_file_free(f);
    loom__free(sl);
    return s;
}
