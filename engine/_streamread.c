/* The loop turn of engine.eventloop.StreamSelector in C: one epoll_wait, then every ready joined
 * socket read and handed to its connection, the rest returned for asyncio's keys.
 *
 * Why C: at 128 streams a token is one read of ~100 bytes; in Python the loop over the poll's events
 * (a dict lookup, os.read, two appends) cost about as much CPU per token as the kernel's read did.
 * Here a token costs the read, one bytes object and two list appends. The behaviour is exactly the
 * Python loop's (engine/eventloop.py, `StreamSelector._select_py`), which runs where this module
 * was not built.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

/* Below glibc's mmap threshold; one buffer, written only while the GIL is held and copied out at once. */
#define READ_SIZE (64 * 1024)
#define STACK_EVENTS 256

static char read_buffer[READ_SIZE];
static PyObject *s_keeping, *s_kept, *s_kept_at, *s_received, *s_stream_eof, *s_stream_failed;

static int
append_to(PyObject *owner, PyObject *name, PyObject *item)
{
    PyObject *list = PyObject_GetAttr(owner, name);
    if (list == NULL)
        return -1;
    int rc;
    if (PyList_CheckExact(list)) {
        rc = PyList_Append(list, item);
    } else {
        PyObject *res = PyObject_CallMethod(list, "append", "O", item);
        rc = res == NULL ? -1 : 0;
        Py_XDECREF(res);
    }
    Py_DECREF(list);
    return rc;
}

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

/* One ready joined socket: 0 when its read was kept (or there was nothing to read), 1 when it went to
 * Python code (received, stream_eof, stream_failed), -1 on an error to raise. */
static int
read_member(PyObject *reader, int fd, PyObject *now)
{
    ssize_t got = read(fd, read_buffer, READ_SIZE);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return 0;
    if (got <= 0) { /* end of file or an error: its transport's own read meets it */
        PyObject *res = PyObject_CallMethod(reader, "stream_eof", "i", fd);
        if (res == NULL)
            return -1;
        Py_DECREF(res);
        return 1;
    }
    PyObject *data = PyBytes_FromStringAndSize(read_buffer, got);
    if (data == NULL)
        return -1;
    int rc;
    PyObject *keeping = PyObject_GetAttr(reader, s_keeping);
    int keep = keeping == NULL ? -1 : PyObject_IsTrue(keeping);
    Py_XDECREF(keeping);
    if (keep < 0) {
        rc = -1;
    } else if (keep && got >= 4 && PyBytes_AS_STRING(data)[got - 4] != '\r') {
        /* a streaming body's read that cannot end the response: kept with its stamp (its byte looked
         * at in the bytes object: the lookup above may have run Python code, and another thread's
         * loop turn may have read into the shared buffer since) */
        rc = append_to(reader, s_kept, data);
        if (rc == 0)
            rc = append_to(reader, s_kept_at, now);
    } else {
        rc = deliver(reader, data, now);
        if (rc == 0)
            rc = 1;
    }
    Py_DECREF(data);
    return rc;
}

PyDoc_STRVAR(poll_doc,
"poll(epfd, timeout_ms, maxevents, members) -> (now, [(fd, events), ...])\n\n"
"epoll_wait on `epfd` (-1 waits forever). Each ready descriptor in `members` (fd -> reader) is\n"
"read and handed to its reader, stamped with one time.perf_counter() reading taken after the wait.\n"
"While a wait brings only reads the readers keep, it waits again for the rest of the timeout; it\n"
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
        Py_XDECREF(now);
        now = perf_counter();
        if (now == NULL)
            goto done;
        int to_python = 0;
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            uint32_t event = events[i].events;
            PyObject *key = PyLong_FromLong(fd);
            if (key == NULL)
                goto done;
            PyObject *reader = PyDict_GetItemWithError(members, key); /* borrowed */
            Py_DECREF(key);
            if (reader == NULL && PyErr_Occurred())
                goto done;
            if (reader != NULL) {
                if (event & ~(uint32_t)EPOLLOUT) { /* readable, or an error or hang-up its read reports */
                    Py_INCREF(reader);
                    int rc = read_member(reader, fd, now);
                    Py_DECREF(reader);
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
    "StreamSelector's loop turn in C (see engine/eventloop.py).", -1, streamread_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__streamread(void)
{
    s_keeping = PyUnicode_InternFromString("keeping");
    s_kept = PyUnicode_InternFromString("kept");
    s_kept_at = PyUnicode_InternFromString("kept_at");
    s_received = PyUnicode_InternFromString("received");
    s_stream_eof = PyUnicode_InternFromString("stream_eof");
    s_stream_failed = PyUnicode_InternFromString("stream_failed");
    if (!s_keeping || !s_kept || !s_kept_at || !s_received || !s_stream_eof || !s_stream_failed)
        return NULL;
    return PyModule_Create(&streamread_module);
}
