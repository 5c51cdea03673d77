/*
 * tests/fuzz/fuzz_config.c - libFuzzer target for the config.json parser
 * (lms__config_parse, engine/config.c and the families' settings checks in
 * engine/model_*.c), which every engine open runs on the model's stored
 * config.json and generation_config.json: untrusted text.
 *
 * Input: config.json text, optionally followed by a NUL byte and
 * generation_config.json text. The parser either fails with LMS_EFORMAT or
 * LMS_EUNSUPPORTED and a detail naming the model, or gives hyper-parameters
 * inside the ranges it promises (the forward pass sizes buffers from them).
 */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/internal.h"

#define SRC "fuzz-model"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* two NUL-terminated texts: the parser reads C strings */
    char *buf = malloc(size + 2);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    buf[size] = buf[size + 1] = '\0';
    const char *cfg = buf, *gen = NULL;
    size_t cl = strlen(buf);
    if (cl < size)
        gen = buf + cl + 1;

    lms__hparams hp;
    int rc = lms__config_parse(cfg, gen, SRC, &hp);
    if (rc) {
        assert(rc == LMS_EFORMAT || rc == LMS_EUNSUPPORTED || rc == LMS_ENOMEM);
        assert(rc == LMS_ENOMEM || strstr(lms_last_error(), SRC));
        free(buf);
        return 0;
    }
    assert(hp.family && hp.family->name);
    assert(memchr(hp.arch_name, '\0', sizeof hp.arch_name));
    assert(hp.n_vocab >= 1 && hp.n_embd >= 1 && hp.n_layers >= 1 && hp.n_ff >= 1 && hp.max_pos >= 1);
    assert(hp.n_heads >= 1 && hp.n_kv_heads >= 1 && hp.n_heads % hp.n_kv_heads == 0);
    assert(hp.head_dim >= 2 && hp.head_dim <= 4096 && hp.head_dim % 2 == 0);
    assert(hp.eps >= 0 && hp.eps <= 1);
    assert(hp.bos_id == -1 || (hp.bos_id >= 0 && (uint32_t)hp.bos_id < hp.n_vocab));
    assert(hp.n_eos >= 0 && hp.n_eos <= LMS__MAX_EOS);
    for (int i = 0; i < hp.n_eos; i++)
        assert(hp.eos_ids[i] >= 0);
    free(buf);
    return 0;
}
