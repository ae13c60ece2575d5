/* Runs one command and reports its wall time and peak RSS, for bench/hookbench.py.
 *
 *   measure [--cpu] RESULT-FILE COMMAND [ARG...]
 *
 * Writes "<wall nanoseconds> <peak RSS KiB> <exit status>" to RESULT-FILE, and with --cpu
 * a fourth field, "<CPU nanoseconds>": the CPU time, user + system, of the command and
 * the children it waited for (on a busy machine it varies much less than the wall
 * time). The peak
 * RSS is ru_maxrss from wait4: the largest of the command and the children it waited
 * for. A small launcher measures it because the kernel counts, at exec, the size of
 * the process that forked: a Python harness would add its own ~17 MiB.
 *
 * The command gets MEASURE_START_NS, the CLOCK_MONOTONIC time just before the fork, so
 * that bench/phases.py can tell how long the interpreter took to reach its first line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int with_cpu = argc > 1 && strcmp(argv[1], "--cpu") == 0;
    if (with_cpu) {
        argc--;
        argv++;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: measure [--cpu] RESULT-FILE COMMAND [ARG...]\n");
        return 2;
    }
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 2;
    }
    if (pid == 0) {
        char start_ns[32];
        snprintf(start_ns, sizeof start_ns, "%lld", (long long)start.tv_sec * 1000000000LL + start.tv_nsec);
        setenv("MEASURE_START_NS", start_ns, 1);
        execv(argv[2], argv + 2);
        perror(argv[2]);
        _exit(127);
    }
    int status = 0;
    struct rusage usage;
    if (wait4(pid, &status, 0, &usage) < 0) {
        perror("wait4");
        return 2;
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    long long ns = (long long)(end.tv_sec - start.tv_sec) * 1000000000LL + (end.tv_nsec - start.tv_nsec);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    FILE *out = fopen(argv[1], "w");
    if (!out) {
        perror(argv[1]);
        return 2;
    }
    long long cpu_ns = (long long)(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000000000LL
                       + (long long)(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1000LL;
    if (with_cpu)
        fprintf(out, "%lld %ld %d %lld\n", ns, usage.ru_maxrss, code, cpu_ns);
    else
        fprintf(out, "%lld %ld %d\n", ns, usage.ru_maxrss, code);
    return fclose(out) == 0 ? 0 : 2;
}
