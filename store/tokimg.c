/*
 * store/tokimg.c - compiled tokenizers in the store (store/tokimg.h;
 * docs/FORMAT.md 3.8 is the normative description).
 *
 * Why a file per image and not a blob: a tokenizer is used for as long as its
 * process runs (a server: days), in place from a mapping. A side file record
 * lives in LMDB, whose pages may be reused once the record is gone, and a
 * blob would need a reference count kept by every writer that copies or
 * removes side files. An image file is immutable and named by its content,
 * so any number of models (and copies of models) can name it, a mapping of it
 * stays valid after gc unlinks it, and gc only has to see which names the
 * reference records hold.
 *
 * Design notes
 *  (1) An image file is complete before any record names it: written to a
 *      temporary name, fsync'd, renamed, the folder fsync'd, all under the
 *      append lock and before the import's commit (FORMAT.md section 4). A
 *      crash leaves at worst an image no record names, which gc removes.
 *  (2) gc removes images only while holding the append lock, so it never
 *      removes one an import has written and not yet committed.
 *  (3) A reference names the XXH3-64 of the tokenizer.json,
 *      tokenizer_config.json and chat_template.jinja it was compiled from;
 *      lms_store_tokenizer uses the image only when the model's records
 *      still hold exactly those, else it parses the JSON (and says so).
 *  (4) Opening an image never reads all of it (that would cost what the
 *      image saves): the tokenizer checks its header and tables
 *      (tokenizer/tok_compiled.c), `lmstore verify` its hash.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lmstore/tokenizer.h"
#include "store/tokimg.h"
#include "tokenizer/tok_image.h"

#define REF_MAGIC "LMSTKREF"
#define REF_VERSION 1u
enum { REF_HAS_CONFIG = 1, REF_HAS_JINJA = 2 };

/* The three source files, in reference order. */
static const char *const SOURCES[3] = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"};

typedef struct ref {
    lms_hash128 image;
    uint64_t size;
    uint32_t flags;
    uint64_t src[3]; /* XXH3-64 of each source; 0 when absent */
} ref;

static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint64_t get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static void ref_encode(const ref *r, uint8_t out[64])
{
    memset(out, 0, 64);
    memcpy(out, REF_MAGIC, 8);
    uint32_t v = REF_VERSION;
    memcpy(out + 8, &v, 4);
    memcpy(out + 12, &r->flags, 4);
    lms__hash128_put(out + 16, r->image);
    put64(out + 32, r->size);
    for (int i = 0; i < 3; i++)
        put64(out + 40 + 8 * i, r->src[i]);
}

static int ref_decode(const void *buf, size_t n, ref *r)
{
    const uint8_t *p = buf;
    uint32_t v;
    if (n != 64 || memcmp(p, REF_MAGIC, 8) != 0)
        return lms__err(LMS_ECORRUPT, "%s: not a compiled tokenizer reference (%zu bytes)", LMS__TOKREF_NAME, n);
    memcpy(&v, p + 8, 4);
    if (v != REF_VERSION)
        return lms__err(LMS_EVERSION, "%s: version %u; this build reads version %u", LMS__TOKREF_NAME, v,
                        REF_VERSION);
    memcpy(&r->flags, p + 12, 4);
    r->image = lms__hash128_get(p + 16);
    r->size = get64(p + 32);
    for (int i = 0; i < 3; i++)
        r->src[i] = get64(p + 40 + 8 * i);
    return 0;
}

static char *image_path(lms_store *s, lms_hash128 h)
{
    char hex[33];
    lms__hash128_hex(h, hex);
    return lms__asprintf("%s/%s/%s%s", s->path, LMS__TOKIMG_DIR, hex, LMS__TOKIMG_EXT);
}

/* ---- import ----------------------------------------------------------------------------- */

static const lms__named_rec *find_rec(const lms__named_rec *files, size_t nf, const char *name)
{
    for (size_t i = 0; i < nf; i++)
        if (!strcmp(files[i].name, name))
            return &files[i];
    return NULL;
}

int lms__tokimg_prepare(lms_store *s, const lms__named_rec *files, size_t nf, lms__tokimg **out)
{
    char *text[3] = {NULL, NULL, NULL};
    size_t len[3] = {0, 0, 0};
    ref r = {0};
    lms_tokenizer *tok = NULL;
    lms__tokimg *ti = NULL;
    int rc = 0;
    *out = NULL;
    if (!find_rec(files, nf, SOURCES[0]))
        return 0;
    for (int i = 0; i < 3; i++) {
        const lms__named_rec *f = find_rec(files, nf, SOURCES[i]);
        lms__file_rec fr;
        if (!f)
            continue;
        if ((rc = lms__file_rec_decode(f->rec, f->len, &fr)) || (rc = lms__file_rec_inflate(&fr, SOURCES[i], &text[i], &len[i])))
            goto out;
        r.src[i] = fr.raw_hash;
        r.flags |= i == 1 ? REF_HAS_CONFIG : i == 2 ? REF_HAS_JINJA : 0;
    }
    rc = lms_tokenizer_load(text[0], len[0], text[1], &tok);
    if (!rc && text[2] && !lms_tokenizer_chat_template(tok))
        rc = lms_tokenizer_set_chat_template(tok, text[2]);
    if (rc == LMS_ENOMEM)
        goto out;
    if (rc) { /* the import goes on; every start will parse the JSON and report why */
        lms__info("tokenizer.json is not compiled into the store: %s", lms_last_error());
        lms_clear_error();
        rc = 0;
        goto out;
    }
    if (!(ti = lms__calloc(1, sizeof *ti))) {
        rc = LMS_ENOMEM;
        goto out;
    }
    if ((rc = lms_tokenizer_compile(tok, &ti->image, &ti->len))) {
        if (rc != LMS_ENOMEM) { /* a big-endian host, a table too large: parse at each start */
            lms__info("tokenizer.json is not compiled into the store: %s", lms_last_error());
            lms_clear_error();
            rc = 0;
        }
        goto out;
    }
    r.image = lms__hash128(ti->image, ti->len);
    r.size = ti->len;
    ref_encode(&r, ti->ref);
    if (!(ti->path = image_path(s, r.image))) {
        rc = LMS_ENOMEM;
        goto out;
    }
    *out = ti;
    ti = NULL;
out:
    lms__tokimg_free(ti);
    lms_tokenizer_free(tok);
    for (int i = 0; i < 3; i++)
        lms__free(text[i]);
    return rc;
}

/* Whether the file at path holds exactly buf. */
static int same_bytes(const char *path, const void *buf, size_t len, bool *same)
{
    *same = false;
    int fd = lms__open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return fd;
    uint64_t size;
    int rc = lms__fstat_size(fd, &size, path);
    if (!rc && size == len) {
        void *m = len ? mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0) : NULL;
        if (len && m == MAP_FAILED)
            rc = lms__err_errno(LMS_EIO, errno, "%s: mmap", path);
        else {
            *same = !len || !memcmp(m, buf, len);
            if (len)
                munmap(m, len);
        }
    }
    close(fd);
    return rc;
}

int lms__tokimg_write(lms_store *s, lms__tokimg *ti)
{
    assert(lms__append_locked(s)); /* design note 1 */
    int rc;
    if (lms__path_exists(ti->path)) {
        bool same;
        if ((rc = same_bytes(ti->path, ti->image, ti->len, &same)))
            return rc;
        if (!same)
            return lms__err(LMS_ECORRUPT, "%s: holds other bytes than its name says (a hash collision, or damage: "
                            "`lmstore verify` tells)", ti->path);
        return 0;
    }
    if (!(ti->dir = lms__asprintf("%s/%s", s->path, LMS__TOKIMG_DIR)))
        return LMS_ENOMEM;
    rc = 0;
    if (!lms__is_dir(ti->dir)) {
        if (!(rc = lms__mkdir_p(ti->dir, 0755)))
            ti->made_dir = true;
        if (!rc)
            rc = lms__fsync_dir(s->path); /* the new folder's entry */
    }
    /* whatever step fails, the file is this import's (the append lock is
     * held): lms__tokimg_unwrite removes it */
    ti->created = true;
    return rc ? rc : lms__write_file_atomic(ti->path, ti->image, ti->len);
}

void lms__tokimg_unwrite(lms__tokimg *ti)
{
    if (!ti)
        return;
    if (ti->created)
        unlink(ti->path); /* ENOENT when the write failed before the rename */
    if (ti->made_dir)
        rmdir(ti->dir);
    ti->created = ti->made_dir = false;
}

void lms__tokimg_free(lms__tokimg *ti)
{
    if (!ti)
        return;
    lms_tokenizer_buf_free(ti->image);
    lms__free(ti->path);
    lms__free(ti->dir);
    lms__free(ti);
}

/* ---- opening ------------------------------------------------------------------------------ */

typedef struct mapping {
    void *p;
    size_t n;
} mapping;

static void unmap(void *arg)
{
    mapping *m = arg;
    munmap(m->p, m->n);
    lms__free(m);
}

/* Map the image r names and open it. */
static int open_image(lms_store *s, const ref *r, lms_tokenizer **out)
{
    char *path = image_path(s, r->image);
    mapping *m = lms__calloc(1, sizeof *m);
    int fd = -1, rc = 0;
    if (!path || !m) {
        rc = LMS_ENOMEM;
        goto out;
    }
    if ((fd = lms__open(path, O_RDONLY | O_CLOEXEC, 0)) < 0) {
        rc = fd;
        goto out;
    }
    uint64_t size;
    if ((rc = lms__fstat_size(fd, &size, path)))
        goto out;
    if (size != r->size || size == 0 || size > SIZE_MAX) {
        rc = lms__err(LMS_ECORRUPT, "%s: %llu bytes, its reference says %llu", path, (unsigned long long)size,
                      (unsigned long long)r->size);
        goto out;
    }
    m->n = (size_t)size;
    if ((m->p = mmap(NULL, m->n, PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        m->p = NULL;
        rc = lms__err_errno(LMS_EIO, errno, "%s: mmap", path);
        goto out;
    }
    if ((rc = lms_tokenizer_open_image(m->p, m->n, out))) {
        rc = lms__err_prefix(rc, "%s: ", path);
        goto out;
    }
    lms__tokenizer_set_release(*out, unmap, m);
    m = NULL;
out:
    if (fd >= 0)
        close(fd);
    if (m && m->p)
        munmap(m->p, m->n);
    lms__free(m);
    lms__free(path);
    return rc;
}

/* The model's reference, if it has one whose sources are still its files
 * (design note 3). *found false: none, or a stale one (said on stderr). */
static int read_ref(lms_store *s, const char *model, ref *r, bool *found)
{
    MDB_txn *txn;
    MDB_val val;
    char key[512];
    *found = false;
    int rc = lms__txn_read(s, &txn);
    if (rc)
        return rc;
    rc = lms__model_get(s, txn, model, &val);
    if (rc)
        goto out;
    size_t klen = lms__key_item(key, sizeof key, model, LMS__TOKREF_NAME);
    if (!klen)
        goto out; /* a name too long for a reference: none */
    rc = lms__db_get(s, txn, LMS__DB_FILES, key, klen, &val);
    if (rc == LMS_ENOENT) { /* imported before images existed, or not compilable */
        lms_clear_error();
        rc = 0;
        goto out;
    }
    if (rc)
        goto out;
    lms__file_rec fr;
    char *raw = NULL;
    size_t rn;
    if ((rc = lms__file_rec_decode(val.mv_data, val.mv_size, &fr)) ||
        (rc = lms__file_rec_inflate(&fr, LMS__TOKREF_NAME, &raw, &rn)) || (rc = ref_decode(raw, rn, r))) {
        lms__free(raw);
        goto stale;
    }
    lms__free(raw);
    for (int i = 0; i < 3; i++) {
        bool want = i == 0 || (r->flags & (i == 1 ? REF_HAS_CONFIG : REF_HAS_JINJA));
        size_t kl = lms__key_item(key, sizeof key, model, SOURCES[i]);
        int grc = kl ? lms__db_get(s, txn, LMS__DB_FILES, key, kl, &val) : LMS_ENOENT;
        if (grc && grc != LMS_ENOENT) {
            rc = grc;
            goto out;
        }
        if (!grc && (rc = lms__file_rec_decode(val.mv_data, val.mv_size, &fr)))
            goto stale;
        if ((grc == 0) != want || (want && fr.raw_hash != r->src[i])) {
            rc = lms__err(LMS_ECORRUPT, "%s was compiled from another %s", LMS__TOKREF_NAME, SOURCES[i]);
            goto stale;
        }
    }
    *found = true;
    goto out;
stale:
    if (rc == LMS_ENOMEM)
        goto out;
    lms__warn("model '%s': its compiled tokenizer is not usable (%s); parsing tokenizer.json", model,
              lms_last_error());
    lms_clear_error();
    rc = 0;
out:
    lms__txn_end(s, txn);
    return rc;
}

/* tokenizer.json (+ tokenizer_config.json, chat_template.jinja when stored). */
static int load_json(lms_store *s, const char *model, lms_tokenizer **out)
{
    void *text[3] = {NULL, NULL, NULL};
    size_t len[3];
    int rc = lms_store_file(s, model, SOURCES[0], &text[0], &len[0]);
    for (int i = 1; i < 3 && !rc; i++)
        if ((rc = lms_store_file(s, model, SOURCES[i], &text[i], &len[i])) == LMS_ENOENT) {
            lms_clear_error();
            rc = 0;
        }
    if (!rc && (rc = lms_tokenizer_load(text[0], len[0], text[1], out)))
        rc = lms__err_prefix(rc, "model '%s': tokenizer.json: ", model);
    if (!rc && text[2] && !lms_tokenizer_chat_template(*out) && (rc = lms_tokenizer_set_chat_template(*out, text[2]))) {
        lms_tokenizer_free(*out);
        *out = NULL;
    }
    for (int i = 0; i < 3; i++)
        lms_free(text[i]);
    return rc;
}

int lms_store_tokenizer(lms_store *s, const char *model, lms_tokenizer **out)
{
    if (!out)
        return lms__err(LMS_EINVAL, "lms_store_tokenizer: out is NULL");
    *out = NULL;
    if (!s || !model)
        return lms__err(LMS_EINVAL, "lms_store_tokenizer: store and model are required");
    ref r;
    bool found;
    int rc = read_ref(s, model, &r, &found);
    if (rc)
        return rc;
    if (found) {
        if (!(rc = open_image(s, &r, out))) {
            lms__debug("model '%s': tokenizer opened in place from its compiled image (%llu bytes)", model,
                       (unsigned long long)r.size);
            return 0;
        }
        if (rc == LMS_ENOMEM)
            return rc;
        lms__warn("model '%s': its compiled tokenizer is not usable (%s); parsing tokenizer.json", model,
                  lms_last_error());
        lms_clear_error();
    }
    return load_json(s, model, out);
}

/* ---- gc and verify ------------------------------------------------------------------------- */

typedef struct hashset {
    lms_hash128 *v;
    size_t n, cap;
} hashset;

/* Every image a reference record names. */
static int referenced(lms_store *s, hashset *hs)
{
    MDB_txn *txn;
    MDB_cursor *cur = NULL;
    MDB_val k, d;
    const size_t nl = sizeof LMS__TOKREF_NAME; /* with the NUL before it: "model NUL name" */
    int rc = lms__txn_read(s, &txn), mrc;
    if (rc)
        return rc;
    if ((mrc = mdb_cursor_open(txn, s->dbi[LMS__DB_FILES], &cur))) {
        rc = lms__mdb_err(mrc, "%s: cursor", s->index_path);
        goto out;
    }
    int check;
    for (mrc = lms__cursor_get(s, cur, LMS__DB_FILES, &k, &d, MDB_FIRST, &check); !mrc;
         mrc = lms__cursor_get(s, cur, LMS__DB_FILES, &k, &d, MDB_NEXT, &check)) {
        const char *key = k.mv_data;
        if (k.mv_size < nl || key[k.mv_size - nl] != '\0' || memcmp(key + k.mv_size - nl + 1, LMS__TOKREF_NAME, nl - 1))
            continue;
        if (check) { /* a damaged reference may name any image: remove none (verify names the record) */
            rc = check;
            goto out;
        }
        lms__file_rec fr;
        char *raw = NULL;
        size_t rn;
        ref r;
        if (lms__file_rec_decode(d.mv_data, d.mv_size, &fr) || lms__file_rec_inflate(&fr, LMS__TOKREF_NAME, &raw, &rn) ||
            ref_decode(raw, rn, &r)) {
            lms__free(raw);
            if (lms_last_error_code() == LMS_ENOMEM) {
                rc = LMS_ENOMEM;
                goto out;
            }
            lms_clear_error(); /* an undecodable reference names nothing; verify reports it */
            continue;
        }
        lms__free(raw);
        if (hs->n == hs->cap) {
            size_t cap = hs->cap ? 2 * hs->cap : 16;
            lms_hash128 *v = lms__realloc(hs->v, cap * sizeof *v);
            if (!v) {
                rc = LMS_ENOMEM;
                goto out;
            }
            hs->v = v;
            hs->cap = cap;
        }
        hs->v[hs->n++] = r.image;
    }
    if (mrc != MDB_NOTFOUND)
        rc = lms__mdb_err(mrc, "%s: read files", s->index_path);
out:
    if (cur)
        mdb_cursor_close(cur);
    lms__txn_end(s, txn);
    return rc;
}

/* Parse "HEX32.lmtok" (no more, no less). */
static bool image_name(const char *name, lms_hash128 *h)
{
    size_t n = strlen(name), el = strlen(LMS__TOKIMG_EXT);
    if (n != 32 + el || strcmp(name + 32, LMS__TOKIMG_EXT) != 0)
        return false;
    uint64_t part[2] = {0, 0};
    for (int i = 0; i < 32; i++) {
        char c = name[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0)
            return false;
        part[i / 16] = part[i / 16] << 4 | (uint64_t)d;
    }
    h->hi = part[0];
    h->lo = part[1];
    return true;
}

/* Each file of STORE/tokenizers/ that no reference names: images, and
 * temporary files of interrupted writes. fn(path, size) for each. */
static int each_unreferenced(lms_store *s, int (*fn)(void *, const char *, uint64_t), void *ctx)
{
    hashset hs = {0};
    char *dir = lms__asprintf("%s/%s", s->path, LMS__TOKIMG_DIR);
    int rc = dir ? 0 : LMS_ENOMEM;
    DIR *d = NULL;
    if (rc || !lms__is_dir(dir) || (rc = referenced(s, &hs)))
        goto out;
    if (!(d = opendir(dir))) {
        rc = lms__err_errno(LMS_EIO, errno, "%s", dir);
        goto out;
    }
    struct dirent *e;
    while (!rc && (e = readdir(d))) {
        lms_hash128 h;
        bool tmp = strstr(e->d_name, LMS__TOKIMG_EXT ".tmp.") != NULL, live = false;
        if (!tmp && !image_name(e->d_name, &h))
            continue; /* not ours */
        for (size_t i = 0; !tmp && i < hs.n && !live; i++)
            live = lms__hash128_eq(hs.v[i], h);
        if (live)
            continue;
        char *path = lms__asprintf("%s/%s", dir, e->d_name);
        struct stat st;
        if (!path)
            rc = LMS_ENOMEM;
        else if (!stat(path, &st) && S_ISREG(st.st_mode))
            rc = fn(ctx, path, (uint64_t)st.st_size);
        lms__free(path);
    }
out:
    if (d)
        closedir(d);
    lms__free(hs.v);
    lms__free(dir);
    return rc;
}

typedef struct sweep_ctx {
    bool dry;
    uint64_t bytes;
} sweep_ctx;

static int sweep_one(void *arg, const char *path, uint64_t size)
{
    sweep_ctx *c = arg;
    if (!c->dry && unlink(path) && errno != ENOENT)
        return lms__err_errno(LMS_EIO, errno, "%s: unlink", path);
    c->bytes += size;
    return 0;
}

int lms__tokimg_sweep(lms_store *s, bool dry_run, uint64_t *bytes)
{
    assert(dry_run || lms__append_locked(s)); /* design note 2 */
    sweep_ctx c = {dry_run, 0};
    int rc = each_unreferenced(s, sweep_one, &c);
    *bytes = c.bytes;
    return rc;
}

int lms__tokimg_garbage(lms_store *s, uint64_t *bytes) { return lms__tokimg_sweep(s, true, bytes); }

int lms__tokimg_check(lms_store *s, const void *raw, size_t n, bool hash)
{
    ref r = {0};
    int rc = ref_decode(raw, n, &r);
    if (rc)
        return rc;
    char *path = image_path(s, r.image);
    if (!path)
        return LMS_ENOMEM;
    int fd = lms__open(path, O_RDONLY | O_CLOEXEC, 0);
    uint64_t size = 0;
    if (fd < 0) {
        rc = lms__err(LMS_ECORRUPT, "the compiled tokenizer %s is missing", path);
        goto out;
    }
    if ((rc = lms__fstat_size(fd, &size, path)))
        goto out;
    if (size != r.size) {
        rc = lms__err(LMS_ECORRUPT, "%s is %llu bytes, its reference says %llu", path, (unsigned long long)size,
                      (unsigned long long)r.size);
        goto out;
    }
    if (hash && size) {
        void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            rc = lms__err_errno(LMS_EIO, errno, "%s: mmap", path);
            goto out;
        }
        bool ok = lms__hash128_eq(lms__hash128(m, (size_t)size), r.image);
        munmap(m, (size_t)size);
        if (!ok)
            rc = lms__err(LMS_ECORRUPT, "%s does not hash to its name (damaged)", path);
    }
out:
    if (fd >= 0)
        close(fd);
    lms__free(path);
    return rc;
}
