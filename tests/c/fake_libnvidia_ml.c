/* Stand-in for the driver's libnvidia-ml (NVML). */
#include <stdio.h>
#ifndef DRIVER_VERSION
#define DRIVER_VERSION "0.0"
#endif

int nvmlInit_v2(void) { return 0; }

int nvmlSystemGetDriverVersion(char *buf, unsigned int len) {
    snprintf(buf, len, "%s", DRIVER_VERSION);
    return 0;
}
