/*
 * common/common.h - internal services every module uses: errors, allocation
 * and file I/O (fault-injectable), hashing, overflow-safe arithmetic, a small
 * thread pool, a progress bar and logging.
 *
 * Internal names start with lms__. Nothing here is part of the public API.
 *
 * All allocation and file I/O in lmstore goes through the wrappers below so
 * that a test can make the Nth call fail (see lms__fault_*) and check that
 * nothing leaks and nothing half-commits (SQLite's test_malloc.c idea).
 */
#ifndef LMS_COMMON_H
#define LMS_COMMON_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "lmstore/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define LMS_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define LMS_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define LMS_PRINTF(a, b)
#define LMS_UNLIKELY(x) (x)
#endif

#define LMS_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define LMS_MIN(a, b) ((a) < (b) ? (a) : (b))
#define LMS_MAX(a, b) ((a) > (b) ? (a) : (b))

/* ---- errors ------------------------------------------------------------ */

/*
 * Record the detail of a failure on this thread and return `code`, so that
 * call sites read `return lms__err(LMS_EFORMAT, "%s: ...", path);`.
 */
int lms__err(int code, const char *fmt, ...) LMS_PRINTF(2, 3);
int lms__verr(int code, const char *fmt, va_list ap);
/* Like lms__err but keeps errno's text: "...: No such file or directory". */
int lms__err_errno(int code, int errnum, const char *fmt, ...) LMS_PRINTF(3, 4);
/* Prefix the current detail with more context: "import 'x': " + detail. */
int lms__err_prefix(int code, const char *fmt, ...) LMS_PRINTF(2, 3);

/* ---- logging (stderr; level from LMSTORE_LOG=error|warn|info|debug) ---- */

enum { LMS_LOG_ERROR, LMS_LOG_WARN, LMS_LOG_INFO, LMS_LOG_DEBUG };
void lms__log(int level, const char *fmt, ...) LMS_PRINTF(2, 3);
#define lms__warn(...) lms__log(LMS_LOG_WARN, __VA_ARGS__)
#define lms__info(...) lms__log(LMS_LOG_INFO, __VA_ARGS__)
#define lms__debug(...) lms__log(LMS_LOG_DEBUG, __VA_ARGS__)

/* ---- allocation (fault-injectable; failures set LMS_ENOMEM detail) ----- */

void *lms__malloc(size_t n);
void *lms__calloc(size_t count, size_t size);
void *lms__realloc(void *p, size_t n);
void *lms__aligned_alloc(size_t align, size_t n); /* free with lms__free */
char *lms__strdup(const char *s);
char *lms__strndup(const char *s, size_t n);
char *lms__asprintf(const char *fmt, ...) LMS_PRINTF(1, 2);
void lms__free(void *p);

/* ---- file I/O (fault-injectable; failures set LMS_EIO detail with path) -- */

/* open(2) wrapper; returns fd or negative LMS_E* code. */
int lms__open(const char *path, int flags, int mode);
/* Open an input file for reading: only a regular file. A FIFO, device or
 * socket is refused (LMS_EFORMAT naming what it is) without blocking: it is
 * opened O_NONBLOCK and checked with fstat before anything reads it. */
int lms__open_regular(const char *path);
int lms__close(int fd);
/* Read exactly n bytes at off; short read (EOF) is LMS_EFORMAT "truncated". */
int lms__pread_all(int fd, void *buf, size_t n, uint64_t off, const char *path);
int lms__pwrite_all(int fd, const void *buf, size_t n, uint64_t off, const char *path);
int lms__fsync(int fd, const char *path);
int lms__fsync_dir(const char *dir);
int lms__ftruncate(int fd, uint64_t size, const char *path);
int lms__fstat_size(int fd, uint64_t *size, const char *path);
/* copy_file_range with a pread/pwrite fallback; copies exactly n bytes. */
int lms__copy_range(int in_fd, uint64_t in_off, int out_fd, uint64_t out_off,
                    uint64_t n, const char *in_path, const char *out_path);
/* Read a whole (small) file into a NUL-terminated buffer; caps at max bytes. */
int lms__read_file(const char *path, size_t max, char **out, size_t *len);
/* Write a whole file atomically (tmp + fsync + rename + fsync dir). */
int lms__write_file_atomic(const char *path, const void *buf, size_t len);
/* mkdir -p */
int lms__mkdir_p(const char *path, int mode);
bool lms__path_exists(const char *path);
bool lms__is_dir(const char *path);

/*
 * Fault injection. Each kind counts its calls; when armed with
 * lms__fault_arm(kind, n), the nth call from now (1-based) and every later one
 * while `repeat` is true fail as the real call would (ENOMEM, EIO, ENOSPC).
 * Counters are process-wide and atomic. Used by tests only.
 */
enum lms_fault_kind {
    LMS_FAULT_ALLOC,
    LMS_FAULT_READ,
    LMS_FAULT_WRITE, /* pwrite, copy_range, ftruncate */
    LMS_FAULT_FSYNC,
    LMS_FAULT_OPEN,
    LMS_FAULT_KINDS_
};
void lms__fault_arm(int kind, long nth, bool repeat);
void lms__fault_disarm_all(void);
long lms__fault_calls(int kind); /* calls counted since the last reset */
void lms__fault_reset_counts(void);
bool lms__fault_hit(int kind); /* for wrappers living in other modules */

/* ---- overflow-safe arithmetic (true on overflow) ------------------------ */

static inline bool lms__mul_overflow(uint64_t a, uint64_t b, uint64_t *r)
{
    return __builtin_mul_overflow(a, b, r);
}
static inline bool lms__add_overflow(uint64_t a, uint64_t b, uint64_t *r)
{
    return __builtin_add_overflow(a, b, r);
}
static inline uint64_t lms__align_up(uint64_t x, uint64_t a) /* a: power of 2 */
{
    return (x + a - 1) & ~(a - 1);
}

/* ---- little-endian encoding for on-disk records -------------------------- */

static inline void lms__put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void lms__put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void lms__put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t lms__get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t lms__get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static inline uint64_t lms__get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* ---- hashing (XXH3) ---------------------------------------------------- */

typedef struct lms_hash128 {
    uint64_t lo, hi;
} lms_hash128;

uint64_t lms__hash64(const void *p, size_t n, uint64_t seed);
lms_hash128 lms__hash128(const void *p, size_t n);
bool lms__hash128_eq(lms_hash128 a, lms_hash128 b);
/* 16 bytes, little-endian lo then hi: the on-disk form of a hash. */
void lms__hash128_put(uint8_t out[16], lms_hash128 h);
lms_hash128 lms__hash128_get(const uint8_t in[16]);
/* 32 lowercase hex digits + NUL. */
void lms__hash128_hex(lms_hash128 h, char out[33]);

/* Streaming XXH3-128. */
typedef struct lms_hasher lms_hasher;
lms_hasher *lms__hasher_new(void);
void lms__hasher_reset(lms_hasher *h);
void lms__hasher_update(lms_hasher *h, const void *p, size_t n);
lms_hash128 lms__hasher_digest(const lms_hasher *h);
void lms__hasher_free(lms_hasher *h);

/* ---- thread pool ------------------------------------------------------- */

/*
 * A fixed set of worker threads. lms__pool_run(pool, n, fn, arg) calls
 * fn(arg, i, worker) for every i in [0, n) spread over the workers and the
 * calling thread, and returns when all are done. Not reentrant: one run at a
 * time per pool. A pool of 1 thread runs everything on the caller.
 */
typedef struct lms_pool lms_pool;
typedef void (*lms_pool_fn)(void *arg, size_t i, int worker);
int lms__pool_create(int threads, lms_pool **out); /* threads 0 = online CPUs */
int lms__pool_threads(const lms_pool *pool);
void lms__pool_run(lms_pool *pool, size_t n, lms_pool_fn fn, void *arg);
void lms__pool_destroy(lms_pool *pool); /* NULL ok */
int lms__cpu_count(void);

/* ---- progress bar (stderr, only when stderr is a TTY) ------------------- */

typedef struct lms_progress lms_progress;
/* total in `unit`s (bytes when unit is "B"); returns NULL when not a TTY
 * (all functions accept NULL). */
lms_progress *lms__progress_start(const char *label, uint64_t total, const char *unit);
void lms__progress_add(lms_progress *p, uint64_t n); /* thread-safe */
void lms__progress_done(lms_progress *p);             /* clears the line, frees */

/* ---- time -------------------------------------------------------------- */

double lms__now(void);              /* monotonic seconds */
uint64_t lms__unix_time(void);      /* wall clock seconds since the epoch */
uint64_t lms__peak_rss_bytes(void); /* VmHWM */

/* ---- 16-bit floats (common/half.c; round to nearest even, NaN stays NaN) ---- */

float lms__bf16_to_f32(uint16_t h);
uint16_t lms__f32_to_bf16(float f);
float lms__f16_to_f32(uint16_t h);
uint16_t lms__f32_to_f16(float f); /* overflow gives infinity */

/* ---- UTF-8 ------------------------------------------------------------- */

/* True if [s, s+n) is valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF). */
bool lms__utf8_valid(const char *s, size_t n);

#ifdef __cplusplus
}
#endif
#endif
