"""Text layout of the DRA part of the report: one block per node, one row per GPU (memory in GiB, allocated /
total and free; cores in percent), and with -d the claims on each GPU; then the claims still waiting, the largest
GPU beside the claim policies' limit, and the total. Every line fits 80 columns."""

from __future__ import annotations

import textwrap

from devplugin import contract
from devplugin.inspect.dra_report import ClaimOnGpu, DraGpu, DraNode, DraReport, is_quantity, quantity_int
from devplugin.inspect.layout import WIDTH, _cut, _pct, _table

GIB = 1 << 30
LIMITS = "kube-system/gpushare-dra-limits"


def gib(n: int) -> str:
    """Bytes as GiB with at most two decimals (256 MiB steps are exact): 4294967296 -> "4", 1342177280 -> "1.25"."""
    text = f"{n / GIB:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def _gpu_row(g: DraGpu) -> list[str]:
    memory = f"{gib(g.memAllocated)}/{gib(g.memTotal)}"
    cores = "whole" if g.whole else f"{g.coreAllocated}/{g.coreTotal}"
    note = ""
    if g.taints:
        unhealthy = [t for t in g.taints if t.startswith(contract.DRA_TAINT_UNHEALTHY + "=")]
        note = ("unhealthy " + unhealthy[0].split("=", 1)[1].rsplit(":", 1)[0]) if unhealthy else \
            "tainted " + ",".join(t.split("=", 1)[0].split(":", 1)[0] for t in g.taints)
    return [str(g.index) if g.index >= 0 else "?", memory, gib(g.memFree), cores, str(g.coreFree),
            str(len(g.claims)), note]


def _claim_line(c: ClaimOnGpu) -> str:
    pods = ",".join(c.pods) if c.pods else "no pod"
    what = "whole GPU" if c.whole else f"{gib(c.memory)} GiB  {c.cores} %  share {c.shareID[:8]}"
    return _cut(f"       {c.namespace}/{c.name} ({c.request})  {pods}  {what}", WIDTH)


def node_block(n: DraNode, details: bool) -> list[str]:
    rows: list[list[str]] = [["GPU", "MEMORY(GiB)", "FREE", "CORE(%)", "FREE", "CLAIMS", ""]]
    claim_lines: dict[int, list[str]] = {}
    for g in n.gpus:
        rows.append(_gpu_row(g))
        if details:
            claim_lines[len(rows) - 1] = [_claim_line(c) for c in g.claims]
    core_total = sum(g.coreTotal for g in n.gpus)
    core_allocated = sum(g.coreAllocated for g in n.gpus)
    rows.append(["all", f"{gib(n.memAllocated)}/{gib(n.memTotal)} ({_pct(n.memAllocated, n.memTotal)})",
                 gib(n.memTotal - n.memAllocated), f"{core_allocated}/{core_total}", str(core_total - core_allocated),
                 str(sum(len(g.claims) for g in n.gpus)), ""])
    lines = [_cut(n.name, WIDTH)]
    for i, line in enumerate(_table(rows)):
        lines.append(_cut(line, WIDTH))
        lines.extend(claim_lines.get(i, []))
    return lines


def _limit_lines(report: DraReport) -> list[str]:
    """The largest GPU beside the claim policies' limit (whole cluster only: one node's slices say too little)."""
    if report.node:
        return []
    largest = gib(report.largestGpuMemory)
    if not report.limit:
        text = (f"Largest GPU: {largest} GiB; claims' memory limit not set ({LIMITS}, largestGpuMemory): "
                "not checked")
    else:
        text = f"Largest GPU: {largest} GiB; claims' memory limit {report.limit} ({LIMITS})"
        limit = quantity_int(report.limit)
        if not is_quantity(report.limit):
            text += "; not a quantity: every claim of the gpushare DeviceClasses is refused, fix it"
        elif report.largestGpuMemory and limit < report.largestGpuMemory:
            text += f"; claims above {report.limit} are refused though a GPU offers {largest} GiB: raise it"
    return textwrap.wrap(text, WIDTH, subsequent_indent="  ", break_on_hyphens=False)


def render_dra_text(report: DraReport, details: bool = False) -> str:
    lines = [f"DRA ({report.driver})"]
    if not report.nodes:
        lines.append("No node publishes a ResourceSlice of this driver (is `devplugin dra` running?).")
    for n in report.nodes:
        lines.extend(node_block(n, details))
        lines.append("")
    if report.unplaced:
        lines.append("Allocated on devices no current ResourceSlice publishes:")
        lines.extend(_cut("  " + u, WIDTH) for u in report.unplaced)
        lines.append("")
    if report.pending:
        rows = [["PENDING CLAIM", "REQUESTS"]]
        for p in report.pending:
            rows += [[f"{p.namespace}/{p.name}" if i == 0 else "", r] for i, r in enumerate(p.requests)]
        lines.extend(_cut(line, WIDTH) for line in _table(rows, indent=""))
        lines.append("")
    lines.extend(_limit_lines(report))
    lines.append(f"Allocated/Total GPU Memory (DRA): {gib(report.memAllocated)}/{gib(report.memTotal)} GiB "
                 f"({_pct(report.memAllocated, report.memTotal)})")
    return "\n".join(lines) + "\n"
