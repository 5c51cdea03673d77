/*
 * store/names.h - the names users give to what the store holds: models
 * (keys of "models", and the first half of "model NUL item" keys) and saved
 * KV sessions (keys of "sessions"). One validator for both, used where a
 * name is created (import, cp, mv, KV save); listing, info, rm and KV resume
 * accept whatever is stored (lms__name_lookup_check), so a name an older
 * build let in can still be seen, used and removed (with "--" on a command
 * line).
 *
 * A valid name is
 *   - 1..LMS__MODEL_NAME_MAX (200) bytes for a model, 1..LMS__SESSION_NAME_MAX
 *     (400) bytes for a session: the key, and for a model the key with a
 *     NUL and a tensor name after it, fits LMDB's 511-byte keys;
 *   - valid UTF-8 without NUL or control characters (U+0000..U+001F,
 *     U+007F): names are printed by `lmstore ls` and `kv ls`;
 *   - not starting with '-', which a command line would read as an option;
 *   - for a model, without '/': model names are single path-like
 *     components (an import's default name is a folder's base name).
 *     Session names may use '/' to group sessions ("user-42/chat").
 */
#ifndef LMS_STORE_NAMES_H
#define LMS_STORE_NAMES_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lms__name_kind { LMS__NAME_MODEL, LMS__NAME_SESSION } lms__name_kind;

/* 0 when `name` is a valid name of that kind, else LMS_EINVAL with a detail
 * saying which rule it breaks ("model name 'a/b' contains '/'"). */
int lms__name_check(lms__name_kind kind, const char *name);

/* For looking a name up (KV resume): 0 when `name` could be a stored key of
 * that kind (1 .. max bytes), else LMS_EINVAL; a name an older build let in
 * (one beginning with '-') is looked up like any other. */
int lms__name_lookup_check(lms__name_kind kind, const char *name);

#ifdef __cplusplus
}
#endif
#endif
