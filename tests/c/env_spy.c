/* Stands in for the host's ldconfig in tests: records the environment and arguments it was
 * started with in "<path of this program>.env", then execs the real ldconfig (REAL_LDCONFIG)
 * with the same arguments. Dynamically linked, so LD_PRELOAD and friends would take effect. */
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

extern char **environ;

int main(int argc, char **argv) {
    char self[4096], record[4200];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return 111;
    self[n] = '\0';
    snprintf(record, sizeof record, "%s.env", self);
    int fd = open(record, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0)
        return 112;
    for (char **e = environ; *e; e++)
        dprintf(fd, "env %s\n", *e);
    for (int i = 0; i < argc; i++)
        dprintf(fd, "arg %s\n", argv[i]);
    close(fd);
    execv(REAL_LDCONFIG, argv);
    return 113;
}
