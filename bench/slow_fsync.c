/* LD_PRELOAD shim for scripts/bench.sh writes: delays every fsync/fdatasync/sync_file_range by
 * SLOW_FSYNC_US microseconds (default 2000), the way a network block volume (a cloud disk, a Ceph
 * RBD) makes each flush wait for a round trip, so the benchmark shows what a flush costs there. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>
#include <time.h>

static void delay(void) {
    const char *text = getenv("SLOW_FSYNC_US");
    long us = text ? atol(text) : 2000;
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    delay();
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    delay();
    return real(fd);
}

int sync_file_range(int fd, off64_t offset, off64_t nbytes, unsigned int flags) {
    static int (*real)(int, off64_t, off64_t, unsigned int);
    if (!real) real = (int (*)(int, off64_t, off64_t, unsigned int))dlsym(RTLD_NEXT, "sync_file_range");
    delay();
    return real(fd, offset, nbytes, flags);
}
