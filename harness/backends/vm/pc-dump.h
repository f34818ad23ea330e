/* pc-dump.c: the recovered tree written for the host's content oracle. */
#ifndef PC_DUMP_H
#define PC_DUMP_H
#include <stdint.h>

/* Walk ROOT and write its dump to FD at START (at most LENGTH bytes, then
 * flushed); -1 if it did not fit or could not be written. */
int dump_tree(const char *root, int fd, uint64_t start, uint64_t length);

#endif
