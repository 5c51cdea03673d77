/*
 * store/tokimg.h - compiled tokenizers in the store (docs/FORMAT.md 3.8):
 * import writes each model's tokenizer as an image file in STORE/tokenizers/
 * (named by the XXH3-128 of its bytes, immutable) and a side file record
 * `.tokenizer.lmstok` that names it; lms_store_tokenizer maps the image and
 * opens it in place; gc removes images no record names; verify checks them.
 * Internal.
 */
#ifndef LMS_STORE_TOKIMG_H
#define LMS_STORE_TOKIMG_H

#include "store/store_internal.h"

#define LMS__TOKREF_NAME ".tokenizer.lmstok" /* the side file naming the image */
#define LMS__TOKIMG_DIR "tokenizers"
#define LMS__TOKIMG_EXT ".lmtok"

/* An image on its way into the store (import). */
typedef struct lms__tokimg {
    void *image;          /* lms_tokenizer_compile's bytes */
    size_t len;
    uint8_t ref[64];      /* the raw bytes of the .tokenizer.lmstok record */
    char *path;           /* STORE/tokenizers/HEX.lmtok */
    char *dir;            /* STORE/tokenizers */
    bool created;         /* lms__tokimg_write made (or began) the file: a rollback unlinks it */
    bool made_dir;        /* ... and the folder: a rollback removes it */
} lms__tokimg;

/*
 * Compile the tokenizer of a model about to be imported from its side file
 * records (tokenizer.json, tokenizer_config.json, chat_template.jinja).
 * *out is NULL when there is no tokenizer.json or it does not load (the
 * model then parses it at each start, which reports why); an error only for
 * LMS_ENOMEM.
 */
int lms__tokimg_prepare(lms_store *s, const lms__named_rec *files, size_t nf, lms__tokimg **out);

/* Under the append lock, before the commit that adds the reference record:
 * write the image file (tmp, fsync, rename, fsync the folder), or find the
 * identical one already there. Different bytes under the same name (a hash
 * collision) is LMS_ECORRUPT naming the file. */
int lms__tokimg_write(lms_store *s, lms__tokimg *ti);

/* After a failed import: unlink the image (and the folder) if this import
 * created them. */
void lms__tokimg_unwrite(lms__tokimg *ti);
void lms__tokimg_free(lms__tokimg *ti); /* NULL ok */

/*
 * gc, holding the append lock (or dry): remove image files that no
 * .tokenizer.lmstok record names, and temporary files left by a crashed
 * writer. *bytes: their total size (what is, or would be, freed).
 */
int lms__tokimg_sweep(lms_store *s, bool dry_run, uint64_t *bytes);

/* verify: the image a reference record (raw bytes ref, n) names exists, has
 * its size and, with hash, its XXH3-128. 0 or LMS_ECORRUPT / LMS_EIO with the
 * detail in lms_last_error; LMS_ENOMEM. */
int lms__tokimg_check(lms_store *s, const void *ref, size_t n, bool hash);

/* Bytes of image files that no reference names (verify's garbage figure). */
int lms__tokimg_garbage(lms_store *s, uint64_t *bytes);

#endif
