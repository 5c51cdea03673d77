/*
 * common/sys.c - allocation and file I/O wrappers, all fault-injectable.
 *
 * Every allocation and every read/write/fsync/open in lmstore goes through
 * here, so that tests can fail the Nth call of a kind (lms__fault_arm) and
 * check that the caller returns an error, leaks nothing and leaves stored
 * data consistent. Failures set the thread's error detail with the path.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

/* ---- fault injection ---------------------------------------------------- */

static atomic_long fault_calls[LMS_FAULT_KINDS_];
static atomic_long fault_at[LMS_FAULT_KINDS_]; /* absolute call number, 0 = off */
static atomic_bool fault_repeat[LMS_FAULT_KINDS_];

void lms__fault_arm(int kind, long nth, bool repeat)
{
    if (kind < 0 || kind >= LMS_FAULT_KINDS_)
        return;
    atomic_store(&fault_repeat[kind], repeat);
    atomic_store(&fault_at[kind], nth > 0 ? atomic_load(&fault_calls[kind]) + nth : 0);
}

void lms__fault_disarm_all(void)
{
    for (int k = 0; k < LMS_FAULT_KINDS_; k++)
        atomic_store(&fault_at[k], 0);
}

long lms__fault_calls(int kind) { return atomic_load(&fault_calls[kind]); }

void lms__fault_reset_counts(void)
{
    for (int k = 0; k < LMS_FAULT_KINDS_; k++)
        atomic_store(&fault_calls[k], 0);
}

bool lms__fault_hit(int kind)
{
    long n = atomic_fetch_add(&fault_calls[kind], 1) + 1;
    long at = atomic_load(&fault_at[kind]);
    if (LMS_UNLIKELY(at != 0)) {
        if (n == at)
            return true;
        if (n > at && atomic_load(&fault_repeat[kind]))
            return true;
    }
    return false;
}

/* ---- allocation ---------------------------------------------------------- */

static void *oom(size_t n)
{
    lms__err(LMS_ENOMEM, "out of memory allocating %zu bytes", n);
    return NULL;
}

void *lms__malloc(size_t n)
{
    if (lms__fault_hit(LMS_FAULT_ALLOC))
        return oom(n);
    void *p = malloc(n ? n : 1);
    return p ? p : oom(n);
}

void *lms__calloc(size_t count, size_t size)
{
    if (lms__fault_hit(LMS_FAULT_ALLOC))
        return oom(count * size);
    void *p = calloc(count ? count : 1, size ? size : 1);
    return p ? p : oom(count * size);
}

void *lms__realloc(void *p, size_t n)
{
    if (lms__fault_hit(LMS_FAULT_ALLOC))
        return oom(n);
    void *q = realloc(p, n ? n : 1);
    return q ? q : oom(n);
}

void *lms__aligned_alloc(size_t align, size_t n)
{
    void *p = NULL;
    if (lms__fault_hit(LMS_FAULT_ALLOC))
        return oom(n);
    if (posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, n ? n : 1))
        return oom(n);
    return p;
}

char *lms__strdup(const char *s) { return lms__strndup(s, strlen(s)); }

char *lms__strndup(const char *s, size_t n)
{
    size_t len = strnlen(s, n);
    char *d = lms__malloc(len + 1);
    if (!d)
        return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

char *lms__asprintf(const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = n >= 0 ? lms__malloc((size_t)n + 1) : NULL;
    if (s)
        vsnprintf(s, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return s;
}

void lms__free(void *p) { free(p); }

/* ---- file I/O ------------------------------------------------------------ */

int lms__open(const char *path, int flags, int mode)
{
    if (lms__fault_hit(LMS_FAULT_OPEN))
        return lms__err_errno(LMS_EIO, EIO, "%s: open", path);
    int fd;
    do
        fd = open(path, flags | O_CLOEXEC, mode);
    while (fd < 0 && errno == EINTR);
    if (fd < 0)
        return lms__err_errno(errno == ENOENT ? LMS_ENOENT : LMS_EIO, errno, "%s", path);
    return fd;
}

static const char *file_kind(mode_t m)
{
    return S_ISFIFO(m) ? "a FIFO" : S_ISDIR(m) ? "a folder" : S_ISCHR(m) ? "a character device"
         : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

int lms__open_regular(const char *path)
{
    /* O_NONBLOCK: open(2) of a FIFO without a writer would wait forever */
    int fd = lms__open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY, 0);
    if (fd < 0)
        return fd;
    struct stat st;
    if (fstat(fd, &st)) {
        int rc = lms__err_errno(LMS_EIO, errno, "%s: stat", path);
        close(fd);
        return rc;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return lms__err(LMS_EFORMAT, "%s: %s, not a regular file; refusing to read it", path, file_kind(st.st_mode));
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK)) {
        int rc = lms__err_errno(LMS_EIO, errno, "%s: fcntl", path);
        close(fd);
        return rc;
    }
    return fd;
}

int lms__close(int fd) { return close(fd) ? LMS_EIO : 0; }

int lms__pread_all(int fd, void *buf, size_t n, uint64_t off, const char *path)
{
    char *p = buf;
    size_t done = 0;
    if (lms__fault_hit(LMS_FAULT_READ))
        return lms__err_errno(LMS_EIO, EIO, "%s: read at byte %llu", path, (unsigned long long)off);
    while (done < n) {
        ssize_t r = pread(fd, p + done, n - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return lms__err_errno(LMS_EIO, errno, "%s: read at byte %llu", path,
                                  (unsigned long long)(off + done));
        if (r == 0)
            return lms__err(LMS_EFORMAT, "%s: truncated: wanted %zu bytes at byte %llu, file ends at %llu",
                            path, n, (unsigned long long)off, (unsigned long long)(off + done));
        done += (size_t)r;
    }
    return 0;
}

int lms__pwrite_all(int fd, const void *buf, size_t n, uint64_t off, const char *path)
{
    const char *p = buf;
    size_t done = 0;
    if (lms__fault_hit(LMS_FAULT_WRITE))
        return lms__err_errno(LMS_EIO, ENOSPC, "%s: write at byte %llu", path, (unsigned long long)off);
    while (done < n) {
        ssize_t r = pwrite(fd, p + done, n - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return lms__err_errno(LMS_EIO, errno, "%s: write at byte %llu", path,
                                  (unsigned long long)(off + done));
        done += (size_t)r;
    }
    return 0;
}

int lms__fsync(int fd, const char *path)
{
    if (lms__fault_hit(LMS_FAULT_FSYNC))
        return lms__err_errno(LMS_EIO, EIO, "%s: fsync", path);
    if (fsync(fd))
        return lms__err_errno(LMS_EIO, errno, "%s: fsync", path);
    return 0;
}

int lms__fsync_dir(const char *dir)
{
    int fd = lms__open(dir, O_RDONLY | O_DIRECTORY, 0);
    if (fd < 0)
        return fd;
    int rc = lms__fsync(fd, dir);
    close(fd);
    return rc;
}

int lms__ftruncate(int fd, uint64_t size, const char *path)
{
    if (lms__fault_hit(LMS_FAULT_WRITE))
        return lms__err_errno(LMS_EIO, ENOSPC, "%s: truncate to %llu bytes", path, (unsigned long long)size);
    if (ftruncate(fd, (off_t)size))
        return lms__err_errno(LMS_EIO, errno, "%s: truncate to %llu bytes", path, (unsigned long long)size);
    return 0;
}

int lms__fstat_size(int fd, uint64_t *size, const char *path)
{
    struct stat st;
    if (fstat(fd, &st))
        return lms__err_errno(LMS_EIO, errno, "%s: stat", path);
    *size = (uint64_t)st.st_size;
    return 0;
}

int lms__copy_range(int in_fd, uint64_t in_off, int out_fd, uint64_t out_off, uint64_t n,
                    const char *in_path, const char *out_path)
{
    if (lms__fault_hit(LMS_FAULT_WRITE))
        return lms__err_errno(LMS_EIO, ENOSPC, "%s: write at byte %llu", out_path,
                              (unsigned long long)out_off);
    while (n > 0) {
        loff_t io = (loff_t)in_off, oo = (loff_t)out_off;
        ssize_t r = copy_file_range(in_fd, &io, out_fd, &oo, n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break; /* EXDEV, ENOSYS, EOPNOTSUPP or EOF: fall back below */
        in_off += (uint64_t)r;
        out_off += (uint64_t)r;
        n -= (uint64_t)r;
    }
    if (n == 0)
        return 0;
    size_t bufsz = 1 << 20;
    char *buf = lms__malloc(bufsz);
    if (!buf)
        return LMS_ENOMEM;
    int rc = 0;
    while (n > 0 && rc == 0) {
        size_t k = n < bufsz ? (size_t)n : bufsz;
        rc = lms__pread_all(in_fd, buf, k, in_off, in_path);
        if (!rc)
            rc = lms__pwrite_all(out_fd, buf, k, out_off, out_path);
        in_off += k;
        out_off += k;
        n -= k;
    }
    lms__free(buf);
    return rc;
}

int lms__read_file(const char *path, size_t max, char **out, size_t *len)
{
    uint64_t size;
    int fd = lms__open_regular(path), rc;
    *out = NULL;
    if (fd < 0)
        return fd;
    rc = lms__fstat_size(fd, &size, path);
    if (rc)
        goto out_close;
    if (size > max) {
        rc = lms__err(LMS_ERANGE, "%s: %llu bytes is larger than the %zu-byte limit", path,
                      (unsigned long long)size, max);
        goto out_close;
    }
    char *buf = lms__malloc((size_t)size + 1);
    if (!buf) {
        rc = LMS_ENOMEM;
        goto out_close;
    }
    rc = lms__pread_all(fd, buf, (size_t)size, 0, path);
    if (rc) {
        lms__free(buf);
        goto out_close;
    }
    buf[size] = '\0';
    *out = buf;
    if (len)
        *len = (size_t)size;
out_close:
    close(fd);
    return rc;
}

int lms__write_file_atomic(const char *path, const void *buf, size_t len)
{
    char *tmp = lms__asprintf("%s.tmp.%d", path, (int)getpid());
    char *dircopy = NULL;
    int rc, fd;
    if (!tmp)
        return LMS_ENOMEM;
    fd = lms__open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        rc = fd;
        goto out_free;
    }
    rc = lms__pwrite_all(fd, buf, len, 0, tmp);
    if (!rc)
        rc = lms__fsync(fd, tmp);
    close(fd);
    if (!rc && rename(tmp, path))
        rc = lms__err_errno(LMS_EIO, errno, "%s: rename", path);
    if (rc) {
        unlink(tmp);
        goto out_free;
    }
    dircopy = lms__strdup(path);
    rc = dircopy ? lms__fsync_dir(dirname(dircopy)) : LMS_ENOMEM;
out_free:
    lms__free(dircopy);
    lms__free(tmp);
    return rc;
}

int lms__mkdir_p(const char *path, int mode)
{
    char *p = lms__strdup(path);
    if (!p)
        return LMS_ENOMEM;
    for (char *s = p + 1;; s++) {
        if (*s == '/' || *s == '\0') {
            char c = *s;
            *s = '\0';
            if (mkdir(p, (mode_t)mode) && errno != EEXIST) {
                int rc = lms__err_errno(LMS_EIO, errno, "%s: mkdir", p);
                lms__free(p);
                return rc;
            }
            *s = c;
            if (!c)
                break;
        }
    }
    lms__free(p);
    return 0;
}

bool lms__path_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

bool lms__is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}
