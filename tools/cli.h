/*
 * tools/cli.h - shared pieces of the lmstore CLI: the command table entry,
 * option parsing helpers, store location, and turning library error codes
 * into messages and exit statuses.
 *
 * Each subcommand lives in tools/cmd_NAME.c and defines
 *   int lms_cmd_NAME(int argc, char **argv);   argv[0] is the subcommand name
 *   const char lms_cmd_NAME_help[];            one line for `lmstore help`
 * CMake finds the files and generates the table; nothing else to register.
 */
#ifndef LMS_CLI_H
#define LMS_CLI_H

#include <stdbool.h>
#include <stdint.h>

/* Exit statuses. */
enum { LMS_EXIT_OK = 0, LMS_EXIT_FAIL = 1, LMS_EXIT_USAGE = 2 };

/*
 * Store folder: the command's --store argument if given, else the global one
 * (`lmstore --store DIR CMD`, lms_cli_set_store), else $LMSTORE_HOME, else
 * $XDG_DATA_HOME/lmstore, else ~/.local/share/lmstore. Static buffer.
 */
const char *lms_cli_store_path(const char *opt);
void lms_cli_set_store(const char *dir);
/* Whether the store was named with --store (before or after the command). */
bool lms_cli_store_explicit(const char *opt);

/* An absent folder, or an empty one. */
bool lms_cli_nothing_at(const char *path);

struct lms_store;
/*
 * Open the store read-only for a listing (ls, kv ls). The default store
 * (no --store) that does not exist yet, or is an empty folder, holds
 * nothing: *st is NULL and the result LMS_EXIT_OK, as `ollama ls` on a new
 * machine. Anything else that is not a store is an error: printed,
 * LMS_EXIT_FAIL.
 */
int lms_cli_store_open_list(const char *cmd, const char *opt, struct lms_store **st);

/* Print "lmstore CMD: error: <what>: <lms_last_error() or strerror>" and
 * return LMS_EXIT_FAIL. <what> is left out when the detail names it already. */
int lms_cli_fail(const char *cmd, int code, const char *what);
/* The command line of the command being run and its help (tools/main.c). */
void lms_cli_set_help(int (*help)(void), int argc, char **argv);
/* Print "lmstore CMD: <message>" and the usage hint; return LMS_EXIT_USAGE.
 * When the command line asks for help (-h or --help before any "--"), the
 * command's help is shown instead and the program exits with its status. */
int lms_cli_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * "--" ends the options: every argument after it is an operand, also one
 * that begins with '-' (a model or session name an older lmstore let
 * someone create). Each option loop starts with
 *     if (lms_cli_end_of_options(argv, &i)) continue;
 * which skips a first "--" and returns true; from then on lms_cli_opt and
 * lms_cli_flag match nothing and lms_cli_is_option is false.
 */
bool lms_cli_end_of_options(char **argv, int *i);
/* An option (not after "--", begins with '-', not "-" alone). */
bool lms_cli_is_option(const char *arg);

/* Option helpers: match "--name VALUE" or "--name=VALUE" at argv[*i];
 * on a match advance *i past it, set *val and return true. */
bool lms_cli_opt(int argc, char **argv, int *i, const char *name, const char **val);
bool lms_cli_flag(char **argv, int i, const char *name);
/* Parse integers and floats fully; false on junk or overflow. */
bool lms_cli_parse_i64(const char *s, int64_t *out);
bool lms_cli_parse_f64(const char *s, double *out);
/* Parse a size like 4096, 64K, 1M, 2G. */
bool lms_cli_parse_size(const char *s, uint64_t *out);
/* Byte counts and parameter counts for people: "269.03 MB", "0 B";
 * "134.5M", "1.54B". */
void lms_cli_human_bytes(double bytes, char *out, size_t n);
void lms_cli_human_count(uint64_t count, char *out, size_t n);
/* A tensor of a multimodal checkpoint's vision part (tower, projector): stored
 * with the model, not run by the engine (ls and info say so). */
bool lms_cli_vision_tensor(const char *name);

/*
 * `lmstore CMD MODEL NEWNAME [--store DIR]` (cp, mv): parse the arguments,
 * open the store read-write, run op(store, MODEL, NEWNAME) and print
 * "<done> MODEL -> NEWNAME". Returns the exit status.
 */
int lms_cli_model_pair(const char *cmd, int argc, char **argv,
                       int (*op)(struct lms_store *s, const char *src, const char *dst), const char *done);

#endif
