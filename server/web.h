/* web.h - static files of the dashboard (web/), served at / and /web/. */
#ifndef LENSD_WEB_H
#define LENSD_WEB_H

#include <microhttpd.h>

/* The folder to serve, as a malloc'd realpath, or NULL (disabled or none
 * found): flag (--web-dir) when given, else /usr/share/lensd/web when it has
 * index.html, else the web/ folder beside the binary's build/ folder. */
char *web_resolve_dir(const char *flag, int disabled);

/* Is this a dashboard request (GET or HEAD of "/" or "/web/...")? */
int web_wants(const char *method, const char *path);
/* "/" or under "/web/": the dashboard's paths, whatever the method. */
int web_path(const char *path);

/* The response for path under dir (NULL dir: 404); *status is 200, 304 (ETag
 * matched if_none_match) or 404 (missing, not a regular file, or outside dir). */
struct MHD_Response *web_respond(const char *dir, const char *path, const char *if_none_match, int *status);

#endif
