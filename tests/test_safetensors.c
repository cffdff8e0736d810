/*
 * test_safetensors.c - weights files: a save/load round trip with PyTorch's names, and each kind of
 * bad file refused with the tensor and the reason, leaving the model unchanged.
 */
#include "harness.h"

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
        {"{" W_OK_ ",\"0.bias\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[24,28]}}", 32, 0,
         LOOM_EUNSUPPORTED, "'0.bias' has dtype F16"},
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

int main(void) {
    RUN(round_trip_keeps_names_shapes_values);
    RUN(bad_files_are_refused_with_the_reason);
    RUN(metadata_round_trips_and_reads_json_escapes);
    return HARNESS_EXIT();
}
