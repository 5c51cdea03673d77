/*
 * store/names.c - the one validator of model and KV session names (rules in
 * store/names.h).
 */
#include <string.h>

#include "store/kv_records.h"
#include "store/names.h"
#include "store/store_internal.h"

int lms__name_check(lms__name_kind kind, const char *name)
{
    const char *what = kind == LMS__NAME_MODEL ? "model name" : "KV session name";
    int rc = lms__name_lookup_check(kind, name);
    if (rc)
        return rc;
    size_t n = strlen(name);
    if (!lms__utf8_valid(name, n))
        return lms__err(LMS_EINVAL, "%s is not valid UTF-8", what);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
            return lms__err(LMS_EINVAL, "%s contains a control character (byte %zu)", what, i);
    if (name[0] == '-')
        return lms__err(LMS_EINVAL, "%s '%s' begins with '-' (a command line would read it as an option)", what,
                        name);
    if (kind == LMS__NAME_MODEL && strchr(name, '/'))
        return lms__err(LMS_EINVAL, "%s '%s' contains '/'", what, name);
    return 0;
}

int lms__name_lookup_check(lms__name_kind kind, const char *name)
{
    const char *what = kind == LMS__NAME_MODEL ? "model name" : "KV session name";
    size_t max = kind == LMS__NAME_MODEL ? LMS__MODEL_NAME_MAX : LMS__SESSION_NAME_MAX;
    size_t n = name ? strlen(name) : 0;
    if (n == 0)
        return lms__err(LMS_EINVAL, "a %s must not be empty", what);
    if (n > max)
        return lms__err(LMS_EINVAL, "%s '%.40s...' is %zu bytes, more than %zu", what, name, n, max);
    return 0;
}
