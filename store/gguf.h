/*
 * store/gguf.h - strict reader of GGUF files (llama.cpp's model container,
 * versions 2 and 3) and their conversion into an import source: tensors
 * under the HuggingFace names the engine binds, in their GGUF encoding, and
 * config.json / tokenizer.json / tokenizer_config.json /
 * generation_config.json rebuilt from the metadata.
 *
 * GGUF layout (little-endian): u32 magic "GGUF", u32 version, u64 tensor
 * count, u64 metadata count; metadata entries (string key, u32 value type,
 * value); tensor infos (string name, u32 n_dims, n_dims x u64 ne (innermost
 * first), u32 ggml type, u64 offset); padding to general.alignment (default
 * 32); the data section, each tensor at its offset from the section start.
 * A string is a u64 length and that many bytes; an array a u32 element
 * type, a u64 count and the elements.
 *
 * Everything read here is untrusted: every count, length, offset, type and
 * alignment is checked with overflow-safe arithmetic before use, allocation
 * follows what was actually parsed (never a count the file claims), and
 * every rejection names the file and the key or tensor (LMS_EFORMAT, or
 * LMS_EUNSUPPORTED for a well-formed file lmstore cannot store).
 */
#ifndef LMS_STORE_GGUF_H
#define LMS_STORE_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/safetensors.h"

#define LMS__GGUF_MAGIC 0x46554747u          /* "GGUF" read as a little-endian u32 */
#define LMS__GGUF_HEADER_CAP (1ull << 30)    /* bytes of metadata + tensor infos accepted */
#define LMS__GGUF_MAX_DIMS 4

enum lms__gguf_type {
    LMS__GGUF_U8 = 0, LMS__GGUF_I8, LMS__GGUF_U16, LMS__GGUF_I16, LMS__GGUF_U32, LMS__GGUF_I32,
    LMS__GGUF_F32, LMS__GGUF_BOOL, LMS__GGUF_STRING, LMS__GGUF_ARRAY, LMS__GGUF_U64, LMS__GGUF_I64,
    LMS__GGUF_F64, LMS__GGUF_TYPE_COUNT_
};

/* A string inside the parsed buffer: not NUL-terminated, not checked for UTF-8. */
typedef struct lms__gguf_str {
    const char *p;
    uint64_t n;
} lms__gguf_str;

typedef struct lms__gguf_kv {
    char *key;                 /* NUL-terminated copy, valid UTF-8 */
    uint32_t type;             /* lms__gguf_type */
    union {
        uint64_t u;            /* U8 .. U64, BOOL (0 or 1) */
        int64_t i;             /* I8 .. I64 */
        double f;              /* F32, F64 */
    } num;
    lms__gguf_str str;         /* STRING */
    uint32_t arr_type;         /* ARRAY: element type (never ARRAY) */
    uint64_t arr_n;            /* ARRAY: element count */
    const uint8_t *arr;        /* ARRAY of numbers: the packed little-endian elements */
    lms__gguf_str *arr_str;    /* ARRAY of STRING: arr_n strings (owned) */
} lms__gguf_kv;

typedef struct lms__gguf_tensor {
    char *name;                /* NUL-terminated copy, valid UTF-8 */
    uint32_t ggml_type;
    lms_dtype dtype;
    uint32_t n_dims;
    uint64_t ne[LMS__GGUF_MAX_DIMS]; /* innermost first (ne[0] = row length) */
    uint64_t offset;           /* from the start of the data section */
    uint64_t nbytes;
} lms__gguf_tensor;

typedef struct lms__gguf {
    char *path;
    uint32_t version;
    uint64_t file_size;
    uint32_t alignment;
    uint64_t data_off;         /* where the data section starts in the file */
    uint8_t *buf;              /* a copy of the header bytes everything above points into */
    size_t buf_len;
    lms__gguf_kv *kv;
    size_t n_kv;
    lms__gguf_tensor *t;       /* in file order */
    size_t n_t;
} lms__gguf;

/*
 * Parse the first len bytes of a GGUF file of file_size bytes (pure: the
 * fuzz target). 0 and *g filled (free with lms__gguf_clear); 1 when the
 * header runs past len but not past the file (read more and call again);
 * LMS_EFORMAT / LMS_EUNSUPPORTED / LMS_ENOMEM with detail naming `path`.
 */
int lms__gguf_parse(const char *path, const void *buf, size_t len, uint64_t file_size, lms__gguf *g);
void lms__gguf_clear(lms__gguf *g);

/* Read and parse the header of the file at path. */
int lms__gguf_open(const char *path, lms__gguf *g);

/* True when path is a file named *.gguf or starting with the GGUF magic, or
 * a folder with *.gguf files and no *.safetensors file. */
bool lms__gguf_is_source(const char *path);

/* ---- metadata access (errors name the file and key) ------------------------------------ */

const lms__gguf_kv *lms__gguf_find(const lms__gguf *g, const char *key);
/* An integer-typed (or, for _u64, also boolean) value in [0, max]:
 * LMS_ENOENT without detail when absent and !required. */
int lms__gguf_get_u64(const lms__gguf *g, const char *key, bool required, uint64_t max, uint64_t *out);
int lms__gguf_get_f64(const lms__gguf *g, const char *key, bool required, double *out);
int lms__gguf_get_bool(const lms__gguf *g, const char *key, bool required, bool *out);
/* A STRING value that is valid UTF-8 without NUL; *out points into g (not NUL-terminated). */
int lms__gguf_get_str(const lms__gguf *g, const char *key, bool required, lms__gguf_str *out);
/* Element i of a numeric array as double / int64 (the caller checked i < arr_n). */
double lms__gguf_arr_f64(const lms__gguf_kv *kv, uint64_t i);
int64_t lms__gguf_arr_i64(const lms__gguf_kv *kv, uint64_t i);
/* True for the integer and float element types. */
bool lms__gguf_type_numeric(uint32_t t);
const char *lms__gguf_type_name(uint32_t t);

/* Pre-tokenizer regexes as HF tokenizer.json spells them (llama.cpp's
 * tokenizer.ggml.pre names): GPT-2's ("gpt2", and after a \p{N} split
 * "smollm", "starcoder"), Llama 3's ("llama-bpe") and Qwen2's ("qwen2"). */
#define LMS__RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define LMS__RE_LLAMA3                                                                                                 \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|" \
    "\\s+(?!\\S)|\\s+"
#define LMS__RE_QWEN2                                                                                                  \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"     \
    "\\s+(?!\\S)|\\s+"

/* The GGUF name of an HF tensor name of the llama / qwen2 / qwen3 families
 * ("model.layers.3.self_attn.q_proj.weight" -> "blk.3.attn_q.weight");
 * LMS_ENOENT (without detail) for a name without one. */
int lms__gguf_name_from_hf(const char *hf, char *out, size_t cap);

/* ---- conversion into an import source (gguf_model.c) ------------------------------------ */

/*
 * Open a GGUF model: one file, the first of a set of split files
 * (NAME-00001-of-0000N.gguf: the others are found beside it), or a folder
 * holding one model's GGUF file(s). Fills *out with one shard per file
 * (tensors under HF names with their GGUF dtype and HF shape, byte ranges in
 * the file), and the generated side files. LMS_EFORMAT, LMS_EUNSUPPORTED
 * (architecture, tokenizer or tensor type lmstore cannot run or store),
 * LMS_ENOENT, LMS_EIO, LMS_ENOMEM; the detail names the file and key or
 * tensor.
 */
int lms__gguf_source_open(const char *src, lms__st_source **out);

/*
 * The pure part of the conversion (the fuzz target runs it on parsed
 * input): from the metadata of g (the first file of a model), the HF
 * name, dtype, shape and rotary permutation of each of the n tensors of
 * files gs[0..n_files), and the side files. Fills the shards' tensor lists
 * and s->gen_files.
 */
int lms__gguf_convert(lms__gguf *const *gs, size_t n_files, lms__st_source *s);

#endif
