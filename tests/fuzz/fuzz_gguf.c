/*
 * tests/fuzz/fuzz_gguf.c - libFuzzer target for the GGUF reader
 * (store/gguf.c) and the conversion of its metadata into HF names, config
 * and tokenizer files (store/gguf_model.c): GGUF files come from anywhere.
 *
 * Input: a whole GGUF file. Whatever the parser accepts must hold together
 * (tensors inside the file, aligned, byte sizes from their blocks, no
 * overlap; string values inside the header copy); whatever the conversion
 * accepts gives JSON side files and tensors of the same sizes.
 */
#include <assert.h>
#include <cjson/cJSON.h>
#include <stdint.h>
#include <string.h>

#include "common/common.h"
#include "store/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    lms__gguf g;
    int rc = lms__gguf_parse("fuzz.gguf", data, size, size, &g);
    assert(rc != 1); /* the whole file was given: never "read more" */
    if (rc)
        return 0;
    assert(g.data_off <= size && g.data_off % g.alignment == 0);
    for (size_t i = 0; i < g.n_t; i++) {
        const lms__gguf_tensor *t = &g.t[i];
        assert(t->offset % g.alignment == 0 && t->offset + t->nbytes <= size - g.data_off);
        uint64_t shape[4], n;
        for (uint32_t d = 0; d < t->n_dims; d++)
            shape[d] = t->ne[t->n_dims - 1 - d];
        assert(lms_dtype_nbytes(t->dtype, 0, shape, t->n_dims, &n) == 0 && n == t->nbytes);
    }
    for (size_t i = 0; i < g.n_kv; i++) {
        const lms__gguf_kv *kv = &g.kv[i];
        if (kv->type == LMS__GGUF_STRING)
            assert((const uint8_t *)kv->str.p >= g.buf && (const uint8_t *)kv->str.p + kv->str.n <= g.buf + g.buf_len);
        for (uint64_t j = 0; kv->arr_str && j < kv->arr_n; j++)
            assert((const uint8_t *)kv->arr_str[j].p + kv->arr_str[j].n <= g.buf + g.buf_len);
    }
    lms__st_source s;
    memset(&s, 0, sizeof s);
    lms__st_file f;
    memset(&f, 0, sizeof f);
    lms__st_file *shards[1] = {&f};
    s.shards = shards;
    s.n_shards = 1;
    lms__gguf *gs[1] = {&g};
    if (lms__gguf_convert(gs, 1, &s) == 0) {
        assert(s.n_gen_files >= 1 && !strcmp(s.gen_files[0].name, "config.json"));
        for (size_t i = 0; i < s.n_gen_files; i++) {
            cJSON *j = cJSON_ParseWithLength(s.gen_files[i].data, s.gen_files[i].len);
            assert(j);
            cJSON_Delete(j);
        }
        assert(f.n_tensors == g.n_t);
        for (size_t i = 0; i < f.n_tensors; i++)
            assert(f.tensors[i].nbytes == g.t[i].nbytes && f.tensors[i].end <= size - g.data_off);
    }
    for (size_t i = 0; i < f.n_tensors; i++)
        lms__free(f.tensors[i].name);
    lms__free(f.tensors);
    for (size_t i = 0; i < s.n_gen_files; i++) {
        lms__free(s.gen_files[i].name);
        lms__free(s.gen_files[i].data);
    }
    lms__free(s.gen_files);
    lms__gguf_clear(&g);
    return 0;
}
