/*
 * A received message's id read through libpulsar's public C++ API, without a Python call.
 *
 * Included once, by _msgid.c. The Python client keeps each received message as a
 * _pulsar.Message: a pybind11 instance holding a pointer to a pulsar::Message. Its id is
 * reachable from Python only through message_id() and serialize(), two binding calls that
 * allocate a MessageId object and a bytes object. libpulsar exports the accessors of its
 * public headers (Message::getMessageId() returning const MessageId&, MessageId::ledgerId()
 * and the other fields), so the fields can be read in a few nanoseconds instead.
 *
 * Nothing here is assumed; everything is looked up or checked once, in bind_native(), and the
 * reader stays off (every read goes through the bindings, as before) when anything is missing:
 *
 *   - the accessors and vtables are found by their mangled names in the _pulsar module's
 *     libraries (dlsym on its handle); a name that changed is a missing symbol;
 *   - where a _pulsar.Message keeps its pulsar::Message pointer is learnt from pybind11's own
 *     cross-module interface, _pybind11_conduit_v1_ (pulsar-client 3.9 and later): the
 *     conduit returns the pointer of a probe message, found at one offset of the instance;
 *     only instances of exactly that type are read at that offset;
 *   - a chunked message's id carries its first chunk in the serialized form only, so an id
 *     whose implementation is not a plain or batched MessageIdImpl (its vtable pointer,
 *     compared with the exported vtables' addresses) is read through the bindings;
 *   - the topic name, Message::getTopicName(), is a std::string of libstdc++'s C++11 ABI (the
 *     "cxx11" tag of its mangled name says so; a library built otherwise has no such symbol):
 *     its characters and length are its first two words.
 *
 * A read is O(1): one type check, five calls into libpulsar that return a field each; a topic
 * one more call, and the last topic's str again when the name is the same (it mostly is).
 */
#ifndef PULSAR_NACK_NATIVE_ID_H
#define PULSAR_NACK_NATIVE_ID_H

#include <dlfcn.h>

/* glibc 2.34 moved dlopen, dlsym and dlclose from libdl into libc under a new symbol version
 * (GLIBC_2.34), which a build on such a system binds by default: the wheel would then need glibc
 * 2.34 (manylinux_2_34). Bound to their first versions, which libc keeps from 2.34 on and libdl
 * has before (loaded in every CPython there: its import system calls dlopen), the wheel stays
 * manylinux_2_17, as auditwheel's tag shows. */
#if defined(__GLIBC__) && defined(__x86_64__)
__asm__(".symver dlopen,dlopen@GLIBC_2.2.5");
__asm__(".symver dlsym,dlsym@GLIBC_2.2.5");
__asm__(".symver dlclose,dlclose@GLIBC_2.2.5");
#elif defined(__GLIBC__) && defined(__aarch64__)
__asm__(".symver dlopen,dlopen@GLIBC_2.17");
__asm__(".symver dlsym,dlsym@GLIBC_2.17");
__asm__(".symver dlclose,dlclose@GLIBC_2.17");
#endif

typedef const void *(*native_ref_fn)(const void *);
typedef int64_t (*native_i64_fn)(const void *);
typedef int32_t (*native_i32_fn)(const void *);

static struct {
    PyTypeObject *type;  /* _pulsar.Message once bound, else NULL: every read through the bindings */
    Py_ssize_t offset;   /* where its instances keep their pulsar::Message pointer */
    native_ref_fn message_id;
    native_i64_fn ledger, entry;
    native_i32_fn partition, batch_index, batch_size;
    native_ref_fn topic_name;  /* const std::string& Message::getTopicName() const */
    PyObject *last_topic;      /* the str of the last topic read, and its UTF-8 bytes */
    PyObject *last_topic_utf8;
    const void *plain_vptr[2]; /* what the first word of a MessageIdImpl or BatchedMessageIdImpl holds */
    const void *type_info;     /* typeid(pulsar::Message), for the conduit */
} native;

/* The libpulsar symbols the reader uses: accessors first, then the vtables and type info. */
static const char *const native_symbols[] = {
    "_ZNK6pulsar7Message12getMessageIdEv",  /* const MessageId& Message::getMessageId() const */
    "_ZNK6pulsar9MessageId8ledgerIdEv",     /* int64_t MessageId::ledgerId() const */
    "_ZNK6pulsar9MessageId7entryIdEv",      /* int64_t MessageId::entryId() const */
    "_ZNK6pulsar9MessageId9partitionEv",    /* int32_t MessageId::partition() const */
    "_ZNK6pulsar9MessageId10batchIndexEv",  /* int32_t MessageId::batchIndex() const */
    "_ZNK6pulsar9MessageId9batchSizeEv",    /* int32_t MessageId::batchSize() const */
    "_ZTVN6pulsar13MessageIdImplE",         /* vtable for MessageIdImpl */
    "_ZTVN6pulsar20BatchedMessageIdImplE",  /* vtable for BatchedMessageIdImpl */
    "_ZTIN6pulsar7MessageE",                /* typeinfo for Message */
    "_ZNK6pulsar7Message12getTopicNameB5cxx11Ev", /* const std::string& Message::getTopicName() const */
};
#define NATIVE_SYMBOLS (sizeof(native_symbols) / sizeof(native_symbols[0]))

/* An object's vtable pointer is its class's vtable symbol plus two words (offset to top, type info). */
#define VTABLE_POINT(symbol) ((const void *)((const char *)(symbol) + 2 * sizeof(void *)))

/* Fill f (ledger, entry, partition, batch_index, batch_size) from a _pulsar.Message; 1 if read
 * here, 0 if the caller must read it through the bindings (not bound, another type, no message,
 * a chunked or unknown id). Never raises. */
static inline int
native_read(PyObject *message, int64_t f[5])
{
    if (Py_TYPE(message) != native.type)
        return 0;
    const void *cpp = *(const void *const *)((const char *)message + native.offset);
    if (cpp == NULL)
        return 0;
    const void *id = native.message_id(cpp);
    const void *impl = *(const void *const *)id; /* MessageId's one member: shared_ptr<MessageIdImpl>, pointer first */
    if (impl == NULL)
        return 0;
    const void *vptr = *(const void *const *)impl;
    if (vptr != native.plain_vptr[0] && vptr != native.plain_vptr[1])
        return 0; /* a chunked id: its first chunk is in the serialized form only */
    f[0] = native.ledger(id);
    f[1] = native.entry(id);
    f[2] = native.partition(id);
    f[3] = native.batch_index(id);
    f[4] = native.batch_size(id);
    return 1;
}

/* The topic of a _pulsar.Message (a new reference), or NULL with an exception set: through
 * libpulsar where the reader is on, else topic_name() (*method*, its interned name). */
static PyObject *
native_topic(PyObject *message, PyObject *method)
{
    const void *cpp = Py_TYPE(message) == native.type ? *(const void *const *)((const char *)message + native.offset) : NULL;
    if (cpp == NULL)
        return PyObject_CallMethodNoArgs(message, method);
    const char *const *text = (const char *const *)native.topic_name(cpp); /* { char *data; size_t size; ... } */
    Py_ssize_t size = (Py_ssize_t)((const size_t *)text)[1];
    PyObject *last = native.last_topic_utf8;
    if (last != NULL && PyBytes_GET_SIZE(last) == size && memcmp(PyBytes_AS_STRING(last), text[0], size) == 0)
        return Py_NewRef(native.last_topic);
    PyObject *topic = PyUnicode_DecodeUTF8(text[0], size, "strict");
    PyObject *utf8 = topic == NULL ? NULL : PyBytes_FromStringAndSize(text[0], size);
    if (utf8 == NULL) {
        Py_XDECREF(topic);
        return NULL;
    }
    Py_XSETREF(native.last_topic, Py_NewRef(topic));
    Py_XSETREF(native.last_topic_utf8, utf8);
    return topic;
}

PyDoc_STRVAR(native_type_info_doc,
"native_type_info(path: str) -> capsule | None\n\n"
"Look up libpulsar's id accessors through the already loaded module at *path* (the _pulsar\n"
"extension); the capsule of typeid(pulsar::Message) for _pybind11_conduit_v1_, or None if a\n"
"symbol is missing (the reader stays off).");

static PyObject *
native_type_info(PyObject *module, PyObject *path)
{
    void *found[NATIVE_SYMBOLS];
    if (!PyUnicode_Check(path)) {
        PyErr_Format(PyExc_TypeError, "path must be str, not %.100s", Py_TYPE(path)->tp_name);
        return NULL;
    }
    const char *name = PyUnicode_AsUTF8(path);
    if (name == NULL)
        return NULL;
    void *handle = dlopen(name, RTLD_NOW | RTLD_NOLOAD); /* only a module Python loaded already */
    if (handle == NULL)
        Py_RETURN_NONE;
    for (size_t i = 0; i < NATIVE_SYMBOLS; i++) {
        if ((found[i] = dlsym(handle, native_symbols[i])) == NULL) {
            dlclose(handle);
            Py_RETURN_NONE;
        }
    }
    /* the handle stays open: the symbols must outlive this call (dlclose would only drop a count) */
    native.message_id = (native_ref_fn)found[0];
    native.ledger = (native_i64_fn)found[1];
    native.entry = (native_i64_fn)found[2];
    native.partition = (native_i32_fn)found[3];
    native.batch_index = (native_i32_fn)found[4];
    native.batch_size = (native_i32_fn)found[5];
    native.plain_vptr[0] = VTABLE_POINT(found[6]);
    native.plain_vptr[1] = VTABLE_POINT(found[7]);
    native.type_info = found[8];
    native.topic_name = (native_ref_fn)found[9];
    return PyCapsule_New((void *)native.type_info, "St9type_info", NULL); /* typeid(std::type_info).name() */
}

PyDoc_STRVAR(bind_native_doc,
"bind_native(probe: _pulsar.Message, pointer: capsule) -> bool\n\n"
"Turn the reader on for messages of exactly type(probe): *pointer* is what the probe's\n"
"_pybind11_conduit_v1_ returned for native_type_info()'s capsule (its pulsar::Message). True\n"
"if the probe keeps that pointer at one offset and its id reads as a plain one; else False\n"
"and the reader stays off.");

static PyObject *
bind_native(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyCapsule_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "bind_native(probe, pointer) takes a message and a capsule");
        return NULL;
    }
    if (native.type_info == NULL)
        Py_RETURN_FALSE; /* native_type_info() found no accessors */
    const char *name = PyCapsule_GetName(args[1]);
    const void *cpp = name == NULL ? NULL : PyCapsule_GetPointer(args[1], name);
    if (cpp == NULL || strcmp(name, "N6pulsar7MessageE") != 0) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    PyObject *probe = args[0];
    Py_ssize_t size = Py_TYPE(probe)->tp_basicsize;
    Py_ssize_t offset = 0;
    for (Py_ssize_t at = sizeof(PyObject); at + (Py_ssize_t)sizeof(void *) <= size; at += sizeof(void *)) {
        if (*(const void *const *)((const char *)probe + at) == cpp) {
            offset = at;
            break;
        }
    }
    if (offset == 0)
        Py_RETURN_FALSE;
    const void *impl = *(const void *const *)native.message_id(cpp);
    if (impl == NULL || *(const void *const *)impl != native.plain_vptr[0])
        Py_RETURN_FALSE; /* a default message's id is a plain MessageIdImpl: anything else, a layout we do not know */
    Py_XSETREF(native.type, (PyTypeObject *)Py_NewRef(Py_TYPE(probe)));
    native.offset = offset;
    Py_RETURN_TRUE;
}

PyDoc_STRVAR(pybind11_abi_ids_doc,
"pybind11_abi_ids() -> list[str]\n\n"
"The keys of the pybind11 internals in this interpreter (its state dict and builtins): each\n"
"names the platform ABI id a module's _pybind11_conduit_v1_ expects.");

static PyObject *
pybind11_abi_ids(PyObject *module, PyObject *unused)
{
    PyObject *found = PyList_New(0);
    PyObject *dicts[2] = {PyInterpreterState_GetDict(PyInterpreterState_Get()), PyEval_GetBuiltins()};
    if (found == NULL)
        return NULL;
    for (int d = 0; d < 2; d++) {
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (dicts[d] != NULL && PyDict_Next(dicts[d], &pos, &key, &value)) {
            const char *text = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
            if (text == NULL) {
                PyErr_Clear(); /* a key that is not text (or not UTF-8): not pybind11's */
                continue;
            }
            if (strncmp(text, "__pybind11_internals_v", 22) == 0 && PyList_Append(found, key) < 0) {
                Py_DECREF(found);
                return NULL;
            }
        }
    }
    return found;
}

PyDoc_STRVAR(native_bound_doc, "native_bound() -> bool: whether received ids are read through libpulsar's C++ API.");

static PyObject *
native_bound(PyObject *module, PyObject *unused)
{
    return PyBool_FromLong(native.type != NULL);
}

PyDoc_STRVAR(unbind_native_doc, "unbind_native(): read every id through the bindings again (tests).");

static PyObject *
unbind_native(PyObject *module, PyObject *unused)
{
    Py_CLEAR(native.type);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(native_fields_doc,
"native_fields(message) -> tuple[int, int, int, int, int] | None\n\n"
"(ledger, entry, partition, batch_index, batch_size) of a _pulsar.Message read through\n"
"libpulsar, or None where the reader would read it through the bindings.");

static PyObject *
native_fields(PyObject *module, PyObject *message)
{
    int64_t f[5];
    if (!native_read(message, f))
        Py_RETURN_NONE;
    return Py_BuildValue("(LLLLL)", (long long)f[0], (long long)f[1], (long long)f[2], (long long)f[3],
                         (long long)f[4]);
}

#define NATIVE_METHODS                                                                                 \
    {"native_type_info", native_type_info, METH_O, native_type_info_doc},                            \
    {"bind_native", (PyCFunction)(void (*)(void))bind_native, METH_FASTCALL, bind_native_doc},       \
    {"pybind11_abi_ids", pybind11_abi_ids, METH_NOARGS, pybind11_abi_ids_doc},                       \
    {"native_bound", native_bound, METH_NOARGS, native_bound_doc},                                   \
    {"unbind_native", unbind_native, METH_NOARGS, unbind_native_doc},                                \
    {"native_fields", native_fields, METH_O, native_fields_doc},

#endif
