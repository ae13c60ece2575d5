/* at_pid PID CGROUP_PROCS: start a process with the pid PID (clone3's set_tid: that pid must be
 * free, the caller root), which moves itself into the cgroup whose cgroup.procs file is
 * CGROUP_PROCS and then sleeps. Prints the pid and exits: the sleeper is left running (kill it
 * by its pid). What a reused pid looks like to ponytail guard: another process in another cgroup. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: at_pid PID CGROUP_PROCS\n");
        return 2;
    }
    pid_t want = (pid_t)atoi(argv[1]);
    struct clone_args args;
    memset(&args, 0, sizeof args);
    args.exit_signal = SIGCHLD;
    args.set_tid = (uint64_t)(uintptr_t)&want;
    args.set_tid_size = 1;
    int ready[2];
    if (pipe(ready) != 0) {
        perror("pipe");
        return 1;
    }
    long pid = syscall(SYS_clone3, &args, sizeof args);
    if (pid < 0) {
        fprintf(stderr, "clone3 with pid %d: %s\n", want, strerror(errno));
        return 1;
    }
    if (pid == 0) {
        close(ready[0]);
        int null = open("/dev/null", O_RDWR);  /* before the move: that cgroup may deny every device */
        int fd = open(argv[2], O_WRONLY);
        if (null < 0 || fd < 0 || write(fd, "0", 1) != 1) {
            perror(argv[2]);
            _exit(1);
        }
        close(fd);
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
        if (write(ready[1], "x", 1) != 1)
            _exit(1);
        close(ready[1]);
        setsid();
        execl("/bin/sleep", "sleep", "600", (char *)NULL);
        _exit(1);
    }
    close(ready[1]);
    char c;
    if (read(ready[0], &c, 1) != 1) {
        int status;
        waitpid((pid_t)pid, &status, 0);
        fprintf(stderr, "the process at pid %ld did not move into %s\n", pid, argv[2]);
        return 1;
    }
    printf("%ld\n", pid);
    return 0;
}
