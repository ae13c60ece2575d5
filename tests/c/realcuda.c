/* Runs inside the container against NVIDIA's real libraries: dlopen("libcuda.so.1") and print
 * cuDriverGetVersion and cuInit(0) (100, no device, without a kernel module); with the word
 * "cudart", dlopen the CUDA runtime the image ships (libcudart.so.11.0, no headers needed) and
 * print what it sees: cudaDriverGetVersion, cudaRuntimeGetVersion and cudaGetDeviceCount's
 * status (100 no device; 35 would mean the driver is too old for this runtime). */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef int (*get_int)(int *);

int main(int argc, char **argv) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) {
        printf("dlopen libcuda.so.1 failed: %s\n", dlerror());
        return 2;
    }
    get_int version = (get_int)dlsym(cuda, "cuDriverGetVersion");
    int (*init)(unsigned int) = (int (*)(unsigned int))dlsym(cuda, "cuInit");
    int v = 0;
    if (!version || !init || version(&v) != 0) {
        printf("libcuda.so.1 loaded but cuDriverGetVersion failed\n");
        return 3;
    }
    printf("cuDriverGetVersion %d\n", v);
    printf("cuInit %d\n", init(0));
    if (argc > 1 && strcmp(argv[1], "cudart") == 0) {
        void *rt = dlopen("libcudart.so.11.0", RTLD_NOW);
        if (!rt) {
            printf("dlopen libcudart.so.11.0 failed: %s\n", dlerror());
            return 4;
        }
        get_int driver = (get_int)dlsym(rt, "cudaDriverGetVersion");
        get_int runtime = (get_int)dlsym(rt, "cudaRuntimeGetVersion");
        get_int count = (get_int)dlsym(rt, "cudaGetDeviceCount");
        int d = 0, r = 0, n = 0;
        if (!driver || !runtime || !count) {
            printf("libcudart.so.11.0 loaded but lacks its entry points\n");
            return 5;
        }
        int status = driver(&d);
        printf("cudaDriverGetVersion %d status %d\n", d, status);
        status = runtime(&r);
        printf("cudaRuntimeGetVersion %d status %d\n", r, status);
        printf("cudaGetDeviceCount status %d\n", count(&n));
    }
    return 0;
}
