/* A stand-in libnvidia-ml.so.1 for bench/nvidiabench.py: what NVIDIA's container tools ask
 * NVML on a fake host (nvidia-container-cli through its RPC child, nvidia-ctk through
 * go-nvml), answered from a GPU table compiled in. nvidia-container-cli chroots into the
 * driver root before it loads NVML, so nothing here reads a file.
 *
 *   gcc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -DDRIVER_VERSION='"550.54.15"' \
 *       -DCUDA_VERSION_INT=12040 -include TABLE.h -o libnvidia-ml.so.550.54.15 fake_nvml.c
 *
 * TABLE.h defines FAKE_GPUS, a list of { minor, "bus id", "GPU- uuid", "model" } in PCI
 * bus order (the index). Only the ABI is NVIDIA's (return codes, the PCI info layout);
 * no GPU is ever opened. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#ifndef DRIVER_VERSION
#define DRIVER_VERSION "0.0"
#endif
#ifndef CUDA_VERSION_INT
#define CUDA_VERSION_INT 12040
#endif

struct fake_gpu {
    unsigned minor;
    const char *bus_id; /* 0000:3b:00.0 */
    const char *uuid;
    const char *model;
};

#ifndef FAKE_GPUS
#define FAKE_GPUS { 0, "0000:3b:00.0", "GPU-00000000-1111-2222-3333-444444444444", "NVIDIA H100 80GB HBM3" }
#endif
static const struct fake_gpu gpus[] = { FAKE_GPUS };
#define NGPUS (sizeof gpus / sizeof gpus[0])

enum { OK = 0, UNINITIALIZED = 1, INVALID = 2, NOT_SUPPORTED = 3, NOT_FOUND = 6 };
enum { BRAND_TESLA = 2, ARCH_HOPPER = 9 };

/* the layout of nvmlPciInfo_t (v3): legacy bus id, domain, bus, device, ids, bus id */
struct pci_info {
    char bus_id_legacy[16];
    unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
    char bus_id[32];
};

typedef void *handle_t; /* a GPU's handle: &gpus[i] */

static int index_of(handle_t h) {
    const struct fake_gpu *g = h;
    return g >= gpus && g < gpus + NGPUS ? (int)(g - gpus) : -1;
}

#define GPU_OR_INVALID(h, g) \
    int g = index_of(h);     \
    if (g < 0) return INVALID

int nvmlInit(void) { return OK; }
int nvmlInit_v2(void) { return OK; }
int nvmlInitWithFlags(unsigned flags) { (void)flags; return OK; }
int nvmlShutdown(void) { return OK; }

const char *nvmlErrorString(int r) {
    switch (r) {
    case OK: return "Success";
    case NOT_FOUND: return "Not Found";
    case NOT_SUPPORTED: return "Not Supported";
    default: return "Invalid Argument";
    }
}

static int copy_string(char *buf, unsigned len, const char *value) {
    if (!buf || len <= strlen(value)) return INVALID;
    memcpy(buf, value, strlen(value) + 1);
    return OK;
}

int nvmlSystemGetDriverVersion(char *buf, unsigned len) { return copy_string(buf, len, DRIVER_VERSION); }
int nvmlSystemGetNVMLVersion(char *buf, unsigned len) { return copy_string(buf, len, "12." DRIVER_VERSION); }
int nvmlSystemGetCudaDriverVersion(int *v) { *v = CUDA_VERSION_INT; return OK; }
int nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = CUDA_VERSION_INT; return OK; }

int nvmlDeviceGetCount(unsigned *n) { *n = NGPUS; return OK; }
int nvmlDeviceGetCount_v2(unsigned *n) { *n = NGPUS; return OK; }

int nvmlDeviceGetHandleByIndex(unsigned i, handle_t *h) {
    if (i >= NGPUS) return INVALID;
    *h = (handle_t)&gpus[i];
    return OK;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned i, handle_t *h) { return nvmlDeviceGetHandleByIndex(i, h); }

int nvmlDeviceGetHandleByUUID(const char *uuid, handle_t *h) {
    for (unsigned i = 0; i < NGPUS; i++)
        if (strcmp(uuid, gpus[i].uuid) == 0) return nvmlDeviceGetHandleByIndex(i, h);
    return NOT_FOUND;
}

/* a bus id with a 16- or 32-bit domain, any case */
static int same_bus(const char *a, const char *b) {
    while (strlen(a) > 12 && a[0] == '0') a++;
    while (strlen(b) > 12 && b[0] == '0') b++;
    return strcasecmp(a, b) == 0;
}

int nvmlDeviceGetHandleByPciBusId(const char *bus, handle_t *h) {
    for (unsigned i = 0; i < NGPUS; i++)
        if (same_bus(bus, gpus[i].bus_id)) return nvmlDeviceGetHandleByIndex(i, h);
    return NOT_FOUND;
}
int nvmlDeviceGetHandleByPciBusId_v2(const char *bus, handle_t *h) { return nvmlDeviceGetHandleByPciBusId(bus, h); }

int nvmlDeviceGetIndex(handle_t h, unsigned *index) {
    GPU_OR_INVALID(h, g);
    *index = (unsigned)g;
    return OK;
}
int nvmlDeviceGetMinorNumber(handle_t h, unsigned *minor) {
    GPU_OR_INVALID(h, g);
    *minor = gpus[g].minor;
    return OK;
}
int nvmlDeviceGetName(handle_t h, char *buf, unsigned len) {
    GPU_OR_INVALID(h, g);
    return copy_string(buf, len, gpus[g].model);
}
int nvmlDeviceGetUUID(handle_t h, char *buf, unsigned len) {
    GPU_OR_INVALID(h, g);
    return copy_string(buf, len, gpus[g].uuid);
}
int nvmlDeviceGetSerial(handle_t h, char *buf, unsigned len) {
    GPU_OR_INVALID(h, g);
    char serial[32];
    snprintf(serial, sizeof serial, "13240000%05d", g);
    return copy_string(buf, len, serial);
}

int nvmlDeviceGetPciInfo_v3(handle_t h, struct pci_info *pci) {
    GPU_OR_INVALID(h, g);
    unsigned domain = 0, bus = 0, device = 0, function = 0;
    if (sscanf(gpus[g].bus_id, "%x:%x:%x.%x", &domain, &bus, &device, &function) != 4) return INVALID;
    memset(pci, 0, sizeof *pci);
    snprintf(pci->bus_id_legacy, sizeof pci->bus_id_legacy, "%04x:%02x:%02x.%x", domain, bus, device, function);
    snprintf(pci->bus_id, sizeof pci->bus_id, "%08x:%02x:%02x.%x", domain, bus, device, function);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = device;
    pci->pci_device_id = 0x233010de;
    pci->pci_subsystem_id = 0x16c110de;
    return OK;
}
int nvmlDeviceGetPciInfo_v2(handle_t h, struct pci_info *pci) { return nvmlDeviceGetPciInfo_v3(h, pci); }
int nvmlDeviceGetPciInfo(handle_t h, struct pci_info *pci) { return nvmlDeviceGetPciInfo_v3(h, pci); }

int nvmlDeviceGetBrand(handle_t h, int *brand) {
    GPU_OR_INVALID(h, g);
    (void)g;
    *brand = BRAND_TESLA;
    return OK;
}
int nvmlDeviceGetArchitecture(handle_t h, unsigned *arch) {
    GPU_OR_INVALID(h, g);
    (void)g;
    *arch = ARCH_HOPPER;
    return OK;
}
int nvmlDeviceGetCudaComputeCapability(handle_t h, int *major, int *minor) {
    GPU_OR_INVALID(h, g);
    (void)g;
    *major = 9;
    *minor = 0;
    return OK;
}

/* MIG: capable, disabled, no MIG devices */
int nvmlDeviceGetMigMode(handle_t h, unsigned *current, unsigned *pending) {
    GPU_OR_INVALID(h, g);
    (void)g;
    *current = *pending = 0;
    return OK;
}
int nvmlDeviceGetMaxMigDeviceCount(handle_t h, unsigned *count) {
    GPU_OR_INVALID(h, g);
    (void)g;
    *count = 7;
    return OK;
}
int nvmlDeviceGetMigDeviceHandleByIndex(handle_t h, unsigned k, handle_t *out) {
    (void)h, (void)k, (void)out;
    return NOT_FOUND;
}
int nvmlDeviceIsMigDeviceHandle(handle_t h, unsigned *is_mig) {
    GPU_OR_INVALID(h, g);
    (void)g;
    *is_mig = 0;
    return OK;
}
int nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle_t h, handle_t *out) {
    (void)h, (void)out;
    return INVALID;
}

/* memory (NVIDIA's device plugin asks it of every GPU): 80 GiB, all free; nvmlMemory_t and nvmlMemory_v2_t */
struct memory { unsigned long long total, free, used; };
struct memory_v2 { unsigned version; unsigned long long total, reserved, free, used; };
int nvmlDeviceGetMemoryInfo(handle_t h, struct memory *m) {
    GPU_OR_INVALID(h, g);
    (void)g;
    m->total = m->free = 80ULL << 30;
    m->used = 0;
    return OK;
}
int nvmlDeviceGetMemoryInfo_v2(handle_t h, struct memory_v2 *m) {
    GPU_OR_INVALID(h, g);
    (void)g;
    m->total = m->free = 80ULL << 30;
    m->reserved = m->used = 0;
    return OK;
}

/* topology (NVIDIA's device plugin asks it in GetPreferredAllocation, the kubelet's call before Allocate): the
 * level of the two GPUs' common ancestor, nvmlGpuTopologyLevel_t: 0 the same GPU, 40 the same NUMA node (both
 * bus numbers below 0x80, or both above), 50 across the system's interconnect */
enum { TOPOLOGY_INTERNAL = 0, TOPOLOGY_NODE = 40, TOPOLOGY_SYSTEM = 50 };
static unsigned bus_number(const char *bus_id) {
    unsigned domain = 0, bus = 0;
    sscanf(bus_id, "%x:%x", &domain, &bus);
    return bus;
}
int nvmlDeviceGetTopologyCommonAncestor(handle_t a, handle_t b, int *level) {
    GPU_OR_INVALID(a, i);
    GPU_OR_INVALID(b, j);
    if (!level) return INVALID;
    if (i == j) *level = TOPOLOGY_INTERNAL;
    else *level = (bus_number(gpus[i].bus_id) < 0x80) == (bus_number(gpus[j].bus_id) < 0x80) ? TOPOLOGY_NODE : TOPOLOGY_SYSTEM;
    return OK;
}
