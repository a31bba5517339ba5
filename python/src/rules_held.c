/* SPDX-License-Identifier: MIT */
/*
 * rules_held.c -- the rules file's in-flight rules (docs/api-server.md,
 * "Requests that hold a lease"): Rules._acquire decides a request as
 * _check does and gives a ratelimit.RulesHeld, the leases it holds until
 * its release() (a context manager).  While a request is held its Rules
 * and its Limiter refuse to close: the leases live in the limiter's store
 * and the rules' generation, and are released on the limiter's clock.
 */
#include "binding.h"

#include <string.h>

typedef struct {
    PyObject_HEAD
    RulesObject *rules;
    LimiterObject *limiter;
    rate_rules_held_t *held; /* NULL: nothing to release (denied, no
                                in-flight policy, or released) */
    PyObject *outcome;       /* ratelimit.Outcome */
    int released;            /* release() ran */
} RulesHeldObject;

/* Releases what is held, once (the GIL held; it is released around the
 * library's call).  Returns rate_rules_release's status. */
static int held_release(RulesHeldObject *self)
{
    rate_rules_held_t *h = self->held;
    self->held = NULL; /* a release on another thread now does nothing */
    self->released = 1;
    if (!h)
        return RATE_OK;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = rate_rules_release(h);
    Py_END_ALLOW_THREADS
    self->rules->held--;
    self->limiter->users--;
    return rc;
}

static void RulesHeld_dealloc(RulesHeldObject *self)
{
    /* dropped unreleased: released here, as the end of a with block would */
    if (self->rules)
        (void)held_release(self);
    Py_XDECREF(self->rules);
    Py_XDECREF(self->limiter);
    Py_XDECREF(self->outcome);
    PyObject_Free(self);
}

/* _acquire(limiter, key, attrs, permits, max_wait, outcome_type) ->
 * RulesHeld whose outcome is outcome_type(*the outcome's fields) */
PyObject *Rules_acquire(RulesObject *self, PyObject *args)
{
    PyObject *lim_obj, *key_obj, *attrs_obj, *permits_obj, *wait_obj, *type;
    if (!PyArg_ParseTuple(args, "OOOOOO:_acquire", &lim_obj, &key_obj,
                          &attrs_obj, &permits_obj, &wait_obj, &type))
        return NULL;
    rules_req_t q;
    if (rules_req_get(self, lim_obj, key_obj, attrs_obj, permits_obj,
                      wait_obj, &q) < 0)
        return NULL;
    LimiterObject *lim = q.lim;
    /* made first: once leases are taken, nothing fails before the object
     * that releases them holds them */
    RulesHeldObject *h = PyObject_New(RulesHeldObject, &RulesHeldType);
    if (!h) {
        rules_req_release(&q);
        return NULL;
    }
    Py_INCREF(self);
    Py_INCREF(lim);
    h->rules = self;
    h->limiter = lim;
    h->held = NULL;
    h->outcome = NULL;
    h->released = 0;
    /* counted before the GIL is let go: a close() meanwhile refuses */
    self->held++;
    lim->users++;
    rate_outcome_t o;
    rate_rules_held_t *held = NULL;
    int rc = 0, closed = 0;
    Py_BEGIN_ALLOW_THREADS
    if (guard_enter(&self->guard) < 0) {
        closed = 1;
    } else {
        if (guard_enter(&lim->guard) < 0) {
            closed = 1;
        } else {
            rc = rate_rules_acquire(self->guard.handle, lim->guard.handle,
                                    q.k.ptr, q.k.len, q.attrs, q.n, q.permits,
                                    q.wait_ns, &o, &held);
            guard_leave(&lim->guard);
        }
        guard_leave(&self->guard);
    }
    Py_END_ALLOW_THREADS
    rules_req_release(&q);
    if (held) {
        h->held = held;
    } else {
        self->held--;
        lim->users--;
    }
    PyObject *t = NULL;
    if (closed)
        guard_raise_closed("the rules or the limiter are closed");
    else if (rc != RATE_OK)
        raise_rc(rc, NULL);
    else
        t = outcome_new(&o);
    if (t) {
        PyObject *sf = PyTuple_GET_ITEM(t, 4); /* (status, fields) */
        h->outcome = PyObject_CallFunction(
            type, "OOOOOO", PyTuple_GET_ITEM(t, 0), PyTuple_GET_ITEM(t, 1),
            PyTuple_GET_ITEM(t, 2), PyTuple_GET_ITEM(t, 3),
            PyTuple_GET_ITEM(sf, 0), PyTuple_GET_ITEM(sf, 1));
        Py_DECREF(t);
    }
    if (!h->outcome) {
        Py_DECREF(h); /* releases what it holds */
        return NULL;
    }
    return (PyObject *)h;
}

static PyObject *RulesHeld_release(RulesHeldObject *self, PyObject *unused)
{
    (void)unused;
    int rc = held_release(self);
    if (rc != RATE_OK)
        return raise_rc(rc, NULL);
    Py_RETURN_NONE;
}

/* Leaving the block releases (unless released in it); a failed release
 * raises only when the block itself raised nothing. */
static PyObject *RulesHeld_exit(RulesHeldObject *self, PyObject *args)
{
    PyObject *exc_type = PyTuple_GET_SIZE(args) > 0 ? PyTuple_GET_ITEM(args, 0)
                                                    : Py_None;
    int rc = held_release(self);
    if (rc != RATE_OK && exc_type == Py_None)
        return raise_rc(rc, NULL);
    Py_RETURN_FALSE;
}

static PyObject *RulesHeld_get_outcome(RulesHeldObject *self, void *c)
{
    (void)c;
    Py_INCREF(self->outcome);
    return self->outcome;
}

static PyObject *RulesHeld_get_held(RulesHeldObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->held != NULL);
}

static PyObject *RulesHeld_get_released(RulesHeldObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->released);
}

static PyMethodDef RulesHeld_methods[] = {
    {"release", (PyCFunction)RulesHeld_release, METH_NOARGS,
     "gives back every lease held (Error RATE_EEXPIRED when one lapsed "
     "first, the others released all the same); once: later calls, and "
     "calls on a request that holds nothing, do nothing"},
    {"__enter__", enter_self, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)RulesHeld_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef RulesHeld_getset[] = {
    {"outcome", (getter)RulesHeld_get_outcome, NULL,
     "the request's Outcome, as Rules.check gives it", NULL},
    {"held", (getter)RulesHeld_get_held, NULL,
     "leases are held now (allowed under an in-flight policy, not released)",
     NULL},
    {"released", (getter)RulesHeld_get_released, NULL, "release() ran", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject RulesHeldType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ratelimit.RulesHeld",
    .tp_basicsize = sizeof(RulesHeldObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A request decided by Rules.acquire: its outcome, and the "
              "leases it holds until release() or the end of a with block.",
    .tp_dealloc = (destructor)RulesHeld_dealloc,
    .tp_methods = RulesHeld_methods,
    .tp_getset = RulesHeld_getset,
};
