/*
 * tools/cmd_gc.c - `lmstore gc [--dry-run] [--json]`: reclaim unreferenced
 * blobs, bytes crashed imports left, and sparse segments; report the disk
 * space given back (or that would be: truncated and removed segments and
 * holes punched inside kept ones) and which segments another process kept
 * busy.
 */
#include <stdio.h>

#include "lmstore/store.h"
#include "tools/cli.h"

const char lms_cmd_gc_help[] = "give unused space back: gc [--dry-run] [--json] [--compact-below FRACTION]";

static void on_busy(void *ctx, uint32_t segment, const char *path)
{
    if (*(bool *)ctx) /* --json: the count is in the report */
        fprintf(stderr, "busy: segment %u (%s) is mapped by another process or an open snapshot; left as is\n",
                segment, path);
    else
        printf("busy: segment %u (%s) is mapped by another process or an open snapshot; left as is\n", segment,
               path);
}

static void print_json(const lms_gc_report *r, bool dry)
{
    printf("{\"dry_run\": %s, \"bytes_freed\": %llu, \"bytes_punched\": %llu, \"bytes_before\": %llu, "
           "\"bytes_after\": %llu, \"blobs_deleted\": %llu, \"kvpages_deleted\": %llu, \"blobs_moved\": %llu, "
           "\"bytes_moved\": %llu, \"segments_removed\": %llu, \"segments_truncated\": %llu, "
           "\"segments_busy\": %llu, \"seconds\": %.3f}\n",
           dry ? "true" : "false", (unsigned long long)r->bytes_freed, (unsigned long long)r->bytes_punched,
           (unsigned long long)r->bytes_before, (unsigned long long)r->bytes_after,
           (unsigned long long)r->blobs_deleted, (unsigned long long)r->kvpages_deleted,
           (unsigned long long)r->blobs_moved, (unsigned long long)r->bytes_moved,
           (unsigned long long)r->segments_removed, (unsigned long long)r->segments_truncated,
           (unsigned long long)r->segments_busy, r->seconds);
}

int lms_cmd_gc(int argc, char **argv)
{
    const char *store_opt = NULL, *below = NULL, *grace = NULL;
    lms_gc_params gp = lms_gc_default_params();
    bool json = false;
    for (int i = 1; i < argc;) {
        if (lms_cli_end_of_options(argv, &i))
            continue;
        if (lms_cli_opt(argc, argv, &i, "--store", &store_opt) ||
            lms_cli_opt(argc, argv, &i, "--compact-below", &below) || lms_cli_opt(argc, argv, &i, "--grace", &grace))
            continue;
        if (lms_cli_flag(argv, i, "--dry-run") || lms_cli_flag(argv, i, "-n")) {
            gp.dry_run = true;
        } else if (lms_cli_flag(argv, i, "--json")) {
            json = true;
        } else if (lms_cli_flag(argv, i, "--help") || lms_cli_flag(argv, i, "-h")) {
            printf("usage: lmstore gc [--store DIR] [--dry-run] [--json] [--compact-below F] [--grace SECONDS]\n\n"
                   "Deletes blobs no model references and KV pages no session references,\n"
                   "copies the live blobs of segments less than F live (default 0.5) into new\n"
                   "space, trims bytes no record reaches, punches holes where dead bytes lie\n"
                   "between live ones, and unlinks empty segments. A segment another process has\n"
                   "mapped is skipped and named. It reports the disk space given back (shrunk\n"
                   "and removed files plus punched holes). --dry-run only reports.\n"
                   "--json     print the report as one JSON object\n"
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
    rc = lms_store_gc(s, &gp, on_busy, &json, &r);
    lms_store_close(s);
    if (rc)
        return lms_cli_fail("gc", rc, NULL);
    if (json)
        print_json(&r, gp.dry_run);
    else if (gp.dry_run)
        printf("would free %.2f MB (%.2f MB of it as holes punched in kept segments): %llu unreferenced blobs, "
               "%llu unreferenced KV pages, %llu segments to remove (%.2f MB of live blobs to move), %llu to trim; "
               "segment files %.2f MB now\n",
               (double)r.bytes_freed / 1e6, (double)r.bytes_punched / 1e6, (unsigned long long)r.blobs_deleted,
               (unsigned long long)r.kvpages_deleted, (unsigned long long)r.segments_removed,
               (double)r.bytes_moved / 1e6, (unsigned long long)r.segments_truncated, (double)r.bytes_before / 1e6);
    else
        printf("freed %.2f MB (segment files %.2f MB -> %.2f MB, and %.2f MB of holes punched): %llu unreferenced "
               "blobs and %llu KV pages deleted, %llu blobs (%.2f MB) moved, %llu segments removed, %llu trimmed, "
               "%llu busy; %.2f s\n",
               (double)r.bytes_freed / 1e6, (double)r.bytes_before / 1e6, (double)r.bytes_after / 1e6,
               (double)r.bytes_punched / 1e6, (unsigned long long)r.blobs_deleted,
               (unsigned long long)r.kvpages_deleted, (unsigned long long)r.blobs_moved,
               (double)r.bytes_moved / 1e6, (unsigned long long)r.segments_removed,
               (unsigned long long)r.segments_truncated, (unsigned long long)r.segments_busy, r.seconds);
    return LMS_EXIT_OK;
}
