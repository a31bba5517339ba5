/* SPDX-License-Identifier: MIT */
/* libFuzzer target: the access-log (Common / Combined Log Format) parser,
 * with every named key field, xff, and a few field numbers. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *line = malloc(size ? size : 1);

    if (line == NULL)
        return 0;
    memcpy(line, data, size);
    static const int extra[] = {CLF_XFF, CLF_FIELD_1, CLF_FIELD_1 + 3,
                                CLF_FIELD_1 + 9, CLF_FIELD_1 + 63};
    for (int x = 0; x < CLF_AGENT + 1 + 5; x++) {
        int f = x <= CLF_AGENT ? x : extra[x - CLF_AGENT - 1];
        trace_req_t r;
        const char *err = NULL;
        int rc = clf_parse_line(line, size, (clf_field_t)f, &r, &err);
        if (rc == TRACE_REQ &&
            (r.key < line || r.key + r.key_len > line + size ||
             r.key_len == 0 || r.time_len != 26))
            abort();
        if (rc == TRACE_ERR && err == NULL)
            abort();
    }
    free(line);
    return 0;
}
