/* SPDX-License-Identifier: MIT */
/*
 * The Redis store against what production Redis does, on a private
 * redis-server started on a free loopback port and stopped by its PID (as
 * in test_redis.c):
 *
 * - rate_store_redis_drop deletes its own namespace's names only;
 * - a key holding '}' gets a hash tag of its own (escaped), and a key
 *   without one keeps its name;
 * - an ACL user without EVALSHA or without the keys is told so, with the
 *   server's NOPERM, at creation; one without SCRIPT LOAD decides by EVAL;
 * - a call's deadline holds when another caller hands it the reading (a
 *   fake server that answers one command late and the next never);
 * - redirections bounded (a fake cluster that redirects for ever);
 * - Redis stopped (SIGSTOP) under 16 threads: no call past its bound, the
 *   circuit breaker opens (calls fail at once), probes, and closes once
 *   Redis is back (SIGCONT); every caller is answered again;
 * - a server that accepts but never answers: creation is RATE_ETIMEDOUT
 *   after connect + command timeout, "timed out after N ms" (not EAGAIN's
 *   text), at creation and in rate_store_redis_last_error;
 * - lazy connect: created while Redis is down, the fail mode until it is
 *   started on that port, the last connect error reported; killed and
 *   restarted on the same port, decisions resume.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <strings.h>
#include <sys/socket.h>
#include <stdatomic.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "../src/store/redis/cluster.h"
#include "lib/redis_fixture.h"
#include "lib/sched_probe.h"
#include "lib/wait.h"
#include "ratelimit_redis.h"

static redisReply *cmd(redisContext *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    if (r == NULL)
        fail_msg("redis: %s", c->errstr);
    return r;
}

static long long exists(redisContext *c, const char *name)
{
    redisReply *r = cmd(c, "EXISTS %s", name);
    long long n = r->integer;
    freeReplyObject(r);
    return n;
}

/* ------------------------------------------------------------- drop */

static void drop_deletes_its_own_names_only(void **state)
{
    (void)state;
    redisContext *c = raw();
    static const char *others[] = {"app2:{k}", "application-data", "app",
                                   "app{", "app{}", "appx{k}", "app{k}x",
                                   "app{a}b}", "apps{k", "appq{k}"};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++)
        freeReplyObject(cmd(c, "SET %s x", others[i]));
    rate_store_t *rs = redis_store("app", true, 0);
    rate_limiter_t *lim = limiter_of("token-bucket 5/s", rs);
    rate_limiter_config_t cfg = {0};
    cfg.store = rs;
    cfg.shadow = true;
    rate_limiter_t *sh = limiter_cfg("token-bucket 5/s", cfg);
    at(lim, "k", SEC, 1, 0);
    at(lim, "a}b", SEC, 1, 0);
    at(sh, "k", SEC, 1, 0);
    at(sh, "a}b", SEC, 1, 0);
    assert_int_equal(exists(c, "app{k}"), 1);
    assert_int_equal(exists(c, "apps{k}"), 1);
    assert_int_equal(exists(c, "appe{a%7db}"), 1);
    assert_int_equal(exists(c, "appes{a%7db}"), 1);
    rate_limiter_free(lim);
    rate_limiter_free(sh);
    assert_int_equal(rate_store_redis_drop(rs), RATE_OK);
    assert_int_equal(exists(c, "app{k}"), 0);
    assert_int_equal(exists(c, "apps{k}"), 0);
    assert_int_equal(exists(c, "appe{a%7db}"), 0);
    assert_int_equal(exists(c, "appes{a%7db}"), 0);
    redisReply *r = cmd(c, "KEYS app*");
    for (size_t i = 0; i < r->elements; i++) /* the policy record: gone */
        if (strncmp(r->element[i]->str, "appp{", 5) == 0)
            fail_msg("%s left", r->element[i]->str);
    freeReplyObject(r);
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++)
        if (exists(c, others[i]) != 1)
            fail_msg("'%s' of another namespace was deleted", others[i]);
    /* A prefix with glob characters matches itself only. */
    freeReplyObject(cmd(c, "SET %s x", "a?{k}"));
    freeReplyObject(cmd(c, "SET %s x", "ab{k}"));
    rate_store_t *g = redis_store("a?", true, 0);
    assert_int_equal(rate_store_redis_drop(g), RATE_OK);
    assert_int_equal(exists(c, "a?{k}"), 0);
    assert_int_equal(exists(c, "ab{k}"), 1);
    rate_store_free(g);
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++)
        freeReplyObject(cmd(c, "DEL %s", others[i]));
    freeReplyObject(cmd(c, "DEL ab{k}"));
    rate_store_free(rs);
    redisFree(c);
}

/* ------------------------------------------------------------ hash tags */

static void every_key_its_own_tag(void **state)
{
    (void)state;
    redisContext *c = raw();
    rate_store_t *rs = redis_store("tag:", true, 0);
    rate_limiter_t *lim = limiter_of("fixed-window 5/s", rs);
    char key[32];
    for (int i = 0; i < 1000; i++) {
        snprintf(key, sizeof key, "victim}%d", i);
        at(lim, key, SEC, 1, 0);
    }
    /* Names without '}' are as before, '{' inside included. */
    at(lim, "user 42", SEC, 1, 0);
    at(lim, "a{b", SEC, 1, 0);
    at(lim, "{x", SEC, 1, 0);
    assert_int_equal(exists(c, "tag:{user 42}"), 1);
    assert_int_equal(exists(c, "tag:{a{b}"), 1);
    assert_int_equal(exists(c, "tag:{{x}"), 1);
    /* '}' and '%' escaped, only in keys that hold a '}'. */
    at(lim, "}%", SEC, 1, 0);
    at(lim, "%", SEC, 1, 0);
    assert_int_equal(exists(c, "tag:e{%7d%25}"), 1);
    assert_int_equal(exists(c, "tag:{%}"), 1);
    static bool seen[RC_SLOTS];
    unsigned slots = 0, names = 0;
    redisReply *r = cmd(c, "KEYS tag:e{victim*");
    for (size_t i = 0; i < r->elements; i++) {
        unsigned s = rc_key_slot(r->element[i]->str, r->element[i]->len);
        names++;
        slots += !seen[s];
        seen[s] = true;
    }
    freeReplyObject(r);
    assert_int_equal(names, 1000);
    /* 1000 keys over 16384 slots: about 970 distinct; all in one before */
    if (slots < 900)
        fail_msg("1000 keys 'victim}N' in %u slots", slots);
    /* Decisions still carry: the same key, the same state. */
    rate_decision_t d = at(lim, "victim}7", SEC, 1, 0);
    assert_int_equal(d.remaining, 3);
    rate_limiter_free(lim);
    drop_store(rs);
    redisFree(c);
}

/* ------------------------------------------------------------------ ACL */

static void acl_refusals_are_told(void **state)
{
    (void)state;
    redisContext *c = raw();
    freeReplyObject(cmd(c, "ACL SETUSER noeval on >pw ~* +@all -evalsha"));
    freeReplyObject(cmd(c, "ACL SETUSER nokeys on >pw ~other:* +@all"));
    freeReplyObject(cmd(c, "ACL SETUSER fine on >pw ~acl:* +@all"));
    static const struct {
        const char *user, *want;
    } cases[] = {{"noeval", "EVALSHA"}, {"nokeys", "acl:"}};
    for (size_t i = 0; i < 2; i++) {
        char u[128], err[512] = "";
        rate_store_t *s = NULL;
        rate_redis_options_t o = {.prefix = "acl:"};
        snprintf(u, sizeof u, "redis://%s:pw@127.0.0.1:%d", cases[i].user,
                 port);
        assert_int_equal(rate_store_redis_new(u, &o, &s, err, sizeof err),
                         RATE_ESTORE);
        assert_null(s);
        if (strstr(err, "NOPERM") == NULL || strstr(err, cases[i].want) == NULL)
            fail_msg("user %s: '%s'", cases[i].user, err);
        /* Lazy: created, decisions fail, and the last error says why. */
        o.lazy_connect = true;
        assert_int_equal(rate_store_redis_new(u, &o, &s, err, sizeof err),
                         RATE_OK);
        rate_limiter_t *lim = limiter_of("fixed-window 5/s", s);
        assert_int_equal(at(lim, "k", SEC, 1, 0).reason,
                         RATE_REASON_STORE_ERROR);
        char last[512];
        assert_int_equal(rate_store_redis_last_error(s, last, sizeof last),
                         RATE_OK);
        if (strstr(last, "NOPERM") == NULL)
            fail_msg("user %s, lazy: last error '%s'", cases[i].user, last);
        rate_limiter_free(lim);
        rate_store_free(s);
    }
    char u[128], err[512] = "";
    rate_store_t *s = NULL;
    rate_redis_options_t o = {.prefix = "acl:"};
    snprintf(u, sizeof u, "redis://fine:pw@127.0.0.1:%d", port);
    if (rate_store_redis_new(u, &o, &s, err, sizeof err) != RATE_OK)
        fail_msg("a user with the rights: %s", err);
    rate_limiter_t *lim = limiter_of("fixed-window 5/s", s);
    assert_true(at(lim, "k", SEC, 1, 0).allowed);
    rate_limiter_free(lim);
    drop_store(s);
    freeReplyObject(cmd(c, "ACL DELUSER noeval nokeys fine"));
    redisFree(c);
}

/* A user who may not SCRIPT LOAD (managed Redis often refuses it), nor
 * FUNCTION LOAD: created, and decides as any other, by FCALL where it may
 * load Functions, else EVALSHA of what another user loaded, else EVAL of
 * the script's text (which caches it); the lean scripts and the general
 * one alike, from a server without any script or function. */
static void a_user_without_script_load_decides(void **state)
{
    (void)state;
    redisContext *c = raw();
    freeReplyObject(cmd(c, "ACL SETUSER noload on >pw ~* +@all -script|load"));
    freeReplyObject(cmd(c, "ACL SETUSER noscript on >pw ~* +@all -script"));
    freeReplyObject(cmd(c, "ACL SETUSER noboth on >pw ~* +@all -script "
                           "-function"));
    static const char *const users[] = {"noload", "noscript", "noboth"};
    for (size_t i = 0; i < 3; i++)
        for (int general = 0; general < 2; general++) {
            char u[128], err[512] = "";
            rate_store_t *s = NULL;
            rate_redis_options_t o = {.prefix = "nl:"};
            o.general_script = general;
            freeReplyObject(cmd(c, "SCRIPT FLUSH"));
            freeReplyObject(cmd(c, "FUNCTION FLUSH"));
            freeReplyObject(cmd(c, "CONFIG RESETSTAT"));
            snprintf(u, sizeof u, "redis://%s:pw@127.0.0.1:%d", users[i],
                     port);
            if (rate_store_redis_new(u, &o, &s, err, sizeof err) != RATE_OK)
                fail_msg("user %s: %s", users[i], err);
            rate_limiter_t *lim = limiter_of("fixed-window 3/s", s);
            for (int k = 0; k < 4; k++) {
                rate_decision_t d = at(lim, "k", SEC, 1, 0);
                uint64_t left = k < 3 ? 2u - (unsigned)k : 0u;
                if (d.allowed != (k < 3) || d.remaining != left)
                    fail_msg("user %s%s, call %d: allowed %d, remaining %llu "
                             "(reason %d)", users[i],
                             general ? " (general)" : "", k, d.allowed,
                             (unsigned long long)d.remaining, d.reason);
            }
            redisReply *st = cmd(c, "INFO commandstats");
            bool eval = strstr(st->str, "cmdstat_eval:") != NULL;
            freeReplyObject(st);
            if ((i == 2 || general) && !eval)
                fail_msg("user %s%s: no EVAL", users[i],
                         general ? " (general)" : "");
            /* the lean scripts' decisions not by FCALL are counted: all of
             * them for a user without FUNCTION, none for the others */
            rate_redis_status_t rs;
            assert_int_equal(rate_store_redis_status(s, &rs), RATE_OK);
            uint64_t want = !general && i == 2 ? rs.lean_decisions : 0;
            if (rs.lean_evalsha != want || (!general && rs.lean_decisions == 0))
                fail_msg("user %s%s: %llu of %llu lean decisions not by "
                         "FCALL", users[i], general ? " (general)" : "",
                         (unsigned long long)rs.lean_evalsha,
                         (unsigned long long)rs.lean_decisions);
            rate_limiter_free(lim);
            drop_store(s);
        }
    freeReplyObject(cmd(c, "ACL DELUSER noload noscript noboth"));
    redisFree(c);
}

/* ---------------------------------------------- a deadline handed on */

/* A fake server on a loopback port, enough of RESP for the store: it
 * answers the connection's handshake, answers a command on "fake:{a}"
 * 900 ms after it came, and never answers one on "fake:{b}" (nor anything
 * after it on that connection). */
typedef struct fake {
    int lfd, port;
    atomic_bool stop;
    bool cluster;          /* says it is a one-node cluster */
    atomic_int askings;    /* ASKING commands seen */
    atomic_int slow_ms;    /* > 0: TIME, and the commands on "fake:{slow}"
                              (HMGET, EVALSHA), answered this late */
    atomic_int slots_ms;   /* > 0: CLUSTER SLOTS answered this late */
    int moved_to;          /* the port "fake:{newnode}" is moved to, 1.5 s
                              after it came */
    /* The connections' threads, which read f: fake_stop shuts their
     * sockets and waits until none is left (f may be a test's local). */
    atomic_int live;
    atomic_int nfds;
    int fds[256];          /* -1 once its reader closed it */
    pthread_mutex_t fds_lock;
} fake_t;

typedef struct fake_arg {
    fake_t *f;
    int fd, idx;
} fake_arg_t;

static bool read_command(FILE *in, char args[8][64], int *argc)
{
    char line[4096];
    if (fgets(line, sizeof line, in) == NULL || line[0] != '*')
        return false;
    *argc = atoi(line + 1);
    for (int i = 0; i < *argc; i++) {
        if (fgets(line, sizeof line, in) == NULL || line[0] != '$')
            return false;
        long n = atol(line + 1);
        char *buf = malloc((size_t)n + 2);
        if (buf == NULL || fread(buf, 1, (size_t)n + 2, in) != (size_t)n + 2) {
            free(buf);
            return false;
        }
        if (i < 8)
            snprintf(args[i], 64, "%.*s", (int)(n < 63 ? n : 63), buf);
        free(buf);
    }
    return true;
}

static void *fake_conn(void *arg)
{
    fake_arg_t *fa = arg;
    fake_t *f = fa->f;
    int fd = fa->fd, idx = fa->idx;
    free(fa);
    FILE *in = fdopen(fd, "r");
    bool silent = false;
    char a[8][64];
    int argc;
    while (in != NULL && read_command(in, a, &argc)) {
        const char *rep = "+OK\r\n";
        char buf[128];
        bool has_key = argc > 3 && (strcasecmp(a[0], "EVALSHA") == 0 ||
                                    strcasecmp(a[0], "EVAL") == 0 ||
                                    strcasecmp(a[0], "FCALL") == 0);
        int slow = atomic_load(&f->slow_ms);
        if (slow > 0 &&
            (strcasecmp(a[0], "TIME") == 0 ||
             (argc > 1 && strcmp(a[1], "fake:{slow}") == 0) ||
             (has_key && strcmp(a[3], "fake:{slow}") == 0)))
            usleep((useconds_t)slow * 1000);
        if (strcasecmp(a[0], "CLUSTER") == 0 && atomic_load(&f->slots_ms) > 0)
            usleep((useconds_t)atomic_load(&f->slots_ms) * 1000);
        if (strcasecmp(a[0], "TIME") == 0) {
            rep = "*2\r\n$10\r\n1700000000\r\n$1\r\n0\r\n";
        } else if (strcasecmp(a[0], "CLUSTER") == 0 && f->cluster) {
            snprintf(buf, sizeof buf,
                     "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n"
                     "127.0.0.1\r\n:%d\r\n", f->port);
            rep = buf;
        } else if (strcasecmp(a[0], "CLUSTER") == 0)
            rep = "-ERR This instance has cluster support disabled\r\n";
        else if (strcasecmp(a[0], "ASKING") == 0)
            atomic_fetch_add(&f->askings, 1);
        else if (strcasecmp(a[0], "SCRIPT") == 0) {
            snprintf(buf, sizeof buf, "$40\r\n%040d\r\n", 7);
            rep = buf;
        } else if (strcasecmp(a[0], "HMGET") == 0)
            rep = "*2\r\n$-1\r\n$-1\r\n";
        else if (has_key && strcmp(a[3], "fake:{a}") == 0) {
            usleep(900000);
            rep = "-ERR a slow answer\r\n";
        } else if (has_key && strcmp(a[3], "fake:{b}") == 0) {
            silent = true;
        } else if (has_key && strcmp(a[3], "fake:{moved}") == 0) {
            snprintf(buf, sizeof buf, "-MOVED 3 127.0.0.1:%d\r\n", f->port);
            rep = buf; /* to itself, for ever */
        } else if (has_key && strcmp(a[3], "fake:{newnode}") == 0 &&
                   f->moved_to != 0) {
            usleep(1500000);
            snprintf(buf, sizeof buf, "-MOVED %u 127.0.0.1:%d\r\n",
                     rc_key_slot(a[3], strlen(a[3])), f->moved_to);
            rep = buf;
        } else if (has_key && strcmp(a[3], "fake:{down}") == 0) {
            rep = "-CLUSTERDOWN The cluster is down\r\n";
        } else if (has_key && strcmp(a[3], "fake:{ask}") == 0) {
            snprintf(buf, sizeof buf, "-ASK 3 127.0.0.1:%d\r\n", f->port);
            rep = buf;
        }
        else if (has_key)
            rep = ":1\r\n";
        if (!silent && send(fd, rep, strlen(rep), MSG_NOSIGNAL) < 0)
            break;
    }
    pthread_mutex_lock(&f->fds_lock); /* not shut by fake_stop once closed */
    f->fds[idx] = -1;
    if (in != NULL)
        fclose(in);
    else
        close(fd);
    pthread_mutex_unlock(&f->fds_lock);
    atomic_fetch_sub(&f->live, 1); /* f is not read after this */
    return NULL;
}

static void *fake_accept(void *arg)
{
    fake_t *f = arg;
    while (!atomic_load(&f->stop)) {
        int fd = accept(f->lfd, NULL, NULL);
        if (fd < 0)
            break;
        pthread_t th;
        fake_arg_t *fa = malloc(sizeof *fa);
        assert_non_null(fa);
        pthread_mutex_lock(&f->fds_lock);
        int i = atomic_fetch_add(&f->nfds, 1);
        assert_true(i < (int)(sizeof f->fds / sizeof f->fds[0]));
        f->fds[i] = fd;
        pthread_mutex_unlock(&f->fds_lock);
        *fa = (fake_arg_t){f, fd, i};
        atomic_fetch_add(&f->live, 1);
        pthread_create(&th, NULL, fake_conn, fa);
        pthread_detach(th);
    }
    return NULL;
}

static pthread_t fake_start(fake_t *f)
{
    struct sockaddr_in sa = {0};
    socklen_t sl = sizeof sa;
    f->lfd = socket(AF_INET, SOCK_STREAM, 0);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(f->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(f->lfd, 8), 0);
    assert_int_equal(getsockname(f->lfd, (struct sockaddr *)&sa, &sl), 0);
    f->port = ntohs(sa.sin_port);
    pthread_mutex_init(&f->fds_lock, NULL);
    pthread_t acc;
    pthread_create(&acc, NULL, fake_accept, f);
    return acc;
}

static void fake_stop(fake_t *f, pthread_t acc)
{
    atomic_store(&f->stop, true);
    shutdown(f->lfd, SHUT_RDWR);
    close(f->lfd);
    pthread_join(acc, NULL);
    /* Each connection's reader wakes with its socket shut (one may first
     * finish a slow answer, 1.5 s at most): none reads f afterwards. */
    pthread_mutex_lock(&f->fds_lock);
    for (int i = 0; i < atomic_load(&f->nfds); i++)
        if (f->fds[i] >= 0)
            shutdown(f->fds[i], SHUT_RDWR);
    pthread_mutex_unlock(&f->fds_lock);
    assert_true(WAIT_UNTIL(atomic_load(&f->live) == 0, TEST_WAIT_S));
}

typedef struct timed {
    rate_limiter_t *lim;
    const char *key;
    uint64_t start_after_ns, took_ns;
} timed_t;

static void *timed_call(void *arg)
{
    timed_t *t = arg;
    rate_decision_t d;
    usleep((useconds_t)(t->start_after_ns / 1000));
    uint64_t t0 = rate_clock_monotonic_ns();
    assert_int_equal(rate_limiter_check(t->lim, t->key, strlen(t->key), 1, 0,
                                        &d),
                     RATE_OK);
    t->took_ns = rate_clock_monotonic_ns() - t0;
    assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
    return NULL;
}

/* A sends; B sends 50 ms later on the same connection while A reads; A's
 * reply comes at 900 ms and A hands the reading to B; B's never comes.
 * B must still return by its own deadline (its start plus 1 s), not 1 s
 * after it began to read (about 1.85 s).  The times are long so that the
 * two differ by far more than a loaded machine's scheduling (500 ms of
 * slack). */
static void a_deadline_survives_a_handover(void **state)
{
    (void)state;
    fake_t f = {0};
    pthread_t acc = fake_start(&f);

    const uint64_t timeout = 1000 * MS;
    char u[64], err[256] = "";
    snprintf(u, sizeof u, "redis://127.0.0.1:%d", f.port);
    rate_redis_options_t o = {.prefix = "fake:", .pool_size = 1};
    o.command_timeout_ns = timeout;
    rate_store_t *rs = NULL;
    if (rate_store_redis_new(u, &o, &rs, err, sizeof err) != RATE_OK)
        fail_msg("the fake server: %s", err);
    rate_limiter_t *lim = limiter_of("fixed-window 5/s", rs);
    timed_t a = {lim, "a", 0, 0}, b = {lim, "b", 50 * MS, 0};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, timed_call, &a);
    pthread_create(&tb, NULL, timed_call, &b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    print_message("A took %llu ms, B %llu ms (timeout %llu ms)\n",
                  (unsigned long long)(a.took_ns / MS),
                  (unsigned long long)(b.took_ns / MS),
                  (unsigned long long)(timeout / MS));
    /* Before the fix B took a fresh timeout from 900 ms. */
    if (b.took_ns > timeout + 500 * MS)
        fail_msg("B waited %llu ms past its start, its timeout is %llu ms",
                 (unsigned long long)(b.took_ns / MS),
                 (unsigned long long)(timeout / MS));
    assert_true(a.took_ns >= 880 * MS); /* A's answer came, late */
    rate_limiter_free(lim);
    rate_store_free(rs);
    fake_stop(&f, acc);
}

/* A decision over the compare-and-set path (a policy with a block, which
 * the scripts leave to the C step) makes three commands: TIME, HMGET,
 * EVALSHA.  They share one deadline, the command timeout from the
 * decision's start.  Each is answered 600 ms late here, with a 1 s
 * timeout: 1.8 s per decision when each had its own (the defect);
 * within it, the decision ends in RATE_ETIMEDOUT at 1 s.  Each decision
 * must return within the timeout plus 0.5 s of slack (the answers are
 * 600 ms apart: a loaded machine's scheduling is far below it). */
static void a_decision_has_one_deadline(void **state)
{
    (void)state;
    fake_t f = {0};
    pthread_t acc = fake_start(&f);

    const uint64_t timeout = 1000 * MS, slack = 500 * MS;
    char u[64], err[256] = "";
    snprintf(u, sizeof u, "redis://127.0.0.1:%d", f.port);
    rate_redis_options_t o = {.prefix = "fake:", .pool_size = 1};
    o.command_timeout_ns = timeout;
    o.no_breaker = true;
    rate_store_t *rs = NULL;
    if (rate_store_redis_new(u, &o, &rs, err, sizeof err) != RATE_OK)
        fail_msg("the fake server: %s", err);
    rate_limiter_t *lim = limiter_of("fixed-window 5/s block=1s", rs);
    atomic_store(&f.slow_ms, 600);
    uint64_t worst = 0;
    int late = 0;
    for (int i = 0; i < 3; i++) {
        rate_decision_t d;
        uint64_t t0 = rate_clock_monotonic_ns();
        assert_int_equal(rate_limiter_check(lim, "slow", 4, 1, 0, &d),
                         RATE_OK);
        uint64_t took = rate_clock_monotonic_ns() - t0;
        worst = took > worst ? took : worst;
        late += took > timeout + slack;
        print_message("decision %d: %llu ms, %s\n", i,
                      (unsigned long long)(took / MS),
                      d.reason == RATE_REASON_STORE_ERROR
                          ? rate_err_name(d.error)
                          : "answered");
        usleep(100000); /* past the reconnection's backoff */
    }
    print_message("worst decision: %llu ms against a %llu ms timeout\n",
                  (unsigned long long)(worst / MS),
                  (unsigned long long)(timeout / MS));
    assert_int_equal(late, 0);
    rate_limiter_free(lim);
    rate_store_free(rs);
    fake_stop(&f, acc);
}

typedef struct later {
    rate_limiter_t *lim;
    const char *key;
    uint64_t start_after_ns, took_ns;
    int error;
} later_t;

static void *later_call(void *arg)
{
    later_t *t = arg;
    rate_decision_t d;
    usleep((useconds_t)(t->start_after_ns / 1000));
    uint64_t t0 = rate_clock_monotonic_ns();
    assert_int_equal(rate_limiter_check(t->lim, t->key, strlen(t->key), 1, 0,
                                        &d),
                     RATE_OK);
    t->took_ns = rate_clock_monotonic_ns() - t0;
    t->error = d.reason == RATE_REASON_STORE_ERROR ? d.error : RATE_OK;
    return NULL;
}

/* A command sent later may have an earlier deadline.  Two connections,
 * which calls take in turn: B's decision (the compare-and-set path) sends
 * TIME at 0 on one, answered at 1.9 s; A sends a command at 1.0 s on the
 * other (on "fake:{b}", never answered) and reads there, until its
 * deadline, 3 s; C's call at 1.5 s takes B's connection, so that B's
 * HMGET, sent at 1.9 s with B's deadline, 2 s, goes to A's.  The reader
 * must give up at B's deadline, not at A's: B returns within its 2 s
 * timeout plus 0.5 s of slack (1 s later otherwise). */
static void a_later_command_with_an_earlier_deadline(void **state)
{
    (void)state;
    fake_t f = {0};
    pthread_t acc = fake_start(&f);

    const uint64_t timeout = 2000 * MS, slack = 500 * MS;
    char u[64], err[256] = "";
    snprintf(u, sizeof u, "redis://127.0.0.1:%d", f.port);
    rate_redis_options_t o = {.prefix = "fake:", .pool_size = 2};
    o.command_timeout_ns = timeout;
    o.no_breaker = true;
    o.module = RATE_REDIS_MODULE_OFF;
    rate_store_t *rs = NULL;
    if (rate_store_redis_new(u, &o, &rs, err, sizeof err) != RATE_OK)
        fail_msg("the fake server: %s", err);
    rate_limiter_t *lb = limiter_of("fixed-window 5/s block=1s", rs);
    rate_limiter_t *la = limiter_of("fixed-window 5/s", rs);
    atomic_store(&f.slow_ms, 1900);
    later_t b = {lb, "slow", 0, 0, 0}, a = {la, "b", 1000 * MS, 0, 0},
            c = {la, "fast", 1500 * MS, 0, 0};
    pthread_t tb, ta, tc;
    pthread_create(&tb, NULL, later_call, &b);
    pthread_create(&ta, NULL, later_call, &a);
    pthread_create(&tc, NULL, later_call, &c);
    pthread_join(tb, NULL);
    pthread_join(ta, NULL);
    pthread_join(tc, NULL);
    print_message("B took %llu ms (%s), A %llu ms (%s); timeout %llu ms\n",
                  (unsigned long long)(b.took_ns / MS), rate_err_name(b.error),
                  (unsigned long long)(a.took_ns / MS), rate_err_name(a.error),
                  (unsigned long long)(timeout / MS));
    if (b.took_ns > timeout + slack)
        fail_msg("B took %llu ms, its timeout is %llu ms",
                 (unsigned long long)(b.took_ns / MS),
                 (unsigned long long)(timeout / MS));
    assert_int_equal(b.error, RATE_ETIMEDOUT);
    rate_limiter_free(la);
    rate_limiter_free(lb);
    rate_store_free(rs);
    fake_stop(&f, acc);
}

/* A call redirected to a node new to the store must not wait for a map
 * refresh that another call makes, with that call's later deadline.  M
 * sends at 0 on "fake:{newnode}", moved at 1.5 s to another server; R
 * sends at 1.0 s on "fake:{moved}" (moved to the same node), and refreshes
 * the map: CLUSTER SLOTS, answered at 4 s, past R's deadline (3 s).  M
 * must return within its 2 s timeout plus 0.5 s of slack; waiting for
 * the refresh, it returned at R's deadline, 3 s; not, at 1.5 s, with the
 * other server's answer. */
static void a_new_node_waits_for_no_refresh(void **state)
{
    (void)state;
    fake_t g = {0};
    pthread_t gacc = fake_start(&g);
    fake_t f = {0};
    f.cluster = true;
    f.moved_to = g.port;
    pthread_t acc = fake_start(&f);

    const uint64_t timeout = 2000 * MS, slack = 500 * MS;
    char u[64], err[256] = "";
    snprintf(u, sizeof u, "redis://127.0.0.1:%d", f.port);
    rate_redis_options_t o = {.prefix = "fake:"};
    o.command_timeout_ns = timeout;
    o.no_breaker = true;
    o.module = RATE_REDIS_MODULE_OFF;
    rate_store_t *rs = NULL;
    if (rate_store_redis_new(u, &o, &rs, err, sizeof err) != RATE_OK)
        fail_msg("the fake cluster: %s", err);
    rate_limiter_t *lim = limiter_of("fixed-window 5/s", rs);
    atomic_store(&f.slots_ms, 3000);
    later_t m = {lim, "newnode", 0, 0, 0}, r = {lim, "moved", 1000 * MS, 0, 0};
    pthread_t tm, tr;
    pthread_create(&tm, NULL, later_call, &m);
    pthread_create(&tr, NULL, later_call, &r);
    pthread_join(tm, NULL);
    pthread_join(tr, NULL);
    print_message("M took %llu ms (%s), R %llu ms (%s); timeout %llu ms\n",
                  (unsigned long long)(m.took_ns / MS), rate_err_name(m.error),
                  (unsigned long long)(r.took_ns / MS), rate_err_name(r.error),
                  (unsigned long long)(timeout / MS));
    if (m.took_ns > timeout + slack)
        fail_msg("M took %llu ms, its timeout is %llu ms",
                 (unsigned long long)(m.took_ns / MS),
                 (unsigned long long)(timeout / MS));
    atomic_store(&f.slots_ms, 0);
    rate_limiter_free(lim);
    rate_store_free(rs);
    fake_stop(&f, acc);
    fake_stop(&g, gacc);
}

/* A node that answers CLUSTERDOWN (a new cluster's masters do, until
 * their cluster state is ok: about the node timeout after creation):
 * a store error at once, and last_error names the node and its words.
 * Before, last_error said nothing ("") and the errors had no cause. */
static void cluster_down_is_told(void **state)
{
    (void)state;
    fake_t f = {0};
    f.cluster = true;
    pthread_t acc = fake_start(&f);
    char u[64], err[256] = "", last[256] = "", want[64];
    snprintf(u, sizeof u, "redis://127.0.0.1:%d", f.port);
    rate_redis_options_t o = {.prefix = "fake:"};
    rate_store_t *rs = NULL;
    if (rate_store_redis_new(u, &o, &rs, err, sizeof err) != RATE_OK)
        fail_msg("the fake cluster: %s", err);
    rate_limiter_t *lim = limiter_of("fixed-window 5/s", rs);
    rate_decision_t d;
    uint64_t t0 = rate_clock_monotonic_ns();
    assert_int_equal(rate_limiter_check(lim, "down", 4, 1, 0, &d), RATE_OK);
    assert_true(rate_clock_monotonic_ns() - t0 < 500 * MS);
    assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
    assert_int_equal(d.error, RATE_ESTORE);
    assert_int_equal(rate_store_redis_last_error(rs, last, sizeof last),
                     RATE_OK);
    snprintf(want, sizeof want, "127.0.0.1:%d: replied: CLUSTERDOWN The "
             "cluster is down", f.port);
    if (strcmp(last, want) != 0)
        fail_msg("last_error '%s', want '%s'", last, want);
    rate_limiter_free(lim);
    rate_store_free(rs);
    fake_stop(&f, acc);
}

/* A listener that never accepts: TCP connects at once (the kernel's
 * backlog), nothing ever answers.  Creation has connect + command timeout
 * (100 + 200 ms) for the whole handshake, and says it timed out; a lazy
 * store's call has its command timeout, and last_error says so too.
 * Before the fix both said "Resource temporarily unavailable". */
static void a_silent_server_times_out(void **state)
{
    (void)state;
    struct sockaddr_in sa = {0};
    socklen_t sl = sizeof sa;
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(lfd, 8), 0);
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&sa, &sl), 0);
    char u[64], err[256] = "";
    snprintf(u, sizeof u, "redis://127.0.0.1:%d", ntohs(sa.sin_port));
    rate_redis_options_t o = {.prefix = "silent:"};
    o.connect_timeout_ns = 100 * MS;
    o.command_timeout_ns = 200 * MS;
    rate_store_t *rs = NULL;
    uint64_t t0 = rate_clock_monotonic_ns();
    assert_int_equal(rate_store_redis_new(u, &o, &rs, err, sizeof err),
                     RATE_ETIMEDOUT);
    uint64_t took = rate_clock_monotonic_ns() - t0;
    print_message("creation: %llu ms: %s\n",
                  (unsigned long long)(took / MS), err);
    if (strstr(err, "timed out after 300 ms") == NULL ||
        strstr(err, "temporarily") != NULL)
        fail_msg("'%s'", err);
    /* The combined budget, with 2 s of scheduling slack above it. */
    assert_true(took >= 290 * MS && took < 2300 * MS);

    o.lazy_connect = true;
    assert_int_equal(rate_store_redis_new(u, &o, &rs, err, sizeof err),
                     RATE_OK);
    char last[256] = "";
    assert_int_equal(rate_store_redis_last_error(rs, last, sizeof last),
                     RATE_OK);
    if (strstr(last, "timed out after 300 ms") == NULL) /* its creation's */
        fail_msg("'%s'", last);
    rate_limiter_t *lim = limiter_of("fixed-window 5/s", rs);
    rate_decision_t d;
    usleep(50000); /* past the 10 ms backoff: the call tries again */
    assert_int_equal(rate_limiter_check(lim, "k", 1, 1, 0, &d), RATE_OK);
    assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
    assert_int_equal(rate_store_redis_last_error(rs, last, sizeof last),
                     RATE_OK);
    print_message("lazy: last_error after a call: %s\n", last);
    if (strstr(last, "timed out after 200 ms") == NULL ||
        strstr(last, "temporarily") != NULL)
        fail_msg("'%s'", last);
    rate_limiter_free(lim);
    rate_store_free(rs);
    close(lfd);
}

/* A cluster that redirects for ever: MAX_REDIRECTS (5) followed, then a
 * store error, quickly; ASK is followed with ASKING. */
static void redirections_are_bounded(void **state)
{
    (void)state;
    fake_t f = {0};
    f.cluster = true;
    pthread_t acc = fake_start(&f);
    char u[64], err[256] = "";
    snprintf(u, sizeof u, "redis://127.0.0.1:%d", f.port);
    rate_redis_options_t o = {.prefix = "fake:"};
    rate_store_t *rs = NULL;
    if (rate_store_redis_new(u, &o, &rs, err, sizeof err) != RATE_OK)
        fail_msg("the fake cluster: %s", err);
    rate_redis_status_t st;
    assert_int_equal(rate_store_redis_status(rs, &st), RATE_OK);
    assert_true(st.cluster);
    assert_int_equal(st.masters, 1);
    rate_limiter_t *lim = limiter_of("fixed-window 5/s", rs);
    static const char *keys[] = {"moved", "ask"};
    for (int i = 0; i < 2; i++) {
        uint64_t before = st.redirections, t0 = rate_clock_monotonic_ns();
        int askings = atomic_load(&f.askings);
        rate_decision_t d;
        assert_int_equal(rate_limiter_check(lim, keys[i], strlen(keys[i]), 1,
                                            0, &d),
                         RATE_OK);
        assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
        assert_int_equal(d.error, RATE_ESTORE);
        assert_true(rate_clock_monotonic_ns() - t0 < 500 * MS);
        assert_int_equal(rate_store_redis_status(rs, &st), RATE_OK);
        assert_int_equal(st.redirections - before, 5);
        assert_int_equal(atomic_load(&f.askings) - askings, i == 1 ? 5 : 0);
    }
    rate_limiter_free(lim);
    rate_store_free(rs);
    fake_stop(&f, acc);
}

/* -------------------------------------------------------- Redis stopped */

#define THREADS 16

typedef struct caller {
    rate_limiter_t *lim;
    int i;
    atomic_int *phase; /* 0 before, 1 stopped, 2 continued, 3 end */
    uint64_t bound_ns;   /* the stated bound and a fixed slack: the
                            scheduler's worst delay is added after */
    uint64_t longest_ns; /* the longest call */
    unsigned slow_stopped; /* calls of phase 1 that waited (not at once) */
    atomic_uint answered_after; /* read while the callers run */
    unsigned errors_stopped, allowed_stopped;
} caller_t;

/* The callers whose longest call passed their bound plus three times the
 * scheduler's worst delay; each one is named with its figures. */
static unsigned count_late(const caller_t *s, int n, uint64_t sched)
{
    unsigned late = 0;
    for (int i = 0; i < n; i++) {
        if (s[i].longest_ns <= s[i].bound_ns + 3 * sched)
            continue;
        print_message("caller %d: longest call %.1f ms, bound %.1f ms + 3 x "
                      "%.1f ms of scheduling delay\n", i,
                      (double)s[i].longest_ns / 1e6,
                      (double)s[i].bound_ns / 1e6, (double)sched / 1e6);
        late++;
    }
    return late;
}

static void *caller_run(void *arg)
{
    caller_t *s = arg;
    char key[16];
    snprintf(key, sizeof key, "stop%d", s->i);
    int ph;
    while ((ph = atomic_load(s->phase)) != 3) {
        rate_decision_t d;
        uint64_t t0 = rate_clock_monotonic_ns();
        assert_int_equal(rate_limiter_check(s->lim, key, strlen(key), 1, 0,
                                            &d),
                         RATE_OK);
        uint64_t took = rate_clock_monotonic_ns() - t0;
        if (took > s->longest_ns)
            s->longest_ns = took;
        bool err = d.reason == RATE_REASON_STORE_ERROR;
        if (ph == 1 && atomic_load(s->phase) == 1) {
            s->errors_stopped += err;
            s->allowed_stopped += err && d.allowed;
            s->slow_stopped += took > 100 * MS; /* half the timeout */
        }
        if (err)
            usleep(1000); /* a server's caller does not spin on errors */
        if (ph == 2 && !err)
            atomic_fetch_add(&s->answered_after, 1);
    }
    return NULL;
}

/* Waits until every caller has been answered since Redis came back (past
 * the breaker's cool-down and the reconnect backoff), or 10 s: a loaded
 * machine may take a while to run all of them. */
static bool all_answered(caller_t *s, int n)
{
    for (int i = 0; i < n; i++)
        if (atomic_load(&s[i].answered_after) == 0)
            return false;
    return true;
}

/* Until every caller has been answered in phase 2 (the checks after it
 * say which was not). */
static void wait_answered(caller_t *s, int n)
{
    WAIT_UNTIL(all_answered(s, n), TEST_WAIT_S);
}

static void stopped_redis_costs_a_bounded_wait(void **state)
{
    (void)state;
    const uint64_t timeout = 200 * MS;
    rate_redis_options_t o = {.prefix = "stop:", .no_ttl = true};
    o.command_timeout_ns = timeout;
    o.connect_timeout_ns = 1000 * MS; /* inside the command's bound */
    o.breaker_cooldown_ns = 300 * MS;
    rate_store_t *rs = NULL;
    char err[256];
    if (rate_store_redis_new(url, &o, &rs, err, sizeof err) != RATE_OK)
        fail_msg("%s", err);
    rate_limiter_config_t cfg = {0};
    cfg.store = rs;
    rate_limiter_t *lim = limiter_cfg("token-bucket 1000000/s burst=1000", cfg);
    atomic_int phase = 0;
    pthread_t th[THREADS];
    caller_t s[THREADS];
    static sched_probe_t probe; /* a failed check leaves its thread on */
    sched_probe_start(&probe);
    for (int i = 0; i < THREADS; i++) {
        /* The stated bound, with 500 ms of slack, and three times the
         * scheduler's worst delay in the run (a call wakes up a few times,
         * and a loaded 2-core machine leaves threads off their cores). */
        s[i] = (caller_t){lim, i, &phase, timeout + 500 * MS, 0, 0, 0, 0, 0};
        pthread_create(&th[i], NULL, caller_run, &s[i]);
    }
    usleep(300000); /* (the callers at work first: a pace, not a wait) */
    kill(server, SIGSTOP);
    atomic_store(&phase, 1);
    usleep(1500000); /* the outage: 1.5 s of wall time is the point */
    atomic_store(&phase, 2);
    kill(server, SIGCONT);
    wait_answered(s, THREADS);
    atomic_store(&phase, 3);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    uint64_t sched = sched_probe_stop(&probe);
    unsigned late = count_late(s, THREADS, sched);
    unsigned slow = 0, errors = 0, allowed = 0;
    for (int i = 0; i < THREADS; i++) {
        slow += s[i].slow_stopped;
        errors += s[i].errors_stopped;
        allowed += s[i].allowed_stopped;
        if (atomic_load(&s[i].answered_after) == 0)
            fail_msg("caller %d got no answer after SIGCONT", i);
    }
    rate_redis_status_t st;
    assert_int_equal(rate_store_redis_status(rs, &st), RATE_OK);
    print_message("stopped 1.5 s: %u errors, %u waited, %u late; breaker "
                  "opened %llu times, %llu calls failed at once\n",
                  errors, slow, late, (unsigned long long)st.breaker_opened,
                  (unsigned long long)st.breaker_rejected);
    assert_int_equal(late, 0);
    assert_true(errors > 0);
    assert_int_equal(allowed, 0); /* fail closed */
    assert_true(st.breaker_opened >= 1);
    assert_true(st.breaker_rejected > 0);
    /* Without the breaker every caller waits out each timeout: about
     * 16 * 1.5 s / 200 ms = 120 waits; with it, the first timeouts and one
     * probe per cool-down (300 ms) at most. */
    if (slow > 3 * THREADS)
        fail_msg("%u calls waited while Redis was stopped", slow);
    assert_int_equal(st.breakers_open, 0);
    rate_limiter_free(lim);
    drop_store(rs);
}

/* The breaker off: the same bound on every call. */
static void stopped_redis_without_breaker(void **state)
{
    (void)state;
    const uint64_t timeout = 150 * MS;
    rate_redis_options_t o = {.prefix = "stop2:", .no_ttl = true};
    o.command_timeout_ns = timeout;
    o.no_breaker = true;
    rate_store_t *rs = NULL;
    char err[256];
    if (rate_store_redis_new(url, &o, &rs, err, sizeof err) != RATE_OK)
        fail_msg("%s", err);
    rate_limiter_config_t cfg = {0};
    cfg.store = rs;
    cfg.on_store_error = RATE_FAIL_OPEN;
    rate_limiter_t *lim = limiter_cfg("token-bucket 1000000/s burst=1000", cfg);
    atomic_int phase = 0;
    pthread_t th[THREADS];
    caller_t s[THREADS];
    static sched_probe_t probe; /* a failed check leaves its thread on */
    sched_probe_start(&probe);
    for (int i = 0; i < THREADS; i++) {
        s[i] = (caller_t){lim, i, &phase, timeout + 500 * MS, 0, 0, 0, 0, 0};
        pthread_create(&th[i], NULL, caller_run, &s[i]);
    }
    usleep(200000); /* (the callers at work first: a pace, not a wait) */
    kill(server, SIGSTOP);
    atomic_store(&phase, 1);
    usleep(1000000); /* the outage: 1 s of wall time is the point */
    atomic_store(&phase, 2);
    kill(server, SIGCONT);
    wait_answered(s, THREADS);
    atomic_store(&phase, 3);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    uint64_t sched = sched_probe_stop(&probe);
    unsigned late = count_late(s, THREADS, sched);
    unsigned errors = 0, allowed = 0;
    for (int i = 0; i < THREADS; i++) {
        errors += s[i].errors_stopped;
        allowed += s[i].allowed_stopped;
        if (atomic_load(&s[i].answered_after) == 0)
            fail_msg("caller %d got no answer after SIGCONT", i);
    }
    rate_redis_status_t st;
    assert_int_equal(rate_store_redis_status(rs, &st), RATE_OK);
    assert_int_equal(st.breaker_opened, 0);
    assert_int_equal(late, 0);
    assert_true(errors > 0);
    assert_int_equal(allowed, errors); /* fail open */
    rate_limiter_free(lim);
    drop_store(rs);
}

/* --------------------------------------------------------- lazy connect */

/* The first decision on `key` that the store answered (TEST_WAIT_S at
 * most; the last one tried). */
static rate_decision_t wait_answer(rate_limiter_t *lim, const char *key)
{
    rate_decision_t d;
    WAIT_UNTIL((assert_int_equal(rate_limiter_check(lim, key, strlen(key), 1,
                                                    0, &d),
                                 RATE_OK),
                d.reason != RATE_REASON_STORE_ERROR),
               TEST_WAIT_S);
    return d;
}

static void lazy_connect_rides_out_redis_down(void **state)
{
    (void)state;
    stop_server();
    rate_redis_options_t o = {.prefix = "lazy:", .no_ttl = true};
    o.command_timeout_ns = 200 * MS;
    o.connect_timeout_ns = 200 * MS;
    o.breaker_cooldown_ns = 200 * MS;
    rate_store_t *rs = NULL;
    char err[256] = "", last[256] = "";
    /* The default stays strict. */
    assert_int_equal(rate_store_redis_new(url, &o, &rs, err, sizeof err),
                     RATE_ESTORE);
    assert_non_null(strstr(err, "cannot connect"));
    o.lazy_connect = true;
    /* A malformed URL is still refused. */
    assert_int_equal(rate_store_redis_new("redis://h:99999", &o, &rs, err,
                                          sizeof err),
                     RATE_EINVAL);
    assert_int_equal(rate_store_redis_new(url, &o, &rs, err, sizeof err),
                     RATE_OK);
    rate_redis_status_t st;
    assert_int_equal(rate_store_redis_status(rs, &st), RATE_OK);
    assert_false(st.ready);
    assert_int_equal(rate_store_redis_last_error(rs, last, sizeof last),
                     RATE_OK);
    if (strstr(last, "cannot connect") == NULL)
        fail_msg("last error: '%s'", last);
    rate_limiter_config_t cfg = {0};
    cfg.store = rs;
    cfg.on_store_error = RATE_FAIL_OPEN;
    rate_limiter_t *lim = limiter_cfg("fixed-window 2/h", cfg);
    for (int i = 0; i < 5; i++) {
        uint64_t t0 = rate_clock_monotonic_ns();
        rate_decision_t d;
        assert_int_equal(rate_limiter_check(lim, "k", 1, 1, 0, &d), RATE_OK);
        assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
        assert_true(d.allowed); /* the fail mode */
        /* Within the timeout, and 1 s of scheduling slack. */
        assert_true(rate_clock_monotonic_ns() - t0 < 200 * MS + 1000 * MS);
    }
    /* Started on that port: decisions resume by themselves. */
    start_server(NULL, NULL);
    rate_decision_t d = wait_answer(lim, "k");
    assert_int_not_equal(d.reason, RATE_REASON_STORE_ERROR);
    assert_true(d.allowed);
    d = wait_answer(lim, "k");
    d = wait_answer(lim, "k");
    assert_false(d.allowed); /* 2/h: the store's count */
    assert_int_equal(rate_store_redis_status(rs, &st), RATE_OK);
    assert_true(st.ready);
    assert_false(st.cluster);
    assert_int_equal(rate_store_redis_last_error(rs, last, sizeof last),
                     RATE_OK);
    assert_string_equal(last, "");
    /* Killed: the fail mode, and the error said; restarted on the same
     * port: decisions resume. */
    stop_server();
    for (int i = 0; i < 3; i++) {
        assert_int_equal(rate_limiter_check(lim, "k", 1, 1, 0, &d), RATE_OK);
        assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
        assert_true(d.allowed);
    }
    assert_int_equal(rate_store_redis_last_error(rs, last, sizeof last),
                     RATE_OK);
    if (strstr(last, "cannot connect") == NULL)
        fail_msg("last error after the kill: '%s'", last);
    start_server(NULL, NULL);
    d = wait_answer(lim, "k");
    assert_int_not_equal(d.reason, RATE_REASON_STORE_ERROR);
    assert_true(d.allowed); /* a new, empty server */
    assert_int_equal(rate_store_redis_last_error(NULL, last, sizeof last),
                     RATE_EINVAL);
    assert_int_equal(rate_store_redis_status(NULL, &st), RATE_EINVAL);
    rate_limiter_free(lim);
    drop_store(rs);
}

/* 16 callers on a lazy store while Redis is down at the start, then
 * started on that port, then killed and restarted: no call past its bound,
 * the fail mode (open) while it is down, everyone answered after. */
static void lazy_connect_under_many_callers(void **state)
{
    (void)state;
    stop_server();
    const uint64_t timeout = 200 * MS;
    rate_redis_options_t o = {.prefix = "lazy16:", .no_ttl = true};
    o.command_timeout_ns = timeout;
    o.connect_timeout_ns = timeout;
    o.breaker_cooldown_ns = 200 * MS;
    o.lazy_connect = true;
    rate_store_t *rs = NULL;
    char err[256] = "";
    assert_int_equal(rate_store_redis_new(url, &o, &rs, err, sizeof err),
                     RATE_OK);
    rate_limiter_config_t cfg = {0};
    cfg.store = rs;
    cfg.on_store_error = RATE_FAIL_OPEN;
    rate_limiter_t *lim = limiter_cfg("token-bucket 1000000/s burst=1000", cfg);
    for (int round = 0; round < 2; round++) {
        atomic_int phase = 1; /* down */
        pthread_t th[THREADS];
        caller_t s[THREADS];
        static sched_probe_t probe; /* a failed check leaves its thread on */
        sched_probe_start(&probe);
        for (int i = 0; i < THREADS; i++) {
            s[i] = (caller_t){lim, i, &phase, timeout + 500 * MS, 0, 0, 0, 0,
                              0};
            pthread_create(&th[i], NULL, caller_run, &s[i]);
        }
        usleep(500000); /* the outage: 0.5 s of wall time is the point */
        start_server(NULL, NULL);
        atomic_store(&phase, 2);
        wait_answered(s, THREADS);
        atomic_store(&phase, 3);
        for (int i = 0; i < THREADS; i++)
            pthread_join(th[i], NULL);
        uint64_t sched = sched_probe_stop(&probe);
        unsigned late = count_late(s, THREADS, sched);
        unsigned errors = 0, allowed = 0;
        for (int i = 0; i < THREADS; i++) {
                errors += s[i].errors_stopped;
            allowed += s[i].allowed_stopped;
            if (atomic_load(&s[i].answered_after) == 0)
                fail_msg("round %d: caller %d got no answer once Redis was "
                         "up", round, i);
        }
        assert_int_equal(late, 0);
        assert_true(errors > 0);
        assert_int_equal(allowed, errors); /* fail open */
        stop_server(); /* the second round: killed, restarted, same port */
    }
    start_server(NULL, NULL);
    rate_limiter_free(lim);
    drop_store(rs);
}

/* rate_store_redis_last_error of the store s, checked to hold `want`
 * ("" : to be empty). */
static void last_error_is(rate_store_t *s, const char *want, const char *when)
{
    char last[512];
    assert_int_equal(rate_store_redis_last_error(s, last, sizeof last),
                     RATE_OK);
    if (want[0] == '\0' ? last[0] != '\0' : strstr(last, want) == NULL)
        fail_msg("%s: last error '%s', not '%s'", when, last, want);
}

/* An error reply that becomes a store error says why, with the server's
 * address, until a later call succeeds: NOPERM of an ACL that stopped
 * covering the store's keys after it connected, OOM of a full Redis under
 * noeviction, and a key of another type (RATE_ECORRUPT). */
static void error_replies_say_why(void **state)
{
    (void)state;
    redisContext *c = raw();
    freeReplyObject(cmd(c, "ACL SETUSER later on >pw ~* +@all"));
    char u[128], err[512] = "", where[64];
    rate_store_t *s = NULL;
    rate_redis_options_t o = {.prefix = "er:"};
    snprintf(u, sizeof u, "redis://later:pw@127.0.0.1:%d", port);
    if (rate_store_redis_new(u, &o, &s, err, sizeof err) != RATE_OK)
        fail_msg("%s", err);
    snprintf(where, sizeof where, "127.0.0.1:%d: replied: ", port);
    rate_limiter_t *lim = limiter_of("fixed-window 1000/s", s);
    assert_true(wait_answer(lim, "k").allowed);
    last_error_is(s, "", "at first");

    freeReplyObject(cmd(c, "ACL SETUSER later resetkeys ~other:*"));
    rate_decision_t d;
    assert_int_equal(rate_limiter_check(lim, "k", 1, 1, 0, &d), RATE_OK);
    assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
    last_error_is(s, where, "NOPERM");
    last_error_is(s, "NOPERM", "NOPERM");
    freeReplyObject(cmd(c, "ACL SETUSER later resetkeys ~*"));
    assert_true(wait_answer(lim, "k").allowed);
    last_error_is(s, "", "the keys granted");

    freeReplyObject(cmd(c, "CONFIG SET maxmemory-policy noeviction"));
    freeReplyObject(cmd(c, "CONFIG SET maxmemory 1"));
    assert_int_equal(rate_limiter_check(lim, "new", 3, 1, 0, &d), RATE_OK);
    freeReplyObject(cmd(c, "CONFIG SET maxmemory 0"));
    assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
    last_error_is(s, where, "OOM");
    last_error_is(s, "OOM", "OOM");
    assert_true(wait_answer(lim, "new").allowed);
    last_error_is(s, "", "memory given back");

    /* A key of the state's name that is no hash: named, left as it is. */
    freeReplyObject(cmd(c, "LPUSH er:{w} x"));
    assert_int_equal(rate_limiter_check(lim, "w", 1, 1, 0, &d), RATE_OK);
    assert_int_equal(d.error, RATE_ECORRUPT);
    last_error_is(s, "WRONGTYPE: 'er:{w}' is not a hash", "WRONGTYPE");
    assert_true(wait_answer(lim, "k").allowed);
    last_error_is(s, "", "another key");
    freeReplyObject(cmd(c, "DEL er:{w}"));
    rate_limiter_free(lim);
    drop_store(s);
    freeReplyObject(cmd(c, "ACL DELUSER later"));
    redisFree(c);
}

/* A call that fails on a connection that was open says why: Redis that
 * does not answer in time (CLIENT PAUSE), a connection the server closed
 * (CLIENT KILL); forgotten at the next call that succeeds. */
static void a_lost_connection_says_why(void **state)
{
    (void)state;
    redisContext *c = raw();
    rate_redis_options_t o = {.prefix = "lost:", .pool_size = 1};
    o.command_timeout_ns = 200 * MS;
    o.no_breaker = true;
    rate_store_t *s = NULL;
    char err[512] = "", want[96];
    if (rate_store_redis_new(url, &o, &s, err, sizeof err) != RATE_OK)
        fail_msg("%s", err);
    rate_limiter_t *lim = limiter_of("fixed-window 1000/s", s);
    assert_true(wait_answer(lim, "k").allowed);

    freeReplyObject(cmd(c, "CLIENT PAUSE 600 ALL"));
    rate_decision_t d;
    assert_int_equal(rate_limiter_check(lim, "k", 1, 1, 0, &d), RATE_OK);
    assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
    snprintf(want, sizeof want, "127.0.0.1:%d: no reply within the command "
             "timeout (200 ms)", port);
    last_error_is(s, want, "paused");
    assert_true(wait_answer(lim, "k").allowed);
    last_error_is(s, "", "unpaused");

    freeReplyObject(cmd(c, "CLIENT KILL TYPE normal SKIPME yes"));
    assert_int_equal(rate_limiter_check(lim, "k", 1, 1, 0, &d), RATE_OK);
    assert_int_equal(d.reason, RATE_REASON_STORE_ERROR);
    snprintf(want, sizeof want, "127.0.0.1:%d: connection lost: ", port);
    last_error_is(s, want, "killed");
    assert_true(wait_answer(lim, "k").allowed);
    last_error_is(s, "", "connected again");
    rate_limiter_free(lim);
    drop_store(s);
    redisFree(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(drop_deletes_its_own_names_only),
        cmocka_unit_test(every_key_its_own_tag),
        cmocka_unit_test(acl_refusals_are_told),
        cmocka_unit_test(a_user_without_script_load_decides),
        cmocka_unit_test(a_deadline_survives_a_handover),
        cmocka_unit_test(a_decision_has_one_deadline),
        cmocka_unit_test(a_later_command_with_an_earlier_deadline),
        cmocka_unit_test(a_new_node_waits_for_no_refresh),
        cmocka_unit_test(cluster_down_is_told),
        cmocka_unit_test(redirections_are_bounded),
        cmocka_unit_test(a_silent_server_times_out),
        cmocka_unit_test(stopped_redis_costs_a_bounded_wait),
        cmocka_unit_test(stopped_redis_without_breaker),
        cmocka_unit_test(lazy_connect_rides_out_redis_down),
        cmocka_unit_test(lazy_connect_under_many_callers),
        cmocka_unit_test(error_replies_say_why),
        cmocka_unit_test(a_lost_connection_says_why),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
