/*
 * matrix.h - the model matrix: the two recipes and twelve more models built through the public API
 * (loom_sequential), each with the batch it runs at. bench/matrix.c times them against PyTorch
 * (bench/torch_matrix.py builds the same models from `bench_matrix --list`), and
 * tests/test_matrix.c trains each one against the interpreter and on 2 devices against 1. The
 * inputs are Fashion-MNIST's shape, (B, 1, 28, 28), 10 classes.
 */
#ifndef LOOM_BENCH_MATRIX_H
#define LOOM_BENCH_MATRIX_H

#include "loom.h"

#include <string.h>

typedef struct {
    const char *name;
    int64_t batch;
    bool flat; /* the images flattened to (B, 784) first */
    loom_layer layers[20];
} matrix_model;

#define CONV(i, o, k, s, p) LOOM_CONV2D(i, o, k, s, p), LOOM_RELU
#define FC(i, o)            LOOM_LINEAR(i, o), LOOM_RELU

static const matrix_model matrix[] = {
    {"fmnist-mlp", 128, true, {FC(784, 256), FC(256, 256), LOOM_LINEAR(256, 10), LOOM_END}},
    {"fmnist-cnn",
     128,
     false,
     {CONV(1, 32, 3, 1, 0), LOOM_MAXPOOL2D(2), CONV(32, 64, 3, 1, 0), LOOM_MAXPOOL2D(2),
      LOOM_FLATTEN, FC(1600, 128), LOOM_LINEAR(128, 10), LOOM_END}},
    {"mlp512x2-b32", 32, true, {FC(784, 512), FC(512, 512), LOOM_LINEAR(512, 10), LOOM_END}},
    {"mlp1024x3",
     128,
     true,
     {FC(784, 1024), FC(1024, 1024), FC(1024, 1024), LOOM_LINEAR(1024, 10), LOOM_END}},
    {"mlp2048x2-b512", 512, true, {FC(784, 2048), FC(2048, 2048), LOOM_LINEAR(2048, 10), LOOM_END}},
    {"mlp512x6",
     128,
     true,
     {FC(784, 512), FC(512, 512), FC(512, 512), FC(512, 512), FC(512, 512), LOOM_LINEAR(512, 10),
      LOOM_END}},
    {"lenet5", /* 5x5 with padding 2, then without */
     128,
     false,
     {CONV(1, 6, 5, 1, 2), LOOM_MAXPOOL2D(2), CONV(6, 16, 5, 1, 0), LOOM_MAXPOOL2D(2), LOOM_FLATTEN,
      FC(400, 120), FC(120, 84), LOOM_LINEAR(84, 10), LOOM_END}},
    {"cnn3x3-same",
     128,
     false,
     {CONV(1, 32, 3, 1, 1), LOOM_MAXPOOL2D(2), CONV(32, 64, 3, 1, 1), LOOM_MAXPOOL2D(2),
      LOOM_FLATTEN, FC(3136, 128), LOOM_LINEAR(128, 10), LOOM_END}},
    {"cnn-stride2", /* no pooling */
     128,
     false,
     {CONV(1, 32, 3, 2, 1), CONV(32, 64, 3, 2, 1), LOOM_FLATTEN, LOOM_LINEAR(3136, 10), LOOM_END}},
    {"cnn3-layers",
     128,
     false,
     {CONV(1, 16, 3, 1, 1), CONV(16, 32, 3, 1, 1), LOOM_MAXPOOL2D(2), CONV(32, 64, 3, 1, 1),
      LOOM_MAXPOOL2D(2), LOOM_FLATTEN, LOOM_LINEAR(3136, 10), LOOM_END}},
    {"cnn5x5-b512",
     512,
     false,
     {CONV(1, 16, 5, 1, 0), LOOM_MAXPOOL2D(2), CONV(16, 32, 5, 1, 0), LOOM_MAXPOOL2D(2),
      LOOM_FLATTEN, LOOM_LINEAR(512, 10), LOOM_END}},
    {"cnn-pool3s2", /* overlapping 3x3 windows, stride 2, padding 1 (ResNet's stem pooling) */
     128,
     false,
     {CONV(1, 32, 3, 1, 1), LOOM_MAXPOOL2D_STRIDED(3, 2, 1), CONV(32, 64, 3, 1, 1),
      LOOM_MAXPOOL2D_STRIDED(3, 2, 1), LOOM_FLATTEN, LOOM_LINEAR(3136, 10), LOOM_END}},
    {"cnn-1x1", /* bottlenecks: 1x1 convolutions between 3x3 ones (ResNet's and MobileNet's) */
     128,
     false,
     {CONV(1, 32, 3, 1, 1), CONV(32, 32, 1, 1, 0), LOOM_MAXPOOL2D(2), CONV(32, 64, 3, 1, 1),
      LOOM_MAXPOOL2D(2), CONV(64, 64, 1, 1, 0), LOOM_FLATTEN, LOOM_LINEAR(3136, 10), LOOM_END}},
    {"fmnist-cnn-b32",
     32,
     false,
     {CONV(1, 32, 3, 1, 0), LOOM_MAXPOOL2D(2), CONV(32, 64, 3, 1, 0), LOOM_MAXPOOL2D(2),
      LOOM_FLATTEN, FC(1600, 128), LOOM_LINEAR(128, 10), LOOM_END}},
};
#define MATRIX_COUNT ((int)(sizeof matrix / sizeof *matrix))

#undef CONV
#undef FC

static inline const matrix_model *matrix_find(const char *name) {
    for (int i = 0; i < MATRIX_COUNT; i++)
        if (!strcmp(matrix[i].name, name))
            return &matrix[i];
    return NULL;
}

/* Training FLOP a sample: each product's forward, its weight gradient, and its input gradient
 * but for the first layer's (2 a multiply-add); pooling, ReLU and biases not counted. */
static inline double matrix_flop(const matrix_model *m) {
    int64_t c = 1, h = 28, w = 28;
    double flop = 0;
    bool first = true;
    if (m->flat)
        c = 784, h = w = 1;
    for (const loom_layer *l = m->layers; l->kind != LOOM_LAYER_END; l++) {
        double macs = 0;
        if (l->kind == LOOM_LAYER_LINEAR) {
            macs = (double)l->in * (double)l->out;
            c = l->out, h = w = 1;
        } else if (l->kind == LOOM_LAYER_CONV2D) {
            h = (h + 2 * l->padding - l->kernel) / l->stride + 1;
            w = (w + 2 * l->padding - l->kernel) / l->stride + 1;
            macs = (double)l->out * (double)l->in * l->kernel * l->kernel * (double)(h * w);
            c = l->out;
        } else if (l->kind == LOOM_LAYER_MAXPOOL) {
            int s = l->stride ? l->stride : l->kernel;
            h = (h + 2 * l->padding - l->kernel) / s + 1;
            w = (w + 2 * l->padding - l->kernel) / s + 1;
        } else if (l->kind == LOOM_LAYER_FLATTEN) {
            c *= h * w, h = w = 1;
        }
        if (macs > 0) {
            flop += 2 * macs * (first ? 2 : 3);
            first = false;
        }
    }
    return flop;
}

#endif
