/*
 * pulsar_nack.core._speedups: the optional C hot path of NegativeAcksTracker.add.
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
 * The tail log (part of HotSlot): adds of ONE stream (topic, ledger, kind, with its
 *   sid) that land strictly after every bucket of the structure, e.g. one nack per ms at
 *   precision 0, where every add opens a new bucket. TimeBuckets sets the stream and the
 *   floor (no bucket is later than it) after a slow add, with set_log(). A hot-slot miss
 *   is appended as a (bucket deadline, value) record when its stream is the log's, its
 *   deadline is above the floor and (deadline, value) is above the last record's (at
 *   most LOG_GROUP records per deadline, LOG_CAPACITY in all); anything else misses to
 *   Python as before. Records strictly increase, so there is no duplicate and growth()
 *   stays exact. While the log holds records the Python structure is untouched: every
 *   Python operation on it first calls take_log(), which encodes every deadline group
 *   but the last into sealed pages (the exact format of pulsar_nack/_pages.py, one GAPS
 *   stream per bucket) for TimeBuckets to put after its last bucket, and hands back the
 *   last group for it to open as a normal bucket (a dense bucket then gets a hot bitmap).
 *
 * FastAdd: NegativeAcksTracker.add for the common calls, add(key), add(key, None, None)
 *   and, with a MultiplierRedeliveryBackoff, add(key, None, redelivery_count) (its
 *   delays precomputed by count), with the default clock (or any clock for tests). It
 *   computes the deadline and, holding the tracker's lock, adds the key to its slot's
 *   bitmap when a slot takes it, or appends it to the tail log. Anything else goes to
 *   the tracker's Python code: track(key, deadline) for other keys, general(*args) for
 *   other calls. It never arms the timer: the slot's bucket exists, or the log's
 *   deadline is after the structure's last bucket (the log has a stream only while the
 *   structure holds one), so the timer is already armed for an earlier time.
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

#define LOG_CAPACITY 2048 /* records in the tail log; a full log misses to Python, which takes it */
#define LOG_GROUP 8       /* records per deadline: a denser bucket is handed to Python to get a hot bitmap */
#define GAPS_CODEC 2      /* pulsar_nack.core.pages.GAPS */

typedef struct {
    long long deadline; /* trimmed bucket deadline */
    long long value;    /* bitmap value (PLAIN: entry; BATCHED: entry << 10 | index) */
} LogRecord;

typedef struct {
    PyObject_HEAD
    int count;          /* slots in use: slots[0] is the oldest */
    int last;           /* the slot of the previous hit */
    Slot slots[MAX_SLOTS];
    /* The tail log: its stream (log_topic NULL: none), the floor, the records. */
    PyObject *log_topic;  /* exact str */
    long long log_ledger;
    int log_kind;
    long long log_sid;
    long long log_floor;  /* no bucket of the structure is later than this */
    LogRecord *log;       /* LOG_CAPACITY records, allocated by the first set_log() */
    Py_ssize_t log_len;
    Py_ssize_t log_entries; /* distinct (deadline, entry) among the records */
    int log_group;        /* records with the last record's deadline */
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
    Py_CLEAR(self->log_topic);
    PyMem_Free(self->log);
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

/* A stream kind given to set() or set_log(): KIND_PLAIN or KIND_BATCHED, or -1 with an error. */
static long long
read_kind(PyObject *kind_obj)
{
    long long kind = PyLong_AsLongLong(kind_obj);
    if (kind != KIND_PLAIN && kind != KIND_BATCHED) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "kind must be 0 (plain) or 1 (batched)");
        return -1;
    }
    return kind;
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
    if ((kind = read_kind(args[3])) < 0)
        return NULL;
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
    counts[0] += self->log_len; /* the log's records: distinct, none in the structure */
    counts[1] += self->log_entries;
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

/* ------------------------------------------------------------------ tail log */

/* Whether the tail log takes the key in bucket *deadline* (see the top of this file).
 * Runs no Python code. */
static int
log_takes(HotSlot *self, SlotKey *k, long long deadline)
{
    if (self->log_topic == NULL || deadline <= self->log_floor || self->log_len == LOG_CAPACITY
        || k->kind != self->log_kind || k->ledger != self->log_ledger)
        return 0;
    if (self->log_len) {
        LogRecord *last = &self->log[self->log_len - 1];
        if (deadline < last->deadline
            || (deadline == last->deadline && (k->value <= last->value || self->log_group >= LOG_GROUP)))
            return 0;
    }
    return k->topic == self->log_topic || (PyUnicode_GET_LENGTH(self->log_topic) == PyUnicode_GET_LENGTH(k->topic)
                                           && PyUnicode_Compare(self->log_topic, k->topic) == 0);
}

/* Append the key the log takes (log_takes() said so; the caller holds the tracker's lock). */
static void
log_append(HotSlot *self, SlotKey *k, long long deadline)
{
    LogRecord *last = self->log_len ? &self->log[self->log_len - 1] : NULL;
    if (last == NULL || last->deadline != deadline) {
        self->log_group = 1;
        self->log_entries++;
    } else {
        self->log_group++;
        self->log_entries += k->kind == KIND_PLAIN || (k->value >> BATCH_BITS) != (last->value >> BATCH_BITS);
    }
    LogRecord *record = &self->log[self->log_len++];
    record->deadline = deadline;
    record->value = k->value;
}

static PyObject *
HotSlot_set_log(HotSlot *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long ledger = 0, kind, sid = 0, floor = 0;
    int overflow = 0;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "set_log(topic, ledger, kind, sid, floor) takes 5 arguments");
        return NULL;
    }
    if (!PyUnicode_Check(args[0]) || !PyLong_Check(args[1]) || !PyLong_Check(args[2]) || !PyLong_Check(args[3])
        || !PyLong_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "set_log() takes a str topic and int ledger, kind, sid and floor");
        return NULL;
    }
    if (self->log_len) {
        PyErr_SetString(PyExc_RuntimeError, "set_log() while the log holds records: take_log() first");
        return NULL;
    }
    if ((kind = read_kind(args[2])) < 0)
        return NULL;
    ledger = PyLong_AsLongLongAndOverflow(args[1], &overflow);
    if (!overflow)
        sid = PyLong_AsLongLongAndOverflow(args[3], &overflow);
    if (!overflow)
        floor = PyLong_AsLongLongAndOverflow(args[4], &overflow);
    Py_CLEAR(self->log_topic);
    if (overflow || !PyUnicode_CheckExact(args[0]) || ledger < 0 || sid < 0 || floor < 0 || floor >= DEADLINE_LIMIT)
        Py_RETURN_NONE; /* beyond 64 bits (fake clocks only) or a str subclass: no log */
    if (self->log == NULL && (self->log = PyMem_Malloc(sizeof(LogRecord) * LOG_CAPACITY)) == NULL)
        Py_RETURN_NONE; /* no memory for it: no log (the key is stored already: never fail here) */
    self->log_topic = Py_NewRef(args[0]);
    self->log_ledger = ledger;
    self->log_kind = (int)kind;
    self->log_sid = sid;
    self->log_floor = floor;
    Py_RETURN_NONE;
}

static PyObject *
HotSlot_unset_log(HotSlot *self, PyObject *unused)
{
    if (self->log_len) {
        PyErr_SetString(PyExc_RuntimeError, "unset_log() while the log holds records: take_log() first");
        return NULL;
    }
    Py_CLEAR(self->log_topic);
    Py_RETURN_NONE;
}

/* Write uvarint(value) (LEB128, as _pages.uvarint) at out; return its length. */
static Py_ssize_t
put_uvarint(unsigned char *out, unsigned long long value)
{
    Py_ssize_t size = 0;
    while (value >= 0x80) {
        out[size++] = (unsigned char)(value & 0x7F) | 0x80;
        value >>= 7;
    }
    out[size++] = (unsigned char)value;
    return size;
}

#define UVARINT_MAX 10
#define LOG_RECORD_MAX (2 * UVARINT_MAX + 3 * UVARINT_MAX + LOG_GROUP * UVARINT_MAX)

/* Append the page page[:size] keyed by *key* to the list as (key, bytes); -1 on error. */
static int
emit_page(PyObject *pages, long long key, const unsigned char *page, Py_ssize_t size)
{
    PyObject *item = Py_BuildValue("(Ly#)", key, (const char *)page, size);
    int failed = item == NULL || PyList_Append(pages, item) < 0;
    Py_XDECREF(item);
    return failed ? -1 : 0;
}

/* take_log(page_bytes): None when the log is empty, else
 * (sid, pages, messages, entries, buckets, last_page_deadline, deadline, values):
 * every deadline group but the last encoded as sealed buckets into pages of up to
 * page_bytes ([(key, bytes)], the _pages format, one GAPS stream per bucket) with the
 * messages, distinct entries and buckets they hold and the deadline of their last bucket
 * (-1 when none), and the last group (its deadline and its values, ascending). The log is
 * then empty and its floor is that last deadline. On error the log is left as it was. */
static PyObject *
HotSlot_take_log(HotSlot *self, PyObject *arg)
{
    Py_ssize_t page_bytes = PyLong_AsSsize_t(arg);
    if (page_bytes == -1 && PyErr_Occurred())
        return NULL;
    if (page_bytes < 1 || page_bytes > (1 << 24)) {
        PyErr_SetString(PyExc_ValueError, "page_bytes must be in [1, 2**24]");
        return NULL;
    }
    if (self->log_len == 0)
        Py_RETURN_NONE;
    LogRecord *log = self->log;
    Py_ssize_t n = self->log_len, last_start = n - 1;
    long long last_deadline = log[n - 1].deadline, key = 0, page_last = -1;
    while (last_start > 0 && log[last_start - 1].deadline == last_deadline)
        last_start--;
    unsigned char *page = PyMem_Malloc((size_t)page_bytes + 2 * LOG_RECORD_MAX);
    PyObject *pages = PyList_New(0), *values = PyList_New(n - last_start), *result = NULL;
    if (page == NULL || pages == NULL || values == NULL)
        goto done;
    Py_ssize_t size = 0, messages = 0, entries = 0, buckets = 0;
    unsigned long long tag = (unsigned long long)self->log_sid << 2 | GAPS_CODEC;
    for (Py_ssize_t i = 0, j; i < last_start; i = j) {
        /* body := uvarint(1) uvarint(sid << 2 | GAPS) uvarint(len(payload)) payload */
        unsigned char payload[LOG_GROUP * UVARINT_MAX], body[LOG_RECORD_MAX], head[2 * UVARINT_MAX];
        Py_ssize_t payload_size = 0, body_size, head_size;
        long long deadline = log[i].deadline, previous = 0;
        for (j = i; j < last_start && log[j].deadline == deadline; j++) {
            payload_size += put_uvarint(payload + payload_size, (unsigned long long)(log[j].value - previous));
            entries += j == i || self->log_kind == KIND_PLAIN || (log[j].value >> BATCH_BITS) != (previous >> BATCH_BITS);
            previous = log[j].value;
        }
        body_size = put_uvarint(body, 1);
        body_size += put_uvarint(body + body_size, tag);
        body_size += put_uvarint(body + body_size, (unsigned long long)payload_size);
        memcpy(body + body_size, payload, (size_t)payload_size);
        body_size += payload_size;
        /* record := uvarint(deadline - base) uvarint(len(body)) body; base = the page's key */
        if (size) {
            head_size = put_uvarint(head, (unsigned long long)(deadline - key));
            head_size += put_uvarint(head + head_size, (unsigned long long)body_size);
            if (size + head_size + body_size > page_bytes) { /* full: a new page */
                if (emit_page(pages, key, page, size) < 0)
                    goto done;
                size = 0;
            }
        }
        if (size == 0) { /* page := uvarint(key - base) record+, base = key */
            key = deadline;
            size = put_uvarint(page, 0);
            head_size = put_uvarint(head, 0);
            head_size += put_uvarint(head + head_size, (unsigned long long)body_size);
        }
        memcpy(page + size, head, (size_t)head_size);
        memcpy(page + size + head_size, body, (size_t)body_size);
        size += head_size + body_size;
        page_last = deadline;
        messages += j - i;
        buckets++;
    }
    if (size && emit_page(pages, key, page, size) < 0)
        goto done;
    for (Py_ssize_t i = last_start; i < n; i++) {
        PyObject *value = PyLong_FromLongLong(log[i].value);
        if (value == NULL)
            goto done;
        PyList_SET_ITEM(values, i - last_start, value);
    }
    result = Py_BuildValue("(LOnnnLLO)", self->log_sid, pages, messages, entries, buckets, page_last, last_deadline,
                           values);
    if (result != NULL) {
        self->log_len = 0;
        self->log_entries = 0;
        self->log_group = 0;
        self->log_floor = last_deadline;
    }
done:
    PyMem_Free(page);
    Py_XDECREF(pages);
    Py_XDECREF(values);
    if (result == NULL && !PyErr_Occurred())
        PyErr_NoMemory();
    return result;
}

static PyObject *
HotSlot_log(HotSlot *self, PyObject *unused)
{
    if (self->log_topic == NULL)
        Py_RETURN_NONE;
    PyObject *records = PyList_New(self->log_len);
    for (Py_ssize_t i = 0; records != NULL && i < self->log_len; i++) {
        PyObject *item = Py_BuildValue("(LL)", self->log[i].deadline, self->log[i].value);
        if (item == NULL)
            Py_CLEAR(records);
        else
            PyList_SET_ITEM(records, i, item);
    }
    if (records == NULL)
        return NULL;
    return Py_BuildValue("(OLiLLN)", self->log_topic, self->log_ledger, self->log_kind, self->log_sid, self->log_floor,
                         records);
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
    if (i < 0) {
        if (!log_takes(self, &k, deadline))
            Py_RETURN_FALSE;
        log_append(self, &k, deadline);
        Py_RETURN_TRUE;
    }
    if (slot_add(&self->slots[i], &k) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

static PyMethodDef HotSlot_methods[] = {
    {"set", (PyCFunction)(void (*)(void))HotSlot_set, METH_FASTCALL,
     "set(deadline, topic, ledger, kind, bitmap): make *bitmap* hot (it must not be already); "
     "return the (messages, entries) growth of the slot evicted to make room, if any."},
    {"add", (PyCFunction)(void (*)(void))HotSlot_add, METH_FASTCALL,
     "add(key, bucket_deadline): add the key to its hot bitmap or to the tail log and return True, "
     "or False when neither takes it."},
    {"forget", (PyCFunction)HotSlot_forget, METH_O, "Remove the slots of one bucket; return their (messages, entries) growth."},
    {"forget_bitmap", (PyCFunction)HotSlot_forget_bitmap, METH_O,
     "Remove the slot of one bitmap; return its (messages, entries) growth."},
    {"clear", (PyCFunction)HotSlot_clear, METH_NOARGS, "Remove every slot; return their (messages, entries) growth."},
    {"growth", (PyCFunction)HotSlot_growth, METH_NOARGS, "Messages added through the slots since set(), and in the log. O(slots)."},
    {"entry_growth", (PyCFunction)HotSlot_entry_growth, METH_NOARGS, "New entries added through the slots, and in the log. O(slots)."},
    {"slots", (PyCFunction)HotSlot_slots, METH_NOARGS,
     "[(deadline, topic, ledger, kind, bitmap, base)] of every slot, oldest first (for checks)."},
    {"set_log", (PyCFunction)(void (*)(void))HotSlot_set_log, METH_FASTCALL,
     "set_log(topic, ledger, kind, sid, floor): the tail log's stream, and the floor no bucket is later than "
     "(the log must be empty)."},
    {"unset_log", (PyCFunction)HotSlot_unset_log, METH_NOARGS, "No tail log stream (the log must be empty)."},
    {"take_log", (PyCFunction)HotSlot_take_log, METH_O,
     "take_log(page_bytes): None, or (sid, pages, messages, entries, buckets, last_page_deadline, deadline, values): "
     "the log's records, every deadline but the last as sealed pages, then the log is empty."},
    {"log", (PyCFunction)HotSlot_log, METH_NOARGS,
     "None, or (topic, ledger, kind, sid, floor, [(deadline, value)]) of the tail log (for checks)."},
    {NULL},
};

static PyTypeObject HotSlotType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pulsar_nack.core._speedups.HotSlot",
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

/* Add the key to its hot slot or to the tail log, holding the lock.
 * 1: added; 0: neither takes it, or the lock is taken (nothing changed); -1: error. */
static int
add_to_slot(FastAdd *self, PyObject *key, long long bucket)
{
    SlotKey k;
    if (!slot_key(key, &k) || (find_slot(self->slot, &k, bucket) < 0 && !log_takes(self->slot, &k, bucket)))
        return 0; /* a miss costs no lock round trip */
    PyObject *got = PyObject_CallOneArg(self->acquire, Py_False);
    if (got == NULL)
        return -1;
    int locked = got == Py_True;
    Py_DECREF(got);
    if (!locked)
        return 0; /* contended: the Python path waits for the lock */
    /* Looked up again under the lock (cheap): only lock holders change the slots and the log. */
    int i = find_slot(self->slot, &k, bucket);
    if (i < 0 && log_takes(self->slot, &k, bucket)) {
        log_append(self->slot, &k, bucket);
        i = MAX_SLOTS; /* added */
    }
    int failed = i >= 0 && i < MAX_SLOTS && slot_add(&self->slot->slots[i], &k) < 0;
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
    .tp_name = "pulsar_nack.core._speedups.FastAdd",
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
    .m_name = "pulsar_nack.core._speedups",
    .m_doc = "The optional C hot path of NegativeAcksTracker.add (see pulsar_nack.core.accel).",
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
