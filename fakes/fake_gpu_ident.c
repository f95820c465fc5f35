/* Process identity for the shared state (fake_gpu_ident.h): getpid() and kill(), or the node's driver socket. */
#include "fake_gpu_ident.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#define REQUEST_TIMEOUT_S 10

static char socket_path[sizeof(((struct sockaddr_un *)0)->sun_path)]; /* "" = no socket */
static char who[32] = "fake driver";
/* (getpid() << 32) | host pid, of the last process that asked: a forked child has another getpid() and asks
 * again. 0 = not known. */
static uint64_t self_cache;
static int32_t warned_self, warned_alive; /* getpid() of the process that printed that warning */

/* One request on a fresh connection; the reply line without its newline into reply. 0, or -1 with err. */
static int request(const char *line, char *reply, size_t len, char *err, size_t errlen)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    struct timeval tv = {REQUEST_TIMEOUT_S, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    memcpy(addr.sun_path, socket_path, sizeof addr.sun_path);
    int rc = -1;
    size_t got = 0, want = strlen(line);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        snprintf(err, errlen, "cannot connect: %s", strerror(errno));
        goto out;
    }
    for (size_t sent = 0; sent < want;) {
        ssize_t n = send(fd, line + sent, want - sent, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            snprintf(err, errlen, "cannot send '%.*s': %s", (int)want - 1, line, n < 0 ? strerror(errno) : "closed");
            goto out;
        }
        sent += (size_t)n;
    }
    while (got + 1 < len) {
        ssize_t n = recv(fd, reply + got, len - 1 - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            snprintf(err, errlen, "no answer to '%.*s': %s", (int)want - 1, line,
                     errno == EAGAIN ? "timed out" : strerror(errno));
            goto out;
        }
        if (n == 0)
            break;
        got += (size_t)n;
        if (memchr(reply, '\n', got))
            break;
    }
    reply[got] = '\0';
    char *nl = strchr(reply, '\n');
    if (!nl) {
        snprintf(err, errlen, "the answer to '%.*s' is not a line: '%.40s'", (int)want - 1, line, reply);
        goto out;
    }
    *nl = '\0';
    rc = 0;
out:
    close(fd);
    return rc;
}

/* Ask for this process's host pid. >0, or 0 with err. */
static int32_t ask_pid(char *err, size_t errlen)
{
    char reply[64], *end;
    if (request("pid\n", reply, sizeof reply, err, errlen) != 0)
        return 0;
    errno = 0;
    long v = strtol(reply, &end, 10);
    if (errno || end == reply || *end || v <= 0 || v > INT32_MAX) {
        snprintf(err, errlen, "the answer to 'pid' is not a pid: '%.40s'", reply);
        return 0;
    }
    return (int32_t)v;
}

int fake_ident_configure(const char *name, const char *path, char *err, size_t errlen)
{
    snprintf(who, sizeof who, "%s", name);
    __atomic_store_n(&self_cache, 0, __ATOMIC_RELAXED);
    if (!path || !*path) {
        socket_path[0] = '\0';
        return 0;
    }
    if (strlen(path) >= sizeof socket_path) {
        snprintf(err, errlen, "driver socket path %s is longer than %zu characters", path, sizeof socket_path - 1);
        return -1;
    }
    snprintf(socket_path, sizeof socket_path, "%s", path);
    char why[256];
    int32_t host = ask_pid(why, sizeof why);
    if (!host) {
        snprintf(err, errlen, "driver socket %s: %s", path, why);
        return -1;
    }
    __atomic_store_n(&self_cache, (uint64_t)(uint32_t)getpid() << 32 | (uint32_t)host, __ATOMIC_RELEASE);
    return 0;
}

int fake_ident_uses_socket(void)
{
    return socket_path[0] != '\0';
}

int32_t fake_ident_self(void)
{
    int32_t me = (int32_t)getpid();
    if (!socket_path[0])
        return me;
    uint64_t c = __atomic_load_n(&self_cache, __ATOMIC_ACQUIRE);
    if (c && (int32_t)(c >> 32) == me)
        return (int32_t)(uint32_t)c;
    char why[256];
    int32_t host = ask_pid(why, sizeof why);
    if (!host) {
        if (__atomic_exchange_n(&warned_self, me, __ATOMIC_RELAXED) != me)
            fprintf(stderr, "%s: cannot learn this process's host pid from the driver socket %s: %s; its GPU work "
                            "is refused\n", who, socket_path, why);
        return 0;
    }
    __atomic_store_n(&self_cache, (uint64_t)(uint32_t)me << 32 | (uint32_t)host, __ATOMIC_RELEASE);
    return host;
}

int fake_ident_alive(int32_t pid)
{
    if (pid <= 0)
        return 0;
    if (!socket_path[0])
        return kill(pid, 0) == 0 || errno != ESRCH;
    uint64_t c = __atomic_load_n(&self_cache, __ATOMIC_ACQUIRE);
    if (c && (int32_t)(c >> 32) == (int32_t)getpid() && (int32_t)(uint32_t)c == pid)
        return 1; /* this process */
    char line[32], reply[16], why[256];
    snprintf(line, sizeof line, "alive %d\n", (int)pid);
    if (request(line, reply, sizeof reply, why, sizeof why) == 0) {
        if (!strcmp(reply, "1") || !strcmp(reply, "0"))
            return reply[0] == '1';
        snprintf(why, sizeof why, "the answer to 'alive %d' is neither 1 nor 0: '%.20s'", (int)pid, reply);
    }
    int32_t me = (int32_t)getpid();
    if (__atomic_exchange_n(&warned_alive, me, __ATOMIC_RELAXED) != me)
        fprintf(stderr, "%s: cannot ask the driver socket %s whether process %d is alive: %s; taking it as alive\n",
                who, socket_path, (int)pid, why);
    return 1;
}
