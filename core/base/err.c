/* err.c - filling lens_err. */
#include "core/base/err.h"

#include <stdarg.h>
#include <stdio.h>

int lens_fail(lens_err *err, lens_status code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

const char *lens_status_name(lens_status code)
{
    switch (code) {
    case LENS_OK: return "ok";
    case LENS_EINVAL: return "invalid";
    case LENS_ENOENT: return "not_found";
    case LENS_EIO: return "io_error";
    case LENS_EFORMAT: return "bad_format";
    case LENS_ENOMEM: return "out_of_memory";
    case LENS_ELIMIT: return "over_limit";
    case LENS_ECANCEL: return "cancelled";
    }
    return "unknown";
}
