/* mapmany COUNT: map a deleted file merely named libcuda.so.1 (not the driver's), then one file
   under a path of about 3,800 characters COUNT times (each its own mapping), write
   /dev/shm/ready and sleep: a container whose /proc/<pid>/maps is as long as it likes. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv) {
    long count = argc > 1 ? atol(argv[1]) : 0;
    int fd = open("/dev/shm/libcuda.so.1", O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ftruncate(fd, 4096) != 0 || mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, fd, 0) == MAP_FAILED) {
        perror("libcuda.so.1");
        return 1;
    }
    close(fd);
    unlink("/dev/shm/libcuda.so.1");
    char path[4096] = "/dev/shm";
    char name[251];
    memset(name, 'd', 250);
    name[250] = '\0';
    for (int i = 0; i < 15; i++) {
        strcat(path, "/");
        strcat(path, name);
        mkdir(path, 0755);
    }
    strcat(path, "/f");
    fd = open(path, O_RDWR | O_CREAT, 0644);
    if (fd < 0 || ftruncate(fd, 4096) != 0) {
        perror("long path");
        return 1;
    }
    for (long i = 0; i < count; i++) {
        if (mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, fd, 0) == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
    }
    close(open("/dev/shm/ready", O_WRONLY | O_CREAT, 0644));
    for (;;)
        pause();
}
