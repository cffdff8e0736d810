/*
 * data/internal.h - what the loader needs of a dataset's storage. Never installed.
 */
#ifndef LOOM_DATA_INTERNAL_H
#define LOOM_DATA_INTERNAL_H

#include "../core/internal.h"

#include <zlib.h>

/* Elements per sample, and sample i as floats into dst. */
int64_t loom__dataset_sample_numel(const loom_dataset *d);
void loom__dataset_sample(const loom_dataset *d, int64_t i, float *dst);
/* Asks the memory system for sample i ahead of loom__dataset_sample (a batch gathers samples
 * from random places in the file: a miss per cache line otherwise). */
void loom__dataset_prefetch(const loom_dataset *d, int64_t i);
const int32_t *loom__dataset_y(const loom_dataset *d);

/* A regular file opened for zlib's reading (gzip'd or plain, loom__open_regular's checks), its
 * size in *size (dataset.c). */
loom_status loom__gz_open(const char *path, gzFile *f, int64_t *size);

/* The name of a cached copy of file `path` under the data cache ($LOOM_DATA_CACHE, or
 * $XDG_CACHE_HOME/loom/data; "off": none), from its path, size, modification time and salt, with
 * extension ext; false when there is none (no cache, or a file under min_bytes) (dataset.c). */
bool loom__data_cache_path(const char *path, uint64_t salt, const char *ext, int64_t min_bytes,
                           char *out, size_t size);
/* A fingerprint of a tokenizer (its file's text) (tokenizer.c). */
uint64_t loom__tokenizer_hash(const loom_tokenizer *t);

#endif
