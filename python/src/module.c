/* SPDX-License-Identifier: MIT */
/*
 * module.c -- ratelimit._ratelimit, the CPython binding of libratelimit
 * (docs/python.md; the rooms are listed in binding.h): its types, the
 * functions of each room, the error codes and constants, and the module's
 * own functions (the clock, durations, error texts, the bench's floor).
 */
#include "binding.h"

#include <limits.h>

/* The floor of the bench: a Python call into a C function that does
 * nothing. */
static PyObject *mod_noop(PyObject *m, PyObject *args)
{
    (void)m;
    (void)args;
    Py_RETURN_NONE;
}

static PyObject *mod_monotonic_ns(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    return PyLong_FromUnsignedLongLong(rate_clock_monotonic_ns());
}

static PyObject *mod_parse_duration(PyObject *m, PyObject *arg)
{
    (void)m;
    const char *text;
    if (cstring_arg(arg, "duration", &text) < 0)
        return NULL;
    char err[ERRLEN] = "";
    uint64_t ns;
    int rc = rate_parse_duration(text, &ns, err, sizeof err);
    if (rc != RATE_OK)
        return raise_rc(rc, err);
    return PyLong_FromUnsignedLongLong(ns);
}

static PyObject *mod_strerror(PyObject *m, PyObject *arg)
{
    (void)m;
    long code = PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    if (code < INT_MIN || code > INT_MAX)
        code = INT_MIN;
    return Py_BuildValue("(ss)", rate_err_name((int)code),
                         rate_strerror((int)code));
}

static PyMethodDef module_methods[] = {
    {"strerror", mod_strerror, METH_O,
     "strerror(code) -> (name, text): an error code's name and message"},
    {"noop", mod_noop, METH_VARARGS, "does nothing (the bench's floor)"},
    {"monotonic_ns", mod_monotonic_ns, METH_NOARGS,
     "the library's clock (CLOCK_MONOTONIC), ns"},
    {"parse_duration", mod_parse_duration, METH_O,
     "parse_duration(text) -> ns ('250ms', '1m')"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "ratelimit._ratelimit",
    "The C binding of libratelimit (use the ratelimit package).", -1,
    module_methods, NULL, NULL, NULL, NULL};

/* The types, under their names in the module (NULL: not in it). */
static const struct {
    const char *name;
    PyTypeObject *type;
} module_types[] = {
    {"Policy", &PolicyType},     {"Store", &StoreType},
    {"Limiter", &LimiterType},   {"InFlight", &InFlightType},
    {"Lease", &LeaseType},       {"Fair", &FairType},
    {"_Rules", &RulesType},      {"SyncedLimiter", &SyncedType},
    {NULL, &IoWatchType},        {NULL, &LoopTimerType},
    {"_LimitsCalls", &LimitsCallsType}, {"RulesHeld", &RulesHeldType},
};

/* The rooms' functions beside the module's own. */
static PyMethodDef *const room_functions[] = {
    store_functions,
    store_redis_functions,
    store_dynamodb_functions,
};

static int module_add_types(PyObject *m)
{
    size_t n = sizeof module_types / sizeof module_types[0];
    for (size_t i = 0; i < n; i++)
        if (PyType_Ready(module_types[i].type) < 0)
            return -1;
    for (size_t i = 0; i < n; i++)
        if (module_types[i].name &&
            PyModule_AddObjectRef(m, module_types[i].name,
                                  (PyObject *)module_types[i].type) < 0)
            return -1;
    return PyModule_AddObjectRef(m, "Decision", (PyObject *)DecisionType);
}

PyMODINIT_FUNC PyInit__ratelimit(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    Error = PyErr_NewExceptionWithDoc(
        "ratelimit.Error",
        "An error of the library: the message is the library's; .code is "
        "the RATE_E* code, .name its name.",
        NULL, NULL);
    if (!Error || PyModule_AddObjectRef(m, "Error", Error) < 0 ||
        decision_type_ready() < 0 || module_add_types(m) < 0)
        goto fail;
    for (size_t i = 0; i < sizeof room_functions / sizeof room_functions[0]; i++)
        if (PyModule_AddFunctions(m, room_functions[i]) < 0)
            goto fail;
#define ADD_CODE(name, code, text)                                   \
    if (PyModule_AddIntConstant(m, #name, code) < 0)              \
        goto fail;
    RATE_ERRNO_MAP(ADD_CODE)
#undef ADD_CODE
    if (PyModule_AddObject(m, "NEVER",
                           PyLong_FromUnsignedLongLong(RATE_NEVER)) < 0 ||
        PyModule_AddIntConstant(m, "KEY_MAX", RATE_KEY_MAX) < 0 ||
        PyModule_AddStringConstant(m, "__version__", "0.4.0") < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
