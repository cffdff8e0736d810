/*
 * callbacks.c - the trainer's built-in callbacks, after Lightning's: EarlyStopping (the run stops
 * once `patience` validations in a row have not improved the monitored value by more than
 * min_delta) and LearningRateMonitor (each step's learning rate into the TensorBoard file, and
 * through the log hook every N steps). Each is a loom_trainer_callback over state the trainer
 * owns; validation gives every process the same values, so every process decides the same.
 */
#include "internal.h"

#include <math.h>

typedef struct {
    loom_early_stopping_config c;
    double best;
    int64_t bad; /* validations in a row without an improvement */
} early_stopping;

static bool early_stop(const loom_trainer_state *s, void *user) {
    early_stopping *e = user;
    if (s->event != LOOM_ON_VALIDATION_END)
        return false;
    double v = e->c.monitor_accuracy ? s->val_accuracy : s->val_loss;
    bool better =
        !isnan(v) && (isnan(e->best) || (e->c.monitor_accuracy ? v > e->best + e->c.min_delta
                                                               : v < e->best - e->c.min_delta));
    if (better) {
        e->best = v, e->bad = 0;
        return false;
    }
    if (++e->bad < e->c.patience)
        return false;
    if (s->first_process)
        loom__log(LOOM_LOG_INFO,
                  "early stopping at step %lld: %s has not improved on %.6g by more than %g for "
                  "%lld validations",
                  (long long)s->step, e->c.monitor_accuracy ? "val_accuracy" : "val_loss", e->best,
                  e->c.min_delta, (long long)e->bad);
    return true;
}

loom_status loom_trainer_early_stopping(loom_trainer *t, const loom_early_stopping_config *c) {
    loom_early_stopping_config cfg = c ? *c : (loom_early_stopping_config){0};
    if (!t || cfg.patience < 0 || !(cfg.min_delta >= 0))
        return loom__error(LOOM_EINVAL, "loom_trainer_early_stopping: %s",
                           !t ? "NULL trainer" : "expected patience >= 0 and min_delta >= 0");
    cfg.patience = cfg.patience ? cfg.patience : 3;
    early_stopping *e = loom__trainer_own(t, sizeof *e);
    if (!e)
        return loom__error(LOOM_ENOMEM, "loom_trainer_early_stopping: no room for its state");
    e->c = cfg, e->best = NAN;
    return loom_trainer_add_callback(t, early_stop, e);
}

typedef struct {
    int64_t every;
} lr_monitor;

static bool lr_step(const loom_trainer_state *s, void *user) {
    const lr_monitor *l = user;
    if (s->event != LOOM_ON_TRAIN_BATCH_END)
        return false;
    if (s->tb)
        loom_tensorboard_add(s->tb, "train/lr", s->step, s->lr); /* (its failure: at the flush) */
    if (l->every > 0 && s->step % l->every == 0 && s->first_process)
        loom__log(LOOM_LOG_INFO, "step %lld: learning rate %.6g", (long long)s->step, s->lr);
    return false;
}

loom_status loom_trainer_lr_monitor(loom_trainer *t, int64_t every) {
    lr_monitor *l = t && every >= 0 ? loom__trainer_own(t, sizeof *l) : NULL;
    if (!l)
        return loom__error(t && every >= 0 ? LOOM_ENOMEM : LOOM_EINVAL,
                           "loom_trainer_lr_monitor: %s",
                           t && every >= 0 ? "no room for its state" : "bad arguments");
    l->every = every;
    return loom_trainer_add_callback(t, lr_step, l);
}
