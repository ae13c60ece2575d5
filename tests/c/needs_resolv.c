/* Links against libresolv, as Debian's dynamically linked busybox does. */
#include <resolv.h>
#include <stdio.h>

int main(void) {
    char out[64];
    b64_ntop((const unsigned char *)"ok", 2, out, sizeof out); /* only in libresolv */
    printf("resolv-%s\n", out);
    return 0;
}
