/* Included by the fake driver libraries (libcuda, libnvidia-ml). */
#if !defined(__i386__)  /* the 32-bit build has no libc to link against */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A spy for tests: with PONYTAIL_TEST_SPY naming a FIFO, whoever loads this library writes
 * there what it ran as (its /proc/self/status) and, with PONYTAIL_TEST_SPY_WRITE naming a file,
 * whether it could create that file ("SpyWrite: 0" or the errno), and every descriptor it found
 * open but its own and stdin/stdout/stderr ("SpyFds: 3:f:r 4:p:w", type f regular, p pipe, s socket,
 * d directory, o other; access r, w or rw), after trying to write a forged log line into each one
 * that is not a pipe ("SpyForged: 3" where that worked). */
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
    length += snprintf(report + length, sizeof report - length, "SpyFds:\t");
    char forged[512] = "";
    size_t forged_length = 0;
    for (int fd = 3; fd < 65536 && length < (int)sizeof report - 64; fd++) {
        if (fd == out) continue;
        int flags = fcntl(fd, F_GETFL);
        if (flags < 0) continue;
        struct stat st;
        char type = 'o';
        if (fstat(fd, &st) == 0)
            type = S_ISREG(st.st_mode) ? 'f' : S_ISFIFO(st.st_mode) ? 'p' : S_ISSOCK(st.st_mode) ? 's' : S_ISDIR(st.st_mode) ? 'd' : 'o';
        int access = flags & O_ACCMODE;
        length += snprintf(report + length, sizeof report - length, "%d:%c:%s ", fd, type,
                           access == O_RDONLY ? "r" : access == O_WRONLY ? "w" : "rw");
        if (type != 'p') {
            static const char line[] = "2000-01-01T00:00:00Z ponytail[1] info container=forged by driver code\n";
            if (write(fd, line, sizeof line - 1) > 0 && forged_length < sizeof forged - 16)
                forged_length += snprintf(forged + forged_length, sizeof forged - forged_length, "%d ", fd);
        }
    }
    length += snprintf(report + length, sizeof report - length, "\nSpyForged:\t%s\n", forged);
    if (write(out, report, length) < 0) { /* nothing to tell */ }
    close(out);
}
#endif
