/* SPDX-License-Identifier: MIT */
/*
 * decision.c -- ratelimit.Decision, a struct sequence (a named tuple)
 * whose truth is `allowed`, made from a rate_decision_t and back; and the
 * RateLimit header fields of a decision as (status, {field: value}).
 */
#include "binding.h"

#include <math.h>
#include <string.h>

PyTypeObject *DecisionType;

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
int decision_type_ready(void)
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

PyObject *decision_new(const rate_decision_t *d)
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
int decision_from(PyObject *o, rate_decision_t *d)
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

/* (status, {field: value}) of formatted header fields: those not empty. */
PyObject *headers_new(const rate_headers_t *hp)
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
