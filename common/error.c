/*
 * common/error.c - error names and the thread-local detail of the last
 * failure (see include/lmstore/error.h for the convention).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common.h"

#define LMS_ERRBUF 1024

static _Thread_local char tl_detail[LMS_ERRBUF];
static _Thread_local int tl_code;

const char *lms_strerror(int code)
{
    switch (code) {
    case LMS_OK: return "success";
    case LMS_EINVAL: return "invalid argument";
    case LMS_ENOMEM: return "out of memory";
    case LMS_EIO: return "I/O error";
    case LMS_ENOENT: return "not found";
    case LMS_EEXIST: return "already exists";
    case LMS_EFORMAT: return "malformed input";
    case LMS_ECORRUPT: return "corrupt data";
    case LMS_EVERSION: return "unsupported format version";
    case LMS_EBUSY: return "busy";
    case LMS_EUNSUPPORTED: return "not supported";
    case LMS_EMISMATCH: return "mismatch";
    case LMS_ENOSPACE: return "out of space";
    case LMS_EDEVICE: return "device error";
    case LMS_EDB: return "index database error";
    case LMS_ECANCELED: return "canceled";
    case LMS_ERANGE: return "out of range";
    default: return "unknown error";
    }
}

const char *lms_last_error(void) { return tl_detail; }
int lms_last_error_code(void) { return tl_code; }

void lms_clear_error(void)
{
    tl_detail[0] = '\0';
    tl_code = 0;
}

int lms__verr(int code, const char *fmt, va_list ap)
{
    char tmp[LMS_ERRBUF]; /* fmt's arguments may point into tl_detail */
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    memcpy(tl_detail, tmp, sizeof tmp);
    tl_code = code;
    return code;
}

int lms__err(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    lms__verr(code, fmt, ap);
    va_end(ap);
    return code;
}

int lms__err_errno(int code, int errnum, const char *fmt, ...)
{
    char msg[LMS_ERRBUF];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return lms__err(code, "%s: %s", msg, strerror(errnum));
}

int lms__err_prefix(int code, const char *fmt, ...)
{
    char pre[LMS_ERRBUF], old[LMS_ERRBUF];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    memcpy(old, tl_detail, sizeof old);
    if (old[0])
        return lms__err(code, "%s%s", pre, old);
    return lms__err(code, "%s%s", pre, lms_strerror(code));
}
