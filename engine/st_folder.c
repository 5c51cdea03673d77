/*
 * engine/st_folder.c - a weight source over a HuggingFace folder
 * (*.safetensors + config.json), mapped read-only. The engine's own path is
 * the loader (lms_model from the store); this source serves tools and
 * benchmarks that run a folder directly and the forward-pass tests that
 * must not depend on the store. Headers are untrusted: sizes, offsets and
 * shapes are checked before use.
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine/internal.h"

typedef struct st_tensor {
    char *name;
    lms_dtype dt;
    uint32_t ndim;
    uint64_t shape[LMS_MAX_DIMS];
    const void *data;
    uint64_t nbytes;
} st_tensor;

struct lms__st_folder {
    char *dir;
    void *maps[64];
    size_t map_len[64];
    int n_maps;
    st_tensor *t;
    size_t n, cap;
};

static int add_file(lms__st_folder *f, const char *path)
{
    int rc = 0, fd = lms__open(path, O_RDONLY, 0);
    uint64_t size;
    cJSON *hdr = NULL;
    char *htxt = NULL;
    if (fd < 0)
        return fd;
    if ((rc = lms__fstat_size(fd, &size, path)))
        goto out;
    if (size < 8) {
        rc = lms__err(LMS_EFORMAT, "%s: too short for a safetensors file", path);
        goto out;
    }
    if (f->n_maps == (int)LMS_ARRAY_LEN(f->maps)) {
        rc = lms__err(LMS_EUNSUPPORTED, "%s: more than %d shards", f->dir, f->n_maps);
        goto out;
    }
    void *m = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        rc = lms__err_errno(LMS_EIO, errno, "%s: mmap", path);
        goto out;
    }
    f->maps[f->n_maps] = m;
    f->map_len[f->n_maps++] = size;
    uint64_t hlen = lms__get_u64(m);
    if (hlen > 100u << 20 || hlen > size - 8) {
        rc = lms__err(LMS_EFORMAT, "%s: header length %llu does not fit the file", path, (unsigned long long)hlen);
        goto out;
    }
    htxt = lms__strndup((const char *)m + 8, hlen);
    if (!htxt) {
        rc = LMS_ENOMEM;
        goto out;
    }
    hdr = cJSON_Parse(htxt);
    if (!hdr || !cJSON_IsObject(hdr)) {
        rc = lms__err(LMS_EFORMAT, "%s: header is not a JSON object", path);
        goto out;
    }
    const uint8_t *base = (const uint8_t *)m + 8 + hlen;
    uint64_t dlen = size - 8 - hlen;
    cJSON *it;
    cJSON_ArrayForEach(it, hdr)
    {
        if (!strcmp(it->string, "__metadata__"))
            continue;
        st_tensor t = {0};
        cJSON *dt = cJSON_GetObjectItem(it, "dtype"), *sh = cJSON_GetObjectItem(it, "shape"),
              *off = cJSON_GetObjectItem(it, "data_offsets");
        if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 ||
            cJSON_GetArraySize(sh) > LMS_MAX_DIMS || lms_dtype_from_name(dt->valuestring, &t.dt)) {
            rc = lms__err(LMS_EFORMAT, "%s: tensor '%s': malformed header entry", path, it->string);
            goto out;
        }
        uint64_t n = 1, b0, b1;
        cJSON *d;
        cJSON_ArrayForEach(d, sh)
        {
            if (!cJSON_IsNumber(d) || d->valuedouble < 0 || d->valuedouble > 1e15 ||
                lms__mul_overflow(n, (uint64_t)d->valuedouble, &n)) {
                rc = lms__err(LMS_EFORMAT, "%s: tensor '%s': bad shape", path, it->string);
                goto out;
            }
            t.shape[t.ndim++] = (uint64_t)d->valuedouble;
        }
        b0 = (uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble;
        b1 = (uint64_t)cJSON_GetArrayItem(off, 1)->valuedouble;
        if (b1 < b0 || b1 > dlen || lms__mul_overflow(n, lms_dtype_size(t.dt), &n) || n != b1 - b0) {
            rc = lms__err(LMS_EFORMAT, "%s: tensor '%s': offsets [%llu, %llu) do not match its shape or the file",
                          path, it->string, (unsigned long long)b0, (unsigned long long)b1);
            goto out;
        }
        t.data = base + b0;
        t.nbytes = n;
        if (f->n == f->cap) {
            size_t nc = f->cap ? 2 * f->cap : 256;
            st_tensor *nt = lms__realloc(f->t, nc * sizeof *nt);
            if (!nt) {
                rc = LMS_ENOMEM;
                goto out;
            }
            f->t = nt;
            f->cap = nc;
        }
        if (!(t.name = lms__strdup(it->string))) {
            rc = LMS_ENOMEM;
            goto out;
        }
        f->t[f->n++] = t;
    }
out:
    cJSON_Delete(hdr);
    lms__free(htxt);
    lms__close(fd);
    return rc;
}

static int st_tensor_fn(void *ctx, const char *name, lms_dtype *dt, uint32_t *ndim, uint64_t shape[LMS_MAX_DIMS],
                        const void **data, uint64_t *nbytes)
{
    lms__st_folder *f = ctx;
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->t[i].name, name)) {
            *dt = f->t[i].dt;
            *ndim = f->t[i].ndim;
            memcpy(shape, f->t[i].shape, sizeof f->t[i].shape);
            *data = f->t[i].data;
            *nbytes = f->t[i].nbytes;
            return 0;
        }
    return LMS_ENOENT;
}

static int st_file_fn(void *ctx, const char *name, char **data, size_t *len)
{
    lms__st_folder *f = ctx;
    char *p = lms__asprintf("%s/%s", f->dir, name);
    if (!p)
        return LMS_ENOMEM;
    if (!lms__path_exists(p)) {
        lms__free(p);
        return LMS_ENOENT;
    }
    int rc = lms__read_file(p, 64u << 20, data, len);
    lms__free(p);
    return rc;
}

static int cmpstr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int lms__st_folder_open(const char *dir, lms__st_folder **out, lms__wsrc *src)
{
    int rc = 0;
    char *names[64];
    int nn = 0;
    lms__st_folder *f = lms__calloc(1, sizeof *f);
    *out = NULL;
    if (!f || !(f->dir = lms__strdup(dir))) {
        lms__free(f);
        return LMS_ENOMEM;
    }
    DIR *d = opendir(dir);
    if (!d) {
        rc = lms__err_errno(LMS_ENOENT, errno, "%s", dir);
        goto fail;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l > 12 && !strcmp(e->d_name + l - 12, ".safetensors") && nn < 64)
            names[nn++] = lms__asprintf("%s/%s", dir, e->d_name);
    }
    closedir(d);
    qsort(names, nn, sizeof *names, cmpstr);
    for (int i = 0; i < nn; i++) {
        if (!rc && names[i])
            rc = add_file(f, names[i]);
        else if (!rc)
            rc = LMS_ENOMEM;
        lms__free(names[i]);
    }
    if (!rc && nn == 0)
        rc = lms__err(LMS_ENOENT, "%s: no .safetensors file", dir);
    if (rc)
        goto fail;
    *out = f;
    src->ctx = f;
    src->tensor = st_tensor_fn;
    src->file = st_file_fn;
    src->free_file = lms__free;
    src->name = f->dir;
    return 0;
fail:
    lms__st_folder_close(f);
    return rc;
}

void lms__st_folder_close(lms__st_folder *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->n; i++) lms__free(f->t[i].name);
    lms__free(f->t);
    for (int i = 0; i < f->n_maps; i++) munmap(f->maps[i], f->map_len[i]);
    lms__free(f->dir);
    lms__free(f);
}
