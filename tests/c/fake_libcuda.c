/* Stand-in for the driver's libcuda: the entry points a CUDA program calls first. */
#ifndef CUDA_VERSION_INT
#define CUDA_VERSION_INT 12040
#endif
#ifndef DRIVER_VERSION
#define DRIVER_VERSION "0.0"
#endif

int cuInit(unsigned int flags) { (void)flags; return 0; }

#ifdef BLOCK_VERSION
#include <unistd.h>
#endif
#ifdef SWAP_FROM
#include <stdio.h>
#endif

int cuDriverGetVersion(int *version) {
#ifdef BLOCK_VERSION
    /* a wedged GPU: the call never returns; BLOCK_VERSION=2 also starts a helper process */
    if (BLOCK_VERSION == 2 && fork() == 0)
        for (;;) pause();
    for (;;) pause();
#endif
#ifdef SWAP_FROM
    /* a driver install replacing this very file while it is being asked (same name, another build) */
    rename(SWAP_FROM, SWAP_TO);
#endif
    if (!version) return 1; /* CUDA_ERROR_INVALID_VALUE */
    *version = CUDA_VERSION_INT;
    return 0;
}

const char *ponytail_fake_driver_version(void) { return DRIVER_VERSION; }

#include "spy.h"
