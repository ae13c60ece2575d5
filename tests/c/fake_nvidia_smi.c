/* Stand-in for nvidia-smi: loads libnvidia-ml.so.1 by SONAME and asks it the driver version,
 * then lists the GPU device nodes it can see. */
#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

int main(void) {
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!nvml) {
        fprintf(stderr, "NVIDIA-SMI has failed: %s\n", dlerror());
        return 9;
    }
    int (*init)(void) = (int (*)(void))dlsym(nvml, "nvmlInit_v2");
    int (*version)(char *, unsigned int) = (int (*)(char *, unsigned int))dlsym(nvml, "nvmlSystemGetDriverVersion");
    if (!init || !version || init() != 0) {
        fprintf(stderr, "NVIDIA-SMI has failed: bad libnvidia-ml\n");
        return 9;
    }
    char buf[80];
    version(buf, sizeof buf);
    printf("NVIDIA-SMI stand-in  Driver Version: %s\n", buf);
    DIR *dev = opendir("/dev");
    struct dirent *e;
    while (dev && (e = readdir(dev))) {
        if (strncmp(e->d_name, "nvidia", 6) == 0 && e->d_name[6] >= '0' && e->d_name[6] <= '9')
            printf("GPU node /dev/%s\n", e->d_name);
    }
    if (dev) closedir(dev);
    return 0;
}
