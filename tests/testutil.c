/*
 * tests/testutil.c - see testutil.h.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "testutil.h"

const char *lms_test_src(void)
{
    const char *s = getenv("LMS_SRC_DIR");
    return s ? s : ".";
}

const char *lms_test_bin(void)
{
    const char *s = getenv("LMS_BIN");
    return s ? s : "lmstore";
}

char *lms_test_tmpdir(const char *tag)
{
    static int counter;
    const char *base = getenv("LMS_TMP");
    char *path;
    if (!base)
        base = "/tmp/lmstore-test";
    if (asprintf(&path, "%s/%s-%d-%d", base, tag, (int)getpid(), counter++) < 0)
        return NULL;
    lms_test_rmrf(path);
    char *cmd;
    if (asprintf(&cmd, "mkdir -p '%s'", path) >= 0) {
        if (system(cmd) != 0) {
            free(cmd);
            free(path);
            return NULL;
        }
        free(cmd);
    }
    return path;
}

int lms_test_sh(char **out, const char *fmt, ...)
{
    char *cmd, *full;
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&cmd, fmt, ap) < 0) {
        va_end(ap);
        return -1;
    }
    va_end(ap);
    if (asprintf(&full, "(%s) 2>&1", cmd) < 0) {
        free(cmd);
        return -1;
    }
    free(cmd);
    FILE *p = popen(full, "r");
    free(full);
    if (!p)
        return -1;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += r;
        if (cap - len < 2) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
    }
    int st = pclose(p);
    if (buf)
        buf[len] = '\0';
    if (out)
        *out = buf;
    else
        free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

char *lms_test_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        if (len)
            *len = (size_t)n;
    }
    return buf;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void collect(const char *root, const char *rel, char ***names, size_t *n, size_t *cap)
{
    char *dirpath;
    if (asprintf(&dirpath, "%s/%s", root, rel) < 0)
        return;
    DIR *d = opendir(dirpath);
    free(dirpath);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char *r, *full;
        if (asprintf(&r, "%s%s%s", rel, *rel ? "/" : "", e->d_name) < 0)
            continue;
        if (asprintf(&full, "%s/%s", root, r) < 0) {
            free(r);
            continue;
        }
        struct stat st;
        if (lstat(full, &st) == 0 && S_ISDIR(st.st_mode)) {
            collect(root, r, names, n, cap);
            free(r);
        } else if (S_ISREG(st.st_mode)) {
            if (*n == *cap) {
                *cap = *cap ? *cap * 2 : 64;
                *names = realloc(*names, *cap * sizeof **names);
            }
            (*names)[(*n)++] = r;
        } else {
            free(r);
        }
        free(full);
    }
    closedir(d);
}

uint64_t lms_test_tree_digest(const char *dir)
{
    char **names = NULL;
    size_t n = 0, cap = 0;
    collect(dir, "", &names, &n, &cap);
    qsort(names, n, sizeof *names, cmp_str);
    XXH3_state_t *st = XXH3_createState();
    XXH3_64bits_reset(st);
    for (size_t i = 0; i < n; i++) {
        char *full;
        size_t len = 0;
        XXH3_64bits_update(st, names[i], strlen(names[i]) + 1);
        if (asprintf(&full, "%s/%s", dir, names[i]) >= 0) {
            char *data = lms_test_slurp(full, &len);
            if (data)
                XXH3_64bits_update(st, data, len);
            free(data);
            free(full);
        }
        free(names[i]);
    }
    free(names);
    uint64_t h = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return h;
}

void lms_test_rmrf(const char *path)
{
    char *cmd;
    if (asprintf(&cmd, "rm -rf '%s'", path) >= 0) {
        if (system(cmd) != 0) { /* nothing to do: best effort */
        }
        free(cmd);
    }
}
