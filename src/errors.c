/* Status strings and the per-thread last-error message. */
#include "moe_backend.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MOE_ERROR_CAPACITY = 512 };

static _Thread_local char moe_last_error_message[MOE_ERROR_CAPACITY];

const char *moe_strerror(moe_status status)
{
    switch (status) {
    case MOE_OK: return "success";
    case MOE_ERR_NULL_POINTER: return "null pointer";
    case MOE_ERR_INVALID_SHAPE: return "invalid shape";
    case MOE_ERR_OVERFLOW: return "size overflow";
    case MOE_ERR_INVALID_ROUTING: return "invalid routing";
    case MOE_ERR_INVALID_DTYPE: return "invalid dtype";
    case MOE_ERR_INVALID_OPTION: return "invalid option";
    case MOE_ERR_UNSUPPORTED: return "unsupported by this backend";
    case MOE_ERR_NO_BACKEND: return "backend not available";
    case MOE_ERR_OUT_OF_MEMORY: return "out of memory";
    case MOE_ERR_DEVICE: return "device error";
    case MOE_ERR_INVALID_INDEX: return "index out of range";
    case MOE_ERR_IO: return "file error";
    case MOE_ERR_MISALIGNED: return "misaligned pointer";
    case MOE_ERR_INVALID_VALUE: return "invalid value";
    }
    return "unknown status code";
}

const char *moe_last_error(void) { return moe_last_error_message; }

void moe_clear_error(void) { moe_last_error_message[0] = '\0'; }

moe_status moe_fail_at(const char *file, int line, moe_status status, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    int used = vsnprintf(moe_last_error_message, MOE_ERROR_CAPACITY, fmt, args);
    va_end(args);
    if (used >= 0 && used < MOE_ERROR_CAPACITY && getenv("MOE_DEBUG_LOCATIONS") != NULL)
        snprintf(moe_last_error_message + used, (size_t)(MOE_ERROR_CAPACITY - used), " [%s:%d]", file,
                 line);
    return status;
}

int moe_mul_ok(int64_t a, int64_t b, int64_t *out)
{
    if (a < 0 || b < 0)
        return 0;
    if (a != 0 && b > INT64_MAX / a)
        return 0;
    *out = a * b;
    return 1;
}
