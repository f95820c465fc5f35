"""Notice the kubelet restarting (`kubelet.sock` re-created) and our sockets vanishing, without polling."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver


class _Handler(FileSystemEventHandler):
    def __init__(self, names: set[str], poke: Callable[[], None]) -> None:
        self._names = names
        self._poke = poke

    def on_any_event(self, event: FileSystemEvent) -> None:
        paths = {Path(str(event.src_path)).name, Path(str(getattr(event, "dest_path", "") or "")).name}
        if paths & self._names:
            self._poke()


def watch_socket_dir(directory: Path, names: set[str], poke: Callable[[], None]) -> BaseObserver:
    """Start an inotify observer calling `poke()` whenever one of `names` in `directory` changes."""
    observer = Observer()
    observer.schedule(_Handler(names, poke), str(directory), recursive=False)
    observer.daemon = True
    observer.start()
    return observer
