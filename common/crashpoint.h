/*
 * common/crashpoint.h - named crash points for the crash-safety tests.
 *
 * Writers call lms__crashpoint("name") at each step whose interruption
 * matters: before and after a segment write, before and after an fsync,
 * before and after an LMDB commit, before an unlink. In a normal run the call
 * is one relaxed load and a branch. A test arms it through the environment
 * of a child process, so that the child kills itself with SIGKILL at exactly
 * its Nth crash point: deterministic coverage of every interruption point,
 * where a timer-driven kill -9 only samples them.
 *
 *   LMS_CRASH_AT=N       SIGKILL the process at its Nth crash point (1-based)
 *   LMS_CRASH_STOP=N     SIGSTOP the process at its Nth crash point, so that
 *                        a test can act while it waits there (rewrite a
 *                        source, delete a lock file), then SIGCONT it
 *   LMS_CRASH_MATCH=STR  count only points whose name contains STR
 *   LMS_CRASH_COUNT=1    at exit, print "lms-crashpoints: N" to stderr
 *                        (how many points the run passed: the range of N)
 *
 * Killing (or stopping) the process is the whole purpose of this hook, so it
 * is the one place in the library that ends the process; it does so only
 * when a test asked for it through LMS_CRASH_AT (LMS_CRASH_STOP).
 */
#ifndef LMS_CRASHPOINT_H
#define LMS_CRASHPOINT_H

#ifdef __cplusplus
extern "C" {
#endif

/* Count one crash point named `name`; SIGKILL the process if it is the one
 * LMS_CRASH_AT asked for. Thread-safe. */
void lms__crashpoint(const char *name);

/* Crash points counted so far in this process (those LMS_CRASH_MATCH
 * selects). */
long lms__crashpoint_count(void);

#ifdef __cplusplus
}
#endif
#endif
