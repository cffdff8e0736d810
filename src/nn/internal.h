/*
 * nn/internal.h - what the models of src/nn share. Never installed.
 */
#ifndef LOOM_NN_INTERNAL_H
#define LOOM_NN_INTERNAL_H

#include "../graph/internal.h"

/* A parameter's values: Normal(0, std) from Philox stream (1, its index) of seed (Box-Muller on
 * two uniforms), or ones (gpt.c). */
void loom__fill_normal(loom_param *p, uint64_t seed, double std);
void loom__fill_ones(loom_param *p);

#endif
