/*
 * fuzz_common.h: what the libFuzzer targets share: the input as a file. The readers under
 * test take a path, so each input is written into one memfd (no disk traffic) and opened
 * through /proc/self/fd/N.
 */
#ifndef GDP_FUZZ_COMMON_H
#define GDP_FUZZ_COMMON_H

#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* The path of a file holding exactly data[0, size); NULL if the memfd cannot be made. */
static inline const char *fuzz_input_file(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("gdp-fuzz-input", MFD_CLOEXEC);
        if (fd < 0)
            return NULL;
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0)
        return NULL;
    for (size_t done = 0; done < size;) {
        ssize_t k = pwrite(fd, data + done, size - done, (off_t)done);
        if (k <= 0)
            return NULL;
        done += (size_t)k;
    }
    return path;
}

#endif /* GDP_FUZZ_COMMON_H */
