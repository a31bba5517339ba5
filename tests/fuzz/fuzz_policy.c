/* libFuzzer target: the policy text parser, and the round trip through its
 * canonical form (format, parse again, same limits). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <ratelimit.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    rate_policy_t *p = NULL, *q = NULL;
    char err[256], canon[512];

    if (text == NULL)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    if (rate_policy_parse(text, &p, err, sizeof err) == RATE_OK) {
        size_t need = rate_policy_format(p, canon, sizeof canon);
        if (need < sizeof canon) {
            if (rate_policy_parse(canon, &q, err, sizeof err) != RATE_OK)
                abort(); /* the canonical form must parse */
            if (rate_policy_count(p) != rate_policy_count(q))
                abort();
            for (size_t i = 0; i < rate_policy_count(p); i++)
                if (memcmp(rate_policy_limit(p, i), rate_policy_limit(q, i),
                           sizeof(rate_limit_t)) != 0)
                    abort();
        }
    } else if (strlen(err) == 0) {
        abort(); /* every error names what is wrong */
    }
    rate_policy_free(q);
    rate_policy_free(p);
    free(text);
    return 0;
}
