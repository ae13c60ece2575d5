/* Runs inside the container: dlopen("libcuda.so.1") with no LD_LIBRARY_PATH, call into it,
 * then try to open each device node given on the command line and report the errno name
 * (ENXIO means visible and allowed: there is no real GPU behind the node). */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char *errname(int e) {
    switch (e) {
    case 0: return "OK";
    case ENXIO: return "ENXIO";
    case EPERM: return "EPERM";
    case ENOENT: return "ENOENT";
    case EACCES: return "EACCES";
    case ENODEV: return "ENODEV";
    default: return strerror(e);
    }
}

int main(int argc, char **argv) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) {
        printf("dlopen libcuda.so.1 failed: %s\n", dlerror());
        return 2;
    }
    int (*get_version)(int *) = (int (*)(int *))dlsym(cuda, "cuDriverGetVersion");
    int (*init)(unsigned int) = (int (*)(unsigned int))dlsym(cuda, "cuInit");
    int version = 0;
    if (!get_version || !init || init(0) != 0 || get_version(&version) != 0) {
        printf("libcuda.so.1 loaded but its entry points failed\n");
        return 3;
    }
    printf("cuDriverGetVersion %d\n", version);
    for (int i = 1; i < argc; i++) {
        int fd = open(argv[i], O_RDWR);
        printf("open %s %s\n", argv[i], errname(fd >= 0 ? 0 : errno));
        if (fd >= 0) close(fd);
    }
    return 0;
}
