/* SPDX-License-Identifier: MIT */
/* libFuzzer target: the trace line parser ("TIME KEY [PERMITS]") and the
 * JSON line parser. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A copy of exactly `size` bytes, so reads past the line are caught. */
    char *line = malloc(size ? size : 1);
    trace_req_t r;
    const char *err = NULL;

    if (line == NULL)
        return 0;
    memcpy(line, data, size);
    int rc = trace_parse_line(line, size, &r, &err);
    if (rc == TRACE_REQ) {
        if (r.key < line || r.key + r.key_len > line + size || r.key_len == 0 ||
            r.t_ns > INT64_MAX || r.permits > INT64_MAX)
            abort();
    } else if (rc == TRACE_ERR && err == NULL) {
        abort();
    }
    /* The same bytes as a JSON line (--input json). */
    err = NULL;
    rc = json_parse_line(line, size, "remote_addr", "time", &r, &err);
    if ((rc == TRACE_REQ && (r.key < line || r.key + r.key_len > line + size ||
                             r.key_len == 0 || r.t_ns > INT64_MAX)) ||
        (rc == TRACE_ERR && err == NULL))
        abort();
    free(line);
    return 0;
}
