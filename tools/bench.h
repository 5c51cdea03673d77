/* tools/bench.h - the `lmstore bench` subcommands, one file each. */
#ifndef LMS_TOOLS_BENCH_H
#define LMS_TOOLS_BENCH_H
int lms_bench_load(int argc, char **argv); /* tools/bench_load.c */
int lms_bench_kv(int argc, char **argv);   /* tools/bench_kv.c */
int lms_bench_engine(int argc, char **argv); /* tools/bench_engine.c */
int lms_bench_batch(int argc, char **argv);  /* tools/bench_batch.c */
/* The median of v[0, n) (sorts v; n > 0). tools/bench_engine.c */
double lms_bench_median(double *v, int n);
#endif
