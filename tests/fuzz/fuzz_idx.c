/*
 * fuzz_idx.c - libFuzzer target: the IDX reader, plain and gzip'd, through loom_dataset_load_idx.
 * The first byte chooses: bit 0 gzip-compresses the images file (so mutations reach the
 * decompressed layout), bit 1 the labels file; the second and third bytes give where the rest is
 * split into the images file and the labels file. Nothing may crash, leak or allocate more than
 * the files hold (the fuzzer's -rss_limit_mb and -malloc_limit_mb catch that).
 */
#include "fuzz.h"
#include "loom.h"

#include <zlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *write_part(int which, bool gz, const uint8_t *p, size_t n) {
    if (!gz)
        return fuzz_file(which, "", p, n);
    const char *path = fuzz_file(which, ".gz", NULL, 0);
    gzFile f = gzopen(path, "wb");
    if (!f)
        abort();
    if (n)
        gzwrite(f, p, (unsigned)n);
    gzclose(f);
    return path;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3)
        return 0;
    static bool once;
    if (!once) { /* no decompressed copies: each input is read as it is */
        setenv("LOOM_DATA_CACHE", "off", 1);
        once = true;
    }
    size_t rest = size - 3, cut = ((size_t)data[1] << 8 | data[2]) % (rest + 1);
    const char *img = write_part(0, data[0] & 1, data + 3, cut);
    const char *lab = write_part(1, data[0] & 2, data + 3 + cut, rest - cut);
    loom_dataset *d = NULL;
    if (loom_dataset_load_idx(img, lab, 10, &d) == LOOM_OK) {
        loom_loader *l = loom_loader_new(
            d, &(loom_loader_config){.batch_size = 7, .no_shuffle = true, .drop_last = false});
        loom_batch b;
        while (l && loom_loader_next(l, &b))
            if (loom_loader_epoch(l) > 0)
                break;
        loom_loader_free(l);
        loom_dataset_free(d);
    }
    return 0;
}
