/*
 * data/internal.h - what the loader needs of a dataset's storage. Never installed.
 */
#ifndef LOOM_DATA_INTERNAL_H
#define LOOM_DATA_INTERNAL_H

#include "../core/internal.h"

/* Elements per sample, and sample i as floats into dst. */
int64_t loom__dataset_sample_numel(const loom_dataset *d);
void loom__dataset_sample(const loom_dataset *d, int64_t i, float *dst);
const int32_t *loom__dataset_y(const loom_dataset *d);

#endif
