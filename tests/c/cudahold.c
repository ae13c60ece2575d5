/* Load libcuda.so.1 (as a CUDA program does), say so, and keep it mapped until killed:
   a running GPU job for ponytail guard's stale-driver check. */
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

int main(void) {
    void *handle = dlopen("libcuda.so.1", RTLD_NOW);
    if (handle == NULL) {
        printf("dlopen libcuda.so.1: %s\n", dlerror());
        return 1;
    }
    printf("libcuda.so.1 loaded\n");
    fflush(stdout);
    for (;;)
        pause();
}
