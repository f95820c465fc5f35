"""Per-container GPU use for /metrics: each container holding devices of this node, per GPU, read at scrape time
from the shim's usage file of that container (devplugin/isolation/container_usage.py).

Series exist only for containers the daemon knows as holding devices: one that ended disappears at the next
scrape after the daemon learns it ended. Labels: node, namespace, pod, container, gpu (index), uuid; at most a
few hundred containers a node, each on 1..16 GPUs (docs/reference/metrics.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from devplugin.app.node_daemon import KubeLink, NodeDaemon
from devplugin.isolation.container_usage import ContainerGpuUse, container_use
from devplugin.isolation.shim_files import ShimPaths

log = logging.getLogger(__name__)

PREFIX = "gpushare_container_"
LABELS = ["node", "namespace", "pod", "container", "gpu", "uuid"]


# (family, type, help, ContainerGpuUse attribute); counters' samples end in _total.
FAMILIES: tuple[tuple[str, str, str, str], ...] = (
    ("memory_used_bytes", "gauge", "GPU memory the container's live processes hold (the shim's accounting), in bytes",
     "memory_used"),
    ("memory_limit_bytes", "gauge", "GPU memory the container was given, in bytes (a GPU held whole: all of it)",
     "memory_limit"),
    ("compute_used_percent", "gauge", "Percent of the GPU's time the container's launches took over the shim's last "
     "measurement (about 100 ms); only for containers with a compute share below 100", "compute_used"),
    ("compute_share_percent", "gauge", "Percent of the GPU's compute the container was given (100: no compute limit)",
     "compute_share"),
    ("memory_refusals", "counter", "Allocations refused because the container was at its memory cap", "refused"),
    ("throttled_seconds", "counter", "Time the container's launches waited for its compute share, summed over its "
     "threads", "throttled_s"),
    ("processes", "gauge", "Processes of the container registered in its usage file (CUDA users)", "processes"),
)
UNREADABLE = (PREFIX + "usage_unreadable", "1 when the container's usage file cannot be read (the reason says why; "
              "its figures then show 0)")


def families() -> dict[str, str]:
    """{family name: type} of every per-container metric (for the docs' and the dashboard's checks)."""
    out = {PREFIX + name: kind for name, kind, _, _ in FAMILIES}
    out[UNREADABLE[0]] = "gauge"
    return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return repr(float(value))  # the figures are finite: clamped when read (usage_file.py)


def render(node_name: str, rows: list[ContainerGpuUse]) -> bytes:
    """The per-container families in Prometheus's text format (0.0.4). Written out here rather than through
    prometheus_client's generic writer, which formats every sample's labels anew: each row's label set is escaped
    once for all its metrics (a scrape's cost: bench/metrics_scrape.py)."""
    labels = [",".join(f'{k}="{_escape(v)}"' for k, v in zip(LABELS, (
        node_name, r.namespace, r.pod, r.container, str(r.gpu), r.uuid), strict=True)) for r in rows]
    out: list[str] = []
    for name, kind, doc, attr in FAMILIES:
        full = PREFIX + name
        out.append(f"# HELP {full} {doc}\n# TYPE {full} {kind}\n")
        sample = full + ("_total" if kind == "counter" else "")
        for r, lab in zip(rows, labels, strict=True):
            value = getattr(r, attr)
            if value is not None:
                out.append(f"{sample}{{{lab}}} {_number(value)}\n")
    out.append(f"# HELP {UNREADABLE[0]} {UNREADABLE[1]}\n# TYPE {UNREADABLE[0]} gauge\n")
    for r, lab in zip(rows, labels, strict=True):
        if r.error:
            out.append(f'{UNREADABLE[0]}{{{lab},reason="{_escape(r.error)}"}} 1.0\n')
    return "".join(out).encode()


def current_use(nd: NodeDaemon, paths: ShimPaths) -> list[ContainerGpuUse]:
    """The figures of every container the serving daemon holds devices for ([] when it delivers no shim)."""
    if nd.allocator.mounts is None:
        return []
    return container_use(nd.node, nd.allocator.holdings.holders(), paths)


def exposition(link: Callable[[], KubeLink | None], node_name: str) -> bytes:
    """The per-container families of the daemon serving now, read at scrape time (empty families while none
    serves). A failure to read the node's figures is logged and gives empty families: the scrape goes on."""
    current = link()
    nd = current.current if current is not None else None
    rows: list[ContainerGpuUse] = []
    if nd is not None:
        try:
            rows = current_use(nd, ShimPaths(host_root=Path(nd.cfg.shim_state_dir)))
        except (OSError, ValueError) as exc:
            log.warning("reading per-container GPU use failed: %s", exc, extra={"fields": {"node": node_name}})
    return render(node_name, rows)
