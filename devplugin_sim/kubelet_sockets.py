"""Unix socket housekeeping for the emulator: path length check, plugin directory clean-up, serving."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc

log = logging.getLogger(__name__)

MAX_UNIX_PATH = 107  # sun_path holds 108 bytes including the terminating NUL


def check_socket_path(path: Path) -> None:
    """Refuse a socket path the kernel cannot bind, with advice."""
    n = len(os.fsencode(str(path)))
    if n > MAX_UNIX_PATH:
        raise ValueError(f"unix socket path {path} is {n} bytes, over the {MAX_UNIX_PATH}-byte limit: "
                         "use a short directory, e.g. tempfile.mkdtemp(dir='/tmp')")


# mirrors ManagerImpl.CleanupPluginDirectory: remove unix sockets only; directories, regular files and the
# checkpoint stay
def cleanup_plugin_directory(directory: Path) -> list[str]:
    """Delete every unix socket directly in directory; returns the names removed."""
    removed = []
    for name in sorted(os.listdir(directory)):
        path = directory / name
        try:
            st = os.stat(path)
        except OSError as err:
            log.debug("cannot stat %s: %s", path, err)
            continue
        if not stat.S_ISSOCK(st.st_mode):
            continue
        try:
            os.remove(path)
            removed.append(name)
        except OSError as err:
            log.error("cannot remove stale socket %s: %s", path, err)
    log.debug("plugin directory %s cleaned of sockets %s", directory, removed)
    return removed


def remove_socket(path: Path) -> None:
    """Remove path if it is a unix socket (or a dangling link); leave anything else and say so."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            os.remove(path)
        return
    if stat.S_ISSOCK(st.st_mode):
        os.remove(path)
    else:
        raise FileExistsError(f"{path} exists and is not a unix socket: move it away so the emulator can "
                              "serve there")


def serve_unix(path: Path, add_servicer: Callable[[grpc.Server], object], name: str,
               workers: int = 8) -> grpc.Server:
    """A started gRPC server on the unix socket path; add_servicer(server) registers the service."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name))
    add_servicer(server)
    try:
        bound = server.add_insecure_port(f"unix:{path}")
    except RuntimeError as err:
        bound, detail = 0, str(err)
    else:
        detail = "bind failed"
    if bound == 0:
        raise OSError(f"cannot serve {name} on unix:{path}: {detail}")
    server.start()
    log.debug("%s serving on %s", name, path)
    return server
