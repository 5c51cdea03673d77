/*
 * store/safetensors.h - strict reader of safetensors files and of
 * HuggingFace model folders (shards + model.safetensors.index.json).
 *
 * Everything read here is untrusted: the header length is capped, every
 * length, offset, dtype and shape is checked with overflow-safe arithmetic,
 * and each rejection names the file and the tensor (LMS_EFORMAT). Nothing is
 * mapped or trusted before the checks pass.
 */
#ifndef LMS_STORE_SAFETENSORS_H
#define LMS_STORE_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lmstore/store.h"

#define LMS__ST_HEADER_CAP (100ull << 20) /* bytes of JSON header accepted */
#define LMS__ST_NAME_MAX 300              /* bytes of a tensor name (store keys are <= 511) */

typedef struct lms__st_tensor {
    char *name;          /* UTF-8, NUL-terminated */
    lms_dtype dtype;
    uint32_t ndim;
    uint64_t shape[LMS_MAX_DIMS];
    uint64_t nelem;      /* product of shape */
    uint64_t nbytes;     /* nelem * dtype size == end - begin */
    uint64_t begin, end; /* data_offsets, relative to the data region */
    /* Set by the readers of other containers (gguf.c, mlx.c), 0 for safetensors: */
    uint32_t bits, group; /* MLX_AFFINE: bits per code, codes per scale (lms__tensor_rec) */
    uint32_t perm_heads;  /* rows are stored in llama.cpp's rotary order in heads of
                           * shape[0] / perm_heads rows; import writes them in HF order */
} lms__st_tensor;

typedef struct lms__st_file {
    char *path;          /* as opened */
    uint64_t file_size;
    uint64_t header_len; /* N: the JSON header's length */
    uint64_t data_off;   /* 8 + N: where the data region starts in the file */
    uint64_t data_size;  /* file_size - data_off */
    lms__st_tensor *tensors; /* sorted by begin offset */
    size_t n_tensors;
    char *metadata;      /* __metadata__ as compact JSON, or NULL */
} lms__st_file;

/*
 * Parse and validate a header (pure: the fuzz target). `path` names the file
 * in errors; `json` is the N header bytes; data_size is the number of bytes
 * after the header in the file. Fills *out (free with lms__st_file_clear).
 */
int lms__st_parse_header(const char *path, const char *json, size_t len, uint64_t data_size, lms__st_file *out);
void lms__st_file_clear(lms__st_file *f);

/* Open a .safetensors file: read the length and header, validate. */
int lms__st_open(const char *path, lms__st_file **out);
void lms__st_free(lms__st_file *f); /* NULL ok */

/* A side file made by a reader (GGUF metadata -> config.json, ...). */
typedef struct lms__gen_file {
    char *name;
    char *data;
    size_t len;
} lms__gen_file;

/* A model source: one file, or a folder of shards (with or without an index). */
typedef struct lms__st_source {
    char *src;              /* as given */
    bool is_dir;
    char *index_path;       /* model.safetensors.index.json when used, else NULL */
    lms__st_file **shards;  /* sorted by file name */
    size_t n_shards;
    const char *kind;       /* "safetensors" or "GGUF" (static) */
    lms__gen_file *gen_files; /* side files made from a GGUF's metadata; the import stores
                               * these instead of reading the folder's */
    size_t n_gen_files;
} lms__st_source;

/*
 * Open and cross-check a source: every shard valid, no tensor name twice in
 * or across shards, and with an index: every shard it names exists, every
 * tensor it lists is in the shard it names, and every shard tensor is listed.
 */
int lms__st_source_open(const char *src, lms__st_source **out);
void lms__st_source_free(lms__st_source *s); /* NULL ok */

/*
 * Parse untrusted JSON strictly, as the reference implementations do
 * (serde_json in safetensors and tokenizers, Python's json): exactly one
 * value, then only whitespace; no NUL byte anywhere; no UTF-8 byte-order
 * mark in front (cJSON would skip one). NULL with LMS_EFORMAT detail
 * "<path>: <what> ..." naming the byte; free the result with cJSON_Delete.
 */
struct cJSON;
struct cJSON *lms__json_parse_strict(const char *path, const char *what, const char *json, size_t len);

/*
 * Parse model.safetensors.index.json's weight_map (pure). Fills parallel
 * arrays names[i] -> shards[i] sorted by name (free each and the arrays with
 * lms__free). Rejects non-objects, non-string shard names, names with '/'.
 */
int lms__st_parse_index(const char *path, const char *json, size_t len, char ***names, char ***shards,
                        size_t *n);

#endif
