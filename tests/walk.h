/* walk.h - the regular files under a folder, for tests that read the
 * source tree (test_layers, test_family_names). */
#ifndef LENS_TEST_WALK_H
#define LENS_TEST_WALK_H

#include <dirent.h>
#include <stdio.h>
#include <sys/stat.h>

/* Calls visit(path, ctx) for every regular file under dir, recursively,
 * skipping names that start with '.' and paths over 1023 bytes; an
 * unreadable folder visits nothing. */
static inline void walk_files(const char *dir, void (*visit)(const char *path, void *ctx), void *ctx)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[1024];
        const int n = snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (n < 0 || (size_t)n >= sizeof path || stat(path, &st)) continue;
        if (S_ISDIR(st.st_mode)) walk_files(path, visit, ctx);
        else visit(path, ctx);
    }
    closedir(d);
}

#endif
