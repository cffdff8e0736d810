/* The Fashion-MNIST CNN with the accelerator (the mid-level API, after Hugging Face Accelerate):
 * prepare once, then the loop is yours. Runs unchanged on 1 or N devices.
 * usage: example_cnn_mid [devices (0: one per core)] [steps (0: one epoch)] */
#include <loom.h>
#include <stdio.h>
#include <stdlib.h>

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
    loom_optim *opt = loom_sgd_new(m, &(loom_optim_config){.lr = 0.05, .momentum = 0.9});
    loom_loader *train_loader = loom_loader_new(train, &(loom_loader_config){.batch_size = 128});
    loom_loader *test_loader =
        loom_loader_new(test, &(loom_loader_config){.batch_size = 1000, .no_shuffle = true});
    loom_accelerator *acc = loom_accelerator_new(&(loom_accelerator_config){.devices = devices});
    if (!acc || loom_accelerator_prepare(acc, m, opt, train_loader)) {
        fprintf(stderr, "%s\n", loom_last_error());
        return 1;
    }
    loom_graph *g;
    loom_tensor *x, *y;
    double loss_value = 0;
    for (long step = 1; (!steps || step <= steps) && loom_accelerator_next(acc, NULL, &g, &x, &y);
         step++) {
        loom_tensor *loss = loom_cross_entropy(g, loom_sequential_forward(g, net, x), y);
        loom_accelerator_backward(acc, loss);
        if (loom_accelerator_step(acc)) {
            fprintf(stderr, "step %ld: %s\n", step, loom_last_error());
            return 1;
        }
        loss_value = loom_item(loss);
    }
    static float logits[1000 * 10];
    static int32_t labels[1000];
    int64_t correct = 0, seen = 0;
    while (loom_accelerator_next(acc, test_loader, &g, &x, &y)) {
        loom_tensor *z = loom_sequential_forward(g, net, x);
        loom_output(z);
        loom_output(y);
        if (loom_accelerator_run(acc))
            return 1;
        /* each device's rows, in order, without padding: every test image counted once */
        int64_t rows = loom_tensor_gather(z, logits);
        loom_tensor_gather(y, labels);
        correct += loom_count_correct(logits, rows, 10, labels);
        seen += rows;
    }
    printf("devices %d, last loss %.4f\n", loom_accelerator_devices(acc), loss_value);
    printf("test accuracy: %.4f\n", (double)correct / (double)seen);
    loom_accelerator_free(acc);
    loom_loader_free(train_loader);
    loom_loader_free(test_loader);
    loom_optim_free(opt);
    loom_sequential_free(net);
    loom_model_free(m);
    loom_dataset_free(train);
    loom_dataset_free(test);
    return 0;
}
