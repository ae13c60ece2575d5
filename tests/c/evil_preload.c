/* A library an attacker wants some host process to load (LD_PRELOAD, LD_LIBRARY_PATH,
 * /etc/ld.so.preload). If anything ever loads it, its constructor leaves a marker next to
 * itself: "<path of this library>.ran", holding the name of the program that loaded it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

__attribute__((constructor)) static void leave_marker(void) {
    Dl_info info;
    if (!dladdr((void *)leave_marker, &info) || !info.dli_fname)
        return;
    char marker[4096], exe[4096] = "?";
    snprintf(marker, sizeof marker, "%s.ran", info.dli_fname);
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0)
        exe[n] = '\0';
    int fd = open(marker, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
        dprintf(fd, "%s\n", exe);
        close(fd);
    }
}
