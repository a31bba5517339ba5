/* SPDX-License-Identifier: MIT */
/*
 * binding.h -- what the rooms of the CPython binding share (python/src,
 * docs/python.md); private to the extension, which exports PyInit alone.
 *
 * Rooms: module.c (the module, its types and functions), convert.c
 * (errors, arguments, the guard), decision.c (Decision, header fields),
 * policy.c, store.c (Store, memory, shared memory), store_redis.c,
 * store_dynamodb.c, async.c (the rate_loop_t adapter on asyncio,
 * asynchronous decisions), limiter.c, synced.c (the synced mode),
 * lease.c (InFlight, Lease), fair.c, rules.c, rules_held.c (its
 * in-flight rules), limits.c (the hot calls of the storage for limits).
 *
 * Every call that may block (a store's I/O, a shared-memory lock, an
 * acquire's sleep) runs with the GIL released.  An object over a library
 * handle keeps it in a guard: its calls hold the guard's read lock while
 * they run without the GIL, and close() takes the write lock, so that
 * close() never frees a handle another thread is using; a Store stays
 * open while a Limiter on it is open.
 */
#ifndef RATELIMIT_PY_BINDING_H
#define RATELIMIT_PY_BINDING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdint.h>

#include "ratelimit.h"
#include "ratelimit_http.h"
#include "ratelimit_loop.h"

#define ERRLEN 512

/* --------------------------------------------------------- convert.c */

extern PyObject *Error; /* ratelimit.Error */

/* Raises ratelimit.Error(message) with .code and .name: the library's
 * message (`detail`, when the call gave one) or rate_strerror's text.
 * Returns NULL. */
PyObject *raise_rc(int rc, const char *detail);

/* A C string without NUL bytes from str (UTF-8) or bytes (texts, paths,
 * URLs); borrowed from obj. */
int cstring_arg(PyObject *obj, const char *what, const char **out);

/* A key: str (its UTF-8) or bytes-like, any bytes (NUL too: keys go with
 * their length).  The view is released by key_release. */
typedef struct {
    Py_buffer view;
    const char *ptr;
    size_t len;
    int has_view;
} key_arg_t;

int key_get(PyObject *obj, key_arg_t *k);
void key_release(key_arg_t *k);
/* The key as a new bytes object (what an object keeps for later calls). */
PyObject *key_bytes(PyObject *key_obj);

/* A count or a time in ns: an int from 0 to 2^64-1 (the library refuses
 * what is above its own bounds, RATE_ERANGE). */
int u64_arg(PyObject *obj, const char *what, uint64_t *out);
/* An integer option (NULL: not given, *out kept) from 0 to `max`:
 * ValueError when negative, OverflowError above `max`, never wrapped. */
int uint_opt(PyObject *obj, const char *what, unsigned long long max,
             unsigned long long *out);
/* A duration in seconds (int or float) as ns; NULL or None is `dflt`. */
int seconds_arg(PyObject *obj, const char *what, uint64_t dflt, uint64_t *out);

/* A fail mode, "closed", "open" or "fallback" (NULL or None: *out kept). */
int fail_arg(PyObject *obj, rate_fail_mode_t *out);

/* Arguments of a METH_FASTCALL | METH_KEYWORDS method: out[i] is the
 * argument named names[i] (positions first, up to npos), or left as it
 * is; TypeError for an unknown, repeated or extra argument. */
int fast_args(const char *fname, PyObject *const *args, Py_ssize_t nargs,
              PyObject *kwnames, const char *const *names, Py_ssize_t npos,
              Py_ssize_t nrequired, PyObject **out);

/* __enter__ (the object) and __exit__ (its close()) of the objects that
 * are context managers. */
PyObject *enter_self(PyObject *self, PyObject *unused);
PyObject *exit_close(PyObject *self, PyObject *args);

/* The guard of an object over a library handle (see above). */
typedef struct {
    void *handle;          /* the library's object; NULL: not made or closed */
    pthread_rwlock_t lock; /* read: a call; write: close */
    int ready;             /* the lock is made (__init__ succeeded once) */
    int closing;           /* a close() took it on (set with the GIL) */
} guard_t;

/* __init__: keeps `handle`; MemoryError (handle not kept) when the lock
 * cannot be made.  RuntimeError when __init__ ran before (`type` names
 * the class). */
int guard_init(guard_t *g, void *handle);
int guard_init_twice(const guard_t *g, const char *type);
/* dealloc: destroys the lock (the handle taken before). */
void guard_fini(guard_t *g);
/* With the GIL: ValueError unless __init__ ran and the handle is open
 * (no close() under way); `closed` is the message for a closed one. */
int guard_usable(const guard_t *g, const char *type, const char *closed);
/* ValueError(closed); returns NULL. */
PyObject *guard_raise_closed(const char *closed);
/* Without the GIL: takes the read lock; -1 (the lock not held) when the
 * handle is closed.  guard_leave releases it. */
int guard_enter(guard_t *g);
void guard_leave(guard_t *g);
/* With the GIL: 1 when this close() is the one to take the handle out
 * and give back what the object holds of others (a Store's or a
 * Limiter's use), 0 when it was closed or another thread's close() took
 * it on.  From then on guard_usable answers "closed", so that no new
 * object starts using the handle while it is being freed. */
int guard_close_begin(guard_t *g);
/* Without the GIL: takes the handle out under the write lock (NULL when
 * closed already), for its owner to free. */
void *guard_take(guard_t *g);
/* With the GIL, on an event loop's thread: takes the read lock without
 * waiting; -1 (the lock not held) when the handle is closed or a close is
 * under way. */
int guard_enter_now(guard_t *g);

/* A call that never waits (memory stores: a shard's spin lock is held for
 * the step only) keeps the GIL, saving its release and take; every other
 * call releases it.  `self` has an int memory_only. */
#define DECIDE_BEGIN(self) \
    { \
        PyThreadState *ts_ = (self)->memory_only ? NULL : PyEval_SaveThread();
#define DECIDE_END \
    if (ts_) \
        PyEval_RestoreThread(ts_); \
    }

/* -------------------------------------------------------- decision.c */

extern PyTypeObject *DecisionType;
int decision_type_ready(void);
PyObject *decision_new(const rate_decision_t *d);
/* The decision back from its Python record (for headers()). */
int decision_from(PyObject *o, rate_decision_t *d);
/* (status, {field: value}) of formatted header fields: those not empty. */
PyObject *headers_new(const rate_headers_t *h);

/* ---------------------------------------------------------- policy.c */

typedef struct {
    PyObject_HEAD
    rate_policy_t *policy;
} PolicyObject;

extern PyTypeObject PolicyType;
/* A Policy argument (made by __init__): its policy, borrowed. */
int policy_arg(PyObject *obj, const rate_policy_t **out);

/* ----------------------------------------------------------- store.c */

typedef struct {
    PyObject_HEAD
    rate_store_t *store;
    const char *kind;   /* "memory", "shm", "redis", "redis-async", ... */
    Py_ssize_t users;   /* open limiters (and in-flight limits) on it */
    Py_ssize_t busy;    /* its own calls under way without the GIL */
    PyObject *loop;     /* redis-async: the asyncio loop, kept alive */
} StoreObject;

extern PyTypeObject StoreType;
extern PyMethodDef store_functions[];
StoreObject *store_alloc(const char *kind);
/* A store argument: None or an open Store; -1 with the error raised. */
int store_arg(PyObject *store);
/* Keeps the store (None: nothing) for an object made on it, which it
 * then outlives.  Returns whether its calls never wait (memory). */
int store_attach(PyObject *store, PyObject **slot);
/* Gives it back (a store kept by store_attach; NULL: nothing). */
void store_detach(PyObject *store);
/* Raises the error of a call that set or used `policy` on `store` (None:
 * a private memory store), RATE_EPOLICY with the store's reason. */
PyObject *raise_policy_rc(int rc, PyObject *store, const rate_policy_t *policy);

/* ----------------------------------------------------- store_redis.c */

extern PyMethodDef store_redis_functions[];

/* -------------------------------------------------- store_dynamodb.c */

extern PyMethodDef store_dynamodb_functions[];

/* ----------------------------------------------------------- async.c */

extern PyTypeObject IoWatchType, LoopTimerType;
/* A rate_loop_t on the asyncio loop `loop` (borrowed: the store keeps it). */
void aio_loop_init(rate_loop_t *l, PyObject *loop);
/* Reports the exception set (if any) as unraisable: the adapter's and the
 * callbacks' errors cannot reach a Python caller. */
void adapter_unraisable(const char *what);
/* In an asynchronous call's callback (GIL held): whether its future is
 * done already (its task cancelled), and then takes no answer. */
int future_done(PyObject *fut);
/* Answers the future: `res` (a new reference, stolen; NULL with the error
 * set when it could not be made) for rc RATE_OK, else Error for rc; any
 * failure becomes its exception, so that the awaiting task never hangs. */
void future_answer(PyObject *fut, int rc, PyObject *res);

/* --------------------------------------------------------- limiter.c */

typedef struct {
    PyObject_HEAD
    guard_t guard;        /* a rate_limiter_t */
    PyObject *store;      /* StoreObject or NULL (a private memory store) */
    PyObject *policy;     /* the default PolicyObject */
    Py_ssize_t in_flight; /* asynchronous decisions not yet called back */
    int memory_only;      /* on a memory store: its calls never wait */
    Py_ssize_t users;     /* open Fair limits and held requests on it */
} LimiterObject;

#define LIMITER_CLOSED "the limiter is closed"

extern PyTypeObject LimiterType;
/* A Limiter argument, open; -1 with the error raised. */
int limiter_arg(PyObject *obj, LimiterObject **out);
/* _check_start (async.c), a method of Limiter. */
PyObject *Limiter_check_start(LimiterObject *self, PyObject *args);
/* A wait that Ctrl-C ends: step(ctx) runs with the GIL released, again
 * while it returns 1, each run waiting at most WAIT_SLICE_NS, and the
 * signals' handlers run between the runs.  0 once step returns 0; -1 with
 * the handler's exception (KeyboardInterrupt). */
#define WAIT_SLICE_NS 100000000u /* 100 ms */
int wait_in_slices(int (*step)(void *ctx), void *ctx);

/* ------------------------------------------- lease.c fair.c rules.c */

extern PyTypeObject InFlightType, LeaseType, FairType, RulesType;

typedef struct {
    PyObject_HEAD
    guard_t guard;   /* a rate_rules_t */
    Py_ssize_t held; /* requests held (rules_held.c): close() refuses */
} RulesObject;

#define RULES_CLOSED "the rules are closed"

/* The outcome tuple of Rules._check. */
PyObject *outcome_new(const rate_outcome_t *o);

/* A rules request's arguments (Rules._check, Rules._acquire): the
 * limiter (borrowed), the permits and max_wait, and the key and the
 * attributes held for the call, from a dict of str (or bytes) to str (or
 * bytes) without NUL.  The attributes point into a list of the dict's
 * items of our own, which the dict's later changes (another thread's,
 * while the call runs without the GIL) leave alone.  With the GIL; -1 and
 * an exception, nothing held, on bad input; rules_req_release after the
 * call. */
typedef struct {
    LimiterObject *lim;
    uint64_t permits, wait_ns;
    key_arg_t k;
    PyObject *items;
    rate_attr_t *attrs;
    size_t n;
} rules_req_t;
int rules_req_get(RulesObject *self, PyObject *lim_obj, PyObject *key_obj,
                  PyObject *attrs_obj, PyObject *permits_obj,
                  PyObject *wait_obj, rules_req_t *r);
void rules_req_release(rules_req_t *r);

/* ----------------------------------------------------- rules_held.c */

extern PyTypeObject RulesHeldType;
/* _acquire, a method of Rules. */
PyObject *Rules_acquire(RulesObject *self, PyObject *args);

/* ---------------------------------------------------------- synced.c */

extern PyTypeObject SyncedType;

/* ---------------------------------------------------------- limits.c */

extern PyTypeObject LimitsCallsType;

#endif
