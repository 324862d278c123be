/* file.h - reading whole files for the io layer (tokenizer files, training
 * text, shard partials). */
#ifndef LENS_FILE_H
#define LENS_FILE_H

#include <stddef.h>

#include "core/base/err.h"

/* The whole file, NUL-terminated (so text can be parsed in place); *len
 * excludes the NUL. NULL with err: LENS_ENOENT, LENS_EIO or LENS_ENOMEM. */
char *lens_file_read(const char *path, size_t *len, lens_err *err);

#endif
