/*
 * pulsar_nack.core._speedups: the optional C hot path of NegativeAcksTracker.add.
 *
 * Nothing here is needed for correctness: pulsar_nack/core/accel.py holds the pure-Python
 * HotSlot, and NegativeAcksTracker.add is pure Python without FastAdd
 * (PULSAR_NACK_PURE_PYTHON=1 forces that). This file owns no rule of the structure:
 * TimeBuckets (buckets.py) trims deadlines into buckets and gives each hot slot the range
 * of deadlines its bucket holds; pages.py is the only writer of sealed pages; the tracker
 * (tracker.py) hands FastAdd its delays, the backoff's table and the delay limit.
 *
 * HotSlot: up to MAX_SLOTS open bitmaps that recent adds went to, each by (range of
 *   deadlines [first, last], topic, ledger, kind): plain ids below 2**32, and batched ids
 *   whose packed value (entry << BATCH_BITS | index) is below 2**32. Adds through a slot
 *   are not counted one by one: TimeBuckets counts them as the bitmap's growth since set()
 *   (and, for batches, the new entries the slot saw) when the slot goes.
 *
 * The tail log (part of HotSlot): adds of ONE stream (topic, ledger, kind, with its sid)
 *   whose deadline is after every bucket, at precision 0 only (a bucket per millisecond:
 *   a deadline is its own bucket, so the log needs no trimming). TimeBuckets sets the
 *   stream and the floor with set_log(). A hot-slot miss is appended as a (deadline, value)
 *   record when its stream is the log's, its deadline is above the floor and (deadline,
 *   value) is above the last record's (at most LOG_GROUP records per deadline,
 *   LOG_CAPACITY in all); anything else misses to Python. Records strictly increase, so
 *   there is no duplicate and growth() stays exact. Every Python operation on the
 *   structure first calls take_log(), which seals every deadline but the last into
 *   pages (the framing below, as pages.py calls it) and hands back the last one for
 *   TimeBuckets to open as a normal bucket (a dense bucket then gets a hot bitmap).
 *
 * FastAdd: NegativeAcksTracker.add for every documented call form, add(key),
 *   add(key, delay_ms) and add(key, delay_ms=...), add(key, None, redelivery_count) and
 *   add(key, redelivery_count=...), with the fixed delay or a multiplier backoff's table.
 *   It computes the deadline (now + delay) and, holding the tracker's lock, adds the key to
 *   the slot whose range holds it, or to the tail log. Anything else goes to the tracker's
 *   Python code: track(key, deadline) for other keys, general(*args, **kwargs) for other
 *   calls and arguments the Python code must judge. It never arms the timer: a slot's
 *   bucket exists, and a log record is after the structure's last bucket.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <time.h>

#define U32_LIMIT (1LL << 32)
#define DEADLINE_LIMIT (1LL << 62) /* deadlines at or above it take the Python path */
#define MAX_SLOTS 16
#define KIND_PLAIN 0
#define KIND_BATCHED 1
#define BATCH_BITS 10
#define LOG_CAPACITY 2048 /* records in the tail log; a full log misses to Python, which takes it */
#define LOG_GROUP 8       /* records per deadline: a denser bucket is handed to Python to get a hot bitmap */

/* ------------------------------------------------------------------ page framing
 *
 * pulsar_nack/core/pages.py defines the sealed-page format and calls these when the
 * extension is built (its Python versions are the stand-ins, byte for byte the same):
 *
 *     page   := uvarint(key - base) record+
 *     record := uvarint(deadline - base) uvarint(len(body)) body
 *     body   := uvarint(streams) [uvarint(tag) uvarint(len(payload)) payload]...
 *     GAPS   := uvarint(first) uvarint(value - previous)...
 *
 * pages.py also makes each stream's tag (sid and codec) and decides the page size; the
 * tail log's pages (take_log) are written by the same functions.
 */

#define UVARINT_MAX 10

typedef struct {
    unsigned char *data;
    Py_ssize_t size, capacity;
} Buffer;

/* Room for *more* bytes; -1 (MemoryError) when none. */
static int
buf_reserve(Buffer *b, Py_ssize_t more)
{
    if (b->size + more <= b->capacity)
        return 0;
    Py_ssize_t capacity = b->capacity ? b->capacity : 256;
    while (capacity < b->size + more)
        capacity *= 2;
    unsigned char *data = PyMem_Realloc(b->data, (size_t)capacity);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->capacity = capacity;
    return 0;
}

static Py_ssize_t
uvarint_at(unsigned char *out, unsigned long long value)
{
    Py_ssize_t size = 0;
    while (value >= 0x80) {
        out[size++] = (unsigned char)(value & 0x7F) | 0x80;
        value >>= 7;
    }
    out[size++] = (unsigned char)value;
    return size;
}

static int
buf_uvarint(Buffer *b, unsigned long long value)
{
    if (buf_reserve(b, UVARINT_MAX) < 0)
        return -1;
    b->size += uvarint_at(b->data + b->size, value);
    return 0;
}

static int
buf_bytes(Buffer *b, const void *data, Py_ssize_t size)
{
    if (buf_reserve(b, size) < 0)
        return -1;
    memcpy(b->data + b->size, data, (size_t)size);
    b->size += size;
    return 0;
}

/* The page being packed: pages are appended to *pages* as (key, bytes) once full. */
typedef struct {
    PyObject *pages;
    Buffer page, record;
    long long key, base; /* of the page being filled (key < 0: none) */
    Py_ssize_t limit;    /* pages grow up to this many bytes; a larger record stands alone */
} Packer;

static int
packer_emit(Packer *p)
{
    if (p->key < 0)
        return 0;
    PyObject *item = Py_BuildValue("(Ly#)", p->key, (const char *)p->page.data, p->page.size);
    int failed = item == NULL || PyList_Append(p->pages, item) < 0;
    Py_XDECREF(item);
    p->key = -1;
    p->page.size = 0;
    return failed ? -1 : 0;
}

/* Add the record of one sealed bucket: to the page being filled while it fits, else to a new page. */
static int
packer_add(Packer *p, long long deadline, const unsigned char *body, Py_ssize_t size)
{
    p->record.size = 0;
    if (p->key >= 0 && (buf_uvarint(&p->record, (unsigned long long)(deadline - p->base)) < 0
                        || buf_uvarint(&p->record, (unsigned long long)size) < 0))
        return -1;
    if (p->key < 0 || p->page.size + p->record.size + size > p->limit) {
        if (packer_emit(p) < 0)
            return -1;
        p->key = p->base = deadline;
        p->record.size = 0;
        if (buf_uvarint(&p->page, 0) < 0 || buf_uvarint(&p->record, 0) < 0
            || buf_uvarint(&p->record, (unsigned long long)size) < 0)
            return -1;
    }
    return buf_bytes(&p->page, p->record.data, p->record.size) < 0 || buf_bytes(&p->page, body, size) < 0 ? -1 : 0;
}

static void
packer_free(Packer *p)
{
    Py_CLEAR(p->pages);
    PyMem_Free(p->page.data);
    PyMem_Free(p->record.data);
}

/* Go on filling *page*, keyed by *key*: its base is key - uvarint(page[0:]). -1 on error. */
static int
packer_resume(Packer *p, PyObject *key, PyObject *page)
{
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(page);
    Py_ssize_t size = PyBytes_GET_SIZE(page), i = 0;
    unsigned long long offset = 0;
    for (int shift = 0; i < size && shift < 63; shift += 7) {
        offset |= (unsigned long long)(data[i] & 0x7F) << shift;
        if (!(data[i++] & 0x80))
            break;
    }
    if ((p->key = PyLong_AsLongLong(key)) == -1 && PyErr_Occurred())
        return -1;
    if (p->key < 0 || i == 0 || data[i - 1] & 0x80) {
        PyErr_SetString(PyExc_ValueError, "a page starts with uvarint(key - base) and has a key >= 0");
        return -1;
    }
    p->base = p->key - (long long)offset;
    return buf_bytes(&p->page, data, size);
}

/* pack(records, key, page, page_bytes): [(key, page)]: *page* (keyed by *key*; None: no
 * page) followed by the records of the (deadline, body) pairs, ascending, in pages of up
 * to page_bytes. The first item is the given page, grown, when the first record fits. */
static PyObject *
pack(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Packer p = {.key = -1};
    if (nargs != 4 || !PyList_Check(args[0]) || !PyLong_Check(args[1]) || (args[2] != Py_None && !PyBytes_Check(args[2]))) {
        PyErr_SetString(PyExc_TypeError, "pack(records: list, key: int, page: bytes | None, page_bytes: int)");
        return NULL;
    }
    if ((p.limit = PyLong_AsSsize_t(args[3])) == -1 && PyErr_Occurred())
        return NULL;
    if ((p.pages = PyList_New(0)) == NULL || (args[2] != Py_None && packer_resume(&p, args[1], args[2]) < 0))
        goto fail;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(args[0]); i++) {
        PyObject *item = PyList_GET_ITEM(args[0], i);
        long long deadline;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(item, 1))) {
            PyErr_SetString(PyExc_TypeError, "records must be (deadline, body bytes) pairs");
            goto fail;
        }
        PyObject *body = PyTuple_GET_ITEM(item, 1);
        if (((deadline = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 0))) == -1 && PyErr_Occurred())
            || packer_add(&p, deadline, (const unsigned char *)PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body)) < 0)
            goto fail;
    }
    if (packer_emit(&p) < 0)
        goto fail;
    PyObject *pages = p.pages;
    p.pages = NULL;
    packer_free(&p);
    return pages;
fail:
    packer_free(&p);
    return NULL;
}

/* The body of streams of (tag, payload); -1 on error. */
static int
frame_body_into(Buffer *out, PyObject *streams)
{
    Py_ssize_t n = PyList_GET_SIZE(streams);
    if (buf_uvarint(out, (unsigned long long)n) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(streams, i);
        unsigned long long tag;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(item, 1))) {
            PyErr_SetString(PyExc_TypeError, "streams must be (tag, payload bytes) pairs");
            return -1;
        }
        PyObject *payload = PyTuple_GET_ITEM(item, 1);
        if (((tag = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(item, 0))) == (unsigned long long)-1 && PyErr_Occurred())
            || buf_uvarint(out, tag) < 0 || buf_uvarint(out, (unsigned long long)PyBytes_GET_SIZE(payload)) < 0
            || buf_bytes(out, PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload)) < 0)
            return -1;
    }
    return 0;
}

/* frame_body(streams): the body of one sealed bucket from its [(tag, payload)]. */
static PyObject *
frame_body(PyObject *module, PyObject *streams)
{
    Buffer body = {0};
    if (!PyList_Check(streams)) {
        PyErr_SetString(PyExc_TypeError, "frame_body takes a list of (tag, payload) pairs");
        return NULL;
    }
    PyObject *result = frame_body_into(&body, streams) < 0 ? NULL : PyBytes_FromStringAndSize((char *)body.data, body.size);
    PyMem_Free(body.data);
    return result;
}


/* encode_gaps(values): the GAPS payload (pulsar_nack.core.pages) of ascending distinct values
 * given as a buffer of unsigned 32- or 64-bit ints (BitMap.to_array()): uvarint(first),
 * then uvarint(value - previous) for each further value. */
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

/* ------------------------------------------------------------------ HotSlot */

typedef struct {
    long long first, last; /* the deadlines its bucket holds */
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
    long long deadline;
    long long value;    /* bitmap value (PLAIN: entry; BATCHED: entry << BATCH_BITS | index) */
} LogRecord;

typedef struct {
    PyObject_HEAD
    int count;          /* slots in use: slots[0] is the oldest */
    int hit;            /* the slot of the previous hit */
    Slot slots[MAX_SLOTS];
    PyObject *log_topic;  /* the log's stream (exact str), NULL when none */
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
    return type->tp_alloc(type, 0); /* zeroed: no slots, no log */
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

/* Add a slot's growth since set() to *messages and *entries; -1 on error. */
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
    self->hit = 0;
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

/* Read n ints of args into out; 1 if all fit 64 bits, 0 if one does not (no error). */
static int
read_longs(PyObject *const *args, int n, long long *out)
{
    int overflow = 0;
    for (int i = 0; i < n && !overflow; i++)
        out[i] = PyLong_AsLongLongAndOverflow(args[i], &overflow);
    return !overflow;
}

static PyObject *
HotSlot_set(HotSlot *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long range[2], ledger, kind;
    Py_ssize_t messages = 0, entries = 0;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "set(first, last, topic, ledger, kind, bitmap) takes 6 arguments");
        return NULL;
    }
    if (!PyLong_Check(args[0]) || !PyLong_Check(args[1]) || !PyUnicode_Check(args[2]) || !PyLong_Check(args[3])
        || !PyLong_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "set() takes int first and last deadlines, a str topic, an int ledger and kind");
        return NULL;
    }
    if ((kind = read_kind(args[4])) < 0)
        return NULL;
    if (!read_longs(args, 2, range) || !read_longs(args + 3, 1, &ledger) || !PyUnicode_CheckExact(args[2]))
        /* Beyond 64 bits (fake clocks only) or a str subclass: no slot; the Python path
         * handles such keys. The caller has stored the key already: never fail here. */
        return growth_pair(0, 0, 0);
    Py_ssize_t base = PyObject_Length(args[5]);
    if (base < 0)
        return NULL;
    PyObject *add = PyObject_GetAttrString(args[5], "add"), *range_cardinality = NULL;
    if (add == NULL)
        return NULL;
    if (kind == KIND_BATCHED && (range_cardinality = PyObject_GetAttrString(args[5], "range_cardinality")) == NULL) {
        Py_DECREF(add);
        return NULL;
    }
    int failed = self->count == MAX_SLOTS && slot_remove(self, 0, &messages, &entries) < 0; /* the oldest makes room */
    Slot *slot = &self->slots[self->count++];
    slot->first = range[0];
    slot->last = range[1];
    slot->topic = Py_NewRef(args[2]);
    slot->ledger = ledger;
    slot->kind = (int)kind;
    slot->bitmap = Py_NewRef(args[5]);
    slot->add = add;
    slot->range_cardinality = range_cardinality;
    slot->base = base;
    slot->entries = 0;
    slot->last_entry = -1;
    return growth_pair(failed, messages, entries);
}

/* Remove every slot holding deadline *value* (all slots when arg is Py_True, the slot of
 * bitmap *arg* otherwise when arg is not NULL); return their growth. */
static PyObject *
remove_where(HotSlot *self, PyObject *bitmap, int all, long long deadline)
{
    Py_ssize_t messages = 0, entries = 0;
    int failed = 0;
    for (int i = self->count - 1; i >= 0; i--) {
        Slot *s = &self->slots[i];
        if (all || (bitmap != NULL ? s->bitmap == bitmap : s->first <= deadline && deadline <= s->last))
            failed |= slot_remove(self, i, &messages, &entries);
    }
    return growth_pair(failed, messages, entries);
}

static PyObject *
HotSlot_clear(HotSlot *self, PyObject *unused)
{
    return remove_where(self, NULL, 1, 0);
}

static PyObject *
HotSlot_forget(HotSlot *self, PyObject *deadline)
{
    int overflow = 0;
    long long value = PyLong_Check(deadline) ? PyLong_AsLongLongAndOverflow(deadline, &overflow) : -1;
    if (value == -1 && PyErr_Occurred())
        return NULL;
    if (!PyLong_Check(deadline) || overflow)
        return growth_pair(0, 0, 0); /* no slot holds such a deadline */
    return remove_where(self, NULL, 0, value);
}

static PyObject *
HotSlot_forget_bitmap(HotSlot *self, PyObject *bitmap)
{
    return remove_where(self, bitmap, 0, 0);
}

/* The messages (entries == 0) or the entries (entries == 1) added through every slot and the log. */
static PyObject *
total_growth(HotSlot *self, int entries)
{
    Py_ssize_t counts[2] = {self->log_len, self->log_entries}; /* the log's records: distinct, none stored */
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
        PyObject *item = Py_BuildValue("(LLOLiOn)", s->first, s->last, s->topic, s->ledger, s->kind, s->bitmap, s->base);
        if (item == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, item);
    }
    return list;
}

/* The fields of a key the slots can take: exact str topic and exact ints, a plain id
 * below 2**32 or a batched one whose packed value is below 2**32. */
typedef struct {
    PyObject *topic, *entry_obj;
    long long ledger, entry, value;
    int kind;
} SlotKey;

/* 1 if the slots can take *key* (filling *k*), else 0; runs no Python code, never fails. */
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
    if (overflow || k->entry < 0 || k->entry >= (index < 0 ? U32_LIMIT : U32_LIMIT >> BATCH_BITS))
        return 0;
    k->kind = index < 0 ? KIND_PLAIN : KIND_BATCHED;
    k->value = index < 0 ? k->entry : k->entry << BATCH_BITS | index;
    k->topic = topic;
    k->entry_obj = entry;
    return 1;
}

/* Whether two exact strs are equal (pointer first: keys usually share one topic object). */
static int
same_topic(PyObject *a, PyObject *b)
{
    return a == b || (PyUnicode_GET_LENGTH(a) == PyUnicode_GET_LENGTH(b) && PyUnicode_Compare(a, b) == 0);
}

/* The slot for a key due at *deadline*, or -1. Runs no Python code. */
static int
find_slot(HotSlot *self, SlotKey *k, long long deadline)
{
    for (int n = 0; n < self->count; n++) {
        int i = (self->hit + n) % self->count; /* the previous hit first */
        Slot *s = &self->slots[i];
        if (deadline < s->first || deadline > s->last || s->ledger != k->ledger || s->kind != k->kind)
            continue;
        if (same_topic(s->topic, k->topic)) {
            self->hit = i;
            return i;
        }
    }
    return -1;
}

/* Add the key to a slot's bitmap (the caller holds the tracker's lock). 0, or -1 on error. */
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

/* Whether the tail log takes the key due at *deadline* (see the top of this file). */
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
    return same_topic(self->log_topic, k->topic);
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
    self->log[self->log_len++] = (LogRecord){deadline, k->value};
}

static PyObject *
HotSlot_set_log(HotSlot *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long numbers[4], kind; /* ledger, kind, sid, floor */
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
    Py_CLEAR(self->log_topic);
    if (!read_longs(args + 1, 4, numbers) || !PyUnicode_CheckExact(args[0]) || numbers[0] < 0 || numbers[2] < 0
        || numbers[3] < 0 || numbers[3] >= DEADLINE_LIMIT)
        Py_RETURN_NONE; /* beyond 64 bits (fake clocks only) or a str subclass: no log */
    if (self->log == NULL && (self->log = PyMem_Malloc(sizeof(LogRecord) * LOG_CAPACITY)) == NULL)
        Py_RETURN_NONE; /* no memory for it: no log (the key is stored already: never fail here) */
    self->log_topic = Py_NewRef(args[0]);
    self->log_ledger = numbers[0];
    self->log_kind = (int)kind;
    self->log_sid = numbers[2];
    self->log_floor = numbers[3];
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

/* take_log(tag, page_bytes): None when the log is empty, else (sid, pages, messages,
 * entries, buckets, last_sealed, deadline, values): every deadline but the last sealed
 * into pages (by the packer above, with pages.py's tag for the log's GAPS stream) with
 * the messages, distinct entries and buckets they hold and the deadline of the last of
 * them (-1 when none), then the last deadline and its values. The log is then empty and
 * its floor is that last deadline. On error the log is left as it was. */
static PyObject *
HotSlot_take_log(HotSlot *self, PyObject *const *args, Py_ssize_t nargs)
{
    unsigned long long tag;
    Packer p = {.key = -1};
    if (nargs != 2 || ((tag = PyLong_AsUnsignedLongLong(args[0])) == (unsigned long long)-1 && PyErr_Occurred())
        || (p.limit = PyLong_AsSsize_t(args[1])) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "take_log(tag, page_bytes) takes two non-negative ints");
        return NULL;
    }
    if (self->log_len == 0)
        Py_RETURN_NONE;
    LogRecord *log = self->log;
    Py_ssize_t n = self->log_len, last = n - 1, messages = 0, entries = 0, buckets = 0;
    while (last > 0 && log[last - 1].deadline == log[n - 1].deadline)
        last--;
    PyObject *values = PyList_New(n - last), *result = NULL;
    if (values == NULL || (p.pages = PyList_New(0)) == NULL)
        goto done;
    for (Py_ssize_t i = 0, j; i < last; i = j) {
        unsigned char payload[LOG_GROUP * UVARINT_MAX], body[3 * UVARINT_MAX + sizeof(payload)];
        Py_ssize_t payload_size = 0, body_size;
        long long previous = 0;
        for (j = i; j < last && log[j].deadline == log[i].deadline; j++) {
            payload_size += uvarint_at(payload + payload_size, (unsigned long long)(log[j].value - previous));
            entries += j == i || self->log_kind == KIND_PLAIN || (log[j].value >> BATCH_BITS) != (previous >> BATCH_BITS);
            previous = log[j].value;
        }
        body_size = uvarint_at(body, 1); /* one stream: the log's */
        body_size += uvarint_at(body + body_size, tag);
        body_size += uvarint_at(body + body_size, (unsigned long long)payload_size);
        memcpy(body + body_size, payload, (size_t)payload_size);
        if (packer_add(&p, log[i].deadline, body, body_size + payload_size) < 0)
            goto done;
        messages += j - i;
        buckets++;
    }
    if (packer_emit(&p) < 0)
        goto done;
    for (Py_ssize_t i = last; i < n; i++) {
        PyObject *value = PyLong_FromLongLong(log[i].value);
        if (value == NULL)
            goto done;
        PyList_SET_ITEM(values, i - last, value);
    }
    result = Py_BuildValue("(LOnnnLLO)", self->log_sid, p.pages, messages, entries, buckets,
                           last ? log[last - 1].deadline : -1LL, log[n - 1].deadline, values);
    if (result != NULL) {
        self->log_floor = log[n - 1].deadline;
        self->log_len = self->log_entries = self->log_group = 0;
    }
done:
    packer_free(&p);
    Py_XDECREF(values);
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
        PyErr_SetString(PyExc_TypeError, "add(key, deadline) takes a key and an int");
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
     "set(first, last, topic, ledger, kind, bitmap): make *bitmap* hot for the deadlines first..last "
     "(it must not be already); return the (messages, entries) growth of the slot evicted to make room, if any."},
    {"add", (PyCFunction)(void (*)(void))HotSlot_add, METH_FASTCALL,
     "add(key, deadline): add the key to its hot bitmap or to the tail log and return True, "
     "or False when neither takes it."},
    {"forget", (PyCFunction)HotSlot_forget, METH_O, "Remove the slots holding a deadline; return their (messages, entries) growth."},
    {"forget_bitmap", (PyCFunction)HotSlot_forget_bitmap, METH_O,
     "Remove the slot of one bitmap; return its (messages, entries) growth."},
    {"clear", (PyCFunction)HotSlot_clear, METH_NOARGS, "Remove every slot; return their (messages, entries) growth."},
    {"growth", (PyCFunction)HotSlot_growth, METH_NOARGS, "Messages added through the slots since set(), and in the log. O(slots)."},
    {"entry_growth", (PyCFunction)HotSlot_entry_growth, METH_NOARGS, "New entries added through the slots, and in the log. O(slots)."},
    {"slots", (PyCFunction)HotSlot_slots, METH_NOARGS,
     "[(first, last, topic, ledger, kind, bitmap, base)] of every slot, oldest first (for checks)."},
    {"set_log", (PyCFunction)(void (*)(void))HotSlot_set_log, METH_FASTCALL,
     "set_log(topic, ledger, kind, sid, floor): the tail log's stream, and the floor no bucket is later than "
     "(the log must be empty)."},
    {"unset_log", (PyCFunction)HotSlot_unset_log, METH_NOARGS, "No tail log stream (the log must be empty)."},
    {"take_log", (PyCFunction)(void (*)(void))HotSlot_take_log, METH_FASTCALL,
     "take_log(tag, page_bytes): None, or (sid, pages, messages, entries, buckets, last_sealed, deadline, values): "
     "the log's records, every deadline but the last sealed into pages; then the log is empty."},
    {"log", (PyCFunction)HotSlot_log, METH_NOARGS,
     "None, or (topic, ledger, kind, sid, floor, [(deadline, value)]) of the tail log (for checks)."},
    {NULL},
};

static PyTypeObject HotSlotType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pulsar_nack.core._speedups.HotSlot",
    .tp_doc = PyDoc_STR("Up to 16 open bitmaps recent adds went to, by deadline range, topic, ledger and kind (C version)."),
    .tp_basicsize = sizeof(HotSlot),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = HotSlot_new,
    .tp_dealloc = (destructor)HotSlot_dealloc,
    .tp_methods = HotSlot_methods,
};

/* ------------------------------------------------------------------ FastAdd */

#define MAX_DELAYS 64

static PyObject *str_delay_ms, *str_redelivery_count; /* interned keyword names */

typedef struct {
    PyObject_HEAD
    HotSlot *slot;
    PyObject *acquire;  /* lock.acquire */
    PyObject *release;  /* lock.release */
    PyObject *clock;    /* callable returning ms, or NULL for CLOCK_MONOTONIC */
    long long delay_ms; /* the fixed delay */
    long long max_delay_ms; /* the largest delay a call may give */
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

/* A delay in [0, 2**61), or -1 with an error. */
static long long
read_delay(PyObject *value, const char *name)
{
    long long delay = PyLong_AsLongLong(value);
    if (delay == -1 && PyErr_Occurred())
        return -1;
    if (delay < 0 || delay >= DEADLINE_LIMIT / 2) {
        PyErr_Format(PyExc_ValueError, "%s must be in [0, 2**61)", name);
        return -1;
    }
    return delay;
}

/* Read the backoff table (a tuple of 1 to MAX_DELAYS delays) into self; -1 on error. */
static int
read_delays(FastAdd *self, PyObject *delays)
{
    if (delays == Py_None)
        return 0;
    if (!PyTuple_Check(delays) || PyTuple_GET_SIZE(delays) < 1 || PyTuple_GET_SIZE(delays) > MAX_DELAYS) {
        PyErr_SetString(PyExc_TypeError, "delays must be None or a tuple of 1 to 64 ints");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(delays); i++)
        if ((self->delays[i] = read_delay(PyTuple_GET_ITEM(delays, i), "delays")) < 0)
            return -1;
    self->n_delays = (int)PyTuple_GET_SIZE(delays);
    return 0;
}

static PyObject *
FastAdd_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"slot", "lock", "clock", "delay_ms", "max_delay_ms", "general", "track", "delays", NULL};
    PyObject *slot, *lock, *clock, *delay, *max_delay, *general, *track, *delays = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OOO!O!OO|O:FastAdd", names, &HotSlotType, &slot, &lock, &clock,
                                     &PyLong_Type, &delay, &PyLong_Type, &max_delay, &general, &track, &delays))
        return NULL;
    if ((clock != Py_None && !PyCallable_Check(clock)) || !PyCallable_Check(general) || !PyCallable_Check(track)) {
        PyErr_SetString(PyExc_TypeError, "clock (or None), general and track must be callable");
        return NULL;
    }
    FastAdd *self = (FastAdd *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    if ((self->delay_ms = read_delay(delay, "delay_ms")) < 0 || (self->max_delay_ms = read_delay(max_delay, "max_delay_ms")) < 0
        || read_delays(self, delays) < 0 || (self->acquire = PyObject_GetAttrString(lock, "acquire")) == NULL
        || (self->release = PyObject_GetAttrString(lock, "release")) == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->slot = (HotSlot *)Py_NewRef(slot);
    self->clock = clock == Py_None ? NULL : Py_NewRef(clock);
    self->general = Py_NewRef(general);
    self->track = Py_NewRef(track);
    return (PyObject *)self;
}

/* Call a lock method; keep an error already set (the add's) over its own result. */
static int
call_lock(PyObject *method, PyObject *argument)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *error = PyErr_GetRaisedException();
#else
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
#endif
    PyObject *result = argument == NULL ? PyObject_CallNoArgs(method) : PyObject_CallOneArg(method, argument);
    int answer = result == NULL ? -1 : result == Py_True;
    Py_XDECREF(result);
#if PY_VERSION_HEX >= 0x030C0000
    if (error != NULL)
        PyErr_SetRaisedException(error);
#else
    if (type != NULL)
        PyErr_Restore(type, value, traceback);
#endif
    return answer;
}

/* Add the key to its hot slot or to the tail log, holding the lock.
 * 1: added; 0: neither takes it, or the lock is taken (nothing changed); -1: error. */
static int
add_to_slot(FastAdd *self, PyObject *key, long long deadline)
{
    SlotKey k;
    if (!slot_key(key, &k) || (find_slot(self->slot, &k, deadline) < 0 && !log_takes(self->slot, &k, deadline)))
        return 0; /* a miss costs no lock round trip */
    int locked = call_lock(self->acquire, Py_False);
    if (locked <= 0)
        return locked; /* contended (0): the Python path waits for the lock */
    /* Looked up again under the lock (cheap): only lock holders change the slots and the log. */
    int i = find_slot(self->slot, &k, deadline), added = i >= 0;
    if (!added && log_takes(self->slot, &k, deadline)) {
        log_append(self->slot, &k, deadline);
        added = 1;
    } else if (added && slot_add(&self->slot->slots[i], &k) < 0) {
        added = -1;
    }
    return call_lock(self->release, NULL) < 0 ? -1 : added;
}

/* The delay of a call, as BaseTracker.add resolves it: an explicit delay_ms, else the
 * backoff's by redelivery count (None: 0, as a key tuple has no redelivery_count()), else
 * the fixed one. -1 when the Python path must judge an argument (it raises or converts). */
static long long
call_delay(FastAdd *self, PyObject *delay_ms, PyObject *redelivery_count)
{
    int overflow;
    if (delay_ms != Py_None) {
        long long delay = PyLong_CheckExact(delay_ms) ? PyLong_AsLongLongAndOverflow(delay_ms, &overflow) : -1;
        return !PyLong_CheckExact(delay_ms) || overflow || delay > self->max_delay_ms ? -1 : delay;
    }
    long long count = 0;
    if (redelivery_count != Py_None) {
        count = PyLong_CheckExact(redelivery_count) ? PyLong_AsLongLongAndOverflow(redelivery_count, &overflow) : -1;
        if (!PyLong_CheckExact(redelivery_count) || overflow || count < 0)
            return -1;
    }
    if (self->n_delays == 0)
        return self->delay_ms;
    return self->delays[count < self->n_delays ? count : self->n_delays - 1];
}

/* Whether *name* is the keyword *known* (interned: usually the same object). */
static int
is_keyword(PyObject *name, PyObject *known)
{
    return name == known || PyUnicode_Compare(name, known) == 0;
}

/* The delay_ms and redelivery_count of a call add(key, ...): 1, or 0 for a call the
 * Python path must take (other keywords, too many arguments, a keyword given twice). */
static int
read_call(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **delay_ms, PyObject **redelivery_count)
{
    *delay_ms = nargs > 1 ? args[1] : Py_None;
    *redelivery_count = nargs > 2 ? args[2] : Py_None;
    if (nargs < 1 || nargs > 3)
        return 0;
    Py_ssize_t n = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i), *value = args[nargs + i];
        if (nargs < 2 && is_keyword(name, str_delay_ms))
            *delay_ms = value;
        else if (nargs < 3 && is_keyword(name, str_redelivery_count))
            *redelivery_count = value;
        else
            return 0;
    }
    return 1;
}

/* now in ms: CLOCK_MONOTONIC, or the injected clock. 0 with *now set; 1 for a clock value
 * the Python path must judge (*value holds it, a new reference); -1 on error. */
static int
read_clock(FastAdd *self, long long *now, PyObject **value)
{
    if (self->clock == NULL) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        *now = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
        return 0;
    }
    if ((*value = PyObject_CallNoArgs(self->clock)) == NULL)
        return -1;
    int overflow = 1;
    *now = PyLong_CheckExact(*value) ? PyLong_AsLongLongAndOverflow(*value, &overflow) : 0;
    if (overflow || *now < 0 || *now >= DEADLINE_LIMIT / 2)
        return 1;
    Py_CLEAR(*value);
    return 0;
}

/* self.track(key, now + delay): the Python path, once the deadline is known. */
static PyObject *
call_track(FastAdd *self, PyObject *key, PyObject *now, long long delay)
{
    PyObject *delay_obj = PyLong_FromLongLong(delay);
    PyObject *deadline = delay_obj == NULL ? NULL : PyNumber_Add(now, delay_obj);
    PyObject *args[2] = {key, deadline};
    PyObject *result = deadline == NULL ? NULL : PyObject_Vectorcall(self->track, args, 2, NULL);
    Py_XDECREF(delay_obj);
    Py_XDECREF(deadline);
    return result;
}

static PyObject *
FastAdd_add(FastAdd *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *delay_ms, *redelivery_count, *now_obj = NULL;
    long long delay = -1, now;
    if (self->general == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "FastAdd was cleared by the garbage collector");
        return NULL;
    }
    if (read_call(args, nargs, kwnames, &delay_ms, &redelivery_count) && PyTuple_CheckExact(args[0])
        && PyTuple_GET_SIZE(args[0]) == 4)
        delay = call_delay(self, delay_ms, redelivery_count);
    if (delay < 0)
        return PyObject_Vectorcall(self->general, args, (size_t)nargs, kwnames);
    int unusual = read_clock(self, &now, &now_obj);
    if (unusual) { /* an error, or an unusual clock value: the Python path decides what it means */
        PyObject *result = unusual < 0 ? NULL : call_track(self, args[0], now_obj, delay);
        Py_XDECREF(now_obj);
        return result;
    }
    int added = add_to_slot(self, args[0], now + delay);
    if (added < 0)
        return NULL;
    if (added)
        return PyLong_FromLongLong(now + delay);
    PyObject *now_int = PyLong_FromLongLong(now);
    PyObject *result = now_int == NULL ? NULL : call_track(self, args[0], now_int, delay);
    Py_XDECREF(now_int);
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
    .tp_doc = PyDoc_STR("FastAdd(slot, lock, clock, delay_ms, max_delay_ms, general, track, delays=None): "
                        "the C hot path of NegativeAcksTracker.add."),
    .tp_basicsize = sizeof(FastAdd),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = FastAdd_new,
    .tp_dealloc = (destructor)FastAdd_dealloc,
    .tp_traverse = (traverseproc)FastAdd_traverse,
    .tp_clear = (inquiry)FastAdd_clear,
    .tp_methods = FastAdd_methods,
};

static PyMethodDef module_methods[] = {
    {"pack", (PyCFunction)(void (*)(void))pack, METH_FASTCALL,
     "pack(records, key, page, page_bytes): [(key, page)], the records appended to a page, in pages of up to page_bytes."},
    {"frame_body", frame_body, METH_O, "frame_body(streams): the body of a sealed bucket from its [(tag, payload)]."},
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
    if ((str_delay_ms = PyUnicode_InternFromString("delay_ms")) == NULL
        || (str_redelivery_count = PyUnicode_InternFromString("redelivery_count")) == NULL)
        return NULL;
    PyObject *module = PyModule_Create(&speedups_module);
    if (module == NULL)
        return NULL;
    /* The sizes compiled in, for accel.py to check against its own (one definition each). */
    if (PyModule_AddObjectRef(module, "HotSlot", (PyObject *)&HotSlotType) < 0
        || PyModule_AddObjectRef(module, "FastAdd", (PyObject *)&FastAddType) < 0
        || PyModule_AddIntConstant(module, "MAX_SLOTS", MAX_SLOTS) < 0
        || PyModule_AddIntConstant(module, "BATCH_BITS", BATCH_BITS) < 0
        || PyModule_AddIntConstant(module, "LOG_GROUP", LOG_GROUP) < 0
        || PyModule_AddIntConstant(module, "LOG_CAPACITY", LOG_CAPACITY) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
