/* SPDX-License-Identifier: MIT */
/*
 * convert.c -- what every room of the binding uses: the library's errors
 * as ratelimit.Error, Python arguments as the library's (texts, keys,
 * counts, durations, options), the context-manager methods, and the guard
 * of an object over a library handle (binding.h).
 */
#include "binding.h"

#include <limits.h>
#include <math.h>
#include <string.h>

PyObject *Error;

/* ---------------------------------------------------------------- errors */

/* Raises ratelimit.Error(message) with .code and .name: the library's
 * message (`detail`, when the call gave one) or rate_strerror's text. */
PyObject *raise_rc(int rc, const char *detail)
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

/* ------------------------------------------------------------- arguments */

int cstring_arg(PyObject *obj, const char *what, const char **out)
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

int key_get(PyObject *obj, key_arg_t *k)
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

void key_release(key_arg_t *k)
{
    if (k->has_view)
        PyBuffer_Release(&k->view);
}

/* The key as bytes (a Lease keeps it for its release). */
PyObject *key_bytes(PyObject *key_obj)
{
    key_arg_t k;
    if (key_get(key_obj, &k) < 0)
        return NULL;
    PyObject *b = PyBytes_FromStringAndSize(k.ptr, (Py_ssize_t)k.len);
    key_release(&k);
    return b;
}

/* A count or a time in ns: a non-negative int up to 2^64-1 (the library
 * itself refuses what is above its bounds, RATE_ERANGE). */
int u64_arg(PyObject *obj, const char *what, uint64_t *out)
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
int uint_opt(PyObject *obj, const char *what, unsigned long long max,
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
int seconds_arg(PyObject *obj, const char *what, uint64_t dflt,
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

/* Arguments of a METH_FASTCALL | METH_KEYWORDS method: out[i] is the
 * argument named names[i] (positions first, up to npos), or left as it is.
 * Returns -1 with TypeError for an unknown, repeated or extra argument. */
int fast_args(const char *fname, PyObject *const *args,
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

int fail_arg(PyObject *obj, rate_fail_mode_t *out)
{
    const char *fail;
    if (obj == NULL || obj == Py_None)
        return 0;
    if (cstring_arg(obj, "fail", &fail) < 0)
        return -1;
    if (strcmp(fail, "closed") == 0)
        *out = RATE_FAIL_CLOSED;
    else if (strcmp(fail, "open") == 0)
        *out = RATE_FAIL_OPEN;
    else if (strcmp(fail, "fallback") == 0)
        *out = RATE_FAIL_FALLBACK;
    else {
        PyErr_Format(PyExc_ValueError,
                     "fail must be 'closed', 'open' or 'fallback', not '%s'",
                     fail);
        return -1;
    }
    return 0;
}

/* -------------------------------------------------------- context managers */

/* __enter__ of the objects that are context managers: the object. */
PyObject *enter_self(PyObject *self, PyObject *unused)
{
    (void)unused;
    Py_INCREF(self);
    return self;
}

/* __exit__ of those whose leaving closes them: their close(). */
PyObject *exit_close(PyObject *self, PyObject *args)
{
    (void)args;
    return PyObject_CallMethod(self, "close", NULL);
}

/* ----------------------------------------------------------------- guard */

int guard_init_twice(const guard_t *g, const char *type)
{
    if (g->handle || g->ready) {
        PyErr_Format(PyExc_RuntimeError, "%s.__init__ called twice", type);
        return -1;
    }
    return 0;
}

int guard_init(guard_t *g, void *handle)
{
    if (pthread_rwlock_init(&g->lock, NULL) != 0) {
        PyErr_NoMemory();
        return -1;
    }
    g->ready = 1;
    g->handle = handle;
    return 0;
}

void guard_fini(guard_t *g)
{
    if (g->ready)
        pthread_rwlock_destroy(&g->lock);
    g->ready = 0;
}

int guard_usable(const guard_t *g, const char *type, const char *closed)
{
    if (!g->ready) {
        PyErr_Format(PyExc_ValueError, "%s.__init__ was not called", type);
        return -1;
    }
    if (!g->handle || g->closing) {
        guard_raise_closed(closed);
        return -1;
    }
    return 0;
}

int guard_close_begin(guard_t *g)
{
    if (!g->handle || g->closing)
        return 0;
    g->closing = 1;
    return 1;
}

PyObject *guard_raise_closed(const char *closed)
{
    PyErr_SetString(PyExc_ValueError, closed);
    return NULL;
}

int guard_enter(guard_t *g)
{
    pthread_rwlock_rdlock(&g->lock);
    if (!g->handle) {
        pthread_rwlock_unlock(&g->lock);
        return -1;
    }
    return 0;
}

void guard_leave(guard_t *g)
{
    pthread_rwlock_unlock(&g->lock);
}

int guard_enter_now(guard_t *g)
{
    if (pthread_rwlock_tryrdlock(&g->lock) != 0)
        return -1;
    if (!g->handle) {
        pthread_rwlock_unlock(&g->lock);
        return -1;
    }
    return 0;
}

void *guard_take(guard_t *g)
{
    pthread_rwlock_wrlock(&g->lock);
    void *handle = g->handle;
    g->handle = NULL;
    pthread_rwlock_unlock(&g->lock);
    return handle;
}
