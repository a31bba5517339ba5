/* SPDX-License-Identifier: MIT */
/*
 * AddressSanitizer's defaults for the C suites of an ASan build (linked
 * into each; ASAN_OPTIONS still overrides them).  A smaller quarantine of
 * freed memory (16 MB, not 256): ASan empties a tenth of it at once when it
 * is full, and at 256 MB that held a free() for about 150 ms, as long as
 * the fault suites' command timeout (docs/contributing.md, "What runs
 * where").
 */
const char *__asan_default_options(void);

const char *__asan_default_options(void)
{
    return "quarantine_size_mb=16";
}
