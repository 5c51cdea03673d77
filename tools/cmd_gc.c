/*
 * tools/cmd_gc.c - `lmstore gc [--dry-run]`: reclaim unreferenced blobs,
 * bytes crashed imports left, and sparse segments; report what was freed
 * (or would be) and which segments another process kept busy.
 */
#include <stdio.h>

#include "lmstore/store.h"
#include "tools/cli.h"

const char lms_cmd_gc_help[] = "give unused space back: gc [--dry-run] [--compact-below FRACTION]";

static void on_busy(void *ctx, uint32_t segment, const char *path)
{
    (void)ctx;
    printf("busy: segment %u (%s) is mapped by another process or an open snapshot; left as is\n", segment, path);
}

int lms_cmd_gc(int argc, char **argv)
{
    const char *store_opt = NULL, *below = NULL, *grace = NULL;
    lms_gc_params gp = lms_gc_default_params();
    for (int i = 1; i < argc;) {
        if (lms_cli_opt(argc, argv, &i, "--store", &store_opt) ||
            lms_cli_opt(argc, argv, &i, "--compact-below", &below) || lms_cli_opt(argc, argv, &i, "--grace", &grace))
            continue;
        if (lms_cli_flag(argv, i, "--dry-run") || lms_cli_flag(argv, i, "-n")) {
            gp.dry_run = true;
        } else if (lms_cli_flag(argv, i, "--help") || lms_cli_flag(argv, i, "-h")) {
            printf("usage: lmstore gc [--store DIR] [--dry-run] [--compact-below F] [--grace SECONDS]\n\n"
                   "Deletes blobs no model references and KV pages no session references,\n"
                   "copies the live blobs of segments less than F live (default 0.5) into new\n"
                   "space, trims bytes no record reaches, and unlinks empty segments. A segment\n"
                   "another process has mapped is skipped and named. --dry-run only reports.\n"
                   "--grace S  wait up to S seconds (default 5) for readers of older snapshots\n");
            return LMS_EXIT_OK;
        } else {
            return lms_cli_usage("gc", "unknown argument %s", argv[i]);
        }
        i++;
    }
    if (below && (!lms_cli_parse_f64(below, &gp.compact_below) || gp.compact_below > 1))
        return lms_cli_usage("gc", "--compact-below wants a fraction from 0 to 1 (negative: never compact)");
    if (grace && (!lms_cli_parse_f64(grace, &gp.grace_seconds) || gp.grace_seconds < 0))
        return lms_cli_usage("gc", "--grace wants seconds");
    lms_store *s = NULL;
    int rc = lms_store_open(lms_cli_store_path(store_opt), gp.dry_run ? LMS_STORE_RDONLY : 0, NULL, &s);
    if (rc)
        return lms_cli_fail("gc", rc, "open store");
    lms_gc_report r;
    rc = lms_store_gc(s, &gp, on_busy, NULL, &r);
    lms_store_close(s);
    if (rc)
        return lms_cli_fail("gc", rc, "gc");
    if (gp.dry_run)
        printf("would free %.2f MB: %llu unreferenced blobs, %llu unreferenced KV pages, %llu segments to remove "
               "(%.2f MB of live blobs to move), %llu to trim; segments %.2f MB now\n",
               (double)r.bytes_freed / 1e6, (unsigned long long)r.blobs_deleted,
               (unsigned long long)r.kvpages_deleted, (unsigned long long)r.segments_removed,
               (double)r.bytes_moved / 1e6, (unsigned long long)r.segments_truncated, (double)r.bytes_before / 1e6);
    else
        printf("freed %.2f MB (segments %.2f MB -> %.2f MB): %llu unreferenced blobs and %llu KV pages deleted, "
               "%llu blobs (%.2f MB) moved, %llu segments removed, %llu trimmed, %.2f MB of holes punched, "
               "%llu busy; %.2f s\n",
               (double)r.bytes_freed / 1e6, (double)r.bytes_before / 1e6, (double)r.bytes_after / 1e6,
               (unsigned long long)r.blobs_deleted, (unsigned long long)r.kvpages_deleted,
               (unsigned long long)r.blobs_moved, (double)r.bytes_moved / 1e6,
               (unsigned long long)r.segments_removed, (unsigned long long)r.segments_truncated,
               (double)r.bytes_punched / 1e6, (unsigned long long)r.segments_busy, r.seconds);
    return LMS_EXIT_OK;
}
