/*
 * tests/loader/loader_smaps.h - reads /proc/PID/smaps to tell how much of a
 * store's segment mappings a process has resident, and whether those pages
 * are file-backed and shared (the page cache) or anonymous (a private copy).
 */
#ifndef LMS_LOADER_SMAPS_H
#define LMS_LOADER_SMAPS_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

typedef struct seg_usage {
    int mappings;               /* segment mappings found */
    unsigned long long size, rss, shared_clean, shared_dirty, private_clean, private_dirty, anonymous; /* bytes */
} seg_usage;

/* Sum the smaps fields of every mapping of a file under `store_dir`/segments/. */
static inline int seg_usage_read(pid_t pid, const char *store_dir, seg_usage *u)
{
    char path[64], line[4096], want[2048];
    memset(u, 0, sizeof *u);
    snprintf(path, sizeof path, "/proc/%d/smaps", (int)pid);
    snprintf(want, sizeof want, "%s/segments/", store_dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    bool in = false;
    while (fgets(line, sizeof line, f)) {
        unsigned long long lo, hi, kb;
        char name[64];
        if (sscanf(line, "%llx-%llx", &lo, &hi) == 2 && strchr(line, ' ')) {
            in = strstr(line, want) != NULL;
            if (in)
                u->mappings++;
            continue;
        }
        if (!in || sscanf(line, "%63[^:]: %llu kB", name, &kb) != 2)
            continue;
        kb <<= 10;
        if (!strcmp(name, "Size")) u->size += kb;
        else if (!strcmp(name, "Rss")) u->rss += kb;
        else if (!strcmp(name, "Shared_Clean")) u->shared_clean += kb;
        else if (!strcmp(name, "Shared_Dirty")) u->shared_dirty += kb;
        else if (!strcmp(name, "Private_Clean")) u->private_clean += kb;
        else if (!strcmp(name, "Private_Dirty")) u->private_dirty += kb;
        else if (!strcmp(name, "Anonymous")) u->anonymous += kb;
    }
    fclose(f);
    return 0;
}

#endif
