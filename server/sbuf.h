/*
 * server/sbuf.h - a growing text buffer for the server's responses (JSON,
 * server-sent events, Prometheus text). An allocation failure sticks (oom)
 * and later appends do nothing, so a writer checks once at the end.
 */
#ifndef LMS_SERVER_SBUF_H
#define LMS_SERVER_SBUF_H

#include <stdbool.h>
#include <stddef.h>

#include "common/common.h"

typedef struct lms__sbuf {
    char *p;        /* NUL-terminated when len > 0 or after any append; lms__free */
    size_t len, cap;
    bool oom;
} lms__sbuf;

void lms__sbuf_add(lms__sbuf *b, const char *data, size_t len);
void lms__sbuf_put(lms__sbuf *b, const char *fmt, ...) LMS_PRINTF(2, 3);
/* Forget the contents, keep the memory. */
void lms__sbuf_clear(lms__sbuf *b);
void lms__sbuf_free(lms__sbuf *b);

#endif
