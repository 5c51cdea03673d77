/* tools/bench.h - the `lmstore bench` subcommands, one file each. */
#ifndef LMS_TOOLS_BENCH_H
#define LMS_TOOLS_BENCH_H
#include <stdbool.h>
int lms_bench_load(int argc, char **argv); /* tools/bench_load.c */
int lms_bench_kv(int argc, char **argv);   /* tools/bench_kv.c */
int lms_bench_engine(int argc, char **argv); /* tools/bench_engine.c */
int lms_bench_batch(int argc, char **argv);  /* tools/bench_batch.c */
/* The median of v[0, n) (sorts v; n > 0). tools/bench_engine.c */
double lms_bench_median(double *v, int n);
struct lms_store;
struct lms_device;
/* The store of --store (read-only unless writable) and the device named by
 * --device (*dev NULL for none or "cpu"); failures are reported as CMD's.
 * LMS_OK or the error code; *st and *dev are NULL on failure, else the
 * caller's to close. tools/bench_engine.c */
int lms_bench_open(const char *cmd, const char *store_opt, bool writable, const char *devname, struct lms_store **st,
                   struct lms_device **dev);
#endif
