/* SPDX-License-Identifier: MIT */
/*
 * store_dynamodb.c -- the DynamoDB store (docs/dynamodb.md):
 * dynamodb_store(url, ...), its figures (counters()) and the service's
 * last message (last_error()).  Present when the library has the store
 * (setup.py defines RATE_WITH_DYNAMODB when it links libcurl); without
 * it the module has no dynamodb_store.
 */
#include "binding.h"

#ifdef RATE_WITH_DYNAMODB

#include <string.h>

#include "ratelimit_dynamodb.h"

/* An optional text option (None: NULL). */
static int text_opt(PyObject *obj, const char *what, const char **out)
{
    *out = NULL;
    return obj == Py_None ? 0 : cstring_arg(obj, what, out);
}

/* dynamodb_store(url, *, prefix=None, create_table=False, no_ttl=False,
 * safety_ttl=None, client_time=False, connect_timeout=None,
 * request_timeout=None, access_key_id=None, secret_access_key=None,
 * session_token=None) -> Store */
static PyObject *mod_dynamodb_store(PyObject *m, PyObject *args, PyObject *kw)
{
    (void)m;
    static char *kwlist[] = {"url", "prefix", "create_table", "no_ttl",
                             "safety_ttl", "client_time", "connect_timeout",
                             "request_timeout", "access_key_id",
                             "secret_access_key", "session_token", NULL};
    PyObject *url_obj, *prefix_obj = Py_None, *safety_obj = Py_None;
    PyObject *cto = Py_None, *rto = Py_None, *id_obj = Py_None;
    PyObject *secret_obj = Py_None, *token_obj = Py_None;
    int create = 0, no_ttl = 0, client_time = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$OppOpOOOOO:dynamodb_store",
                                     kwlist, &url_obj, &prefix_obj, &create,
                                     &no_ttl, &safety_obj, &client_time, &cto,
                                     &rto, &id_obj, &secret_obj, &token_obj))
        return NULL;
    rate_dynamodb_options_t o;
    memset(&o, 0, sizeof o);
    const char *url;
    if (cstring_arg(url_obj, "url", &url) < 0 ||
        text_opt(prefix_obj, "prefix", &o.prefix) < 0 ||
        text_opt(id_obj, "access_key_id", &o.access_key_id) < 0 ||
        text_opt(secret_obj, "secret_access_key", &o.secret_access_key) < 0 ||
        text_opt(token_obj, "session_token", &o.session_token) < 0 ||
        seconds_arg(safety_obj, "safety_ttl", 0, &o.safety_ttl_ns) < 0 ||
        seconds_arg(cto, "connect_timeout", 0, &o.connect_timeout_ns) < 0 ||
        seconds_arg(rto, "request_timeout", 0, &o.request_timeout_ns) < 0)
        return NULL;
    o.prefix_len = o.prefix ? strlen(o.prefix) : 0;
    o.create_table = create != 0;
    o.no_ttl = no_ttl != 0;
    o.client_time = client_time != 0;
    StoreObject *s = store_alloc("dynamodb");
    if (!s)
        return NULL;
    char err[ERRLEN] = "";
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = rate_store_dynamodb_new(url, &o, &s->store, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (rc != RATE_OK) {
        Py_DECREF(s);
        return raise_rc(rc, err);
    }
    return (PyObject *)s;
}

/* A DynamoDB store argument, open; TypeError for another kind. */
static int dynamodb_arg(PyObject *obj, rate_store_t **out)
{
    if (store_arg(obj) < 0)
        return -1;
    if (obj == Py_None || strcmp(((StoreObject *)obj)->kind, "dynamodb") != 0) {
        PyErr_SetString(PyExc_TypeError, "store must be a DynamoDB store");
        return -1;
    }
    *out = ((StoreObject *)obj)->store;
    return 0;
}

/* dynamodb_counters(store) -> dict: what the store has sent. */
static PyObject *mod_dynamodb_counters(PyObject *m, PyObject *store)
{
    (void)m;
    rate_store_t *st;
    if (dynamodb_arg(store, &st) < 0)
        return NULL;
    rate_dynamodb_counters_t c;
    int rc = rate_store_dynamodb_counters(st, &c);
    if (rc != RATE_OK)
        return raise_rc(rc, NULL);
    return Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "requests",
        (unsigned long long)c.requests, "reads", (unsigned long long)c.reads,
        "writes", (unsigned long long)c.writes, "deletes",
        (unsigned long long)c.deletes, "conflicts",
        (unsigned long long)c.conflicts, "throttled",
        (unsigned long long)c.throttled, "errors",
        (unsigned long long)c.errors);
}

/* dynamodb_last_error(store) -> str: the last failed request's line. */
static PyObject *mod_dynamodb_last_error(PyObject *m, PyObject *store)
{
    (void)m;
    rate_store_t *st;
    if (dynamodb_arg(store, &st) < 0)
        return NULL;
    char buf[ERRLEN];
    rate_store_dynamodb_last_error(st, buf, sizeof buf);
    return PyUnicode_DecodeUTF8(buf, (Py_ssize_t)strlen(buf), "replace");
}

PyMethodDef store_dynamodb_functions[] = {
    {"dynamodb_store", (PyCFunction)(void (*)(void))mod_dynamodb_store,
     METH_VARARGS | METH_KEYWORDS,
     "dynamodb_store(url, *, prefix=None, create_table=False, no_ttl=False, "
     "safety_ttl=None, client_time=False, connect_timeout=None, "
     "request_timeout=None, access_key_id=None, secret_access_key=None, "
     "session_token=None) -> Store"},
    {"dynamodb_counters", mod_dynamodb_counters, METH_O,
     "dynamodb_counters(store) -> dict: the requests the store has sent"},
    {"dynamodb_last_error", mod_dynamodb_last_error, METH_O,
     "dynamodb_last_error(store) -> str: the last failed request, '' none"},
    {NULL, NULL, 0, NULL}};

#else

PyMethodDef store_dynamodb_functions[] = {{NULL, NULL, 0, NULL}};

#endif
