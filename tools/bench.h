/* tools/bench.h - the `lmstore bench` subcommands, one file each. */
#ifndef LMS_TOOLS_BENCH_H
#define LMS_TOOLS_BENCH_H
int lms_bench_load(int argc, char **argv); /* tools/bench_load.c */
int lms_bench_kv(int argc, char **argv);   /* tools/bench_kv.c */
int lms_bench_engine(int argc, char **argv); /* tools/bench_engine.c */
int lms_bench_batch(int argc, char **argv);  /* tools/bench_batch.c */
#endif
