/* The Fashion-MNIST CNN with the trainer (the high-level API, after PyTorch Lightning): give the
 * steps and call fit. Runs unchanged on 1 or N devices.
 * usage: example_cnn_high [devices (0: one per core)] [steps (0: one epoch)] */
#include <loom.h>
#include <stdio.h>
#include <stdlib.h>

static loom_tensor *training_step(void *net, loom_graph *g, loom_tensor *x, loom_tensor *y) {
    return loom_cross_entropy(g, loom_sequential_forward(g, net, x), y);
}

static loom_tensor *validation_step(void *net, loom_graph *g, loom_tensor *x, loom_tensor *y) {
    (void)y;
    return loom_sequential_forward(g, net, x); /* logits: the trainer counts correct argmaxes */
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
    loom_optim *opt = loom_sgd_new(m, &(loom_optim_config){.lr = 0.05, .momentum = 0.9});
    loom_loader *train_loader = loom_loader_new(train, &(loom_loader_config){.batch_size = 128});
    loom_loader *test_loader =
        loom_loader_new(test, &(loom_loader_config){.batch_size = 1000, .no_shuffle = true});
    loom_trainer *t = loom_trainer_new(
        &(loom_trainer_config){.max_epochs = 1, .max_steps = steps, .devices = devices});
    loom_module_fns fns = {training_step, validation_step, net};
    if (!t || loom_trainer_fit(t, m, opt, &fns, train_loader, test_loader)) {
        fprintf(stderr, "%s\n", loom_last_error());
        return 1;
    }
    loom_trainer_metrics tm;
    loom_trainer_get_metrics(t, &tm);
    printf("steps %lld, last loss %.4f, %.0f samples/s\n", (long long)tm.steps, tm.last_loss,
           tm.samples_per_s);
    printf("test accuracy: %.4f\n", tm.val_accuracy);
    loom_trainer_free(t);
    loom_loader_free(train_loader);
    loom_loader_free(test_loader);
    loom_optim_free(opt);
    loom_sequential_free(net);
    loom_model_free(m);
    loom_dataset_free(train);
    loom_dataset_free(test);
    return 0;
}
