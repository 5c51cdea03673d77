/*
 * lmstore/tokenizer.h - text <-> token ids, exactly as HuggingFace
 * `tokenizers` does it for a model's tokenizer.json, plus streaming
 * detokenization, stop strings and built-in chat formats.
 *
 * Supported tokenizer.json components (anything else fails at load with
 * LMS_EUNSUPPORTED naming the component, never by mis-tokenizing):
 *   model          BPE (vocab, merges "a b" or ["a","b"], ignore_merges,
 *                  byte_fallback, unk_token, fuse_unk)
 *   normalizer     NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend, Strip,
 *                  Sequence
 *   pre_tokenizer  Split (PCRE2 regex or string; Removed, Isolated,
 *                  MergedWithPrevious, MergedWithNext, Contiguous; invert),
 *                  ByteLevel, Metaspace, Digits, Punctuation,
 *                  WhitespaceSplit, Sequence
 *   post_processor TemplateProcessing, ByteLevel, Sequence
 *   decoder        ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace,
 *                  Sequence
 *   added_tokens   special, lstrip, rstrip, single_word, normalized
 *
 * Thread safety: a loaded lms_tokenizer is immutable; encode, decode and the
 * lookups may be called from many threads at once. A detokenizer or stop
 * matcher belongs to one thread at a time.
 *
 * Memory: buffers returned through `int32_t **` / `char **` are owned by the
 * caller and freed with lms_tokenizer_buf_free() (the same allocator as
 * lms_free()). Errors follow lmstore/error.h: 0 or a negative LMS_E* code,
 * detail in lms_last_error(); on failure outputs are NULL / 0.
 */
#ifndef LMSTORE_TOKENIZER_H
#define LMSTORE_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lmstore/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lms_tokenizer lms_tokenizer;

/* ---- loading -------------------------------------------------------------- */

/*
 * Load a tokenizer from the text of a tokenizer.json (`len` bytes, need not be
 * NUL-terminated) and, optionally, of the model's tokenizer_config.json
 * (NUL-terminated or NULL): it supplies bos/eos tokens and the chat template.
 * Neither buffer is kept. On failure *out is NULL. Errors: LMS_EFORMAT
 * (malformed JSON, merge of unknown tokens, bad regex: the message names the
 * field), LMS_EUNSUPPORTED (component type lmstore does not implement),
 * LMS_ENOMEM.
 */
LMS_API int lms_tokenizer_load(const char *tokenizer_json, size_t len, const char *tokenizer_config_json,
                       lms_tokenizer **out);

/* Same from files; config_path may be NULL. Errors as above plus LMS_ENOENT,
 * LMS_EIO naming the path. */
LMS_API int lms_tokenizer_load_file(const char *path, const char *config_path, lms_tokenizer **out);

/* NULL is accepted. */
LMS_API void lms_tokenizer_free(lms_tokenizer *tok);

/* ---- the compiled form ----------------------------------------------------------
 *
 * A loaded tokenizer can be written as one binary image of its tables
 * (docs/TOKENIZER.md, "Compiled form"; the store keeps one per imported
 * model) and opened again from it in place: opening reads a header and points
 * the vocabulary, merges and added-token tables into the image, so it costs
 * O(1) in the vocabulary size instead of a JSON parse. A tokenizer opened
 * from an image encodes and decodes exactly as the one it was compiled from.
 */

/*
 * Write tok's image: *out is a new buffer of *len bytes (free with
 * lms_tokenizer_buf_free); tok is unchanged. Errors: LMS_ENOMEM, LMS_ERANGE
 * (a table too large for the format), LMS_EUNSUPPORTED (a big-endian host:
 * the image is little-endian).
 */
LMS_API int lms_tokenizer_compile(const lms_tokenizer *tok, void **out, size_t *len);

/*
 * Open an image in place. `image` (8-byte aligned; a mapping or a heap
 * buffer is) is borrowed, never written, and must stay valid and unchanged
 * until lms_tokenizer_free. The image is untrusted input: the header, every
 * section's offset and size and every small table are checked here, and the
 * large tables' entries where they are read, so a damaged image yields wrong
 * ids at worst, never a crash. Errors: LMS_EFORMAT (not an image or a check
 * failed: the message names the section), LMS_EVERSION (another version of
 * the format), LMS_EINVAL (NULL or misaligned), LMS_EUNSUPPORTED (a
 * big-endian host), LMS_ENOMEM; a regex that does not compile as in
 * lms_tokenizer_load. On failure *out is NULL.
 */
LMS_API int lms_tokenizer_open_image(const void *image, size_t len, lms_tokenizer **out);

/* Free an ids array or text returned by this API. NULL ok. */
LMS_API void lms_tokenizer_buf_free(void *p);

/* ---- encode / decode --------------------------------------------------------- */

enum lms_tok_flags {
    /* Add what the post-processor adds (e.g. Gemma's <bos>); like HF
     * add_special_tokens=True. */
    LMS_TOK_ADD_SPECIAL = 1 << 0,
    /* Recognise special tokens written in the text ("<|im_start|>" -> one id).
     * Off, user text never turns into control tokens (HF
     * encode_special_tokens=True); added tokens that are not special are
     * still recognised, as HF does. */
    LMS_TOK_PARSE_SPECIAL = 1 << 1,
};

/*
 * Encode `len` bytes of UTF-8 text (NULs allowed). *ids is a new array of *n
 * ids (non-NULL even when *n is 0). Errors: LMS_EINVAL (text is not valid
 * UTF-8: the message gives the byte offset), LMS_ENOMEM.
 */
LMS_API int lms_tokenizer_encode(const lms_tokenizer *tok, const char *text, size_t len, unsigned flags,
                         int32_t **ids, size_t *n);

/*
 * Decode ids to text as HF `decode` does (ids outside the vocabulary are
 * skipped, as HF does; skip_special drops special added tokens). *text is
 * NUL-terminated, *len excludes the NUL; len may be NULL.
 */
LMS_API int lms_tokenizer_decode(const lms_tokenizer *tok, const int32_t *ids, size_t n, bool skip_special,
                         char **text, size_t *len);

/* ---- vocabulary ------------------------------------------------------------------ */

/* Largest id + 1 over the model vocabulary and the added tokens. */
LMS_API size_t lms_tokenizer_vocab_size(const lms_tokenizer *tok);
/* Id of a token string as written in tokenizer.json ("Ġthe", "<|im_end|>");
 * -1 when absent. */
LMS_API int32_t lms_tokenizer_token_to_id(const lms_tokenizer *tok, const char *token);
/* Token string of an id; NULL for an unknown id. Valid until
 * lms_tokenizer_free. */
LMS_API const char *lms_tokenizer_id_to_token(const lms_tokenizer *tok, int32_t id);
/* True for special added tokens (what skip_special drops). */
LMS_API bool lms_tokenizer_is_special(const lms_tokenizer *tok, int32_t id);
/* BOS / EOS ids from tokenizer_config.json (bos_token, eos_token), else from
 * the post-processor's first special token (BOS); -1 when unknown. */
LMS_API int32_t lms_tokenizer_bos_id(const lms_tokenizer *tok);
LMS_API int32_t lms_tokenizer_eos_id(const lms_tokenizer *tok);

/* ---- streaming detokenizer ---------------------------------------------------------- */

/*
 * Turns ids, one at a time, into text as they arrive. Text that is not yet
 * complete UTF-8 (a character split over several byte tokens) is held back
 * until the bytes that complete it arrive; the concatenation of everything
 * returned equals lms_tokenizer_decode of all the ids whenever that text is
 * valid UTF-8. Bytes that can never become valid come out as U+FFFD.
 */
typedef struct lms_detokenizer lms_detokenizer;

/* tok must outlive the detokenizer. */
LMS_API int lms_detokenizer_create(const lms_tokenizer *tok, bool skip_special, lms_detokenizer **out);
LMS_API void lms_detokenizer_free(lms_detokenizer *d); /* NULL ok */
/* Forget all state (start of a new stream). */
LMS_API void lms_detokenizer_reset(lms_detokenizer *d);
/*
 * Push one id; *text (not NUL-terminated) / *len is the newly completed text,
 * possibly empty. *text is valid until the next call on d.
 */
LMS_API int lms_detokenizer_push(lms_detokenizer *d, int32_t id, const char **text, size_t *len);
/* End of stream: whatever is held back, incomplete bytes as U+FFFD. */
LMS_API int lms_detokenizer_flush(lms_detokenizer *d, const char **text, size_t *len);

/* ---- stop strings -------------------------------------------------------------------- */

/*
 * Watches streamed text for stop strings. Text that could be the start of a
 * stop string is held back until it is known not to be one; when a stop
 * string appears, the text before it is released and the matcher reports a
 * stop (the stop string itself is not released).
 */
typedef struct lms_stop_matcher lms_stop_matcher;

/* Copies the strings (empty strings are ignored). n may be 0. */
LMS_API int lms_stop_matcher_create(const char *const *stops, size_t n, lms_stop_matcher **out);
LMS_API void lms_stop_matcher_free(lms_stop_matcher *m); /* NULL ok */
LMS_API void lms_stop_matcher_reset(lms_stop_matcher *m);
/*
 * Feed text. *out / *out_len: text now safe to show (valid until the next
 * call on m). *stopped is set to true when a stop string was found; further
 * pushes release nothing. *which (may be NULL) is the index of the stop
 * string found, else -1.
 */
LMS_API int lms_stop_matcher_push(lms_stop_matcher *m, const char *text, size_t len, const char **out,
                          size_t *out_len, bool *stopped, int *which);
/* End of stream: release what is held back (nothing after a stop). */
LMS_API int lms_stop_matcher_flush(lms_stop_matcher *m, const char **out, size_t *out_len);

/* ---- chat formats ------------------------------------------------------------------------ */

typedef enum lms_chat_format {
    LMS_CHAT_UNKNOWN = 0,
    LMS_CHAT_CHATML, /* Qwen 2/3: <|im_start|>role\n...<|im_end|>\n */
    LMS_CHAT_LLAMA3, /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    LMS_CHAT_GEMMA,  /* <start_of_turn>user\n...<end_of_turn>\n */
} lms_chat_format;

typedef struct lms_chat_message {
    const char *role;    /* "system", "user", "assistant"; "tool" in ChatML and Llama 3 */
    const char *content; /* NUL-terminated UTF-8 */
} lms_chat_message;

enum lms_chat_flags {
    LMS_CHAT_ADD_GENERATION_PROMPT = 1 << 0, /* end with the assistant header */
    LMS_CHAT_NO_THINKING = 1 << 1,           /* ChatML/Qwen3: enable_thinking=false */
};

/* "chatml", "llama3", "gemma"; NULL for LMS_CHAT_UNKNOWN. */
LMS_API const char *lms_chat_format_name(lms_chat_format fmt);
/* By name (case-insensitive; "qwen" = chatml, "llama" = llama3, "gemma3" =
 * gemma), for --chat-format. LMS_EINVAL listing the names when unknown. */
LMS_API int lms_chat_format_from_name(const char *name, lms_chat_format *out);
/*
 * Recognise a Jinja chat template (tokenizer_config.json's chat_template or
 * chat_template.jinja) by its markers. LMS_EUNSUPPORTED when none fits,
 * suggesting --chat-format.
 */
LMS_API int lms_chat_format_detect(const char *template_text, lms_chat_format *out);
/* The format of the template in the tokenizer_config.json given at load;
 * LMS_ENOENT when there was none, LMS_EUNSUPPORTED when unrecognised. */
LMS_API int lms_tokenizer_chat_format(const lms_tokenizer *tok, lms_chat_format *out);
/* The chat template text from tokenizer_config.json, or NULL. Valid until
 * lms_tokenizer_free. */
LMS_API const char *lms_tokenizer_chat_template(const lms_tokenizer *tok);
/* Set (replace) the chat template, e.g. from a chat_template.jinja file; the
 * text is copied. Call before sharing tok between threads. */
LMS_API int lms_tokenizer_set_chat_template(lms_tokenizer *tok, const char *template_text);

/*
 * Render messages as the model's template would (the text, including BOS
 * where the template writes it: encode it with LMS_TOK_PARSE_SPECIAL and
 * without LMS_TOK_ADD_SPECIAL). flags: lms_chat_flags (passing `true` asks
 * for the generation prompt). *out is NUL-terminated, freed with
 * lms_tokenizer_buf_free. Errors: LMS_EINVAL (unknown format, a role the
 * format cannot express, Gemma roles not alternating user/assistant).
 */
LMS_API int lms_chat_apply(lms_chat_format fmt, const lms_chat_message *msgs, size_t n, unsigned flags,
                   char **out);

/*
 * The family's end-of-turn tokens: the ids (of those present in tok) and the
 * strings. Fills up to `max` ids into ids (may be NULL to count) and returns
 * the number found (>= 0) or a negative code. Strings: a NULL-terminated
 * static array.
 */
LMS_API int lms_chat_stop_ids(const lms_tokenizer *tok, lms_chat_format fmt, int32_t *ids, size_t max);
LMS_API const char *const *lms_chat_stop_strings(lms_chat_format fmt);

#ifdef __cplusplus
}
#endif
#endif
