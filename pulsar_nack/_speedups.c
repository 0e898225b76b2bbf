/*
 * pulsar_nack._speedups: the optional C hot path of NegativeAcksTracker.add.
 *
 * Nothing here is needed for correctness: pulsar_nack/_accel.py has a pure-Python
 * HotSlot, and NegativeAcksTracker.add is pure Python without FastAdd. Set
 * PULSAR_NACK_PURE_PYTHON=1 to use the pure-Python versions.
 *
 * HotSlot: up to 16 open bitmaps that recent adds went to, each by (bucket deadline,
 *   topic, ledger, kind), kept by TimeBuckets: plain ids below 2**32, and batched ids
 *   whose packed value (entry << 10 | index) is below 2**32. So interleaved topics,
 *   batches and the few buckets a backoff writes to at once all stay hot. Adds through
 *   a slot are not counted one by one: TimeBuckets counts them as the bitmap's growth
 *   since set() (and, for batches, the new entries the slot saw) when a slot goes.
 *
 * FastAdd: NegativeAcksTracker.add for the common calls, add(key), add(key, None, None)
 *   and, with a MultiplierRedeliveryBackoff, add(key, None, redelivery_count) (its
 *   delays precomputed by count), with the default clock (or any clock for tests). It
 *   computes the deadline and, holding the tracker's lock, adds the key to its slot's
 *   bitmap when a slot takes it. Anything else goes to the tracker's Python code:
 *   track(key, deadline) for other keys, general(*args) for other calls. It never arms
 *   the timer: the slot's bucket exists, so the timer is already armed for it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <time.h>

#define U32_LIMIT (1LL << 32)
#define DEADLINE_LIMIT (1LL << 62) /* deadlines at or above it take the Python path */

/* ------------------------------------------------------------------ HotSlot */

#define MAX_SLOTS 16
#define KIND_PLAIN 0
#define KIND_BATCHED 1
#define BATCH_BITS 10

typedef struct {
    long long deadline; /* trimmed bucket deadline */
    PyObject *topic;    /* exact str */
    long long ledger;
    int kind;           /* KIND_PLAIN or KIND_BATCHED */
    PyObject *bitmap;   /* pyroaring.BitMap */
    PyObject *add;      /* bitmap.add */
    PyObject *range_cardinality; /* bitmap.range_cardinality (batched only) */
    Py_ssize_t base;    /* len(bitmap) at set() */
    Py_ssize_t entries; /* new entries added through the slot (batched only) */
    long long last_entry; /* the entry of the previous batched add, -1 when none */
} Slot;

typedef struct {
    PyObject_HEAD
    int count;          /* slots in use: slots[0] is the oldest */
    int last;           /* the slot of the previous hit */
    Slot slots[MAX_SLOTS];
} HotSlot;

static void
slot_release(Slot *slot)
{
    Py_CLEAR(slot->topic);
    Py_CLEAR(slot->bitmap);
    Py_CLEAR(slot->add);
    Py_CLEAR(slot->range_cardinality);
}

static PyObject *
HotSlot_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "HotSlot() takes no arguments");
        return NULL;
    }
    return type->tp_alloc(type, 0); /* zeroed: no slots */
}

static void
HotSlot_dealloc(HotSlot *self)
{
    for (int i = 0; i < self->count; i++)
        slot_release(&self->slots[i]);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Add slot i's growth since set() to *messages and *entries; -1 on error. */
static int
slot_growth(Slot *slot, Py_ssize_t *messages, Py_ssize_t *entries)
{
    Py_ssize_t size = PyObject_Length(slot->bitmap);
    if (size < 0)
        return -1;
    *messages += size - slot->base;
    *entries += slot->kind == KIND_PLAIN ? size - slot->base : slot->entries;
    return 0;
}

/* Remove slot i (keeping the order of the others); add its growth to the counts. */
static int
slot_remove(HotSlot *self, int i, Py_ssize_t *messages, Py_ssize_t *entries)
{
    int failed = slot_growth(&self->slots[i], messages, entries);
    slot_release(&self->slots[i]);
    memmove(&self->slots[i], &self->slots[i + 1], sizeof(Slot) * (size_t)(self->count - i - 1));
    self->count--;
    self->last = 0;
    return failed;
}

static PyObject *
growth_pair(int failed, Py_ssize_t messages, Py_ssize_t entries)
{
    return failed ? NULL : Py_BuildValue("(nn)", messages, entries);
}

static PyObject *
HotSlot_set(HotSlot *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long deadline, ledger, kind;
    int overflow = 0;
    Py_ssize_t messages = 0, entries = 0;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "set(deadline, topic, ledger, kind, bitmap) takes 5 arguments");
        return NULL;
    }
    if (!PyLong_Check(args[0]) || !PyLong_Check(args[2]) || !PyLong_Check(args[3]) || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "set() takes an int deadline, a str topic, an int ledger and an int kind");
        return NULL;
    }
    kind = PyLong_AsLongLong(args[3]);
    if (kind != KIND_PLAIN && kind != KIND_BATCHED) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "kind must be 0 (plain) or 1 (batched)");
        return NULL;
    }
    deadline = PyLong_AsLongLongAndOverflow(args[0], &overflow);
    if (!overflow)
        ledger = PyLong_AsLongLongAndOverflow(args[2], &overflow);
    if (overflow || !PyUnicode_CheckExact(args[1]))
        /* Beyond 64 bits (fake clocks only) or a str subclass: no slot; the Python path
         * handles such keys. The caller has stored the key already: never fail here. */
        return growth_pair(0, 0, 0);
    Py_ssize_t base = PyObject_Length(args[4]);
    if (base < 0)
        return NULL;
    PyObject *add = PyObject_GetAttrString(args[4], "add");
    if (add == NULL)
        return NULL;
    PyObject *range_cardinality = NULL;
    if (kind == KIND_BATCHED && (range_cardinality = PyObject_GetAttrString(args[4], "range_cardinality")) == NULL) {
        Py_DECREF(add);
        return NULL;
    }
    int failed = 0;
    if (self->count == MAX_SLOTS)
        failed = slot_remove(self, 0, &messages, &entries); /* the oldest makes room */
    Slot *slot = &self->slots[self->count++];
    slot->deadline = deadline;
    slot->topic = Py_NewRef(args[1]);
    slot->ledger = ledger;
    slot->kind = (int)kind;
    slot->bitmap = Py_NewRef(args[4]);
    slot->add = add;
    slot->range_cardinality = range_cardinality;
    slot->base = base;
    slot->entries = 0;
    slot->last_entry = -1;
    return growth_pair(failed, messages, entries);
}

/* Remove every slot for which match(slot, arg) holds; return their growth. */
static PyObject *
remove_where(HotSlot *self, int (*match)(Slot *, PyObject *, long long), PyObject *arg, long long value)
{
    Py_ssize_t messages = 0, entries = 0;
    int failed = 0;
    for (int i = self->count - 1; i >= 0; i--)
        if (match(&self->slots[i], arg, value))
            failed |= slot_remove(self, i, &messages, &entries);
    return growth_pair(failed, messages, entries);
}

static int
match_all(Slot *slot, PyObject *arg, long long value)
{
    return 1;
}

static int
match_deadline(Slot *slot, PyObject *arg, long long value)
{
    return slot->deadline == value;
}

static int
match_bitmap(Slot *slot, PyObject *arg, long long value)
{
    return slot->bitmap == arg;
}

static PyObject *
HotSlot_clear(HotSlot *self, PyObject *unused)
{
    return remove_where(self, match_all, NULL, 0);
}

static PyObject *
HotSlot_forget(HotSlot *self, PyObject *deadline)
{
    int overflow;
    long long value = PyLong_Check(deadline) ? PyLong_AsLongLongAndOverflow(deadline, &overflow) : -1;
    if (value == -1 && PyErr_Occurred())
        return NULL;
    if (!PyLong_Check(deadline) || overflow)
        return growth_pair(0, 0, 0); /* no slot has such a deadline */
    return remove_where(self, match_deadline, NULL, value);
}

static PyObject *
HotSlot_forget_bitmap(HotSlot *self, PyObject *bitmap)
{
    return remove_where(self, match_bitmap, bitmap, 0);
}

/* The messages (entries == 0) or the entries (entries == 1) added through every slot. */
static PyObject *
total_growth(HotSlot *self, int entries)
{
    Py_ssize_t counts[2] = {0, 0};
    int failed = 0;
    for (int i = 0; i < self->count; i++)
        failed |= slot_growth(&self->slots[i], &counts[0], &counts[1]);
    return failed ? NULL : PyLong_FromSsize_t(counts[entries]);
}

static PyObject *
HotSlot_growth(HotSlot *self, PyObject *unused)
{
    return total_growth(self, 0);
}

static PyObject *
HotSlot_entry_growth(HotSlot *self, PyObject *unused)
{
    return total_growth(self, 1);
}

static PyObject *
HotSlot_slots(HotSlot *self, PyObject *unused)
{
    PyObject *list = PyList_New(self->count);
    for (int i = 0; list != NULL && i < self->count; i++) {
        Slot *s = &self->slots[i];
        PyObject *item = Py_BuildValue("(LOLiOn)", s->deadline, s->topic, s->ledger, s->kind, s->bitmap, s->base);
        if (item == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, item);
    }
    return list;
}

/* The fields of a key the slots can take: exact str topic and exact ints, a plain id
 * below 2**32 or a batched one whose packed value is below 2**32. 1 if so, else 0;
 * runs no Python code and never fails. */
typedef struct {
    PyObject *topic, *entry_obj;
    long long ledger, entry, value;
    int kind;
} SlotKey;

static int
slot_key(PyObject *key, SlotKey *k)
{
    if (!PyTuple_CheckExact(key) || PyTuple_GET_SIZE(key) != 4)
        return 0;
    PyObject *topic = PyTuple_GET_ITEM(key, 0), *ledger = PyTuple_GET_ITEM(key, 1);
    PyObject *entry = PyTuple_GET_ITEM(key, 2), *batch_index = PyTuple_GET_ITEM(key, 3);
    int overflow;
    if (!PyUnicode_CheckExact(topic) || !PyLong_CheckExact(ledger) || !PyLong_CheckExact(entry)
        || !PyLong_CheckExact(batch_index))
        return 0;
    long long index = PyLong_AsLongLongAndOverflow(batch_index, &overflow);
    if (overflow || index < -1 || index >= (1 << BATCH_BITS))
        return 0;
    k->ledger = PyLong_AsLongLongAndOverflow(ledger, &overflow);
    if (overflow || k->ledger < 0)
        return 0;
    k->entry = PyLong_AsLongLongAndOverflow(entry, &overflow);
    if (overflow || k->entry < 0)
        return 0;
    if (index == -1) {
        k->kind = KIND_PLAIN;
        k->value = k->entry;
    } else {
        k->kind = KIND_BATCHED;
        if (k->entry >= (U32_LIMIT >> BATCH_BITS))
            return 0;
        k->value = k->entry << BATCH_BITS | index;
    }
    if (k->value >= U32_LIMIT)
        return 0;
    k->topic = topic;
    k->entry_obj = entry;
    return 1;
}

/* The slot for a key in bucket *deadline*, or -1. Runs no Python code. */
static int
find_slot(HotSlot *self, SlotKey *k, long long deadline)
{
    for (int n = 0; n < self->count; n++) {
        int i = (self->last + n) % self->count; /* the previous hit first */
        Slot *s = &self->slots[i];
        if (s->deadline != deadline || s->ledger != k->ledger || s->kind != k->kind)
            continue;
        if (s->topic == k->topic || (PyUnicode_GET_LENGTH(s->topic) == PyUnicode_GET_LENGTH(k->topic)
                                     && PyUnicode_Compare(s->topic, k->topic) == 0)) {
            self->last = i;
            return i;
        }
    }
    return -1;
}

/* Add the key to slot i's bitmap (the caller holds the tracker's lock). 0, or -1 on error. */
static int
slot_add(Slot *s, SlotKey *k)
{
    PyObject *result;
    if (s->kind == KIND_PLAIN) {
        result = PyObject_CallOneArg(s->add, k->entry_obj);
        Py_XDECREF(result);
        return result == NULL ? -1 : 0;
    }
    int new_entry = 0;
    if (k->entry != s->last_entry) {
        PyObject *args[2] = {PyLong_FromLongLong(k->entry << BATCH_BITS), PyLong_FromLongLong((k->entry + 1) << BATCH_BITS)};
        result = args[0] && args[1] ? PyObject_Vectorcall(s->range_cardinality, args, 2, NULL) : NULL;
        Py_XDECREF(args[0]);
        Py_XDECREF(args[1]);
        if (result == NULL)
            return -1;
        new_entry = result == Py_False || (PyLong_Check(result) && PyLong_AsLongLong(result) == 0);
        Py_DECREF(result);
    }
    PyObject *value = PyLong_FromLongLong(k->value);
    if (value == NULL)
        return -1;
    result = PyObject_CallOneArg(s->add, value);
    Py_DECREF(value);
    if (result == NULL)
        return -1;
    Py_DECREF(result);
    s->entries += new_entry;
    s->last_entry = k->entry;
    return 0;
}

static PyObject *
HotSlot_add(HotSlot *self, PyObject *const *args, Py_ssize_t nargs)
{
    SlotKey k;
    int overflow = 0;
    if (nargs != 2 || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "add(key, bucket_deadline) takes a key and an int");
        return NULL;
    }
    long long deadline = PyLong_AsLongLongAndOverflow(args[1], &overflow);
    if (overflow || !slot_key(args[0], &k))
        Py_RETURN_FALSE;
    int i = find_slot(self, &k, deadline);
    if (i < 0)
        Py_RETURN_FALSE;
    if (slot_add(&self->slots[i], &k) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

static PyMethodDef HotSlot_methods[] = {
    {"set", (PyCFunction)(void (*)(void))HotSlot_set, METH_FASTCALL,
     "set(deadline, topic, ledger, kind, bitmap): make *bitmap* hot (it must not be already); "
     "return the (messages, entries) growth of the slot evicted to make room, if any."},
    {"add", (PyCFunction)(void (*)(void))HotSlot_add, METH_FASTCALL,
     "add(key, bucket_deadline): add the key to its hot bitmap and return True, or False when no slot takes it."},
    {"forget", (PyCFunction)HotSlot_forget, METH_O, "Remove the slots of one bucket; return their (messages, entries) growth."},
    {"forget_bitmap", (PyCFunction)HotSlot_forget_bitmap, METH_O,
     "Remove the slot of one bitmap; return its (messages, entries) growth."},
    {"clear", (PyCFunction)HotSlot_clear, METH_NOARGS, "Remove every slot; return their (messages, entries) growth."},
    {"growth", (PyCFunction)HotSlot_growth, METH_NOARGS, "Messages added through the slots since set(). O(slots)."},
    {"entry_growth", (PyCFunction)HotSlot_entry_growth, METH_NOARGS, "New entries added through the slots. O(slots)."},
    {"slots", (PyCFunction)HotSlot_slots, METH_NOARGS,
     "[(deadline, topic, ledger, kind, bitmap, base)] of every slot, oldest first (for checks)."},
    {NULL},
};

static PyTypeObject HotSlotType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pulsar_nack._speedups.HotSlot",
    .tp_doc = PyDoc_STR("Up to 16 open bitmaps recent adds went to, by bucket, topic, ledger and kind (C version)."),
    .tp_basicsize = sizeof(HotSlot),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = HotSlot_new,
    .tp_dealloc = (destructor)HotSlot_dealloc,
    .tp_methods = HotSlot_methods,
};

/* ------------------------------------------------------------------ FastAdd */

#define MAX_DELAYS 64

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
    int n_delays;       /* backoff table length (0: fixed delay) */
    long long delays[MAX_DELAYS]; /* backoff delay by redelivery count; the last one for larger counts */
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

/* Read the backoff table (a tuple of ints in [0, 2**61), 1 to MAX_DELAYS long) into self. */
static int
read_delays(FastAdd *self, PyObject *delays)
{
    if (delays == Py_None)
        return 0;
    if (!PyTuple_Check(delays) || PyTuple_GET_SIZE(delays) < 1 || PyTuple_GET_SIZE(delays) > MAX_DELAYS) {
        PyErr_SetString(PyExc_TypeError, "delays must be None or a tuple of 1 to 64 ints");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(delays); i++) {
        long long value = PyLong_AsLongLong(PyTuple_GET_ITEM(delays, i));
        if (value == -1 && PyErr_Occurred())
            return -1;
        if (value < 0 || value >= DEADLINE_LIMIT / 2) {
            PyErr_SetString(PyExc_ValueError, "delays must be in [0, 2**61)");
            return -1;
        }
        self->delays[i] = value;
    }
    self->n_delays = (int)PyTuple_GET_SIZE(delays);
    return 0;
}

static PyObject *
FastAdd_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"slot", "lock", "clock", "delay_ms", "low_mask", "round_up", "general", "track", "delays", NULL};
    PyObject *slot, *lock, *clock, *delay, *general, *track, *delays = Py_None;
    long long low_mask;
    int round_up;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OOO!LpOO|O:FastAdd", names, &HotSlotType, &slot, &lock, &clock,
                                     &PyLong_Type, &delay, &low_mask, &round_up, &general, &track, &delays))
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
    FastAdd *self = (FastAdd *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    if (read_delays(self, delays) < 0 || (self->acquire = PyObject_GetAttrString(lock, "acquire")) == NULL
        || (self->release = PyObject_GetAttrString(lock, "release")) == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->slot = (HotSlot *)Py_NewRef(slot);
    self->clock = clock == Py_None ? NULL : Py_NewRef(clock);
    self->delay = Py_NewRef(delay);
    self->delay_ms = delay_ms;
    self->low_mask = low_mask;
    self->round_up = round_up;
    self->general = Py_NewRef(general);
    self->track = Py_NewRef(track);
    return (PyObject *)self;
}

/* Add the key to its hot slot, holding the lock.
 * 1: added; 0: no slot takes it, or the lock is taken (nothing changed); -1: error. */
static int
add_to_slot(FastAdd *self, PyObject *key, long long bucket)
{
    SlotKey k;
    if (!slot_key(key, &k) || find_slot(self->slot, &k, bucket) < 0)
        return 0; /* a miss costs no lock round trip */
    PyObject *got = PyObject_CallOneArg(self->acquire, Py_False);
    if (got == NULL)
        return -1;
    int locked = got == Py_True;
    Py_DECREF(got);
    if (!locked)
        return 0; /* contended: the Python path waits for the lock */
    /* Looked up again under the lock (cheap): only lock holders change the slots. */
    int i = find_slot(self->slot, &k, bucket);
    int failed = i >= 0 && slot_add(&self->slot->slots[i], &k) < 0;
    if (failed) { /* release the lock, keeping the add's error */
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
    if (released == NULL)
        return -1;
    Py_DECREF(released);
    return i >= 0;
}

/* self.track(key, deadline): the Python path, once the deadline is known. */
static PyObject *
call_track(FastAdd *self, PyObject *key, PyObject *deadline)
{
    PyObject *args[2] = {key, deadline};
    return PyObject_Vectorcall(self->track, args, 2, NULL);
}

/* The delay of a call: the fixed one, or the backoff table's by redelivery count
 * (None: count 0, as a key tuple has no redelivery_count()). -1: the Python path decides. */
static long long
call_delay(FastAdd *self, PyObject *redelivery_count)
{
    if (self->n_delays == 0)
        return redelivery_count == Py_None ? self->delay_ms : -1;
    if (redelivery_count == Py_None)
        return self->delays[0];
    int overflow;
    long long count = PyLong_CheckExact(redelivery_count) ? PyLong_AsLongLongAndOverflow(redelivery_count, &overflow) : -1;
    if (count < 0 || overflow)
        return -1;
    return self->delays[count < self->n_delays ? count : self->n_delays - 1];
}

static PyObject *
FastAdd_add(FastAdd *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (self->general == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "FastAdd was cleared by the garbage collector");
        return NULL;
    }
    /* add(key), add(key, None, None) as NackingConsumer calls it, or add(key, None, count) with a backoff */
    long long delay = -1;
    if (nargs >= 1 && nargs <= 3 && kwnames == NULL && (nargs < 2 || args[1] == Py_None)
        && PyTuple_CheckExact(args[0]) && PyTuple_GET_SIZE(args[0]) == 4)
        delay = call_delay(self, nargs > 2 ? args[2] : Py_None);
    if (delay < 0)
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
            PyObject *delay_obj = PyLong_FromLongLong(delay);
            PyObject *deadline = delay_obj == NULL ? NULL : PyNumber_Add(now_obj, delay_obj);
            Py_DECREF(now_obj);
            Py_XDECREF(delay_obj);
            if (deadline == NULL)
                return NULL;
            PyObject *result = call_track(self, key, deadline);
            Py_DECREF(deadline);
            return result;
        }
        Py_DECREF(now_obj);
    }
    long long deadline = now + delay;
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
    .tp_doc = PyDoc_STR("FastAdd(slot, lock, clock, delay_ms, low_mask, round_up, general, track, delays=None): "
                        "the C hot path of NegativeAcksTracker.add."),
    .tp_basicsize = sizeof(FastAdd),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = FastAdd_new,
    .tp_dealloc = (destructor)FastAdd_dealloc,
    .tp_traverse = (traverseproc)FastAdd_traverse,
    .tp_clear = (inquiry)FastAdd_clear,
    .tp_methods = FastAdd_methods,
};

/* ------------------------------------------------------------------ gap codec */

/* encode_gaps(values): the GAPS payload of ascending distinct values given as a buffer
 * of unsigned 32- or 64-bit ints (BitMap.to_array()): uvarint(first), then
 * uvarint(value - previous) for each further value. Same bytes as _pages' Python code. */
static PyObject *
encode_gaps(PyObject *module, PyObject *values)
{
    Py_buffer view;
    if (PyObject_GetBuffer(values, &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    Py_ssize_t n = view.itemsize ? view.len / view.itemsize : 0;
    if ((view.itemsize != 4 && view.itemsize != 8) || n < 1) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "encode_gaps takes 1 or more unsigned 32- or 64-bit values");
        return NULL;
    }
    unsigned char *out = PyMem_Malloc((size_t)n * 10);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    Py_ssize_t size = 0;
    unsigned long long previous = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long value = view.itemsize == 4 ? ((uint32_t *)view.buf)[i] : ((uint64_t *)view.buf)[i];
        unsigned long long gap = value - previous;
        if (i && value <= previous) {
            PyMem_Free(out);
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_ValueError, "encode_gaps takes ascending distinct values");
            return NULL;
        }
        previous = value;
        while (gap >= 0x80) {
            out[size++] = (unsigned char)(gap & 0x7F) | 0x80;
            gap >>= 7;
        }
        out[size++] = (unsigned char)gap;
    }
    PyBuffer_Release(&view);
    PyObject *result = PyBytes_FromStringAndSize((char *)out, size);
    PyMem_Free(out);
    return result;
}

/* decode_gaps(payload): the ascending values of a GAPS payload, as a list of ints. */
static PyObject *
decode_gaps(PyObject *module, PyObject *payload)
{
    if (!PyBytes_Check(payload)) {
        PyErr_SetString(PyExc_TypeError, "decode_gaps takes bytes");
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(payload);
    Py_ssize_t size = PyBytes_GET_SIZE(payload), pos = 0;
    PyObject *list = PyList_New(0);
    unsigned long long value = 0;
    while (list != NULL && pos < size) {
        unsigned long long gap = 0;
        int shift = 0;
        while (pos < size && data[pos] & 0x80 && shift < 63) {
            gap |= (unsigned long long)(data[pos++] & 0x7F) << shift;
            shift += 7;
        }
        if (pos == size || data[pos] >> (shift > 57 ? 64 - shift : 7)) {
            PyErr_SetString(PyExc_ValueError, "corrupt GAPS payload");
            Py_CLEAR(list);
            break;
        }
        gap |= (unsigned long long)data[pos++] << shift;
        value += gap;
        PyObject *item = PyLong_FromUnsignedLongLong(value);
        if (item == NULL || PyList_Append(list, item) < 0)
            Py_CLEAR(list);
        Py_XDECREF(item);
    }
    return list;
}

static PyMethodDef module_methods[] = {
    {"encode_gaps", encode_gaps, METH_O, "encode_gaps(values): GAPS payload of ascending unsigned ints (a buffer)."},
    {"decode_gaps", decode_gaps, METH_O, "decode_gaps(payload): the values of a GAPS payload, as a list."},
    {NULL},
};

/* ------------------------------------------------------------------ module */

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "pulsar_nack._speedups",
    .m_doc = "The optional C hot path of NegativeAcksTracker.add (see pulsar_nack._accel).",
    .m_size = -1,
    .m_methods = module_methods,
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
