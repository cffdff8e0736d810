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
loom_devices *loom__accelerator_devs(const loom_accelerator *a);
/* trainer.c: `bytes` of zeroed state a built-in callback keeps, freed with the trainer (NULL:
 * ENOMEM, or more than 4). */
void *loom__trainer_own(loom_trainer *t, size_t bytes);

/* safetensors.c: a tensor to write (F32, row-major), and the writer: the tensors in this order,
 * the metadata beside "format", "producer" and each tensor's CRC-32C ("loom.crc32c", checked by
 * loom_tensor_file_read), written atomically (loom__write_atomic). ERANGE, writing nothing, when
 * a tensor holds a NaN or an infinity. */
typedef struct {
    const char *name;
    int ndim;
    const int64_t *shape;
    const float *data;
    int64_t numel;
} loom__st_tensor;
loom_status loom__safetensors_write(const char *path, const loom__st_tensor *t, int64_t n,
                                    const loom__meta *md);
/* m's tensors as loom_model_save writes them (parameters, then tied names), with room for `more`
 * after them; *n of them. loom__malloc'd (NULL: ENOMEM); m settled by the caller. */
loom__st_tensor *loom__model_tensors(const loom_model *m, int64_t more, int64_t *n);
/* Whether file f (read from path) holds m's parameters and tied names as loom_model_load takes
 * them, and nothing else but tensors whose names start with `other` (NULL: none); the first that
 * does not match named. loom__model_take_file then copies them into m (touched) and makes f's
 * metadata m's, but for what the writers set (format, producer, loom.crc32c, and a checkpoint's
 * loom.checkpoint, optimizer, optimizer.step). */
loom_status loom__model_check_file(const loom_model *m, const loom_tensor_file *f, const char *path,
                                   const char *other);
void loom__model_take_file(loom_model *m, loom_tensor_file *f);
/* "(2,3)": nd dims of shape s, as loom__shape_str writes a tensor's (safetensors.c). */
void loom__dims_str(int nd, const int64_t *s, char *buf, size_t size);

#endif
