/* Stands in for a hostile process racing the hook: swaps each pair of paths given on the command
 * line (a real directory and a symlink pointing out of the rootfs) with renameat2(RENAME_EXCHANGE),
 * over and over, until it is killed. Each swap is atomic: at every moment one name is a
 * directory and the other a symlink. Prints the number of swaps on SIGTERM. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

static volatile sig_atomic_t stop;
static void on_term(int sig) { (void)sig; stop = 1; }

int main(int argc, char **argv) {
    if (argc < 3 || argc % 2 == 0) {
        fprintf(stderr, "usage: swapper A B [A B ...]\n");
        return 2;
    }
    signal(SIGTERM, on_term);
    unsigned long swaps = 0;
    while (!stop) {
        for (int i = 1; i + 1 < argc; i += 2) {
            if (syscall(SYS_renameat2, AT_FDCWD, argv[i], AT_FDCWD, argv[i + 1], RENAME_EXCHANGE) == 0)
                swaps++;
        }
    }
    printf("%lu\n", swaps);
    return 0;
}
