/* Stand-in for the driver's libnvidia-ml (NVML): the driver version for nvidia-smi, and
 * the device and MIG queries ponytail makes to resolve MIG UUIDs. The devices come from a
 * table file whose path is compiled in (NVML_TABLE): lines "gpu MINOR MIGMODE" and
 * "mig MINOR GI CI UUID". */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#ifndef DRIVER_VERSION
#define DRIVER_VERSION "0.0"
#endif
#ifndef NVML_TABLE
#define NVML_TABLE "/nonexistent"
#endif

enum { OK = 0, INVALID = 2, NOT_FOUND = 6 };
static struct { unsigned minor, mig; } gpus[64];
static struct { unsigned minor, gi, ci; char uuid[96]; } migs[256];
static unsigned ngpus, nmigs;

static void load(void) {
    FILE *f = fopen(NVML_TABLE, "r");
    char line[256];
    ngpus = nmigs = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (ngpus < 64 && sscanf(line, "gpu %u %u", &gpus[ngpus].minor, &gpus[ngpus].mig) == 2) ngpus++;
        else if (nmigs < 256 && sscanf(line, "mig %u %u %u %95s", &migs[nmigs].minor, &migs[nmigs].gi, &migs[nmigs].ci, migs[nmigs].uuid) == 4) nmigs++;
    }
    if (f) fclose(f);
}

/* handles: 0x1000 + gpu index, 0x100000 + mig index */
static int gpu_of(void *h) { uintptr_t v = (uintptr_t)h; return v >= 0x1000 && v < 0x1000 + ngpus ? (int)(v - 0x1000) : -1; }
static int mig_of(void *h) { uintptr_t v = (uintptr_t)h; return v >= 0x100000 && v < 0x100000 + nmigs ? (int)(v - 0x100000) : -1; }

int nvmlInit_v2(void) { load(); return OK; }
int nvmlInitWithFlags(unsigned int flags) { (void)flags; load(); return OK; }
int nvmlShutdown(void) { return OK; }
const char *nvmlErrorString(int r) { return r == NOT_FOUND ? "Not Found" : r ? "Invalid Argument" : "Success"; }

int nvmlSystemGetDriverVersion(char *buf, unsigned int len) {
    snprintf(buf, len, "%s", DRIVER_VERSION);
    return OK;
}

int nvmlDeviceGetCount_v2(unsigned int *n) { *n = ngpus; return OK; }

int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h) {
    if (i >= ngpus) return INVALID;
    *h = (void *)(uintptr_t)(0x1000 + i);
    return OK;
}

int nvmlDeviceGetMinorNumber(void *h, unsigned int *minor) {
    int g = gpu_of(h);
    if (g < 0) return INVALID;
    *minor = gpus[g].minor;
    return OK;
}

int nvmlDeviceGetMigMode(void *h, unsigned int *current, unsigned int *pending) {
    int g = gpu_of(h);
    if (g < 0) return INVALID;
    *current = *pending = gpus[g].mig;
    return OK;
}

int nvmlDeviceGetMaxMigDeviceCount(void *h, unsigned int *count) {
    if (gpu_of(h) < 0) return INVALID;
    *count = 7;
    return OK;
}

int nvmlDeviceGetMigDeviceHandleByIndex(void *h, unsigned int k, void **out) {
    int g = gpu_of(h);
    if (g < 0) return INVALID;
    for (unsigned i = 0, seen = 0; i < nmigs; i++) {
        if (migs[i].minor == gpus[g].minor && seen++ == k) {
            *out = (void *)(uintptr_t)(0x100000 + i);
            return OK;
        }
    }
    return NOT_FOUND;
}

int nvmlDeviceGetUUID(void *h, char *buf, unsigned int len) {
    int m = mig_of(h);
    if (m < 0) return INVALID;
    snprintf(buf, len, "%s", migs[m].uuid);
    return OK;
}

int nvmlDeviceGetGpuInstanceId(void *h, unsigned int *id) {
    int m = mig_of(h);
    if (m < 0) return INVALID;
    *id = migs[m].gi;
    return OK;
}

int nvmlDeviceGetComputeInstanceId(void *h, unsigned int *id) {
    int m = mig_of(h);
    if (m < 0) return INVALID;
    *id = migs[m].ci;
    return OK;
}

#include "spy.h"
