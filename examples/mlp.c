/* Trains Linear(784,256) ReLU Linear(256,256) ReLU Linear(256,10) on Fashion-MNIST for one epoch.
 */
#include <loom.h>
#include <stdio.h>

int main(void) {
    loom_dataset *train;
    if (loom_dataset_fmnist(NULL, "train", &train)) {
        fprintf(stderr, "%s\n", loom_last_error());
        return 1;
    }
    loom_model *m = loom_model_new();
    loom_layer layers[] = {LOOM_LINEAR(784, 256), LOOM_RELU, LOOM_LINEAR(256, 256), LOOM_RELU,
                           LOOM_LINEAR(256, 10),  LOOM_END};
    loom_sequential *net = loom_sequential_new(m, layers);
    loom_sequential_init(net, 0);
    loom_optim *opt = loom_sgd_new(m, &(loom_optim_config){.lr = 0.05, .momentum = 0.9});
    loom_loader *loader = loom_loader_new(train, &(loom_loader_config){.batch_size = 128});
    loom_graph *g = loom_graph_new(m);
    loom_batch b;
    for (int step = 1; loom_loader_next(loader, &b); step++) {
        loom_graph_reset(g); /* one lazy graph per step: forward, backward, update */
        int64_t shape[2] = {b.n, 784};
        loom_tensor *x = loom_input(g, LOOM_F32, 2, shape, b.x);
        loom_tensor *y = loom_input(g, LOOM_I32, 1, &b.n, b.y);
        loom_tensor *loss = loom_cross_entropy(g, loom_sequential_forward(g, net, x), y);
        loom_backward(g, loss);
        loom_optim_step(g, opt);
        if (loom_graph_run(g)) { /* compiled once, replayed from the cache */
            fprintf(stderr, "step %d: %s\n", step, loom_last_error());
            return 1;
        }
        if (step % 100 == 0)
            printf("step %d loss %.4f\n", step, loom_item(loss));
    }
    loom_graph_free(g);
    loom_loader_free(loader);
    loom_optim_free(opt);
    loom_sequential_free(net);
    loom_model_free(m);
    loom_dataset_free(train);
    return 0;
}
