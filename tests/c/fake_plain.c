/* Stand-in for any other driver library: an ELF shared object with the right SONAME. */
int ponytail_fake_library(void) { return 1; }
