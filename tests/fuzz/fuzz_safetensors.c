/*
 * tests/fuzz/fuzz_safetensors.c - libFuzzer target for the safetensors
 * header parser and the model.safetensors.index.json parser
 * (store/safetensors.c): both read files users download from anywhere.
 *
 * Input: byte 0 picks the parser; for headers, bytes 1..4 give the size of
 * the data region (little-endian) and the rest is the JSON header. Whatever
 * the parser accepts must hold together: tensors sorted, inside the data
 * region, without overlap, byte sizes equal to shape x dtype.
 */
#include <assert.h>
#include <stdint.h>
#include <string.h>

#include "common/common.h"
#include "store/safetensors.h"

static void header(const uint8_t *p, size_t n)
{
    if (n < 4)
        return;
    uint64_t data_size = lms__get_u32(p);
    lms__st_file f;
    memset(&f, 0, sizeof f);
    if (lms__st_parse_header("fuzz.safetensors", (const char *)p + 4, n - 4, data_size, &f) == 0) {
        uint64_t prev_end = 0;
        for (size_t i = 0; i < f.n_tensors; i++) {
            const lms__st_tensor *t = &f.tensors[i];
            assert(t->name && t->begin <= t->end && t->end <= data_size);
            assert(t->end - t->begin == t->nbytes);
            assert(t->nbytes == t->nelem * lms_dtype_size(t->dtype));
            assert(t->ndim <= LMS_MAX_DIMS);
            assert(t->begin >= prev_end);
            prev_end = t->end;
        }
    }
    lms__st_file_clear(&f);
}

static void index_json(const uint8_t *p, size_t n)
{
    char **names = NULL, **shards = NULL;
    size_t cnt = 0;
    if (lms__st_parse_index("model.safetensors.index.json", (const char *)p, n, &names, &shards, &cnt) != 0)
        return;
    for (size_t i = 0; i < cnt; i++) {
        assert(names[i] && shards[i] && !strchr(shards[i], '/'));
        if (i)
            assert(strcmp(names[i - 1], names[i]) < 0);
    }
    for (size_t i = 0; i < cnt; i++) {
        lms__free(names[i]);
        lms__free(shards[i]);
    }
    lms__free(names);
    lms__free(shards);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (data[0] & 1)
        index_json(data + 1, size - 1);
    else
        header(data + 1, size - 1);
    return 0;
}
