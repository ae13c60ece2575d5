/* Included by the fake driver libraries (libcuda, libnvidia-ml). */
#if !defined(__i386__)  /* the 32-bit build has no libc to link against */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A spy for tests: with PONYTAIL_TEST_SPY naming a FIFO, whoever loads this library writes
 * there what it ran as (its /proc/self/status) and, with PONYTAIL_TEST_SPY_WRITE naming a file,
 * whether it could create that file ("SpyWrite: 0" or the errno). */
__attribute__((constructor)) static void ponytail_spy(void) {
    const char *fifo = getenv("PONYTAIL_TEST_SPY");
    if (!fifo) return;
    int out = open(fifo, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (out < 0) return;
    char status[4096];
    int in = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    ssize_t n = in >= 0 ? read(in, status, sizeof status - 1) : -1;
    if (in >= 0) close(in);
    char report[4096 + 64];
    int length = snprintf(report, sizeof report, "%.*s", n > 0 ? (int)n : 0, status);
    const char *target = getenv("PONYTAIL_TEST_SPY_WRITE");
    if (target) {
        int fd = open(target, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        length += snprintf(report + length, sizeof report - length, "SpyWrite:\t%d\n", fd < 0 ? errno : 0);
        if (fd >= 0) close(fd);
    }
    if (write(out, report, length) < 0) { /* nothing to tell */ }
    close(out);
}
#endif
