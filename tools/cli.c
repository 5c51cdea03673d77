/*
 * tools/cli.c - helpers shared by the subcommands (see cli.h).
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lmstore/error.h"
#include "lmstore/store.h"
#include "tools/cli.h"

static const char *global_store;

void lms_cli_set_store(const char *dir) { global_store = dir; }

bool lms_cli_store_explicit(const char *opt) { return (opt && *opt) || (global_store && *global_store); }

const char *lms_cli_store_path(const char *opt)
{
    static char buf[PATH_MAX];
    const char *s;
    if (opt && *opt)
        return opt;
    if (global_store && *global_store)
        return global_store;
    if ((s = getenv("LMSTORE_HOME")) && *s)
        return s;
    if ((s = getenv("XDG_DATA_HOME")) && *s) {
        snprintf(buf, sizeof buf, "%s/lmstore", s);
        return buf;
    }
    s = getenv("HOME");
    snprintf(buf, sizeof buf, "%s/.local/share/lmstore", s && *s ? s : ".");
    return buf;
}

bool lms_cli_nothing_at(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return errno == ENOENT;
    struct dirent *e;
    bool empty = true;
    while (empty && (e = readdir(d)))
        empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    return empty;
}

int lms_cli_store_open_list(const char *cmd, const char *opt, lms_store **st)
{
    const char *path = lms_cli_store_path(opt);
    *st = NULL;
    if (!lms_cli_store_explicit(opt) && lms_cli_nothing_at(path))
        return LMS_EXIT_OK;
    int rc = lms_store_open(path, LMS_STORE_RDONLY, NULL, st);
    if (rc)
        return lms_cli_fail(cmd, rc, path);
    return LMS_EXIT_OK;
}

int lms_cli_fail(const char *cmd, int code, const char *what)
{
    const char *detail = lms_last_error();
    if (!detail || !*detail)
        detail = lms_strerror(code);
    if (what && *what && !strstr(detail, what))
        fprintf(stderr, "lmstore %s: error: %s: %s\n", cmd, what, detail);
    else
        fprintf(stderr, "lmstore %s: error: %s\n", cmd, detail);
    return LMS_EXIT_FAIL;
}

static int (*help_fn)(void);
static int help_argc;
static char **help_argv;

void lms_cli_set_help(int (*help)(void), int argc, char **argv)
{
    help_fn = help;
    help_argc = argc;
    help_argv = argv;
}

static bool help_wanted(void)
{
    for (int i = 1; i < help_argc && strcmp(help_argv[i], "--"); i++)
        if (!strcmp(help_argv[i], "-h") || !strcmp(help_argv[i], "--help"))
            return true;
    return false;
}

int lms_cli_usage(const char *cmd, const char *fmt, ...)
{
    if (help_fn && help_wanted()) {
        /* the help instead of the mistake, and the command ends here (its
         * parser is in the middle of the line: nothing to return into) */
        int (*fn)(void) = help_fn;
        help_fn = NULL;
        int st = fn();
        fflush(stdout);
        exit(st);
    }
    va_list ap;
    fprintf(stderr, "lmstore %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(see `lmstore help %s`)\n", cmd);
    return LMS_EXIT_USAGE;
}

static bool only_operands; /* "--" was seen */

bool lms_cli_end_of_options(char **argv, int *i)
{
    if (only_operands || strcmp(argv[*i], "--") != 0)
        return false;
    only_operands = true;
    (*i)++;
    return true;
}

bool lms_cli_is_option(const char *arg) { return !only_operands && arg[0] == '-' && arg[1]; }

bool lms_cli_opt(int argc, char **argv, int *i, const char *name, const char **val)
{
    const char *a = argv[*i];
    if (only_operands)
        return false;
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0)
        return false;
    if (a[n] == '=') {
        *val = a + n + 1;
        (*i)++;
        return true;
    }
    if (a[n] != '\0')
        return false;
    if (*i + 1 >= argc) {
        fprintf(stderr, "lmstore: option %s needs a value\n", name);
        exit(LMS_EXIT_USAGE);
    }
    *val = argv[*i + 1];
    *i += 2;
    return true;
}

bool lms_cli_flag(char **argv, int i, const char *name) { return !only_operands && strcmp(argv[i], name) == 0; }

bool lms_cli_parse_i64(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno)
        return false;
    *out = v;
    return true;
}

bool lms_cli_parse_f64(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno)
        return false;
    *out = v;
    return true;
}

bool lms_cli_parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || errno || *s == '-')
        return false;
    int shift = 0;
    switch (*end) {
    case '\0': break;
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    default: return false;
    }
    if (*end == 'i') end++;
    if (*end == 'B') end++;
    if (*end || (shift && v > (ULLONG_MAX >> shift)))
        return false;
    *out = (uint64_t)v << shift;
    return true;
}

void lms_cli_human_bytes(double b, char *out, size_t n)
{
    const char *u[] = {"B", "KB", "MB", "GB", "TB"};
    int i = 0;
    while (b >= 1000 && i < 4) {
        b /= 1000;
        i++;
    }
    snprintf(out, n, i ? "%.2f %s" : "%.0f %s", b, u[i]);
}

void lms_cli_human_count(uint64_t p, char *out, size_t n)
{
    if (p >= 1000000000ull)
        snprintf(out, n, "%.2fB", (double)p / 1e9);
    else if (p >= 1000000ull)
        snprintf(out, n, "%.1fM", (double)p / 1e6);
    else if (p >= 1000ull)
        snprintf(out, n, "%.1fK", (double)p / 1e3);
    else
        snprintf(out, n, "%llu", (unsigned long long)p);
}

bool lms_cli_vision_tensor(const char *name)
{
    static const char *const prefixes[] = {"vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                                           "model.multi_modal_projector."};
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++)
        if (!strncmp(name, prefixes[i], strlen(prefixes[i])))
            return true;
    return false;
}

int lms_cli_model_pair(const char *cmd, int argc, char **argv,
                       int (*op)(struct lms_store *s, const char *src, const char *dst), const char *done)
{
    const char *store_opt = NULL, *src = NULL, *dst = NULL;
    for (int i = 1; i < argc;) {
        if (lms_cli_end_of_options(argv, &i) || lms_cli_opt(argc, argv, &i, "--store", &store_opt))
            continue;
        if (lms_cli_flag(argv, i, "--help") || lms_cli_flag(argv, i, "-h")) {
            printf("usage: lmstore %s MODEL NEWNAME [--store DIR]\n", cmd);
            return LMS_EXIT_OK;
        }
        if (lms_cli_is_option(argv[i]))
            return lms_cli_usage(cmd, "unknown option %s", argv[i]);
        if (!src)
            src = argv[i];
        else if (!dst)
            dst = argv[i];
        else
            return lms_cli_usage(cmd, "too many arguments");
        i++;
    }
    if (!src || !dst)
        return lms_cli_usage(cmd, "want MODEL and NEWNAME");
    lms_store *s = NULL;
    int rc = lms_store_open(lms_cli_store_path(store_opt), 0, NULL, &s);
    if (rc)
        return lms_cli_fail(cmd, rc, "open store");
    rc = op(s, src, dst);
    lms_store_close(s);
    if (rc)
        return lms_cli_fail(cmd, rc, src);
    printf("%s %s -> %s\n", done, src, dst);
    return LMS_EXIT_OK;
}
