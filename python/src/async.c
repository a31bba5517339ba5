/* SPDX-License-Identifier: MIT */
/*
 * async.c -- asyncio: the rate_loop_t adapter on asyncio's add_reader,
 * add_writer and call_later (docs/python.md's table), and a Limiter's
 * asynchronous decisions (_check_start), whose callback resolves an
 * asyncio future.
 */
#include "binding.h"

#include <string.h>

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

PyTypeObject IoWatchType = {
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

PyTypeObject LoopTimerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ratelimit._LoopTimer",
    .tp_basicsize = sizeof(LoopTimerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)LoopTimer_dealloc,
    .tp_methods = LoopTimer_methods,
};

/* An exception inside the adapter cannot reach a Python caller: it is
 * reported as unraisable and the function fails as the table allows. */
void adapter_unraisable(const char *what)
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

void aio_loop_init(rate_loop_t *l, PyObject *loop)
{
    memset(l, 0, sizeof *l);
    l->ud = loop;
    l->io_new = aio_io_new;
    l->io_set = aio_io_set;
    l->io_free = aio_io_free;
    l->timer_new = aio_timer_new;
    l->timer_arm = aio_timer_arm;
    l->timer_cancel = aio_timer_cancel;
    l->timer_free = aio_timer_free;
}

/* ------------------------------------------------ asynchronous decisions */

/* Sets the exception raised (None when there is none) on the future. */
static PyObject *future_fail(PyObject *fut)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *r = PyObject_CallMethod(fut, "set_exception", "(O)",
                                      value ? value : Py_None);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return r;
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
            r = future_fail(fut);
        }
        /* never leave the awaiting task hanging: it gets the error */
        if (!r)
            r = future_fail(fut);
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
PyObject *Limiter_check_start(LimiterObject *self, PyObject *args)
{
    PyObject *key_obj, *permits_obj, *wait_obj, *fut, *now_obj = Py_None;
    if (!PyArg_ParseTuple(args, "OOOO|O:_check_start", &key_obj, &permits_obj,
                          &wait_obj, &fut, &now_obj))
        return NULL;
    if (guard_usable(&self->guard, "Limiter", LIMITER_CLOSED) < 0)
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
    if (guard_enter(&self->guard) < 0) {
        key_release(&k);
        Py_DECREF(pair);
        return guard_raise_closed(LIMITER_CLOSED);
    }
    self->in_flight++;
    int rc = now_obj != Py_None
                 ? rate_limiter_check_start_at(self->guard.handle, k.ptr, k.len,
                                               permits, wait_ns, now_ns, &d,
                                               check_done, pair)
                 : rate_limiter_check_start(self->guard.handle, k.ptr, k.len,
                                            permits, wait_ns, &d, check_done,
                                            pair);
    guard_leave(&self->guard);
    key_release(&k);
    if (rc == RATE_PENDING)
        Py_RETURN_NONE;
    self->in_flight--;
    Py_DECREF(pair);
    if (rc != RATE_OK)
        return raise_rc(rc, NULL);
    return decision_new(&d);
}
