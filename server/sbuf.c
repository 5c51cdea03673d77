/*
 * server/sbuf.c - the growing text buffer (see sbuf.h).
 */
#include "server/sbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static bool reserve(lms__sbuf *b, size_t more)
{
    if (b->oom)
        return false;
    if (b->len + more + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more + 1)
        cap *= 2;
    char *q = lms__realloc(b->p, cap);
    if (!q) {
        b->oom = true;
        return false;
    }
    b->p = q;
    b->cap = cap;
    return true;
}

void lms__sbuf_add(lms__sbuf *b, const char *data, size_t len)
{
    if (!reserve(b, len))
        return;
    if (len)
        memcpy(b->p + b->len, data, len);
    b->len += len;
    b->p[b->len] = '\0';
}

void lms__sbuf_put(lms__sbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !reserve(b, (size_t)n)) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void lms__sbuf_clear(lms__sbuf *b)
{
    b->len = 0;
    if (b->p)
        b->p[0] = '\0';
}

void lms__sbuf_free(lms__sbuf *b)
{
    lms__free(b->p);
    memset(b, 0, sizeof *b);
}
