/* SPDX-License-Identifier: MIT */
/*
 * limits.c -- _LimitsCalls, the base of ratelimit.limits_storage's storage
 * for `limits` (docs/python.md, "limits and Flask-Limiter"): its hot calls
 * in C, incr (a fixed window's hit), get and get_expiry (its test and
 * window stats, which Flask-Limiter's headers ask for each request) and
 * acquire_entry (a moving window's hit).
 *
 * The storage's Python side parses a key made by limits's key_for once
 * and keeps what a decision on it needs in two dicts (a key -> (policy,
 * expiry, store key, limit) for the fixed window; a key -> (policy, limit,
 * expiry, store key) for the moving window).  A call whose key is there,
 * with the same limit and expiry, is decided here without a Python frame
 * or a Decision; any other call goes to the storage's _incr, _get,
 * _get_expiry or _acquire_entry, which check it, fill the dicts and
 * decide.  A store
 * failure goes to its _store_failed, which raises.
 */
#include "binding.h"

#include <limits.h>
#include <math.h>
#include <time.h>

typedef struct {
    PyObject_HEAD
    PyObject *limiter; /* the Limiter deciding (set by _use); NULL: none */
    PyObject *fixed;   /* dict: key -> (policy, expiry, store key, limit) */
    PyObject *moving;  /* dict: key -> (policy, limit, expiry, store key) */
} LimitsCallsObject;

static PyObject *LimitsCalls_new(PyTypeObject *type, PyObject *args,
                                 PyObject *kw)
{
    (void)args;
    (void)kw;
    LimitsCallsObject *self = (LimitsCallsObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->fixed = PyDict_New();
    self->moving = PyDict_New();
    if (!self->fixed || !self->moving) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int LimitsCalls_traverse(LimitsCallsObject *self, visitproc visit,
                                void *arg)
{
    Py_VISIT(self->limiter);
    Py_VISIT(self->fixed);
    Py_VISIT(self->moving);
    return 0;
}

static int LimitsCalls_clear(LimitsCallsObject *self)
{
    Py_CLEAR(self->limiter);
    Py_CLEAR(self->fixed);
    Py_CLEAR(self->moving);
    return 0;
}

static void LimitsCalls_dealloc(LimitsCallsObject *self)
{
    PyObject_GC_UnTrack(self);
    LimitsCalls_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* _use(limiter): the Limiter that decides from now on. */
static PyObject *LimitsCalls_use(LimitsCallsObject *self, PyObject *limiter)
{
    if (!PyObject_TypeCheck(limiter, &LimiterType)) {
        PyErr_Format(PyExc_TypeError, "limiter must be a ratelimit.Limiter, not %.100s",
                     Py_TYPE(limiter)->tp_name);
        return NULL;
    }
    Py_INCREF(limiter);
    Py_XSETREF(self->limiter, limiter);
    Py_RETURN_NONE;
}

/* The call on the storage's Python side (`name`: _incr, _acquire_entry)
 * with the arguments as they came. */
static PyObject *slow_call(LimitsCallsObject *self, const char *name,
                           PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames)
{
    PyObject *m = PyObject_GetAttrString((PyObject *)self, name);
    if (!m)
        return NULL;
    PyObject *r = PyObject_Vectorcall(m, args, (size_t)nargs, kwnames);
    Py_DECREF(m);
    return r;
}

/* One decision of `policy_obj` (a Policy) on the store key `skey` for
 * `permits_obj` permits (NULL: 1), as Limiter.check(skey, permits,
 * policy=policy) makes it: 0 with *d and *permits, or -1 with the error
 * raised (bad permits, a closed limiter, the library's error, a store
 * failure by the storage's _store_failed). */
static int decide(LimitsCallsObject *self, PyObject *policy_obj, PyObject *skey,
                  PyObject *permits_obj, uint64_t *permits, rate_decision_t *d)
{
    LimiterObject *lim = (LimiterObject *)self->limiter;
    const rate_policy_t *policy;
    if (!lim) {
        PyErr_SetString(PyExc_RuntimeError, "the storage has no limiter");
        return -1;
    }
    *permits = 1;
    if (guard_usable(&lim->guard, "Limiter", LIMITER_CLOSED) < 0 ||
        (permits_obj && u64_arg(permits_obj, "permits", permits) < 0) ||
        policy_arg(policy_obj, &policy) < 0)
        return -1;
    key_arg_t k;
    if (key_get(skey, &k) < 0)
        return -1;
    int rc = 0, closed = 0;
    Py_INCREF(lim); /* the storage may swap its limiter meanwhile */
    DECIDE_BEGIN(lim)
    if (guard_enter(&lim->guard) < 0) {
        closed = 1;
    } else {
        rc = rate_limiter_check_policy(lim->guard.handle, policy, k.ptr, k.len,
                                       *permits, 0, d);
        guard_leave(&lim->guard);
    }
    DECIDE_END
    key_release(&k);
    int out = -1;
    if (closed)
        guard_raise_closed(LIMITER_CLOSED);
    else if (rc != RATE_OK)
        raise_policy_rc(rc, lim->store, policy);
    else if (d->reason == RATE_REASON_STORE_ERROR) {
        PyObject *dec = decision_new(d);
        if (dec) {
            PyObject *r = PyObject_CallMethod((PyObject *)self, "_store_failed",
                                              "OO", dec, policy_obj);
            Py_XDECREF(r);
            Py_DECREF(dec);
            if (r && !PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError,
                                "_store_failed returned without raising");
        }
    } else
        out = 0;
    Py_DECREF(lim);
    return out;
}

/* The entry kept for `key` in `dict` (a tuple of 4), held in *e, when
 * args[i] equals its item at[i] for each i below n: 1; 0 when there is none
 * or they differ (the call then goes to the slow path); -1 with the error
 * raised.  Held because a comparison may run Python code that changes the
 * dict, and a decision that releases the GIL lets other threads in. */
static int entry_for(PyObject *dict, PyObject *key, PyObject *const *args,
                     const int *at, int n, PyObject **e)
{
    *e = PyDict_GetItemWithError(dict, key);
    if (!*e)
        return PyErr_Occurred() ? -1 : 0;
    if (!PyTuple_CheckExact(*e) || PyTuple_GET_SIZE(*e) != 4) {
        *e = NULL; /* not ours: the slow path */
        return 0;
    }
    Py_INCREF(*e);
    for (int i = 0; i < n; i++) {
        int same = PyObject_RichCompareBool(args[i], PyTuple_GET_ITEM(*e, at[i]),
                                            Py_EQ);
        if (same <= 0) {
            Py_CLEAR(*e);
            return same;
        }
    }
    return 1;
}

/* A fixed window's count from a decision under `limit_obj` (an int):
 * limit - remaining, plus `extra` (a denied hit's permits: the count it
 * would have made). */
static PyObject *count_of(PyObject *limit_obj, const rate_decision_t *d,
                          uint64_t extra)
{
    unsigned long long limit = PyLong_AsUnsignedLongLong(limit_obj);
    int fits = !(limit == (unsigned long long)-1 && PyErr_Occurred());
    if (!fits)
        PyErr_Clear(); /* Python's arithmetic below */
    unsigned long long used = limit - d->remaining;
    if (fits && d->remaining <= limit && extra <= ULLONG_MAX - used)
        return PyLong_FromUnsignedLongLong(used + extra);
    PyObject *rem = PyLong_FromUnsignedLongLong(d->remaining);
    PyObject *n = PyLong_FromUnsignedLongLong(extra);
    PyObject *u = rem ? PyNumber_Subtract(limit_obj, rem) : NULL;
    PyObject *out = u && n ? PyNumber_Add(u, n) : NULL;
    Py_XDECREF(rem);
    Py_XDECREF(n);
    Py_XDECREF(u);
    return out;
}

/* incr(key, expiry, elastic_expiry=False, amount=1): the fixed window's
 * hit, as the storage's _incr documents it. */
static PyObject *LimitsCalls_incr(LimitsCallsObject *self, PyObject *const *args,
                                  Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"key", "expiry", "elastic_expiry",
                                        "amount", NULL};
    PyObject *a[4] = {NULL, NULL, NULL, NULL};
    if (fast_args("incr", args, nargs, kwnames, names, 4, 2, a) < 0)
        return NULL;
    PyObject *e = NULL;
    int found = 0;
    if (a[0] && a[1] && (!a[2] || a[2] == Py_False))
        found = entry_for(self->fixed, a[0], &a[1], (const int[]){1}, 1, &e);
    if (found <= 0)
        return found < 0 ? NULL : slow_call(self, "_incr", args, nargs, kwnames);
    PyObject *limit_obj = PyTuple_GET_ITEM(e, 3);
    uint64_t permits;
    rate_decision_t d;
    int rc = decide(self, PyTuple_GET_ITEM(e, 0), PyTuple_GET_ITEM(e, 2), a[3],
                    &permits, &d);
    PyObject *out = rc == 0 ? count_of(limit_obj, &d, d.allowed ? 0 : permits)
                            : NULL;
    Py_DECREF(e);
    return out;
}

/* get(key) and get_expiry(key): the count of a key's fixed window; when
 * its quota is whole again, in seconds since the epoch rounded up (as
 * math.ceil(time.time() + reset_after)).  A key not kept goes to the
 * storage's `slow` (_get, _get_expiry). */
static PyObject *fixed_query(LimitsCallsObject *self, PyObject *key,
                             int expiry, const char *slow)
{
    PyObject *e = NULL;
    int found = entry_for(self->fixed, key, NULL, NULL, 0, &e);
    if (found <= 0)
        return found < 0 ? NULL
                         : PyObject_CallMethod((PyObject *)self, slow, "O", key);
    PyObject *zero = PyLong_FromLong(0);
    uint64_t permits;
    rate_decision_t d;
    int rc = zero ? decide(self, PyTuple_GET_ITEM(e, 0), PyTuple_GET_ITEM(e, 2),
                           zero, &permits, &d)
                  : -1;
    Py_XDECREF(zero);
    PyObject *out = NULL;
    if (rc == 0 && expiry) {
        /* as limits_storage._reset_at: now for nothing to give back */
        const rate_clock_t *wall = rate_clock_wall();
        double now = (double)wall->now_ns(wall->ud) / 1e9;
        double reset = d.reset_after_ns == RATE_NEVER
                           ? INFINITY
                           : (double)d.reset_after_ns / 1e9;
        out = PyLong_FromDouble(reset == 0 ? floor(now) : ceil(now + reset));
    } else if (rc == 0)
        out = count_of(PyTuple_GET_ITEM(e, 3), &d, 0);
    Py_DECREF(e);
    return out;
}

static PyObject *LimitsCalls_get(LimitsCallsObject *self, PyObject *key)
{
    return fixed_query(self, key, 0, "_get");
}

static PyObject *LimitsCalls_get_expiry(LimitsCallsObject *self, PyObject *key)
{
    return fixed_query(self, key, 1, "_get_expiry");
}

/* acquire_entry(key, limit, expiry, amount=1): the moving window's hit,
 * whether it was admitted. */
static PyObject *LimitsCalls_acquire_entry(LimitsCallsObject *self,
                                           PyObject *const *args,
                                           Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"key", "limit", "expiry", "amount",
                                        NULL};
    PyObject *a[4] = {NULL, NULL, NULL, NULL};
    if (fast_args("acquire_entry", args, nargs, kwnames, names, 4, 3, a) < 0)
        return NULL;
    PyObject *e = NULL;
    int found = 0;
    if (a[0] && a[1] && a[2])
        found = entry_for(self->moving, a[0], &a[1], (const int[]){1, 2}, 2, &e);
    if (found <= 0)
        return found < 0 ? NULL
                         : slow_call(self, "_acquire_entry", args, nargs, kwnames);
    uint64_t permits;
    rate_decision_t d;
    int rc = decide(self, PyTuple_GET_ITEM(e, 0), PyTuple_GET_ITEM(e, 3), a[3],
                    &permits, &d);
    Py_DECREF(e);
    if (rc < 0)
        return NULL;
    return PyBool_FromLong(d.allowed);
}

static PyMethodDef LimitsCalls_methods[] = {
    {"incr", (PyCFunction)(void (*)(void))LimitsCalls_incr,
     METH_FASTCALL | METH_KEYWORDS,
     "incr(key, expiry, elastic_expiry=False, amount=1) -> int: the fixed "
     "window's hit: the count after it when admitted; when denied, the "
     "count it would have made (above the limit), charging nothing"},
    {"acquire_entry", (PyCFunction)(void (*)(void))LimitsCalls_acquire_entry,
     METH_FASTCALL | METH_KEYWORDS,
     "acquire_entry(key, limit, expiry, amount=1) -> bool: the moving "
     "window's hit"},
    {"get", (PyCFunction)LimitsCalls_get, METH_O,
     "get(key) -> int: the count of the key's fixed window"},
    {"get_expiry", (PyCFunction)LimitsCalls_get_expiry, METH_O,
     "get_expiry(key) -> int: when the key's fixed window is whole again "
     "(seconds since the epoch, rounded up)"},
    {"_use", (PyCFunction)LimitsCalls_use, METH_O,
     "_use(limiter): the Limiter that decides"},
    {NULL, NULL, 0, NULL}};

static PyObject *LimitsCalls_get_fixed(LimitsCallsObject *self, void *c)
{
    (void)c;
    return Py_NewRef(self->fixed);
}

static PyObject *LimitsCalls_get_moving(LimitsCallsObject *self, void *c)
{
    (void)c;
    return Py_NewRef(self->moving);
}

static PyGetSetDef LimitsCalls_getset[] = {
    {"_fixed", (getter)LimitsCalls_get_fixed, NULL,
     "key -> (policy, expiry, store key, limit) of the fixed window", NULL},
    {"_moving", (getter)LimitsCalls_get_moving, NULL,
     "key -> (policy, limit, expiry, store key) of the moving window", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject LimitsCallsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ratelimit._LimitsCalls",
    .tp_basicsize = sizeof(LimitsCallsObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The hot calls of the storage for limits (limits_storage).",
    .tp_new = LimitsCalls_new,
    .tp_dealloc = (destructor)LimitsCalls_dealloc,
    .tp_traverse = (traverseproc)LimitsCalls_traverse,
    .tp_clear = (inquiry)LimitsCalls_clear,
    .tp_methods = LimitsCalls_methods,
    .tp_getset = LimitsCalls_getset,
};
