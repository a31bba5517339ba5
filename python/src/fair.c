/* SPDX-License-Identifier: MIT */
/*
 * fair.c -- fair shares (docs/fair.md): ratelimit.Fair, one limit of a
 * Limiter on one key divided among flows by weighted max-min fairness
 * (rate_fair_t), in this process or in a table shared by a host's
 * processes: not waiting (check), waiting (acquire, on a thread of its
 * own past a slice, so that Ctrl-C ends it), and waiting on an asyncio
 * loop (_acquire_start, for AsyncFair).
 */
#include "binding.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ratelimit_fair.h"

typedef struct {
    PyObject_HEAD
    guard_t guard;          /* a rate_fair_t */
    LimiterObject *limiter; /* kept open while this is */
    int memory_only;        /* a memory limiter and a table in this process */
    char *key;              /* the shared limit's key (a waiter's refund) */
    size_t key_len;
    PyObject *loop;         /* the asyncio loop of its asynchronous waits */
    Py_ssize_t in_flight;   /* asynchronous waiters not yet called back */
} FairObject;

#define FAIR_CLOSED "the fair limit is closed"

static int Fair_init(FairObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"limiter", "key", "slots", "queue_max",
                             "shm_path", NULL};
    PyObject *lim_obj, *key_obj, *path_obj = Py_None;
    PyObject *slots_obj = NULL, *queue_obj = NULL;
    unsigned long long slots = 0, queue_max = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|$OOO:Fair", kwlist, &lim_obj,
                                     &key_obj, &slots_obj, &queue_obj,
                                     &path_obj))
        return -1;
    if (uint_opt(slots_obj, "slots", UINT_MAX, &slots) < 0 ||
        uint_opt(queue_obj, "queue_max", UINT_MAX, &queue_max) < 0)
        return -1;
    LimiterObject *lim;
    if (guard_init_twice(&self->guard, "Fair") < 0 ||
        limiter_arg(lim_obj, &lim) < 0)
        return -1;
    const char *path = NULL;
    if (path_obj != Py_None && cstring_arg(path_obj, "shm_path", &path) < 0)
        return -1;
    key_arg_t k;
    if (key_get(key_obj, &k) < 0)
        return -1;
    rate_fair_config_t c;
    memset(&c, 0, sizeof c);
    c.limiter = lim->guard.handle;
    c.key = k.ptr;
    c.key_len = k.len;
    c.slots = (unsigned)slots;
    c.queue_max = (unsigned)queue_max;
    c.shm_path = path;
    char err[ERRLEN] = "";
    rate_fair_t *f = NULL;
    int rc;
    /* a user of the limiter from here: its close() refuses while this
     * runs without the GIL */
    lim->users++;
    Py_BEGIN_ALLOW_THREADS
    rc = rate_fair_new(&c, &f, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (rc == RATE_OK && (self->key = malloc(k.len)) != NULL) {
        memcpy(self->key, k.ptr, k.len);
        self->key_len = k.len;
    }
    key_release(&k);
    if (rc != RATE_OK) {
        lim->users--;
        raise_rc(rc, err);
        return -1;
    }
    if (!self->key || guard_init(&self->guard, f) < 0) {
        if (!self->key)
            PyErr_NoMemory();
        rate_fair_free(f);
        lim->users--;
        free(self->key);
        self->key = NULL;
        return -1;
    }
    /* a table shared by processes has a lock that may wait */
    self->memory_only = lim->memory_only && path == NULL;
    Py_INCREF(lim);
    self->limiter = lim;
    return 0;
}

static void fair_close(FairObject *self)
{
    if (!guard_close_begin(&self->guard))
        return;
    Py_BEGIN_ALLOW_THREADS
    rate_fair_free(guard_take(&self->guard));
    Py_END_ALLOW_THREADS
    self->limiter->users--;
}

static void Fair_dealloc(FairObject *self)
{
    fair_close(self);
    guard_fini(&self->guard);
    Py_XDECREF(self->limiter);
    Py_XDECREF(self->loop);
    free(self->key);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Fair_close(FairObject *self, PyObject *unused)
{
    (void)unused;
    fair_close(self);
    Py_RETURN_NONE;
}

/* The flow, permits and weight of a call on an open Fair; -1 with the
 * error. */
static int fair_args(FairObject *self, PyObject *flow_obj, PyObject *permits_obj,
                     PyObject *weight_obj, key_arg_t *k, uint64_t *permits,
                     uint32_t *weight)
{
    if (guard_usable(&self->guard, "Fair", FAIR_CLOSED) < 0)
        return -1;
    uint64_t w = 1;
    *permits = 1;
    if ((permits_obj && u64_arg(permits_obj, "permits", permits) < 0) ||
        (weight_obj && u64_arg(weight_obj, "weight", &w) < 0))
        return -1;
    if (w > RATE_FAIR_WEIGHT_MAX) {
        raise_rc(RATE_EINVAL, "weight above RATE_FAIR_WEIGHT_MAX (2^20)");
        return -1;
    }
    *weight = (uint32_t)w;
    return key_get(flow_obj, k);
}

/* check(flow, permits=1, *, weight=1, now=None) -> Decision */
static PyObject *Fair_check(FairObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"flow", "permits", "weight", "now", NULL};
    PyObject *flow_obj, *permits_obj = NULL, *weight_obj = NULL;
    PyObject *now_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O$OO:check", kwlist,
                                     &flow_obj, &permits_obj, &weight_obj,
                                     &now_obj))
        return NULL;
    uint64_t permits, now_ns = 0;
    uint32_t weight;
    key_arg_t k;
    if ((now_obj != Py_None && u64_arg(now_obj, "now", &now_ns) < 0) ||
        fair_args(self, flow_obj, permits_obj, weight_obj, &k, &permits,
                  &weight) < 0)
        return NULL;
    rate_decision_t d;
    int rc = 0, closed = 0;
    DECIDE_BEGIN(self)
    if (guard_enter(&self->guard) < 0) {
        closed = 1;
    } else {
        rate_fair_t *f = self->guard.handle;
        rc = now_obj != Py_None
                 ? rate_fair_check_at(f, k.ptr, k.len, weight, permits, now_ns,
                                      &d)
                 : rate_fair_check(f, k.ptr, k.len, weight, permits, &d);
        guard_leave(&self->guard);
    }
    DECIDE_END
    key_release(&k);
    if (closed)
        return guard_raise_closed(FAIR_CLOSED);
    if (rc != RATE_OK)
        return raise_rc(rc, NULL);
    return decision_new(&d);
}

/* Gives an admission nobody takes back to the shared limit (a waiter
 * interrupted or cancelled after it was admitted).  The fair limit is
 * open (its lock read-held), and so its limiter.
 * A refund that fails leaves the admission spent, as an unused one. */
static void fair_give_back(FairObject *self, uint64_t permits)
{
    /* at the time of the waiting calls' decisions: the fair clock's */
    (void)rate_limiter_refund_at(self->limiter->guard.handle, self->key,
                                 self->key_len, permits,
                                 rate_clock_monotonic_ns());
}

/* A blocking wait longer than a slice runs on a thread of its own, so
 * that the caller's thread can stop waiting at Ctrl-C without taking the
 * waiter out of its queue (the C call cannot be cut short, and a wait cut
 * into slices would lose its place in the queue at each).  The caller and
 * the thread share this record; the last one to leave frees it. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* its lock read-held by the thread while it waits; a reference of the
     * thread's once the caller abandoned the wait (see fair_wait_main) */
    FairObject *owner;
    char *flow;
    size_t flow_len;
    uint32_t weight;
    uint64_t permits, timeout_ns;
    int started, done, closed, abandoned, refs;
    int rc;
    rate_decision_t d;
} fair_wait_t;

static void fair_wait_unref(fair_wait_t *w)
{
    pthread_mutex_lock(&w->mu);
    int last = --w->refs == 0;
    pthread_mutex_unlock(&w->mu);
    if (last) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w->flow);
        free(w);
    }
}

/* Drops the reference the caller gave an abandoned waiter's thread (the
 * Fair's dealloc may run here, the waiter out of its guard: it never
 * waits).  At the interpreter's exit the reference is left: the process
 * ends with the Fair. */
static void fair_owner_release(FairObject *self)
{
#if PY_VERSION_HEX >= 0x030D0000
    if (Py_IsFinalizing())
        return;
#else
    if (_Py_IsFinalizing())
        return;
#endif
    PyGILState_STATE g = PyGILState_Ensure();
    Py_DECREF(self);
    PyGILState_Release(g);
}

static void *fair_wait_main(void *arg)
{
    fair_wait_t *w = arg;
    FairObject *self = w->owner;
    int closed = guard_enter(&self->guard) < 0;
    pthread_mutex_lock(&w->mu);
    w->started = 1;
    w->closed = closed;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    /* The caller waits for `started`: until this thread leaves the guard,
     * the fair limit stays open and the object alive (its close takes the
     * guard's write lock).  Closed, the object is not touched again. */
    int rc = RATE_OK;
    rate_decision_t d;
    memset(&d, 0, sizeof d);
    if (!closed)
        rc = rate_fair_acquire(self->guard.handle, w->flow, w->flow_len,
                               w->weight, w->permits, w->timeout_ns, &d);
    pthread_mutex_lock(&w->mu);
    w->rc = rc;
    w->d = d;
    w->done = 1;
    int abandoned = w->abandoned;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    if (!closed) {
        if (abandoned && rc == RATE_OK && d.allowed)
            fair_give_back(self, w->permits);
        guard_leave(&self->guard);
    }
    fair_wait_unref(w);
    if (abandoned)
        fair_owner_release(self);
    return NULL;
}

/* One slice of the caller's wait for the thread's answer. */
static int fair_wait_slice(void *ctx)
{
    fair_wait_t *w = ctx;
    pthread_mutex_lock(&w->mu);
    if (!w->done) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t at = (uint64_t)ts.tv_sec * RATE_NS_PER_S +
                      (uint64_t)ts.tv_nsec + WAIT_SLICE_NS;
        ts.tv_sec = (time_t)(at / RATE_NS_PER_S);
        ts.tv_nsec = (long)(at % RATE_NS_PER_S);
        pthread_cond_timedwait(&w->cv, &w->mu, &ts);
    }
    int more = !w->done;
    pthread_mutex_unlock(&w->mu);
    return more;
}

/* Waits on a thread of its own (see fair_wait_t): RATE_OK and *w's
 * answer, or -1 with the exception (Ctrl-C: the thread's admission, if
 * any, is given back). */
static int fair_wait_threaded(FairObject *self, const key_arg_t *k,
                              uint32_t weight, uint64_t permits,
                              uint64_t timeout_ns, int *closed, int *rc,
                              rate_decision_t *d)
{
    fair_wait_t *w = calloc(1, sizeof *w);
    if (!w || !(w->flow = malloc(k->len))) {
        free(w);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(w->flow, k->ptr, k->len);
    w->flow_len = k->len;
    w->owner = self;
    w->weight = weight;
    w->permits = permits;
    w->timeout_ns = timeout_ns;
    w->refs = 2;
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t th;
    int e = pthread_create(&th, &attr, fair_wait_main, w);
    pthread_attr_destroy(&attr);
    if (e != 0) {
        w->refs = 1;
        fair_wait_unref(w);
        errno = e;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&w->mu);
    while (!w->started)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    Py_END_ALLOW_THREADS
    int ret = 0;
    if (wait_in_slices(fair_wait_slice, w) < 0) {
        /* Still waiting, the thread keeps the Fair alive until answered:
         * freeing it (del, the interpreter's exit) would otherwise wait
         * for that answer, taking the guard's write lock. */
        pthread_mutex_lock(&w->mu);
        int done = w->done;
        w->abandoned = 1;
        if (!done)
            Py_INCREF(self);
        pthread_mutex_unlock(&w->mu);
        /* answered meanwhile: its admission, not to be used, goes back */
        if (done && !w->closed && w->rc == RATE_OK && w->d.allowed) {
            Py_BEGIN_ALLOW_THREADS
            if (guard_enter(&self->guard) == 0) {
                fair_give_back(self, permits);
                guard_leave(&self->guard);
            }
            Py_END_ALLOW_THREADS
        }
        ret = -1;
    } else {
        *closed = w->closed;
        *rc = w->rc;
        *d = w->d;
    }
    fair_wait_unref(w);
    return ret;
}

/* acquire(flow, permits=1, *, weight=1, timeout=0) -> Decision: waits in
 * the flow's queue (GIL released) until admitted or the timeout. */
static PyObject *Fair_acquire(FairObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"flow", "permits", "weight", "timeout", NULL};
    PyObject *flow_obj, *permits_obj = NULL, *weight_obj = NULL;
    PyObject *timeout_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O$OO:acquire", kwlist,
                                     &flow_obj, &permits_obj, &weight_obj,
                                     &timeout_obj))
        return NULL;
    uint64_t permits, timeout_ns;
    uint32_t weight;
    key_arg_t k;
    if (seconds_arg(timeout_obj, "timeout", 0, &timeout_ns) < 0 ||
        fair_args(self, flow_obj, permits_obj, weight_obj, &k, &permits,
                  &weight) < 0)
        return NULL;
    rate_decision_t d;
    int rc = 0, closed = 0;
    if (timeout_ns <= WAIT_SLICE_NS) {
        /* as long as a slice: waited for here */
        Py_BEGIN_ALLOW_THREADS
        if (guard_enter(&self->guard) < 0) {
            closed = 1;
        } else {
            rc = rate_fair_acquire(self->guard.handle, k.ptr, k.len, weight,
                                   permits, timeout_ns, &d);
            guard_leave(&self->guard);
        }
        Py_END_ALLOW_THREADS
    } else if (fair_wait_threaded(self, &k, weight, permits, timeout_ns,
                                  &closed, &rc, &d) < 0) {
        key_release(&k);
        return NULL;
    }
    key_release(&k);
    if (closed)
        return guard_raise_closed(FAIR_CLOSED);
    if (rc != RATE_OK)
        return raise_rc(rc, NULL);
    return decision_new(&d);
}

/* The asynchronous waiter's callback: the future gets the decision, or
 * Error (RATE_ECANCELED when the fair limit was closed first); a future
 * cancelled meanwhile nothing, and an admission it can no longer take
 * goes back to the shared limit.  ud: (future, fair, permits). */
static void fair_done(void *ud, int rc, const rate_decision_t *d)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *t = ud;
    PyObject *fut = PyTuple_GET_ITEM(t, 0);
    FairObject *self = (FairObject *)PyTuple_GET_ITEM(t, 1);
    self->in_flight--;
    if (future_done(fut)) {
        /* in the guard: a close() on another thread (and then its
         * limiter's) waits for the refund; one under way: no refund */
        if (rc == RATE_OK && d->allowed &&
            guard_enter_now(&self->guard) == 0) {
            uint64_t permits =
                PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, 2));
            Py_BEGIN_ALLOW_THREADS
            fair_give_back(self, permits);
            Py_END_ALLOW_THREADS
            guard_leave(&self->guard);
        }
    } else {
        future_answer(fut, rc, rc == RATE_OK ? decision_new(d) : NULL);
    }
    if (PyErr_Occurred())
        adapter_unraisable("ratelimit: asynchronous fair wait");
    Py_DECREF(t);
    PyGILState_Release(g);
}

/* _acquire_start(flow, permits, weight, timeout, future, loop) -> Decision
 * or None: the answer at once, or None and the future gets it (on the
 * loop's thread; never blocks on a table in this process). */
static PyObject *Fair_acquire_start(FairObject *self, PyObject *args)
{
    PyObject *flow_obj, *permits_obj, *weight_obj, *timeout_obj, *fut, *loop;
    if (!PyArg_ParseTuple(args, "OOOOOO:_acquire_start", &flow_obj,
                          &permits_obj, &weight_obj, &timeout_obj, &fut, &loop))
        return NULL;
    uint64_t permits, timeout_ns;
    uint32_t weight;
    key_arg_t k;
    if (seconds_arg(timeout_obj, "timeout", 0, &timeout_ns) < 0 ||
        fair_args(self, flow_obj, permits_obj, weight_obj, &k, &permits,
                  &weight) < 0)
        return NULL;
    if (self->loop && self->loop != loop) {
        key_release(&k);
        PyErr_SetString(PyExc_ValueError,
                        "the fair limit waits on one asyncio loop: its first "
                        "asynchronous acquire's");
        return NULL;
    }
    PyObject *t = Py_BuildValue("(OOK)", fut, (PyObject *)self,
                                (unsigned long long)permits);
    if (!t) {
        key_release(&k);
        return NULL;
    }
    rate_loop_t lt;
    aio_loop_init(&lt, loop);
    rate_decision_t d;
    /* The GIL stays held (the adapter and the callback run on this
     * thread); a close() under way on another thread is "closed". */
    if (guard_enter_now(&self->guard) < 0) {
        key_release(&k);
        Py_DECREF(t);
        return guard_raise_closed(FAIR_CLOSED);
    }
    self->in_flight++;
    int rc = rate_fair_acquire_start(self->guard.handle, &lt, k.ptr, k.len,
                                     weight, permits, timeout_ns, &d,
                                     fair_done, t);
    guard_leave(&self->guard);
    key_release(&k);
    if (rc == RATE_PENDING || rc == RATE_OK) {
        if (!self->loop) {
            Py_INCREF(loop);
            self->loop = loop;
        }
    }
    if (rc == RATE_PENDING)
        Py_RETURN_NONE;
    self->in_flight--;
    Py_DECREF(t);
    if (rc != RATE_OK)
        return raise_rc(rc, NULL);
    return decision_new(&d);
}

static PyObject *Fair_get_waiting(FairObject *self, void *c)
{
    (void)c;
    return PyLong_FromSsize_t(self->in_flight);
}

static PyObject *Fair_stats(FairObject *self, PyObject *unused)
{
    (void)unused;
    if (guard_usable(&self->guard, "Fair", FAIR_CLOSED) < 0)
        return NULL;
    rate_fair_stats_t st;
    int rc = 0, closed = 0;
    Py_BEGIN_ALLOW_THREADS
    if (guard_enter(&self->guard) < 0) {
        closed = 1;
    } else {
        rc = rate_fair_stats(self->guard.handle, &st);
        guard_leave(&self->guard);
    }
    Py_END_ALLOW_THREADS
    if (closed)
        return guard_raise_closed(FAIR_CLOSED);
    if (rc != RATE_OK)
        return raise_rc(rc, NULL);
    return Py_BuildValue("{sKsKsKsKsKsKsK}", "flows",
                         (unsigned long long)st.flows, "slots",
                         (unsigned long long)st.slots, "shared",
                         (unsigned long long)st.shared, "fair_denied",
                         (unsigned long long)st.fair_denied, "waiting",
                         (unsigned long long)st.waiting, "queue_full",
                         (unsigned long long)st.queue_full, "timed_out",
                         (unsigned long long)st.timed_out);
}

static PyGetSetDef Fair_getset[] = {
    {"pending", (getter)Fair_get_waiting, NULL,
     "asynchronous waiters of this object not yet answered", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMethodDef Fair_methods[] = {
    {"check", (PyCFunction)(void (*)(void))Fair_check,
     METH_VARARGS | METH_KEYWORDS,
     "check(flow, permits=1, *, weight=1, now=None) -> Decision"},
    {"acquire", (PyCFunction)(void (*)(void))Fair_acquire,
     METH_VARARGS | METH_KEYWORDS,
     "acquire(flow, permits=1, *, weight=1, timeout=0) -> Decision: waits "
     "in the flow's queue (GIL released; Ctrl-C ends the wait)"},
    {"_acquire_start", (PyCFunction)Fair_acquire_start, METH_VARARGS, NULL},
    {"stats", (PyCFunction)Fair_stats, METH_NOARGS,
     "stats() -> dict: flows, slots, shared, fair_denied, waiting, "
     "queue_full, timed_out"},
    {"close", (PyCFunction)Fair_close, METH_NOARGS, "frees the fair limit"},
    {"__enter__", enter_self, METH_NOARGS, NULL},
    {"__exit__", exit_close, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

PyTypeObject FairType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ratelimit.Fair",
    .tp_basicsize = sizeof(FairObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Fair(limiter, key, *, slots=0, queue_max=0, shm_path=None): "
              "the limiter's limit on `key` shared fairly by flows "
              "(docs/fair.md)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Fair_init,
    .tp_dealloc = (destructor)Fair_dealloc,
    .tp_methods = Fair_methods,
    .tp_getset = Fair_getset,
};

