/*
 * store/gguf.c - the GGUF container: a strict parser of the header
 * (metadata and tensor infos) over a byte buffer, the file reader that feeds
 * it, and typed access to metadata values. gguf.h describes the layout; the
 * conversion into HF names, config and tokenizer is gguf_model.c.
 *
 * Checks, each failing with the file named (and the key or tensor):
 * magic and version (2 or 3; a byte-swapped version means a big-endian
 * file), every length and count against the bytes that remain, value types,
 * booleans 0 or 1, no arrays of arrays, keys and tensor names valid UTF-8
 * without NUL and unique, at most 4 dimensions whose product and byte size
 * fit in 64 bits, row lengths whole blocks of the tensor type, types lmstore
 * stores, general.alignment a power of two (u32), every tensor offset
 * aligned, inside the file and overlapping no other tensor.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "quant/quant.h"
#include "store/gguf.h"

#define MAX_ENTRIES (1u << 24) /* metadata entries or tensors in one file */
#define KEY_MAX 65535

static const struct {
    const char *name;
    uint32_t size; /* bytes of a scalar; 0 for STRING and ARRAY */
} types[LMS__GGUF_TYPE_COUNT_] = {
    [LMS__GGUF_U8] = {"u8", 1},    [LMS__GGUF_I8] = {"i8", 1},      [LMS__GGUF_U16] = {"u16", 2},
    [LMS__GGUF_I16] = {"i16", 2},  [LMS__GGUF_U32] = {"u32", 4},    [LMS__GGUF_I32] = {"i32", 4},
    [LMS__GGUF_F32] = {"f32", 4},  [LMS__GGUF_BOOL] = {"bool", 1},  [LMS__GGUF_STRING] = {"string", 0},
    [LMS__GGUF_ARRAY] = {"array", 0}, [LMS__GGUF_U64] = {"u64", 8}, [LMS__GGUF_I64] = {"i64", 8},
    [LMS__GGUF_F64] = {"f64", 8},
};

const char *lms__gguf_type_name(uint32_t t) { return t < LMS__GGUF_TYPE_COUNT_ ? types[t].name : "?"; }

bool lms__gguf_type_numeric(uint32_t t)
{
    return t < LMS__GGUF_TYPE_COUNT_ && t != LMS__GGUF_STRING && t != LMS__GGUF_ARRAY && t != LMS__GGUF_BOOL;
}

/* ---- the cursor ------------------------------------------------------------------------- */

typedef struct cur {
    const uint8_t *p;
    size_t len, pos;
    uint64_t file_size;
    const char *path;
    bool more; /* ran out of buffer before the end of the file */
} cur;

/* n bytes available at the cursor? Sets c->more or the error. */
static int need(cur *c, uint64_t n, const char *what)
{
    if (n <= c->len - c->pos)
        return 0;
    uint64_t end;
    if (!lms__add_overflow(c->pos, n, &end) && end <= c->file_size && c->len < c->file_size) {
        c->more = true;
        return 1;
    }
    return lms__err(LMS_EFORMAT, "%s: %s runs past the end of the file (%llu bytes at offset %zu, file %llu bytes): "
                    "truncated or corrupt",
                    c->path, what, (unsigned long long)n, c->pos, (unsigned long long)c->file_size);
}

static int rd(cur *c, void *out, size_t n, const char *what)
{
    int rc = need(c, n, what);
    if (rc)
        return rc;
    memcpy(out, c->p + c->pos, n);
    c->pos += n;
    return 0;
}

static int rd_u32(cur *c, uint32_t *v, const char *what)
{
    uint8_t b[4];
    int rc = rd(c, b, 4, what);
    if (!rc)
        *v = lms__get_u32(b);
    return rc;
}

static int rd_u64(cur *c, uint64_t *v, const char *what)
{
    uint8_t b[8];
    int rc = rd(c, b, 8, what);
    if (!rc)
        *v = lms__get_u64(b);
    return rc;
}

static int rd_str(cur *c, lms__gguf_str *s, const char *what)
{
    uint64_t n;
    int rc = rd_u64(c, &n, what);
    if (rc)
        return rc;
    if ((rc = need(c, n, what)))
        return rc;
    s->p = (const char *)c->p + c->pos;
    s->n = n;
    c->pos += (size_t)n;
    return 0;
}

/* A printable excerpt of untrusted bytes for messages. */
static void printable(const char *s, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 6 < cap; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x20 || ch >= 0x7f)
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", ch);
        else
            out[o++] = (char)ch;
    }
    if (o + 6 >= cap && cap > 4)
        memcpy(out + cap - 4, "...", 3), o = cap - 1;
    out[o] = '\0';
}

static bool name_ok(const lms__gguf_str *s, size_t max)
{
    return s->n > 0 && s->n <= max && !memchr(s->p, '\0', (size_t)s->n) && lms__utf8_valid(s->p, (size_t)s->n);
}

/* ---- values --------------------------------------------------------------------------------- */

static int rd_scalar(cur *c, uint32_t type, lms__gguf_kv *kv, const char *what)
{
    uint8_t b[8];
    int rc = rd(c, b, types[type].size, what);
    if (rc)
        return rc;
    switch (type) {
    case LMS__GGUF_U8: kv->num.u = b[0]; break;
    case LMS__GGUF_I8: kv->num.i = (int8_t)b[0]; break;
    case LMS__GGUF_U16: kv->num.u = lms__get_u16(b); break;
    case LMS__GGUF_I16: kv->num.i = (int16_t)lms__get_u16(b); break;
    case LMS__GGUF_U32: kv->num.u = lms__get_u32(b); break;
    case LMS__GGUF_I32: kv->num.i = (int32_t)lms__get_u32(b); break;
    case LMS__GGUF_U64: kv->num.u = lms__get_u64(b); break;
    case LMS__GGUF_I64: kv->num.i = (int64_t)lms__get_u64(b); break;
    case LMS__GGUF_F32: {
        uint32_t u = lms__get_u32(b);
        float f;
        memcpy(&f, &u, 4);
        kv->num.f = f;
        break;
    }
    case LMS__GGUF_F64: {
        uint64_t u = lms__get_u64(b);
        memcpy(&kv->num.f, &u, 8);
        break;
    }
    case LMS__GGUF_BOOL:
        if (b[0] > 1)
            return lms__err(LMS_EFORMAT, "%s: %s: boolean value %u (must be 0 or 1)", c->path, what, b[0]);
        kv->num.u = b[0];
        break;
    }
    return 0;
}

static int rd_value(cur *c, lms__gguf_kv *kv, const char *what)
{
    int rc;
    if (kv->type >= LMS__GGUF_TYPE_COUNT_)
        return lms__err(LMS_EFORMAT, "%s: %s has unknown value type %u", c->path, what, kv->type);
    if (kv->type == LMS__GGUF_STRING)
        return rd_str(c, &kv->str, what);
    if (kv->type != LMS__GGUF_ARRAY)
        return rd_scalar(c, kv->type, kv, what);
    if ((rc = rd_u32(c, &kv->arr_type, what)) || (rc = rd_u64(c, &kv->arr_n, what)))
        return rc;
    if (kv->arr_type >= LMS__GGUF_TYPE_COUNT_)
        return lms__err(LMS_EFORMAT, "%s: %s: array of unknown element type %u", c->path, what, kv->arr_type);
    if (kv->arr_type == LMS__GGUF_ARRAY)
        return lms__err(LMS_EUNSUPPORTED, "%s: %s: arrays of arrays are not supported", c->path, what);
    if (kv->arr_type == LMS__GGUF_STRING) {
        /* each string takes at least its 8-byte length: bound the count
         * by the bytes the file can still hold before allocating */
        uint64_t least;
        if (lms__mul_overflow(kv->arr_n, 8, &least) || least > c->file_size - c->pos)
            return lms__err(LMS_EFORMAT, "%s: %s: %llu strings cannot fit in the %llu bytes left in the file",
                            c->path, what, (unsigned long long)kv->arr_n,
                            (unsigned long long)(c->file_size - c->pos));
        if ((rc = need(c, least, what)))
            return rc;
        kv->arr_str = lms__malloc((size_t)(kv->arr_n ? kv->arr_n : 1) * sizeof *kv->arr_str);
        if (!kv->arr_str)
            return LMS_ENOMEM;
        for (uint64_t i = 0; i < kv->arr_n; i++)
            if ((rc = rd_str(c, &kv->arr_str[i], what)))
                return rc;
        return 0;
    }
    uint64_t n;
    if (lms__mul_overflow(kv->arr_n, types[kv->arr_type].size, &n))
        return lms__err(LMS_EFORMAT, "%s: %s: array of %llu elements overflows 64 bits", c->path, what,
                        (unsigned long long)kv->arr_n);
    if ((rc = need(c, n, what)))
        return rc;
    kv->arr = c->p + c->pos;
    c->pos += (size_t)n;
    if (kv->arr_type == LMS__GGUF_BOOL)
        for (uint64_t i = 0; i < kv->arr_n; i++)
            if (kv->arr[i] > 1)
                return lms__err(LMS_EFORMAT, "%s: %s: element %llu is a boolean %u (must be 0 or 1)", c->path,
                                what, (unsigned long long)i, kv->arr[i]);
    return 0;
}

/* ---- the header ------------------------------------------------------------------------------ */

void lms__gguf_clear(lms__gguf *g)
{
    if (!g)
        return;
    for (size_t i = 0; i < g->n_kv; i++) {
        lms__free(g->kv[i].key);
        lms__free(g->kv[i].arr_str);
    }
    lms__free(g->kv);
    for (size_t i = 0; i < g->n_t; i++)
        lms__free(g->t[i].name);
    lms__free(g->t);
    lms__free(g->buf);
    lms__free(g->path);
    memset(g, 0, sizeof *g);
}

/* Room for one more element of esz bytes in *v (n used, *cap allocated). */
static int grow(void **v, size_t n, size_t *cap, size_t esz)
{
    if (n < *cap)
        return 0;
    size_t nc = *cap ? *cap * 2 : 64;
    void *nv = lms__realloc(*v, nc * esz);
    if (!nv)
        return LMS_ENOMEM;
    *v = nv;
    *cap = nc;
    return 0;
}

static int cmp_key(const void *a, const void *b)
{
    return strcmp(((const lms__gguf_kv *)a)->key, ((const lms__gguf_kv *)b)->key);
}

static int cmp_tname(const void *a, const void *b)
{
    return strcmp((*(const lms__gguf_tensor *const *)a)->name, (*(const lms__gguf_tensor *const *)b)->name);
}

static int cmp_toff(const void *a, const void *b)
{
    const lms__gguf_tensor *x = *(const lms__gguf_tensor *const *)a, *y = *(const lms__gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int parse_tensor(cur *c, lms__gguf_tensor *t, size_t idx)
{
    char what[96];
    snprintf(what, sizeof what, "tensor info %zu", idx);
    lms__gguf_str nm;
    int rc = rd_str(c, &nm, what);
    if (rc)
        return rc;
    if (!name_ok(&nm, 300)) {
        char pn[80];
        printable(nm.p, (size_t)LMS_MIN(nm.n, 60), pn, sizeof pn);
        return lms__err(LMS_EFORMAT, "%s: tensor %zu has an empty, overlong (> 300 bytes) or non-UTF-8 name '%s'",
                        c->path, idx, pn);
    }
    if (!(t->name = lms__strndup(nm.p, (size_t)nm.n)))
        return LMS_ENOMEM;
    snprintf(what, sizeof what, "tensor info of '%.60s'", t->name);
    if ((rc = rd_u32(c, &t->n_dims, what)))
        return rc;
    if (t->n_dims == 0 || t->n_dims > LMS__GGUF_MAX_DIMS)
        return lms__err(LMS_EFORMAT, "%s: tensor '%s' has %u dimensions (1 to 4 are allowed)", c->path, t->name,
                        t->n_dims);
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if ((rc = rd_u64(c, &t->ne[d], what)))
            return rc;
        if (t->ne[d] > INT64_MAX || lms__mul_overflow(n, t->ne[d], &n) || n > INT64_MAX)
            return lms__err(LMS_EFORMAT, "%s: tensor '%s': element count overflows 63 bits", c->path, t->name);
    }
    if ((rc = rd_u32(c, &t->ggml_type, what)) || (rc = rd_u64(c, &t->offset, what)))
        return rc;
    if (!lms__dtype_from_ggml(t->ggml_type, &t->dtype)) {
        const char *tn = lms__ggml_type_name(t->ggml_type);
        if (!strcmp(tn, "?"))
            return lms__err(LMS_EFORMAT, "%s: tensor '%s' has unknown type %u", c->path, t->name, t->ggml_type);
        return lms__err(LMS_EUNSUPPORTED,
                        "%s: tensor '%s' is %s, which lmstore does not store (F32, F16, BF16, Q4_0, Q4_1, Q5_0, "
                        "Q5_1, Q8_0, Q2_K..Q6_K are)",
                        c->path, t->name, tn);
    }
    uint64_t shape[LMS__GGUF_MAX_DIMS];
    for (uint32_t d = 0; d < t->n_dims; d++)
        shape[d] = t->ne[t->n_dims - 1 - d];
    if ((rc = lms_dtype_nbytes(t->dtype, 0, shape, t->n_dims, &t->nbytes)))
        return lms__err(LMS_EFORMAT, "%s: tensor '%s' (%s): %s", c->path, t->name, lms_dtype_name(t->dtype),
                        lms_last_error());
    return 0;
}

int lms__gguf_parse(const char *path, const void *buf, size_t len, uint64_t file_size, lms__gguf *g)
{
    memset(g, 0, sizeof *g);
    cur c = {.p = buf, .len = len, .file_size = file_size, .path = path};
    lms__gguf_tensor **byname = NULL;
    size_t cap = 0;
    int rc = 0;
    if (len > file_size) {
        c.len = len = (size_t)file_size;
    }
    if (!(g->path = lms__strdup(path)))
        return LMS_ENOMEM;
    g->file_size = file_size;
    uint32_t magic, version;
    uint64_t n_t, n_kv;
    if ((rc = rd_u32(&c, &magic, "magic")))
        goto out;
    if (magic != LMS__GGUF_MAGIC) {
        rc = lms__err(LMS_EFORMAT, "%s: not a GGUF file (no \"GGUF\" magic)", path);
        goto out;
    }
    if ((rc = rd_u32(&c, &version, "version")))
        goto out;
    if (version == 0x02000000u || version == 0x03000000u) {
        rc = lms__err(LMS_EUNSUPPORTED, "%s: big-endian GGUF files are not supported", path);
        goto out;
    }
    if (version != 2 && version != 3) {
        rc = lms__err(LMS_EUNSUPPORTED, "%s: GGUF version %u is not supported (2 and 3 are)", path, version);
        goto out;
    }
    g->version = version;
    if ((rc = rd_u64(&c, &n_t, "tensor count")) || (rc = rd_u64(&c, &n_kv, "metadata count")))
        goto out;
    if (n_t > MAX_ENTRIES || n_kv > MAX_ENTRIES) {
        rc = lms__err(LMS_EFORMAT, "%s: claims %llu tensors and %llu metadata entries (at most %u each)", path,
                      (unsigned long long)n_t, (unsigned long long)n_kv, MAX_ENTRIES);
        goto out;
    }
    /* metadata: arrays grow with what is parsed, never by the claimed count */
    for (uint64_t i = 0; i < n_kv; i++) {
        if ((rc = grow((void **)&g->kv, g->n_kv, &cap, sizeof *g->kv)))
            goto out;
        lms__gguf_kv *kv = &g->kv[g->n_kv];
        memset(kv, 0, sizeof *kv);
        g->n_kv++;
        char what[128];
        snprintf(what, sizeof what, "metadata entry %llu", (unsigned long long)i);
        lms__gguf_str k;
        if ((rc = rd_str(&c, &k, what)))
            goto out;
        if (!name_ok(&k, KEY_MAX)) {
            char pk[80];
            printable(k.p, (size_t)LMS_MIN(k.n, 60), pk, sizeof pk);
            rc = lms__err(LMS_EFORMAT, "%s: metadata entry %llu has an empty or non-UTF-8 key '%s'", path,
                          (unsigned long long)i, pk);
            goto out;
        }
        if (!(kv->key = lms__strndup(k.p, (size_t)k.n))) {
            rc = LMS_ENOMEM;
            goto out;
        }
        snprintf(what, sizeof what, "metadata '%.100s'", kv->key);
        if ((rc = rd_u32(&c, &kv->type, what)) || (rc = rd_value(&c, kv, what)))
            goto out;
    }
    if (g->n_kv > 1) {
        lms__gguf_kv *sorted = lms__malloc(g->n_kv * sizeof *sorted);
        if (!sorted) {
            rc = LMS_ENOMEM;
            goto out;
        }
        memcpy(sorted, g->kv, g->n_kv * sizeof *sorted);
        qsort(sorted, g->n_kv, sizeof *sorted, cmp_key);
        for (size_t i = 1; i < g->n_kv; i++)
            if (!strcmp(sorted[i - 1].key, sorted[i].key)) {
                rc = lms__err(LMS_EFORMAT, "%s: metadata key '%s' appears twice", path, sorted[i].key);
                break;
            }
        lms__free(sorted);
        if (rc)
            goto out;
    }
    g->alignment = 32;
    const lms__gguf_kv *al = lms__gguf_find(g, "general.alignment");
    if (al) {
        if (al->type != LMS__GGUF_U32 || al->num.u == 0 || (al->num.u & (al->num.u - 1))) {
            rc = lms__err(LMS_EFORMAT, "%s: general.alignment must be a u32 power of two", path);
            goto out;
        }
        g->alignment = (uint32_t)al->num.u;
    }
    /* tensor infos */
    cap = 0;
    for (uint64_t i = 0; i < n_t; i++) {
        if ((rc = grow((void **)&g->t, g->n_t, &cap, sizeof *g->t)))
            goto out;
        lms__gguf_tensor *t = &g->t[g->n_t];
        memset(t, 0, sizeof *t);
        g->n_t++;
        if ((rc = parse_tensor(&c, t, (size_t)i)))
            goto out;
    }
    g->data_off = lms__align_up(c.pos, g->alignment);
    if (g->data_off < c.pos || g->data_off > file_size) {
        rc = lms__err(LMS_EFORMAT, "%s: the data section (at byte %llu after alignment to %u) starts past the end "
                      "of the file (%llu bytes)",
                      path, (unsigned long long)g->data_off, g->alignment, (unsigned long long)file_size);
        goto out;
    }
    /* names unique; offsets aligned, in the file, not overlapping */
    if (g->n_t) {
        byname = lms__malloc(g->n_t * sizeof *byname);
        if (!byname) {
            rc = LMS_ENOMEM;
            goto out;
        }
        for (size_t i = 0; i < g->n_t; i++)
            byname[i] = &g->t[i];
        qsort(byname, g->n_t, sizeof *byname, cmp_tname);
        for (size_t i = 1; i < g->n_t; i++)
            if (!strcmp(byname[i - 1]->name, byname[i]->name)) {
                rc = lms__err(LMS_EFORMAT, "%s: tensor name '%s' appears twice", path, byname[i]->name);
                goto out;
            }
        uint64_t data_size = file_size - g->data_off;
        for (size_t i = 0; i < g->n_t; i++) {
            const lms__gguf_tensor *t = &g->t[i];
            uint64_t end;
            if (t->offset % g->alignment) {
                rc = lms__err(LMS_EFORMAT, "%s: tensor '%s' starts at data offset %llu, not a multiple of the "
                              "alignment %u",
                              path, t->name, (unsigned long long)t->offset, g->alignment);
                goto out;
            }
            if (lms__add_overflow(t->offset, t->nbytes, &end) || end > data_size) {
                rc = lms__err(LMS_EFORMAT, "%s: tensor '%s' (%llu bytes at data offset %llu) ends past the end of "
                              "the file (data section %llu bytes): truncated or corrupt",
                              path, t->name, (unsigned long long)t->nbytes, (unsigned long long)t->offset,
                              (unsigned long long)data_size);
                goto out;
            }
        }
        qsort(byname, g->n_t, sizeof *byname, cmp_toff);
        for (size_t i = 1; i < g->n_t; i++)
            if (byname[i - 1]->offset + byname[i - 1]->nbytes > byname[i]->offset) {
                rc = lms__err(LMS_EFORMAT, "%s: tensors '%s' and '%s' overlap in the data section", path,
                              byname[i - 1]->name, byname[i]->name);
                goto out;
            }
    }
out:
    lms__free(byname);
    if (rc == 1 || (rc && c.more)) {
        lms__gguf_clear(g);
        return 1;
    }
    if (rc) {
        lms__gguf_clear(g);
        return rc;
    }
    /* the header bytes everything points into stay with g */
    if (!(g->buf = lms__malloc(c.pos ? c.pos : 1))) {
        lms__gguf_clear(g);
        return LMS_ENOMEM;
    }
    memcpy(g->buf, buf, c.pos);
    g->buf_len = c.pos;
    /* repoint into the copy */
    const uint8_t *old = buf;
    for (size_t i = 0; i < g->n_kv; i++) {
        lms__gguf_kv *kv = &g->kv[i];
        if (kv->str.p)
            kv->str.p = (const char *)g->buf + ((const uint8_t *)kv->str.p - old);
        if (kv->arr)
            kv->arr = g->buf + (kv->arr - old);
        for (uint64_t j = 0; kv->arr_str && j < kv->arr_n; j++)
            kv->arr_str[j].p = (const char *)g->buf + ((const uint8_t *)kv->arr_str[j].p - old);
    }
    return 0;
}

int lms__gguf_open(const char *path, lms__gguf *g)
{
    memset(g, 0, sizeof *g);
    int fd = lms__open_regular(path), rc;
    if (fd < 0)
        return fd;
    uint64_t size;
    uint8_t *buf = NULL;
    if ((rc = lms__fstat_size(fd, &size, path)))
        goto out;
    for (uint64_t want = LMS_MIN(size, 8ull << 20);; want = LMS_MIN(size, LMS_MIN(want * 4, LMS__GGUF_HEADER_CAP))) {
        lms__free(buf);
        if (!(buf = lms__malloc(want ? (size_t)want : 1))) {
            rc = LMS_ENOMEM;
            goto out;
        }
        if ((rc = lms__pread_all(fd, buf, (size_t)want, 0, path)))
            goto out;
        rc = lms__gguf_parse(path, buf, (size_t)want, size, g);
        if (rc != 1)
            break;
        if (want >= LMS__GGUF_HEADER_CAP || want >= size) {
            rc = lms__err(LMS_EFORMAT, "%s: metadata and tensor infos are larger than %llu MiB", path,
                          LMS__GGUF_HEADER_CAP >> 20);
            break;
        }
    }
out:
    lms__free(buf);
    close(fd);
    return rc;
}

static bool has_suffix(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

bool lms__gguf_is_source(const char *path)
{
    if (!lms__is_dir(path)) {
        if (has_suffix(path, ".gguf"))
            return true;
        int fd = lms__open_regular(path); /* a FIFO is refused by the reader that opens it next */
        uint8_t b[4];
        bool yes = fd >= 0 && pread(fd, b, 4, 0) == 4 && lms__get_u32(b) == LMS__GGUF_MAGIC;
        if (fd >= 0)
            close(fd);
        lms_clear_error();
        return yes;
    }
    DIR *d = opendir(path);
    if (!d)
        return false;
    bool gguf = false, st = false;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        gguf |= has_suffix(e->d_name, ".gguf");
        st |= has_suffix(e->d_name, ".safetensors");
    }
    closedir(d);
    return gguf && !st;
}

/* ---- metadata access --------------------------------------------------------------------------- */

const lms__gguf_kv *lms__gguf_find(const lms__gguf *g, const char *key)
{
    for (size_t i = 0; i < g->n_kv; i++)
        if (!strcmp(g->kv[i].key, key))
            return &g->kv[i];
    return NULL;
}

static int absent(const lms__gguf *g, const char *key, bool required)
{
    if (required)
        return lms__err(LMS_EFORMAT, "%s: metadata '%s' is missing", g->path, key);
    return LMS_ENOENT;
}

int lms__gguf_get_u64(const lms__gguf *g, const char *key, bool required, uint64_t max, uint64_t *out)
{
    const lms__gguf_kv *kv = lms__gguf_find(g, key);
    if (!kv)
        return absent(g, key, required);
    bool is_signed = kv->type == LMS__GGUF_I8 || kv->type == LMS__GGUF_I16 || kv->type == LMS__GGUF_I32 ||
                     kv->type == LMS__GGUF_I64;
    bool is_unsigned = kv->type == LMS__GGUF_U8 || kv->type == LMS__GGUF_U16 || kv->type == LMS__GGUF_U32 ||
                       kv->type == LMS__GGUF_U64 || kv->type == LMS__GGUF_BOOL;
    if (!is_signed && !is_unsigned)
        return lms__err(LMS_EFORMAT, "%s: metadata '%s' is a %s, expected an integer", g->path, key,
                        lms__gguf_type_name(kv->type));
    if ((is_signed && (kv->num.i < 0 || (uint64_t)kv->num.i > max)) || (is_unsigned && kv->num.u > max))
        return lms__err(LMS_EFORMAT, "%s: metadata '%s' = %lld is out of range (0 to %llu)", g->path, key,
                        is_signed ? (long long)kv->num.i : (long long)kv->num.u, (unsigned long long)max);
    *out = is_signed ? (uint64_t)kv->num.i : kv->num.u;
    return 0;
}

int lms__gguf_get_f64(const lms__gguf *g, const char *key, bool required, double *out)
{
    const lms__gguf_kv *kv = lms__gguf_find(g, key);
    if (!kv)
        return absent(g, key, required);
    if (kv->type == LMS__GGUF_F32 || kv->type == LMS__GGUF_F64)
        *out = kv->num.f;
    else if (lms__gguf_type_numeric(kv->type))
        *out = kv->type == LMS__GGUF_I8 || kv->type == LMS__GGUF_I16 || kv->type == LMS__GGUF_I32 ||
                       kv->type == LMS__GGUF_I64
                   ? (double)kv->num.i
                   : (double)kv->num.u;
    else
        return lms__err(LMS_EFORMAT, "%s: metadata '%s' is a %s, expected a number", g->path, key,
                        lms__gguf_type_name(kv->type));
    if (!isfinite(*out))
        return lms__err(LMS_EFORMAT, "%s: metadata '%s' is not finite", g->path, key);
    return 0;
}

int lms__gguf_get_bool(const lms__gguf *g, const char *key, bool required, bool *out)
{
    const lms__gguf_kv *kv = lms__gguf_find(g, key);
    if (!kv)
        return absent(g, key, required);
    if (kv->type != LMS__GGUF_BOOL)
        return lms__err(LMS_EFORMAT, "%s: metadata '%s' is a %s, expected a bool", g->path, key,
                        lms__gguf_type_name(kv->type));
    *out = kv->num.u != 0;
    return 0;
}

int lms__gguf_get_str(const lms__gguf *g, const char *key, bool required, lms__gguf_str *out)
{
    const lms__gguf_kv *kv = lms__gguf_find(g, key);
    if (!kv)
        return absent(g, key, required);
    if (kv->type != LMS__GGUF_STRING)
        return lms__err(LMS_EFORMAT, "%s: metadata '%s' is a %s, expected a string", g->path, key,
                        lms__gguf_type_name(kv->type));
    if (memchr(kv->str.p, '\0', (size_t)kv->str.n) || !lms__utf8_valid(kv->str.p, (size_t)kv->str.n))
        return lms__err(LMS_EFORMAT, "%s: metadata '%s' is not valid UTF-8 text", g->path, key);
    *out = kv->str;
    return 0;
}

int64_t lms__gguf_arr_i64(const lms__gguf_kv *kv, uint64_t i)
{
    const uint8_t *p = kv->arr + i * types[kv->arr_type].size;
    switch (kv->arr_type) {
    case LMS__GGUF_U8: case LMS__GGUF_BOOL: return p[0];
    case LMS__GGUF_I8: return (int8_t)p[0];
    case LMS__GGUF_U16: return lms__get_u16(p);
    case LMS__GGUF_I16: return (int16_t)lms__get_u16(p);
    case LMS__GGUF_U32: return lms__get_u32(p);
    case LMS__GGUF_I32: return (int32_t)lms__get_u32(p);
    case LMS__GGUF_U64: return (int64_t)LMS_MIN(lms__get_u64(p), (uint64_t)INT64_MAX);
    case LMS__GGUF_I64: return (int64_t)lms__get_u64(p);
    default: return (int64_t)lms__gguf_arr_f64(kv, i);
    }
}

double lms__gguf_arr_f64(const lms__gguf_kv *kv, uint64_t i)
{
    const uint8_t *p = kv->arr + i * types[kv->arr_type].size;
    if (kv->arr_type == LMS__GGUF_F32) {
        uint32_t u = lms__get_u32(p);
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    if (kv->arr_type == LMS__GGUF_F64) {
        uint64_t u = lms__get_u64(p);
        double d;
        memcpy(&d, &u, 8);
        return d;
    }
    return (double)lms__gguf_arr_i64(kv, i);
}
