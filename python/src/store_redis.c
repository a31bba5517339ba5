/* SPDX-License-Identifier: MIT */
/*
 * store_redis.c -- the Redis stores (docs/redis.md): redis_store(url, ...),
 * blocking, and redis_async_store(url, loop, ...), the library's
 * asynchronous store on an asyncio loop through the adapter (async.c).
 */
#include "binding.h"

#include <limits.h>
#include <string.h>

#include "ratelimit_redis.h"

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
    aio_loop_init(&loop, loop_obj);
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

PyMethodDef store_redis_functions[] = {
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
    {NULL, NULL, 0, NULL}};
