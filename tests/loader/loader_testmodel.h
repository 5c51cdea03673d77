/*
 * tests/loader/loader_testmodel.h - writes small HuggingFace-style models
 * (safetensors shards + config.json) with known pseudo-random bytes, imports
 * them into a fresh store, and lets tests check the loader's views against
 * the bytes the generator wrote (the reference: independent of the store).
 *
 * Header-only (static functions) so each test program stays one file.
 */
#ifndef LMS_LOADER_TESTMODEL_H
#define LMS_LOADER_TESTMODEL_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lmstore/loader.h"
#include "lmstore/store.h"

typedef struct tm_tensor {
    char name[128];
    const char *dtype;
    int ndim;
    uint64_t shape[4];
    uint64_t nbytes;
    uint64_t seed;
    int shard;
} tm_tensor;

typedef struct tm_model {
    int n;
    tm_tensor t[256];
} tm_model;

/* Deterministic bytes of tensor seed at byte i (splitmix64 per 8 bytes). */
static inline uint64_t tm_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static inline void tm_fill(uint8_t *buf, uint64_t n, uint64_t seed)
{
    for (uint64_t i = 0; i < n; i += 8) {
        uint64_t v = tm_mix(seed * 0x100000001b3ull + i / 8);
        for (uint64_t k = 0; k < 8 && i + k < n; k++)
            buf[i + k] = (uint8_t)(v >> (8 * k));
    }
}

static inline size_t tm_dtype_size(const char *d)
{
    if (!strcmp(d, "F32") || !strcmp(d, "I32")) return 4;
    if (!strcmp(d, "BF16") || !strcmp(d, "F16")) return 2;
    if (!strcmp(d, "U8") || !strcmp(d, "I8")) return 1;
    return 8;
}

static inline void tm_add(tm_model *m, const char *name, const char *dtype, int ndim, const uint64_t *shape, int shard)
{
    tm_tensor *t = &m->t[m->n];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->ndim = ndim;
    t->nbytes = tm_dtype_size(dtype);
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->nbytes *= shape[i];
    }
    t->seed = 1000 + (uint64_t)m->n;
    t->shard = shard;
    m->n++;
}

/* A llama-shaped model: embedding, n_layers blocks of 9 tensors, norm, head.
 * dim and ffn set the sizes; two shards (first half of the blocks in shard 0).
 * When `distinct` is false, tensors of the same shape and role share seeds
 * across layers (identical bytes, so the store deduplicates them). */
static inline void tm_llama(tm_model *m, int n_layers, uint64_t vocab, uint64_t dim, uint64_t ffn)
{
    memset(m, 0, sizeof *m);
    char nm[128];
    uint64_t s2[2];
    s2[0] = vocab, s2[1] = dim;
    tm_add(m, "model.embed_tokens.weight", "BF16", 2, s2, 0);
    for (int l = 0; l < n_layers; l++) {
        int sh = l < n_layers / 2 ? 0 : 1;
        static const char *attn[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
        for (int k = 0; k < 4; k++) {
            snprintf(nm, sizeof nm, "model.layers.%d.self_attn.%s.weight", l, attn[k]);
            s2[0] = dim, s2[1] = dim;
            tm_add(m, nm, "BF16", 2, s2, sh);
        }
        static const char *mlp[] = {"gate_proj", "up_proj", "down_proj"};
        for (int k = 0; k < 3; k++) {
            snprintf(nm, sizeof nm, "model.layers.%d.mlp.%s.weight", l, mlp[k]);
            s2[0] = k == 2 ? dim : ffn, s2[1] = k == 2 ? ffn : dim;
            tm_add(m, nm, "BF16", 2, s2, sh);
        }
        uint64_t s1 = dim;
        snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
        tm_add(m, nm, "F32", 1, &s1, sh);
        snprintf(nm, sizeof nm, "model.layers.%d.post_attention_layernorm.weight", l);
        tm_add(m, nm, "F32", 1, &s1, sh);
    }
    uint64_t s1 = dim;
    tm_add(m, "model.norm.weight", "F32", 1, &s1, 1);
    s2[0] = vocab, s2[1] = dim;
    tm_add(m, "lm_head.weight", "BF16", 2, s2, 1);
}

static inline const tm_tensor *tm_find(const tm_model *m, const char *name)
{
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->t[i].name, name))
            return &m->t[i];
    return NULL;
}

/* Write shard `shard` of m as DIR/model-0000S-of-00002.safetensors. When
 * sparse, only the first 4 KiB of each tensor is written (the rest is a
 * hole: zeros), which makes large models cheap. Returns 0 or -1. */
static inline int tm_write_shard(const tm_model *m, const char *dir, int shard, int nshards, bool sparse)
{
    char path[2048], *hdr = malloc(64 << 10);
    size_t hl = 0;
    uint64_t off = 0;
    if (!hdr)
        return -1;
    hl += (size_t)snprintf(hdr + hl, (64 << 10) - hl, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < m->n; i++) {
        const tm_tensor *t = &m->t[i];
        if (t->shard != shard)
            continue;
        hl += (size_t)snprintf(hdr + hl, (64 << 10) - hl, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name, t->dtype);
        for (int d = 0; d < t->ndim; d++)
            hl += (size_t)snprintf(hdr + hl, (64 << 10) - hl, "%s%llu", d ? "," : "", (unsigned long long)t->shape[d]);
        hl += (size_t)snprintf(hdr + hl, (64 << 10) - hl, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                               (unsigned long long)(off + t->nbytes));
        off += t->nbytes;
    }
    hl += (size_t)snprintf(hdr + hl, (64 << 10) - hl, "}");
    while (hl % 8)
        hdr[hl++] = ' ';
    snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", dir, shard + 1, nshards);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        free(hdr);
        return -1;
    }
    uint8_t len8[8];
    for (int k = 0; k < 8; k++)
        len8[k] = (uint8_t)((uint64_t)hl >> (8 * k));
    int rc = 0;
    if (write(fd, len8, 8) != 8 || write(fd, hdr, hl) != (ssize_t)hl)
        rc = -1;
    uint64_t base = 8 + hl;
    off = 0;
    for (int i = 0; i < m->n && !rc; i++) {
        const tm_tensor *t = &m->t[i];
        if (t->shard != shard)
            continue;
        uint64_t n = sparse ? (t->nbytes < 4096 ? t->nbytes : 4096) : t->nbytes;
        uint8_t *buf = malloc(n ? n : 1);
        tm_fill(buf, n, t->seed);
        if (pwrite(fd, buf, n, (off_t)(base + off)) != (ssize_t)n)
            rc = -1;
        free(buf);
        off += t->nbytes;
    }
    if (!rc && ftruncate(fd, (off_t)(base + off)))
        rc = -1;
    close(fd);
    free(hdr);
    return rc;
}

/* Reference bytes of tensor t (sparse: generated head, zero tail). */
static inline uint8_t *tm_expected(const tm_tensor *t, bool sparse)
{
    uint8_t *buf = calloc(1, t->nbytes ? t->nbytes : 1);
    tm_fill(buf, sparse ? (t->nbytes < 4096 ? t->nbytes : 4096) : t->nbytes, t->seed);
    return buf;
}

/* Write the model folder and import it as `name` into the store at
 * store_path (created when absent). Returns 0 or an LMS_E* code. */
static inline int tm_import(const tm_model *m, const char *dir, const char *store_path, const char *name, bool sparse)
{
    char path[2048];
    for (int s = 0; s < 2; s++)
        if (tm_write_shard(m, dir, s, 2, sparse))
            return LMS_EIO;
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return LMS_EIO;
    fprintf(f, "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\"}\n");
    fclose(f);
    lms_store *st = NULL;
    int rc = lms_store_open(store_path, LMS_STORE_CREATE, NULL, &st);
    if (rc)
        return rc;
    lms_import_params ip = lms_import_default_params();
    ip.name = name;
    ip.threads = 2;
    rc = lms_import(st, dir, &ip, NULL);
    lms_store_close(st);
    return rc;
}

#endif
