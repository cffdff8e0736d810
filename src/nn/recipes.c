/*
 * recipes.c - the built-in models, named as torch.nn.Sequential names them, shared by the CLI,
 * the examples and the tests so that each is written down once.
 */
#include "../graph/internal.h"

#include <string.h>

/* fmnist-mlp = Linear(784,256) ReLU Linear(256,256) ReLU Linear(256,10): tensors 0., 2., 4.;
 * images are flattened to (B, 784) before the Sequential. */
static const loom_layer mlp[] = {LOOM_LINEAR(784, 256), LOOM_RELU, LOOM_LINEAR(256, 256), LOOM_RELU,
                                 LOOM_LINEAR(256, 10),  LOOM_END};

/* fmnist-cnn = Conv2d(1,32,3) ReLU MaxPool2d(2) Conv2d(32,64,3) ReLU MaxPool2d(2) Flatten
 * Linear(1600,128) ReLU Linear(128,10): tensors 0., 3., 7., 9.; input (B, 1, 28, 28). */
static const loom_layer cnn[] = {LOOM_CONV2D(1, 32, 3, 1, 0),
                                 LOOM_RELU,
                                 LOOM_MAXPOOL2D(2),
                                 LOOM_CONV2D(32, 64, 3, 1, 0),
                                 LOOM_RELU,
                                 LOOM_MAXPOOL2D(2),
                                 LOOM_FLATTEN,
                                 LOOM_LINEAR(1600, 128),
                                 LOOM_RELU,
                                 LOOM_LINEAR(128, 10),
                                 LOOM_END};

const loom_layer *loom_recipe(const char *name, bool *flatten_input) {
    bool is_mlp = name && !strcmp(name, "fmnist-mlp");
    if (flatten_input)
        *flatten_input = is_mlp;
    if (is_mlp)
        return mlp;
    if (name && !strcmp(name, "fmnist-cnn"))
        return cnn;
    loom__error(LOOM_ENOTFOUND, "unknown recipe '%s' (known: fmnist-mlp, fmnist-cnn)",
                name ? name : "(null)");
    return NULL;
}
