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
 * _pulsar.Message. The pure-Python stand-ins in pulsar_nack/consumer/msgid.py return the
 * same. Both run in O(length of the serialized id).
 *
 * EntryTable: what the consumer knows of the entries in flight, keyed by (ledger, entry):
 *
 *     open record     a batch entry received (or settled in part) while the consumer
 *                     guards: its batch size, the members the application acked (A) and
 *                     those it nacked (N), one bit each (inline up to 64 members, else
 *                     two heap arrays of words);
 *     settled record  an entry whose every member was acked (or an acked non-batched
 *                     message), kept in a FIFO ring of the last `settled_capacity`
 *                     settlements, and with `settled_max_age_ms` only as long: the client
 *                     drops grouped acks it could not send when its connection drops, so
 *                     such an entry can come back.
 *
 * When A | N covers an open batch entry and N is not empty the record is dropped and the
 * caller moves the entry to its compact set of complete entries (roaring bitmaps). Records
 * live in one pool (free list), chained from a power-of-two bucket array by index; the
 * ring holds (index, generation) pairs, so a stale pair of a freed and reused record is
 * ignored. Every operation is O(1) (amortized for growth), except sweeps and clears.
 *
 * Watched entries: the caller marks (watch) every entry that may hold a message of its
 * nack sets, as a per-ledger high mark (the highest watched entry id of each ledger). A
 * copy of an entry above its ledger's mark has no nack state, so admit_message() decides
 * it here (deliver it, opening the record of a batch entry) and ack_message() records its
 * ack here, without a call back into Python; a watched entry goes to the caller, but where
 * its open record settles it: the caller marks every member of an open record that is in
 * one of its nack sets as nacked, so a copy of a member in neither bit set is delivered
 * here, and its ack recorded here unless it completes the entry with a nacked member. The
 * marks only grow until unwatch(): too high a mark costs a Python call, never a wrong verdict.
 *
 * Reading: an open record also keeps the member last delivered here (last_read) and when a
 * member was last read, delivered or settled here (touched_ms, a coarse clock). busy() tells
 * the caller whether the application may still settle members of the entry: the one it was
 * given last is unsettled, or the entry's copy was read from very recently (its other members
 * may be queued behind). On a shared subscription an entry handed off then could be delivered
 * to another consumer with a member this one nacks afterwards.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>
#include <time.h>

static PyObject *str_message_id;
static PyObject *str_serialize;
static PyObject *str_topic_name;
static PyObject *str_stash;
static PyObject *str_inner;

#include "_native_id.h"

/* native_read() of the _pulsar.Message a pulsar.Message wrapper holds (attribute _message); 0 where
 * the caller must read the id another way, a bare _pulsar.Message included (it keeps no id, as
 * before: the caller acks it by its own path). Never raises. */
static int
native_read_wrapper(PyObject *wrapper, int64_t f[5])
{
    if (native.type == NULL || Py_TYPE(wrapper) == native.type)
        return 0;
    PyObject *inner = PyObject_GetAttr(wrapper, str_inner);
    if (inner == NULL) {
        PyErr_Clear();
        return 0;
    }
    int read = native_read(inner, f);
    Py_DECREF(inner);
    return read;
}

/* The id a wrapper keeps (attribute _pulsar_nack_id): a new reference, or NULL (none kept: no
 * exception, none raised, since most messages keep none) or NULL with an exception set. */
static PyObject *
kept_id(PyObject *wrapper)
{
    PyObject *data = NULL;
#if PY_VERSION_HEX >= 0x030D0000
    if (PyObject_GetOptionalAttr(wrapper, str_stash, &data) < 0)
        return NULL;
#else
    if (_PyObject_LookupAttr(wrapper, str_stash, &data) < 0)
        return NULL;
#endif
    return data;
}

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

/* Decode fields 1-4 and 6, and with chunk not NULL the (ledger, entry) of field 7
 * (first_chunk_message_id) into chunk[0..1], chunk[2] = 1 if present (else 0); -1 with
 * ValueError set for malformed input. */
static int
parse_chunked(const unsigned char *pos, Py_ssize_t length, int64_t fields[5], int64_t *chunk)
{
    const unsigned char *end = pos + length;
    int seen = 0;
    if (chunk != NULL)
        chunk[2] = 0;
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
            if (number == 7 && chunk != NULL) {
                int64_t first[5];
                if (parse_chunked(pos, (Py_ssize_t)value, first, NULL) < 0)
                    return -1;
                chunk[0] = first[0];
                chunk[1] = first[1];
                chunk[2] = 1;
            }
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

/* Decode fields 1-4 and 6 (parse_chunked without the first chunk). */
static int
parse(const unsigned char *pos, Py_ssize_t length, int64_t fields[5])
{
    return parse_chunked(pos, length, fields, NULL);
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

/* A received message's id as bytes (message_id().serialize()): a new reference, or NULL with
 * an exception set. */
static PyObject *
message_id_bytes(PyObject *message)
{
    PyObject *id = PyObject_CallMethodNoArgs(message, str_message_id);
    if (id == NULL)
        return NULL;
    PyObject *data = PyObject_CallMethodNoArgs(id, str_serialize);
    Py_DECREF(id);
    if (data != NULL && !PyBytes_Check(data)) {
        Py_DECREF(data);
        PyErr_SetString(PyExc_TypeError, "MessageId.serialize() did not return bytes");
        return NULL;
    }
    return data;
}

/* message_id_bytes(), parsed into f; a new reference, or NULL with an exception set. */
static PyObject *
read_message_id(PyObject *message, int64_t f[5])
{
    PyObject *data = message_id_bytes(message);
    if (data == NULL)
        return NULL;
    if (parse((const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), f) < 0) {
        Py_DECREF(data);
        return NULL;
    }
    return data;
}

/* (topic, *v[0..n), last): a new tuple that steals *topic* and *last* (NULL: no last item); NULL
 * with an exception set (both released). Built directly: Py_BuildValue parses its format on every
 * call, and these are the nack's and the ack's per-message keys. */
static PyObject *
topic_tuple(PyObject *topic, const long long *v, Py_ssize_t n, PyObject *last)
{
    PyObject *tuple = PyTuple_New(1 + n + (last != NULL));
    if (tuple == NULL) {
        Py_DECREF(topic);
        Py_XDECREF(last);
        return NULL;
    }
    PyTuple_SET_ITEM(tuple, 0, topic);
    if (last != NULL)
        PyTuple_SET_ITEM(tuple, 1 + n, last);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = PyLong_FromLongLong(v[i]);
        if (value == NULL) {
            Py_DECREF(tuple); /* its unset items are NULL, which the tuple's release skips */
            return NULL;
        }
        PyTuple_SET_ITEM(tuple, 1 + i, value);
    }
    return tuple;
}

PyDoc_STRVAR(message_key_doc,
"message_key(message: _pulsar.Message) -> tuple[str, int, int, int]\n\n"
"(topic, ledger, entry, batch_index) of a received message, in three calls into\n"
"the client (message_id, serialize, topic_name).");

static PyObject *
message_key(PyObject *module, PyObject *message)
{
    int64_t f[5];
    if (!native_read(message, f)) {
        PyObject *data = read_message_id(message, f);
        if (data == NULL)
            return NULL;
        Py_DECREF(data);
    }
    PyObject *topic = native_topic(message, str_topic_name);
    if (topic == NULL)
        return NULL;
    const long long key[3] = {f[0], f[1], f[3]};
    return topic_tuple(topic, key, 3, NULL);
}

PyDoc_STRVAR(received_key_doc,
"received_key(message: _pulsar.Message, wrapper) -> tuple[str, int, int, int, int, tuple[int, int] | None]\n\n"
"(topic, ledger, entry, batch_index, batch_size, first_chunk) of a received message: the id\n"
"from the serialized one its pulsar.Message wrapper keeps (attribute _pulsar_nack_id), else\n"
"read once (message_id, serialize); the topic from topic_name(); first_chunk, the (ledger,\n"
"entry) of the first chunk of a chunked message (from the same bytes), else None.");

static PyObject *
received_key(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t f[5], chunk[3];
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "received_key(message, wrapper) takes two arguments");
        return NULL;
    }
    PyObject *data = kept_id(args[1]);
    if (data == NULL && PyErr_Occurred())
        return NULL;
    if (data != NULL && !PyBytes_Check(data))
        Py_CLEAR(data);
    if (data == NULL && native_read(args[0], f)) {
        chunk[2] = 0; /* read natively: a plain or batched id, never a chunked one */
    } else {
        if (data == NULL && (data = message_id_bytes(args[0])) == NULL)
            return NULL;
        int parsed = parse_chunked((const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), f, chunk);
        Py_DECREF(data);
        if (parsed < 0)
            return NULL;
    }
    PyObject *topic = native_topic(args[0], str_topic_name);
    if (topic == NULL)
        return NULL;
    PyObject *first = chunk[2] ? Py_BuildValue("(LL)", (long long)chunk[0], (long long)chunk[1]) : Py_NewRef(Py_None);
    if (first == NULL) {
        Py_DECREF(topic);
        return NULL;
    }
    const long long key[4] = {f[0], f[1], f[3], f[4]};
    return topic_tuple(topic, key, 4, first);
}

/* ------------------------------------------------------------------ EntryTable */

/* admit() verdicts and ack() / nack() outcomes: the values of msgid.py's Verdict and Outcome
   enums, which are the one table. This module exports them (VERDICTS, OUTCOMES) and msgid.py
   refuses a build whose values differ (tests/test_entry_table.py checks it too). */
#define V_DELIVER 0 /* an open record, member neither acked nor nacked: hand it to the application */
#define V_ACKED 1   /* the member (or the whole entry) was acked: filter the copy */
#define V_NACKED 2  /* the member was nacked: the caller's nack sets decide */
#define V_FRESH 3   /* no record: the caller decides (and opens one for a batch entry) */
#define V_DELIVER_LAST 6 /* admit_message() only: deliver, and guard_left ran out */
#define R_NONE 8
#define R_SETTLED 9          /* every member acked: now a settled record */
#define R_SETTLED_FOREIGN 10 /* the same, and some member was acked through an id the client made up */
#define R_COMPLETE 11        /* every member acked or nacked, some nacked: record dropped */
#define R_MISSING 12         /* no record, and none was created */

#define MAX_AGE_MS (1 << 30) /* well inside the wrap of the uint32 monotonic ms (49 days) */
#define F_SETTLED 1u
#define F_FOREIGN 2u
#define NIL 0xFFFFFFFFu

typedef struct {
    int64_t ledger, entry;
    uint32_t next; /* chain (or free list) */
    uint32_t gen;  /* bumped when the slot is freed */
    int32_t size;  /* members; 0 for a non-batched message */
    uint32_t flags;
    uint64_t acked, nacked; /* size <= 64 */
    uint64_t *wide;         /* size > 64: words acked, then words nacked */
    uint32_t touched_ms;    /* open record: a member last read, delivered or settled here (coarse ms) */
    int32_t last_read;      /* open record: the member last delivered here, or -1 */
} Rec;

typedef struct {
    PyObject_HEAD
    Rec *recs;
    uint32_t cap, used, free_head;
    uint32_t *buckets; /* first record of each chain, or NIL */
    uint32_t nbuckets; /* a power of two, >= cap */
    uint64_t *ring;    /* settled records, oldest first: index << 32 | generation */
    uint32_t *ring_ms; /* with max_age_ms: when each was settled (monotonic ms, wrapping) */
    uint32_t ring_cap, ring_head, ring_len, max_age_ms;
    uint32_t settled;
    Py_ssize_t wide_bytes;
    int64_t *watch;    /* (ledger, highest watched entry) pairs */
    uint32_t nwatch, watch_cap;
    char watch_all;    /* every copy goes to the caller's screen (a dead-letter count is kept) */
    long long guard_left; /* guarded deliveries left before the caller looks at going quiet */
} EntryTable;

static inline uint32_t coarse_ms(void);

static inline uint32_t
key_hash(int64_t ledger, int64_t entry, uint32_t mask)
{
    uint64_t x = (uint64_t)ledger * 0x9E3779B97F4A7C15ull ^ (uint64_t)entry;
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return (uint32_t)x & mask;
}

static inline int
rec_words(const Rec *r)
{
    return r->size > 64 ? (r->size + 63) / 64 : 0;
}

static inline int
bit_get(const Rec *r, int nacked, int32_t i)
{
    if (r->wide == NULL)
        return (int)(((nacked ? r->nacked : r->acked) >> i) & 1u);
    int words = rec_words(r);
    return (int)((r->wide[(nacked ? words : 0) + i / 64] >> (i % 64)) & 1u);
}

static inline void
bit_set(Rec *r, int nacked, int32_t i)
{
    if (r->wide == NULL) {
        if (nacked)
            r->nacked |= 1ull << i;
        else
            r->acked |= 1ull << i;
        return;
    }
    int words = rec_words(r);
    r->wide[(nacked ? words : 0) + i / 64] |= 1ull << (i % 64);
}

static inline void
bit_clear(Rec *r, int nacked, int32_t i)
{
    if (r->wide == NULL) {
        if (nacked)
            r->nacked &= ~(1ull << i);
        else
            r->acked &= ~(1ull << i);
        return;
    }
    int words = rec_words(r);
    r->wide[(nacked ? words : 0) + i / 64] &= ~(1ull << (i % 64));
}

/* 1 if A covers every member, 2 if only A | N does, 0 otherwise. */
static int
coverage(const Rec *r)
{
    if (r->size <= 0)
        return 1;
    if (r->wide == NULL) {
        uint64_t all = r->size == 64 ? ~0ull : (1ull << r->size) - 1;
        if ((r->acked & all) == all)
            return 1;
        return ((r->acked | r->nacked) & all) == all ? 2 : 0;
    }
    int words = rec_words(r), acked_all = 1;
    for (int w = 0; w < words; w++) {
        int bits = (w == words - 1 && r->size % 64) ? r->size % 64 : 64;
        uint64_t all = bits == 64 ? ~0ull : (1ull << bits) - 1;
        uint64_t a = r->wide[w] & all, n = r->wide[words + w] & all;
        if ((a | n) != all)
            return 0;
        if (a != all)
            acked_all = 0;
    }
    return acked_all ? 1 : 2;
}

/* 1 if some member of an open record is nacked. */
static int
has_nacked(const Rec *r)
{
    if (r->wide == NULL)
        return r->nacked != 0;
    int words = rec_words(r);
    for (int w = 0; w < words; w++)
        if (r->wide[words + w])
            return 1;
    return 0;
}

static uint32_t
table_find(EntryTable *t, int64_t ledger, int64_t entry)
{
    if (t->nbuckets == 0)
        return NIL;
    uint32_t i = t->buckets[key_hash(ledger, entry, t->nbuckets - 1)];
    while (i != NIL) {
        Rec *r = &t->recs[i];
        if (r->ledger == ledger && r->entry == entry)
            return i;
        i = r->next;
    }
    return NIL;
}

/* Grow the pool and the buckets (rehashing every used record); -1 on MemoryError. */
static int
table_grow(EntryTable *t)
{
    uint32_t cap = t->cap ? t->cap * 2 : 64;
    if (cap > (1u << 30)) {
        PyErr_SetString(PyExc_MemoryError, "EntryTable is full");
        return -1;
    }
    Rec *recs = PyMem_Realloc(t->recs, (size_t)cap * sizeof(Rec));
    if (recs == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    uint32_t *buckets = PyMem_Malloc((size_t)cap * sizeof(uint32_t));
    if (buckets == NULL) {
        t->recs = recs;
        PyErr_NoMemory();
        return -1;
    }
    memset(buckets, 0xFF, (size_t)cap * sizeof(uint32_t));
    /* the new slots join the free list, in index order */
    for (uint32_t i = t->cap; i < cap; i++) {
        recs[i].next = i + 1 < cap ? i + 1 : t->free_head;
        recs[i].gen = 0;
        recs[i].size = -1; /* free */
        recs[i].wide = NULL;
    }
    t->free_head = t->cap;
    /* rehash the used ones */
    for (uint32_t i = 0; i < t->cap; i++) {
        if (recs[i].size < 0)
            continue;
        uint32_t h = key_hash(recs[i].ledger, recs[i].entry, cap - 1);
        recs[i].next = buckets[h];
        buckets[h] = i;
    }
    PyMem_Free(t->buckets);
    t->recs = recs;
    t->buckets = buckets;
    t->cap = t->nbuckets = cap;
    return 0;
}

/* A new open record; NIL with an exception set on failure. */
static uint32_t
table_insert(EntryTable *t, int64_t ledger, int64_t entry, int32_t size)
{
    if (t->free_head == NIL && table_grow(t) < 0)
        return NIL;
    uint32_t i = t->free_head;
    Rec *r = &t->recs[i];
    uint64_t *wide = NULL;
    if (size > 64) {
        size_t words = (size_t)(size + 63) / 64;
        wide = PyMem_Calloc(2 * words, sizeof(uint64_t));
        if (wide == NULL) {
            PyErr_NoMemory();
            return NIL;
        }
        t->wide_bytes += (Py_ssize_t)(2 * words * sizeof(uint64_t));
    }
    t->free_head = r->next;
    r->ledger = ledger;
    r->entry = entry;
    r->size = size < 0 ? 0 : size;
    r->flags = 0;
    r->acked = r->nacked = 0;
    r->wide = wide;
    r->touched_ms = coarse_ms();
    r->last_read = -1;
    uint32_t h = key_hash(ledger, entry, t->nbuckets - 1);
    r->next = t->buckets[h];
    t->buckets[h] = i;
    t->used++;
    return i;
}

static void
table_delete(EntryTable *t, uint32_t i)
{
    Rec *r = &t->recs[i];
    uint32_t *link = &t->buckets[key_hash(r->ledger, r->entry, t->nbuckets - 1)];
    while (*link != i)
        link = &t->recs[*link].next;
    *link = r->next;
    if (r->wide != NULL) {
        t->wide_bytes -= (Py_ssize_t)(2 * (size_t)rec_words(r) * sizeof(uint64_t));
        PyMem_Free(r->wide);
        r->wide = NULL;
    }
    if (r->flags & F_SETTLED)
        t->settled--;
    r->size = -1;
    r->flags = 0;
    r->gen++;
    r->next = t->free_head;
    t->free_head = i;
    t->used--;
}

static uint32_t
monotonic_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint32_t)((uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u);
}

/* The monotonic clock at its coarse resolution (a few ms): cheap enough for every read. */
static inline uint32_t
coarse_ms(void)
{
#ifdef CLOCK_MONOTONIC_COARSE
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint32_t)((uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u);
#else
    return monotonic_ms();
#endif
}

/* Drop the oldest settlement of the ring (its record, unless freed and reused since). */
static void
ring_pop(EntryTable *t)
{
    uint64_t old = t->ring[t->ring_head];
    t->ring_head = (t->ring_head + 1) % t->ring_cap;
    t->ring_len--;
    uint32_t j = (uint32_t)(old >> 32), gen = (uint32_t)old;
    if (j < t->cap && t->recs[j].size >= 0 && t->recs[j].gen == gen && (t->recs[j].flags & F_SETTLED))
        table_delete(t, j);
}

/* Mark record i settled and put it in the ring, evicting the oldest settlement if full, and
 * with max_age_ms every settlement older than that: a slow consumer's table then stops
 * growing once its age is reached, not after settled_capacity settlements. */
static void
table_settle(EntryTable *t, uint32_t i)
{
    Rec *r = &t->recs[i];
    r->flags |= F_SETTLED;
    t->settled++;
    if (t->ring_cap == 0) {
        table_delete(t, i);
        return;
    }
    uint32_t now = t->max_age_ms ? monotonic_ms() : 0;
    if (t->ring_len == t->ring_cap)
        ring_pop(t);
    while (t->max_age_ms && t->ring_len && (uint32_t)(now - t->ring_ms[t->ring_head]) > t->max_age_ms)
        ring_pop(t);
    uint32_t tail = (t->ring_head + t->ring_len) % t->ring_cap;
    t->ring[tail] = (uint64_t)i << 32 | r->gen;
    if (t->max_age_ms)
        t->ring_ms[tail] = now;
    t->ring_len++;
}


/* ------------------------------------------------------------------ watched entries */

static PyObject *record(EntryTable *t, int64_t ledger, int64_t entry, int index, int size, int nacked, int create,
                        int foreign);

/* 1 if (ledger, entry) is at or below its ledger's mark (or every copy is watched). */
static int
is_watched(const EntryTable *t, int64_t ledger, int64_t entry)
{
    if (t->watch_all)
        return 1;
    for (uint32_t i = 0; i < t->nwatch; i++)
        if (t->watch[2 * i] == ledger)
            return entry <= t->watch[2 * i + 1];
    return 0;
}

/* Raise ledger's mark to entry; -1 on MemoryError. */
static int
watch_entry(EntryTable *t, int64_t ledger, int64_t entry)
{
    for (uint32_t i = 0; i < t->nwatch; i++)
        if (t->watch[2 * i] == ledger) {
            if (entry > t->watch[2 * i + 1])
                t->watch[2 * i + 1] = entry;
            return 0;
        }
    if (t->nwatch == t->watch_cap) {
        uint32_t cap = t->watch_cap ? 2 * t->watch_cap : 4;
        int64_t *grown = PyMem_Realloc(t->watch, (size_t)cap * 2 * sizeof(int64_t));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        t->watch = grown;
        t->watch_cap = cap;
    }
    t->watch[2 * t->nwatch] = ledger;
    t->watch[2 * t->nwatch + 1] = entry;
    t->nwatch++;
    return 0;
}

static int
parse_key(PyObject *args, int64_t *ledger, int64_t *entry, int *index, int *size)
{
    long long l, e;
    if (!PyArg_ParseTuple(args, "LLii", &l, &e, index, size))
        return -1;
    *ledger = l;
    *entry = e;
    return 0;
}

static PyObject *
EntryTable_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"settled_capacity", "settled_max_age_ms", NULL};
    int capacity = 0, max_age_ms = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i|i", names, &capacity, &max_age_ms))
        return NULL;
    if (capacity < 0 || capacity > (1 << 24)) {
        PyErr_SetString(PyExc_ValueError, "settled_capacity must be between 0 and 2**24");
        return NULL;
    }
    if (max_age_ms < 0 || max_age_ms > MAX_AGE_MS) {
        PyErr_SetString(PyExc_ValueError, "settled_max_age_ms must be between 0 and 2**30");
        return NULL;
    }
    EntryTable *t = (EntryTable *)type->tp_alloc(type, 0);
    if (t == NULL)
        return NULL;
    t->free_head = NIL;
    t->ring_cap = (uint32_t)capacity;
    t->max_age_ms = capacity ? (uint32_t)max_age_ms : 0;
    if (capacity) {
        t->ring = PyMem_Malloc((size_t)capacity * sizeof(uint64_t));
        t->ring_ms = t->max_age_ms ? PyMem_Malloc((size_t)capacity * sizeof(uint32_t)) : NULL;
        if (t->ring == NULL || (t->max_age_ms && t->ring_ms == NULL)) {
            Py_DECREF(t);
            return PyErr_NoMemory();
        }
    }
    return (PyObject *)t;
}

static void
EntryTable_free_all(EntryTable *t)
{
    for (uint32_t i = 0; i < t->cap; i++)
        if (t->recs[i].size >= 0 && t->recs[i].wide != NULL)
            PyMem_Free(t->recs[i].wide);
    PyMem_Free(t->recs);
    PyMem_Free(t->buckets);
    t->recs = NULL;
    t->buckets = NULL;
    t->cap = t->nbuckets = t->used = t->settled = 0;
    t->free_head = NIL;
    t->ring_head = t->ring_len = 0;
    t->wide_bytes = 0;
}

static void
EntryTable_dealloc(EntryTable *t)
{
    EntryTable_free_all(t);
    PyMem_Free(t->watch);
    PyMem_Free(t->ring);
    PyMem_Free(t->ring_ms);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

/* The verdict for member `index` of record i (NIL: none). */
static int
verdict_of(EntryTable *t, uint32_t i, int index)
{
    if (i == NIL)
        return V_FRESH;
    Rec *r = &t->recs[i];
    if ((r->flags & F_SETTLED) || index < 0 || r->size == 0)
        return (r->flags & F_SETTLED) ? V_ACKED : V_FRESH;
    if (index >= r->size)
        return V_FRESH;
    if (bit_get(r, 0, index))
        return V_ACKED;
    return bit_get(r, 1, index) ? V_NACKED : V_DELIVER;
}

/* The verdict for member (ledger, entry, index). */
static int
verdict(EntryTable *t, int64_t ledger, int64_t entry, int index)
{
    return verdict_of(t, table_find(t, ledger, entry), index);
}

/* A member of record i (NIL: none) was read; `given`: delivered to the application. */
static inline void
touch(EntryTable *t, uint32_t i, int index, int given)
{
    if (i == NIL)
        return;
    Rec *r = &t->recs[i];
    if ((r->flags & F_SETTLED) || r->size <= 0)
        return;
    r->touched_ms = coarse_ms();
    if (given && index >= 0 && index < r->size)
        r->last_read = index;
}

PyDoc_STRVAR(admit_doc,
"admit(message) -> (verdict, data)\n\n"
"Read a received _pulsar.Message's id (message_id().serialize(), as data) and say what\n"
"is known of it: 0 deliver, 1 acked, 2 nacked, 3 no record.");

static PyObject *
EntryTable_admit(EntryTable *t, PyObject *message)
{
    int64_t f[5];
    PyObject *data = read_message_id(message, f);
    if (data == NULL)
        return NULL;
    int v = verdict(t, f[0], f[1], (int)f[3]);
    return Py_BuildValue("(iN)", v, data);
}

PyDoc_STRVAR(admit_message_doc,
"admit_message(message, wrapper) -> int\n\n"
"admit() for a received _pulsar.Message whose pulsar.Message wrapper keeps the serialized\n"
"id (attribute _pulsar_nack_id). A copy with no record of an entry that is not watched\n"
"cannot be in a nack set: it is delivered here (0), the record of a batch entry opened.\n"
"Each delivery decided here counts guard_left down; the one that takes it to 0 or below\n"
"is 4 (deliver, and look at going quiet). Otherwise admit()'s verdict, for the caller's\n"
"screen. With watch_all set, always admit()'s verdict, nothing opened, nothing counted.");

/* admit_message() of a received _pulsar.Message and its wrapper: the verdict, or -1 with an exception set. */
static int
admit_copy(EntryTable *t, PyObject *message, PyObject *wrapper)
{
    int64_t f[5];
    if (!native_read(message, f)) { /* read natively, the id needs no keeping: ack_message() reads it again */
        PyObject *data = read_message_id(message, f);
        if (data == NULL)
            return -1;
        int stashed = PyObject_SetAttr(wrapper, str_stash, data);
        Py_DECREF(data);
        if (stashed < 0) { /* a wrapper without attributes keeps nothing, as msgid's stand-in */
            if (!PyErr_ExceptionMatches(PyExc_AttributeError))
                return -1;
            PyErr_Clear();
        }
    }
    uint32_t i = table_find(t, f[0], f[1]);
    int v = verdict_of(t, i, (int)f[3]);
    if (t->watch_all)
        return v;
    if (v == V_FRESH) {
        if (is_watched(t, f[0], f[1]))
            return v;
        if (f[3] >= 0 && f[4] > 0 && (i = table_insert(t, f[0], f[1], (int32_t)f[4])) == NIL)
            return -1;
        v = V_DELIVER;
    }
    touch(t, i, (int)f[3], v == V_DELIVER);
    if (v == V_DELIVER && --t->guard_left <= 0)
        v = V_DELIVER_LAST;
    return v;
}

static PyObject *
EntryTable_admit_message(EntryTable *t, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "admit_message(message, wrapper) takes two arguments");
        return NULL;
    }
    int v = admit_copy(t, args[0], args[1]);
    return v < 0 ? NULL : PyLong_FromLong(v);
}

#define ACK_COMPLETES 2 /* ack_watched_member(), ack_copy(): the ack would complete a watched entry */

/* The ack of member `index` of a watched entry, from record i: recorded here (1) only where the
 * caller's books cannot change: an open record without a member acked through a made-up id, the
 * member in neither bit set (every member of an open record in the caller's nack sets is marked
 * nacked), and the ack not completing the entry. 2, nothing recorded, where it would complete
 * the entry with a nacked member (the caller moves it to its complete set: ack_completing()).
 * Else 0, nothing recorded. */
static int
ack_watched_member(EntryTable *t, uint32_t i, int index)
{
    if (i == NIL || index < 0)
        return 0;
    Rec *r = &t->recs[i];
    if ((r->flags & (F_SETTLED | F_FOREIGN)) || index >= r->size || bit_get(r, 0, index) || bit_get(r, 1, index))
        return 0;
    bit_set(r, 0, index);
    switch (coverage(r)) {
    case 0:
        touch(t, i, index, 0);
        return 1;
    case 1: /* every member acked (none nacked): settled, as ack() does */
        table_settle(t, i);
        return 1;
    default: /* complete with nacked members: the caller's */
        bit_clear(r, 0, index);
        return ACK_COMPLETES;
    }
}

PyDoc_STRVAR(ack_message_doc,
"ack_message(wrapper) -> bool\n\n"
"Record the ack of a received message from the id admit_message() kept on its wrapper:\n"
"True (recorded, as ack()). False, and nothing recorded, when the caller must record it:\n"
"no id kept, watch_all set, its record holds a nacked member or one acked through a made-up\n"
"id; for a watched entry, unless the member's open record marks it neither acked nor nacked\n"
"and the ack leaves a member unsettled or settles the entry (every member acked).");

/* ack_message() of a wrapper, its id's fields read into f: 1 recorded, 2 the ack completes a watched
 * entry with a nacked member (nothing recorded: ack_completing()), 0 the caller's, -1 with an
 * exception set. */
static int
ack_copy(EntryTable *t, PyObject *wrapper, int64_t *f)
{
    if (t->watch_all)
        return 0;
    PyObject *data = kept_id(wrapper);
    if (data == NULL) {
        if (PyErr_Occurred())
            return -1;
        if (!native_read_wrapper(wrapper, f)) /* no id kept: one read natively, where the reader is on */
            return 0;
    } else if (!PyBytes_Check(data)) {
        Py_DECREF(data);
        return 0;
    } else {
        int parsed = parse((const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), f);
        Py_DECREF(data);
        if (parsed < 0)
            return -1;
    }
    uint32_t i = table_find(t, f[0], f[1]);
    if (is_watched(t, f[0], f[1]))
        return ack_watched_member(t, i, (int)f[3]);
    if (i != NIL && !(t->recs[i].flags & F_SETTLED) && ((t->recs[i].flags & F_FOREIGN) || has_nacked(&t->recs[i])))
        return 0;
    PyObject *outcome = record(t, f[0], f[1], (int)f[3], (int)f[4], 0, 1, 0);
    if (outcome == NULL)
        return -1;
    Py_DECREF(outcome);
    return 1;
}

static PyObject *
EntryTable_ack_message(EntryTable *t, PyObject *wrapper)
{
    int64_t f[5];
    int recorded = ack_copy(t, wrapper, f);
    return recorded < 0 ? NULL : PyBool_FromLong(recorded == 1);
}

PyDoc_STRVAR(ack_completing_doc,
"ack_completing(ledger, entry, index) -> bool\n\n"
"Record the ack of the member that completes a watched entry with a nacked member, when the\n"
"table says so (ack_message() left it to the caller for that reason): True, the record\n"
"dropped as ack() drops a complete one (the caller moves the entry to its complete set).\n"
"False, nothing recorded, in any other case.");

static PyObject *
EntryTable_ack_completing(EntryTable *t, PyObject *args)
{
    long long l, e;
    int index;
    if (!PyArg_ParseTuple(args, "LLi:ack_completing", &l, &e, &index))
        return NULL;
    if (t->watch_all || !is_watched(t, l, e))
        Py_RETURN_FALSE;
    uint32_t i = table_find(t, l, e);
    if (ack_watched_member(t, i, index) != ACK_COMPLETES)
        Py_RETURN_FALSE;
    table_delete(t, i);
    Py_RETURN_TRUE;
}

PyDoc_STRVAR(watch_doc, "watch(ledger, entry): copies and acks of this entry (and those below it in its ledger) go to the caller.");

/* The (ledger, entry) arguments of a METH_FASTCALL method *name*: 0, or -1 with an exception set.
 * Read directly: the nack calls watch() on every message, and PyArg_ParseTuple parses a format. */
static int
ledger_entry_args(PyObject *const *args, Py_ssize_t nargs, const char *name, long long *l, long long *e)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s() takes exactly 2 arguments (%zd given)", name, nargs);
        return -1;
    }
    if ((*l = PyLong_AsLongLong(args[0])) == -1 && PyErr_Occurred())
        return -1;
    if ((*e = PyLong_AsLongLong(args[1])) == -1 && PyErr_Occurred())
        return -1;
    return 0;
}

static PyObject *
EntryTable_watch(EntryTable *t, PyObject *const *args, Py_ssize_t nargs)
{
    long long l, e;
    if (ledger_entry_args(args, nargs, "watch", &l, &e) < 0)
        return NULL;
    if (watch_entry(t, l, e) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(watched_doc, "watched(ledger, entry) -> bool: whether copies of the entry go to the caller.");

static PyObject *
EntryTable_watched(EntryTable *t, PyObject *const *args, Py_ssize_t nargs)
{
    long long l, e;
    if (ledger_entry_args(args, nargs, "watched", &l, &e) < 0)
        return NULL;
    return PyBool_FromLong(is_watched(t, l, e));
}

PyDoc_STRVAR(unwatch_doc, "unwatch(): watch no entry (the caller has no nack state left).");

static PyObject *
EntryTable_unwatch(EntryTable *t, PyObject *unused)
{
    t->nwatch = 0;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(verdict_doc, "verdict(ledger, entry, index) -> int: admit()'s verdict for a known id.");

static PyObject *
EntryTable_verdict(EntryTable *t, PyObject *args)
{
    long long l, e;
    int index;
    if (!PyArg_ParseTuple(args, "LLi", &l, &e, &index))
        return NULL;
    return PyLong_FromLong(verdict(t, l, e, index));
}

PyDoc_STRVAR(open_doc, "open(ledger, entry, size): an open record for a batch entry, if it has none.");

static PyObject *
EntryTable_open(EntryTable *t, PyObject *args)
{
    long long l, e;
    int size;
    if (!PyArg_ParseTuple(args, "LLi", &l, &e, &size))
        return NULL;
    if (size > 0 && table_find(t, l, e) == NIL && table_insert(t, l, e, size) == NIL)
        return NULL;
    Py_RETURN_NONE;
}

/* Record an ack or a nack of (ledger, entry, index) in an entry of `size` members. */
static PyObject *
record(EntryTable *t, int64_t ledger, int64_t entry, int index, int size, int nacked, int create, int foreign)
{
    uint32_t i = table_find(t, ledger, entry);
    if (index < 0 || size <= 0) { /* a non-batched message */
        if (nacked || (i != NIL && t->recs[i].size > 0))
            return PyLong_FromLong(R_NONE);
        if (i != NIL)
            return PyLong_FromLong(R_NONE);
        if (!create)
            return PyLong_FromLong(R_MISSING);
        i = table_insert(t, ledger, entry, 0);
        if (i == NIL)
            return NULL;
        table_settle(t, i);
        return PyLong_FromLong(R_SETTLED);
    }
    if (i == NIL) {
        if (!create)
            return PyLong_FromLong(R_MISSING);
        i = table_insert(t, ledger, entry, size);
        if (i == NIL)
            return NULL;
    }
    Rec *r = &t->recs[i];
    if ((r->flags & F_SETTLED) || index >= r->size)
        return PyLong_FromLong(R_NONE);
    bit_set(r, nacked, index);
    if (foreign)
        r->flags |= F_FOREIGN;
    switch (coverage(r)) {
    case 1: {
        int was_foreign = (r->flags & F_FOREIGN) != 0;
        table_settle(t, i);
        return PyLong_FromLong(was_foreign ? R_SETTLED_FOREIGN : R_SETTLED);
    }
    case 2:
        table_delete(t, i);
        return PyLong_FromLong(R_COMPLETE);
    default:
        touch(t, i, index, 0);
        return PyLong_FromLong(R_NONE);
    }
}

PyDoc_STRVAR(ack_doc,
"ack(ledger, entry, index, size, create=True, foreign=False) -> int\n\n"
"Record an acked member: 0 nothing else, 1 the entry is settled, 2 settled and some member\n"
"was acked through a made-up id, 3 every member acked or nacked (record dropped), 4 no\n"
"record (create False). A non-batched message (index < 0) becomes a settled record.");

static PyObject *
EntryTable_ack(EntryTable *t, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"ledger", "entry", "index", "size", "create", "foreign", NULL};
    long long l, e;
    int index, size, create = 1, foreign = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "LLii|pp", names, &l, &e, &index, &size, &create, &foreign))
        return NULL;
    return record(t, l, e, index, size, 0, create, foreign);
}

PyDoc_STRVAR(ack_data_doc,
"ack_data(data, create=True) -> int: ack() for the serialized id of a received message.");

static PyObject *
EntryTable_ack_data(EntryTable *t, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"data", "create", NULL};
    PyObject *data;
    int create = 1;
    int64_t f[5];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!|p", names, &PyBytes_Type, &data, &create))
        return NULL;
    if (parse((const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), f) < 0)
        return NULL;
    return record(t, f[0], f[1], (int)f[3], (int)f[4], 0, create, 0);
}

PyDoc_STRVAR(nack_doc,
"nack(ledger, entry, index, size, create=True) -> int: record a nacked member of a batch\n"
"entry (as ack(); a non-batched message is not recorded).");

static PyObject *
EntryTable_nack(EntryTable *t, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"ledger", "entry", "index", "size", "create", NULL};
    long long l, e;
    int index, size, create = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "LLii|p", names, &l, &e, &index, &size, &create))
        return NULL;
    return record(t, l, e, index, size, 1, create, 0);
}

PyDoc_STRVAR(settle_doc, "settle(ledger, entry): a settled record for an entry whose every member is acked.");

static PyObject *
EntryTable_settle(EntryTable *t, PyObject *args)
{
    long long l, e;
    if (!PyArg_ParseTuple(args, "LL", &l, &e))
        return NULL;
    uint32_t i = table_find(t, l, e);
    if (i != NIL && (t->recs[i].flags & F_SETTLED))
        Py_RETURN_NONE;
    if (i != NIL)
        table_delete(t, i);
    i = table_insert(t, l, e, 0);
    if (i == NIL)
        return NULL;
    table_settle(t, i);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(note_read_doc, "note_read(ledger, entry, index): the caller delivered this member of an open record to the application.");

static PyObject *
EntryTable_note_read(EntryTable *t, PyObject *args)
{
    long long l, e;
    int index;
    if (!PyArg_ParseTuple(args, "LLi", &l, &e, &index))
        return NULL;
    touch(t, table_find(t, l, e), index, 1);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(busy_doc,
"busy(ledger, entry, drain_ms, held_ms) -> bool\n\n"
"True if the application may still settle members of the entry here: it has an open record\n"
"(a member unsettled) and the member last delivered is unsettled and was given less than\n"
"held_ms ago, or a member was read, delivered or settled less than drain_ms ago.");

static PyObject *
EntryTable_busy(EntryTable *t, PyObject *args)
{
    long long l, e;
    int drain_ms, held_ms;
    if (!PyArg_ParseTuple(args, "LLii", &l, &e, &drain_ms, &held_ms))
        return NULL;
    if (drain_ms < 0 || held_ms < 0) {
        PyErr_SetString(PyExc_ValueError, "drain_ms and held_ms must be >= 0");
        return NULL;
    }
    uint32_t i = table_find(t, l, e);
    if (i == NIL || (t->recs[i].flags & F_SETTLED) || t->recs[i].size <= 0)
        Py_RETURN_FALSE;
    Rec *r = &t->recs[i];
    uint32_t idle = coarse_ms() - r->touched_ms;
    int held = r->last_read >= 0 && !bit_get(r, 0, r->last_read) && !bit_get(r, 1, r->last_read);
    return PyBool_FromLong(idle < (uint32_t)(held ? held_ms : drain_ms));
}

PyDoc_STRVAR(size_of_doc, "size_of(ledger, entry) -> int: the batch size of an open record, else 0.");

static PyObject *
EntryTable_size_of(EntryTable *t, PyObject *args)
{
    long long l, e;
    if (!PyArg_ParseTuple(args, "LL", &l, &e))
        return NULL;
    uint32_t i = table_find(t, l, e);
    return PyLong_FromLong(i == NIL || (t->recs[i].flags & F_SETTLED) ? 0 : t->recs[i].size);
}

/* Delete every record for which keep() is false. */
static void
table_sweep(EntryTable *t, int (*keep)(const Rec *))
{
    for (uint32_t i = 0; i < t->cap; i++)
        if (t->recs[i].size >= 0 && !keep(&t->recs[i]))
            table_delete(t, i);
    if (t->settled == 0)
        t->ring_head = t->ring_len = 0;
}

static int
keep_open(const Rec *r)
{
    return !(r->flags & F_SETTLED);
}

static int
keep_nacked(const Rec *r)
{
    return !(r->flags & F_SETTLED) && has_nacked(r);
}

PyDoc_STRVAR(forget_settled_doc, "forget_settled(): drop every settled record.");

static PyObject *
EntryTable_forget_settled(EntryTable *t, PyObject *unused)
{
    table_sweep(t, keep_open);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(sweep_doc, "sweep(): drop every record without a nacked member (settled ones too).");

static PyObject *
EntryTable_sweep(EntryTable *t, PyObject *unused)
{
    table_sweep(t, keep_nacked);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(clear_nacks_doc, "clear_nacks(): forget the nacked members of every open record.");

static PyObject *
EntryTable_clear_nacks(EntryTable *t, PyObject *unused)
{
    for (uint32_t i = 0; i < t->cap; i++) {
        Rec *r = &t->recs[i];
        if (r->size < 0)
            continue;
        if (r->wide == NULL)
            r->nacked = 0;
        else
            memset(r->wide + rec_words(r), 0, (size_t)rec_words(r) * sizeof(uint64_t));
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(clear_doc, "clear(): drop every record.");

static PyObject *
EntryTable_clear(EntryTable *t, PyObject *unused)
{
    EntryTable_free_all(t);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(counts_doc, "counts() -> (open, settled): the records of each kind.");

static PyObject *
EntryTable_counts(EntryTable *t, PyObject *unused)
{
    return Py_BuildValue("(II)", t->used - t->settled, t->settled);
}

PyDoc_STRVAR(memory_doc, "memory_bytes() -> int: the bytes the table holds (pool, buckets, ring, wide bit sets).");

static PyObject *
EntryTable_memory_bytes(EntryTable *t, PyObject *unused)
{
    return PyLong_FromSsize_t((Py_ssize_t)t->cap * (Py_ssize_t)(sizeof(Rec) + sizeof(uint32_t)) +
                              (Py_ssize_t)t->ring_cap * (Py_ssize_t)(sizeof(uint64_t) + (t->ring_ms ? sizeof(uint32_t) : 0)) +
                              t->wide_bytes +
                              (Py_ssize_t)sizeof(EntryTable));
}

PyDoc_STRVAR(check_doc, "_check(): assert the invariants (AssertionError if broken). For tests.");

static PyObject *
EntryTable_check(EntryTable *t, PyObject *unused)
{
    uint32_t used = 0, settled = 0, chained = 0, freed = 0;
    for (uint32_t i = 0; i < t->cap; i++) {
        const Rec *r = &t->recs[i];
        if (r->size < 0)
            continue;
        used++;
        settled += (r->flags & F_SETTLED) != 0;
        /* findable by its key; an open record of a batch entry is not yet covered */
        if (table_find(t, r->ledger, r->entry) != i)
            goto bad;
        if (!(r->flags & F_SETTLED) && (r->size == 0 || coverage(r) != 0))
            goto bad;
        if ((r->size > 64) != (r->wide != NULL))
            goto bad;
    }
    for (uint32_t b = 0; b < t->nbuckets; b++)
        for (uint32_t i = t->buckets[b]; i != NIL; i = t->recs[i].next)
            chained++;
    for (uint32_t i = t->free_head; i != NIL; i = t->recs[i].next)
        freed++;
    /* counts agree; every record is chained once, every other slot is free */
    if (used != t->used || settled != t->settled || chained != used || freed != t->cap - used)
        goto bad;
    /* every settled record has its pair in the ring */
    if (settled > t->ring_len)
        goto bad;
    Py_RETURN_NONE;
bad:
    PyErr_SetString(PyExc_AssertionError, "EntryTable invariant broken");
    return NULL;
}

static Py_ssize_t
EntryTable_len(EntryTable *t)
{
    return (Py_ssize_t)t->used;
}

static PySequenceMethods EntryTable_as_sequence = {
    .sq_length = (lenfunc)EntryTable_len,
};

static PyMethodDef EntryTable_methods[] = {
    {"admit", (PyCFunction)EntryTable_admit, METH_O, admit_doc},
    {"admit_message", (PyCFunction)(void (*)(void))EntryTable_admit_message, METH_FASTCALL, admit_message_doc},
    {"ack_message", (PyCFunction)EntryTable_ack_message, METH_O, ack_message_doc},
    {"ack_completing", (PyCFunction)EntryTable_ack_completing, METH_VARARGS, ack_completing_doc},
    {"watch", (PyCFunction)(void (*)(void))EntryTable_watch, METH_FASTCALL, watch_doc},
    {"watched", (PyCFunction)(void (*)(void))EntryTable_watched, METH_FASTCALL, watched_doc},
    {"unwatch", (PyCFunction)EntryTable_unwatch, METH_NOARGS, unwatch_doc},
    {"verdict", (PyCFunction)EntryTable_verdict, METH_VARARGS, verdict_doc},
    {"open", (PyCFunction)EntryTable_open, METH_VARARGS, open_doc},
    {"ack", (PyCFunction)(void (*)(void))EntryTable_ack, METH_VARARGS | METH_KEYWORDS, ack_doc},
    {"ack_data", (PyCFunction)(void (*)(void))EntryTable_ack_data, METH_VARARGS | METH_KEYWORDS, ack_data_doc},
    {"nack", (PyCFunction)(void (*)(void))EntryTable_nack, METH_VARARGS | METH_KEYWORDS, nack_doc},
    {"settle", (PyCFunction)EntryTable_settle, METH_VARARGS, settle_doc},
    {"size_of", (PyCFunction)EntryTable_size_of, METH_VARARGS, size_of_doc},
    {"note_read", (PyCFunction)EntryTable_note_read, METH_VARARGS, note_read_doc},
    {"busy", (PyCFunction)EntryTable_busy, METH_VARARGS, busy_doc},
    {"forget_settled", (PyCFunction)EntryTable_forget_settled, METH_NOARGS, forget_settled_doc},
    {"sweep", (PyCFunction)EntryTable_sweep, METH_NOARGS, sweep_doc},
    {"clear_nacks", (PyCFunction)EntryTable_clear_nacks, METH_NOARGS, clear_nacks_doc},
    {"clear", (PyCFunction)EntryTable_clear, METH_NOARGS, clear_doc},
    {"counts", (PyCFunction)EntryTable_counts, METH_NOARGS, counts_doc},
    {"memory_bytes", (PyCFunction)EntryTable_memory_bytes, METH_NOARGS, memory_doc},
    {"_check", (PyCFunction)EntryTable_check, METH_NOARGS, check_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef EntryTable_members[] = {
    {"watch_all", T_BOOL, offsetof(EntryTable, watch_all), 0,
     "True: admit_message() and ack_message() leave every copy and ack to the caller."},
    {"guard_left", T_LONGLONG, offsetof(EntryTable, guard_left), 0,
     "Guarded deliveries left before the caller looks at going quiet (admit_message() counts it down)."},
    {NULL},
};

static PyTypeObject EntryTable_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pulsar_nack.consumer._msgid.EntryTable",
    .tp_doc = PyDoc_STR("EntryTable(settled_capacity, settled_max_age_ms=0): acked and nacked members of batch entries in flight, "
                        "and the last settled entries (C version)."),
    .tp_basicsize = sizeof(EntryTable),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = EntryTable_new,
    .tp_dealloc = (destructor)EntryTable_dealloc,
    .tp_methods = EntryTable_methods,
    .tp_members = EntryTable_members,
    .tp_as_sequence = &EntryTable_as_sequence,
};

/* ------------------------------------------------------------------ Gate
 *
 * The blocking consumer's common paths of receive and acknowledge (blocking.py), in one C call
 * each: while its ledger is quiet (screening NONE) or guards with this table alone (TABLE),
 * receive() is the client's receive, the pulsar.Message around it (as pulsar.Consumer.receive
 * builds it), the ledger's count and the table's verdict; acknowledge() is the table's record
 * and the client's acknowledge. What it cannot decide goes back to the Python paths: receive()
 * returns the copy it received with its verdict, for the screen, or None without receiving
 * anything (the ledger screens in Python, or a timeout Python must refuse); acknowledge()
 * returns False, nothing done. A Gate keeps no copy between calls: threads share it, and a copy
 * kept for a later call could be taken by another thread's receive, or replaced by it and lost. The ledger's attribute `screening` is read on every call, after the receive
 * too: a nack on another thread may start guarding while this one waits.
 */

typedef struct {
    PyObject_HEAD
    PyObject *receive, *acknowledge; /* the _pulsar.Consumer's */
    PyObject *message_type, *schema; /* pulsar.Message, and the consumer's schema */
    PyObject *ledger, *quiet, *guarding; /* the AdmissionLedger; Screening.NONE and Screening.TABLE */
    PyObject *table;                 /* the ledger's EntryTable */
    PyObject *received, *acked;      /* the core's counters (itertools.count) */
    PyObject *complete;              /* the ledger's note_completing_ack, or None */
} Gate;

static PyObject *str_screening, *str_schema;

static PyObject *
Gate_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"receive", "acknowledge", "message_type", "schema", "ledger", "quiet", "guarding",
                            "table", "received", "acked", "complete", NULL};
    PyObject *o[11];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOOO!OOO", names, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                                     &o[6], &EntryTable_Type, &o[7], &o[8], &o[9], &o[10]))
        return NULL;
    if (!PyType_Check(o[2])) {
        PyErr_SetString(PyExc_TypeError, "message_type must be a type");
        return NULL;
    }
    Gate *g = (Gate *)type->tp_alloc(type, 0);
    if (g == NULL)
        return NULL;
    PyObject **slots[11] = {&g->receive, &g->acknowledge, &g->message_type, &g->schema, &g->ledger,
                            &g->quiet, &g->guarding, &g->table, &g->received, &g->acked, &g->complete};
    for (int k = 0; k < 11; k++)
        *slots[k] = Py_NewRef(o[k]);
    return (PyObject *)g;
}

/* Every reference a Gate holds, for traverse and clear. */
#define GATE_REFS(X) X(receive) X(acknowledge) X(message_type) X(schema) X(ledger) X(quiet) X(guarding) X(table) \
    X(received) X(acked) X(complete)

static int
Gate_traverse(Gate *g, visitproc visit, void *arg)
{
#define GATE_VISIT(field) Py_VISIT(g->field);
    GATE_REFS(GATE_VISIT)
#undef GATE_VISIT
    return 0;
}

static int
Gate_clear(Gate *g)
{
#define GATE_CLEAR(field) Py_CLEAR(g->field);
    GATE_REFS(GATE_CLEAR)
#undef GATE_CLEAR
    return 0;
}

static void
Gate_dealloc(Gate *g)
{
    PyObject_GC_UnTrack(g);
    Gate_clear(g);
    Py_TYPE(g)->tp_free((PyObject *)g);
}

/* 1 quiet, 2 guarding with the table alone, 0 the Python screen's, -1 with an exception set. */
static int
gate_mode(Gate *g)
{
    PyObject *screening = PyObject_GetAttr(g->ledger, str_screening);
    if (screening == NULL)
        return -1;
    int mode = screening == g->quiet ? 1 : screening == g->guarding ? 2 : 0;
    Py_DECREF(screening);
    return mode;
}

/* next(counter), the result dropped; -1 with an exception set. */
static int
count(PyObject *counter)
{
    PyObject *n = PyIter_Next(counter);
    if (n == NULL)
        return PyErr_Occurred() ? -1 : 0;
    Py_DECREF(n);
    return 0;
}

static long long
monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The pulsar.Message around a received _pulsar.Message, as pulsar.Consumer.receive builds it. */
static PyObject *
wrap_received(Gate *g, PyObject *raw)
{
    PyObject *message = PyObject_CallNoArgs(g->message_type);
    if (message == NULL)
        return NULL;
    if (PyObject_SetAttr(message, str_inner, raw) < 0 || PyObject_SetAttr(message, str_schema, g->schema) < 0) {
        Py_DECREF(message);
        return NULL;
    }
    return message;
}

PyDoc_STRVAR(Gate_receive_doc,
"receive(timeout_millis=None) -> pulsar.Message, (message, verdict, start_ns) or None\n\n"
"The next message, when the gate decides it is the application's. A tuple: the copy received,\n"
"left to the Python screen, with its table verdict (None: not screened, not counted) and when\n"
"the receive began (time.monotonic_ns(); 0 without a timeout). None: nothing received (the\n"
"ledger screens in Python, or the timeout is not an int from 0 to 2**31-1).");

static PyObject *
Gate_receive(Gate *g, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "receive(timeout_millis=None) takes at most one argument");
        return NULL;
    }
    PyObject *timeout = nargs ? args[0] : Py_None;
    long long start_ns = 0;
    if (timeout != Py_None) {
        if (!PyLong_CheckExact(timeout))
            Py_RETURN_NONE;
        int overflow;
        long long ms = PyLong_AsLongLongAndOverflow(timeout, &overflow);
        if (overflow || ms < 0 || ms > INT32_MAX)
            Py_RETURN_NONE; /* Python's check names the argument */
        start_ns = monotonic_ns();
    }
    int mode = gate_mode(g);
    if (mode <= 0)
        return mode < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *raw = timeout == Py_None ? PyObject_CallNoArgs(g->receive) : PyObject_CallOneArg(g->receive, timeout);
    if (raw == NULL)
        return NULL;
    PyObject *message = wrap_received(g, raw);
    if (message == NULL || (mode = gate_mode(g)) < 0) { /* MemoryError: the copy comes back after a reconnect */
        Py_XDECREF(message);
        Py_DECREF(raw);
        return NULL;
    }
    int v = -1; /* not screened here: the Python screen counts it */
    if (mode && (count(g->received) < 0 || (v = mode == 2 ? admit_copy((EntryTable *)g->table, raw, message) : V_DELIVER) < 0))
        Py_CLEAR(message);
    Py_DECREF(raw);
    if (message == NULL)
        return NULL;
    if (v == V_DELIVER)
        return message;
    /* to this caller: another thread's receive may be on its way through here meanwhile */
    return v < 0 ? Py_BuildValue("(NOL)", message, Py_None, start_ns) : Py_BuildValue("(NiL)", message, v, start_ns);
}

PyDoc_STRVAR(Gate_acknowledge_doc,
"acknowledge(message) -> bool\n\n"
"Acknowledge a received pulsar.Message (its exact type) while the ledger is quiet, or while\n"
"it guards when the table records the ack (ack_message()) or, for the member that completes a\n"
"watched entry with a nacked member, the ledger's complete(ledger, entry, index) does: True.\n"
"Else False, nothing done.");

/* complete(ledger, entry, index) for the ack of fields f that the table left to the ledger: 1 recorded,
 * 0 not (the Python path's), -1 with an exception set. */
static int
complete_entry(Gate *g, const int64_t *f)
{
    if (g->complete == Py_None)
        return 0;
    PyObject *done = PyObject_CallFunction(g->complete, "LLi", (long long)f[0], (long long)f[1], (int)f[3]);
    if (done == NULL)
        return -1;
    int recorded = PyObject_IsTrue(done);
    Py_DECREF(done);
    return recorded;
}

static PyObject *
Gate_acknowledge(Gate *g, PyObject *message)
{
    if (Py_TYPE(message) != (PyTypeObject *)g->message_type)
        Py_RETURN_FALSE;
    int mode = gate_mode(g);
    if (mode == 2) {
        int64_t f[5];
        int recorded = ack_copy((EntryTable *)g->table, message, f);
        if (recorded == ACK_COMPLETES) /* the ledger's step */
            recorded = complete_entry(g, f);
        mode = recorded < 0 ? -1 : recorded ? 2 : 0;
    }
    if (mode <= 0)
        return mode < 0 ? NULL : Py_NewRef(Py_False);
    PyObject *raw = PyObject_GetAttr(message, str_inner);
    if (raw == NULL)
        return NULL;
    PyObject *done = PyObject_CallOneArg(g->acknowledge, raw);
    Py_DECREF(raw);
    if (done == NULL)
        return NULL;
    Py_DECREF(done);
    if (count(g->acked) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

static PyMethodDef Gate_methods[] = {
    {"receive", (PyCFunction)(void (*)(void))Gate_receive, METH_FASTCALL, Gate_receive_doc},
    {"acknowledge", (PyCFunction)Gate_acknowledge, METH_O, Gate_acknowledge_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject Gate_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pulsar_nack.consumer._msgid.Gate",
    .tp_doc = PyDoc_STR("Gate(receive, acknowledge, message_type, schema, ledger, quiet, guarding, table, received, acked, "
                        "complete): "
                        "a blocking consumer's common receive and acknowledge, in C."),
    .tp_basicsize = sizeof(Gate),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Gate_new,
    .tp_dealloc = (destructor)Gate_dealloc,
    .tp_traverse = (traverseproc)Gate_traverse,
    .tp_clear = (inquiry)Gate_clear,
    .tp_methods = Gate_methods,
};

/* ------------------------------------------------------------------ the ack timeout's logs
 *
 * AckTimeout (ack_timeout.py) logs received messages in one list (log_received, which
 * converts the log on the receiving thread past a limit) and acknowledged ones in another;
 * its timer thread takes both every tick. The receive-then-ack pattern settles the
 * last message logged: settle_logged drops it from the received log at once (it is freed by
 * the ack, as without an ack timeout), in one C call, atomic under the GIL against appends,
 * other settles and take_log. */

PyDoc_STRVAR(log_received_doc,
"log_received(received: list, limit: int, convert, message) -> None\n\n"
"A received message: appended to *received*; if the log is then longer than *limit*,\n"
"convert() is called (on this thread). O(1) but for convert.");

static PyObject *
log_received(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyList_CheckExact(args[0]) || !PyLong_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "log_received(received: list, limit: int, convert, message)");
        return NULL;
    }
    if (PyList_Append(args[0], args[3]) < 0)
        return NULL;
    Py_ssize_t limit = PyLong_AsSsize_t(args[1]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    if (PyList_GET_SIZE(args[0]) > limit) {
        PyObject *result = PyObject_CallNoArgs(args[2]);
        if (result == NULL)
            return NULL;
        Py_DECREF(result);
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(settle_logged_doc,
"settle_logged(received: list, settled: list, message) -> None\n\n"
"An acknowledged message: removed from *received* if it is its last entry, else appended\n"
"to *settled*. Atomic under the GIL. O(1).");

static PyObject *
settle_logged(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "settle_logged(received: list, settled: list, message)");
        return NULL;
    }
    PyObject *received = args[0];
    Py_ssize_t n = PyList_GET_SIZE(received);
    if (n > 0 && PyList_GET_ITEM(received, n - 1) == args[2]) {
        /* The caller holds a reference to the message: no deallocation (no Python code) here. */
        if (PyList_SetSlice(received, n - 1, n, NULL) < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    if (PyList_Append(args[1], args[2]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(take_log_doc,
"take_log(log: list) -> list\n\n"
"The entries of *log*, removed from it, in one step atomic under the GIL. O(n).");

static PyObject *
take_log(PyObject *module, PyObject *log)
{
    if (!PyList_CheckExact(log)) {
        PyErr_SetString(PyExc_TypeError, "take_log(log: list)");
        return NULL;
    }
    PyObject *taken = PyList_GetSlice(log, 0, PyList_GET_SIZE(log));
    if (taken == NULL)
        return NULL;
    /* From here no allocation the GC could run on, and no deallocation (taken holds every
     * entry): no Python code runs, so nothing is appended or settled in between. */
    if (PyList_SetSlice(log, 0, PyList_GET_SIZE(log), NULL) < 0) {
        Py_DECREF(taken);
        return NULL;
    }
    return taken;
}

static PyMethodDef methods[] = {
    {"log_received", (PyCFunction)(void (*)(void))log_received, METH_FASTCALL, log_received_doc},
    {"settle_logged", (PyCFunction)(void (*)(void))settle_logged, METH_FASTCALL, settle_logged_doc},
    {"take_log", take_log, METH_O, take_log_doc},
    {"parse_id", parse_id, METH_O, parse_id_doc},
    {"message_key", message_key, METH_O, message_key_doc},
    {"received_key", (PyCFunction)(void (*)(void))received_key, METH_FASTCALL, received_key_doc},
    NATIVE_METHODS
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "pulsar_nack.consumer._msgid",
    "A received message's id in one serialize() call, parsed in C.", -1, methods,
};

/* PyModule_AddObject, stealing *table* whether it succeeds or not (NULL: the error is set). */
static int
add_table(PyObject *module, const char *name, PyObject *table)
{
    if (table == NULL)
        return -1;
    if (PyModule_AddObject(module, name, table) < 0) {
        Py_DECREF(table);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC
PyInit__msgid(void)
{
    str_message_id = PyUnicode_InternFromString("message_id");
    str_serialize = PyUnicode_InternFromString("serialize");
    str_topic_name = PyUnicode_InternFromString("topic_name");
    str_stash = PyUnicode_InternFromString("_pulsar_nack_id");
    str_inner = PyUnicode_InternFromString("_message");
    str_screening = PyUnicode_InternFromString("screening");
    str_schema = PyUnicode_InternFromString("_schema");
    if (!str_message_id || !str_serialize || !str_topic_name || !str_stash || !str_inner || !str_screening || !str_schema)
        return NULL;
    if (PyType_Ready(&EntryTable_Type) < 0 || PyType_Ready(&Gate_Type) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    Py_INCREF(&EntryTable_Type);
    if (PyModule_AddObject(module, "EntryTable", (PyObject *)&EntryTable_Type) < 0) {
        Py_DECREF(&EntryTable_Type);
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&Gate_Type);
    if (PyModule_AddObject(module, "Gate", (PyObject *)&Gate_Type) < 0) {
        Py_DECREF(&Gate_Type);
        Py_DECREF(module);
        return NULL;
    }
    PyObject *verdicts = Py_BuildValue("{sisisisisi}", "DELIVER", V_DELIVER, "ACKED", V_ACKED, "NACKED", V_NACKED,
                                       "FRESH", V_FRESH, "DELIVER_LAST", V_DELIVER_LAST);
    PyObject *outcomes = Py_BuildValue("{sisisisisi}", "NONE", R_NONE, "SETTLED", R_SETTLED, "SETTLED_FOREIGN",
                                       R_SETTLED_FOREIGN, "COMPLETE", R_COMPLETE, "MISSING", R_MISSING);
    if (add_table(module, "VERDICTS", verdicts) < 0 || add_table(module, "OUTCOMES", outcomes) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
