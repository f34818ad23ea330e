/* pc_die: the executor's one way out on a fatal error, in a unit of its own
 * so that every other unit depends on it and it depends on none of them. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "pcexec.h"

_Noreturn void pc_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("pc-exec: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}
