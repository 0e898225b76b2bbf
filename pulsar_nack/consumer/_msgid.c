/*
 * pulsar_nack.consumer._msgid: read a received message's id in two calls into the client.
 *
 * The Python client exposes a message id only through one pybind call per field
 * (ledger_id(), entry_id(), batch_index(), partition()), each a few hundred ns. Its
 * serialize() returns all of them at once as a MessageIdData protobuf (PulsarApi.proto):
 *
 *     1 ledgerId (uint64)  2 entryId (uint64)  3 partition (int32, default -1)
 *     4 batch_index (int32, default -1)  5 ack_set (repeated int64)  6 batch_size (int32)
 *     7 first_chunk_message_id (MessageIdData)
 *
 * parse_id(bytes) decodes fields 1, 2, 3, 4 and 6 and skips the rest; message_key(message)
 * is the consumer's nack fast path: (topic_name(), ledger, entry, batch_index) of a
 * _pulsar.Message. The pure-Python stand-in in pulsar_nack/_msgid_py.py returns the same.
 * Both run in O(length of the serialized id).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static PyObject *str_message_id;
static PyObject *str_serialize;
static PyObject *str_topic_name;

/* One varint at *pos (< end); 0 on success, -1 on a truncated or too long varint. */
static int
read_varint(const unsigned char **pos, const unsigned char *end, uint64_t *out)
{
    uint64_t value = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (*pos >= end)
            return -1;
        unsigned char byte = *(*pos)++;
        value |= (uint64_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) {
            *out = value;
            return 0;
        }
    }
    return -1;
}

/* Decode fields 1-4 and 6; -1 with ValueError set for malformed input. */
static int
parse(const unsigned char *pos, Py_ssize_t length, int64_t fields[5])
{
    const unsigned char *end = pos + length;
    int seen = 0;
    fields[0] = fields[1] = 0;
    fields[2] = fields[3] = -1;
    fields[4] = 0;
    while (pos < end) {
        uint64_t tag, value;
        if (read_varint(&pos, end, &tag) < 0)
            goto bad;
        uint64_t number = tag >> 3;
        switch (tag & 7) {
        case 0: /* varint */
            if (read_varint(&pos, end, &value) < 0)
                goto bad;
            if (number == 1 || number == 2) {
                fields[number - 1] = (int64_t)value;
                seen |= (int)number;
            }
            else if (number == 3 || number == 4)
                fields[number - 1] = (int32_t)(uint32_t)value;
            else if (number == 6)
                fields[4] = (int32_t)(uint32_t)value;
            break;
        case 1: /* 64-bit */
            if (end - pos < 8)
                goto bad;
            pos += 8;
            break;
        case 2: /* length-delimited */
            if (read_varint(&pos, end, &value) < 0 || value > (uint64_t)(end - pos))
                goto bad;
            pos += value;
            break;
        case 5: /* 32-bit */
            if (end - pos < 4)
                goto bad;
            pos += 4;
            break;
        default:
            goto bad;
        }
    }
    if (seen == 3)
        return 0;
bad:
    PyErr_SetString(PyExc_ValueError, "not a serialized Pulsar message id");
    return -1;
}

PyDoc_STRVAR(parse_id_doc,
"parse_id(data: bytes) -> tuple[int, int, int, int, int]\n\n"
"(ledger, entry, partition, batch_index, batch_size) of MessageId.serialize() bytes.\n"
"ValueError for bytes that are not one.");

static PyObject *
parse_id(PyObject *module, PyObject *data)
{
    int64_t f[5];
    if (!PyBytes_Check(data)) {
        PyErr_Format(PyExc_TypeError, "data must be bytes, not %.100s", Py_TYPE(data)->tp_name);
        return NULL;
    }
    if (parse((const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), f) < 0)
        return NULL;
    return Py_BuildValue("(LLLLL)", (long long)f[0], (long long)f[1], (long long)f[2],
                         (long long)f[3], (long long)f[4]);
}

PyDoc_STRVAR(message_key_doc,
"message_key(message: _pulsar.Message) -> tuple[str, int, int, int]\n\n"
"(topic, ledger, entry, batch_index) of a received message, in three calls into\n"
"the client (message_id, serialize, topic_name).");

static PyObject *
message_key(PyObject *module, PyObject *message)
{
    int64_t f[5];
    PyObject *id = PyObject_CallMethodNoArgs(message, str_message_id);
    if (id == NULL)
        return NULL;
    PyObject *data = PyObject_CallMethodNoArgs(id, str_serialize);
    Py_DECREF(id);
    if (data == NULL)
        return NULL;
    if (!PyBytes_Check(data)) {
        Py_DECREF(data);
        PyErr_SetString(PyExc_TypeError, "MessageId.serialize() did not return bytes");
        return NULL;
    }
    int failed = parse((const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), f);
    Py_DECREF(data);
    if (failed)
        return NULL;
    PyObject *topic = PyObject_CallMethodNoArgs(message, str_topic_name);
    if (topic == NULL)
        return NULL;
    return Py_BuildValue("(NLLL)", topic, (long long)f[0], (long long)f[1], (long long)f[3]);
}

static PyMethodDef methods[] = {
    {"parse_id", parse_id, METH_O, parse_id_doc},
    {"message_key", message_key, METH_O, message_key_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "pulsar_nack.consumer._msgid",
    "A received message's id in one serialize() call, parsed in C.", -1, methods,
};

PyMODINIT_FUNC
PyInit__msgid(void)
{
    str_message_id = PyUnicode_InternFromString("message_id");
    str_serialize = PyUnicode_InternFromString("serialize");
    str_topic_name = PyUnicode_InternFromString("topic_name");
    if (!str_message_id || !str_serialize || !str_topic_name)
        return NULL;
    return PyModule_Create(&module_def);
}
