/*
 * test_safetensors.c - weights files: a save/load round trip with PyTorch's names, and each kind of
 * bad file refused with the tensor and the reason, leaving the model unchanged.
 */
#include "harness.h"

#include <math.h>
#include <unistd.h>

/* Writes a safetensors file from a header text and `data_bytes` bytes of data. */
static void write_raw(const char *path, const char *header, size_t data_bytes, size_t cut) {
    size_t hl = strlen(header);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    size_t total = 8 + hl + data_bytes;
    unsigned char *buf = calloc(1, total);
    memcpy(buf, len8, 8);
    memcpy(buf + 8, header, hl);
    FILE *f = fopen(path, "wb");
    fwrite(buf, 1, cut ? cut : total, f);
    fclose(f);
    free(buf);
}

static loom_model *small_model(void) {
    loom_model *m = loom_model_new();
    int64_t w[2] = {2, 3}, b[1] = {2};
    loom_model_add(m, "0.weight", 2, w);
    loom_model_add(m, "0.bias", 1, b);
    return m;
}

TEST(round_trip_keeps_names_shapes_values) {
    char path[512];
    test_tmp(path, sizeof path, "round.safetensors");
    loom_model *m = small_model();
    for (int i = 0; i < 6; i++)
        loom_param_data(loom_model_at(m, 0))[i] = (float)i * 0.5f - 1;
    loom_param_data(loom_model_at(m, 1))[1] = 7;
    ASSERT_EQ(loom_model_save(m, path), LOOM_OK);
    loom_model *m2 = small_model();
    ASSERT_EQ(loom_model_load(m2, path), LOOM_OK);
    ASSERT(!memcmp(loom_param_data(loom_model_at(m, 0)), loom_param_data(loom_model_at(m2, 0)),
                   8 * sizeof(float)));
    loom_tensor_file *f;
    ASSERT_EQ(loom_tensor_file_read(path, &f), LOOM_OK);
    ASSERT_EQ(loom_tensor_file_count(f), 2);
    loom_dtype dt;
    int nd;
    const int64_t *shape;
    const float *w = loom_tensor_file_get(f, "0.weight", &dt, &nd, &shape);
    ASSERT(w && dt == LOOM_F32 && nd == 2 && shape[0] == 2 && shape[1] == 3 && w[5] == 1.5f);
    loom_tensor_file_free(f);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    ASSERT(access(tmp, F_OK) != 0); /* the temporary file was renamed away */
    loom_model_free(m);
    loom_model_free(m2);
}

/* Metadata: loom_model_set_meta's strings are written escaped and read back whole by
 * loom_model_load (quotes, backslashes, control characters, UTF-8); a file written by Python's
 * json (\\uXXXX escapes, a surrogate pair) reads as the characters; format and producer are the
 * writer's, not the model's. */
TEST(metadata_round_trips_and_reads_json_escapes) {
    char path[512];
    test_tmp(path, sizeof path, "meta.safetensors");
    loom_model *m = small_model();
    const char *odd = "a \"quoted\" \\ back\nslash\t\x01 caf\xc3\xa9 \xf0\x9f\x98\x80";
    ASSERT_EQ(loom_model_set_meta(m, "vocabulary", odd), LOOM_OK);
    ASSERT_EQ(loom_model_set_meta(m, "step", "12"), LOOM_OK);
    ASSERT_EQ(loom_model_set_meta(m, "step", "13"), LOOM_OK); /* replaced */
    ASSERT_EQ(loom_model_set_meta(m, "gone", "x"), LOOM_OK);
    ASSERT_EQ(loom_model_set_meta(m, "gone", NULL), LOOM_OK);
    ASSERT_EQ(loom_model_set_meta(m, "format", "x"), LOOM_EINVAL);
    ASSERT_EQ(loom_model_save(m, path), LOOM_OK);
    loom_model *m2 = small_model();
    ASSERT_EQ(loom_model_load(m2, path), LOOM_OK);
    ASSERT(loom_model_meta(m2, "vocabulary") && !strcmp(loom_model_meta(m2, "vocabulary"), odd));
    ASSERT(loom_model_meta(m2, "step") && !strcmp(loom_model_meta(m2, "step"), "13"));
    ASSERT(!loom_model_meta(m2, "gone") && !loom_model_meta(m2, "format"));
    loom_tensor_file *f;
    ASSERT_EQ(loom_tensor_file_read(path, &f), LOOM_OK);
    ASSERT(!strcmp(loom_tensor_file_meta(f, "format"), "pt"));
    loom_tensor_file_free(f);
    write_raw(path,
              "{\"__metadata__\":{\"v\":\"caf\\u00e9 \\ud83d\\ude00 \\\"\\n\",\"n\":null},"
              "\"0.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
              "\"0.bias\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[24,32]}}",
              32, 0);
    ASSERT_EQ(loom_model_load(m2, path), LOOM_OK);
    ASSERT(loom_model_meta(m2, "v") &&
           !strcmp(loom_model_meta(m2, "v"), "caf\xc3\xa9 \xf0\x9f\x98\x80 \"\n"));
    ASSERT(!loom_model_meta(m2, "n") && !loom_model_meta(m2, "step"));
    write_raw(path, "{\"__metadata__\":{\"v\":\"\\ude00\"}}", 0, 0);
    ASSERT_EQ(loom_tensor_file_read(path, &f), LOOM_EFORMAT);
    ASSERT_STR_CONTAINS(loom_last_error(), "no lone low surrogate");
    loom_model_free(m);
    loom_model_free(m2);
}

typedef struct {
    const char *header;
    size_t data, cut;
    loom_status st;
    const char *expect;
} bad_file;

#define W_OK_ "\"0.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}"
#define B_OK_ "\"0.bias\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[24,32]}"

TEST(half_precision_tensors_read_as_float32) {
    /* F16: 1, -2, 2^-24 (the least subnormal), 65504 (the largest), inf, 3 2^-17 (a subnormal);
     * BF16: 1, -3.140625, 2^-133 (subnormal), -0 */
    const char *hdr = "{\"h\":{\"dtype\":\"F16\",\"shape\":[6],\"data_offsets\":[0,12]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[12,20]}}";
    const uint16_t bits[10] = {0x3C00, 0xC000, 0x0001, 0x7BFF, 0x7C00,
                               0x0180, 0x3F80, 0xC049, 0x0001, 0x8000};
    char path[512];
    test_tmp(path, sizeof path, "half.safetensors");
    size_t hl = strlen(hdr);
    unsigned char buf[256] = {0};
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, hdr, hl);
    for (int k = 0; k < 10; k++)
        buf[8 + hl + 2 * k] = (unsigned char)bits[k], buf[8 + hl + 2 * k + 1] = bits[k] >> 8;
    FILE *f = fopen(path, "wb");
    fwrite(buf, 1, 8 + hl + 20, f);
    fclose(f);
    loom_tensor_file *tf;
    ASSERT_EQ(loom_tensor_file_read(path, &tf), LOOM_OK);
    loom_dtype dt;
    int nd;
    const int64_t *shape;
    const float *h = loom_tensor_file_get(tf, "h", &dt, &nd, &shape);
    ASSERT(h && dt == LOOM_F32 && nd == 1 && shape[0] == 6);
    const float want_h[6] = {1, -2, 0x1p-24f, 65504, INFINITY, 0x3p-17f};
    for (int k = 0; k < 6; k++)
        ASSERT(h[k] == want_h[k]);
    const float *b = loom_tensor_file_get(tf, "b", &dt, &nd, &shape);
    ASSERT(b && dt == LOOM_F32 && nd == 2 && shape[1] == 2);
    ASSERT(b[0] == 1 && b[1] == -3.140625f && b[2] == 0x1p-133f && b[3] == 0 && signbit(b[3]));
    loom_tensor_file_free(tf);
}

TEST(bad_files_are_refused_with_the_reason) {
    const bad_file cases[] = {
        {"{" W_OK_ "," B_OK_ "}", 32, 20, LOOM_EFORMAT, "truncated: header length"},
        {"{" W_OK_ "," B_OK_ "}", 32, 5, LOOM_EFORMAT, "truncated: 5 bytes"},
        {"{" W_OK_ "," B_OK_, 32, 0, LOOM_EFORMAT, "malformed safetensors header at byte"},
        {"{\"0.weight\":{\"dtype\":\"F32\",\"shape\":[2,3] \"data_offsets\":[0,24]}}", 24, 0,
         LOOM_EFORMAT, "expected ',' or '}'"},
        {"{" W_OK_ ",\"0.bias\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[24,40]}}", 32, 0,
         LOOM_EFORMAT, "'0.bias' has data_offsets [24, 40] outside the 32 bytes"},
        {"{" W_OK_ ",\"0.bias\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}", 32, 0,
         LOOM_EFORMAT, "tensors '0.weight' and '0.bias' overlap"},
        {"{" W_OK_ ",\"0.bias\":{\"dtype\":\"Q7\",\"shape\":[2],\"data_offsets\":[24,32]}}", 32, 0,
         LOOM_EFORMAT, "'0.bias' has unknown dtype 'Q7'"},
        {"{" W_OK_ ",\"0.bias\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[24,28]}}", 32, 0,
         LOOM_EUNSUPPORTED, "'0.bias' has dtype I64"},
        {"{" W_OK_ ",\"0.bias\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[24,32]}}", 32, 0,
         LOOM_EFORMAT, "'0.bias' has 8 bytes of data, its shape needs 12"},
        {"{" W_OK_ "}", 24, 0, LOOM_ENOTFOUND, "tensor '0.bias' is missing"},
        {"{" W_OK_ "," B_OK_
         ",\"9.weight\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[32,36]}}",
         36, 0, LOOM_EFORMAT, "tensor '9.weight' is not a parameter of the model"},
        {"{\"0.weight\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[0,24]}," B_OK_ "}", 32,
         0, LOOM_ESHAPE, "tensor '0.weight' is f32 (3,2), the model expects f32 (2,3)"},
    };
    char path[512];
    test_tmp(path, sizeof path, "bad.safetensors");
    loom_model *m = small_model();
    loom_param_data(loom_model_at(m, 0))[0] = 42;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        write_raw(path, cases[i].header, cases[i].data, cases[i].cut);
        loom_status s = loom_model_load(m, path);
        if (s != cases[i].st)
            FAILF("case %zu: status %s, expected %s (%s)", i, loom_status_name(s),
                  loom_status_name(cases[i].st), loom_last_error());
        ASSERT_STR_CONTAINS(loom_last_error(), cases[i].expect);
        ASSERT_STR_CONTAINS(loom_last_error(), "bad.safetensors");
        ASSERT(loom_param_data(loom_model_at(m, 0))[0] == 42); /* unchanged */
    }
    ASSERT_EQ(loom_model_load(m, "/nonexistent/x.safetensors"), LOOM_ENOTFOUND);
    loom_model_free(m);
}

/* The bytes of file path (malloc'd, *n of them). */
static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n + 1);
    if (fread(b, 1, *n, f) != *n)
        *n = 0;
    fclose(f);
    return b;
}

static void spit(const char *path, const unsigned char *b, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(b, 1, n, f);
    fclose(f);
}

/* A checkpoint holds the parameters, the optimizer's state under PyTorch's keys and its step
 * count; loading one restores them all, and every kind of bad checkpoint is refused with the
 * reason, the model and optimizer unchanged. */
TEST(checkpoint_round_trip_and_refusals) {
    char path[512], bad[512], weights[512];
    test_tmp(path, sizeof path, "ckpt.safetensors");
    test_tmp(bad, sizeof bad, "ckpt-bad.safetensors");
    test_tmp(weights, sizeof weights, "ckpt-weights.safetensors");
    loom_model *m = small_model();
    loom_optim *o = loom_adamw_new(m, &(loom_optim_config){.lr = 0.1, .warmup_steps = 10});
    ASSERT(o && loom_optim_state_keys(o) == 2 && !strcmp(loom_optim_name(o), "adamw"));
    ASSERT(!strcmp(loom_optim_state_key(o, 0), "exp_avg"));
    ASSERT(!strcmp(loom_optim_state_key(o, 1), "exp_avg_sq") && !loom_optim_state_key(o, 2));
    for (int i = 0; i < 6; i++) {
        loom_param_data(loom_model_at(m, 0))[i] = (float)i;
        loom_optim_state(o, loom_model_at(m, 0), 0)[i] = 0.25f * (float)i;
        loom_optim_state(o, loom_model_at(m, 0), 1)[i] = 1.0f + (float)i;
    }
    ASSERT_EQ(loom_model_set_meta(m, "loom.step", "5"), LOOM_OK);
    ASSERT_EQ(loom_checkpoint_save(path, m, o, 5), LOOM_OK);
    ASSERT_EQ(loom_model_save(m, weights), LOOM_OK);
    loom_tensor_file *f;
    ASSERT_EQ(loom_tensor_file_read(path, &f), LOOM_OK);
    ASSERT_EQ(loom_tensor_file_count(f), 6);
    ASSERT(loom_tensor_file_get(f, "optimizer.0.weight.exp_avg_sq", NULL, NULL, NULL));
    ASSERT(!strcmp(loom_tensor_file_meta(f, "optimizer.step"), "5"));
    ASSERT(!strcmp(loom_tensor_file_meta(f, "optimizer"), "adamw"));
    ASSERT(loom_tensor_file_meta(f, "loom.crc32c"));
    loom_tensor_file_free(f);
    ASSERT_EQ(loom_tensor_file_read_header(path, &f), LOOM_OK); /* the header alone */
    ASSERT(loom_tensor_file_count(f) == 6 && !strcmp(loom_tensor_file_meta(f, "loom.step"), "5"));
    ASSERT(!loom_tensor_file_get(f, "0.weight", NULL, NULL, NULL));
    loom_tensor_file_free(f);

    /* a run's position: written with the checkpoint, read back whole */
    ASSERT_EQ(loom_run_position_set(m, &(loom_run_position){.step = 5,
                                                            .epoch = 1,
                                                            .batch = 7,
                                                            .monitor = "val_acc",
                                                            .best = 0.75,
                                                            .val_loss = NAN,
                                                            .val_accuracy = 0.5,
                                                            .world = 2}),
              LOOM_OK);
    ASSERT_EQ(loom_checkpoint_save(path, m, o, 5), LOOM_OK);
    loom_model *m2 = small_model();
    loom_optim *o2 = loom_adamw_new(m2, &(loom_optim_config){.lr = 0.1, .warmup_steps = 10});
    loom_run_position at;
    ASSERT_EQ(loom_run_position_get(m2, &at), LOOM_EFORMAT); /* (none yet) */
    int64_t steps = -1;
    ASSERT_EQ(loom_checkpoint_load(path, m2, o2, &steps), LOOM_OK);
    ASSERT_EQ(steps, 5);
    ASSERT_EQ(loom_optim_steps(o2), 5);
    ASSERT_NEAR(loom_optim_lr(o2), 0.1 * 5.0 / 11.0, 1e-12); /* the schedule's step 4 */
    ASSERT(loom_param_data(loom_model_at(m2, 0))[5] == 5.0f);
    ASSERT(loom_optim_state(o2, loom_model_at(m2, 0), 0)[3] == 0.75f);
    ASSERT(loom_optim_state(o2, loom_model_at(m2, 0), 1)[4] == 5.0f);
    ASSERT(!strcmp(loom_model_meta(m2, "loom.step"), "5"));
    ASSERT_EQ(loom_run_position_get(m2, &at), LOOM_OK);
    ASSERT(at.step == 5 && at.epoch == 1 && at.batch == 7 && at.world == 2);
    ASSERT(!strcmp(at.monitor, "val_acc") && at.best == 0.75 && at.val_accuracy == 0.5);
    ASSERT(isnan(at.val_loss));
    ASSERT(!loom_model_meta(m2, "optimizer.step") && !loom_model_meta(m2, "loom.crc32c"));
    /* its weights alone start another run (loom_model_load takes a checkpoint) */
    loom_model *m3 = small_model();
    ASSERT_EQ(loom_model_load(m3, path), LOOM_OK);
    ASSERT(loom_param_data(loom_model_at(m3, 0))[4] == 4.0f);

    /* refusals: nothing changes in m2 and o2 */
    loom_optim_state(o2, loom_model_at(m2, 0), 0)[0] = 42;
    ASSERT_EQ(loom_checkpoint_load(weights, m2, o2, NULL), LOOM_EFORMAT);
    ASSERT(strstr(loom_last_error(), "not a checkpoint"));
    size_t n;
    unsigned char *b = slurp(path, &n);
    ASSERT(b && n > 40);
    b[n - 3] ^= 0x40; /* a byte of the last tensor's data */
    spit(bad, b, n);
    ASSERT_EQ(loom_checkpoint_load(bad, m2, o2, NULL), LOOM_EFORMAT);
    ASSERT(strstr(loom_last_error(), "fails its checksum"));
    spit(bad, b, n - 9); /* cut short */
    ASSERT(loom_checkpoint_load(bad, m2, o2, NULL) != LOOM_OK);
    free(b);
    loom_optim *sgd = loom_sgd_new(m2, &(loom_optim_config){.lr = 0.1, .momentum = 0.9});
    ASSERT_EQ(loom_checkpoint_load(path, m2, sgd, NULL), LOOM_EINVAL);
    ASSERT(strstr(loom_last_error(), "adamw") && strstr(loom_last_error(), "sgd"));
    loom_model *other = loom_model_new();
    int64_t w[2] = {3, 2}, bb[1] = {2};
    loom_model_add(other, "0.weight", 2, w);
    loom_model_add(other, "0.bias", 1, bb);
    loom_optim *oo = loom_adamw_new(other, NULL);
    ASSERT_EQ(loom_checkpoint_load(path, other, oo, NULL), LOOM_ESHAPE);
    ASSERT(strstr(loom_last_error(), "'0.weight'"));
    ASSERT(loom_optim_state(o2, loom_model_at(m2, 0), 0)[0] == 42);
    ASSERT_EQ(loom_optim_steps(o2), 5);
    loom_optim_free(oo), loom_model_free(other);
    loom_optim_free(sgd), loom_optim_free(o2), loom_optim_free(o);
    loom_model_free(m3), loom_model_free(m2), loom_model_free(m);
}

/* The number of lines of path that start with prefix. */
static int lines_with(const char *path, const char *prefix) {
    FILE *f = fopen(path, "r");
    char line[256];
    int n = 0;
    while (f && fgets(line, sizeof line, f))
        n += !strncmp(line, prefix, strlen(prefix));
    if (f)
        fclose(f);
    return n;
}

/* A directory keeps the newest `keep` checkpoints and the best; resuming takes the newest that
 * reads whole; a run resumed from an earlier one drops the later ones. */
TEST(checkpoint_directory_keeps_newest_and_best) {
    char dir[512], index[600], p[700], got[700];
    test_tmp(dir, sizeof dir, "ckdir");
    snprintf(index, sizeof index, "%s/index.tsv", dir);
    unlink(index); /* (of an earlier run of the test) */
    for (int s = 1; s <= 6; s++)
        snprintf(p, sizeof p, "%s/step-%06d.safetensors", dir, s), unlink(p);
    loom_model *m = small_model();
    loom_optim *o = loom_sgd_new(m, &(loom_optim_config){.lr = 0.1, .momentum = 0.5});
    loom_checkpoint_config c = {.dir = dir, .keep = 2};
    const double value[5] = {3, 1, 2, NAN, 5};
    for (int s = 1; s <= 5; s++) {
        loom_param_data(loom_model_at(m, 1))[0] = (float)s;
        ASSERT_EQ(loom_checkpoint_write(&c, m, o, s, value[s - 1], p, sizeof p), LOOM_OK);
    }
    ASSERT_EQ(lines_with(index, "step-"), 3); /* the best (step 2) and the newest two */
    ASSERT_EQ(lines_with(index, "step-000002.safetensors\t2\t1\n"), 1);
    ASSERT_EQ(lines_with(index, "step-000004.safetensors\t4\tnan\n"), 1);
    ASSERT_EQ(lines_with(index, "step-000005.safetensors\t5\t5\n"), 1);
    snprintf(p, sizeof p, "%s/step-000001.safetensors", dir);
    ASSERT(access(p, F_OK) != 0);
    snprintf(p, sizeof p, "%s/step-000003.safetensors", dir);
    ASSERT(access(p, F_OK) != 0);
    loom_model *m2 = small_model();
    loom_optim *o2 = loom_sgd_new(m2, &(loom_optim_config){.lr = 0.1, .momentum = 0.5});
    int64_t steps;
    ASSERT_EQ(loom_checkpoint_resume(dir, m2, o2, &steps, got, sizeof got), LOOM_OK);
    ASSERT_EQ(steps, 5);
    ASSERT(loom_param_data(loom_model_at(m2, 1))[0] == 5.0f);
    snprintf(p, sizeof p, "%s/step-000005.safetensors", dir);
    size_t n;
    unsigned char *b = slurp(p, &n);
    b[n - 1] ^= 1;
    spit(p, b, n);
    free(b);
    ASSERT_EQ(loom_checkpoint_resume(dir, m2, o2, &steps, got, sizeof got), LOOM_OK);
    ASSERT_EQ(steps, 4); /* (step 5's is skipped with a warning) */
    ASSERT(strstr(got, "step-000004.safetensors"));
    /* resumed from step 2 and checkpointed at 3: 4 and 5 were another future */
    ASSERT_EQ(loom_checkpoint_write(&c, m, o, 3, 0.5, p, sizeof p), LOOM_OK);
    ASSERT_EQ(lines_with(index, "step-"), 2);
    ASSERT_EQ(lines_with(index, "step-000003.safetensors\t3\t0.5\n"), 1);
    snprintf(p, sizeof p, "%s/step-000005.safetensors", dir);
    ASSERT(access(p, F_OK) != 0);
    /* nothing there, or an index not loom's */
    char empty[512];
    test_tmp(empty, sizeof empty, "ckdir-none");
    ASSERT_EQ(loom_checkpoint_resume(empty, m2, o2, &steps, got, sizeof got), LOOM_ENOTFOUND);
    FILE *f = fopen(index, "w");
    fputs("step-000003.safetensors 3 x\n", f);
    fclose(f);
    ASSERT_EQ(loom_checkpoint_write(&c, m, o, 6, 0, p, sizeof p), LOOM_EFORMAT);
    ASSERT(strstr(loom_last_error(), "index.tsv line 1"));
    loom_optim_free(o2), loom_optim_free(o);
    loom_model_free(m2), loom_model_free(m);
}

int main(void) {
    RUN(round_trip_keeps_names_shapes_values);
    RUN(half_precision_tensors_read_as_float32);
    RUN(bad_files_are_refused_with_the_reason);
    RUN(metadata_round_trips_and_reads_json_escapes);
    RUN(checkpoint_round_trip_and_refusals);
    RUN(checkpoint_directory_keeps_newest_and_best);
    return HARNESS_EXIT();
}
