/* SPDX-License-Identifier: MIT */
/*
 * limiter.c -- ratelimit.Limiter: a rate_limiter_t on a Store (or its own
 * memory store) and its calls: check, try_acquire (the fast call),
 * acquire (waits in slices, the GIL released), refund, penalize, reset,
 * headers, stats.  Its asynchronous decisions are in async.c.
 */
#include "binding.h"

#include <string.h>
#include <time.h>

static int Limiter_init(LimiterObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"policy", "store", "fail", "shadow", NULL};
    PyObject *policy, *store = Py_None, *fail_obj = Py_None;
    int shadow = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O$Op:Limiter", kwlist,
                                     &policy, &store, &fail_obj, &shadow))
        return -1;
    rate_limiter_config_t c;
    memset(&c, 0, sizeof c);
    if (guard_init_twice(&self->guard, "Limiter") < 0 ||
        policy_arg(policy, &c.policy) < 0 || store_arg(store) < 0)
        return -1;
    c.store = store == Py_None ? NULL : ((StoreObject *)store)->store;
    c.shadow = shadow != 0;
    if (fail_arg(fail_obj, &c.on_store_error) < 0)
        return -1;
    int rc;
    rate_limiter_t *lim = NULL;
    /* a user of the store from here: its close() refuses while this runs
     * without the GIL */
    self->memory_only = store_attach(store, &self->store);
    Py_BEGIN_ALLOW_THREADS
    rc = rate_limiter_new(&c, &lim);
    Py_END_ALLOW_THREADS
    int raised = 0; /* MemoryError of guard_init */
    if (rc == RATE_OK && guard_init(&self->guard, lim) < 0) {
        rate_limiter_free(lim);
        raised = 1;
    }
    if (rc != RATE_OK || raised) {
        if (!raised)
            raise_policy_rc(rc, store, c.policy);
        store_detach(self->store);
        Py_CLEAR(self->store);
        return -1;
    }
    Py_INCREF(policy);
    self->policy = policy;
    return 0;
}

static void limiter_close(LimiterObject *self)
{
    if (!guard_close_begin(&self->guard))
        return;
    Py_BEGIN_ALLOW_THREADS
    rate_limiter_free(guard_take(&self->guard));
    Py_END_ALLOW_THREADS
    store_detach(self->store);
}

static PyObject *Limiter_close(LimiterObject *self, PyObject *unused)
{
    (void)unused;
    if (self->in_flight > 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "the limiter has decisions in flight: await them first");
        return NULL;
    }
    if (self->users > 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "the limiter has open fair limits or held requests: "
                        "close or release them first");
        return NULL;
    }
    limiter_close(self);
    Py_RETURN_NONE;
}

static void Limiter_dealloc(LimiterObject *self)
{
    limiter_close(self);
    guard_fini(&self->guard);
    Py_XDECREF(self->store);
    Py_XDECREF(self->policy);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int limiter_usable(LimiterObject *self)
{
    return guard_usable(&self->guard, "Limiter", LIMITER_CLOSED);
}

int limiter_arg(PyObject *obj, LimiterObject **out)
{
    if (!PyObject_TypeCheck(obj, &LimiterType)) {
        PyErr_Format(PyExc_TypeError, "limiter must be a ratelimit.Limiter, not %.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    *out = (LimiterObject *)obj;
    return limiter_usable(*out);
}

/* check(key, permits=1, *, max_wait=0, now=None, policy=None) */
static PyObject *Limiter_check(LimiterObject *self, PyObject *const *args,
                               Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"key", "permits", "max_wait", "now",
                                        "policy", NULL};
    PyObject *a[5] = {NULL, NULL, Py_None, Py_None, Py_None};
    if (fast_args("check", args, nargs, kwnames, names, 2, 1, a) < 0)
        return NULL;
    PyObject *key_obj = a[0], *permits_obj = a[1], *wait_obj = a[2];
    PyObject *now_obj = a[3], *policy_obj = a[4];
    if (limiter_usable(self) < 0)
        return NULL;
    uint64_t permits = 1, wait_ns, now_ns = 0;
    if (permits_obj && u64_arg(permits_obj, "permits", &permits) < 0)
        return NULL;
    if (seconds_arg(wait_obj, "max_wait", 0, &wait_ns) < 0)
        return NULL;
    if (now_obj != Py_None && u64_arg(now_obj, "now", &now_ns) < 0)
        return NULL;
    const rate_policy_t *policy = NULL;
    if (policy_obj != Py_None && policy_arg(policy_obj, &policy) < 0)
        return NULL;
    key_arg_t k;
    if (key_get(key_obj, &k) < 0)
        return NULL;
    rate_decision_t d;
    int rc = 0, closed = 0, at = now_obj != Py_None;
    DECIDE_BEGIN(self)
    if (guard_enter(&self->guard) < 0) {
        closed = 1;
    } else {
        if (policy && at)
            rc = rate_limiter_check_policy_at(self->guard.handle, policy, k.ptr,
                                              k.len, permits, wait_ns, now_ns, &d);
        else if (policy)
            rc = rate_limiter_check_policy(self->guard.handle, policy, k.ptr, k.len,
                                           permits, wait_ns, &d);
        else if (at)
            rc = rate_limiter_check_at(self->guard.handle, k.ptr, k.len, permits,
                                       wait_ns, now_ns, &d);
        else
            rc = rate_limiter_check(self->guard.handle, k.ptr, k.len, permits,
                                    wait_ns, &d);
        guard_leave(&self->guard);
    }
    DECIDE_END
    key_release(&k);
    if (closed)
        return guard_raise_closed(LIMITER_CLOSED);
    if (rc != RATE_OK)
        return raise_policy_rc(rc, self->store, policy);
    return decision_new(&d);
}

/* try_acquire(key, permits=1, *, now=None) -> bool: the fast call; bad input
 * raises (the C call would answer False). */
static PyObject *Limiter_try_acquire(LimiterObject *self,
                                     PyObject *const *args, Py_ssize_t nargs,
                                     PyObject *kwnames)
{
    static const char *const names[] = {"key", "permits", "now", NULL};
    PyObject *a[3] = {NULL, NULL, Py_None};
    if (fast_args("try_acquire", args, nargs, kwnames, names, 2, 1, a) < 0)
        return NULL;
    PyObject *key_obj = a[0], *permits_obj = a[1], *now_obj = a[2];
    if (limiter_usable(self) < 0)
        return NULL;
    uint64_t permits = 1, now_ns = 0;
    if (permits_obj && u64_arg(permits_obj, "permits", &permits) < 0)
        return NULL;
    if (now_obj != Py_None && u64_arg(now_obj, "now", &now_ns) < 0)
        return NULL;
    if (permits > RATE_TIME_MAX || now_ns > RATE_TIME_MAX)
        return raise_rc(RATE_ERANGE, NULL);
    key_arg_t k;
    if (key_get(key_obj, &k) < 0)
        return NULL;
    if (k.len == 0 || k.len > RATE_KEY_MAX ||
        (k.len >= RATE_KEY_RESERVED_LEN &&
         memcmp(k.ptr, RATE_KEY_RESERVED, RATE_KEY_RESERVED_LEN) == 0)) {
        key_release(&k);
        return raise_rc(RATE_EKEY, NULL);
    }
    bool ok = false;
    int closed = 0;
    DECIDE_BEGIN(self)
    if (guard_enter(&self->guard) < 0) {
        closed = 1;
    } else {
        ok = now_obj != Py_None
                 ? rate_try_acquire_len_at(self->guard.handle, k.ptr, k.len, permits, now_ns)
                 : rate_try_acquire_len(self->guard.handle, k.ptr, k.len, permits);
        guard_leave(&self->guard);
    }
    DECIDE_END
    key_release(&k);
    if (closed)
        return guard_raise_closed(LIMITER_CLOSED);
    return PyBool_FromLong(ok);
}

int wait_in_slices(int (*step)(void *ctx), void *ctx)
{
    for (;;) {
        int more;
        Py_BEGIN_ALLOW_THREADS
        more = step(ctx);
        Py_END_ALLOW_THREADS
        if (!more)
            return 0;
        if (PyErr_CheckSignals() < 0)
            return -1;
    }
}

/* acquire()'s wait, which goes in slices (wait_in_slices). */
typedef struct {
    LimiterObject *self;
    key_arg_t k;
    uint64_t permits, timeout_ns, start;
    rate_decision_t d;
    int rc, closed;
} acquire_wait_t;

/* One slice: the library's acquire for what is left of the timeout, at
 * most a slice; then, denied with a retry within the timeout, a pause
 * until it (at most a slice) and 1 to go on. */
static int acquire_slice(void *ctx)
{
    acquire_wait_t *a = ctx;
    uint64_t spent = rate_clock_monotonic_ns() - a->start;
    uint64_t left = spent < a->timeout_ns ? a->timeout_ns - spent : 0;
    if (guard_enter(&a->self->guard) < 0) {
        a->closed = 1;
        return 0;
    }
    a->rc = rate_limiter_acquire(a->self->guard.handle, a->k.ptr, a->k.len,
                                 a->permits,
                                 left < WAIT_SLICE_NS ? left : WAIT_SLICE_NS,
                                 &a->d);
    guard_leave(&a->self->guard);
    if (a->rc != RATE_OK || a->d.allowed ||
        a->d.reason != RATE_REASON_LIMITED || a->d.retry_after_ns > left ||
        a->d.retry_after_ns == 0)
        return 0;
    uint64_t pause = a->d.retry_after_ns < WAIT_SLICE_NS ? a->d.retry_after_ns
                                                         : WAIT_SLICE_NS;
    struct timespec ts = {(time_t)(pause / RATE_NS_PER_S),
                          (long)(pause % RATE_NS_PER_S)};
    nanosleep(&ts, NULL); /* a signal cuts it short: its handler runs next */
    return 1;
}

/* acquire(key, permits=1, *, timeout=0) -> Decision: waits (GIL released). */
static PyObject *Limiter_acquire(LimiterObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"key", "permits", "timeout", NULL};
    PyObject *key_obj, *permits_obj = NULL, *timeout_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O$O:acquire", kwlist,
                                     &key_obj, &permits_obj, &timeout_obj))
        return NULL;
    if (limiter_usable(self) < 0)
        return NULL;
    acquire_wait_t a;
    memset(&a, 0, sizeof a);
    a.self = self;
    a.permits = 1;
    if (permits_obj && u64_arg(permits_obj, "permits", &a.permits) < 0)
        return NULL;
    if (seconds_arg(timeout_obj, "timeout", 0, &a.timeout_ns) < 0)
        return NULL;
    if (key_get(key_obj, &a.k) < 0)
        return NULL;
    a.start = rate_clock_monotonic_ns();
    int interrupted = wait_in_slices(acquire_slice, &a) < 0;
    key_release(&a.k);
    if (interrupted)
        return NULL;
    if (a.closed)
        return guard_raise_closed(LIMITER_CLOSED);
    if (a.rc != RATE_OK)
        return raise_rc(a.rc, NULL);
    return decision_new(&a.d);
}

enum change { CHANGE_REFUND, CHANGE_PENALIZE, CHANGE_RESET };

static PyObject *limiter_change(LimiterObject *self, PyObject *args,
                                PyObject *kw, enum change what)
{
    static char *kwlist[] = {"key", "permits", "now", "policy", NULL};
    PyObject *key_obj, *permits_obj = NULL, *now_obj = Py_None;
    PyObject *policy_obj = Py_None;
    if (what == CHANGE_RESET) {
        static char *kwreset[] = {"key", NULL};
        if (!PyArg_ParseTupleAndKeywords(args, kw, "O:reset", kwreset, &key_obj))
            return NULL;
    } else if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O$OO:change", kwlist,
                                            &key_obj, &permits_obj, &now_obj,
                                            &policy_obj)) {
        return NULL;
    }
    if (limiter_usable(self) < 0)
        return NULL;
    uint64_t permits = 1, now_ns = 0;
    if (permits_obj && u64_arg(permits_obj, "permits", &permits) < 0)
        return NULL;
    if (now_obj != Py_None && u64_arg(now_obj, "now", &now_ns) < 0)
        return NULL;
    const rate_policy_t *policy = NULL;
    if (policy_obj != Py_None) {
        if (what != CHANGE_REFUND) {
            PyErr_SetString(PyExc_TypeError,
                            "policy must be a ratelimit.Policy (refund only)");
            return NULL;
        }
        if (policy_arg(policy_obj, &policy) < 0)
            return NULL;
    }
    key_arg_t k;
    if (key_get(key_obj, &k) < 0)
        return NULL;
    int rc = 0, closed = 0, at = now_obj != Py_None;
    Py_BEGIN_ALLOW_THREADS
    if (guard_enter(&self->guard) < 0) {
        closed = 1;
    } else {
        rate_limiter_t *l = self->guard.handle;
        switch (what) {
        case CHANGE_REFUND:
            if (policy)
                rc = at ? rate_limiter_refund_policy_at(l, policy, k.ptr, k.len,
                                                        permits, now_ns)
                        : rate_limiter_refund_policy(l, policy, k.ptr, k.len,
                                                     permits);
            else
                rc = at ? rate_limiter_refund_at(l, k.ptr, k.len, permits, now_ns)
                        : rate_limiter_refund(l, k.ptr, k.len, permits);
            break;
        case CHANGE_PENALIZE:
            rc = at ? rate_limiter_penalize_at(l, k.ptr, k.len, permits, now_ns)
                    : rate_limiter_penalize(l, k.ptr, k.len, permits);
            break;
        case CHANGE_RESET:
            rc = rate_limiter_reset(l, k.ptr, k.len);
            break;
        }
        guard_leave(&self->guard);
    }
    Py_END_ALLOW_THREADS
    key_release(&k);
    if (closed)
        return guard_raise_closed(LIMITER_CLOSED);
    if (rc != RATE_OK)
        return raise_rc(rc, NULL);
    Py_RETURN_NONE;
}

static PyObject *Limiter_refund(LimiterObject *self, PyObject *a, PyObject *kw)
{
    return limiter_change(self, a, kw, CHANGE_REFUND);
}

static PyObject *Limiter_penalize(LimiterObject *self, PyObject *a, PyObject *kw)
{
    return limiter_change(self, a, kw, CHANGE_PENALIZE);
}

static PyObject *Limiter_reset(LimiterObject *self, PyObject *a, PyObject *kw)
{
    return limiter_change(self, a, kw, CHANGE_RESET);
}

/* headers(decision, policy=None) -> (status, {field: value}): the RateLimit
 * header fields (ratelimit_http.h) of a decision made under `policy` (the
 * limiter's default when None). */
static PyObject *Limiter_headers(LimiterObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"decision", "policy", NULL};
    PyObject *dec, *policy_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:headers", kwlist, &dec,
                                     &policy_obj))
        return NULL;
    if (limiter_usable(self) < 0)
        return NULL;
    if (policy_obj == Py_None)
        policy_obj = self->policy;
    const rate_policy_t *policy;
    if (policy_arg(policy_obj, &policy) < 0)
        return NULL;
    rate_decision_t d;
    if (decision_from(dec, &d) < 0)
        return NULL;
    rate_headers_t h;
    int rc = rate_headers_format(policy, &d, &h);
    if (rc != RATE_OK)
        return raise_rc(rc, NULL);
    return headers_new(&h);
}

static PyObject *Limiter_stats(LimiterObject *self, PyObject *unused)
{
    (void)unused;
    if (limiter_usable(self) < 0)
        return NULL;
    rate_stats_t st;
    int rc = 0, closed = 0;
    Py_BEGIN_ALLOW_THREADS
    if (guard_enter(&self->guard) < 0) {
        closed = 1;
    } else {
        rc = rate_limiter_stats(self->guard.handle, &st);
        guard_leave(&self->guard);
    }
    Py_END_ALLOW_THREADS
    if (closed)
        return guard_raise_closed(LIMITER_CLOSED);
    if (rc != RATE_OK)
        return raise_rc(rc, NULL);
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K}", "keys",
                         (unsigned long long)st.keys, "allowed",
                         (unsigned long long)st.allowed, "denied",
                         (unsigned long long)st.denied, "store_errors",
                         (unsigned long long)st.store_errors, "evictions",
                         (unsigned long long)st.evictions);
}

static PyObject *Limiter_get_policy(LimiterObject *self, void *c)
{
    (void)c;
    if (!self->policy)
        Py_RETURN_NONE;
    Py_INCREF(self->policy);
    return self->policy;
}

static PyObject *Limiter_get_store(LimiterObject *self, void *c)
{
    (void)c;
    PyObject *s = self->store ? self->store : Py_None;
    Py_INCREF(s);
    return s;
}

static PyObject *Limiter_get_closed(LimiterObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->guard.handle == NULL);
}

static PyMethodDef Limiter_methods[] = {
    {"check", (PyCFunction)(void (*)(void))Limiter_check,
     METH_FASTCALL | METH_KEYWORDS,
     "check(key, permits=1, *, max_wait=0, now=None, policy=None) -> Decision"},
    {"_check_start", (PyCFunction)Limiter_check_start, METH_VARARGS,
     "_check_start(key, permits, max_wait, future, now=None) -> Decision or None"},
    {"try_acquire", (PyCFunction)(void (*)(void))Limiter_try_acquire,
     METH_FASTCALL | METH_KEYWORDS,
     "try_acquire(key, permits=1, *, now=None) -> bool"},
    {"acquire", (PyCFunction)(void (*)(void))Limiter_acquire,
     METH_VARARGS | METH_KEYWORDS,
     "acquire(key, permits=1, *, timeout=0) -> Decision: waits up to timeout s"},
    {"refund", (PyCFunction)(void (*)(void))Limiter_refund,
     METH_VARARGS | METH_KEYWORDS,
     "refund(key, permits=1, *, now=None, policy=None): gives permits back"},
    {"penalize", (PyCFunction)(void (*)(void))Limiter_penalize,
     METH_VARARGS | METH_KEYWORDS,
     "penalize(key, permits=1, *, now=None): charges permits whatever remains"},
    {"reset", (PyCFunction)(void (*)(void))Limiter_reset,
     METH_VARARGS | METH_KEYWORDS, "reset(key): forgets the key"},
    {"headers", (PyCFunction)(void (*)(void))Limiter_headers,
     METH_VARARGS | METH_KEYWORDS,
     "headers(decision, policy=None) -> (status, fields)"},
    {"stats", (PyCFunction)Limiter_stats, METH_NOARGS, "the limiter's figures"},
    {"close", (PyCFunction)Limiter_close, METH_NOARGS,
     "frees the limiter; later calls raise ValueError"},
    {"__enter__", enter_self, METH_NOARGS, NULL},
    {"__exit__", exit_close, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Limiter_getset[] = {
    {"policy", (getter)Limiter_get_policy, NULL, "the default policy", NULL},
    {"store", (getter)Limiter_get_store, NULL, "the store (None: private)", NULL},
    {"closed", (getter)Limiter_get_closed, NULL, "closed already", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject LimiterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ratelimit.Limiter",
    .tp_basicsize = sizeof(LimiterObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Limiter(policy, store=None, *, fail='closed', shadow=False)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Limiter_init,
    .tp_dealloc = (destructor)Limiter_dealloc,
    .tp_methods = Limiter_methods,
    .tp_getset = Limiter_getset,
};

