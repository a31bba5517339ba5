/* SPDX-License-Identifier: MIT */
/*
 * Redis Cluster routing for the Redis store (internal): the slot of a key
 * (CRC16 of its hash tag, as the Cluster specification says), the slot
 * map parsed from a CLUSTER SLOTS reply, and the target of a MOVED or ASK
 * redirection.  No I/O: the transports (sync.c, async.c) do that.  See
 * docs/redis.md.
 */
#ifndef RATE_STORE_REDIS_CLUSTER_H
#define RATE_STORE_REDIS_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#define RC_SLOTS 16384
#define RC_HOST_MAX 256

/* CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0, no
 * reflection), the Cluster's key hash. */
uint16_t rc_crc16(const char *buf, size_t len);

/* The slot of a key name: CRC16 of the bytes between the first '{' and
 * the first '}' after it, when there are any; else of the whole name. */
unsigned rc_key_slot(const char *key, size_t len);

/* A node's address (port 0: host is a unix socket's path). */
typedef struct rc_addr {
    char host[RC_HOST_MAX];
    int port;
} rc_addr_t;

/* One range of slots and the master that serves it. */
typedef struct rc_range {
    unsigned first, last; /* inclusive, first <= last < RC_SLOTS */
    char host[RC_HOST_MAX];
    int port;
} rc_range_t;

/* Parses a CLUSTER SLOTS reply into at most cap ranges (*n of them).  A
 * master's empty host ("" or "?", a node that does not know its own
 * address) becomes `self_host`, the host the reply came from.  Returns
 * false (with *n unspecified) for a reply that is not a CLUSTER SLOTS
 * reply: not an array, a range out of order or out of bounds, a master
 * without host and port, more than cap ranges. */
bool rc_parse_slots(const redisReply *rep, const char *self_host,
                    rc_range_t *out, size_t cap, size_t *n);

/* A slot map (map[slot]: a master's index + 1; 0 for a slot the reply
 * does not name) from a CLUSTER SLOTS reply, as both transports keep it.
 * node_of gives the index of the master host:port in the caller's list
 * of nodes (adding it if new), or a negative number when it cannot.
 * False for a reply that does not parse, out of memory, or a master
 * node_of could not place. */
bool rc_slot_map(const redisReply *rep, const char *self_host,
                 int (*node_of)(void *ctx, const char *host, int port),
                 void *ctx, uint8_t map[RC_SLOTS]);

/* The kind of an error reply that redirects. */
typedef enum rc_redirect {
    RC_NONE = 0,
    RC_MOVED,   /* "MOVED <slot> <host>:<port>": the slot lives there now */
    RC_ASK,     /* "ASK <slot> <host>:<port>": this once, ASKING there */
    RC_TRYAGAIN /* "TRYAGAIN ...": a slot in mid-migration; try later */
} rc_redirect_t;

/* Parses an error reply's text (len bytes).  For RC_MOVED and RC_ASK the
 * slot, host (self_host when the reply gives none) and port are set;
 * RC_NONE for anything else, a malformed redirection included. */
rc_redirect_t rc_parse_redirect(const char *s, size_t len,
                                const char *self_host, unsigned *slot,
                                char host[RC_HOST_MAX], int *port);

#endif
