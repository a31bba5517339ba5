/* SPDX-License-Identifier: MIT */
/*
 * synced.c -- the synced mode (docs/sync.md): ratelimit.SyncedLimiter, a
 * rate_synced_t deciding locally on leases borrowed from a remote Store,
 * within the bound its header states.  Every call may wait for a round
 * trip (its own or another thread's on the same key): each releases the
 * GIL.  close() gives the leases back (one round trip per key held).
 */
#include "binding.h"

#include <stdint.h>
#include <string.h>

#include "ratelimit_synced.h"

typedef struct {
    PyObject_HEAD
    guard_t guard;    /* a rate_synced_t */
    PyObject *store;  /* the remote StoreObject, kept open while this is */
    PyObject *policy; /* the PolicyObject */
} SyncedObject;

#define SYNCED_CLOSED "the synced limiter is closed"

static int Synced_init(SyncedObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"policy", "remote", "lease", "lease_ttl",
                             "max_keys", "fail", "retry", "denial_ttl",
                             "prefetch", "sweep", NULL};
    PyObject *policy, *remote, *lease_obj = NULL, *ttl_obj = Py_None;
    PyObject *max_keys_obj = NULL, *fail_obj = Py_None, *retry_obj = Py_None;
    PyObject *denial_obj = Py_None, *sweep_obj = Py_None;
    int prefetch = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|$OOOOOOpO:SyncedLimiter",
                                     kwlist, &policy, &remote, &lease_obj,
                                     &ttl_obj, &max_keys_obj, &fail_obj,
                                     &retry_obj, &denial_obj, &prefetch,
                                     &sweep_obj))
        return -1;
    rate_synced_config_t c;
    memset(&c, 0, sizeof c);
    unsigned long long lease = 0, max_keys = 0;
    if (guard_init_twice(&self->guard, "SyncedLimiter") < 0 ||
        policy_arg(policy, &c.policy) < 0 || store_arg(remote) < 0 ||
        uint_opt(lease_obj, "lease", UINT64_MAX, &lease) < 0 ||
        uint_opt(max_keys_obj, "max_keys", SIZE_MAX, &max_keys) < 0 ||
        seconds_arg(ttl_obj, "lease_ttl", 0, &c.lease_ttl_ns) < 0 ||
        seconds_arg(retry_obj, "retry", 0, &c.retry_ns) < 0 ||
        seconds_arg(denial_obj, "denial_ttl", 0, &c.denial_ttl_ns) < 0 ||
        seconds_arg(sweep_obj, "sweep", 0, &c.sweep_ns) < 0 ||
        fail_arg(fail_obj, &c.on_store_error) < 0)
        return -1;
    if (remote == Py_None) {
        PyErr_SetString(PyExc_TypeError,
                        "remote must be a ratelimit.Store, not None");
        return -1;
    }
    c.remote = ((StoreObject *)remote)->store;
    c.lease = lease;
    c.max_keys = (size_t)max_keys;
    c.prefetch = prefetch != 0;
    char err[ERRLEN] = "";
    rate_synced_t *s = NULL;
    int rc;
    /* a user of the store from here: its close() refuses while this runs
     * without the GIL */
    store_attach(remote, &self->store);
    Py_BEGIN_ALLOW_THREADS
    rc = rate_synced_new(&c, &s, err, sizeof err);
    Py_END_ALLOW_THREADS
    int raised = 0; /* MemoryError of guard_init */
    if (rc == RATE_OK && guard_init(&self->guard, s) < 0) {
        Py_BEGIN_ALLOW_THREADS
        rate_synced_free(s);
        Py_END_ALLOW_THREADS
        raised = 1;
    }
    if (rc != RATE_OK || raised) {
        if (!raised)
            raise_rc(rc, err);
        store_detach(self->store);
        Py_CLEAR(self->store);
        return -1;
    }
    Py_INCREF(policy);
    self->policy = policy;
    return 0;
}

static void synced_close(SyncedObject *self)
{
    if (!guard_close_begin(&self->guard))
        return;
    Py_BEGIN_ALLOW_THREADS
    rate_synced_free(guard_take(&self->guard));
    Py_END_ALLOW_THREADS
    store_detach(self->store);
}

static void Synced_dealloc(SyncedObject *self)
{
    synced_close(self);
    guard_fini(&self->guard);
    Py_XDECREF(self->store);
    Py_XDECREF(self->policy);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Synced_close(SyncedObject *self, PyObject *unused)
{
    (void)unused;
    synced_close(self);
    Py_RETURN_NONE;
}

/* After a call: 0, or -1 with its error raised (closed meanwhile, or the
 * library's). */
static int synced_result(int closed, int rc)
{
    if (closed) {
        guard_raise_closed(SYNCED_CLOSED);
        return -1;
    }
    if (rc != RATE_OK) {
        raise_rc(rc, NULL);
        return -1;
    }
    return 0;
}

/* The decision for check() and try_acquire(); -1 with the error raised. */
static int synced_decide(SyncedObject *self, PyObject *args, PyObject *kw,
                         const char *fmt, rate_decision_t *d)
{
    static char *kwlist[] = {"key", "permits", "now", NULL};
    PyObject *key_obj, *permits_obj = NULL, *now_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, kwlist, &key_obj,
                                     &permits_obj, &now_obj))
        return -1;
    if (guard_usable(&self->guard, "SyncedLimiter", SYNCED_CLOSED) < 0)
        return -1;
    uint64_t permits = 1, now_ns = 0;
    if ((permits_obj && u64_arg(permits_obj, "permits", &permits) < 0) ||
        (now_obj != Py_None && u64_arg(now_obj, "now", &now_ns) < 0))
        return -1;
    key_arg_t k;
    if (key_get(key_obj, &k) < 0)
        return -1;
    int rc = 0, closed = 0;
    Py_BEGIN_ALLOW_THREADS
    if (guard_enter(&self->guard) < 0) {
        closed = 1;
    } else {
        rc = now_obj != Py_None
                 ? rate_synced_check_at(self->guard.handle, k.ptr, k.len,
                                        permits, now_ns, d)
                 : rate_synced_check(self->guard.handle, k.ptr, k.len,
                                     permits, d);
        guard_leave(&self->guard);
    }
    Py_END_ALLOW_THREADS
    key_release(&k);
    return synced_result(closed, rc);
}

/* check(key, permits=1, *, now=None) -> Decision */
static PyObject *Synced_check(SyncedObject *self, PyObject *args, PyObject *kw)
{
    rate_decision_t d;
    if (synced_decide(self, args, kw, "O|O$O:check", &d) < 0)
        return NULL;
    return decision_new(&d);
}

/* try_acquire(key, permits=1, *, now=None) -> bool; bad input raises. */
static PyObject *Synced_try_acquire(SyncedObject *self, PyObject *args,
                                    PyObject *kw)
{
    rate_decision_t d;
    if (synced_decide(self, args, kw, "O|O$O:try_acquire", &d) < 0)
        return NULL;
    return PyBool_FromLong(d.allowed);
}

/* flush(all=False, *, now=None): gives back the leases due (all: every
 * lease). */
static PyObject *Synced_flush(SyncedObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"all", "now", NULL};
    int all = 0;
    PyObject *now_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|p$O:flush", kwlist, &all,
                                     &now_obj))
        return NULL;
    if (guard_usable(&self->guard, "SyncedLimiter", SYNCED_CLOSED) < 0)
        return NULL;
    uint64_t now_ns = 0;
    if (now_obj != Py_None && u64_arg(now_obj, "now", &now_ns) < 0)
        return NULL;
    int rc = 0, closed = 0;
    Py_BEGIN_ALLOW_THREADS
    if (guard_enter(&self->guard) < 0) {
        closed = 1;
    } else {
        rc = now_obj != Py_None
                 ? rate_synced_flush_at(self->guard.handle, now_ns, all != 0)
                 : rate_synced_flush(self->guard.handle, all != 0);
        guard_leave(&self->guard);
    }
    Py_END_ALLOW_THREADS
    if (synced_result(closed, rc) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Synced_stats(SyncedObject *self, PyObject *unused)
{
    (void)unused;
    if (guard_usable(&self->guard, "SyncedLimiter", SYNCED_CLOSED) < 0)
        return NULL;
    rate_synced_stats_t st;
    int rc = 0, closed = 0;
    Py_BEGIN_ALLOW_THREADS
    if (guard_enter(&self->guard) < 0) {
        closed = 1;
    } else {
        rc = rate_synced_stats(self->guard.handle, &st);
        guard_leave(&self->guard);
    }
    Py_END_ALLOW_THREADS
    if (synced_result(closed, rc) < 0)
        return NULL;
    return Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}",
        "decisions", (unsigned long long)st.decisions,
        "local", (unsigned long long)st.local,
        "allowed", (unsigned long long)st.allowed,
        "denied", (unsigned long long)st.denied,
        "round_trips", (unsigned long long)st.round_trips,
        "remote_errors", (unsigned long long)st.remote_errors,
        "fail_mode", (unsigned long long)st.fail_mode,
        "borrowed", (unsigned long long)st.borrowed,
        "returned", (unsigned long long)st.returned,
        "lost", (unsigned long long)st.lost,
        "held", (unsigned long long)st.held,
        "keys", (unsigned long long)st.keys,
        "evictions", (unsigned long long)st.evictions);
}

static PyObject *Synced_get_lease(SyncedObject *self, void *c)
{
    (void)c;
    /* the read lock: a close() on another thread frees without the GIL */
    if (guard_usable(&self->guard, "SyncedLimiter", SYNCED_CLOSED) < 0 ||
        guard_enter(&self->guard) < 0)
        return PyErr_Occurred() ? NULL : guard_raise_closed(SYNCED_CLOSED);
    uint64_t lease = rate_synced_lease(self->guard.handle);
    guard_leave(&self->guard);
    return PyLong_FromUnsignedLongLong(lease);
}

static PyObject *Synced_get_policy(SyncedObject *self, void *c)
{
    (void)c;
    return Py_NewRef(self->policy ? self->policy : Py_None);
}

static PyObject *Synced_get_store(SyncedObject *self, void *c)
{
    (void)c;
    return Py_NewRef(self->store ? self->store : Py_None);
}

static PyObject *Synced_get_closed(SyncedObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->guard.handle == NULL);
}

static PyMethodDef Synced_methods[] = {
    {"check", (PyCFunction)(void (*)(void))Synced_check,
     METH_VARARGS | METH_KEYWORDS,
     "check(key, permits=1, *, now=None) -> Decision (remaining: the "
     "permits this process holds for the key)"},
    {"try_acquire", (PyCFunction)(void (*)(void))Synced_try_acquire,
     METH_VARARGS | METH_KEYWORDS,
     "try_acquire(key, permits=1, *, now=None) -> bool"},
    {"flush", (PyCFunction)(void (*)(void))Synced_flush,
     METH_VARARGS | METH_KEYWORDS,
     "flush(all=False, *, now=None): gives back the leases lease_ttl old "
     "(all: every lease)"},
    {"stats", (PyCFunction)Synced_stats, METH_NOARGS, "the mode's figures"},
    {"close", (PyCFunction)Synced_close, METH_NOARGS,
     "gives every lease back and frees the limiter; later calls raise"},
    {"__enter__", enter_self, METH_NOARGS, NULL},
    {"__exit__", exit_close, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Synced_getset[] = {
    {"lease", (getter)Synced_get_lease, NULL, "L, the lease size", NULL},
    {"policy", (getter)Synced_get_policy, NULL, "the policy", NULL},
    {"store", (getter)Synced_get_store, NULL, "the remote store", NULL},
    {"closed", (getter)Synced_get_closed, NULL, "closed already", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject SyncedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ratelimit.SyncedLimiter",
    .tp_basicsize = sizeof(SyncedObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "SyncedLimiter(policy, remote, *, lease=0, lease_ttl=None, "
              "max_keys=0, fail='closed', retry=None, denial_ttl=None, "
              "prefetch=False, sweep=None): local decisions on leases of a "
              "shared store (docs/sync.md)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Synced_init,
    .tp_dealloc = (destructor)Synced_dealloc,
    .tp_methods = Synced_methods,
    .tp_getset = Synced_getset,
};
