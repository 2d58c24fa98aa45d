/* The structure check of a Kafka v2 record section, for the broker's produce path.
 *
 * A Kafka producer's batch is stored as sent, and our readers (records/kafka_records.py)
 * decode it record by record. The broker must refuse, before anything is written, a
 * section those readers would refuse: this walks the varint-framed records once, in C,
 * and checks what the reader checks (and a little more), without building any object.
 *
 *   check_records(section, count) -> None | str
 *
 * ``section`` is the uncompressed record section (any buffer), ``count`` the batch's
 * record count. None when the section holds exactly ``count`` well-formed records and
 * nothing after them; otherwise a sentence saying what is wrong (the caller raises).
 *
 * A record, every integer a zigzag varint (Kafka's varint and varlong):
 *   length, attributes (1 byte), timestamp delta, offset delta (= its index),
 *   key length (< 0: null), key, value length (< 0: null), value,
 *   header count (>= 0), then per header: key length (>= 0), key (UTF-8),
 *   value length (< 0: null), value; the fields fill exactly ``length`` bytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>

#define PROBLEM_SIZE 160

typedef struct {
    const unsigned char *buf;
    Py_ssize_t pos;
    Py_ssize_t end; /* the current record's end: no field reads past it */
} cursor;

/* A zigzag varint of at most 10 bytes that does not overflow 64 bits; 0 if it runs past
 * the cursor's end or is malformed. */
static inline int read_varint(cursor *c, int64_t *out) {
    if (c->pos < c->end && !(c->buf[c->pos] & 0x80)) { /* most fields: one byte */
        unsigned char byte = c->buf[c->pos++];
        *out = (int64_t)(byte >> 1) ^ -(int64_t)(byte & 1);
        return 1;
    }
    uint64_t raw = 0;
    int shift = 0;
    for (;;) {
        if (c->pos >= c->end) {
            return 0;
        }
        unsigned char byte = c->buf[c->pos++];
        if (shift == 63 && (byte & 0x7E)) {
            return 0; /* bits past the 64th */
        }
        raw |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) {
            *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
            return 1;
        }
        shift += 7;
        if (shift > 63) {
            return 0;
        }
    }
}

/* A blob's length and bytes: ``min_length`` -1 allows null (any negative length, as the
 * reader takes it), 0 does not. Sets *start and *length (0 for null). */
static inline int read_blob(cursor *c, int64_t min_length, Py_ssize_t *start, Py_ssize_t *length) {
    int64_t n;
    if (!read_varint(c, &n) || (n < 0 && min_length >= 0)) {
        return 0;
    }
    if (n < 0) {
        *start = c->pos;
        *length = 0;
        return 1;
    }
    if (n > (int64_t)(c->end - c->pos)) {
        return 0;
    }
    *start = c->pos;
    *length = (Py_ssize_t)n;
    c->pos += (Py_ssize_t)n;
    return 1;
}

/* Strict UTF-8, as Python's decoder: no overlong forms, surrogates or code points past
 * U+10FFFF. */
static inline int utf8_ok(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char b = s[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        int more;
        unsigned char lo = 0x80, hi = 0xBF;
        if (b >= 0xC2 && b <= 0xDF) {
            more = 1;
        } else if (b >= 0xE0 && b <= 0xEF) {
            more = 2;
            if (b == 0xE0) lo = 0xA0;
            if (b == 0xED) hi = 0x9F;
        } else if (b >= 0xF0 && b <= 0xF4) {
            more = 3;
            if (b == 0xF0) lo = 0x90;
            if (b == 0xF4) hi = 0x8F;
        } else {
            return 0;
        }
        if (n - i <= more) {
            return 0;
        }
        if (s[i + 1] < lo || s[i + 1] > hi) {
            return 0;
        }
        for (int k = 2; k <= more; k++) {
            if ((s[i + k] & 0xC0) != 0x80) {
                return 0;
            }
        }
        i += more + 1;
    }
    return 1;
}

/* NULL when the section is well formed; otherwise writes the problem into ``problem``. */
static const char *check(const unsigned char *buf, Py_ssize_t size, int64_t count,
                         char *problem) {
    cursor c = {buf, 0, size};
    for (int64_t index = 0; index < count; index++) {
        int64_t length, timestamp_delta, offset_delta, header_count;
        Py_ssize_t start, n;
        c.end = size;
        if (c.pos >= size) {
            snprintf(problem, PROBLEM_SIZE,
                     "Kafka record section ends after %lld of %lld records", (long long)index,
                     (long long)count);
            return problem;
        }
        if (!read_varint(&c, &length) || length < 0 || length > (int64_t)(size - c.pos)) {
            snprintf(problem, PROBLEM_SIZE, "Kafka record %lld overruns the batch",
                     (long long)index);
            return problem;
        }
        c.end = c.pos + (Py_ssize_t)length;
        if (c.pos >= c.end) {
            goto malformed;
        }
        c.pos++; /* attributes: unused in v2 */
        if (!read_varint(&c, &timestamp_delta) || !read_varint(&c, &offset_delta)) {
            goto malformed;
        }
        if (offset_delta != index) {
            snprintf(problem, PROBLEM_SIZE, "Kafka record %lld has offset delta %lld",
                     (long long)index, (long long)offset_delta);
            return problem;
        }
        if (!read_blob(&c, -1, &start, &n) || !read_blob(&c, -1, &start, &n)) {
            goto malformed;
        }
        if (!read_varint(&c, &header_count) || header_count < 0) {
            goto malformed;
        }
        for (int64_t h = 0; h < header_count; h++) {
            if (!read_blob(&c, 0, &start, &n)) {
                goto malformed;
            }
            if (!utf8_ok(buf + start, n)) {
                snprintf(problem, PROBLEM_SIZE, "Kafka record %lld has a header key not UTF-8",
                         (long long)index);
                return problem;
            }
            if (!read_blob(&c, -1, &start, &n)) {
                goto malformed;
            }
        }
        if (c.pos != c.end) {
            snprintf(problem, PROBLEM_SIZE, "Kafka record %lld disagrees with its length",
                     (long long)index);
            return problem;
        }
        continue;
    malformed:
        snprintf(problem, PROBLEM_SIZE,
                 "Kafka record %lld is malformed: a field runs past the record's length",
                 (long long)index);
        return problem;
    }
    if (c.pos != size) {
        snprintf(problem, PROBLEM_SIZE,
                 "Kafka record section has %lld trailing bytes after its %lld records",
                 (long long)(size - c.pos), (long long)count);
        return problem;
    }
    return NULL;
}

static PyObject *check_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "check_records(section, count) takes 2 arguments");
        return NULL;
    }
    long long count = PyLong_AsLongLong(args[1]);
    if (count == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    char problem[PROBLEM_SIZE];
    const char *found;
    /* the GIL stays held: a batch takes microseconds, and taking the GIL back could wait a
     * whole switch interval behind another thread, on the broker's event loop */
    found = check((const unsigned char *)view.buf, view.len, (int64_t)count, problem);
    PyBuffer_Release(&view);
    if (found == NULL) {
        Py_RETURN_NONE;
    }
    return PyUnicode_FromString(found);
}

static PyMethodDef methods[] = {
    {"check_records", (PyCFunction)(void (*)(void))check_records, METH_FASTCALL,
     "check_records(section, count) -> None | str: None when the uncompressed Kafka v2\n"
     "record section holds exactly count well-formed records, else what is wrong."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_kafka_check",
    .m_doc = "The structure check of a Kafka v2 record section (compiled: no per-record Python).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__kafka_check(void) { return PyModule_Create(&module_def); }
