/* Who a process is to the simulated GPU: the pid under which it appears in the shared state file (procs[],
 * timeline spans, lock owners) and the answer to "is that one still alive?".
 *
 * A real driver knows host pids: the kernel module sees every process in the host's PID namespace. The fake
 * runs in the process, so inside a container its getpid() is a small number that collides with other
 * containers' processes, and kill(pid, 0) asks the wrong namespace. With `driver_socket=PATH` in the config,
 * the node answers both questions over a unix stream socket (protocol: fakes/README.md, "The driver socket"):
 *
 *   pid\n          -> <the caller's pid in the server's (the host's) PID namespace>\n   (SO_PEERCRED)
 *   alive <pid>\n  -> 1\n or 0\n                                                         (kill(pid, 0) on the host)
 *
 * One connection per request. The host pid is cached per process and asked again in a forked child (the cache
 * remembers the getpid() it was learnt under). Without the key, identities are getpid() and liveness is
 * kill(pid, 0), as before.
 *
 * Each fake library links its own copy (fake_gpu_ident.c, hidden symbols), configured at nvmlInit / cuInit.
 */
#ifndef FAKE_GPU_IDENT_H
#define FAKE_GPU_IDENT_H

#include <stddef.h>
#include <stdint.h>

#pragma GCC visibility push(hidden)

/* Use the socket at `socket_path` ("" or NULL: none, identities are getpid()) and learn this process's host
 * pid from it. `who` names the library in later stderr lines ("fake NVML"). 0, or -1 with a one-line reason in
 * err (the socket cannot be reached or answers nonsense). */
int fake_ident_configure(const char *who, const char *socket_path, char *err, size_t errlen);

/* This process's identity in the shared state: its host pid (or getpid() without a socket). 0 when the socket
 * cannot tell (stderr says so once per process); callers then fail the operation. */
int32_t fake_ident_self(void);

/* 1 when the process with identity `pid` exists, else 0. When the socket cannot tell: 1 (nothing of a process
 * that may be alive is taken over), with one stderr line per process. */
int fake_ident_alive(int32_t pid);

/* 1 when a driver socket is configured. */
int fake_ident_uses_socket(void);

#pragma GCC visibility pop

#endif /* FAKE_GPU_IDENT_H */
