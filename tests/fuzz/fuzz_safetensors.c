/*
 * fuzz_safetensors.c - libFuzzer target: any bytes as a safetensors file, through
 * loom_tensor_file_read (every accessor run on what it accepts) and loom_model_load into a small
 * model. Nothing may crash, leak or read out of bounds; an accepted file's tensors must be whole.
 */
#include "fuzz.h"
#include "loom.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(0, ".safetensors", data, size);
    loom_tensor_file *f;
    if (loom_tensor_file_read(path, &f) == LOOM_OK) {
        volatile uint8_t sink = 0;
        for (int i = 0; i < loom_tensor_file_count(f); i++) {
            loom_dtype dt;
            int nd;
            const int64_t *shape;
            const uint8_t *p =
                loom_tensor_file_get(f, loom_tensor_file_name(f, i), &dt, &nd, &shape);
            int64_t n = dt == LOOM_F64 ? 8 : 4;
            for (int d = 0; d < nd; d++)
                n *= shape[d];
            for (int64_t k = 0; k < n; k += 1 + n / 64) /* touches the whole extent */
                sink ^= p[k];
            if (n)
                sink ^= p[n - 1];
        }
        (void)sink;
        loom_tensor_file_free(f);
    }
    loom_model *m = loom_model_new();
    loom_model_add(m, "w", 2, (int64_t[]){2, 3});
    loom_model_add(m, "b", 1, (int64_t[]){3});
    loom_model_load(m, path);
    loom_model_free(m);
    return 0;
}
