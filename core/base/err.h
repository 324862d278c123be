/* err.h - the error model of libcore.
 *
 * A function that can fail returns 0 on success and -1 on failure, filling a
 * lens_err the caller can show to a user. The code lets api/ map a failure to
 * an HTTP status without parsing the message. No function in core/ exits. */
#ifndef LENS_ERR_H
#define LENS_ERR_H

typedef enum {
    LENS_OK = 0,
    LENS_EINVAL,   /* caller passed something invalid (bad text, bad index) */
    LENS_ENOENT,   /* file or tensor or name not found */
    LENS_EIO,      /* read/mmap failure */
    LENS_EFORMAT,  /* file exists but its content is malformed */
    LENS_ENOMEM,   /* allocation failed */
    LENS_ELIMIT,   /* input over a limit (sequence too long, ...) */
    LENS_ECANCEL   /* computation cancelled by the caller */
} lens_status;

typedef struct {
    lens_status code;
    char msg[512];
} lens_err;

/* Fill err (may be NULL) with code and a printf-style message; returns -1 so
 * that error paths read `return lens_fail(err, LENS_EFORMAT, "...", ...);`. */
int lens_fail(lens_err *err, lens_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

const char *lens_status_name(lens_status code);

/* A cancel flag (a deadline watchdog or DELETE /v1/jobs sets it while a
 * worker computes) is read and written only through these: relaxed atomic
 * loads and stores, so the flag is not a data race (C11 5.1.2.4; make
 * test-tsan) and still costs a plain load per check. flag may be NULL. */
static inline int lens_cancelled(const volatile int *flag)
{
    return flag && __atomic_load_n(flag, __ATOMIC_RELAXED);
}
static inline void lens_cancel_set(volatile int *flag, int value)
{
    __atomic_store_n(flag, value, __ATOMIC_RELAXED);
}

#endif
