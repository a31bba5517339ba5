/* SPDX-License-Identifier: MIT */
/*
 * _ratelimit.c -- the CPython binding of libratelimit (docs/python.md).
 *
 * Map: errors; Policy; the asyncio adapter (a rate_loop_t on asyncio's
 * add_reader, add_writer and call_later); the stores (Store: memory, shm,
 * Redis, asynchronous Redis); Limiter (decisions, asynchronous decisions,
 * changes, headers); InFlight and Lease (in-flight limits); Fair (fair
 * shares); Rules (the rules file); the module.
 *
 * Every call that may block (a store's I/O, a shared-memory lock, an
 * acquire's sleep) runs with the GIL released.  A Limiter's calls hold its
 * read lock while they run without the GIL, and close() takes the write
 * lock, so that close() never frees a limiter another thread is using;
 * a Store stays open while a Limiter on it is open.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "ratelimit.h"
#include "ratelimit_fair.h"
#include "ratelimit_http.h"
#include "ratelimit_lease.h"
#include "ratelimit_loop.h"
#include "ratelimit_redis.h"
#include "ratelimit_shm.h"

#define ERRLEN 512

static PyObject *Error; /* ratelimit.Error */

/* ---------------------------------------------------------------- errors */

/* Raises ratelimit.Error(message) with .code and .name: the library's
 * message (`detail`, when the call gave one) or rate_strerror's text. */
static PyObject *raise_rc(int rc, const char *detail)
{
    const char *msg = (detail && detail[0]) ? detail : rate_strerror(rc);
    PyObject *exc = PyObject_CallFunction(Error, "s", msg);
    if (!exc)
        return NULL;
    PyObject *code = PyLong_FromLong(rc);
    PyObject *name = PyUnicode_FromString(rate_err_name(rc));
    if (code && name) {
        PyObject_SetAttrString(exc, "code", code);
        PyObject_SetAttrString(exc, "name", name);
    }
    Py_XDECREF(code);
    Py_XDECREF(name);
    PyErr_SetObject(Error, exc);
    Py_DECREF(exc);
    return NULL;
}

/* A C string without NUL bytes from str (UTF-8) or bytes: what the library's
 * NUL-terminated arguments (texts, paths, URLs) take. */
static int cstring_arg(PyObject *obj, const char *what, const char **out)
{
    Py_ssize_t len;
    const char *s;
    if (PyUnicode_Check(obj)) {
        s = PyUnicode_AsUTF8AndSize(obj, &len);
        if (!s)
            return -1;
    } else if (PyBytes_Check(obj)) {
        s = PyBytes_AS_STRING(obj);
        len = PyBytes_GET_SIZE(obj);
    } else {
        PyErr_Format(PyExc_TypeError, "%s must be str or bytes, not %.100s",
                     what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    if ((size_t)len != strlen(s)) {
        PyErr_Format(PyExc_ValueError, "%s holds a NUL byte", what);
        return -1;
    }
    *out = s;
    return 0;
}

/* A key: str (its UTF-8) or bytes-like, any bytes (NUL too: keys go with
 * their length).  The view is released by key_release. */
typedef struct {
    Py_buffer view;
    const char *ptr;
    size_t len;
    int has_view;
} key_arg_t;

static int key_get(PyObject *obj, key_arg_t *k)
{
    k->has_view = 0;
    if (PyUnicode_Check(obj)) {
        Py_ssize_t len;
        k->ptr = PyUnicode_AsUTF8AndSize(obj, &len);
        if (!k->ptr)
            return -1;
        k->len = (size_t)len;
        return 0;
    }
    if (PyObject_GetBuffer(obj, &k->view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "key must be str or bytes, not %.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    k->has_view = 1;
    k->ptr = k->view.buf;
    k->len = (size_t)k->view.len;
    return 0;
}

static void key_release(key_arg_t *k)
{
    if (k->has_view)
        PyBuffer_Release(&k->view);
}

/* A count or a time in ns: a non-negative int up to 2^64-1 (the library
 * itself refuses what is above its bounds, RATE_ERANGE). */
static int u64_arg(PyObject *obj, const char *what, uint64_t *out)
{
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be int, not %.100s", what,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_OverflowError, "%s must be from 0 to 2**64-1",
                     what);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

/* An integer option (NULL: not given, *out kept): an int from 0 to `max`
 * (the range of the C field it fills, or the library's bound where the
 * library's error would not name the option), so that none wraps to
 * another value: ValueError when negative, OverflowError above `max`. */
static int uint_opt(PyObject *obj, const char *what, unsigned long long max,
                    unsigned long long *out)
{
    if (obj == NULL)
        return 0;
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be int, not %.100s", what,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow < 0 || (overflow == 0 && v < 0)) {
        PyErr_Format(PyExc_ValueError, "%s must be >= 0, not %R", what, obj);
        return -1;
    }
    unsigned long long u = (unsigned long long)v;
    int above = 0;
    if (overflow > 0) {
        u = PyLong_AsUnsignedLongLong(obj);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            above = 1; /* above 2**64-1 */
        }
    }
    if (above || u > max) {
        PyErr_Format(PyExc_OverflowError, "%s must be at most %llu, not %R",
                     what, max, obj);
        return -1;
    }
    *out = u;
    return 0;
}

/* A duration in seconds (int or float) as ns; None is `dflt`. */
static int seconds_arg(PyObject *obj, const char *what, uint64_t dflt,
                       uint64_t *out)
{
    if (obj == NULL || obj == Py_None) {
        *out = dflt;
        return 0;
    }
    if (PyLong_Check(obj)) {
        uint64_t s;
        if (u64_arg(obj, what, &s) < 0)
            return -1;
        if (s > RATE_TIME_MAX / RATE_NS_PER_S) {
            PyErr_Format(PyExc_OverflowError, "%s is above 2**63-1 ns", what);
            return -1;
        }
        *out = s * RATE_NS_PER_S;
        return 0;
    }
    if (PyFloat_Check(obj)) {
        double s = PyFloat_AS_DOUBLE(obj);
        if (!(s >= 0.0)) {
            PyErr_Format(PyExc_ValueError, "%s must be a duration >= 0", what);
            return -1;
        }
        if (s * 1e9 >= 9.2e18) {
            PyErr_Format(PyExc_OverflowError, "%s is above 2**63-1 ns", what);
            return -1;
        }
        *out = (uint64_t)llround(s * 1e9);
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "%s must be seconds (int or float), not %.100s",
                 what, Py_TYPE(obj)->tp_name);
    return -1;
}

/* __enter__ of the objects that are context managers: the object. */
static PyObject *enter_self(PyObject *self, PyObject *unused)
{
    (void)unused;
    Py_INCREF(self);
    return self;
}

/* __exit__ of those whose leaving closes them: their close(). */
static PyObject *exit_close(PyObject *self, PyObject *args)
{
    (void)args;
    return PyObject_CallMethod(self, "close", NULL);
}

/* ------------------------------------------------------------- decisions */

static PyTypeObject *DecisionType;

static PyStructSequence_Field decision_fields[] = {
    {"allowed", "act on the request (after delay)"},
    {"reason", "'allowed', 'limited', 'never' or 'store-error'"},
    {"remaining", "room left right after this decision"},
    {"limit", "L of the limit that decided (burst/capacity for the buckets)"},
    {"delay", "seconds to wait before acting (reservations)"},
    {"retry_after", "seconds until a retry may pass (inf: never)"},
    {"reset_after", "seconds until the key is back to its cold start"},
    {"delay_ns", "delay in ns"},
    {"retry_after_ns", "retry_after in ns (2**64-1: never)"},
    {"reset_after_ns", "reset_after in ns"},
    {"component", "index of the limit that decided (-1: unlimited)"},
    {"shadow", "shadow mode let a denial through"},
    {"error", "with reason 'store-error': the store's code"},
    {NULL, NULL}};

static PyStructSequence_Desc decision_desc = {
    "ratelimit.Decision", "One decision of a Limiter.", decision_fields, 13};

/* bool(decision) is decision.allowed, so that `if limiter.acquire(k):`
 * reads as it should (a tuple of 13 fields is otherwise always true). */
static PyObject *Decision_bool(PyObject *self, PyObject *unused)
{
    (void)unused;
    return Py_NewRef(PyStructSequence_GET_ITEM(self, 0));
}

static PyMethodDef decision_bool_def = {
    "__bool__", Decision_bool, METH_NOARGS, "self.allowed"};

/* Gives the Decision type its __bool__ (a struct sequence's description
 * takes no methods; setting the attribute fills the type's slot). */
static int decision_type_ready(void)
{
    DecisionType = PyStructSequence_NewType(&decision_desc);
    if (!DecisionType)
        return -1;
    PyObject *m = PyDescr_NewMethod(DecisionType, &decision_bool_def);
    if (!m)
        return -1;
    int rc = PyObject_SetAttrString((PyObject *)DecisionType, "__bool__", m);
    Py_DECREF(m);
    return rc;
}

static double ns_seconds(uint64_t ns)
{
    return ns == RATE_NEVER ? INFINITY : (double)ns / 1e9;
}

static PyObject *decision_new(const rate_decision_t *d)
{
    PyObject *o = PyStructSequence_New(DecisionType);
    if (!o)
        return NULL;
    PyObject *v[13] = {
        PyBool_FromLong(d->allowed),
        PyUnicode_FromString(rate_reason_name(d->reason)),
        PyLong_FromUnsignedLongLong(d->remaining),
        PyLong_FromUnsignedLongLong(d->limit),
        PyFloat_FromDouble(ns_seconds(d->delay_ns)),
        PyFloat_FromDouble(ns_seconds(d->retry_after_ns)),
        PyFloat_FromDouble(ns_seconds(d->reset_after_ns)),
        PyLong_FromUnsignedLongLong(d->delay_ns),
        PyLong_FromUnsignedLongLong(d->retry_after_ns),
        PyLong_FromUnsignedLongLong(d->reset_after_ns),
        PyLong_FromLong(d->component),
        PyBool_FromLong(d->shadow),
        PyLong_FromLong(d->error),
    };
    int bad = 0;
    for (int i = 0; i < 13; i++) {
        if (!v[i])
            bad = 1;
        PyStructSequence_SET_ITEM(o, i, v[i] ? v[i] : (Py_INCREF(Py_None), Py_None));
    }
    if (bad) {
        Py_DECREF(o);
        return NULL;
    }
    return o;
}

/* The decision back from its Python record (for headers()). */
static int decision_from(PyObject *o, rate_decision_t *d)
{
    if (!PyObject_TypeCheck(o, DecisionType)) {
        PyErr_SetString(PyExc_TypeError, "decision must be a ratelimit.Decision");
        return -1;
    }
    memset(d, 0, sizeof *d);
    const char *reason = PyUnicode_AsUTF8(PyStructSequence_GET_ITEM(o, 1));
    if (!reason)
        return -1;
    for (int r = 0; r <= RATE_REASON_STORE_ERROR; r++)
        if (strcmp(reason, rate_reason_name((rate_reason_t)r)) == 0)
            d->reason = (rate_reason_t)r;
    d->allowed = PyObject_IsTrue(PyStructSequence_GET_ITEM(o, 0)) == 1;
    d->remaining = PyLong_AsUnsignedLongLong(PyStructSequence_GET_ITEM(o, 2));
    d->limit = PyLong_AsUnsignedLongLong(PyStructSequence_GET_ITEM(o, 3));
    d->delay_ns = PyLong_AsUnsignedLongLong(PyStructSequence_GET_ITEM(o, 7));
    d->retry_after_ns = PyLong_AsUnsignedLongLong(PyStructSequence_GET_ITEM(o, 8));
    d->reset_after_ns = PyLong_AsUnsignedLongLong(PyStructSequence_GET_ITEM(o, 9));
    d->component = (int)PyLong_AsLong(PyStructSequence_GET_ITEM(o, 10));
    d->shadow = PyObject_IsTrue(PyStructSequence_GET_ITEM(o, 11)) == 1;
    d->error = (int)PyLong_AsLong(PyStructSequence_GET_ITEM(o, 12));
    return PyErr_Occurred() ? -1 : 0;
}

/* --------------------------------------------------------------- Policy */

typedef struct {
    PyObject_HEAD
    rate_policy_t *policy;
} PolicyObject;

static PyTypeObject PolicyType;

static int Policy_init(PolicyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"text", "name", NULL};
    PyObject *text_obj, *name_obj = Py_None;
    const char *text, *name = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:Policy", kwlist, &text_obj,
                                     &name_obj))
        return -1;
    if (cstring_arg(text_obj, "policy text", &text) < 0)
        return -1;
    if (name_obj != Py_None && cstring_arg(name_obj, "policy name", &name) < 0)
        return -1;
    char err[ERRLEN] = "";
    rate_policy_t *p = NULL;
    int rc = rate_policy_parse(text, &p, err, sizeof err);
    if (rc == RATE_OK && name)
        rc = rate_policy_set_name(p, name, err, sizeof err);
    if (rc != RATE_OK) {
        rate_policy_free(p);
        raise_rc(rc, err);
        return -1;
    }
    rate_policy_free(self->policy);
    self->policy = p;
    return 0;
}

static void Policy_dealloc(PolicyObject *self)
{
    rate_policy_free(self->policy);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Policy_str(PolicyObject *self)
{
    if (!self->policy)
        return PyUnicode_FromString("");
    size_t n = rate_policy_format(self->policy, NULL, 0);
    char *buf = PyMem_Malloc(n + 1);
    if (!buf)
        return PyErr_NoMemory();
    rate_policy_format(self->policy, buf, n + 1);
    PyObject *s = PyUnicode_FromStringAndSize(buf, (Py_ssize_t)n);
    PyMem_Free(buf);
    return s;
}

static PyObject *Policy_repr(PolicyObject *self)
{
    PyObject *s = Policy_str(self);
    if (!s)
        return NULL;
    PyObject *r = PyUnicode_FromFormat("ratelimit.Policy(%R)", s);
    Py_DECREF(s);
    return r;
}

static int policy_ready(PolicyObject *self)
{
    if (!self->policy) {
        PyErr_SetString(PyExc_ValueError, "Policy.__init__ was not called");
        return -1;
    }
    return 0;
}

static PyObject *Policy_get_name(PolicyObject *self, void *c)
{
    (void)c;
    return PyUnicode_FromString(rate_policy_name(self->policy));
}

static PyObject *Policy_get_unlimited(PolicyObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(rate_policy_is_unlimited(self->policy));
}

/* The limits, each a dict of the rate_limit_t fields. */
static PyObject *Policy_get_limits(PolicyObject *self, void *c)
{
    (void)c;
    size_t n = rate_policy_count(self->policy);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        const rate_limit_t *l = rate_policy_limit(self->policy, i);
        PyObject *d = Py_BuildValue(
            "{s:s,s:K,s:K,s:K,s:K}", "algorithm",
            rate_algorithm_name(l->algorithm), "limit",
            (unsigned long long)l->limit, "period_ns",
            (unsigned long long)l->period_ns, "burst",
            (unsigned long long)l->burst, "block_ns",
            (unsigned long long)l->block_ns);
        if (!d) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, d);
    }
    return list;
}

static PyGetSetDef Policy_getset[] = {
    {"name", (getter)Policy_get_name, NULL, "the policy's name ('' none)", NULL},
    {"unlimited", (getter)Policy_get_unlimited, NULL, "the unlimited policy", NULL},
    {"limits", (getter)Policy_get_limits, NULL, "its limits, as dicts", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyObject *Policy_richcompare(PyObject *a, PyObject *b, int op)
{
    if (!PyObject_TypeCheck(b, &PolicyType) || (op != Py_EQ && op != Py_NE))
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *sa = Policy_str((PolicyObject *)a), *sb = NULL;
    if (sa)
        sb = Policy_str((PolicyObject *)b);
    if (!sb) {
        Py_XDECREF(sa);
        return NULL;
    }
    PyObject *r = PyObject_RichCompare(sa, sb, op);
    Py_DECREF(sa);
    Py_DECREF(sb);
    return r;
}

static PyTypeObject PolicyType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ratelimit.Policy",
    .tp_basicsize = sizeof(PolicyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Policy(text, name=None): a policy in the library's text form "
              "(docs/policy.md).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Policy_init,
    .tp_dealloc = (destructor)Policy_dealloc,
    .tp_str = (reprfunc)Policy_str,
    .tp_repr = (reprfunc)Policy_repr,
    .tp_getset = Policy_getset,
    .tp_richcompare = Policy_richcompare,
};

/* ------------------------------------------------------ asyncio adapter */

/* A rate_loop_t over an asyncio event loop: a watch is an IoWatch object
 * whose bound methods are the loop's reader and writer callbacks, a timer
 * a LoopTimer whose bound method call_later calls.  The store calls the
 * table on the loop's thread, from asyncio's callbacks or from the
 * binding's calls (GIL held), and from rate_store_free and creation (GIL
 * released): each function takes the GIL itself. */

typedef struct {
    PyObject_HEAD
    PyObject *loop;       /* the asyncio loop */
    int fd;
    unsigned events;      /* watched now */
    rate_loop_io_fn fn;
    void *arg;
    int freed;
} IoWatchObject;

typedef struct {
    PyObject_HEAD
    PyObject *loop;
    PyObject *handle;     /* the TimerHandle while armed, else NULL */
    rate_loop_timer_fn fn;
    void *arg;
    int freed;
} LoopTimerObject;

static void IoWatch_dealloc(IoWatchObject *self)
{
    Py_XDECREF(self->loop);
    PyObject_Free(self);
}

static PyObject *io_ready(IoWatchObject *self, unsigned events)
{
    if (!self->freed && (self->events & events))
        self->fn(self->arg, events);
    Py_RETURN_NONE;
}

static PyObject *IoWatch_on_read(IoWatchObject *self, PyObject *unused)
{
    (void)unused;
    return io_ready(self, RATE_LOOP_READ);
}

static PyObject *IoWatch_on_write(IoWatchObject *self, PyObject *unused)
{
    (void)unused;
    return io_ready(self, RATE_LOOP_WRITE);
}

static PyMethodDef IoWatch_methods[] = {
    {"on_read", (PyCFunction)IoWatch_on_read, METH_NOARGS, NULL},
    {"on_write", (PyCFunction)IoWatch_on_write, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyTypeObject IoWatchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ratelimit._IoWatch",
    .tp_basicsize = sizeof(IoWatchObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)IoWatch_dealloc,
    .tp_methods = IoWatch_methods,
};

static void LoopTimer_dealloc(LoopTimerObject *self)
{
    Py_XDECREF(self->loop);
    Py_XDECREF(self->handle);
    PyObject_Free(self);
}

static PyObject *LoopTimer_fire(LoopTimerObject *self, PyObject *unused)
{
    (void)unused;
    Py_CLEAR(self->handle);
    if (!self->freed)
        self->fn(self->arg);
    Py_RETURN_NONE;
}

static PyMethodDef LoopTimer_methods[] = {
    {"fire", (PyCFunction)LoopTimer_fire, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyTypeObject LoopTimerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ratelimit._LoopTimer",
    .tp_basicsize = sizeof(LoopTimerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)LoopTimer_dealloc,
    .tp_methods = LoopTimer_methods,
};

/* An exception inside the adapter cannot reach a Python caller: it is
 * reported as unraisable and the function fails as the table allows. */
static void adapter_unraisable(const char *what)
{
    if (PyErr_Occurred()) {
        PyObject *msg = PyUnicode_FromString(what);
        PyErr_WriteUnraisable(msg);
        Py_XDECREF(msg);
    }
}

static void *aio_io_new(void *ud, int fd, rate_loop_io_fn fn, void *arg)
{
    PyGILState_STATE g = PyGILState_Ensure();
    IoWatchObject *w = PyObject_New(IoWatchObject, &IoWatchType);
    if (w) {
        Py_INCREF((PyObject *)ud);
        w->loop = ud;
        w->fd = fd;
        w->events = 0;
        w->fn = fn;
        w->arg = arg;
        w->freed = 0;
    } else {
        adapter_unraisable("ratelimit: asyncio watch");
    }
    PyGILState_Release(g);
    return w;
}

/* Adds or removes the reader or writer whose bit changed. */
static int aio_watch_bit(IoWatchObject *w, unsigned events, unsigned bit,
                         const char *add, const char *remove,
                         const char *method)
{
    PyObject *r;
    if ((events & bit) && !(w->events & bit)) {
        PyObject *cb = PyObject_GetAttrString((PyObject *)w, method);
        if (!cb)
            return -1;
        r = PyObject_CallMethod(w->loop, add, "iO", w->fd, cb);
        Py_DECREF(cb);
    } else if (!(events & bit) && (w->events & bit)) {
        r = PyObject_CallMethod(w->loop, remove, "i", w->fd);
    } else {
        return 0;
    }
    if (!r)
        return -1;
    Py_DECREF(r);
    return 0;
}

static int aio_io_set(void *ud, void *io, unsigned events)
{
    (void)ud;
    PyGILState_STATE g = PyGILState_Ensure();
    IoWatchObject *w = io;
    int rc = 0;
    if (aio_watch_bit(w, events, RATE_LOOP_READ, "add_reader", "remove_reader",
                      "on_read") < 0 ||
        aio_watch_bit(w, events, RATE_LOOP_WRITE, "add_writer",
                      "remove_writer", "on_write") < 0) {
        adapter_unraisable("ratelimit: asyncio add_reader/add_writer");
        rc = -1;
    } else {
        w->events = events;
    }
    PyGILState_Release(g);
    return rc;
}

static void aio_io_free(void *ud, void *io)
{
    (void)ud;
    PyGILState_STATE g = PyGILState_Ensure();
    IoWatchObject *w = io;
    if (aio_watch_bit(w, 0, RATE_LOOP_READ, "add_reader", "remove_reader",
                      "on_read") < 0 ||
        aio_watch_bit(w, 0, RATE_LOOP_WRITE, "add_writer", "remove_writer",
                      "on_write") < 0)
        PyErr_Clear(); /* a closed loop: nothing left to remove */
    w->events = 0;
    w->freed = 1;
    Py_DECREF(w);
    PyGILState_Release(g);
}

static void *aio_timer_new(void *ud, rate_loop_timer_fn fn, void *arg)
{
    PyGILState_STATE g = PyGILState_Ensure();
    LoopTimerObject *t = PyObject_New(LoopTimerObject, &LoopTimerType);
    if (t) {
        Py_INCREF((PyObject *)ud);
        t->loop = ud;
        t->handle = NULL;
        t->fn = fn;
        t->arg = arg;
        t->freed = 0;
    } else {
        adapter_unraisable("ratelimit: asyncio timer");
    }
    PyGILState_Release(g);
    return t;
}

static void aio_timer_cancel_held(LoopTimerObject *t)
{
    if (t->handle) {
        PyObject *r = PyObject_CallMethod(t->handle, "cancel", NULL);
        if (r)
            Py_DECREF(r);
        else
            PyErr_Clear();
        Py_CLEAR(t->handle);
    }
}

static int aio_timer_arm(void *ud, void *timer, uint64_t after_ns)
{
    (void)ud;
    PyGILState_STATE g = PyGILState_Ensure();
    LoopTimerObject *t = timer;
    aio_timer_cancel_held(t);
    int rc = 0;
    PyObject *cb = PyObject_GetAttrString((PyObject *)t, "fire");
    if (cb) {
        t->handle = PyObject_CallMethod(t->loop, "call_later", "dO",
                                        (double)after_ns / 1e9, cb);
        Py_DECREF(cb);
    }
    if (!t->handle) {
        adapter_unraisable("ratelimit: asyncio call_later");
        rc = -1;
    }
    PyGILState_Release(g);
    return rc;
}

static void aio_timer_cancel(void *ud, void *timer)
{
    (void)ud;
    PyGILState_STATE g = PyGILState_Ensure();
    aio_timer_cancel_held(timer);
    PyGILState_Release(g);
}

static void aio_timer_free(void *ud, void *timer)
{
    (void)ud;
    PyGILState_STATE g = PyGILState_Ensure();
    LoopTimerObject *t = timer;
    aio_timer_cancel_held(t);
    t->freed = 1;
    Py_DECREF(t);
    PyGILState_Release(g);
}

/* ---------------------------------------------------------------- Store */

typedef struct {
    PyObject_HEAD
    rate_store_t *store;
    const char *kind;   /* "memory", "shm", "redis", "redis-async" */
    Py_ssize_t users;   /* open limiters on it */
    PyObject *loop;     /* redis-async: the asyncio loop, kept alive */
} StoreObject;

static PyTypeObject StoreType;

static StoreObject *store_alloc(const char *kind)
{
    StoreObject *s = PyObject_New(StoreObject, &StoreType);
    if (s) {
        s->store = NULL;
        s->kind = kind;
        s->users = 0;
        s->loop = NULL;
    }
    return s;
}

static void Store_dealloc(StoreObject *self)
{
    /* A limiter holds a reference: no user is left here. */
    rate_store_free(self->store);
    Py_XDECREF(self->loop);
    PyObject_Free(self);
}

static PyObject *Store_close(StoreObject *self, PyObject *unused)
{
    (void)unused;
    if (self->users > 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "the store has open limiters: close them first");
        return NULL;
    }
    rate_store_t *st = self->store;
    self->store = NULL;
    Py_BEGIN_ALLOW_THREADS
    rate_store_free(st);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static int store_open(StoreObject *self)
{
    if (!self->store) {
        PyErr_SetString(PyExc_ValueError, "the store is closed");
        return -1;
    }
    return 0;
}

static PyObject *Store_stats(StoreObject *self, PyObject *unused)
{
    (void)unused;
    if (store_open(self) < 0)
        return NULL;
    rate_stats_t st;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = rate_store_stats(self->store, &st);
    Py_END_ALLOW_THREADS
    if (rc != RATE_OK)
        return raise_rc(rc, NULL);
    return Py_BuildValue("{s:K,s:K,s:K,s:K}", "keys",
                         (unsigned long long)st.keys, "evictions",
                         (unsigned long long)st.evictions, "reclaimed",
                         (unsigned long long)st.reclaimed, "bytes",
                         (unsigned long long)st.bytes);
}

/* Deletes every key of a shared-memory or Redis store's namespace. */
static PyObject *Store_drop(StoreObject *self, PyObject *unused)
{
    (void)unused;
    if (store_open(self) < 0)
        return NULL;
    int rc;
    if (strcmp(self->kind, "shm") == 0) {
        Py_BEGIN_ALLOW_THREADS
        rc = rate_store_shm_drop(self->store);
        Py_END_ALLOW_THREADS
    } else if (strncmp(self->kind, "redis", 5) == 0) {
        Py_BEGIN_ALLOW_THREADS
        rc = rate_store_redis_drop(self->store);
        Py_END_ALLOW_THREADS
    } else {
        PyErr_SetString(PyExc_TypeError, "drop() is for shm and Redis stores");
        return NULL;
    }
    if (rc != RATE_OK)
        return raise_rc(rc, NULL);
    Py_RETURN_NONE;
}

static PyObject *Store_get_kind(StoreObject *self, void *c)
{
    (void)c;
    return PyUnicode_FromString(self->kind);
}

static PyObject *Store_get_closed(StoreObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->store == NULL);
}

/* check_policy(policy): None when the store keeps every state of the
 * policy, else raises Error with its reason (rate_store_check_policy). */
static PyObject *Store_check_policy(StoreObject *self, PyObject *policy)
{
    if (store_open(self) < 0)
        return NULL;
    if (!PyObject_TypeCheck(policy, &PolicyType)) {
        PyErr_Format(PyExc_TypeError, "policy must be a ratelimit.Policy, not %.100s",
                     Py_TYPE(policy)->tp_name);
        return NULL;
    }
    if (policy_ready((PolicyObject *)policy) < 0)
        return NULL;
    char err[ERRLEN] = "";
    int rc = rate_store_check_policy(self->store,
                                     ((PolicyObject *)policy)->policy, err,
                                     sizeof err);
    if (rc != RATE_OK)
        return raise_rc(rc, err);
    Py_RETURN_NONE;
}

static PyMethodDef Store_methods[] = {
    {"check_policy", (PyCFunction)Store_check_policy, METH_O,
     "check_policy(policy): raises Error (RATE_EPOLICY, the store's reason) "
     "when the store cannot keep the policy's states."},
    {"close", (PyCFunction)Store_close, METH_NOARGS,
     "Frees the store (no limiter may be open on it)."},
    {"stats", (PyCFunction)Store_stats, METH_NOARGS, "The store's figures."},
    {"drop", (PyCFunction)Store_drop, METH_NOARGS,
     "Deletes every key of the store's namespace (shm, Redis)."},
    {"__enter__", enter_self, METH_NOARGS, NULL},
    {"__exit__", exit_close, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Store_getset[] = {
    {"kind", (getter)Store_get_kind, NULL, "memory, shm or redis", NULL},
    {"closed", (getter)Store_get_closed, NULL, "closed already", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject StoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ratelimit.Store",
    .tp_basicsize = sizeof(StoreObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A store of key states: memory_store(), shm_store(), redis_store().",
    .tp_dealloc = (destructor)Store_dealloc,
    .tp_methods = Store_methods,
    .tp_getset = Store_getset,
};

static PyObject *mod_memory_store(PyObject *m, PyObject *args, PyObject *kw)
{
    (void)m;
    static char *kwlist[] = {"max_keys", "shards", NULL};
    PyObject *max_keys_obj = NULL, *shards_obj = NULL;
    unsigned long long max_keys = 0, shards = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OO:memory_store", kwlist,
                                     &max_keys_obj, &shards_obj))
        return NULL;
    /* the library's bounds (rate_store_memory_new: RATE_EINVAL alone) */
    if (uint_opt(max_keys_obj, "max_keys", UINT32_MAX, &max_keys) < 0 ||
        uint_opt(shards_obj, "shards", 65536, &shards) < 0)
        return NULL;
    rate_memory_options_t o;
    memset(&o, 0, sizeof o);
    o.max_keys = (size_t)max_keys;
    o.shards = (unsigned)shards;
    StoreObject *s = store_alloc("memory");
    if (!s)
        return NULL;
    int rc = rate_store_memory_new(&o, &s->store);
    if (rc != RATE_OK) {
        Py_DECREF(s);
        return raise_rc(rc, NULL);
    }
    return (PyObject *)s;
}

static PyObject *mod_shm_store(PyObject *m, PyObject *args, PyObject *kw)
{
    (void)m;
    static char *kwlist[] = {"path", "max_keys", "key_max", "state_max",
                             "prefix", "no_create", "mode", NULL};
    PyObject *path_obj, *prefix_obj = Py_None;
    PyObject *max_keys_obj = NULL, *key_max_obj = NULL;
    PyObject *state_max_obj = NULL, *mode_obj = NULL;
    unsigned long long max_keys = 0, key_max = 0, state_max = 0, mode = 0;
    int no_create = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$OOOOpO:shm_store", kwlist,
                                     &path_obj, &max_keys_obj, &key_max_obj,
                                     &state_max_obj, &prefix_obj, &no_create,
                                     &mode_obj))
        return NULL;
    /* the fields' ranges; rate_store_shm_new names its own bounds */
    if (uint_opt(max_keys_obj, "max_keys", UINT64_MAX, &max_keys) < 0 ||
        uint_opt(key_max_obj, "key_max", UINT32_MAX, &key_max) < 0 ||
        uint_opt(state_max_obj, "state_max", UINT32_MAX, &state_max) < 0 ||
        uint_opt(mode_obj, "mode", UINT_MAX, &mode) < 0)
        return NULL;
    rate_shm_options_t o;
    memset(&o, 0, sizeof o);
    const char *path, *prefix = NULL;
    if (cstring_arg(path_obj, "path", &path) < 0)
        return NULL;
    if (prefix_obj != Py_None && cstring_arg(prefix_obj, "prefix", &prefix) < 0)
        return NULL;
    o.max_keys = max_keys;
    o.key_max = (uint32_t)key_max;
    o.state_max = (uint32_t)state_max;
    o.prefix = prefix;
    o.no_create = no_create != 0;
    o.mode = (unsigned)mode;
    StoreObject *s = store_alloc("shm");
    if (!s)
        return NULL;
    char err[ERRLEN] = "";
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = rate_store_shm_new(path, &o, &s->store, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (rc != RATE_OK) {
        Py_DECREF(s);
        return raise_rc(rc, err);
    }
    return (PyObject *)s;
}

/* The Redis stores: redis_store(url, ...), and redis_async_store(url,
 * loop, ...) over an asyncio loop (create it on the loop's thread; close
 * it there). */
static PyObject *redis_store_new(PyObject *args, PyObject *kw, int async)
{
    static char *kwlist[] = {"url", "loop", "prefix", "module", "no_ttl",
                             "client_time", "connect_timeout",
                             "command_timeout", "pool_size", "lazy_connect",
                             NULL};
    PyObject *url_obj, *loop_obj = Py_None, *prefix_obj = Py_None;
    PyObject *module_obj = Py_None, *cto = Py_None, *cmto = Py_None;
    PyObject *pool_obj = NULL;
    int no_ttl = 0, client_time = 0, lazy = 0;
    unsigned long long pool = 0;
    if (!PyArg_ParseTupleAndKeywords(
            args, kw,
            async ? "OO|$OOppOOOp:redis_async_store" : "O|$OOOppOOOp:redis_store",
            kwlist, &url_obj, &loop_obj, &prefix_obj, &module_obj, &no_ttl,
            &client_time, &cto, &cmto, &pool_obj, &lazy))
        return NULL;
    if (uint_opt(pool_obj, "pool_size", UINT_MAX, &pool) < 0)
        return NULL;
    rate_redis_options_t o;
    memset(&o, 0, sizeof o);
    const char *url, *prefix = NULL, *module = "auto";
    if (cstring_arg(url_obj, "url", &url) < 0)
        return NULL;
    if (prefix_obj != Py_None && cstring_arg(prefix_obj, "prefix", &prefix) < 0)
        return NULL;
    if (module_obj != Py_None && cstring_arg(module_obj, "module", &module) < 0)
        return NULL;
    if (strcmp(module, "auto") == 0)
        o.module = RATE_REDIS_MODULE_AUTO;
    else if (strcmp(module, "on") == 0)
        o.module = RATE_REDIS_MODULE_ON;
    else if (strcmp(module, "off") == 0)
        o.module = RATE_REDIS_MODULE_OFF;
    else {
        PyErr_Format(PyExc_ValueError,
                     "module must be 'auto', 'on' or 'off', not '%s'", module);
        return NULL;
    }
    if (seconds_arg(cto, "connect_timeout", 0, &o.connect_timeout_ns) < 0 ||
        seconds_arg(cmto, "command_timeout", 0, &o.command_timeout_ns) < 0)
        return NULL;
    if (async ? !PyObject_HasAttrString(loop_obj, "add_reader") ||
                    !PyObject_HasAttrString(loop_obj, "call_later")
              : loop_obj != Py_None) {
        PyErr_SetString(PyExc_TypeError,
                        async ? "loop must be an asyncio event loop"
                              : "redis_store takes no loop (redis_async_store does)");
        return NULL;
    }
    o.prefix = prefix;
    o.no_ttl = no_ttl != 0;
    o.client_time = client_time != 0;
    o.pool_size = (unsigned)pool;
    o.lazy_connect = lazy != 0;
    rate_loop_t loop;
    memset(&loop, 0, sizeof loop);
    loop.ud = loop_obj;
    loop.io_new = aio_io_new;
    loop.io_set = aio_io_set;
    loop.io_free = aio_io_free;
    loop.timer_new = aio_timer_new;
    loop.timer_arm = aio_timer_arm;
    loop.timer_cancel = aio_timer_cancel;
    loop.timer_free = aio_timer_free;
    StoreObject *s = store_alloc(async ? "redis-async" : "redis");
    if (!s)
        return NULL;
    if (async) {
        Py_INCREF(loop_obj);
        s->loop = loop_obj;
    }
    char err[ERRLEN] = "";
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = async ? rate_store_redis_async_new(url, &o, &loop, &s->store, err,
                                            sizeof err)
               : rate_store_redis_new(url, &o, &s->store, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (rc != RATE_OK) {
        Py_DECREF(s);
        return raise_rc(rc, err);
    }
    return (PyObject *)s;
}

static PyObject *mod_redis_store(PyObject *m, PyObject *args, PyObject *kw)
{
    (void)m;
    return redis_store_new(args, kw, 0);
}

static PyObject *mod_redis_async_store(PyObject *m, PyObject *args, PyObject *kw)
{
    (void)m;
    return redis_store_new(args, kw, 1);
}

/* A store argument: None or an open Store.  Returns -1 with the error
 * raised. */
static int store_arg(PyObject *store)
{
    if (store == Py_None)
        return 0;
    if (!PyObject_TypeCheck(store, &StoreType)) {
        PyErr_Format(PyExc_TypeError, "store must be a ratelimit.Store, not %.100s",
                     Py_TYPE(store)->tp_name);
        return -1;
    }
    return store_open((StoreObject *)store);
}

/* Keeps the store (None: nothing) for a Limiter or an InFlight made on it,
 * which it then outlives.  Returns whether its calls never wait (memory). */
static int store_attach(PyObject *store, PyObject **slot)
{
    if (store == Py_None)
        return 1;
    Py_INCREF(store);
    *slot = store;
    ((StoreObject *)store)->users++;
    return strcmp(((StoreObject *)store)->kind, "memory") == 0;
}

/* Raises the error of a call that set or used `policy` on `store` (None:
 * the limiter's private memory store): RATE_EPOLICY with the store's
 * reason (rate_store_check_policy: "the policy's states take up to N
 * bytes, ..."), which the limiter's calls do not pass on. */
static PyObject *raise_policy_rc(int rc, PyObject *store,
                                 const rate_policy_t *policy)
{
    char err[ERRLEN] = "";
    if (rc == RATE_EPOLICY && store && store != Py_None && policy &&
        ((StoreObject *)store)->store)
        (void)rate_store_check_policy(((StoreObject *)store)->store, policy,
                                      err, sizeof err);
    return raise_rc(rc, err);
}

/* -------------------------------------------------------------- Limiter */

typedef struct {
    PyObject_HEAD
    rate_limiter_t *limiter;
    PyObject *store;  /* StoreObject or NULL (a private memory store) */
    PyObject *policy; /* the default PolicyObject */
    pthread_rwlock_t lock; /* read: a call; write: close */
    int lock_ready;
    Py_ssize_t in_flight; /* asynchronous decisions not yet called back */
    int memory_only;      /* on a memory store: its calls never wait */
    Py_ssize_t users;     /* open Fair limits on it */
} LimiterObject;

/* A decision on the memory store never waits (a shard's spin lock is held
 * for the step only): it keeps the GIL, saving the release and the take.
 * Every other store's calls release it. */
#define DECIDE_BEGIN(self) \
    { \
        PyThreadState *ts_ = (self)->memory_only ? NULL : PyEval_SaveThread();
#define DECIDE_END \
    if (ts_) \
        PyEval_RestoreThread(ts_); \
    }

/* Arguments of a METH_FASTCALL | METH_KEYWORDS method: out[i] is the
 * argument named names[i] (positions first, up to npos), or left as it is.
 * Returns -1 with TypeError for an unknown, repeated or extra argument. */
static int fast_args(const char *fname, PyObject *const *args,
                     Py_ssize_t nargs, PyObject *kwnames,
                     const char *const *names, Py_ssize_t npos,
                     Py_ssize_t nrequired, PyObject **out)
{
    if (nargs > npos) {
        PyErr_Format(PyExc_TypeError,
                     "%s() takes at most %zd positional arguments (%zd given)",
                     fname, npos, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        out[i] = args[i];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    Py_ssize_t given = nargs;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        const char *kw = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, k));
        if (!kw)
            return -1;
        Py_ssize_t i = 0;
        while (names[i] && strcmp(names[i], kw) != 0)
            i++;
        if (!names[i] || i < nargs) {
            PyErr_Format(PyExc_TypeError,
                         names[i] ? "%s() got multiple values for argument '%s'"
                                  : "%s() got an unexpected keyword argument '%s'",
                         fname, kw);
            return -1;
        }
        out[i] = args[nargs + k];
        if (i < nrequired)
            given++;
    }
    if (given < nrequired && out[0] == NULL) {
        PyErr_Format(PyExc_TypeError, "%s() missing its argument '%s'", fname,
                     names[0]);
        return -1;
    }
    return 0;
}

static PyTypeObject LimiterType;

static int Limiter_init(LimiterObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"policy", "store", "fail", "shadow", NULL};
    PyObject *policy, *store = Py_None, *fail_obj = Py_None;
    int shadow = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O$Op:Limiter", kwlist,
                                     &policy, &store, &fail_obj, &shadow))
        return -1;
    if (self->limiter || self->lock_ready) {
        PyErr_SetString(PyExc_RuntimeError, "Limiter.__init__ called twice");
        return -1;
    }
    if (!PyObject_TypeCheck(policy, &PolicyType)) {
        PyErr_Format(PyExc_TypeError, "policy must be a ratelimit.Policy, not %.100s",
                     Py_TYPE(policy)->tp_name);
        return -1;
    }
    if (policy_ready((PolicyObject *)policy) < 0)
        return -1;
    if (store_arg(store) < 0)
        return -1;
    rate_limiter_config_t c;
    memset(&c, 0, sizeof c);
    c.policy = ((PolicyObject *)policy)->policy;
    c.store = store == Py_None ? NULL : ((StoreObject *)store)->store;
    c.shadow = shadow != 0;
    if (fail_obj != Py_None) {
        const char *fail;
        if (cstring_arg(fail_obj, "fail", &fail) < 0)
            return -1;
        if (strcmp(fail, "closed") == 0)
            c.on_store_error = RATE_FAIL_CLOSED;
        else if (strcmp(fail, "open") == 0)
            c.on_store_error = RATE_FAIL_OPEN;
        else if (strcmp(fail, "fallback") == 0)
            c.on_store_error = RATE_FAIL_FALLBACK;
        else {
            PyErr_Format(PyExc_ValueError,
                         "fail must be 'closed', 'open' or 'fallback', not '%s'",
                         fail);
            return -1;
        }
    }
    if (pthread_rwlock_init(&self->lock, NULL) != 0) {
        PyErr_NoMemory();
        return -1;
    }
    self->lock_ready = 1;
    int rc;
    rate_limiter_t *lim = NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = rate_limiter_new(&c, &lim);
    Py_END_ALLOW_THREADS
    if (rc != RATE_OK) {
        raise_policy_rc(rc, store, c.policy);
        return -1;
    }
    self->limiter = lim;
    self->memory_only = store_attach(store, &self->store);
    Py_INCREF(policy);
    self->policy = policy;
    return 0;
}

static void limiter_close(LimiterObject *self)
{
    if (!self->limiter)
        return;
    rate_limiter_t *lim;
    Py_BEGIN_ALLOW_THREADS
    pthread_rwlock_wrlock(&self->lock);
    lim = self->limiter;
    self->limiter = NULL;
    pthread_rwlock_unlock(&self->lock);
    rate_limiter_free(lim);
    Py_END_ALLOW_THREADS
    if (self->store)
        ((StoreObject *)self->store)->users--;
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
                        "the limiter has open fair limits: close them first");
        return NULL;
    }
    limiter_close(self);
    Py_RETURN_NONE;
}

static void Limiter_dealloc(LimiterObject *self)
{
    limiter_close(self);
    if (self->lock_ready)
        pthread_rwlock_destroy(&self->lock);
    Py_XDECREF(self->store);
    Py_XDECREF(self->policy);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Takes the read lock with the GIL released; fails on a closed limiter
 * (the lock then released).  Call with the GIL released. */
static int limiter_enter(LimiterObject *self)
{
    pthread_rwlock_rdlock(&self->lock);
    if (!self->limiter) {
        pthread_rwlock_unlock(&self->lock);
        return -1;
    }
    return 0;
}

static PyObject *raise_closed(void)
{
    PyErr_SetString(PyExc_ValueError, "the limiter is closed");
    return NULL;
}

static int limiter_usable(LimiterObject *self)
{
    if (!self->lock_ready) {
        PyErr_SetString(PyExc_ValueError, "Limiter.__init__ was not called");
        return -1;
    }
    if (!self->limiter) {
        raise_closed();
        return -1;
    }
    return 0;
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
    if (policy_obj != Py_None) {
        if (!PyObject_TypeCheck(policy_obj, &PolicyType)) {
            PyErr_SetString(PyExc_TypeError, "policy must be a ratelimit.Policy");
            return NULL;
        }
        if (policy_ready((PolicyObject *)policy_obj) < 0)
            return NULL;
        policy = ((PolicyObject *)policy_obj)->policy;
    }
    key_arg_t k;
    if (key_get(key_obj, &k) < 0)
        return NULL;
    rate_decision_t d;
    int rc = 0, closed = 0, at = now_obj != Py_None;
    DECIDE_BEGIN(self)
    if (limiter_enter(self) < 0) {
        closed = 1;
    } else {
        if (policy && at)
            rc = rate_limiter_check_policy_at(self->limiter, policy, k.ptr,
                                              k.len, permits, wait_ns, now_ns, &d);
        else if (policy)
            rc = rate_limiter_check_policy(self->limiter, policy, k.ptr, k.len,
                                           permits, wait_ns, &d);
        else if (at)
            rc = rate_limiter_check_at(self->limiter, k.ptr, k.len, permits,
                                       wait_ns, now_ns, &d);
        else
            rc = rate_limiter_check(self->limiter, k.ptr, k.len, permits,
                                    wait_ns, &d);
        pthread_rwlock_unlock(&self->lock);
    }
    DECIDE_END
    key_release(&k);
    if (closed)
        return raise_closed();
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
    if (limiter_enter(self) < 0) {
        closed = 1;
    } else {
        ok = now_obj != Py_None
                 ? rate_try_acquire_len_at(self->limiter, k.ptr, k.len, permits, now_ns)
                 : rate_try_acquire_len(self->limiter, k.ptr, k.len, permits);
        pthread_rwlock_unlock(&self->lock);
    }
    DECIDE_END
    key_release(&k);
    if (closed)
        return raise_closed();
    return PyBool_FromLong(ok);
}

/* acquire(key, permits=1, *, timeout=0) -> Decision: waits (GIL released). */
#define ACQUIRE_SLICE_NS 100000000u /* 100 ms */
static PyObject *Limiter_acquire(LimiterObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"key", "permits", "timeout", NULL};
    PyObject *key_obj, *permits_obj = NULL, *timeout_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O$O:acquire", kwlist,
                                     &key_obj, &permits_obj, &timeout_obj))
        return NULL;
    if (limiter_usable(self) < 0)
        return NULL;
    uint64_t permits = 1, timeout_ns;
    if (permits_obj && u64_arg(permits_obj, "permits", &permits) < 0)
        return NULL;
    if (seconds_arg(timeout_obj, "timeout", 0, &timeout_ns) < 0)
        return NULL;
    key_arg_t k;
    if (key_get(key_obj, &k) < 0)
        return NULL;
    /* The wait goes in slices of at most ACQUIRE_SLICE_NS, the signals'
     * handlers run between them: Ctrl-C ends a long wait. */
    rate_decision_t d;
    int rc = 0, closed = 0;
    uint64_t start = rate_clock_monotonic_ns();
    for (;;) {
        uint64_t spent = rate_clock_monotonic_ns() - start;
        uint64_t left = spent < timeout_ns ? timeout_ns - spent : 0;
        uint64_t pause = 0;
        Py_BEGIN_ALLOW_THREADS
        if (limiter_enter(self) < 0) {
            closed = 1;
        } else {
            rc = rate_limiter_acquire(self->limiter, k.ptr, k.len, permits,
                                      left < ACQUIRE_SLICE_NS ? left
                                                              : ACQUIRE_SLICE_NS,
                                      &d);
            pthread_rwlock_unlock(&self->lock);
        }
        /* denied for now, a retry within the timeout: wait a slice */
        if (!closed && rc == RATE_OK && !d.allowed &&
            d.reason == RATE_REASON_LIMITED && d.retry_after_ns <= left) {
            pause = d.retry_after_ns < ACQUIRE_SLICE_NS ? d.retry_after_ns
                                                        : ACQUIRE_SLICE_NS;
            struct timespec ts = {(time_t)(pause / RATE_NS_PER_S),
                                  (long)(pause % RATE_NS_PER_S)};
            nanosleep(&ts, NULL); /* a signal cuts it short: checked below */
        }
        Py_END_ALLOW_THREADS
        if (closed || rc != RATE_OK || pause == 0)
            break;
        if (PyErr_CheckSignals() < 0) {
            key_release(&k);
            return NULL;
        }
    }
    key_release(&k);
    if (closed)
        return raise_closed();
    if (rc != RATE_OK)
        return raise_rc(rc, NULL);
    return decision_new(&d);
}


/* The asynchronous decision's callback: the future gets the decision, or
 * Error; a cancelled future nothing.  ud is a (future, limiter) tuple the
 * call made, which keeps both alive until now. */
static void check_done(void *ud, int rc, const rate_decision_t *d)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *pair = ud; /* (future, limiter) */
    PyObject *fut = PyTuple_GET_ITEM(pair, 0);
    ((LimiterObject *)PyTuple_GET_ITEM(pair, 1))->in_flight--;
    PyObject *done = PyObject_CallMethod(fut, "done", NULL);
    int skip = done ? PyObject_IsTrue(done) : 1;
    Py_XDECREF(done);
    if (!skip) {
        PyObject *r = NULL;
        if (rc == RATE_OK) {
            PyObject *dec = decision_new(d);
            if (dec) {
                r = PyObject_CallMethod(fut, "set_result", "(O)", dec);
                Py_DECREF(dec);
            }
        } else {
            raise_rc(rc, NULL);
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_NormalizeException(&type, &value, &tb);
            r = PyObject_CallMethod(fut, "set_exception", "(O)", value);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
        }
        if (!r) {
            /* never leave the awaiting task hanging: it gets the error */
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_NormalizeException(&type, &value, &tb);
            r = PyObject_CallMethod(fut, "set_exception", "(O)",
                                    value ? value : Py_None);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
        }
        Py_XDECREF(r);
    }
    if (PyErr_Occurred())
        adapter_unraisable("ratelimit: asynchronous decision");
    Py_DECREF(pair);
    PyGILState_Release(g);
}

/* _check_start(key, permits, max_wait, future, now=None) -> Decision or
 * None: the decision at once, or None and the future gets it (on the
 * loop's thread; never blocks). */
static PyObject *Limiter_check_start(LimiterObject *self, PyObject *args)
{
    PyObject *key_obj, *permits_obj, *wait_obj, *fut, *now_obj = Py_None;
    if (!PyArg_ParseTuple(args, "OOOO|O:_check_start", &key_obj, &permits_obj,
                          &wait_obj, &fut, &now_obj))
        return NULL;
    if (limiter_usable(self) < 0)
        return NULL;
    uint64_t permits, wait_ns, now_ns = 0;
    if (u64_arg(permits_obj, "permits", &permits) < 0 ||
        seconds_arg(wait_obj, "max_wait", 0, &wait_ns) < 0 ||
        (now_obj != Py_None && u64_arg(now_obj, "now", &now_ns) < 0))
        return NULL;
    key_arg_t k;
    if (key_get(key_obj, &k) < 0)
        return NULL;
    rate_decision_t d;
    PyObject *pair = PyTuple_Pack(2, fut, (PyObject *)self);
    if (!pair) {
        key_release(&k);
        return NULL;
    }
    /* The GIL stays held: the call never blocks, and the adapter and the
     * callback run on this thread (a close() in another thread holds the
     * write lock only while it frees, which takes no GIL). */
    if (limiter_enter(self) < 0) {
        key_release(&k);
        Py_DECREF(pair);
        return raise_closed();
    }
    self->in_flight++;
    int rc = now_obj != Py_None
                 ? rate_limiter_check_start_at(self->limiter, k.ptr, k.len,
                                               permits, wait_ns, now_ns, &d,
                                               check_done, pair)
                 : rate_limiter_check_start(self->limiter, k.ptr, k.len,
                                            permits, wait_ns, &d, check_done,
                                            pair);
    pthread_rwlock_unlock(&self->lock);
    key_release(&k);
    if (rc == RATE_PENDING)
        Py_RETURN_NONE;
    self->in_flight--;
    Py_DECREF(pair);
    if (rc != RATE_OK)
        return raise_rc(rc, NULL);
    return decision_new(&d);
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
        if (what != CHANGE_REFUND || !PyObject_TypeCheck(policy_obj, &PolicyType)) {
            PyErr_SetString(PyExc_TypeError,
                            "policy must be a ratelimit.Policy (refund only)");
            return NULL;
        }
        if (policy_ready((PolicyObject *)policy_obj) < 0)
            return NULL;
        policy = ((PolicyObject *)policy_obj)->policy;
    }
    key_arg_t k;
    if (key_get(key_obj, &k) < 0)
        return NULL;
    int rc = 0, closed = 0, at = now_obj != Py_None;
    Py_BEGIN_ALLOW_THREADS
    if (limiter_enter(self) < 0) {
        closed = 1;
    } else {
        rate_limiter_t *l = self->limiter;
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
        pthread_rwlock_unlock(&self->lock);
    }
    Py_END_ALLOW_THREADS
    key_release(&k);
    if (closed)
        return raise_closed();
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

static PyObject *headers_new(const rate_headers_t *hp);

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
    if (!PyObject_TypeCheck(policy_obj, &PolicyType)) {
        PyErr_SetString(PyExc_TypeError, "policy must be a ratelimit.Policy");
        return NULL;
    }
    if (policy_ready((PolicyObject *)policy_obj) < 0)
        return NULL;
    rate_decision_t d;
    if (decision_from(dec, &d) < 0)
        return NULL;
    rate_headers_t h;
    int rc = rate_headers_format(((PolicyObject *)policy_obj)->policy, &d, &h);
    if (rc != RATE_OK)
        return raise_rc(rc, NULL);
    return headers_new(&h);
}

/* (status, {field: value}) of formatted header fields: those not empty. */
static PyObject *headers_new(const rate_headers_t *hp)
{
    const rate_headers_t h = *hp;
    PyObject *fields = PyDict_New();
    if (!fields)
        return NULL;
    const char *names[3] = {"RateLimit-Policy", "RateLimit", "Retry-After"};
    const char *values[3] = {h.policy, h.ratelimit, h.retry_after};
    for (int i = 0; i < 3; i++) {
        if (!values[i][0])
            continue;
        PyObject *v = PyUnicode_FromString(values[i]);
        if (!v || PyDict_SetItemString(fields, names[i], v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(fields);
            return NULL;
        }
        Py_DECREF(v);
    }
    return Py_BuildValue("(iN)", h.status, fields);
}

static PyObject *Limiter_stats(LimiterObject *self, PyObject *unused)
{
    (void)unused;
    if (limiter_usable(self) < 0)
        return NULL;
    rate_stats_t st;
    int rc = 0, closed = 0;
    Py_BEGIN_ALLOW_THREADS
    if (limiter_enter(self) < 0) {
        closed = 1;
    } else {
        rc = rate_limiter_stats(self->limiter, &st);
        pthread_rwlock_unlock(&self->lock);
    }
    Py_END_ALLOW_THREADS
    if (closed)
        return raise_closed();
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
    return PyBool_FromLong(self->limiter == NULL);
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

static PyTypeObject LimiterType = {
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

/* -------------------------------------------------------- InFlight, Lease */

typedef struct {
    PyObject_HEAD
    rate_inflight_t *inflight;
    PyObject *store;
    pthread_rwlock_t lock; /* read: a call; write: close */
    int lock_ready;
    int memory_only;       /* 0: lease calls release the GIL (DECIDE_BEGIN) */
} InFlightObject;

typedef struct {
    PyObject_HEAD
    InFlightObject *owner;
    PyObject *key;        /* bytes */
    rate_lease_t lease;
    int released;
} LeaseObject;

static PyTypeObject InFlightType;
static PyTypeObject LeaseType;

static int InFlight_init(InFlightObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"policy", "store", "reap_dead_holders", NULL};
    PyObject *text_obj, *store = Py_None;
    int reap = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O$p:InFlight", kwlist,
                                     &text_obj, &store, &reap))
        return -1;
    if (self->inflight || self->lock_ready) {
        PyErr_SetString(PyExc_RuntimeError, "InFlight.__init__ called twice");
        return -1;
    }
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
    if (pthread_rwlock_init(&self->lock, NULL) != 0) {
        rate_inflight_free(in);
        PyErr_NoMemory();
        return -1;
    }
    self->lock_ready = 1;
    self->inflight = in;
    /* A release or an extension may pause between retries under
     * contention, on any store: lease calls always release the GIL. */
    store_attach(store, &self->store);
    self->memory_only = 0;
    return 0;
}

static void inflight_close(InFlightObject *self)
{
    if (!self->inflight)
        return;
    rate_inflight_t *in;
    Py_BEGIN_ALLOW_THREADS
    pthread_rwlock_wrlock(&self->lock);
    in = self->inflight;
    self->inflight = NULL;
    pthread_rwlock_unlock(&self->lock);
    rate_inflight_free(in);
    Py_END_ALLOW_THREADS
    if (self->store)
        ((StoreObject *)self->store)->users--;
}

static void InFlight_dealloc(InFlightObject *self)
{
    inflight_close(self);
    if (self->lock_ready)
        pthread_rwlock_destroy(&self->lock);
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
    if (!self->lock_ready) {
        PyErr_SetString(PyExc_ValueError, "InFlight.__init__ was not called");
        return -1;
    }
    if (!self->inflight) {
        PyErr_SetString(PyExc_ValueError, "the in-flight limit is closed");
        return -1;
    }
    return 0;
}

/* Takes the read lock; fails on a closed object.  GIL released. */
static int inflight_enter(InFlightObject *self)
{
    pthread_rwlock_rdlock(&self->lock);
    if (!self->inflight) {
        pthread_rwlock_unlock(&self->lock);
        return -1;
    }
    return 0;
}

/* The key as bytes (a Lease keeps it for its release). */
static PyObject *key_bytes(PyObject *key_obj)
{
    key_arg_t k;
    if (key_get(key_obj, &k) < 0)
        return NULL;
    PyObject *b = PyBytes_FromStringAndSize(k.ptr, (Py_ssize_t)k.len);
    key_release(&k);
    return b;
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
    if (inflight_enter(self) < 0) {
        closed = 1;
    } else {
        rc = now_obj != Py_None
                 ? rate_inflight_acquire_at(self->inflight, kp, kl, cls, now_ns,
                                            &lease, &d)
                 : rate_inflight_acquire(self->inflight, kp, kl, cls, &lease, &d);
        pthread_rwlock_unlock(&self->lock);
    }
    DECIDE_END
    if (closed || rc != RATE_OK) {
        Py_DECREF(key);
        if (closed) {
            PyErr_SetString(PyExc_ValueError, "the in-flight limit is closed");
            return NULL;
        }
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
    if (inflight_enter(self) < 0) {
        closed = 1;
    } else {
        rc = now_obj != Py_None
                 ? rate_inflight_held_at(self->inflight, k.ptr, k.len, now_ns, &held)
                 : rate_inflight_held(self->inflight, k.ptr, k.len, &held);
        pthread_rwlock_unlock(&self->lock);
    }
    DECIDE_END
    key_release(&k);
    if (closed) {
        PyErr_SetString(PyExc_ValueError, "the in-flight limit is closed");
        return NULL;
    }
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

static PyTypeObject InFlightType = {
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
    if (inflight_enter(in) < 0) {
        closed = 1;
    } else {
        rc = op == LEASE_RELEASE
                 ? rate_inflight_release(in->inflight, kp, kl, &lease)
                 : rate_inflight_extend(in->inflight, kp, kl, &lease, ttl_ns);
        pthread_rwlock_unlock(&in->lock);
    }
    DECIDE_END
    if (closed) {
        PyErr_SetString(PyExc_ValueError, "the in-flight limit is closed");
        return NULL;
    }
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

static PyTypeObject LeaseType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ratelimit.Lease",
    .tp_basicsize = sizeof(LeaseObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A lease held: release() it, or use it as a context manager.",
    .tp_dealloc = (destructor)Lease_dealloc,
    .tp_methods = Lease_methods,
    .tp_getset = Lease_getset,
};


/* ----------------------------------------------------------------- Fair */

typedef struct {
    PyObject_HEAD
    rate_fair_t *fair;
    LimiterObject *limiter; /* kept open while this is */
    pthread_rwlock_t lock;  /* read: a call; write: close */
    int lock_ready;
    int memory_only;        /* a memory limiter and a table in this process */
} FairObject;

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
    if (self->fair || self->lock_ready) {
        PyErr_SetString(PyExc_RuntimeError, "Fair.__init__ called twice");
        return -1;
    }
    if (!PyObject_TypeCheck(lim_obj, &LimiterType)) {
        PyErr_Format(PyExc_TypeError, "limiter must be a ratelimit.Limiter, not %.100s",
                     Py_TYPE(lim_obj)->tp_name);
        return -1;
    }
    LimiterObject *lim = (LimiterObject *)lim_obj;
    if (limiter_usable(lim) < 0)
        return -1;
    const char *path = NULL;
    if (path_obj != Py_None && cstring_arg(path_obj, "shm_path", &path) < 0)
        return -1;
    key_arg_t k;
    if (key_get(key_obj, &k) < 0)
        return -1;
    rate_fair_config_t c;
    memset(&c, 0, sizeof c);
    c.limiter = lim->limiter;
    c.key = k.ptr;
    c.key_len = k.len;
    c.slots = (unsigned)slots;
    c.queue_max = (unsigned)queue_max;
    c.shm_path = path;
    char err[ERRLEN] = "";
    rate_fair_t *f = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = rate_fair_new(&c, &f, err, sizeof err);
    Py_END_ALLOW_THREADS
    key_release(&k);
    if (rc != RATE_OK) {
        raise_rc(rc, err);
        return -1;
    }
    if (pthread_rwlock_init(&self->lock, NULL) != 0) {
        rate_fair_free(f);
        PyErr_NoMemory();
        return -1;
    }
    self->lock_ready = 1;
    self->fair = f;
    /* a table shared by processes has a lock that may wait */
    self->memory_only = lim->memory_only && path == NULL;
    Py_INCREF(lim);
    self->limiter = lim;
    lim->users++;
    return 0;
}

static void fair_close(FairObject *self)
{
    if (!self->fair)
        return;
    rate_fair_t *f;
    Py_BEGIN_ALLOW_THREADS
    pthread_rwlock_wrlock(&self->lock);
    f = self->fair;
    self->fair = NULL;
    pthread_rwlock_unlock(&self->lock);
    rate_fair_free(f);
    Py_END_ALLOW_THREADS
    self->limiter->users--;
}

static void Fair_dealloc(FairObject *self)
{
    fair_close(self);
    if (self->lock_ready)
        pthread_rwlock_destroy(&self->lock);
    Py_XDECREF(self->limiter);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Fair_close(FairObject *self, PyObject *unused)
{
    (void)unused;
    fair_close(self);
    Py_RETURN_NONE;
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
    if (!self->lock_ready || !self->fair) {
        PyErr_SetString(PyExc_ValueError, "the fair limit is closed");
        return NULL;
    }
    uint64_t permits = 1, weight = 1, now_ns = 0;
    if ((permits_obj && u64_arg(permits_obj, "permits", &permits) < 0) ||
        (weight_obj && u64_arg(weight_obj, "weight", &weight) < 0) ||
        (now_obj != Py_None && u64_arg(now_obj, "now", &now_ns) < 0))
        return NULL;
    if (weight > UINT32_MAX)
        return raise_rc(RATE_EINVAL, "weight above RATE_FAIR_WEIGHT_MAX");
    key_arg_t k;
    if (key_get(flow_obj, &k) < 0)
        return NULL;
    rate_decision_t d;
    int rc = 0, closed = 0;
    DECIDE_BEGIN(self)
    pthread_rwlock_rdlock(&self->lock);
    if (!self->fair) {
        closed = 1;
    } else {
        rc = now_obj != Py_None
                 ? rate_fair_check_at(self->fair, k.ptr, k.len, (uint32_t)weight,
                                      permits, now_ns, &d)
                 : rate_fair_check(self->fair, k.ptr, k.len, (uint32_t)weight,
                                   permits, &d);
    }
    pthread_rwlock_unlock(&self->lock);
    DECIDE_END
    key_release(&k);
    if (closed) {
        PyErr_SetString(PyExc_ValueError, "the fair limit is closed");
        return NULL;
    }
    if (rc != RATE_OK)
        return raise_rc(rc, NULL);
    return decision_new(&d);
}

static PyMethodDef Fair_methods[] = {
    {"check", (PyCFunction)(void (*)(void))Fair_check,
     METH_VARARGS | METH_KEYWORDS,
     "check(flow, permits=1, *, weight=1, now=None) -> Decision"},
    {"close", (PyCFunction)Fair_close, METH_NOARGS, "frees the fair limit"},
    {"__enter__", enter_self, METH_NOARGS, NULL},
    {"__exit__", exit_close, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyTypeObject FairType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ratelimit.Fair",
    .tp_basicsize = sizeof(FairObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Fair(limiter, key, *, slots=0, queue_max=0, shm_path=None): "
              "the limiter's limit on `key` shared fairly by flows "
              "(docs/fair.md)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Fair_init,
    .tp_dealloc = (destructor)Fair_dealloc,
    .tp_methods = Fair_methods,
};


/* ---------------------------------------------------------------- Rules */

typedef struct {
    PyObject_HEAD
    rate_rules_t *rules;
    pthread_rwlock_t lock; /* read: a call; write: close */
    int lock_ready;
} RulesObject;

static int Rules_init(RulesObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"path", NULL};
    PyObject *path_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:Rules", kwlist, &path_obj))
        return -1;
    if (self->rules || self->lock_ready) {
        PyErr_SetString(PyExc_RuntimeError, "Rules.__init__ called twice");
        return -1;
    }
    PyObject *path_bytes = NULL;
    if (!PyUnicode_FSConverter(path_obj, &path_bytes))
        return -1;
    const char *path = PyBytes_AS_STRING(path_bytes);
    char err[ERRLEN] = "";
    rate_rules_t *r = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = rate_rules_load(path, &r, err, sizeof err);
    Py_END_ALLOW_THREADS
    Py_DECREF(path_bytes);
    if (rc != RATE_OK) {
        raise_rc(rc, err);
        return -1;
    }
    if (pthread_rwlock_init(&self->lock, NULL) != 0) {
        rate_rules_free(r);
        PyErr_NoMemory();
        return -1;
    }
    self->lock_ready = 1;
    self->rules = r;
    return 0;
}

static void rules_close(RulesObject *self)
{
    if (!self->rules)
        return;
    rate_rules_t *r;
    Py_BEGIN_ALLOW_THREADS
    pthread_rwlock_wrlock(&self->lock);
    r = self->rules;
    self->rules = NULL;
    pthread_rwlock_unlock(&self->lock);
    rate_rules_free(r);
    Py_END_ALLOW_THREADS
}

static void Rules_dealloc(RulesObject *self)
{
    rules_close(self);
    if (self->lock_ready)
        pthread_rwlock_destroy(&self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Rules_close(RulesObject *self, PyObject *unused)
{
    (void)unused;
    rules_close(self);
    Py_RETURN_NONE;
}

/* The outcome: (allowed, denied_by, delay_ns, [(policy name, Decision,
 * refunded), ...], (status, fields)). */
static PyObject *outcome_new(const rate_outcome_t *o)
{
    PyObject *applied = PyList_New((Py_ssize_t)o->count);
    for (size_t i = 0; applied && i < o->count; i++) {
        const rate_applied_t *a = &o->applied[i];
        PyObject *item = Py_BuildValue("(sNO)", a->policy_name,
                                       decision_new(&a->decision),
                                       a->refunded ? Py_True : Py_False);
        if (!item) {
            Py_CLEAR(applied);
            break;
        }
        PyList_SET_ITEM(applied, (Py_ssize_t)i, item);
    }
    if (!applied)
        return NULL;
    rate_headers_t h;
    int rc = rate_outcome_headers(o, &h);
    if (rc != RATE_OK) {
        Py_DECREF(applied);
        return raise_rc(rc, NULL);
    }
    PyObject *headers = headers_new(&h);
    if (!headers) {
        Py_DECREF(applied);
        return NULL;
    }
    return Py_BuildValue("(OiKNN)", o->allowed ? Py_True : Py_False,
                         o->denied_by, (unsigned long long)o->delay_ns,
                         applied, headers);
}

/* _check(limiter, key, attrs, permits, max_wait, now) -> the outcome tuple */
static PyObject *Rules_check(RulesObject *self, PyObject *args)
{
    PyObject *lim_obj, *key_obj, *attrs_obj, *permits_obj, *wait_obj, *now_obj;
    if (!PyArg_ParseTuple(args, "OOOOOO:_check", &lim_obj, &key_obj, &attrs_obj,
                          &permits_obj, &wait_obj, &now_obj))
        return NULL;
    if (!self->lock_ready || !self->rules) {
        PyErr_SetString(PyExc_ValueError, "the rules are closed");
        return NULL;
    }
    if (!PyObject_TypeCheck(lim_obj, &LimiterType)) {
        PyErr_SetString(PyExc_TypeError, "limiter must be a ratelimit.Limiter");
        return NULL;
    }
    LimiterObject *lim = (LimiterObject *)lim_obj;
    if (limiter_usable(lim) < 0)
        return NULL;
    if (!PyDict_Check(attrs_obj)) {
        PyErr_SetString(PyExc_TypeError, "attrs must be a dict of str to str");
        return NULL;
    }
    uint64_t permits, wait_ns, now_ns = 0;
    if (u64_arg(permits_obj, "permits", &permits) < 0 ||
        seconds_arg(wait_obj, "max_wait", 0, &wait_ns) < 0 ||
        (now_obj != Py_None && u64_arg(now_obj, "now", &now_ns) < 0))
        return NULL;
    Py_ssize_t n = PyDict_Size(attrs_obj);
    rate_attr_t *attrs = PyMem_Calloc((size_t)(n > 0 ? n : 1), sizeof *attrs);
    if (!attrs)
        return PyErr_NoMemory();
    PyObject *name, *value;
    Py_ssize_t pos = 0, i = 0;
    while (PyDict_Next(attrs_obj, &pos, &name, &value)) {
        if (cstring_arg(name, "attribute name", &attrs[i].name) < 0 ||
            cstring_arg(value, "attribute value", &attrs[i].value) < 0) {
            PyMem_Free(attrs);
            return NULL;
        }
        i++;
    }
    key_arg_t k;
    if (key_get(key_obj, &k) < 0) {
        PyMem_Free(attrs);
        return NULL;
    }
    rate_outcome_t o;
    int rc = 0, closed = 0;
    DECIDE_BEGIN(lim)
    pthread_rwlock_rdlock(&self->lock);
    if (!self->rules || limiter_enter(lim) < 0) {
        closed = 1;
    } else {
        rc = now_obj != Py_None
                 ? rate_rules_check_at(self->rules, lim->limiter, k.ptr, k.len,
                                       attrs, (size_t)n, permits, wait_ns,
                                       now_ns, &o)
                 : rate_rules_check(self->rules, lim->limiter, k.ptr, k.len,
                                    attrs, (size_t)n, permits, wait_ns, &o);
        pthread_rwlock_unlock(&lim->lock);
    }
    pthread_rwlock_unlock(&self->lock);
    DECIDE_END
    key_release(&k);
    PyMem_Free(attrs);
    if (closed) {
        PyErr_SetString(PyExc_ValueError, "the rules or the limiter are closed");
        return NULL;
    }
    if (rc != RATE_OK)
        return raise_rc(rc, NULL);
    return outcome_new(&o);
}

static PyMethodDef Rules_methods[] = {
    {"_check", (PyCFunction)Rules_check, METH_VARARGS,
     "_check(limiter, key, attrs, permits, max_wait, now) -> outcome tuple"},
    {"close", (PyCFunction)Rules_close, METH_NOARGS, "frees the rules"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject RulesType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ratelimit._Rules",
    .tp_basicsize = sizeof(RulesObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "_Rules(path): a rules file (use ratelimit.Rules)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Rules_init,
    .tp_dealloc = (destructor)Rules_dealloc,
    .tp_methods = Rules_methods,
};

/* --------------------------------------------------------------- module */

/* The floor of the bench: a Python call into a C function that does
 * nothing. */
static PyObject *mod_noop(PyObject *m, PyObject *args)
{
    (void)m;
    (void)args;
    Py_RETURN_NONE;
}

static PyObject *mod_monotonic_ns(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    return PyLong_FromUnsignedLongLong(rate_clock_monotonic_ns());
}

static PyObject *mod_parse_duration(PyObject *m, PyObject *arg)
{
    (void)m;
    const char *text;
    if (cstring_arg(arg, "duration", &text) < 0)
        return NULL;
    char err[ERRLEN] = "";
    uint64_t ns;
    int rc = rate_parse_duration(text, &ns, err, sizeof err);
    if (rc != RATE_OK)
        return raise_rc(rc, err);
    return PyLong_FromUnsignedLongLong(ns);
}

static PyObject *mod_strerror(PyObject *m, PyObject *arg)
{
    (void)m;
    long code = PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    if (code < INT_MIN || code > INT_MAX)
        code = INT_MIN;
    return Py_BuildValue("(ss)", rate_err_name((int)code),
                         rate_strerror((int)code));
}

static PyMethodDef module_methods[] = {
    {"strerror", mod_strerror, METH_O,
     "strerror(code) -> (name, text): an error code's name and message"},
    {"memory_store", (PyCFunction)(void (*)(void))mod_memory_store,
     METH_VARARGS | METH_KEYWORDS,
     "memory_store(*, max_keys=0, shards=0) -> Store"},
    {"shm_store", (PyCFunction)(void (*)(void))mod_shm_store,
     METH_VARARGS | METH_KEYWORDS,
     "shm_store(path, *, max_keys=0, key_max=0, state_max=0, prefix=None, "
     "no_create=False, mode=0) -> Store"},
    {"redis_store", (PyCFunction)(void (*)(void))mod_redis_store,
     METH_VARARGS | METH_KEYWORDS,
     "redis_store(url, *, prefix=None, module='auto', no_ttl=False, "
     "client_time=False, connect_timeout=None, command_timeout=None, "
     "pool_size=0, lazy_connect=False) -> Store"},
    {"redis_async_store", (PyCFunction)(void (*)(void))mod_redis_async_store,
     METH_VARARGS | METH_KEYWORDS,
     "redis_async_store(url, loop, *, prefix=None, module='auto', "
     "no_ttl=False, connect_timeout=None, command_timeout=None, "
     "lazy_connect=False) -> Store"},
    {"noop", mod_noop, METH_VARARGS, "does nothing (the bench's floor)"},
    {"monotonic_ns", mod_monotonic_ns, METH_NOARGS,
     "the library's clock (CLOCK_MONOTONIC), ns"},
    {"parse_duration", mod_parse_duration, METH_O,
     "parse_duration(text) -> ns ('250ms', '1m')"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "ratelimit._ratelimit",
    "The C binding of libratelimit (use the ratelimit package).", -1,
    module_methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__ratelimit(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    if (decision_type_ready() < 0 || PyType_Ready(&PolicyType) < 0 ||
        PyType_Ready(&StoreType) < 0 || PyType_Ready(&LimiterType) < 0 ||
        PyType_Ready(&IoWatchType) < 0 || PyType_Ready(&LoopTimerType) < 0 ||
        PyType_Ready(&InFlightType) < 0 || PyType_Ready(&LeaseType) < 0 ||
        PyType_Ready(&FairType) < 0 || PyType_Ready(&RulesType) < 0)
        goto fail;
    Error = PyErr_NewExceptionWithDoc(
        "ratelimit.Error",
        "An error of the library: the message is the library's; .code is "
        "the RATE_E* code, .name its name.",
        NULL, NULL);
    if (!Error)
        goto fail;
    if (PyModule_AddObjectRef(m, "Error", Error) < 0 ||
        PyModule_AddObjectRef(m, "Decision", (PyObject *)DecisionType) < 0 ||
        PyModule_AddObjectRef(m, "Policy", (PyObject *)&PolicyType) < 0 ||
        PyModule_AddObjectRef(m, "Store", (PyObject *)&StoreType) < 0 ||
        PyModule_AddObjectRef(m, "Limiter", (PyObject *)&LimiterType) < 0 ||
        PyModule_AddObjectRef(m, "InFlight", (PyObject *)&InFlightType) < 0 ||
        PyModule_AddObjectRef(m, "Lease", (PyObject *)&LeaseType) < 0 ||
        PyModule_AddObjectRef(m, "Fair", (PyObject *)&FairType) < 0 ||
        PyModule_AddObjectRef(m, "_Rules", (PyObject *)&RulesType) < 0)
        goto fail;
#define ADD_CODE(name, code, text)                                   \
    if (PyModule_AddIntConstant(m, #name, code) < 0)              \
        goto fail;
    RATE_ERRNO_MAP(ADD_CODE)
#undef ADD_CODE
    if (PyModule_AddObject(m, "NEVER",
                           PyLong_FromUnsignedLongLong(RATE_NEVER)) < 0 ||
        PyModule_AddIntConstant(m, "KEY_MAX", RATE_KEY_MAX) < 0 ||
        PyModule_AddStringConstant(m, "__version__", "0.4.0") < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
