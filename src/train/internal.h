/*
 * train/internal.h - what the trainer needs of the accelerator. Never installed.
 */
#ifndef LOOM_TRAIN_INTERNAL_H
#define LOOM_TRAIN_INTERNAL_H

#include "../graph/internal.h"

/* The labels of the accelerator's current batch (global, unsharded). */
const int32_t *loom__accelerator_labels(const loom_accelerator *a);
/* loom_accelerator_step() that returns once the devices have the step (loom_graph_submit): the
 * trainer records the next step meanwhile, then waits (loom_graph_wait) for this one's loss. */
loom_status loom__accelerator_submit(loom_accelerator *a);
/* The accelerator's devices: across the processes of an MPI job, every process's. */
const loom_devices *loom__accelerator_devs(const loom_accelerator *a);

#endif
