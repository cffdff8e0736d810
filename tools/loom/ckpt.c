/*
 * ckpt.c - what every training command shares about checkpoints: the run's configuration kept
 * in the model's metadata (so that every checkpoint and weights file says how it was made; where
 * the run was is loom_run_position's), the comparison of a resumed checkpoint's configuration
 * with the run's, and the write by the job's process 0 into --checkpoint-dir.
 */
#include "cli.h"

#include <inttypes.h>
#include <string.h>

/* Item it's name (before '=') into name; its value after it. */
static const char *split_item(const char *item, char *name, size_t cap) {
    const char *eq = strchr(item, '=');
    size_t n = eq ? (size_t)(eq - item) : strlen(item);
    snprintf(name, cap, "config.%.*s", (int)n, item);
    return eq ? eq + 1 : "";
}

int cli_config_meta(loom_model *m, const cli_items *it) {
    for (int i = 0; i < it->n; i++) {
        char key[128];
        const char *v = split_item(it->p[i], key, sizeof key);
        if (loom_model_set_meta(m, key, v))
            return cli_fail("%s", loom_last_error());
    }
    return 0;
}

int cli_resume_check(const loom_model *m, const cli_items *it, const char *path,
                     const char *const *may_change) {
    for (int i = 0; i < it->n; i++) {
        char key[128];
        const char *v = split_item(it->p[i], key, sizeof key), *name = key + 7;
        bool may = false;
        for (int k = 0; may_change[k] && !may; k++)
            may = !strcmp(may_change[k], name);
        const char *theirs = loom_model_meta(m, key);
        if (may || (theirs && !strcmp(theirs, v)))
            continue;
        if (!theirs)
            return cli_fail("--resume: %s does not record %s (not a checkpoint of this command?)",
                            path, name),
                   2;
        char list[256] = "";
        for (int k = 0; may_change[k]; k++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s, ", may_change[k]);
        return cli_fail("--resume: %s is a run with %s %s, this one has %s: a resumed run keeps "
                        "what shapes it (only %s--devices and the checkpoint and log options "
                        "may change)",
                        path, name, theirs, v, list),
               2;
    }
    return 0;
}

int cli_ckpt_write(const ckpt_opts *c, loom_model *m, loom_optim *o, int64_t steps,
                   double monitored, bool writer, char *path, size_t cap) {
    if (!writer)
        return 0;
    loom_checkpoint_config cc = {.dir = c->dir, .keep = c->keep, .maximize = c->monitor_acc};
    if (loom_checkpoint_write(&cc, m, o, steps, monitored, path, cap))
        return cli_fail("checkpoint after step %" PRId64 ": %s", steps, loom_last_error());
    return 0;
}

int cli_recipe_of(train_opts *o) {
    static char recipe[64];
    if (o->recipe)
        return 0;
    loom_tensor_file *f;
    if (loom_tensor_file_read_header(o->init, &f))
        return cli_fail("--init: %s", loom_last_error());
    const char *r = loom_tensor_file_meta(f, "config.recipe");
    snprintf(recipe, sizeof recipe, "%s", r ? r : "");
    loom_tensor_file_free(f);
    if (!*recipe)
        return cli_fail("%s: expected a recipe: %s records none (fmnist-mlp or fmnist-cnn)",
                        o->eval_only ? "eval" : "train", o->init),
               2;
    o->recipe = recipe;
    return 0;
}
