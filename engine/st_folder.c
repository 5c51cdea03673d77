/*
 * engine/st_folder.c - a weight source over a HuggingFace folder
 * (*.safetensors + config.json), mapped read-only. The engine's own path is
 * the loader (lms_model from the store); this source serves tools and
 * benchmarks that run a folder directly and the forward-pass tests that
 * must not depend on the store.
 *
 * The folder is read by the store's strict safetensors reader
 * (store/safetensors.h: every header, length, offset, overlap and shard
 * checked, the index cross-checked), so this file only maps what that
 * reader has validated.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine/internal.h"
#include "store/safetensors.h"

struct lms__st_folder {
    char *dir;
    lms__st_source *src;
    void **maps;       /* [n_shards] */
    size_t *map_len;   /* [n_shards] */
};

static int st_tensor_fn(void *ctx, const char *name, lms_dtype *dt, uint32_t *ndim, uint64_t shape[LMS_MAX_DIMS],
                        const void **data, const void **dev, uint64_t *nbytes)
{
    lms__st_folder *f = ctx;
    for (size_t s = 0; s < f->src->n_shards; s++) {
        const lms__st_file *sh = f->src->shards[s];
        for (size_t i = 0; i < sh->n_tensors; i++) {
            const lms__st_tensor *t = &sh->tensors[i];
            if (strcmp(t->name, name))
                continue;
            *dt = t->dtype;
            *ndim = t->ndim;
            memcpy(shape, t->shape, sizeof t->shape);
            *data = (const uint8_t *)f->maps[s] + sh->data_off + t->begin;
            *dev = NULL;
            *nbytes = t->nbytes;
            return 0;
        }
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

static int map_shard(const lms__st_file *sh, void **map, size_t *len)
{
    int fd = lms__open(sh->path, O_RDONLY, 0);
    if (fd < 0)
        return fd;
    void *m = mmap(NULL, sh->file_size, PROT_READ, MAP_SHARED, fd, 0);
    int err = errno;
    lms__close(fd);
    if (m == MAP_FAILED)
        return lms__err_errno(LMS_EIO, err, "%s: mmap", sh->path);
    *map = m;
    *len = sh->file_size;
    return 0;
}

int lms__st_folder_open(const char *dir, lms__st_folder **out, lms__wsrc *src)
{
    int rc;
    lms__st_folder *f = lms__calloc(1, sizeof *f);
    *out = NULL;
    if (!f || !(f->dir = lms__strdup(dir))) {
        lms__free(f);
        return LMS_ENOMEM;
    }
    if ((rc = lms__st_source_open(dir, &f->src)))
        goto fail;
    if (!(f->maps = lms__calloc(f->src->n_shards, sizeof *f->maps)) ||
        !(f->map_len = lms__calloc(f->src->n_shards, sizeof *f->map_len))) {
        rc = LMS_ENOMEM;
        goto fail;
    }
    for (size_t s = 0; s < f->src->n_shards; s++)
        if ((rc = map_shard(f->src->shards[s], &f->maps[s], &f->map_len[s])))
            goto fail;
    *out = f;
    src->ctx = f;
    src->tensor = st_tensor_fn;
    src->file = st_file_fn;
    src->free_file = lms__free;
    src->name = f->dir;
    src->tokenizer = NULL; /* tokenizer.json through st_file_fn */
    src->prefetch = NULL;
    return 0;
fail:
    lms__st_folder_close(f);
    return rc;
}

void lms__st_folder_close(lms__st_folder *f)
{
    if (!f)
        return;
    for (size_t s = 0; f->maps && s < f->src->n_shards; s++)
        if (f->maps[s])
            munmap(f->maps[s], f->map_len[s]);
    lms__free(f->maps);
    lms__free(f->map_len);
    lms__st_source_free(f->src);
    lms__free(f->dir);
    lms__free(f);
}
