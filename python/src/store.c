/* SPDX-License-Identifier: MIT */
/*
 * store.c -- ratelimit.Store, one type for every back end (its kind says
 * which): closing (refused while a limiter is open on it), figures,
 * drop(), check_policy(); the constructors of the stores in this process
 * and host, memory_store() and shm_store(); and what the objects made on
 * a store use of it.  The remote stores have their own rooms
 * (store_redis.c, store_dynamodb.c).
 */
#include "binding.h"

#include <limits.h>
#include <string.h>

#include "ratelimit_redis.h"
#include "ratelimit_shm.h"
#ifdef RATE_WITH_DYNAMODB
#include "ratelimit_dynamodb.h"
#endif

StoreObject *store_alloc(const char *kind)
{
    StoreObject *s = PyObject_New(StoreObject, &StoreType);
    if (s) {
        s->store = NULL;
        s->kind = kind;
        s->users = 0;
        s->busy = 0;
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
    if (self->busy > 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "the store is in use by another thread (stats() or "
                        "drop()): close it when that call is back");
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
    rate_store_t *store = self->store;
    int rc;
    self->busy++; /* close() waits for it (with the GIL, as this count) */
    Py_BEGIN_ALLOW_THREADS
    rc = rate_store_stats(store, &st);
    Py_END_ALLOW_THREADS
    self->busy--;
    if (rc != RATE_OK)
        return raise_rc(rc, NULL);
    return Py_BuildValue("{s:K,s:K,s:K,s:K}", "keys",
                         (unsigned long long)st.keys, "evictions",
                         (unsigned long long)st.evictions, "reclaimed",
                         (unsigned long long)st.reclaimed, "bytes",
                         (unsigned long long)st.bytes);
}

/* Deletes every key of a shared-memory, Redis or DynamoDB store's
 * namespace. */
static PyObject *Store_drop(StoreObject *self, PyObject *unused)
{
    (void)unused;
    if (store_open(self) < 0)
        return NULL;
    int (*drop)(rate_store_t *) = NULL;
    if (strcmp(self->kind, "shm") == 0)
        drop = rate_store_shm_drop;
    else if (strncmp(self->kind, "redis", 5) == 0)
        drop = rate_store_redis_drop;
#ifdef RATE_WITH_DYNAMODB
    else if (strcmp(self->kind, "dynamodb") == 0)
        drop = rate_store_dynamodb_drop;
#endif
    if (drop == NULL) {
        PyErr_SetString(PyExc_TypeError,
                        "drop() is for shm, Redis and DynamoDB stores");
        return NULL;
    }
    rate_store_t *store = self->store;
    int rc;
    self->busy++; /* close() waits for it (with the GIL, as this count) */
    Py_BEGIN_ALLOW_THREADS
    rc = drop(store);
    Py_END_ALLOW_THREADS
    self->busy--;
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
static PyObject *Store_check_policy(StoreObject *self, PyObject *policy_obj)
{
    const rate_policy_t *policy;
    if (store_open(self) < 0 || policy_arg(policy_obj, &policy) < 0)
        return NULL;
    char err[ERRLEN] = "";
    int rc = rate_store_check_policy(self->store, policy, err, sizeof err);
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
     "Deletes every key of the store's namespace (shm, Redis, DynamoDB)."},
    {"__enter__", enter_self, METH_NOARGS, NULL},
    {"__exit__", exit_close, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Store_getset[] = {
    {"kind", (getter)Store_get_kind, NULL, "memory, shm or redis", NULL},
    {"closed", (getter)Store_get_closed, NULL, "closed already", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject StoreType = {
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

/* A store argument: None or an open Store.  Returns -1 with the error
 * raised. */
int store_arg(PyObject *store)
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
int store_attach(PyObject *store, PyObject **slot)
{
    if (store == Py_None)
        return 1;
    Py_INCREF(store);
    *slot = store;
    ((StoreObject *)store)->users++;
    return strcmp(((StoreObject *)store)->kind, "memory") == 0;
}

void store_detach(PyObject *store)
{
    if (store)
        ((StoreObject *)store)->users--;
}

/* Raises the error of a call that set or used `policy` on `store` (None:
 * the limiter's private memory store): RATE_EPOLICY with the store's
 * reason (rate_store_check_policy: "the policy's states take up to N
 * bytes, ..."), which the limiter's calls do not pass on. */
PyObject *raise_policy_rc(int rc, PyObject *store, const rate_policy_t *policy)
{
    char err[ERRLEN] = "";
    if (rc == RATE_EPOLICY && store && store != Py_None && policy &&
        ((StoreObject *)store)->store)
        (void)rate_store_check_policy(((StoreObject *)store)->store, policy,
                                      err, sizeof err);
    return raise_rc(rc, err);
}

PyMethodDef store_functions[] = {
    {"memory_store", (PyCFunction)(void (*)(void))mod_memory_store,
     METH_VARARGS | METH_KEYWORDS,
     "memory_store(*, max_keys=0, shards=0) -> Store"},
    {"shm_store", (PyCFunction)(void (*)(void))mod_shm_store,
     METH_VARARGS | METH_KEYWORDS,
     "shm_store(path, *, max_keys=0, key_max=0, state_max=0, prefix=None, "
     "no_create=False, mode=0) -> Store"},
    {NULL, NULL, 0, NULL}};
