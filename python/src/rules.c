/* SPDX-License-Identifier: MIT */
/*
 * rules.c -- the rules file (docs/api-server.md): ratelimit._Rules, a
 * rate_rules_t whose _check decides a request's attributes on a Limiter;
 * ratelimit.Rules (__init__.py) wraps its outcome tuple.
 */
#include "binding.h"

#include <string.h>

static int Rules_init(RulesObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"path", NULL};
    PyObject *path_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:Rules", kwlist, &path_obj))
        return -1;
    if (guard_init_twice(&self->guard, "Rules") < 0)
        return -1;
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
    if (guard_init(&self->guard, r) < 0) {
        rate_rules_free(r);
        return -1;
    }
    return 0;
}

static void rules_close(RulesObject *self)
{
    if (!guard_close_begin(&self->guard))
        return;
    Py_BEGIN_ALLOW_THREADS
    rate_rules_free(guard_take(&self->guard));
    Py_END_ALLOW_THREADS
}

static void Rules_dealloc(RulesObject *self)
{
    rules_close(self);
    guard_fini(&self->guard);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Rules_close(RulesObject *self, PyObject *unused)
{
    (void)unused;
    if (self->held > 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "the rules have requests held: release them first");
        return NULL;
    }
    rules_close(self);
    Py_RETURN_NONE;
}

/* The outcome: (allowed, denied_by, delay_ns, [(policy name, Decision,
 * refunded), ...], (status, fields)). */
PyObject *outcome_new(const rate_outcome_t *o)
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

/* A request's attributes (see rules_req_t): *attrs (PyMem_Free it) points
 * into *items (a new reference, to drop after the call). */
static int attrs_get(PyObject *dict, PyObject **items, rate_attr_t **attrs,
                     size_t *n)
{
    if (!PyDict_Check(dict)) {
        PyErr_SetString(PyExc_TypeError, "attrs must be a dict of str to str");
        return -1;
    }
    /* a list of our own: the strings outlive any change to the dict made
     * by another thread while the call runs without the GIL */
    PyObject *list = PyDict_Items(dict);
    if (!list)
        return -1;
    Py_ssize_t count = PyList_GET_SIZE(list);
    rate_attr_t *a = PyMem_Calloc((size_t)(count > 0 ? count : 1), sizeof *a);
    if (!a) {
        Py_DECREF(list);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyList_GET_ITEM(list, i);
        if (cstring_arg(PyTuple_GET_ITEM(item, 0), "attribute name",
                        &a[i].name) < 0 ||
            cstring_arg(PyTuple_GET_ITEM(item, 1), "attribute value",
                        &a[i].value) < 0) {
            PyMem_Free(a);
            Py_DECREF(list);
            return -1;
        }
    }
    *items = list;
    *attrs = a;
    *n = (size_t)count;
    return 0;
}

int rules_req_get(RulesObject *self, PyObject *lim_obj, PyObject *key_obj,
                  PyObject *attrs_obj, PyObject *permits_obj,
                  PyObject *wait_obj, rules_req_t *r)
{
    if (guard_usable(&self->guard, "Rules", RULES_CLOSED) < 0 ||
        limiter_arg(lim_obj, &r->lim) < 0 ||
        u64_arg(permits_obj, "permits", &r->permits) < 0 ||
        seconds_arg(wait_obj, "max_wait", 0, &r->wait_ns) < 0 ||
        attrs_get(attrs_obj, &r->items, &r->attrs, &r->n) < 0)
        return -1;
    if (key_get(key_obj, &r->k) < 0) {
        PyMem_Free(r->attrs);
        Py_DECREF(r->items);
        return -1;
    }
    return 0;
}

void rules_req_release(rules_req_t *r)
{
    key_release(&r->k);
    PyMem_Free(r->attrs);
    Py_DECREF(r->items);
}

/* _check(limiter, key, attrs, permits, max_wait, now) -> the outcome tuple */
static PyObject *Rules_check(RulesObject *self, PyObject *args)
{
    PyObject *lim_obj, *key_obj, *attrs_obj, *permits_obj, *wait_obj, *now_obj;
    if (!PyArg_ParseTuple(args, "OOOOOO:_check", &lim_obj, &key_obj, &attrs_obj,
                          &permits_obj, &wait_obj, &now_obj))
        return NULL;
    uint64_t now_ns = 0;
    if (now_obj != Py_None && u64_arg(now_obj, "now", &now_ns) < 0)
        return NULL;
    rules_req_t q;
    if (rules_req_get(self, lim_obj, key_obj, attrs_obj, permits_obj,
                      wait_obj, &q) < 0)
        return NULL;
    LimiterObject *lim = q.lim;
    rate_outcome_t o;
    int rc = 0, closed = 0;
    DECIDE_BEGIN(lim)
    if (guard_enter(&self->guard) < 0) {
        closed = 1;
    } else {
        if (guard_enter(&lim->guard) < 0) {
            closed = 1;
        } else {
            rate_rules_t *r = self->guard.handle;
            rc = now_obj != Py_None
                     ? rate_rules_check_at(r, lim->guard.handle, q.k.ptr,
                                           q.k.len, q.attrs, q.n, q.permits,
                                           q.wait_ns, now_ns, &o)
                     : rate_rules_check(r, lim->guard.handle, q.k.ptr,
                                        q.k.len, q.attrs, q.n, q.permits,
                                        q.wait_ns, &o);
            guard_leave(&lim->guard);
        }
        guard_leave(&self->guard);
    }
    DECIDE_END
    rules_req_release(&q);
    if (closed)
        return guard_raise_closed("the rules or the limiter are closed");
    if (rc == RATE_EPOLICY) /* the one cause rate_rules_check names */
        return raise_rc(rc, "the request matches a rule with an in-flight "
                            "policy, whose lease check() cannot hold: "
                            "Rules.acquire takes it");
    if (rc != RATE_OK)
        return raise_rc(rc, NULL);
    return outcome_new(&o);
}

/* reload(path=None) -> generation: the file read again (or `path`, which
 * later reloads then read); a bad file raises and keeps the rules. */
static PyObject *Rules_reload(RulesObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"path", NULL};
    PyObject *path_obj = Py_None, *path_bytes = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:reload", kwlist, &path_obj))
        return NULL;
    if (guard_usable(&self->guard, "Rules", RULES_CLOSED) < 0)
        return NULL;
    if (path_obj != Py_None && !PyUnicode_FSConverter(path_obj, &path_bytes))
        return NULL;
    const char *path = path_bytes ? PyBytes_AS_STRING(path_bytes) : NULL;
    char err[ERRLEN] = "";
    int rc = 0, closed = 0;
    uint64_t generation = 0;
    Py_BEGIN_ALLOW_THREADS
    if (guard_enter(&self->guard) < 0) {
        closed = 1;
    } else {
        rc = rate_rules_reload(self->guard.handle, path, err, sizeof err);
        generation = rate_rules_generation(self->guard.handle);
        guard_leave(&self->guard);
    }
    Py_END_ALLOW_THREADS
    Py_XDECREF(path_bytes);
    if (closed)
        return guard_raise_closed(RULES_CLOSED);
    if (rc != RATE_OK)
        return raise_rc(rc, err);
    return PyLong_FromUnsignedLongLong(generation);
}

/* The generation in use: 1 once loaded, one more for each reload. */
static PyObject *Rules_get_generation(RulesObject *self, void *c)
{
    (void)c;
    /* the read lock: a close() on another thread frees without the GIL */
    if (guard_usable(&self->guard, "Rules", RULES_CLOSED) < 0 ||
        guard_enter(&self->guard) < 0)
        return PyErr_Occurred() ? NULL : guard_raise_closed(RULES_CLOSED);
    uint64_t generation = rate_rules_generation(self->guard.handle);
    guard_leave(&self->guard);
    return PyLong_FromUnsignedLongLong(generation);
}

static PyGetSetDef Rules_getset[] = {
    {"generation", (getter)Rules_get_generation, NULL,
     "the rules in use: 1 once loaded, one more for each reload", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMethodDef Rules_methods[] = {
    {"reload", (PyCFunction)(void (*)(void))Rules_reload,
     METH_VARARGS | METH_KEYWORDS,
     "reload(path=None) -> generation: reads the file again; a bad file "
     "raises Error and the rules in use stay"},
    {"_check", (PyCFunction)Rules_check, METH_VARARGS,
     "_check(limiter, key, attrs, permits, max_wait, now) -> outcome tuple"},
    {"_acquire", (PyCFunction)Rules_acquire, METH_VARARGS,
     "_acquire(limiter, key, attrs, permits, max_wait, outcome_type) -> "
     "RulesHeld"},
    {"close", (PyCFunction)Rules_close, METH_NOARGS, "frees the rules"},
    {NULL, NULL, 0, NULL}};

PyTypeObject RulesType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ratelimit._Rules",
    .tp_basicsize = sizeof(RulesObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "_Rules(path): a rules file (use ratelimit.Rules)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Rules_init,
    .tp_dealloc = (destructor)Rules_dealloc,
    .tp_methods = Rules_methods,
    .tp_getset = Rules_getset,
};

