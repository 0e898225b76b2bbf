/*
 * pulsar_nack._speedups: the optional C hot path of NegativeAcksTracker.add.
 *
 * Nothing here is needed for correctness: pulsar_nack/_accel.py has a pure-Python
 * HotSlot, and NegativeAcksTracker.add is pure Python without FastAdd. Set
 * PULSAR_NACK_PURE_PYTHON=1 to use the pure-Python versions.
 *
 * HotSlot: the open bitmap the previous plain add went to (bucket deadline, topic,
 *   ledger, bitmap), kept by TimeBuckets. Adds through the slot are not counted one by
 *   one: TimeBuckets counts them as the bitmap's growth since set() (clear() returns it).
 *
 * FastAdd: NegativeAcksTracker.add for the common call, add(key) (or add(key, None,
 *   None)) with a plain key tuple, a fixed delay and the default clock (or any clock for tests). It computes
 *   the deadline and, holding the tracker's lock, adds the entry id to the slot's bitmap
 *   when the key belongs there. Anything else goes to the tracker's Python code:
 *   track(key, deadline) for other keys, general(*args) for other calls. It never arms
 *   the timer: the slot's bucket exists, so the timer is already armed for it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

#define U32_LIMIT (1LL << 32)
#define DEADLINE_LIMIT (1LL << 62) /* deadlines at or above it take the Python path */

/* ------------------------------------------------------------------ HotSlot */

typedef struct {
    PyObject_HEAD
    long long deadline; /* trimmed bucket deadline; -1 when empty */
    PyObject *topic;    /* str, or None when empty */
    long long ledger;
    PyObject *bitmap;   /* pyroaring.BitMap, or None when empty */
    PyObject *add;      /* bitmap.add, or NULL when empty */
    Py_ssize_t base;    /* len(bitmap) at set() */
} HotSlot;

static void
slot_empty(HotSlot *self)
{
    self->deadline = -1;
    self->ledger = -1;
    Py_XSETREF(self->topic, Py_NewRef(Py_None));
    Py_XSETREF(self->bitmap, Py_NewRef(Py_None));
    Py_CLEAR(self->add);
    self->base = 0;
}

static PyObject *
HotSlot_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "HotSlot() takes no arguments");
        return NULL;
    }
    HotSlot *self = (HotSlot *)type->tp_alloc(type, 0);
    if (self != NULL)
        slot_empty(self);
    return (PyObject *)self;
}

static void
HotSlot_dealloc(HotSlot *self)
{
    Py_XDECREF(self->topic);
    Py_XDECREF(self->bitmap);
    Py_XDECREF(self->add);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Store the bitmap's growth since set() in *grown; -1 on error. */
static int
slot_growth(HotSlot *self, Py_ssize_t *grown)
{
    *grown = 0;
    if (self->add == NULL)
        return 0;
    Py_ssize_t size = PyObject_Length(self->bitmap);
    if (size < 0)
        return -1;
    *grown = size - self->base;
    return 0;
}

static PyObject *
HotSlot_set(HotSlot *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long deadline, ledger;
    int overflow;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "set(deadline, topic, ledger, bitmap) takes 4 arguments");
        return NULL;
    }
    if (!PyLong_Check(args[0]) || !PyLong_Check(args[2]) || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "set() takes an int deadline, a str topic and an int ledger");
        return NULL;
    }
    deadline = PyLong_AsLongLongAndOverflow(args[0], &overflow);
    if (!overflow)
        ledger = PyLong_AsLongLongAndOverflow(args[2], &overflow);
    if (overflow || !PyUnicode_CheckExact(args[1])) {
        /* Beyond 64 bits (fake clocks only) or a str subclass: no slot; the Python path
         * handles such keys. The caller has stored the key already: never fail here. */
        slot_empty(self);
        Py_RETURN_NONE;
    }
    Py_ssize_t base = PyObject_Length(args[3]);
    if (base < 0)
        return NULL;
    PyObject *add = PyObject_GetAttrString(args[3], "add");
    if (add == NULL)
        return NULL;
    self->deadline = deadline;
    self->ledger = ledger;
    Py_XSETREF(self->topic, Py_NewRef(args[1]));
    Py_XSETREF(self->bitmap, Py_NewRef(args[3]));
    Py_XSETREF(self->add, add);
    self->base = base;
    Py_RETURN_NONE;
}

static PyObject *
HotSlot_clear(HotSlot *self, PyObject *unused)
{
    Py_ssize_t grown;
    if (slot_growth(self, &grown) < 0)
        return NULL;
    slot_empty(self);
    return PyLong_FromSsize_t(grown);
}

static PyObject *
HotSlot_growth(HotSlot *self, PyObject *unused)
{
    Py_ssize_t grown;
    return slot_growth(self, &grown) < 0 ? NULL : PyLong_FromSsize_t(grown);
}

static PyMethodDef HotSlot_methods[] = {
    {"set", (PyCFunction)(void (*)(void))HotSlot_set, METH_FASTCALL,
     "set(deadline, topic, ledger, bitmap): make *bitmap* the hot bitmap (the slot must be empty)."},
    {"clear", (PyCFunction)HotSlot_clear, METH_NOARGS,
     "Empty the slot; return the bitmap's growth since set()."},
    {"growth", (PyCFunction)HotSlot_growth, METH_NOARGS,
     "The bitmap's growth since set() (0 when empty). O(1)."},
    {NULL},
};

static PyMemberDef HotSlot_members[] = {
    {"deadline", T_LONGLONG, offsetof(HotSlot, deadline), READONLY, "bucket deadline, -1 when empty"},
    {"topic", T_OBJECT, offsetof(HotSlot, topic), READONLY, "topic, None when empty"},
    {"ledger", T_LONGLONG, offsetof(HotSlot, ledger), READONLY, "ledger id, -1 when empty"},
    {"bitmap", T_OBJECT, offsetof(HotSlot, bitmap), READONLY, "the hot bitmap, None when empty"},
    {"base", T_PYSSIZET, offsetof(HotSlot, base), READONLY, "len(bitmap) at set()"},
    {NULL},
};

static PyTypeObject HotSlotType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pulsar_nack._speedups.HotSlot",
    .tp_doc = PyDoc_STR("The open bitmap the previous plain add went to (C version)."),
    .tp_basicsize = sizeof(HotSlot),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = HotSlot_new,
    .tp_dealloc = (destructor)HotSlot_dealloc,
    .tp_methods = HotSlot_methods,
    .tp_members = HotSlot_members,
};

/* ------------------------------------------------------------------ FastAdd */

typedef struct {
    PyObject_HEAD
    HotSlot *slot;
    PyObject *acquire;  /* lock.acquire */
    PyObject *release;  /* lock.release */
    PyObject *clock;    /* callable returning ms, or NULL for CLOCK_MONOTONIC */
    PyObject *delay;    /* delay_ms as an int object */
    long long delay_ms;
    long long low_mask;
    int round_up;
    PyObject *general;  /* the tracker's Python add(key_or_message, delay_ms, redelivery_count) */
    PyObject *track;    /* the tracker's track(key, deadline_ms) */
} FastAdd;

static int
FastAdd_traverse(FastAdd *self, visitproc visit, void *arg)
{
    Py_VISIT(self->slot);
    Py_VISIT(self->acquire);
    Py_VISIT(self->release);
    Py_VISIT(self->clock);
    Py_VISIT(self->delay);
    Py_VISIT(self->general);
    Py_VISIT(self->track);
    return 0;
}

static int
FastAdd_clear(FastAdd *self)
{
    Py_CLEAR(self->slot);
    Py_CLEAR(self->acquire);
    Py_CLEAR(self->release);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->delay);
    Py_CLEAR(self->general);
    Py_CLEAR(self->track);
    return 0;
}

static void
FastAdd_dealloc(FastAdd *self)
{
    PyObject_GC_UnTrack(self);
    FastAdd_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
FastAdd_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"slot", "lock", "clock", "delay_ms", "low_mask", "round_up", "general", "track", NULL};
    PyObject *slot, *lock, *clock, *delay, *general, *track;
    long long low_mask;
    int round_up;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OOO!LpOO:FastAdd", names, &HotSlotType, &slot, &lock, &clock,
                                     &PyLong_Type, &delay, &low_mask, &round_up, &general, &track))
        return NULL;
    long long delay_ms = PyLong_AsLongLong(delay);
    if (delay_ms == -1 && PyErr_Occurred())
        return NULL;
    if (delay_ms < 0 || delay_ms >= DEADLINE_LIMIT / 2 || low_mask < 0 || low_mask >= DEADLINE_LIMIT / 2) {
        PyErr_SetString(PyExc_ValueError, "delay_ms and low_mask must be in [0, 2**61)");
        return NULL;
    }
    if ((clock != Py_None && !PyCallable_Check(clock)) || !PyCallable_Check(general) || !PyCallable_Check(track)) {
        PyErr_SetString(PyExc_TypeError, "clock (or None), general and track must be callable");
        return NULL;
    }
    PyObject *acquire = PyObject_GetAttrString(lock, "acquire");
    if (acquire == NULL)
        return NULL;
    PyObject *release = PyObject_GetAttrString(lock, "release");
    if (release == NULL) {
        Py_DECREF(acquire);
        return NULL;
    }
    FastAdd *self = (FastAdd *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(acquire);
        Py_DECREF(release);
        return NULL;
    }
    self->slot = (HotSlot *)Py_NewRef(slot);
    self->acquire = acquire;
    self->release = release;
    self->clock = clock == Py_None ? NULL : Py_NewRef(clock);
    self->delay = Py_NewRef(delay);
    self->delay_ms = delay_ms;
    self->low_mask = low_mask;
    self->round_up = round_up;
    self->general = Py_NewRef(general);
    self->track = Py_NewRef(track);
    return (PyObject *)self;
}

/* Whether *key* goes into the slot's bitmap at *bucket*: a plain key (exact ints and
 * str; bool, IntEnum and the like go through validate_key) of the slot's topic and
 * ledger, with a 32-bit entry id. Runs no Python code. */
static int
belongs_to_slot(HotSlot *slot, PyObject *key, long long bucket)
{
    PyObject *topic = PyTuple_GET_ITEM(key, 0), *ledger = PyTuple_GET_ITEM(key, 1);
    PyObject *entry = PyTuple_GET_ITEM(key, 2), *batch_index = PyTuple_GET_ITEM(key, 3);
    int overflow;
    if (slot->add == NULL || bucket != slot->deadline || !PyLong_CheckExact(ledger) || !PyLong_CheckExact(entry)
        || !PyLong_CheckExact(batch_index) || !PyUnicode_CheckExact(topic))
        return 0;
    if (PyLong_AsLongLongAndOverflow(batch_index, &overflow) != -1 || overflow)
        return 0;
    if (PyLong_AsLongLongAndOverflow(ledger, &overflow) != slot->ledger || overflow)
        return 0;
    long long entry_id = PyLong_AsLongLongAndOverflow(entry, &overflow);
    if (overflow || entry_id < 0 || entry_id >= U32_LIMIT)
        return 0;
    return topic == slot->topic || PyUnicode_Compare(topic, slot->topic) == 0;
}

/* Add the key to the slot's bitmap if it belongs there, holding the lock.
 * 1: added; 0: not the slot's, or the lock is taken (nothing changed); -1: error. */
static int
add_to_slot(FastAdd *self, PyObject *key, long long bucket)
{
    if (!belongs_to_slot(self->slot, key, bucket))
        return 0; /* a miss costs no lock round trip */
    PyObject *got = PyObject_CallOneArg(self->acquire, Py_False);
    if (got == NULL)
        return -1;
    int locked = got == Py_True;
    Py_DECREF(got);
    if (!locked)
        return 0; /* contended: the Python path waits for the lock */
    /* Checked again under the lock (cheap): only lock holders change the slot. */
    int belongs = belongs_to_slot(self->slot, key, bucket);
    PyObject *added = belongs ? PyObject_CallOneArg(self->slot->add, PyTuple_GET_ITEM(key, 2)) : Py_NewRef(Py_None);
    if (added == NULL) { /* release the lock, keeping the add's error */
#if PY_VERSION_HEX >= 0x030C0000
        PyObject *error = PyErr_GetRaisedException();
        Py_XDECREF(PyObject_CallNoArgs(self->release));
        PyErr_SetRaisedException(error);
#else
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        Py_XDECREF(PyObject_CallNoArgs(self->release));
        PyErr_Restore(type, value, traceback);
#endif
        return -1;
    }
    PyObject *released = PyObject_CallNoArgs(self->release);
    Py_DECREF(added);
    if (released == NULL)
        return -1;
    Py_DECREF(released);
    return belongs;
}

/* self.track(key, deadline): the Python path, once the deadline is known. */
static PyObject *
call_track(FastAdd *self, PyObject *key, PyObject *deadline)
{
    PyObject *args[2] = {key, deadline};
    return PyObject_Vectorcall(self->track, args, 2, NULL);
}

static PyObject *
FastAdd_add(FastAdd *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (self->general == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "FastAdd was cleared by the garbage collector");
        return NULL;
    }
    /* add(key), or add(key, None, None) as NackingConsumer calls it */
    if (nargs < 1 || nargs > 3 || kwnames != NULL || (nargs > 1 && args[1] != Py_None)
        || (nargs > 2 && args[2] != Py_None) || !PyTuple_CheckExact(args[0]) || PyTuple_GET_SIZE(args[0]) != 4)
        return PyObject_Vectorcall(self->general, args, (size_t)nargs, kwnames);
    PyObject *key = args[0];
    long long now;
    if (self->clock == NULL) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        now = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    } else {
        PyObject *now_obj = PyObject_CallNoArgs(self->clock);
        if (now_obj == NULL)
            return NULL;
        int overflow = 1;
        now = PyLong_CheckExact(now_obj) ? PyLong_AsLongLongAndOverflow(now_obj, &overflow) : 0;
        if (overflow || now < 0 || now >= DEADLINE_LIMIT / 2) {
            /* An unusual clock value: the Python path decides what it means. */
            PyObject *deadline = PyNumber_Add(now_obj, self->delay);
            Py_DECREF(now_obj);
            if (deadline == NULL)
                return NULL;
            PyObject *result = call_track(self, key, deadline);
            Py_DECREF(deadline);
            return result;
        }
        Py_DECREF(now_obj);
    }
    long long deadline = now + self->delay_ms;
    long long bucket = (self->round_up ? deadline + self->low_mask : deadline) & ~self->low_mask;
    int added = add_to_slot(self, key, bucket);
    if (added < 0)
        return NULL;
    PyObject *deadline_obj = PyLong_FromLongLong(deadline);
    if (added || deadline_obj == NULL)
        return deadline_obj;
    PyObject *result = call_track(self, key, deadline_obj);
    Py_DECREF(deadline_obj);
    return result;
}

static PyMethodDef FastAdd_methods[] = {
    {"add", (PyCFunction)(void (*)(void))FastAdd_add, METH_FASTCALL | METH_KEYWORDS,
     "add(key_or_message, delay_ms=None, redelivery_count=None): NegativeAcksTracker.add."},
    {NULL},
};

static PyTypeObject FastAddType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pulsar_nack._speedups.FastAdd",
    .tp_doc = PyDoc_STR("FastAdd(slot, lock, clock, delay_ms, low_mask, round_up, general, track): "
                        "the C hot path of NegativeAcksTracker.add."),
    .tp_basicsize = sizeof(FastAdd),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = FastAdd_new,
    .tp_dealloc = (destructor)FastAdd_dealloc,
    .tp_traverse = (traverseproc)FastAdd_traverse,
    .tp_clear = (inquiry)FastAdd_clear,
    .tp_methods = FastAdd_methods,
};

/* ------------------------------------------------------------------ module */

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "pulsar_nack._speedups",
    .m_doc = "The optional C hot path of NegativeAcksTracker.add (see pulsar_nack._accel).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (PyType_Ready(&HotSlotType) < 0 || PyType_Ready(&FastAddType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&speedups_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "HotSlot", (PyObject *)&HotSlotType) < 0
        || PyModule_AddObjectRef(module, "FastAdd", (PyObject *)&FastAddType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
