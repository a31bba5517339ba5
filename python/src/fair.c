/* SPDX-License-Identifier: MIT */
/*
 * fair.c -- fair shares (docs/fair.md): ratelimit.Fair, one limit of a
 * Limiter on one key divided among flows by weighted max-min fairness
 * (rate_fair_t), in this process or in a table shared by a host's
 * processes.
 */
#include "binding.h"

#include <limits.h>
#include <string.h>

#include "ratelimit_fair.h"

typedef struct {
    PyObject_HEAD
    guard_t guard;          /* a rate_fair_t */
    LimiterObject *limiter; /* kept open while this is */
    int memory_only;        /* a memory limiter and a table in this process */
} FairObject;

#define FAIR_CLOSED "the fair limit is closed"

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
    LimiterObject *lim;
    if (guard_init_twice(&self->guard, "Fair") < 0 ||
        limiter_arg(lim_obj, &lim) < 0)
        return -1;
    const char *path = NULL;
    if (path_obj != Py_None && cstring_arg(path_obj, "shm_path", &path) < 0)
        return -1;
    key_arg_t k;
    if (key_get(key_obj, &k) < 0)
        return -1;
    rate_fair_config_t c;
    memset(&c, 0, sizeof c);
    c.limiter = lim->guard.handle;
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
    if (guard_init(&self->guard, f) < 0) {
        rate_fair_free(f);
        return -1;
    }
    /* a table shared by processes has a lock that may wait */
    self->memory_only = lim->memory_only && path == NULL;
    Py_INCREF(lim);
    self->limiter = lim;
    lim->users++;
    return 0;
}

static void fair_close(FairObject *self)
{
    if (!self->guard.handle)
        return;
    Py_BEGIN_ALLOW_THREADS
    rate_fair_free(guard_take(&self->guard));
    Py_END_ALLOW_THREADS
    self->limiter->users--;
}

static void Fair_dealloc(FairObject *self)
{
    fair_close(self);
    guard_fini(&self->guard);
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
    if (guard_usable(&self->guard, "Fair", FAIR_CLOSED) < 0)
        return NULL;
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
    if (guard_enter(&self->guard) < 0) {
        closed = 1;
    } else {
        rate_fair_t *f = self->guard.handle;
        rc = now_obj != Py_None
                 ? rate_fair_check_at(f, k.ptr, k.len, (uint32_t)weight,
                                      permits, now_ns, &d)
                 : rate_fair_check(f, k.ptr, k.len, (uint32_t)weight, permits,
                                   &d);
        guard_leave(&self->guard);
    }
    DECIDE_END
    key_release(&k);
    if (closed)
        return guard_raise_closed(FAIR_CLOSED);
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

PyTypeObject FairType = {
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

