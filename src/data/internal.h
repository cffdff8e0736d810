/*
 * data/internal.h - what the loader needs of a dataset's storage. Never installed.
 */
#ifndef LOOM_DATA_INTERNAL_H
#define LOOM_DATA_INTERNAL_H

#include "../core/internal.h"

/* Samples, contiguous; *sample_numel elements each. */
const float *loom__dataset_x(const loom_dataset *d, int64_t *sample_numel);
const int32_t *loom__dataset_y(const loom_dataset *d);

#endif
