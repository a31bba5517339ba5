/* SPDX-License-Identifier: MIT */
/*
 * lease.c -- in-flight limits (docs/leases.md): ratelimit.InFlight, a
 * rate_inflight_t on a Store, whose acquire() gives a ratelimit.Lease to
 * release (a context manager) or extend; and their asynchronous forms
 * (_acquire_start, _release_start, _extend_start, for AsyncInFlight).
 */
#include "binding.h"

#include <string.h>

#include "ratelimit_lease.h"

typedef struct {
    PyObject_HEAD
    guard_t guard;         /* a rate_inflight_t */
    PyObject *store;
    int memory_only;       /* 0: lease calls release the GIL (DECIDE_BEGIN) */
    Py_ssize_t in_flight;  /* asynchronous lease calls not yet called back */
} InFlightObject;

typedef struct {
    PyObject_HEAD
    InFlightObject *owner;
    PyObject *key;        /* bytes */
    rate_lease_t lease;
    int released;
} LeaseObject;

#define INFLIGHT_CLOSED "the in-flight limit is closed"

static int InFlight_init(InFlightObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"policy", "store", "reap_dead_holders", NULL};
    PyObject *text_obj, *store = Py_None;
    int reap = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O$p:InFlight", kwlist,
                                     &text_obj, &store, &reap))
        return -1;
    if (guard_init_twice(&self->guard, "InFlight") < 0)
        return -1;
    const char *text;
    if (cstring_arg(text_obj, "in-flight policy text", &text) < 0)
        return -1;
    if (store_arg(store) < 0)
        return -1;
    char err[ERRLEN] = "";
    rate_inflight_policy_t *p = NULL;
    int rc = rate_inflight_policy_parse(text, &p, err, sizeof err);
    if (rc != RATE_OK) {
        raise_rc(rc, err);
        return -1;
    }
    rate_inflight_config_t c;
    memset(&c, 0, sizeof c);
    c.policy = p;
    c.store = store == Py_None ? NULL : ((StoreObject *)store)->store;
    c.reap_dead_holders = reap != 0;
    rate_inflight_t *in = NULL;
    /* a user of the store from here: its close() refuses while this runs
     * without the GIL */
    store_attach(store, &self->store);
    Py_BEGIN_ALLOW_THREADS
    rc = rate_inflight_new(&c, &in);
    Py_END_ALLOW_THREADS
    rate_inflight_policy_free(p);
    int raised = 0; /* MemoryError of guard_init */
    if (rc == RATE_OK && guard_init(&self->guard, in) < 0) {
        rate_inflight_free(in);
        raised = 1;
    }
    if (rc != RATE_OK || raised) {
        if (!raised)
            raise_rc(rc, rc == RATE_EPOLICY
                             ? "the store cannot keep this policy's states: "
                               "a key of N leases takes 14 + 24 N bytes (on "
                               "shared memory, give state_max that much)"
                             : NULL);
        store_detach(self->store);
        Py_CLEAR(self->store);
        return -1;
    }
    /* A release or an extension may pause between retries under
     * contention, on any store: lease calls always release the GIL. */
    self->memory_only = 0;
    return 0;
}

static void inflight_close(InFlightObject *self)
{
    if (!guard_close_begin(&self->guard))
        return;
    Py_BEGIN_ALLOW_THREADS
    rate_inflight_free(guard_take(&self->guard));
    Py_END_ALLOW_THREADS
    store_detach(self->store);
}

static void InFlight_dealloc(InFlightObject *self)
{
    inflight_close(self);
    guard_fini(&self->guard);
    Py_XDECREF(self->store);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *InFlight_close(InFlightObject *self, PyObject *unused)
{
    (void)unused;
    if (self->in_flight > 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "the in-flight limit has lease calls in flight: await "
                        "them first");
        return NULL;
    }
    inflight_close(self);
    Py_RETURN_NONE;
}

static int inflight_usable(InFlightObject *self)
{
    return guard_usable(&self->guard, "InFlight", INFLIGHT_CLOSED);
}

/* (Decision, Lease or None) of an acquire's answer; key (bytes, stolen)
 * is the Lease's. */
static PyObject *lease_answer(InFlightObject *self, PyObject *key,
                              const rate_decision_t *d,
                              const rate_lease_t *lease)
{
    PyObject *dec = decision_new(d);
    if (!dec) {
        Py_DECREF(key);
        return NULL;
    }
    if (!d->allowed || lease->id == 0) {
        Py_DECREF(key);
        return Py_BuildValue("(NO)", dec, Py_None);
    }
    LeaseObject *l = PyObject_New(LeaseObject, &LeaseType);
    if (!l) {
        Py_DECREF(key);
        Py_DECREF(dec);
        return NULL;
    }
    Py_INCREF(self);
    l->owner = self;
    l->key = key;
    l->lease = *lease;
    l->released = 0;
    return Py_BuildValue("(NN)", dec, (PyObject *)l);
}

/* Takes the read lock without waiting (the GIL held, on the loop's
 * thread); fails, raising, on a closed object or a close under way. */
static int inflight_enter_now(InFlightObject *self)
{
    if (guard_enter_now(&self->guard) < 0) {
        guard_raise_closed(INFLIGHT_CLOSED);
        return -1;
    }
    return 0;
}

/* The release of a lease granted to a task cancelled meanwhile: ud is the
 * InFlight. */
static void lease_dropped(void *ud, int rc, const rate_lease_t *lease,
                          const rate_decision_t *d)
{
    (void)rc;
    (void)lease;
    (void)d;
    PyGILState_STATE g = PyGILState_Ensure();
    InFlightObject *self = ud;
    self->in_flight--;
    Py_DECREF(self);
    PyGILState_Release(g);
}

/* On the loop's thread (the GIL held): releases, through the loop, a
 * lease granted to nobody (its task cancelled, or no Lease object could
 * be made for it).  The error raised, if any, stays. */
static void lease_drop_async(InFlightObject *self, PyObject *key,
                             const rate_lease_t *lease)
{
    if (guard_enter_now(&self->guard) < 0)
        return; /* closed: the slot lapses at its TTL */
    Py_INCREF(self);
    self->in_flight++;
    int rrc = rate_inflight_release_start(
        self->guard.handle, PyBytes_AS_STRING(key),
        (size_t)PyBytes_GET_SIZE(key), lease, lease_dropped, self);
    guard_leave(&self->guard);
    if (rrc != RATE_PENDING) {
        self->in_flight--;
        Py_DECREF(self);
    }
}

/* An asynchronous acquire's callback: the future gets (Decision, Lease or
 * None), or Error; a lease granted to a task cancelled meanwhile (or that
 * no Lease object could be made for) is released at once, through the
 * loop.  The call counts as in flight until the end, so that close() on
 * another thread refuses while this runs (future_answer may let the GIL
 * go).  ud: (future, inflight, key). */
static void lease_acquired(void *ud, int rc, const rate_lease_t *lease,
                           const rate_decision_t *d)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *t = ud;
    PyObject *fut = PyTuple_GET_ITEM(t, 0);
    InFlightObject *self = (InFlightObject *)PyTuple_GET_ITEM(t, 1);
    PyObject *key = PyTuple_GET_ITEM(t, 2);
    int taken = 0; /* the lease is the task's */
    if (!future_done(fut)) {
        PyObject *res = NULL;
        if (rc == RATE_OK) {
            Py_INCREF(key);
            res = lease_answer(self, key, d, lease);
        }
        taken = res != NULL;
        future_answer(fut, rc, res);
    }
    if (!taken && rc == RATE_OK && lease->id != 0)
        lease_drop_async(self, key, lease);
    self->in_flight--;
    if (PyErr_Occurred())
        adapter_unraisable("ratelimit: asynchronous lease");
    Py_DECREF(t);
    PyGILState_Release(g);
}

/* _acquire_start(key, critical, future) -> (Decision, Lease or None), or
 * None and the future gets it (on the loop's thread; never blocks on the
 * asynchronous Redis store). */
static PyObject *InFlight_acquire_start(InFlightObject *self, PyObject *args)
{
    PyObject *key_obj, *fut;
    int critical;
    if (!PyArg_ParseTuple(args, "OpO:_acquire_start", &key_obj, &critical, &fut))
        return NULL;
    if (inflight_usable(self) < 0)
        return NULL;
    PyObject *key = key_bytes(key_obj);
    if (!key)
        return NULL;
    PyObject *t = PyTuple_Pack(3, fut, (PyObject *)self, key);
    if (!t) {
        Py_DECREF(key);
        return NULL;
    }
    if (inflight_enter_now(self) < 0) {
        Py_DECREF(key);
        Py_DECREF(t);
        return NULL;
    }
    rate_lease_t lease;
    rate_decision_t d;
    self->in_flight++;
    int rc = rate_inflight_acquire_start(
        self->guard.handle, PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key),
        critical ? RATE_LEASE_CRITICAL : RATE_LEASE_NORMAL, &lease, &d,
        lease_acquired, t);
    guard_leave(&self->guard);
    if (rc == RATE_PENDING) {
        Py_DECREF(key);
        Py_RETURN_NONE;
    }
    self->in_flight--;
    Py_DECREF(t);
    if (rc != RATE_OK) {
        Py_DECREF(key);
        return raise_rc(rc, NULL);
    }
    Py_INCREF(key); /* for a release when no Lease can be made */
    PyObject *res = lease_answer(self, key, &d, &lease);
    if (!res && d.allowed && lease.id != 0)
        lease_drop_async(self, key, &lease);
    Py_DECREF(key);
    return res;
}

/* acquire(key, *, critical=False, now=None) -> (Decision, Lease or None) */
static PyObject *InFlight_acquire(InFlightObject *self, PyObject *args,
                                  PyObject *kw)
{
    static char *kwlist[] = {"key", "critical", "now", NULL};
    PyObject *key_obj, *now_obj = Py_None;
    int critical = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$pO:acquire", kwlist,
                                     &key_obj, &critical, &now_obj))
        return NULL;
    if (inflight_usable(self) < 0)
        return NULL;
    uint64_t now_ns = 0;
    if (now_obj != Py_None && u64_arg(now_obj, "now", &now_ns) < 0)
        return NULL;
    PyObject *key = key_bytes(key_obj);
    if (!key)
        return NULL;
    const char *kp = PyBytes_AS_STRING(key);
    size_t kl = (size_t)PyBytes_GET_SIZE(key);
    rate_lease_class_t cls = critical ? RATE_LEASE_CRITICAL : RATE_LEASE_NORMAL;
    rate_lease_t lease;
    rate_decision_t d;
    int rc = 0, closed = 0;
    DECIDE_BEGIN(self)
    if (guard_enter(&self->guard) < 0) {
        closed = 1;
    } else {
        rc = now_obj != Py_None
                 ? rate_inflight_acquire_at(self->guard.handle, kp, kl, cls, now_ns,
                                            &lease, &d)
                 : rate_inflight_acquire(self->guard.handle, kp, kl, cls, &lease, &d);
        guard_leave(&self->guard);
    }
    DECIDE_END
    if (closed || rc != RATE_OK) {
        Py_DECREF(key);
        if (closed)
            return guard_raise_closed(INFLIGHT_CLOSED);
        return raise_rc(rc, NULL);
    }
    Py_INCREF(key); /* for a release when no Lease can be made */
    PyObject *res = lease_answer(self, key, &d, &lease);
    if (!res && d.allowed && lease.id != 0) {
        /* granted, but the caller gets MemoryError: the slot goes back
         * now rather than at its TTL (the error raised stays) */
        Py_BEGIN_ALLOW_THREADS
        if (guard_enter(&self->guard) == 0) {
            (void)rate_inflight_release(self->guard.handle, kp, kl, &lease);
            guard_leave(&self->guard);
        }
        Py_END_ALLOW_THREADS
    }
    Py_DECREF(key);
    return res;
}

static PyObject *InFlight_held(InFlightObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"key", "now", NULL};
    PyObject *key_obj, *now_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$O:held", kwlist, &key_obj,
                                     &now_obj))
        return NULL;
    if (inflight_usable(self) < 0)
        return NULL;
    uint64_t now_ns = 0, held = 0;
    if (now_obj != Py_None && u64_arg(now_obj, "now", &now_ns) < 0)
        return NULL;
    key_arg_t k;
    if (key_get(key_obj, &k) < 0)
        return NULL;
    int rc = 0, closed = 0;
    DECIDE_BEGIN(self)
    if (guard_enter(&self->guard) < 0) {
        closed = 1;
    } else {
        rc = now_obj != Py_None
                 ? rate_inflight_held_at(self->guard.handle, k.ptr, k.len, now_ns, &held)
                 : rate_inflight_held(self->guard.handle, k.ptr, k.len, &held);
        guard_leave(&self->guard);
    }
    DECIDE_END
    key_release(&k);
    if (closed)
        return guard_raise_closed(INFLIGHT_CLOSED);
    if (rc != RATE_OK)
        return raise_rc(rc, NULL);
    return PyLong_FromUnsignedLongLong(held);
}

static PyMethodDef InFlight_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))InFlight_acquire,
     METH_VARARGS | METH_KEYWORDS,
     "acquire(key, *, critical=False, now=None) -> (Decision, Lease or None)"},
    {"_acquire_start", (PyCFunction)InFlight_acquire_start, METH_VARARGS,
     NULL},
    {"held", (PyCFunction)(void (*)(void))InFlight_held,
     METH_VARARGS | METH_KEYWORDS, "held(key, *, now=None) -> leases held"},
    {"close", (PyCFunction)InFlight_close, METH_NOARGS,
     "frees the object; leases held stay until released or expired"},
    {"__enter__", enter_self, METH_NOARGS, NULL},
    {"__exit__", exit_close, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyObject *InFlight_get_pending(InFlightObject *self, void *c)
{
    (void)c;
    return PyLong_FromSsize_t(self->in_flight);
}

static PyGetSetDef InFlight_getset[] = {
    {"pending", (getter)InFlight_get_pending, NULL,
     "asynchronous lease calls of this object not yet answered", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject InFlightType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ratelimit.InFlight",
    .tp_basicsize = sizeof(InFlightObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "InFlight(policy, store=None, *, reap_dead_holders=False): "
              "an in-flight limit (\"concurrency 10 ttl=30s\", docs/leases.md)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)InFlight_init,
    .tp_dealloc = (destructor)InFlight_dealloc,
    .tp_methods = InFlight_methods,
    .tp_getset = InFlight_getset,
};

static void Lease_dealloc(LeaseObject *self)
{
    Py_XDECREF(self->owner);
    Py_XDECREF(self->key);
    PyObject_Free(self);
}

enum lease_op { LEASE_RELEASE, LEASE_EXTEND };

/* A lease not released yet, of an open InFlight; -1 with the error. */
static int lease_usable(LeaseObject *self)
{
    if (self->released) {
        PyErr_SetString(PyExc_ValueError, "the lease is released already");
        return -1;
    }
    return inflight_usable(self->owner);
}

static PyObject *lease_call(LeaseObject *self, enum lease_op op, uint64_t ttl_ns)
{
    if (lease_usable(self) < 0)
        return NULL;
    InFlightObject *in = self->owner;
    const char *kp = PyBytes_AS_STRING(self->key);
    size_t kl = (size_t)PyBytes_GET_SIZE(self->key);
    rate_lease_t lease = self->lease;
    int rc = 0, closed = 0;
    DECIDE_BEGIN(in)
    if (guard_enter(&in->guard) < 0) {
        closed = 1;
    } else {
        rc = op == LEASE_RELEASE
                 ? rate_inflight_release(in->guard.handle, kp, kl, &lease)
                 : rate_inflight_extend(in->guard.handle, kp, kl, &lease, ttl_ns);
        guard_leave(&in->guard);
    }
    DECIDE_END
    if (closed)
        return guard_raise_closed(INFLIGHT_CLOSED);
    if (op == LEASE_RELEASE && (rc == RATE_OK || rc == RATE_ELEASE ||
                                rc == RATE_EEXPIRED))
        self->released = 1;
    if (rc != RATE_OK)
        return raise_rc(rc, NULL);
    self->lease = lease;
    Py_RETURN_NONE;
}

static PyObject *Lease_release(LeaseObject *self, PyObject *unused)
{
    (void)unused;
    return lease_call(self, LEASE_RELEASE, 0);
}

static PyObject *Lease_extend(LeaseObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"ttl", NULL};
    PyObject *ttl_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:extend", kwlist, &ttl_obj))
        return NULL;
    uint64_t ttl_ns;
    if (seconds_arg(ttl_obj, "ttl", 0, &ttl_ns) < 0)
        return NULL;
    return lease_call(self, LEASE_EXTEND, ttl_ns);
}

/* An asynchronous release's or extend's callback: the lease object takes
 * the answer (released; its new expiry), the future None or Error.
 * ud: (future, lease, op). */
static void lease_changed(void *ud, int rc, const rate_lease_t *lease,
                          const rate_decision_t *d)
{
    (void)d;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *t = ud;
    PyObject *fut = PyTuple_GET_ITEM(t, 0);
    LeaseObject *self = (LeaseObject *)PyTuple_GET_ITEM(t, 1);
    long op = PyLong_AsLong(PyTuple_GET_ITEM(t, 2));
    self->owner->in_flight--;
    if (op == LEASE_RELEASE)
        /* a store's failure leaves it held: it may be released again */
        self->released = rc == RATE_OK || rc == RATE_ELEASE ||
                         rc == RATE_EEXPIRED;
    else if (rc == RATE_OK)
        self->lease.expires_ns = lease->expires_ns;
    if (!future_done(fut)) {
        Py_INCREF(Py_None);
        future_answer(fut, rc, Py_None);
    }
    if (PyErr_Occurred())
        adapter_unraisable("ratelimit: asynchronous lease");
    Py_DECREF(t);
    PyGILState_Release(g);
}

/* _release_start(future), _extend_start(ttl, future) -> True when done
 * at once, None when the future gets the answer (on the loop's thread). */
static PyObject *lease_change_start(LeaseObject *self, enum lease_op op,
                                    uint64_t ttl_ns, PyObject *fut)
{
    if (lease_usable(self) < 0)
        return NULL;
    InFlightObject *in = self->owner;
    PyObject *t = Py_BuildValue("(OOi)", fut, (PyObject *)self, (int)op);
    if (!t)
        return NULL;
    if (inflight_enter_now(in) < 0) {
        Py_DECREF(t);
        return NULL;
    }
    const char *kp = PyBytes_AS_STRING(self->key);
    size_t kl = (size_t)PyBytes_GET_SIZE(self->key);
    rate_lease_t lease = self->lease;
    in->in_flight++;
    int rc = op == LEASE_RELEASE
                 ? rate_inflight_release_start(in->guard.handle, kp, kl, &lease,
                                               lease_changed, t)
                 : rate_inflight_extend_start(in->guard.handle, kp, kl, &lease,
                                              ttl_ns, lease_changed, t);
    guard_leave(&in->guard);
    if (rc == RATE_PENDING) {
        if (op == LEASE_RELEASE)
            self->released = 1; /* no second release while this one runs */
        Py_RETURN_NONE;
    }
    in->in_flight--;
    Py_DECREF(t);
    if (op == LEASE_RELEASE && (rc == RATE_OK || rc == RATE_ELEASE ||
                                rc == RATE_EEXPIRED))
        self->released = 1;
    if (rc != RATE_OK)
        return raise_rc(rc, NULL);
    if (op == LEASE_EXTEND)
        self->lease = lease;
    Py_RETURN_TRUE;
}

static PyObject *Lease_release_start(LeaseObject *self, PyObject *fut)
{
    return lease_change_start(self, LEASE_RELEASE, 0, fut);
}

static PyObject *Lease_extend_start(LeaseObject *self, PyObject *args)
{
    PyObject *ttl_obj, *fut;
    if (!PyArg_ParseTuple(args, "OO:_extend_start", &ttl_obj, &fut))
        return NULL;
    uint64_t ttl_ns;
    if (seconds_arg(ttl_obj, "ttl", 0, &ttl_ns) < 0)
        return NULL;
    return lease_change_start(self, LEASE_EXTEND, ttl_ns, fut);
}

/* Leaving the block releases the lease (unless released in it); a failed
 * release raises only when the block itself raised nothing. */
static PyObject *Lease_exit(LeaseObject *self, PyObject *args)
{
    PyObject *exc_type = PyTuple_GET_SIZE(args) > 0 ? PyTuple_GET_ITEM(args, 0)
                                                    : Py_None;
    if (self->released)
        Py_RETURN_FALSE;
    PyObject *r = lease_call(self, LEASE_RELEASE, 0);
    if (!r && exc_type != Py_None)
        PyErr_Clear();
    if (!r && exc_type == Py_None)
        return NULL;
    Py_XDECREF(r);
    Py_RETURN_FALSE;
}

static PyObject *Lease_get_expires_ns(LeaseObject *self, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLongLong(self->lease.expires_ns);
}

static PyObject *Lease_get_released(LeaseObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->released);
}

static PyObject *Lease_get_key(LeaseObject *self, void *c)
{
    (void)c;
    Py_INCREF(self->key);
    return self->key;
}

static PyMethodDef Lease_methods[] = {
    {"release", (PyCFunction)Lease_release, METH_NOARGS,
     "gives the slot back (Error RATE_EEXPIRED when it lapsed first)"},
    {"extend", (PyCFunction)(void (*)(void))Lease_extend,
     METH_VARARGS | METH_KEYWORDS,
     "extend(ttl=None): expires ttl s from now (None: the policy's TTL)"},
    {"_release_start", (PyCFunction)Lease_release_start, METH_O, NULL},
    {"_extend_start", (PyCFunction)Lease_extend_start, METH_VARARGS, NULL},
    {"__enter__", enter_self, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Lease_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Lease_getset[] = {
    {"expires_ns", (getter)Lease_get_expires_ns, NULL,
     "when it lapses unless extended (the store's clock)", NULL},
    {"released", (getter)Lease_get_released, NULL, "released already", NULL},
    {"key", (getter)Lease_get_key, NULL, "its key, bytes", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject LeaseType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ratelimit.Lease",
    .tp_basicsize = sizeof(LeaseObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A lease held: release() it, or use it as a context manager.",
    .tp_dealloc = (destructor)Lease_dealloc,
    .tp_methods = Lease_methods,
    .tp_getset = Lease_getset,
};

