/* SPDX-License-Identifier: MIT */
/*
 * lease.c -- in-flight limits (docs/leases.md): ratelimit.InFlight, a
 * rate_inflight_t on a Store, whose acquire() gives a ratelimit.Lease to
 * release (a context manager) or extend.
 */
#include "binding.h"

#include <string.h>

#include "ratelimit_lease.h"

typedef struct {
    PyObject_HEAD
    guard_t guard;         /* a rate_inflight_t */
    PyObject *store;
    int memory_only;       /* 0: lease calls release the GIL (DECIDE_BEGIN) */
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
    Py_BEGIN_ALLOW_THREADS
    rc = rate_inflight_new(&c, &in);
    Py_END_ALLOW_THREADS
    rate_inflight_policy_free(p);
    if (rc != RATE_OK) {
        raise_rc(rc, NULL);
        return -1;
    }
    if (guard_init(&self->guard, in) < 0) {
        rate_inflight_free(in);
        return -1;
    }
    /* A release or an extension may pause between retries under
     * contention, on any store: lease calls always release the GIL. */
    store_attach(store, &self->store);
    self->memory_only = 0;
    return 0;
}

static void inflight_close(InFlightObject *self)
{
    if (!self->guard.handle)
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
    inflight_close(self);
    Py_RETURN_NONE;
}

static int inflight_usable(InFlightObject *self)
{
    return guard_usable(&self->guard, "InFlight", INFLIGHT_CLOSED);
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
    PyObject *dec = decision_new(&d);
    if (!dec) {
        Py_DECREF(key);
        return NULL;
    }
    if (!d.allowed || lease.id == 0) {
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
    l->lease = lease;
    l->released = 0;
    return Py_BuildValue("(NN)", dec, (PyObject *)l);
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
    {"held", (PyCFunction)(void (*)(void))InFlight_held,
     METH_VARARGS | METH_KEYWORDS, "held(key, *, now=None) -> leases held"},
    {"close", (PyCFunction)InFlight_close, METH_NOARGS,
     "frees the object; leases held stay until released or expired"},
    {"__enter__", enter_self, METH_NOARGS, NULL},
    {"__exit__", exit_close, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

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
};

static void Lease_dealloc(LeaseObject *self)
{
    Py_XDECREF(self->owner);
    Py_XDECREF(self->key);
    PyObject_Free(self);
}

enum lease_op { LEASE_RELEASE, LEASE_EXTEND };

static PyObject *lease_call(LeaseObject *self, enum lease_op op, uint64_t ttl_ns)
{
    if (self->released) {
        PyErr_SetString(PyExc_ValueError, "the lease is released already");
        return NULL;
    }
    InFlightObject *in = self->owner;
    if (inflight_usable(in) < 0)
        return NULL;
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

