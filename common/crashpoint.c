/*
 * common/crashpoint.c - see crashpoint.h: SIGKILL at the Nth named crash
 * point when a test asks for it through LMS_CRASH_AT.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/crashpoint.h"

static pthread_once_t crash_once = PTHREAD_ONCE_INIT;
static long crash_at;           /* 0 = never */
static long stop_at;            /* 0 = never */
static const char *crash_match; /* NULL = every point */
static atomic_long crash_count;

static void crash_report(void)
{
    fprintf(stderr, "lms-crashpoints: %ld\n", atomic_load(&crash_count));
}

static void crash_init(void)
{
    const char *s = getenv("LMS_CRASH_AT");
    if (s && *s)
        crash_at = strtol(s, NULL, 10);
    s = getenv("LMS_CRASH_STOP");
    if (s && *s)
        stop_at = strtol(s, NULL, 10);
    s = getenv("LMS_CRASH_MATCH");
    if (s && *s)
        crash_match = s;
    s = getenv("LMS_CRASH_COUNT");
    if (s && *s && strcmp(s, "0") != 0)
        atexit(crash_report);
}

void lms__crashpoint(const char *name)
{
    pthread_once(&crash_once, crash_init);
    if (crash_match && !strstr(name, crash_match))
        return;
    long n = atomic_fetch_add(&crash_count, 1) + 1;
    if (stop_at > 0 && n == stop_at) {
        /* the test acts while we wait here, then sends SIGCONT */
        if (getenv("LMS_CRASH_VERBOSE"))
            fprintf(stderr, "lms-crashpoint: stopped at %ld (%s)\n", n, name);
        raise(SIGSTOP);
    }
    if (crash_at > 0 && n == crash_at) {
        if (getenv("LMS_CRASH_VERBOSE"))
            fprintf(stderr, "lms-crashpoint: killed at %ld (%s)\n", n, name);
        kill(getpid(), SIGKILL);
        /* SIGKILL cannot be caught; wait for it to land */
        for (;;)
            pause();
    }
}

long lms__crashpoint_count(void)
{
    return atomic_load(&crash_count);
}
