/* The loop turn of engine.eventloop.StreamSelector in C, and `Kept`, the reads of a streaming body
 * kept with their stamps until the body may have ended.
 *
 * `poll`: epoll_wait, then every ready joined socket read; a read its connection keeps (a token's
 * chunk) is copied into the connection's `Kept` with its stamp, anything else goes to the
 * connection's Python code; what is left for asyncio is returned. While a wait brings nothing but
 * kept reads it waits again, so a token costs the kernel's read and a copy, no Python object.
 * `Kept.take_framed` then gives the messages of a whole body of SSE event chunks in one pass.
 *
 * `Kept.acks`: the kernel ACKs a streamed token when the client reads it (a small pushed segment
 * in a connection that is not "interactive"), and on loopback that ACK's trip through the server's
 * TCP is charged to the client too: about half of what a token's read costs. With TCP_QUICKACK off
 * the kernel ACKs every second such segment instead. That is harmless where the server sends each
 * token at once (TCP_NODELAY: vLLM's, SGLang's and every asyncio/uvloop server) but would hold a
 * Nagle server's next token until a delayed ACK (40 ms), so it is only turned on for a server seen
 * to send a segment while the one before it was still unacknowledged (`ACKS_TRY`: the kernel's own
 * counters, `tcpi_segs_out` and `tcpi_data_segs_in`, read before each read), and only by a caller
 * that tries it on requests it does not measure.
 *
 * Why C: at 128 streams a token is one read of ~100 bytes; in Python the loop turn (asyncio's
 * `_run_once`, a dict lookup, os.read, two appends) and the framing passes cost together about as
 * much CPU per token as the kernel's read. The behaviour is the Python code's
 * (engine/eventloop.py: `StreamSelector._select_py`, `PyKept`; `ResponseParser.feed_reads`), which
 * runs where this module was not built.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <stddef.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
/* struct tcp_info with tcpi_segs_out and tcpi_data_segs_in (glibc's has neither); without the kernel's
 * headers a try never proves anything and every token is ACKed as by default. */
#if defined(__has_include)
#if __has_include(<linux/tcp.h>)
#include <linux/tcp.h>
#define HAVE_TCP_COUNTERS 1
#endif
#endif
#ifndef HAVE_TCP_COUNTERS
#include <netinet/tcp.h>
#endif

/* Below glibc's mmap threshold; one buffer, written only while the GIL is held and copied out at once. */
#define READ_SIZE (64 * 1024)
#define STACK_EVENTS 256
/* A Kept keeps its buffers between responses up to these sizes; larger ones are freed when taken. */
#define KEEP_BYTES (1 << 20)
#define KEEP_READS 16384

static char read_buffer[READ_SIZE];
static PyObject *s_keeping, *s_add, *s_received, *s_stream_eof, *s_stream_failed;

/* ---- Kept ---------------------------------------------------------------------------------- */

/* Kept.acks: what the next kept reads do to the socket's ACKs (see the top of this file). */
enum {
    ACKS_EACH = 0,    /* nothing: the kernel's default */
    ACKS_HALVE = 1,   /* after the next kept read, TCP_QUICKACK off (then ACKS_EACH: done for this body) */
    ACKS_TRY = 2,     /* the same, and watch whether the server waits for our ACKs (ACKS_WATCH) */
    ACKS_WATCH = 3,   /* before each kept read: two data segments in, no ACK out -> PROVEN; an ACK out first -> REFUTED */
    ACKS_PROVEN = 4,  /* the server sent a segment while the one before it was unacknowledged */
    ACKS_REFUTED = 5, /* an ACK went out before that was seen (a Nagle server, or tokens slower than the delayed ACK) */
};

typedef struct {
    PyObject_HEAD
    char keeping;        /* a chunked body is being read: reads that cannot end it are kept */
    int acks;            /* ACKS_* */
    unsigned int watch_segs_out, watch_data_in; /* the socket's counters when ACKS_WATCH began */
    char *buf;           /* the kept reads, one after another */
    Py_ssize_t len, cap;
    Py_ssize_t *ends;    /* where each read ends in buf */
    double *stamps;      /* each read's perf_counter() stamp */
    Py_ssize_t n, ncap;
} Kept;

static PyTypeObject KeptType;

static void
kept_reset(Kept *k)
{
    k->len = k->n = 0;
    if (k->cap > KEEP_BYTES) {
        PyMem_Free(k->buf);
        k->buf = NULL;
        k->cap = 0;
    }
    if (k->ncap > KEEP_READS) {
        PyMem_Free(k->ends);
        PyMem_Free(k->stamps);
        k->ends = NULL;
        k->stamps = NULL;
        k->ncap = 0;
    }
}

static int
kept_push(Kept *k, const char *data, Py_ssize_t size, double stamp)
{
    if (k->len + size > k->cap) {
        Py_ssize_t cap = k->cap ? k->cap : 4096;
        while (cap < k->len + size)
            cap *= 2;
        char *buf = PyMem_Realloc(k->buf, (size_t)cap);
        if (buf == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        k->buf = buf;
        k->cap = cap;
    }
    if (k->n == k->ncap) {
        Py_ssize_t ncap = k->ncap ? k->ncap * 2 : 64;
        Py_ssize_t *ends = PyMem_Realloc(k->ends, sizeof(Py_ssize_t) * (size_t)ncap);
        if (ends == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        k->ends = ends;
        double *stamps = PyMem_Realloc(k->stamps, sizeof(double) * (size_t)ncap);
        if (stamps == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        k->stamps = stamps;
        k->ncap = ncap;
    }
    memcpy(k->buf + k->len, data, (size_t)size);
    k->len += size;
    k->ends[k->n] = k->len;
    k->stamps[k->n] = stamp;
    k->n++;
    return 0;
}

static void
kept_dealloc(Kept *k)
{
    PyMem_Free(k->buf);
    PyMem_Free(k->ends);
    PyMem_Free(k->stamps);
    Py_TYPE(k)->tp_free((PyObject *)k);
}

static PyObject *
kept_add(Kept *k, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "add(data: bytes, stamp: float)");
        return NULL;
    }
    double stamp = PyFloat_AsDouble(args[1]);
    if (stamp == -1.0 && PyErr_Occurred())
        return NULL;
    if (kept_push(k, PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0]), stamp) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
kept_take(Kept *k, PyObject *Py_UNUSED(ignored))
{
    PyObject *reads = PyList_New(k->n), *stamps = PyList_New(k->n);
    if (reads == NULL || stamps == NULL)
        goto fail;
    for (Py_ssize_t i = 0, start = 0; i < k->n; start = k->ends[i], i++) {
        PyObject *data = PyBytes_FromStringAndSize(k->buf + start, k->ends[i] - start);
        PyObject *at = PyFloat_FromDouble(k->stamps[i]);
        if (data == NULL || at == NULL) {
            Py_XDECREF(data);
            Py_XDECREF(at);
            goto fail;
        }
        PyList_SET_ITEM(reads, i, data);
        PyList_SET_ITEM(stamps, i, at);
    }
    kept_reset(k);
    PyObject *out = PyTuple_Pack(2, reads, stamps);
    Py_DECREF(reads);
    Py_DECREF(stamps);
    return out;
fail:
    Py_XDECREF(reads);
    Py_XDECREF(stamps);
    return NULL;
}

/* A chunk-size line of hex digits only (what servers write), and its CRLF, at p (< end): the
 * size, and p moved past the line; -1 for anything else. */
static Py_ssize_t
size_line(const char **pp, const char *end)
{
    const char *p = *pp;
    Py_ssize_t size = 0;
    int digits = 0;
    for (; p < end; p++, digits++) {
        char c = *p;
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (v < 0)
            break;
        if (digits == 15) /* past 2^60 bytes: not a chunk of ours (and no overflow) */
            return -1;
        size = size * 16 + v;
    }
    if (digits == 0 || end - p < 2 || p[0] != '\r' || p[1] != '\n')
        return -1;
    *pp = p + 2;
    return size;
}

static PyObject *
kept_take_framed(Kept *k, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "take_framed(prefix: bytes, suffix: bytes)");
        return NULL;
    }
    const char *prefix = PyBytes_AS_STRING(args[0]), *suffix = PyBytes_AS_STRING(args[1]);
    Py_ssize_t plen = PyBytes_GET_SIZE(args[0]), slen = PyBytes_GET_SIZE(args[1]);
    /* First pass: check every read and count the messages; nothing is made unless all fit. */
    Py_ssize_t count = 0;
    int ended = 0;
    for (Py_ssize_t i = 0, start = 0; i < k->n; start = k->ends[i], i++) {
        const char *p = k->buf + start, *end = k->buf + k->ends[i];
        if (p == end)
            Py_RETURN_NONE;
        while (p < end) {
            Py_ssize_t size = size_line(&p, end);
            if (size < 0)
                Py_RETURN_NONE;
            if (size == 0) { /* the last chunk: no trailers, the body's end, the last kept byte */
                if (end - p != 2 || p[0] != '\r' || p[1] != '\n' || i != k->n - 1)
                    Py_RETURN_NONE;
                ended = 1;
                p = end;
                break;
            }
            if (end - p < size + 2 || p[size] != '\r' || p[size + 1] != '\n' || size < plen + slen
                    || memcmp(p, prefix, (size_t)plen) != 0 || memcmp(p + size - slen, suffix, (size_t)slen) != 0)
                Py_RETURN_NONE;
            count++;
            p += size + 2;
        }
    }
    /* Second pass: the messages, each at its read's stamp. */
    PyObject *messages = PyList_New(count), *stamps = PyList_New(count);
    if (messages == NULL || stamps == NULL)
        goto fail;
    Py_ssize_t m = 0;
    for (Py_ssize_t i = 0, start = 0; i < k->n; start = k->ends[i], i++) {
        const char *p = k->buf + start, *end = k->buf + k->ends[i];
        PyObject *at = NULL;
        while (p < end) {
            Py_ssize_t size = size_line(&p, end);
            if (size == 0)
                break;
            PyObject *message = PyBytes_FromStringAndSize(p + plen, size - plen - slen);
            if (message == NULL)
                goto fail;
            PyList_SET_ITEM(messages, m, message);
            if (at == NULL && (at = PyFloat_FromDouble(k->stamps[i])) == NULL)
                goto fail;
            Py_INCREF(at);
            PyList_SET_ITEM(stamps, m, at);
            m++;
            p += size + 2;
        }
        Py_XDECREF(at);
    }
    kept_reset(k);
    PyObject *out = Py_BuildValue("(NNO)", messages, stamps, ended ? Py_True : Py_False);
    return out;
fail:
    Py_XDECREF(messages);
    Py_XDECREF(stamps);
    return NULL;
}

static PyObject *
kept_clear(Kept *k, PyObject *Py_UNUSED(ignored))
{
    kept_reset(k);
    Py_RETURN_NONE;
}

static Py_ssize_t
kept_length(Kept *k)
{
    return k->n;
}

static PyMethodDef kept_methods[] = {
    {"add", (PyCFunction)(void (*)(void))kept_add, METH_FASTCALL,
     "add(data, stamp): keep one read and its perf_counter() stamp."},
    {"take", (PyCFunction)kept_take, METH_NOARGS,
     "take() -> (reads, stamps): every kept read, in order, and its stamp; none are kept after."},
    {"take_framed", (PyCFunction)(void (*)(void))kept_take_framed, METH_FASTCALL,
     "take_framed(prefix, suffix) -> (messages, stamps, ended) | None\n\n"
     "When every kept read is whole chunks (hex size lines without extensions) whose data are each\n"
     "prefix + message + suffix, the last read possibly ending with the last chunk (no trailers):\n"
     "each message with its read's stamp, and whether the body ended; none are kept after. Else\n"
     "None, and the reads stay for take()."},
    {"clear", (PyCFunction)kept_clear, METH_NOARGS, "clear(): keep nothing."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef kept_members[] = {
    {"keeping", T_BOOL, offsetof(Kept, keeping), 0,
     "a chunked body is being read: a read that cannot end it is kept"},
    {"acks", T_INT, offsetof(Kept, acks), 0,
     "what the next kept reads do to the socket's ACKs: 0 nothing, 1 every second one (TCP_QUICKACK\n"
     "off after the next kept read), 2 the same and watch whether the server waits for them, 3\n"
     "watching, 4 it does not (proven), 5 an ACK went out before that was seen (refuted)"},
    {NULL, 0, 0, 0, NULL},
};

static PySequenceMethods kept_as_sequence = {
    .sq_length = (lenfunc)kept_length,
};

static PyTypeObject KeptType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "engine._streamread.Kept",
    .tp_doc = "The reads of a streaming body kept with their stamps (engine.eventloop.PyKept in C).",
    .tp_basicsize = sizeof(Kept),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)kept_dealloc,
    .tp_methods = kept_methods,
    .tp_members = kept_members,
    .tp_as_sequence = &kept_as_sequence,
};

/* ---- the loop turn ------------------------------------------------------------------------- */

/* reader.received(data, now); an Exception from it goes to reader.stream_failed(exc), anything
 * else (KeyboardInterrupt, SystemExit) propagates. */
static int
deliver(PyObject *reader, PyObject *data, PyObject *now)
{
    PyObject *res = PyObject_CallMethodObjArgs(reader, s_received, data, now, NULL);
    if (res != NULL) {
        Py_DECREF(res);
        return 0;
    }
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
    res = PyObject_CallMethodObjArgs(reader, s_stream_failed, value != NULL ? value : Py_None, NULL);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (res == NULL)
        return -1;
    Py_DECREF(res);
    return 0;
}

/* The socket's count of segments sent (ACKs included) and of data segments received; 0 when the
 * kernel has no such counters (before Linux 4.6). */
static int
tcp_counters(int fd, unsigned int *segs_out, unsigned int *data_in)
{
#ifdef HAVE_TCP_COUNTERS
    struct tcp_info info;
    socklen_t size = sizeof info;
    memset(&info, 0, sizeof info);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &size) < 0
            || size < offsetof(struct tcp_info, tcpi_data_segs_in) + sizeof info.tcpi_data_segs_in)
        return 0;
    *segs_out = info.tcpi_segs_out;
    *data_in = info.tcpi_data_segs_in;
    return 1;
#else
    (void)fd;
    (void)segs_out;
    (void)data_in;
    return 0;
#endif
}

/* Before a kept read of a socket in ACKS_WATCH: proven once two data segments came in since the
 * watch began with no segment of ours going out (the second was sent while the first was
 * unacknowledged: no Nagle wait), refuted once anything went out first. */
static void
acks_watch(Kept *k, int fd)
{
    unsigned int segs_out, data_in;
    if (!tcp_counters(fd, &segs_out, &data_in) || segs_out != k->watch_segs_out)
        k->acks = ACKS_REFUTED;
    else if (data_in - k->watch_data_in >= 2)
        k->acks = ACKS_PROVEN;
}

/* After a kept read in ACKS_HALVE or ACKS_TRY: TCP_QUICKACK off (the kernel turns it back on by
 * itself when a delayed ACK's timer fires, so it is set once per body, after its first token). */
static void
acks_halve(Kept *k, int fd)
{
    int off = 0, trying = k->acks == ACKS_TRY;
    if (setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &off, sizeof off) == 0 && trying
            && tcp_counters(fd, &k->watch_segs_out, &k->watch_data_in))
        k->acks = ACKS_WATCH;
    else /* done for this body; a try that cannot watch proves nothing */
        k->acks = trying ? ACKS_REFUTED : ACKS_EACH;
}

/* One ready joined socket, `entry` its (reader, kept): 0 when its read was kept (or there was nothing
 * to read), 1 when it went to Python code (received, stream_eof, stream_failed), -1 on an error. */
static int
read_member(PyObject *entry, int fd, double stamp, PyObject **now)
{
    PyObject *reader = PyTuple_GET_ITEM(entry, 0), *kept = PyTuple_GET_ITEM(entry, 1);
    int is_kept = Py_IS_TYPE(kept, &KeptType);
    if (is_kept && ((Kept *)kept)->acks == ACKS_WATCH && ((Kept *)kept)->keeping)
        acks_watch((Kept *)kept, fd);
    ssize_t got = read(fd, read_buffer, READ_SIZE);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return 0;
    if (got <= 0) { /* end of file or an error: its transport's own read meets it */
        PyObject *number = PyLong_FromLong(fd);
        if (number == NULL)
            return -1;
        PyObject *res = PyObject_CallMethodObjArgs(reader, s_stream_eof, number, NULL);
        Py_DECREF(number);
        if (res == NULL)
            return -1;
        Py_DECREF(res);
        return 1;
    }
    int may_end = got < 4 || read_buffer[got - 4] == '\r'; /* a chunked body ends with a blank line */
    if (is_kept) {
        Kept *k = (Kept *)kept;
        if (k->keeping && !may_end) {
            if (k->acks == ACKS_HALVE || k->acks == ACKS_TRY)
                acks_halve(k, fd);
            return kept_push(k, read_buffer, got, stamp);
        }
    }
    if (*now == NULL && (*now = PyFloat_FromDouble(stamp)) == NULL)
        return -1;
    PyObject *data = PyBytes_FromStringAndSize(read_buffer, got);
    if (data == NULL)
        return -1;
    int rc = 0;
    if (!is_kept && !may_end) { /* a Kept of another type (PyKept): its own way */
        PyObject *keeping = PyObject_GetAttr(kept, s_keeping);
        int keep = keeping == NULL ? -1 : PyObject_IsTrue(keeping);
        Py_XDECREF(keeping);
        if (keep < 0) {
            Py_DECREF(data);
            return -1;
        }
        if (keep) {
            PyObject *res = PyObject_CallMethodObjArgs(kept, s_add, data, *now, NULL);
            Py_DECREF(data);
            if (res == NULL)
                return -1;
            Py_DECREF(res);
            return 0;
        }
    }
    rc = deliver(reader, data, *now);
    Py_DECREF(data);
    return rc < 0 ? -1 : 1;
}

PyDoc_STRVAR(poll_doc,
"poll(epfd, timeout_ms, maxevents, members) -> (now, [(fd, events), ...])\n\n"
"epoll_wait on `epfd` (-1 waits forever). Each ready descriptor in `members` (fd -> (reader, kept))\n"
"is read, stamped with one time.perf_counter() reading taken after the wait: a read `kept` keeps\n"
"goes there, any other to the reader. While a wait brings only kept reads, it waits again for the\n"
"rest of the timeout; it\n"
"returns what is left for asyncio (every other descriptor, and a member's EPOLLOUT/ERR/HUP) with\n"
"the last stamp, after a reader's Python code ran, or when the time is up.");

static long long
monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* time.perf_counter() as CPython computes it on Linux: CLOCK_MONOTONIC, nanoseconds, then seconds. */
static PyObject *
perf_counter(void)
{
    return PyFloat_FromDouble((double)monotonic_ns() / 1e9);
}

static int
as_int(PyObject *value, int *out)
{
    long v = PyLong_AsLong(value);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < INT_MIN || v > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "poll: an argument does not fit a C int");
        return -1;
    }
    *out = (int)v;
    return 0;
}

static PyObject *
streamread_poll(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 4 || !PyDict_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "poll(epfd: int, timeout_ms: int, maxevents: int, members: dict)");
        return NULL;
    }
    int epfd, timeout, maxevents;
    if (as_int(args[0], &epfd) < 0 || as_int(args[1], &timeout) < 0 || as_int(args[2], &maxevents) < 0)
        return NULL;
    PyObject *members = args[3];
    if (maxevents < 1)
        maxevents = 1;
    struct epoll_event stack_events[STACK_EVENTS];
    struct epoll_event *events = stack_events;
    if (maxevents > STACK_EVENTS) {
        events = PyMem_Malloc(sizeof(struct epoll_event) * (size_t)maxevents);
        if (events == NULL)
            return PyErr_NoMemory();
    }
    /* While a wait ends with nothing but kept reads, nothing in asyncio has changed: wait again, for
     * what is left of the timeout, instead of a loop turn in Python per wake-up. */
    long long deadline = timeout > 0 ? monotonic_ns() + (long long)timeout * 1000000LL : 0;
    PyObject *result = NULL, *now = NULL, *rest = PyList_New(0);
    if (rest == NULL)
        goto done;
    for (;;) {
        int n, err;
        Py_BEGIN_ALLOW_THREADS
        n = epoll_wait(epfd, events, maxevents, timeout);
        err = errno;
        Py_END_ALLOW_THREADS
        if (n < 0) {
            if (err != EINTR) {
                errno = err;
                PyErr_SetFromErrno(PyExc_OSError);
                goto done;
            }
            if (PyErr_CheckSignals() < 0) /* a handler raised (KeyboardInterrupt) */
                goto done;
            n = 0;
        }
        Py_CLEAR(now); /* this wake-up's stamp, made a float only when Python code needs it */
        double stamp = (double)monotonic_ns() / 1e9;
        int to_python = 0;
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            uint32_t event = events[i].events;
            PyObject *key = PyLong_FromLong(fd);
            if (key == NULL)
                goto done;
            PyObject *entry = PyDict_GetItemWithError(members, key); /* borrowed */
            Py_DECREF(key);
            if (entry == NULL && PyErr_Occurred())
                goto done;
            if (entry != NULL) {
                if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 2) {
                    PyErr_SetString(PyExc_TypeError, "poll: members maps a descriptor to (reader, kept)");
                    goto done;
                }
                if (event & ~(uint32_t)EPOLLOUT) { /* readable, or an error or hang-up its read reports */
                    Py_INCREF(entry);
                    int rc = read_member(entry, fd, stamp, &now);
                    Py_DECREF(entry);
                    if (rc < 0)
                        goto done;
                    to_python |= rc;
                }
                event &= EPOLLOUT | EPOLLERR | EPOLLHUP; /* left for asyncio: a writer of this socket */
                if (!event)
                    continue;
            }
            PyObject *item = Py_BuildValue("(iI)", fd, event);
            if (item == NULL)
                goto done;
            int rc = PyList_Append(rest, item);
            Py_DECREF(item);
            if (rc < 0)
                goto done;
        }
        /* back to asyncio: its own events, Python code ran (it may have scheduled callbacks), the
         * time is up, or asyncio has callbacks waiting (timeout 0) */
        if (n == 0 || to_python || PyList_GET_SIZE(rest) > 0 || timeout == 0)
            break;
        if (PyErr_CheckSignals() < 0) /* a signal that came while reading: its handler runs now */
            goto done;
        if (deadline) {
            long long left = deadline - monotonic_ns();
            if (left <= 0)
                break;
            timeout = (int)((left + 999999) / 1000000); /* round up, as asyncio does */
        }
    }
    if (now == NULL && (now = perf_counter()) == NULL)
        goto done;
    result = PyTuple_Pack(2, now, rest);
done:
    Py_XDECREF(now);
    Py_XDECREF(rest);
    if (events != stack_events)
        PyMem_Free(events);
    return result;
}

static PyMethodDef streamread_methods[] = {
    {"poll", (PyCFunction)(void (*)(void))streamread_poll, METH_FASTCALL, poll_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef streamread_module = {
    PyModuleDef_HEAD_INIT, "engine._streamread",
    "StreamSelector's loop turn and the kept reads of a streaming body, in C (see engine/eventloop.py).",
    -1, streamread_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__streamread(void)
{
    s_keeping = PyUnicode_InternFromString("keeping");
    s_add = PyUnicode_InternFromString("add");
    s_received = PyUnicode_InternFromString("received");
    s_stream_eof = PyUnicode_InternFromString("stream_eof");
    s_stream_failed = PyUnicode_InternFromString("stream_failed");
    if (!s_keeping || !s_add || !s_received || !s_stream_eof || !s_stream_failed)
        return NULL;
    if (PyType_Ready(&KeptType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&streamread_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&KeptType);
    if (PyModule_AddObject(module, "Kept", (PyObject *)&KeptType) < 0) {
        Py_DECREF(&KeptType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
