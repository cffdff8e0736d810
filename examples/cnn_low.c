/* The Fashion-MNIST CNN, data parallel by hand (the process-group level): devices, batch inputs
 * sharded over them, each parameter's gradient all-reduced (mean) by this program, and SGD
 * written out with loom_assign. Runs unchanged on 1 or N devices.
 * usage: example_cnn_low [devices (0: one per core)] [steps (0: one epoch)] */
#include <loom.h>
#include <stdio.h>
#include <stdlib.h>

static double accuracy(loom_graph *g, loom_sequential *net, loom_dataset *test) {
    static float logits[1000 * 10];
    loom_loader *l =
        loom_loader_new(test, &(loom_loader_config){.batch_size = 1000, .no_shuffle = true});
    loom_batch b;
    int64_t correct = 0, seen = 0;
    while (loom_loader_next(l, &b)) {
        loom_graph_reset(g);
        loom_tensor *z =
            loom_sequential_forward(g, net, loom_input_batch(g, LOOM_F32, b.ndim, b.shape, b.x));
        loom_output(z);
        if (loom_graph_run(g) || loom_tensor_gather(z, logits) != b.n)
            return -1;
        correct += loom_count_correct(logits, b.n, 10, b.y);
        seen += b.n;
    }
    loom_loader_free(l);
    return (double)correct / (double)seen;
}

int main(int argc, char **argv) {
    int devices = argc > 1 ? atoi(argv[1]) : 0;
    long steps = argc > 2 ? atol(argv[2]) : 0;
    loom_dataset *train, *test;
    if (loom_dataset_fmnist(NULL, "train", &train) || loom_dataset_fmnist(NULL, "test", &test)) {
        fprintf(stderr, "%s\n", loom_last_error());
        return 1;
    }
    loom_model *m = loom_model_new();
    loom_sequential *net = loom_sequential_new(m, loom_recipe("fmnist-cnn", NULL));
    loom_sequential_init(net, 0);
    loom_devices *devs = loom_devices_new(&(loom_devices_config){.count = devices});
    loom_graph *g = loom_graph_new(m);
    if (!devs || loom_graph_set_devices(g, devs)) {
        fprintf(stderr, "%s\n", loom_last_error());
        return 1;
    }
    int n = loom_model_count(m);
    loom_loader *loader = loom_loader_new(train, &(loom_loader_config){.batch_size = 128});
    loom_batch b;
    double loss_value = 0;
    for (long step = 1; loom_loader_next(loader, &b) && (!steps || step <= steps); step++) {
        loom_graph_reset(g);
        loom_tensor *x = loom_input_batch(g, LOOM_F32, b.ndim, b.shape, b.x);
        loom_tensor *y = loom_input_batch(g, LOOM_I32, 1, &b.n, b.y);
        loom_tensor *loss = loom_cross_entropy(g, loom_sequential_forward(g, net, x), y);
        loom_output(loss);
        loom_tensor *w[16], *grad[16];
        for (int i = 0; i < n; i++)
            w[i] = loom_parameter(g, loom_model_at(m, i));
        loom_grads(g, loss, n, w, grad);
        for (int i = 0; i < n; i++) { /* the user's own all-reduce and update rule */
            loom_tensor *avg = loom_allreduce(g, grad[i], LOOM_REDUCE_MEAN);
            loom_tensor *lr = loom_scalar(g, 0.05, LOOM_F32);
            loom_assign(g, loom_model_at(m, i), loom_sub(g, w[i], loom_mul(g, lr, avg)));
        }
        if (loom_graph_run(g)) {
            fprintf(stderr, "step %ld: %s\n", step, loom_last_error());
            return 1;
        }
        loss_value = loom_item(loss);
    }
    printf("devices %d, last loss %.4f\n", loom_devices_count(devs), loss_value);
    printf("test accuracy: %.4f\n", accuracy(g, net, test));
    loom_graph_free(g);
    loom_devices_free(devs);
    loom_loader_free(loader);
    loom_sequential_free(net);
    loom_model_free(m);
    loom_dataset_free(train);
    loom_dataset_free(test);
    return 0;
}
