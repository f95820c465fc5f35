"""Text layout of the report: one block per node, one row per GPU, so any GPU count fits 80 columns; with the
node daemons' figures, the memory and compute used beside each allocation."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from devplugin.inspect.report import GpuReport, NodeReport, PodOnGpu, Report

WIDTH = 80


def unit_name(unit_mib: int) -> str:
    if unit_mib == 1024:
        return "GiB"
    if unit_mib == 1:
        return "MiB"
    return f"x{unit_mib}MiB"


def _pct(used: int, total: int) -> str:
    return f"{round(100 * used / total)}%" if total else "0%"


def _table(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(max(len(r) for r in rows))]
    out = []
    for r in rows:
        cells = [c.ljust(widths[i]) for i, c in enumerate(r)]
        out.append((indent + "  ".join(cells)).rstrip())
    return out


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _used(mib: float | None, unit_mib: int) -> str:
    if mib is None:
        return "-"
    value = mib / unit_mib
    return f"{value:.1f}".rstrip("0").rstrip(".") if value else "0"


def _gpu_row(g: GpuReport, unit_mib: int, use: bool) -> list[str]:
    core = "whole" if g.whole else f"{g.coreAllocated}/{g.coreTotal}"
    note = " ".join(([] if g.nvlink is None or g.parent else [f"nvlink {g.nvlink}"])
                    + ([] if g.healthy else ["unhealthy"]))
    name = f"  {g.index} {g.migProfile}" if g.parent else str(g.index)  # a MIG device, under its GPU's row
    if not use:
        return [name, f"{g.memAllocated}/{g.memTotal}", core, str(len(g.pods)), note]
    compute = "-" if g.computeUsed is None else f"{round(g.computeUsed)}"
    return [name, f"{g.memAllocated}/{g.memTotal}", _used(g.memUsedMiB, unit_mib), core, compute,
            str(len(g.pods)), note]


def _in_gpu_order(gpus: Sequence[GpuReport]) -> list[GpuReport]:
    """Whole GPUs by index, each GPU in MIG mode at its index as its MIG devices."""
    return sorted(gpus, key=lambda g: (g.parentIndex if g.parent and g.parentIndex is not None else g.index,
                                       bool(g.parent), g.index))


def _parent_row(g: GpuReport, use: bool) -> list[str]:
    """The row of a GPU in MIG mode: its index and `MIG`; its MIG devices follow."""
    label = str(g.parentIndex) if g.parentIndex is not None else g.parent
    return [label, "MIG", "", "", "", "", ""] if use else [label, "MIG", "", "", ""]


def _pod_line(p: PodOnGpu, unit: str, unit_mib: int) -> str:
    line = f"       {p.namespace}/{p.name} ({p.container})  " + (
        f"whole GPU  {p.state}" if p.whole else f"{p.mem} {unit}  {p.core} %  {p.state}")
    if p.memUsedMiB is not None:
        line += f"  used {_used(p.memUsedMiB, unit_mib)} {unit}"
        if p.computeUsed is not None:
            line += f"  {round(p.computeUsed)} %"
        if p.refused:
            line += f"  refused {p.refused:g}"
    return _cut(line, WIDTH)


def node_block(n: NodeReport, details: bool, use: bool = False) -> list[str]:
    head = "  ".join(x for x in (n.name, n.ip, n.mode, n.placement) if x)
    lines = [_cut(head, WIDTH)]
    if n.problem:
        lines += textwrap.wrap(n.problem, WIDTH, initial_indent="  ! ", subsequent_indent="    ")
    if not n.gpus:
        return lines
    if use and n.useError:
        lines += textwrap.wrap(f"use unknown: {n.useError}", WIDTH, initial_indent="  ! ", subsequent_indent="    ")
    unit = unit_name(n.unitMiB)
    head_row = ["GPU", f"MEMORY({unit})", "USED", "CORE(%)", "USED", "PODS", ""] if use else \
        ["GPU", f"MEMORY({unit})", "CORE(%)", "PODS", ""]
    rows: list[list[str]] = [head_row]
    pod_lines: dict[int, list[str]] = {}
    parents: set[str] = set()
    for g in _in_gpu_order(n.gpus):
        if g.parent and g.parent not in parents:
            parents.add(g.parent)
            rows.append(_parent_row(g, use))
        rows.append(_gpu_row(g, n.unitMiB, use))
        if details:
            pod_lines[len(rows) - 1] = [_pod_line(p, unit, n.unitMiB) for p in g.pods]
    mem = f"{n.memAllocated}/{n.memTotal} ({_pct(n.memAllocated, n.memTotal)})"
    core = f"{sum(g.coreAllocated for g in n.gpus)}/{sum(g.coreTotal for g in n.gpus)}"
    pods = str(sum(len(g.pods) for g in n.gpus))
    if use:
        used = [g.memUsedMiB for g in n.gpus if g.memUsedMiB is not None]
        rows.append(["all", mem, _used(sum(used), n.unitMiB) if used else "-", core, "", pods, ""])
    else:
        rows.append(["all", mem, core, pods, ""])
    for i, line in enumerate(_table(rows)):
        lines.append(line)
        lines.extend(pod_lines.get(i, []))
    return lines


def render_text(report: Report, details: bool = False) -> str:
    lines: list[str] = []
    if not report.nodes:
        lines.append("No node publishes a GPU inventory (is the devplugin node daemon running?).")
    use = any(n.useError or any(g.memUsedMiB is not None for g in n.gpus) for n in report.nodes)
    for n in report.nodes:
        lines.extend(node_block(n, details, use))
        lines.append("")
    if report.pending:
        rows = [["PENDING", "NODE", "MEMORY", "CORE(%)", "GPUS"]]
        rows += [[f"{p.namespace}/{p.name}", p.node or "-", str(p.mem), str(p.core), str(p.count)]
                 for p in report.pending]
        lines.extend(_cut(line, WIDTH) for line in _table(rows, indent=""))
        lines.append("")
    lines.append("-" * 60)
    total, used = report.memTotalMiB / 1024, report.memAllocatedMiB / 1024
    lines.append(f"Allocated/Total GPU Memory In Cluster: {used:g}/{total:g} GiB "
                 f"({_pct(report.memAllocatedMiB, report.memTotalMiB)})")
    return "\n".join(lines) + "\n"
