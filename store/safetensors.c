/*
 * store/safetensors.c - strict, overflow-safe safetensors header parser and
 * the HuggingFace folder reader (shards + model.safetensors.index.json).
 *
 * The file layout (safetensors): u64 little-endian N, then N bytes of JSON
 * {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [b, e]}, ...,
 *  "__metadata__": {"k": "v"}}, then the data region; offsets are relative
 * to the data region. We additionally require the tensors to tile the data
 * region exactly (no overlaps, no holes, nothing after the last tensor), as
 * the safetensors writer produces, so that every byte of the file is
 * accounted for.
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "store/safetensors.h"

#define MAX_SAFE_INT 9007199254740992.0 /* 2^53: larger JSON numbers lose precision */

/* A printable copy of a possibly invalid name for messages (\xNN escapes). */
static void printable(const char *s, char *out, size_t cap)
{
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p && o + 5 < cap; p++) {
        if (*p < 0x20 || *p >= 0x7f)
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", *p);
        else
            out[o++] = (char)*p;
    }
    out[o] = '\0';
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

void lms__st_file_clear(lms__st_file *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->n_tensors; i++)
        lms__free(f->tensors[i].name);
    lms__free(f->tensors);
    lms__free(f->metadata);
    lms__free(f->path);
    memset(f, 0, sizeof *f);
}

void lms__st_free(lms__st_file *f)
{
    lms__st_file_clear(f);
    lms__free(f);
}

/* A JSON number that is a non-negative integer below 2^53. */
static int get_uint(const cJSON *v, uint64_t *out, const char **why)
{
    if (!cJSON_IsNumber(v)) {
        *why = "is not a number";
        return -1;
    }
    double d = v->valuedouble;
    if (d < 0) {
        *why = "is negative";
        return -1;
    }
    if (d != floor(d) || !isfinite(d)) {
        *why = "is not an integer";
        return -1;
    }
    if (d >= MAX_SAFE_INT) {
        *why = "is too large (2^53 or more)";
        return -1;
    }
    *out = (uint64_t)d;
    return 0;
}

static int cmp_begin(const void *a, const void *b)
{
    const lms__st_tensor *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int cmp_strp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int parse_tensor(const char *path, const cJSON *e, lms__st_tensor *t, uint64_t data_size)
{
    const char *nm = t->name;
    if (!cJSON_IsObject(e))
        return lms__err(LMS_EFORMAT, "%s: tensor '%s': entry is not a JSON object", path, nm);
    const cJSON *dtype = NULL, *shape = NULL, *offs = NULL;
    for (const cJSON *c = e->child; c; c = c->next) {
        const cJSON **slot = !strcmp(c->string, "dtype")          ? &dtype
                             : !strcmp(c->string, "shape")        ? &shape
                             : !strcmp(c->string, "data_offsets") ? &offs
                                                                  : NULL;
        if (!slot)
            return lms__err(LMS_EFORMAT, "%s: tensor '%s': unknown field '%s'", path, nm, c->string);
        if (*slot)
            return lms__err(LMS_EFORMAT, "%s: tensor '%s': field '%s' appears twice", path, nm, c->string);
        *slot = c;
    }
    if (!cJSON_IsString(dtype))
        return lms__err(LMS_EFORMAT, "%s: tensor '%s': \"dtype\" is missing or not a string", path, nm);
    if (lms_dtype_from_name(dtype->valuestring, &t->dtype) || lms_dtype_is_quantized(t->dtype)) {
        char pd[64];
        printable(dtype->valuestring, pd, sizeof pd);
        return lms__err(LMS_EFORMAT, "%s: tensor '%s': unknown dtype '%s'", path, nm, pd);
    }
    if (!cJSON_IsArray(shape))
        return lms__err(LMS_EFORMAT, "%s: tensor '%s': \"shape\" is missing or not an array", path, nm);
    int nd = cJSON_GetArraySize(shape);
    if (nd > LMS_MAX_DIMS)
        return lms__err(LMS_EFORMAT, "%s: tensor '%s': %d dimensions, at most %d are supported", path, nm, nd,
                        LMS_MAX_DIMS);
    t->ndim = (uint32_t)nd;
    uint64_t n = 1;
    int i = 0;
    const char *why;
    for (const cJSON *d = shape->child; d; d = d->next, i++) {
        if (get_uint(d, &t->shape[i], &why))
            return lms__err(LMS_EFORMAT, "%s: tensor '%s': shape entry %d %s", path, nm, i, why);
    }
    bool overflow = false;
    for (i = 0; i < nd; i++)
        overflow |= lms__mul_overflow(n, t->shape[i], &n);
    if (overflow)
        return lms__err(LMS_EFORMAT, "%s: tensor '%s': shape product overflows 64 bits", path, nm);
    t->nelem = n;
    if (lms__mul_overflow(n, lms_dtype_size(t->dtype), &t->nbytes))
        return lms__err(LMS_EFORMAT, "%s: tensor '%s': byte size (%llu elements of %s) overflows 64 bits", path,
                        nm, (unsigned long long)n, lms_dtype_name(t->dtype));
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
        return lms__err(LMS_EFORMAT, "%s: tensor '%s': \"data_offsets\" is missing or not an array of 2", path,
                        nm);
    if (get_uint(offs->child, &t->begin, &why) || get_uint(offs->child->next, &t->end, &why))
        return lms__err(LMS_EFORMAT, "%s: tensor '%s': data_offsets entry %s", path, nm, why);
    if (t->begin > t->end)
        return lms__err(LMS_EFORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] are reversed", path, nm,
                        (unsigned long long)t->begin, (unsigned long long)t->end);
    if (t->end - t->begin != t->nbytes)
        return lms__err(LMS_EFORMAT,
                        "%s: tensor '%s': data_offsets span %llu bytes but shape and dtype give %llu "
                        "(%llu elements of %s)",
                        path, nm, (unsigned long long)(t->end - t->begin), (unsigned long long)t->nbytes,
                        (unsigned long long)n, lms_dtype_name(t->dtype));
    if (t->end > data_size)
        return lms__err(LMS_EFORMAT,
                        "%s: tensor '%s' ends at byte %llu past the end of the data region (%llu bytes): "
                        "out of range or truncated file",
                        path, nm, (unsigned long long)t->end, (unsigned long long)data_size);
    return 0;
}

cJSON *lms__json_parse_strict(const char *path, const char *what, const char *json, size_t len)
{
    const char *nul = memchr(json, '\0', len);
    if (nul) {
        lms__err(LMS_EFORMAT, "%s: %s contains a NUL byte (byte %zu)", path, what, (size_t)(nul - json));
        return NULL;
    }
    if (len >= 3 && !memcmp(json, "\xef\xbb\xbf", 3)) {
        lms__err(LMS_EFORMAT, "%s: %s begins with a UTF-8 byte-order mark, which JSON does not allow", path, what);
        return NULL;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, false);
    if (!root) {
        size_t at = end && end >= json && end <= json + len ? (size_t)(end - json) : 0;
        lms__err(LMS_EFORMAT, "%s: %s is not valid JSON (error near byte %zu of %zu)", path, what, at, len);
        return NULL;
    }
    for (const char *p = end; p < json + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            lms__err(LMS_EFORMAT, "%s: %s has data after its JSON value (byte %zu)", path, what, (size_t)(p - json));
            cJSON_Delete(root);
            return NULL;
        }
    return root;
}

int lms__st_parse_header(const char *path, const char *json, size_t len, uint64_t data_size, lms__st_file *out)
{
    memset(out, 0, sizeof *out);
    int rc = 0;
    for (size_t i = 0; i + 6 <= len; i++)
        if (json[i] == '\\' && !memcmp(json + i, "\\u0000", 6))
            return lms__err(LMS_EFORMAT, "%s: header contains an escaped NUL (\\u0000)", path);
    cJSON *root = lms__json_parse_strict(path, "header", json, len);
    if (!root)
        return LMS_EFORMAT;
    if (!cJSON_IsObject(root)) {
        rc = lms__err(LMS_EFORMAT, "%s: header is not a JSON object", path);
        goto out;
    }
    size_t n = 0;
    for (const cJSON *c = root->child; c; c = c->next)
        n++;
    out->tensors = lms__calloc(n ? n : 1, sizeof *out->tensors);
    if (!out->tensors) {
        rc = LMS_ENOMEM;
        goto out;
    }
    bool have_meta = false;
    for (const cJSON *c = root->child; c; c = c->next) {
        const char *nm = c->string;
        size_t nl = strlen(nm);
        if (!lms__utf8_valid(nm, nl)) {
            char pn[256];
            printable(nm, pn, sizeof pn);
            rc = lms__err(LMS_EFORMAT, "%s: tensor name '%s' is not valid UTF-8", path, pn);
            goto out;
        }
        if (!strcmp(nm, "__metadata__")) {
            if (have_meta) {
                rc = lms__err(LMS_EFORMAT, "%s: \"__metadata__\" appears twice", path);
                goto out;
            }
            have_meta = true;
            if (!cJSON_IsObject(c)) {
                rc = lms__err(LMS_EFORMAT, "%s: \"__metadata__\" is not a JSON object", path);
                goto out;
            }
            for (const cJSON *m = c->child; m; m = m->next)
                if (!cJSON_IsString(m)) {
                    rc = lms__err(LMS_EFORMAT, "%s: \"__metadata__\" value '%s' is not a string", path, m->string);
                    goto out;
                }
            char *txt = cJSON_PrintUnformatted(c);
            if (!txt) {
                rc = lms__err(LMS_ENOMEM, "%s: out of memory", path);
                goto out;
            }
            out->metadata = lms__strdup(txt);
            cJSON_free(txt);
            if (!out->metadata) {
                rc = LMS_ENOMEM;
                goto out;
            }
            continue;
        }
        if (nl == 0 || nl > LMS__ST_NAME_MAX) {
            rc = lms__err(LMS_EFORMAT, "%s: tensor name of %zu bytes (must be 1 to %d)", path, nl, LMS__ST_NAME_MAX);
            goto out;
        }
        lms__st_tensor *t = &out->tensors[out->n_tensors];
        if (!(t->name = lms__strdup(nm))) {
            rc = LMS_ENOMEM;
            goto out;
        }
        out->n_tensors++;
        if ((rc = parse_tensor(path, c, t, data_size)))
            goto out;
    }
    /* duplicate names (cJSON keeps both members of an object) */
    if (out->n_tensors > 1) {
        char **names = lms__malloc(out->n_tensors * sizeof *names);
        if (!names) {
            rc = LMS_ENOMEM;
            goto out;
        }
        for (size_t i = 0; i < out->n_tensors; i++)
            names[i] = out->tensors[i].name;
        qsort(names, out->n_tensors, sizeof *names, cmp_strp);
        for (size_t i = 1; i < out->n_tensors; i++)
            if (!strcmp(names[i - 1], names[i])) {
                rc = lms__err(LMS_EFORMAT, "%s: duplicate tensor name '%s'", path, names[i]);
                break;
            }
        lms__free(names);
        if (rc)
            goto out;
    }
    /* the tensors must tile the data region: no overlap, no hole */
    qsort(out->tensors, out->n_tensors, sizeof *out->tensors, cmp_begin);
    uint64_t pos = 0;
    const char *prev = NULL;
    for (size_t i = 0; i < out->n_tensors; i++) {
        lms__st_tensor *t = &out->tensors[i];
        if (t->begin < pos) {
            rc = lms__err(LMS_EFORMAT, "%s: tensor '%s' [%llu, %llu) overlaps tensor '%s' (which ends at %llu)",
                          path, t->name, (unsigned long long)t->begin, (unsigned long long)t->end, prev,
                          (unsigned long long)pos);
            goto out;
        }
        if (t->begin > pos) {
            rc = lms__err(LMS_EFORMAT, "%s: hole of %llu bytes before tensor '%s' (data_offsets start at %llu)",
                          path, (unsigned long long)(t->begin - pos), t->name, (unsigned long long)t->begin);
            goto out;
        }
        pos = t->end;
        prev = t->name;
    }
    if (pos != data_size) {
        rc = lms__err(LMS_EFORMAT, "%s: %llu bytes after the last tensor%s%s%s are not covered by any tensor (hole)",
                      path, (unsigned long long)(data_size - pos), prev ? " '" : "", prev ? prev : "",
                      prev ? "'" : "");
        goto out;
    }
out:
    cJSON_Delete(root);
    if (rc)
        lms__st_file_clear(out);
    return rc;
}

int lms__st_open(const char *path, lms__st_file **out)
{
    *out = NULL;
    lms__st_file *f = NULL;
    char *json = NULL;
    uint64_t size;
    uint8_t lenbuf[8];
    int fd = lms__open_regular(path), rc;
    if (fd < 0)
        return fd;
    if ((rc = lms__fstat_size(fd, &size, path)))
        goto out;
    if (size < 8) {
        rc = lms__err(LMS_EFORMAT, "%s: truncated file: %llu bytes, too short for the 8-byte header length", path,
                      (unsigned long long)size);
        goto out;
    }
    if ((rc = lms__pread_all(fd, lenbuf, 8, 0, path)))
        goto out;
    uint64_t n = lms__get_u64(lenbuf);
    if (n > LMS__ST_HEADER_CAP) {
        /* name what the file is when it is not safetensors at all */
        bool text = true;
        for (int i = 0; i < 8; i++)
            text = text && ((lenbuf[i] >= 0x20 && lenbuf[i] < 0x7f) || lenbuf[i] == '\n' || lenbuf[i] == '\t' ||
                            lenbuf[i] == '\r');
        if (!memcmp(lenbuf, "GGUF", 4))
            rc = lms__err(LMS_EUNSUPPORTED, "%s: a GGUF file; GGUF import is not supported yet (import the "
                          "model's HuggingFace folder of .safetensors files)", path);
        else if (text)
            rc = lms__err(LMS_EFORMAT, "%s: not a safetensors file (it begins with text, not with the 8-byte "
                          "length of a JSON header)", path);
        else
            rc = lms__err(LMS_EFORMAT, "%s: header length %llu exceeds the %llu-byte (100 MiB) cap", path,
                          (unsigned long long)n, (unsigned long long)LMS__ST_HEADER_CAP);
        goto out;
    }
    if (n > size - 8) {
        rc = lms__err(LMS_EFORMAT, "%s: header length %llu is larger than the file (%llu bytes): truncated file?",
                      path, (unsigned long long)n, (unsigned long long)size);
        goto out;
    }
    if (n < 2) {
        rc = lms__err(LMS_EFORMAT, "%s: header length %llu is too short for a JSON object", path,
                      (unsigned long long)n);
        goto out;
    }
    json = lms__malloc((size_t)n + 1);
    f = lms__calloc(1, sizeof *f);
    if (!json || !f) {
        rc = LMS_ENOMEM;
        goto out;
    }
    if ((rc = lms__pread_all(fd, json, (size_t)n, 8, path)))
        goto out;
    json[n] = '\0';
    if ((rc = lms__st_parse_header(path, json, (size_t)n, size - 8 - n, f)))
        goto out;
    if (!(f->path = lms__strdup(path))) {
        rc = LMS_ENOMEM;
        goto out;
    }
    f->file_size = size;
    f->header_len = n;
    f->data_off = 8 + n;
    f->data_size = size - 8 - n;
    *out = f;
    f = NULL;
out:
    lms__st_free(f);
    lms__free(json);
    close(fd);
    return rc;
}

/* ---- index json ------------------------------------------------------------------- */

typedef struct name_pair {
    char *name, *shard;
} name_pair;

static int cmp_pair(const void *a, const void *b) { return strcmp(((const name_pair *)a)->name, ((const name_pair *)b)->name); }

int lms__st_parse_index(const char *path, const char *json, size_t len, char ***names_out, char ***shards_out,
                        size_t *n_out)
{
    *names_out = *shards_out = NULL;
    *n_out = 0;
    int rc = 0;
    name_pair *v = NULL;
    size_t n = 0;
    cJSON *root = lms__json_parse_strict(path, "the index", json, len);
    if (!root)
        return LMS_EFORMAT;
    const cJSON *wm = NULL;
    if (!cJSON_IsObject(root)) {
        rc = lms__err(LMS_EFORMAT, "%s: not a JSON object", path);
        goto out;
    }
    for (const cJSON *c = root->child; c; c = c->next)
        if (!strcmp(c->string, "weight_map")) {
            if (wm) {
                rc = lms__err(LMS_EFORMAT, "%s: \"weight_map\" appears twice", path);
                goto out;
            }
            wm = c;
        }
    if (!cJSON_IsObject(wm)) {
        rc = lms__err(LMS_EFORMAT, "%s: \"weight_map\" is missing or not an object", path);
        goto out;
    }
    size_t cnt = 0;
    for (const cJSON *c = wm->child; c; c = c->next)
        cnt++;
    v = lms__calloc(cnt ? cnt : 1, sizeof *v);
    if (!v) {
        rc = LMS_ENOMEM;
        goto out;
    }
    for (const cJSON *c = wm->child; c; c = c->next) {
        if (!lms__utf8_valid(c->string, strlen(c->string))) {
            char pn[256];
            printable(c->string, pn, sizeof pn);
            rc = lms__err(LMS_EFORMAT, "%s: tensor name '%s' is not valid UTF-8", path, pn);
            goto out;
        }
        if (!cJSON_IsString(c)) {
            rc = lms__err(LMS_EFORMAT, "%s: tensor '%s': shard is not a string", path, c->string);
            goto out;
        }
        const char *sh = c->valuestring;
        if (!*sh || strchr(sh, '/') || !strcmp(sh, ".") || !strcmp(sh, "..") ||
            !lms__utf8_valid(sh, strlen(sh))) {
            char ps[256];
            printable(sh, ps, sizeof ps);
            rc = lms__err(LMS_EFORMAT, "%s: tensor '%s': shard '%s' is not a file name in the model folder", path,
                          c->string, ps);
            goto out;
        }
        v[n].name = lms__strdup(c->string);
        v[n].shard = lms__strdup(sh);
        n++;
        if (!v[n - 1].name || !v[n - 1].shard) {
            rc = LMS_ENOMEM;
            goto out;
        }
    }
    qsort(v, n, sizeof *v, cmp_pair);
    for (size_t i = 1; i < n; i++)
        if (!strcmp(v[i - 1].name, v[i].name)) {
            rc = lms__err(LMS_EFORMAT, "%s: duplicate tensor name '%s' in weight_map", path, v[i].name);
            goto out;
        }
    char **names = lms__calloc(n ? n : 1, sizeof *names), **shards = lms__calloc(n ? n : 1, sizeof *shards);
    if (!names || !shards) {
        lms__free(names);
        lms__free(shards);
        rc = LMS_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        names[i] = v[i].name;
        shards[i] = v[i].shard;
    }
    *names_out = names;
    *shards_out = shards;
    *n_out = n;
    lms__free(v);
    v = NULL;
    n = 0;
out:
    for (size_t i = 0; i < n; i++) {
        lms__free(v[i].name);
        lms__free(v[i].shard);
    }
    lms__free(v);
    cJSON_Delete(root);
    return rc;
}

/* ---- sources -------------------------------------------------------------------- */

void lms__st_source_free(lms__st_source *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n_shards; i++)
        lms__st_free(s->shards[i]);
    lms__free(s->shards);
    for (size_t i = 0; i < s->n_gen_files; i++) {
        lms__free(s->gen_files[i].name);
        lms__free(s->gen_files[i].data);
    }
    lms__free(s->gen_files);
    lms__free(s->index_path);
    lms__free(s->src);
    lms__free(s);
}

static bool ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

typedef struct where {
    const char *name;
    size_t shard;
} where;

static int cmp_where(const void *a, const void *b) { return strcmp(((const where *)a)->name, ((const where *)b)->name); }

static int list_shards(const char *dir, char ***out, size_t *n_out)
{
    DIR *d = opendir(dir);
    *out = NULL;
    *n_out = 0;
    if (!d)
        return lms__err_errno(errno == ENOENT ? LMS_ENOENT : LMS_EIO, errno, "%s", dir);
    char **v = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || !ends_with(e->d_name, ".safetensors"))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nv = lms__realloc(v, cap * sizeof *v);
            if (!nv) {
                rc = LMS_ENOMEM;
                break;
            }
            v = nv;
        }
        if (!(v[n] = lms__strdup(e->d_name))) {
            rc = LMS_ENOMEM;
            break;
        }
        n++;
    }
    closedir(d);
    if (rc) {
        for (size_t i = 0; i < n; i++)
            lms__free(v[i]);
        lms__free(v);
        return rc;
    }
    if (n)
        qsort(v, n, sizeof *v, cmp_strp);
    *out = v;
    *n_out = n;
    return 0;
}

/* Whether folder dir holds a *.gguf file (for the message when it has no safetensors). */
static bool has_gguf(const char *dir)
{
    DIR *d = opendir(dir);
    bool found = false;
    struct dirent *e;
    while (d && !found && (e = readdir(d)))
        found = e->d_name[0] != '.' && ends_with(e->d_name, ".gguf");
    if (d)
        closedir(d);
    return found;
}

int lms__st_source_open(const char *src, lms__st_source **out)
{
    *out = NULL;
    int rc = 0;
    char **files = NULL, **inames = NULL, **ishards = NULL, *ijson = NULL;
    size_t n_files = 0, n_index = 0;
    where *all = NULL;
    lms__st_source *s = lms__calloc(1, sizeof *s);
    if (!s || !(s->src = lms__strdup(src))) {
        rc = LMS_ENOMEM;
        goto out;
    }
    s->is_dir = lms__is_dir(src);
    s->kind = "safetensors";
    if (!s->is_dir) {
        if (!lms__path_exists(src)) {
            rc = lms__err(LMS_ENOENT, "%s: no such file or folder", src);
            goto out;
        }
        s->shards = lms__calloc(1, sizeof *s->shards);
        if (!s->shards) {
            rc = LMS_ENOMEM;
            goto out;
        }
        if ((rc = lms__st_open(src, &s->shards[0])))
            goto out;
        s->n_shards = 1;
        if (s->shards[0]->n_tensors == 0) {
            rc = lms__err(LMS_EFORMAT, "%s: holds no tensors", src);
            goto out;
        }
        *out = s;
        return 0;
    }

    char *ipath = lms__asprintf("%s/model.safetensors.index.json", src);
    if (!ipath) {
        rc = LMS_ENOMEM;
        goto out;
    }
    if (lms__path_exists(ipath)) {
        s->index_path = ipath;
        size_t ilen;
        if ((rc = lms__read_file(ipath, LMS__ST_HEADER_CAP, &ijson, &ilen)))
            goto out;
        if ((rc = lms__st_parse_index(ipath, ijson, ilen, &inames, &ishards, &n_index)))
            goto out;
        /* the shards are the distinct values of weight_map, sorted */
        char **v = lms__calloc(n_index ? n_index : 1, sizeof *v);
        if (!v) {
            rc = LMS_ENOMEM;
            goto out;
        }
        memcpy(v, ishards, n_index * sizeof *v);
        if (n_index)
            qsort(v, n_index, sizeof *v, cmp_strp);
        files = lms__calloc(n_index ? n_index : 1, sizeof *files);
        if (!files) {
            lms__free(v);
            rc = LMS_ENOMEM;
            goto out;
        }
        for (size_t i = 0; i < n_index; i++)
            if (i == 0 || strcmp(v[i], v[i - 1]) != 0) {
                if (!(files[n_files] = lms__strdup(v[i]))) {
                    lms__free(v);
                    rc = LMS_ENOMEM;
                    goto out;
                }
                n_files++;
            }
        lms__free(v);
        if (n_files == 0) {
            rc = lms__err(LMS_EFORMAT, "%s: weight_map lists no tensors", ipath);
            goto out;
        }
    } else {
        lms__free(ipath);
        if ((rc = list_shards(src, &files, &n_files)))
            goto out;
        if (n_files == 0) {
            if (has_gguf(src))
                rc = lms__err(LMS_EUNSUPPORTED, "%s: no .safetensors files in this folder, only GGUF; GGUF import "
                              "is not supported yet", src);
            else
                rc = lms__err(LMS_ENOENT, "%s: no .safetensors files in this folder", src);
            goto out;
        }
    }

    s->shards = lms__calloc(n_files, sizeof *s->shards);
    if (!s->shards) {
        rc = LMS_ENOMEM;
        goto out;
    }
    size_t total = 0;
    for (size_t i = 0; i < n_files; i++) {
        char *p = lms__asprintf("%s/%s", src, files[i]);
        if (!p) {
            rc = LMS_ENOMEM;
            goto out;
        }
        if (s->index_path && !lms__path_exists(p)) {
            rc = lms__err(LMS_EFORMAT, "%s: names shard '%s', which is missing from %s", s->index_path, files[i], src);
            lms__free(p);
            goto out;
        }
        rc = lms__st_open(p, &s->shards[i]);
        lms__free(p);
        if (rc)
            goto out;
        s->n_shards++;
        total += s->shards[i]->n_tensors;
    }

    /* duplicates across shards */
    all = lms__calloc(total ? total : 1, sizeof *all);
    if (!all) {
        rc = LMS_ENOMEM;
        goto out;
    }
    size_t k = 0;
    for (size_t i = 0; i < s->n_shards; i++)
        for (size_t j = 0; j < s->shards[i]->n_tensors; j++)
            all[k++] = (where){s->shards[i]->tensors[j].name, i};
    if (total)
        qsort(all, total, sizeof *all, cmp_where);
    for (size_t i = 1; i < total; i++)
        if (!strcmp(all[i - 1].name, all[i].name)) {
            rc = lms__err(LMS_EFORMAT, "%s: duplicate tensor name '%s' (also in %s)", s->shards[all[i].shard]->path,
                          all[i].name, s->shards[all[i - 1].shard]->path);
            goto out;
        }

    if (s->index_path) {
        /* both lists are sorted by name: walk them together */
        size_t a = 0, b = 0;
        while (a < n_index || b < total) {
            int c = a == n_index ? 1 : b == total ? -1 : strcmp(inames[a], all[b].name);
            if (c < 0) {
                rc = lms__err(LMS_EFORMAT, "%s: lists tensor '%s' in shard '%s', which does not contain it",
                              s->index_path, inames[a], ishards[a]);
                goto out;
            }
            if (c > 0) {
                rc = lms__err(LMS_EFORMAT, "%s: holds tensor '%s', which the index %s does not list",
                              s->shards[all[b].shard]->path, all[b].name, s->index_path);
                goto out;
            }
            const char *actual = base_name(s->shards[all[b].shard]->path);
            if (strcmp(actual, ishards[a]) != 0) {
                rc = lms__err(LMS_EFORMAT, "%s: holds tensor '%s', which the index %s lists in shard '%s'",
                              s->shards[all[b].shard]->path, all[b].name, s->index_path, ishards[a]);
                goto out;
            }
            a++;
            b++;
        }
    }
    if (total == 0) {
        rc = lms__err(LMS_EFORMAT, "%s: holds no tensors", src);
        goto out;
    }
    *out = s;
    s = NULL;
out:
    lms__free(all);
    for (size_t i = 0; i < n_files; i++)
        lms__free(files[i]);
    lms__free(files);
    for (size_t i = 0; i < n_index; i++) {
        lms__free(inames[i]);
        lms__free(ishards[i]);
    }
    lms__free(inames);
    lms__free(ishards);
    lms__free(ijson);
    lms__st_source_free(s);
    return rc;
}
