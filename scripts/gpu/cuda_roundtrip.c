/* A real CUDA driver call sequence through libcuda.so.1, loaded with dlopen (no CUDA
 * headers or toolkit needed): cuInit, cuDeviceGetCount, cuDeviceGetName, a context,
 * cuMemAlloc, a host -> device -> host copy round trip, checked byte for byte.
 * Built on the machine that runs it (scripts/gpu_check.py), against its own libc. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

static void *cuda;

static void *sym(const char *name) {
    void *f = dlsym(cuda, name);
    if (!f) { printf("FAIL symbol %s missing from libcuda.so.1\n", name); }
    return f;
}

#define CHECK(call, what) do { CUresult r_ = (call); if (r_ != 0) { printf("FAIL %s: CUresult %d\n", what, r_); return 1; } } while (0)

int main(void) {
    cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) { printf("FAIL dlopen libcuda.so.1: %s\n", dlerror()); return 1; }
    CUresult (*cuInit)(unsigned) = sym("cuInit");
    CUresult (*cuDriverGetVersion)(int *) = sym("cuDriverGetVersion");
    CUresult (*cuDeviceGetCount)(int *) = sym("cuDeviceGetCount");
    CUresult (*cuDeviceGet)(CUdevice *, int) = sym("cuDeviceGet");
    CUresult (*cuDeviceGetName)(char *, int, CUdevice) = sym("cuDeviceGetName");
    CUresult (*cuCtxCreate)(CUcontext *, unsigned, CUdevice) = sym("cuCtxCreate_v2");
    CUresult (*cuCtxDestroy)(CUcontext) = sym("cuCtxDestroy_v2");
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = sym("cuMemAlloc_v2");
    CUresult (*cuMemFree)(CUdeviceptr) = sym("cuMemFree_v2");
    CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t) = sym("cuMemcpyHtoD_v2");
    CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t) = sym("cuMemcpyDtoH_v2");
    if (!cuInit || !cuDriverGetVersion || !cuDeviceGetCount || !cuDeviceGet || !cuDeviceGetName || !cuCtxCreate ||
        !cuCtxDestroy || !cuMemAlloc || !cuMemFree || !cuMemcpyHtoD || !cuMemcpyDtoH)
        return 1;

    int version = 0, count = 0;
    CHECK(cuInit(0), "cuInit");
    CHECK(cuDriverGetVersion(&version), "cuDriverGetVersion");
    CHECK(cuDeviceGetCount(&count), "cuDeviceGetCount");
    if (count < 1) { printf("FAIL cuDeviceGetCount: %d devices\n", count); return 1; }
    CUdevice device;
    char name[256] = {0};
    CHECK(cuDeviceGet(&device, 0), "cuDeviceGet");
    CHECK(cuDeviceGetName(name, sizeof name, device), "cuDeviceGetName");
    CUcontext context;
    CHECK(cuCtxCreate(&context, 0, device), "cuCtxCreate");
    enum { SIZE = 1 << 20 };
    static unsigned char out[SIZE], back[SIZE];
    for (int i = 0; i < SIZE; i++) out[i] = (unsigned char)(i * 7 + 3);
    CUdeviceptr buffer;
    CHECK(cuMemAlloc(&buffer, SIZE), "cuMemAlloc");
    CHECK(cuMemcpyHtoD(buffer, out, SIZE), "cuMemcpyHtoD");
    CHECK(cuMemcpyDtoH(back, buffer, SIZE), "cuMemcpyDtoH");
    int same = memcmp(out, back, SIZE) == 0;
    CHECK(cuMemFree(buffer), "cuMemFree");
    CHECK(cuCtxDestroy(context), "cuCtxDestroy");
    if (!same) { printf("FAIL copy round trip: the bytes that came back differ\n"); return 1; }
    printf("OK cuda %d.%d, %d device(s), device 0 %s, 1 MiB host->device->host round trip identical\n",
           version / 1000, (version % 1000) / 10, count, name);
    return 0;
}
