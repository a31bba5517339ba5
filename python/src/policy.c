/* SPDX-License-Identifier: MIT */
/*
 * policy.c -- ratelimit.Policy: a rate_policy_t parsed from the library's
 * text form (docs/policy.md), named or not; its canonical text, its
 * limits as dicts, equality by that text.
 */
#include "binding.h"

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

int policy_arg(PyObject *obj, const rate_policy_t **out)
{
    if (!PyObject_TypeCheck(obj, &PolicyType)) {
        PyErr_Format(PyExc_TypeError, "policy must be a ratelimit.Policy, not %.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (!((PolicyObject *)obj)->policy) {
        PyErr_SetString(PyExc_ValueError, "Policy.__init__ was not called");
        return -1;
    }
    *out = ((PolicyObject *)obj)->policy;
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

PyTypeObject PolicyType = {
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

