/* The least a streaming benchmark client can cost: C, one thread, one epoll set, no parsing.
 *
 * `benchmarks/client_cost.py --clients floor,...` runs it beside the real clients: CONC keep-alive
 * connections, closed loop, each sends a streamed completion (x-request-id warmup-<i>, then
 * floor-<i>), reads every byte as it arrives (one read per ready socket and wake-up, the way a
 * client that stamps each token must), stamps the first body byte after the head, and sends its next
 * request when the chunked body's last bytes ("0\r\n\r\n") arrive. After each body's first bytes it
 * turns TCP_QUICKACK off, so the kernel ACKs every second token, not each one (what our client does
 * once its warm-up showed the server does not wait for ACKs; the scheduled server sets TCP_NODELAY).
 * What it costs per token is the kernel's read, half an ACK and the wake-ups, plus almost nothing:
 * the floor under every client that reads each token when it arrives.
 *
 *     cc -O2 -o floor_client floor_client.c
 *     floor_client HOST PORT CONC REQUESTS WARMUP MAX_TOKENS INPUT_WORDS OUT.json
 *
 * OUT.json: {"mean_ttft_ms", "failed", "start_times", "ttfts"} (CLOCK_MONOTONIC seconds, as
 * Python's perf_counter on Linux), request i sent as floor-<i>.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BUF (64 * 1024)

struct conn {
    int fd;
    int req;         /* index of the request in flight, -1 when idle */
    int warm;        /* the request in flight is a warm-up */
    int in_body;     /* the head was read */
    int halved;      /* TCP_QUICKACK was turned off for this body */
    char tail[5];    /* the last 5 bytes read: the end of a chunked body is "0\r\n\r\n" */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char body[65536], request[70000];
static const char *host;
static int port;

static int send_request(struct conn *c, const char *prefix, int index, double *start)
{
    int n = snprintf(request, sizeof request,
                     "POST /v1/completions HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                     "X-Request-ID: %s%d\r\nContent-Length: %zu\r\n\r\n%s",
                     host, port, prefix, index, strlen(body), body);
    *start = now_s();
    for (int off = 0; off < n;) {
        ssize_t w = write(c->fd, request + off, (size_t)(n - off));
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        off += (int)w;
    }
    c->in_body = 0;
    c->halved = 0;
    memset(c->tail, 0, sizeof c->tail);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 9) {
        fprintf(stderr, "usage: %s HOST PORT CONC REQUESTS WARMUP MAX_TOKENS INPUT_WORDS OUT.json\n", argv[0]);
        return 2;
    }
    host = argv[1];
    port = atoi(argv[2]);
    int conc = atoi(argv[3]), total = atoi(argv[4]), warmup = atoi(argv[5]);
    int max_tokens = atoi(argv[6]), words = atoi(argv[7]);
    const char *out_path = argv[8];
    int len = snprintf(body, sizeof body, "{\"model\":\"fake\",\"max_tokens\":%d,\"stream\":true,\"ignore_eos\":true,\"prompt\":\"",
                       max_tokens);
    for (int i = 0; i < words && len < (int)sizeof body - 16; i++)
        len += snprintf(body + len, sizeof body - len, "%sw%d", i ? " " : "", i % 1000);
    snprintf(body + len, sizeof body - len, "\"}");

    double *start = calloc((size_t)total, sizeof(double)), *ttft = calloc((size_t)total, sizeof(double));
    struct conn *conns = calloc((size_t)conc, sizeof(struct conn));
    int ep = epoll_create1(0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, host, &addr.sin_addr);
    for (int i = 0; i < conc; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
            perror("connect");
            return 1;
        }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        conns[i].fd = fd;
        conns[i].req = -1;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &conns[i]};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    }
    static char buf[BUF];
    struct epoll_event events[1024];
    double warm_start;
    /* warm-up: WARMUP requests, one per connection at a time, all finished before the measured ones */
    for (int phase = 0; phase < 2; phase++) {
        int count = phase == 0 ? warmup : total, sent = 0, done = 0;
        for (int i = 0; i < conc && sent < count; i++, sent++) {
            conns[i].req = sent;
            conns[i].warm = phase == 0;
            if (send_request(&conns[i], phase == 0 ? "warmup-" : "floor-", sent, phase == 0 ? &warm_start : &start[sent]) < 0)
                return 1;
        }
        while (done < count) {
            int n = epoll_wait(ep, events, 1024, 60000);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                fprintf(stderr, "no response for 60 s\n");
                return 1;
            }
            double t = now_s();
            for (int e = 0; e < n; e++) {
                struct conn *c = events[e].data.ptr;
                ssize_t r = read(c->fd, buf, BUF);
                if (r <= 0) {
                    if (r < 0 && (errno == EAGAIN || errno == EINTR))
                        continue;
                    fprintf(stderr, "connection closed\n");
                    return 1;
                }
                if (c->req < 0)
                    continue;
                char *data = buf;
                ssize_t size = r;
                if (!c->in_body) {
                    char *end = memmem(buf, (size_t)r, "\r\n\r\n", 4);
                    if (end == NULL)
                        continue; /* the head goes on (the scheduled server writes it in one piece) */
                    c->in_body = 1;
                    data = end + 4;
                    size = r - (data - buf);
                }
                if (size > 0 && !c->halved) {
                    int off = 0;
                    setsockopt(c->fd, IPPROTO_TCP, TCP_QUICKACK, &off, sizeof off);
                    c->halved = 1;
                }
                if (size > 0 && !c->warm && ttft[c->req] == 0)
                    ttft[c->req] = t - start[c->req];
                /* keep the last 5 bytes of the body to see its end */
                if (size >= 5) {
                    memcpy(c->tail, data + size - 5, 5);
                } else if (size > 0) {
                    memmove(c->tail, c->tail + size, (size_t)(5 - size));
                    memcpy(c->tail + 5 - size, data, (size_t)size);
                }
                if (c->in_body && memcmp(c->tail, "0\r\n\r\n", 5) == 0) {
                    done++;
                    c->req = -1;
                    if (sent < count) {
                        c->req = sent;
                        c->warm = phase == 0;
                        if (send_request(c, phase == 0 ? "warmup-" : "floor-", sent, phase == 0 ? &warm_start : &start[sent]) < 0)
                            return 1;
                        sent++;
                    }
                }
            }
        }
    }
    /* stay a moment, idle, so that the server reads this process's CPU at the end of its window */
    struct timespec pause = {.tv_sec = 0, .tv_nsec = 500 * 1000 * 1000};
    nanosleep(&pause, NULL);
    FILE *f = fopen(out_path, "w");
    if (f == NULL) {
        perror(out_path);
        return 1;
    }
    double sum = 0;
    for (int i = 0; i < total; i++)
        sum += ttft[i];
    fprintf(f, "{\"mean_ttft_ms\": %.6f, \"failed\": 0, \"start_times\": [", total ? sum / total * 1e3 : 0.0);
    for (int i = 0; i < total; i++)
        fprintf(f, "%s%.9f", i ? "," : "", start[i]);
    fprintf(f, "], \"ttfts\": [");
    for (int i = 0; i < total; i++)
        fprintf(f, "%s%.9f", i ? "," : "", ttft[i]);
    fprintf(f, "]}\n");
    fclose(f);
    return 0;
}
