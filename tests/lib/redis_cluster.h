/* SPDX-License-Identifier: MIT */
/*
 * A private Redis Cluster for a test (header-only, static): six
 * redis-servers (--cluster-enabled yes, a node timeout of 1000 ms) on free
 * loopback ports whose bus ports (port + 10000) are free too, joined by
 * `redis-cli --cluster create ... --cluster-replicas 1` into 3 masters
 * with a replica each, in a scratch directory; each server started by
 * fork and exec, stopped by its PID and killed with the test however it
 * ends (PR_SET_PDEATHSIG).
 */
#ifndef TEST_REDIS_CLUSTER_H
#define TEST_REDIS_CLUSTER_H

#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "redis_server.h"

#define RCL_NODES 6

typedef struct rcluster {
    int port[RCL_NODES];
    pid_t pid[RCL_NODES];
    char dir[64];
} rcluster_t;

static inline bool rcl_port_free(int p)
{
    struct sockaddr_in a = {0};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)p);
    bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

/* A port free now whose cluster bus port (port + 10000) is free too,
 * both below Linux's ephemeral range (32768 up), where an outgoing
 * connection could take the bus port meanwhile; 0 if none. */
static inline int rcl_free_port(void)
{
    static unsigned seed;
    if (seed == 0)
        seed = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL);
    for (int tries = 0; tries < 1000; tries++) {
        seed = seed * 1103515245u + 12345u;
        int p = 10000 + (int)((seed >> 8) % 12000); /* bus: 20000-31999 */
        if (rcl_port_free(p) && rcl_port_free(p + 10000))
            return p;
    }
    return 0;
}

static inline redisContext *rcl_connect(int port)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c != NULL && c->err) {
        redisFree(c);
        return NULL;
    }
    return c;
}

/* Starts node i (again, after a stop: same port, same node file) and
 * waits until it answers PING (up to TEST_WAIT_S). */
/* A module every node loads (--loadmodule), or NULL: set before
 * rcl_start. */
static const char *rcl_module;

static inline bool rcl_start_node(rcluster_t *cl, int i)
{
    char p[16], conf[128], rdb[32];
    snprintf(p, sizeof p, "%d", cl->port[i]);
    snprintf(conf, sizeof conf, "%s/nodes-%d.conf", cl->dir, cl->port[i]);
    snprintf(rdb, sizeof rdb, "dump-%d.rdb", cl->port[i]);
    const char *argv[] = {"redis-server", "--port", p, "--bind",
                          "127.0.0.1", "--save", "", "--appendonly", "no",
                          "--cluster-enabled", "yes", "--cluster-config-file",
                          conf, "--cluster-node-timeout", "1000", "--dir",
                          cl->dir, "--dbfilename", rdb,
                          "--cluster-replica-validity-factor", "0",
                          "--loglevel", "warning", NULL, NULL, NULL};
    if (rcl_module != NULL) {
        argv[sizeof argv / sizeof argv[0] - 3] = "--loadmodule";
        argv[sizeof argv / sizeof argv[0] - 2] = rcl_module;
    }
    cl->pid[i] = test_spawn(argv);
    return test_wait_ready(&cl->pid[i], cl->port[i], redis_test_answers);
}

static inline void rcl_stop_node(rcluster_t *cl, int i)
{
    redis_test_stop(&cl->pid[i]);
}

/* Runs a program (argv[0] on PATH), its output to /dev/null: its exit
 * status, or -1. */
static inline int rcl_run(char *const argv[])
{
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int null = open("/dev/null", O_RDWR);
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
        execvp(argv[0], argv);
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Whether the node on `port` says cluster_state:ok and knows `masters`
 * masters serving slots. */
static inline bool rcl_node_ok(int port, int masters)
{
    redisContext *c = rcl_connect(port);
    bool ok = false;
    if (c == NULL)
        return false;
    redisReply *r = redisCommand(c, "CLUSTER INFO");
    if (r != NULL && r->type == REDIS_REPLY_STRING) {
        char want[64];
        snprintf(want, sizeof want, "cluster_size:%d", masters);
        ok = strstr(r->str, "cluster_state:ok") != NULL &&
             strstr(r->str, want) != NULL;
    }
    freeReplyObject(r);
    redisFree(c);
    return ok;
}

typedef struct rcl_ok_arg {
    rcluster_t *cl;
    int masters;
} rcl_ok_arg_t;

/* Node `port`'s slot map as text, "START-END:PORT," for each range in the
 * order CLUSTER SLOTS gives (by START); "" when it does not answer. */
static inline void rcl_slots_text(int port, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    redisContext *c = rcl_connect(port);
    if (c == NULL)
        return;
    redisReply *r = redisCommand(c, "CLUSTER SLOTS");
    for (size_t k = 0; r != NULL && r->type == REDIS_REPLY_ARRAY &&
                       k < r->elements && n < cap;
         k++) {
        redisReply *e = r->element[k];
        int w = snprintf(buf + n, cap - n, "%lld-%lld:%lld,",
                         e->element[0]->integer, e->element[1]->integer,
                         e->element[2]->element[1]->integer);
        n += w > 0 ? (size_t)w : 0;
    }
    freeReplyObject(r);
    redisFree(c);
}

/* Whether no slot is half-moved on node `port` (CLUSTER NODES names none
 * MIGRATING, "[S->-ID]", or IMPORTING, "[S-<-ID]"): a key of such a slot
 * may be sent to another node by ASK. */
static inline bool rcl_node_settled(int port)
{
    redisContext *c = rcl_connect(port);
    if (c == NULL)
        return false;
    redisReply *r = redisCommand(c, "CLUSTER NODES");
    bool ok = r != NULL && r->type == REDIS_REPLY_STRING &&
              strstr(r->str, "->-") == NULL && strstr(r->str, "-<-") == NULL;
    freeReplyObject(r);
    redisFree(c);
    return ok;
}

/* Every running node ok with `masters`, no slot half-moved, and all of
 * them giving the same slot map: a node restarted as a replica may, for a
 * while, still name itself master of the slots it had, and a test that
 * asks it which node holds a key would be told wrong. */
static inline bool rcl_all_ok(void *ud)
{
    rcl_ok_arg_t *a = ud;
    char first[1024] = "", map[1024];
    for (int i = 0; i < RCL_NODES; i++) {
        if (a->cl->pid[i] <= 0)
            continue;
        if (!rcl_node_ok(a->cl->port[i], a->masters) ||
            !rcl_node_settled(a->cl->port[i]))
            return false;
        rcl_slots_text(a->cl->port[i], map, sizeof map);
        if (map[0] == '\0')
            return false;
        if (first[0] == '\0')
            memcpy(first, map, sizeof first);
        else if (strcmp(map, first) != 0)
            return false;
    }
    return true;
}

/* Waits (up to `ms`, and at least TEST_WAIT_S: agreeing takes the nodes
 * longer on a loaded machine) until every running node is ok with
 * `masters` and they agree on the slot map. */
static inline bool rcl_wait_ok(rcluster_t *cl, int masters, int ms)
{
    rcl_ok_arg_t a = {cl, masters};
    unsigned s = (unsigned)(ms / 1000) + 1;
    return wait_until(rcl_all_ok, &a, s > TEST_WAIT_S ? s : TEST_WAIT_S);
}

static inline void rcl_stop(rcluster_t *cl)
{
    for (int i = 0; i < RCL_NODES; i++)
        rcl_stop_node(cl, i);
    if (cl->dir[0] != '\0') {
        char *rm[] = {"rm", "-rf", cl->dir, NULL};
        rcl_run(rm);
        cl->dir[0] = '\0';
    }
}

/* Starts the cluster: false (all stopped) when it could not be made. */
static inline bool rcl_start(rcluster_t *cl)
{
    memset(cl, 0, sizeof *cl);
    snprintf(cl->dir, sizeof cl->dir, "/tmp/ratelimit-cluster.XXXXXX");
    if (mkdtemp(cl->dir) == NULL) {
        cl->dir[0] = '\0';
        return false;
    }
    char addr[RCL_NODES][32];
    char *av[RCL_NODES + 8];
    int n = 0;
    av[n++] = "redis-cli";
    av[n++] = "--cluster";
    av[n++] = "create";
    for (int i = 0; i < RCL_NODES; i++) {
        int p;
        bool dup;
        do { /* six different ports */
            p = rcl_free_port();
            dup = false;
            for (int j = 0; j < i; j++)
                dup |= cl->port[j] == p || cl->port[j] + 10000 == p ||
                       cl->port[j] == p + 10000;
        } while (dup);
        cl->port[i] = p;
        if (p == 0 || !rcl_start_node(cl, i)) {
            rcl_stop(cl);
            return false;
        }
        snprintf(addr[i], sizeof addr[i], "127.0.0.1:%d", p);
        av[n++] = addr[i];
    }
    av[n++] = "--cluster-replicas";
    av[n++] = "1";
    av[n++] = "--cluster-yes";
    av[n] = NULL;
    if (rcl_run(av) != 0 || !rcl_wait_ok(cl, 3, 20000)) {
        rcl_stop(cl);
        return false;
    }
    return true;
}

/* The index of the node that is the master of `slot` now (-1: none). */
static inline int rcl_master_of(rcluster_t *cl, unsigned slot)
{
    for (int i = 0; i < RCL_NODES; i++) {
        if (cl->pid[i] <= 0)
            continue;
        redisContext *c = rcl_connect(cl->port[i]);
        if (c == NULL)
            continue;
        redisReply *r = redisCommand(c, "CLUSTER SLOTS");
        int found = -1;
        for (size_t k = 0; r != NULL && r->type == REDIS_REPLY_ARRAY &&
                           k < r->elements;
             k++) {
            redisReply *e = r->element[k];
            if ((unsigned)e->element[0]->integer <= slot &&
                slot <= (unsigned)e->element[1]->integer) {
                int port = (int)e->element[2]->element[1]->integer;
                for (int j = 0; j < RCL_NODES; j++)
                    if (cl->port[j] == port)
                        found = j;
            }
        }
        freeReplyObject(r);
        redisFree(c);
        if (found >= 0)
            return found;
    }
    return -1;
}

/* Node i's replication offset (ROLE: a master's own, a replica's as far
 * as it has applied its master's stream) into *off, and for a replica its
 * master's port into *master_port (0 for a master): whether it answered. */
static inline bool rcl_offset(rcluster_t *cl, int i, long long *off,
                              int *master_port)
{
    redisContext *c = rcl_connect(cl->port[i]);
    if (c == NULL)
        return false;
    redisReply *r = redisCommand(c, "ROLE");
    bool ok = false;
    if (r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements >= 2 &&
        r->element[0]->type == REDIS_REPLY_STRING) {
        if (strcmp(r->element[0]->str, "master") == 0 &&
            r->element[1]->type == REDIS_REPLY_INTEGER) {
            *off = r->element[1]->integer;
            *master_port = 0;
            ok = true;
        } else if (strcmp(r->element[0]->str, "slave") == 0 &&
                   r->elements >= 5 &&
                   r->element[2]->type == REDIS_REPLY_INTEGER &&
                   r->element[4]->type == REDIS_REPLY_INTEGER) {
            *master_port = (int)r->element[2]->integer;
            *off = r->element[4]->integer;
            ok = true;
        }
    }
    freeReplyObject(r);
    redisFree(c);
    return ok;
}

/* Whether node i is a master now. */
static inline bool rcl_is_master(rcluster_t *cl, int i)
{
    long long off;
    int master_port;
    return rcl_offset(cl, i, &off, &master_port) && master_port == 0;
}

/* How many keys under `prefix` node i holds (SCAN); 0 when it does not
 * take a connection, UINT_MAX when it answers what SCAN does not. */
static inline unsigned rcl_keys_on(rcluster_t *cl, int i, const char *prefix)
{
    redisContext *c = rcl_connect(cl->port[i]);
    if (c == NULL)
        return 0;
    unsigned n = 0;
    char cursor[32] = "0", pat[64];
    snprintf(pat, sizeof pat, "%s*", prefix);
    do {
        redisReply *r = redisCommand(c, "SCAN %s MATCH %s COUNT 1000", cursor,
                                     pat);
        if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
            freeReplyObject(r);
            n = UINT_MAX;
            break;
        }
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        n += (unsigned)r->element[1]->elements;
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0);
    redisFree(c);
    return n;
}

/* The URL naming every node as a seed ("redis://127.0.0.1:P,..."), so
 * that a store outlives any one of them. */
static inline void rcl_url(const rcluster_t *cl, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "redis://");
    for (int i = 0; i < RCL_NODES && n > 0 && (size_t)n < cap; i++)
        n += snprintf(buf + n, cap - (size_t)n, "%s127.0.0.1:%d",
                      i ? "," : "", cl->port[i]);
}

typedef struct {
    rcluster_t *cl;
    long long want[RCL_NODES]; /* each replica's master's offset; -1: none */
} rcl_repl_arg_t;

static inline bool rcl_replicas_caught_up(void *ud)
{
    rcl_repl_arg_t *a = ud;
    for (int i = 0; i < RCL_NODES; i++) {
        long long off;
        int mport;
        if (a->want[i] >= 0 &&
            (!rcl_offset(a->cl, i, &off, &mport) || off < a->want[i]))
            return false;
    }
    return true;
}

/* Waits (up to TEST_WAIT_S) until every running replica has applied what
 * its master had written when this was called: each replica's offset
 * reaches its master's.  False if one did not. */
static inline bool rcl_wait_replicas(rcluster_t *cl)
{
    rcl_repl_arg_t a = {.cl = cl};
    long long moff[RCL_NODES];
    int mport[RCL_NODES];
    for (int i = 0; i < RCL_NODES; i++) {
        a.want[i] = -1;
        if (cl->pid[i] <= 0 || !rcl_offset(cl, i, &moff[i], &mport[i]))
            mport[i] = -1;
    }
    for (int i = 0; i < RCL_NODES; i++) {
        if (mport[i] <= 0)
            continue; /* a master, or not running */
        for (int m = 0; m < RCL_NODES; m++)
            if (mport[m] == 0 && cl->port[m] == mport[i])
                a.want[i] = moff[m];
    }
    return wait_until(rcl_replicas_caught_up, &a, TEST_WAIT_S);
}

/* Node i's id (CLUSTER MYID) into id: whether it answered one. */
static inline bool rcl_node_id(rcluster_t *cl, int i, char id[64])
{
    redisContext *c = rcl_connect(cl->port[i]);
    if (c == NULL)
        return false;
    redisReply *r = redisCommand(c, "CLUSTER MYID");
    bool ok = r != NULL && r->type == REDIS_REPLY_STRING;
    if (ok)
        snprintf(id, 64, "%s", r->str);
    freeReplyObject(r);
    redisFree(c);
    return ok;
}

/* One command of rcl_move_slots: counts it in *errs if it failed, and says
 * what in why (the first failure only). */
static inline void rcl_mv_ok(redisContext *c, redisReply *r, const char *what,
                             unsigned *errs, char *why, size_t cap)
{
    if (r == NULL || r->type == REDIS_REPLY_ERROR) {
        if ((*errs)++ == 0)
            snprintf(why, cap, "%s: %s", what,
                     r != NULL ? r->str : c != NULL ? c->errstr : "no node");
    }
    freeReplyObject(r);
}

/* Moves slots [first, last] from node `from` to node `to` as redis-cli
 * --cluster reshard does: IMPORTING, MIGRATING, the keys `batch` at a
 * time with a pause of pause_us before each (so that callers meet the slot
 * half moved: ASK) and before the slot is given, then the new owner told
 * first, the old one next, the other masters last.  Returns how many
 * commands failed (0: all went through), the first one said in why.  No
 * assertion: a test's helper thread may call it. */
static inline unsigned rcl_move_slots(rcluster_t *cl, int from, int to,
                                      unsigned first, unsigned last,
                                      unsigned batch, unsigned pause_us,
                                      char *why, size_t cap)
{
    char fid[64], tid[64];
    unsigned errs = 0;
    if (!rcl_node_id(cl, from, fid) || !rcl_node_id(cl, to, tid)) {
        snprintf(why, cap, "CLUSTER MYID of node %d or %d", from, to);
        return 1;
    }
    redisContext *src = rcl_connect(cl->port[from]);
    redisContext *dst = rcl_connect(cl->port[to]);
    if (src == NULL || dst == NULL) {
        snprintf(why, cap, "no connection to node %d or %d", from, to);
        redisFree(src);
        redisFree(dst);
        return 1;
    }
    for (unsigned s = first; s <= last; s++) {
        rcl_mv_ok(dst, redisCommand(dst, "CLUSTER SETSLOT %u IMPORTING %s", s,
                                    fid), "IMPORTING", &errs, why, cap);
        rcl_mv_ok(src, redisCommand(src, "CLUSTER SETSLOT %u MIGRATING %s", s,
                                    tid), "MIGRATING", &errs, why, cap);
        for (;;) {
            redisReply *k = redisCommand(src, "CLUSTER GETKEYSINSLOT %u %u", s,
                                         batch);
            if (k == NULL || k->type != REDIS_REPLY_ARRAY) {
                rcl_mv_ok(src, k, "GETKEYSINSLOT", &errs, why, cap);
                break;
            }
            size_t n = k->elements;
            for (size_t i = 0; i < n; i++) {
                usleep(pause_us);
                rcl_mv_ok(src,
                          redisCommand(src, "MIGRATE 127.0.0.1 %d %b 0 5000",
                                       cl->port[to], k->element[i]->str,
                                       k->element[i]->len),
                          "MIGRATE", &errs, why, cap);
            }
            freeReplyObject(k);
            if (n == 0)
                break;
        }
        usleep(pause_us);
        /* The new owner first, then the old, then the others. */
        int order[RCL_NODES], n = 0;
        order[n++] = to;
        order[n++] = from;
        for (int i = 0; i < RCL_NODES; i++)
            if (i != to && i != from)
                order[n++] = i;
        for (int j = 0; j < n; j++) {
            if (!rcl_is_master(cl, order[j]))
                continue;
            redisContext *c = rcl_connect(cl->port[order[j]]);
            rcl_mv_ok(c, c != NULL ? redisCommand(c, "CLUSTER SETSLOT %u NODE %s",
                                                  s, tid)
                                   : NULL,
                      "SETSLOT NODE", &errs, why, cap);
            redisFree(c);
        }
    }
    redisFree(src);
    redisFree(dst);
    return errs;
}

#endif
