/*
 * common/progress.c - a one-line progress bar on stderr, drawn only when
 * stderr is a terminal (so logs and pipes stay clean). Updates are
 * thread-safe and redraw at most ten times a second.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

#include "common.h"

struct lms_progress {
    char label[48];
    char unit[8];
    uint64_t total;
    atomic_uint_least64_t done;
    double start, last_draw;
    pthread_mutex_t mu;
};

lms_progress *lms__progress_start(const char *label, uint64_t total, const char *unit)
{
    if (!isatty(STDERR_FILENO))
        return NULL;
    lms_progress *p = lms__calloc(1, sizeof *p);
    if (!p)
        return NULL;
    snprintf(p->label, sizeof p->label, "%s", label);
    snprintf(p->unit, sizeof p->unit, "%s", unit ? unit : "");
    p->total = total;
    p->start = lms__now();
    pthread_mutex_init(&p->mu, NULL);
    return p;
}

static void draw(lms_progress *p, uint64_t done)
{
    const int width = 30;
    double frac = p->total ? (double)done / (double)p->total : 1.0;
    double el = lms__now() - p->start;
    char bar[32];
    int fill = (int)(frac * width);
    if (fill > width) fill = width;
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[width] = '\0';
    if (p->unit[0] == 'B') { /* bytes: in the unit that suits the total */
        double u = p->total >= 1e9 ? 1e9 : p->total >= 1e6 ? 1e6 : 1e3;
        const char *un = u == 1e9 ? "GB" : u == 1e6 ? "MB" : "KB";
        fprintf(stderr, "\r%s [%s] %5.1f%% %.2f/%.2f %s %.2f %s/s ", p->label, bar, frac * 100.0, (double)done / u,
                (double)p->total / u, un, el > 0 ? (double)done / u / el : 0.0, un);
    } else
        fprintf(stderr, "\r%s [%s] %5.1f%% %llu/%llu %s ", p->label, bar, frac * 100.0,
                (unsigned long long)done, (unsigned long long)p->total, p->unit);
    fflush(stderr);
}

void lms__progress_add(lms_progress *p, uint64_t n)
{
    if (!p)
        return;
    uint64_t done = atomic_fetch_add(&p->done, n) + n;
    double now = lms__now();
    if (now - p->last_draw < 0.1 && done < p->total)
        return;
    if (pthread_mutex_trylock(&p->mu))
        return;
    p->last_draw = now;
    draw(p, done);
    pthread_mutex_unlock(&p->mu);
}

void lms__progress_done(lms_progress *p)
{
    if (!p)
        return;
    fprintf(stderr, "\r\033[K");
    fflush(stderr);
    pthread_mutex_destroy(&p->mu);
    lms__free(p);
}
