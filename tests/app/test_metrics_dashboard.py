"""The Grafana dashboard and docs/reference/metrics.md agree with the metrics the code exports: a query naming a metric
that no longer exists shows an empty panel with no error, so it is checked here."""

from __future__ import annotations

import json
import re
from pathlib import Path

from devplugin.app import usage_metrics
from devplugin.app.metrics import NodeMetrics
from devplugin.dra.metrics import DraMetrics
from devplugin.scheduler.metrics import SchedulerMetrics
from devplugin.scheduler.state import ClusterState

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "gpushare-dashboard.json"
DOC = ROOT / "docs" / "reference" / "metrics.md"
METRIC = re.compile(r"\bgpushare_[a-z0-9_]+\b")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",), "info": ("_info",)}


def families() -> dict[str, str]:
    """Every metric family the services export ({name: type}); the collectors yield their families even with
    nothing to report."""
    out = {}
    registries = (NodeMetrics(lambda: None).registry, SchedulerMetrics(ClusterState()).registry,
                  DraMetrics("node", lambda: 0).registry)
    for registry in registries:
        for family in registry.collect():
            out[family.name] = family.type
    out.update(usage_metrics.families())  # the per-container families, rendered beside the node daemon's registry
    return out


def sample_names() -> set[str]:
    return {name + suffix for name, kind in families().items() for suffix in SUFFIXES[kind]}


def panels() -> list[dict]:
    doc = json.loads(DASHBOARD.read_text())
    out = []
    for p in doc["panels"]:
        out.append(p)
        out += p.get("panels", [])
    return out


def queries() -> list[str]:
    return [t["expr"] for p in panels() for t in p.get("targets", [])]


def test_dashboard_is_valid_json_with_unique_ids_and_a_datasource_variable() -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] and doc["title"]
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for p in panels():
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
            assert p["targets"], f"panel {p['title']!r} has no query"


def test_every_query_names_only_metrics_the_code_exports() -> None:
    exported = sample_names()
    doc = json.loads(DASHBOARD.read_text())
    texts = queries() + [v["definition"] for v in doc["templating"]["list"] if "definition" in v]
    for expr in texts:
        named = set(METRIC.findall(expr))
        assert named, f"query names no gpushare metric: {expr}"
        assert named <= exported, f"{expr}: {sorted(named - exported)} not exported"


def test_dashboard_shows_what_operators_ask_for() -> None:
    used = {m for expr in queries() for m in METRIC.findall(expr)}
    for name in ("gpushare_gpu_memory_allocated_bytes", "gpushare_gpu_memory_capacity_bytes",
                 "gpushare_gpu_core_allocated_percent", "gpushare_gpu_core_capacity_percent",
                 "gpushare_gpu_containers", "gpushare_gpu_healthy", "gpushare_gpu_unhealthy_info",
                 "gpushare_resource_registered", "gpushare_admission_duration_seconds_bucket",
                 "gpushare_admission_refusals_total", "gpushare_apiserver_errors_total",
                 "gpushare_extender_duration_seconds_bucket", "gpushare_extender_binds_total",
                 "gpushare_webhook_denials_total", "gpushare_container_memory_used_bytes",
                 "gpushare_container_memory_limit_bytes", "gpushare_container_compute_used_percent",
                 "gpushare_container_compute_share_percent", "gpushare_container_memory_refusals_total",
                 "gpushare_container_throttled_seconds_total", "gpushare_container_processes"):
        assert name in used, f"the dashboard does not show {name}"
    quantiles = [e for e in queries() if "histogram_quantile(0.99" in e]
    assert any("admission_duration" in e for e in quantiles) and any("extender_duration" in e for e in quantiles)


def test_docs_list_every_metric() -> None:
    text = DOC.read_text()
    listed = set(METRIC.findall(text))
    for name, kind in families().items():
        shown = name + ("_total" if kind == "counter" else "")
        assert shown in listed, f"docs/reference/metrics.md does not list {shown}"
    known = sample_names() | set(families())  # a histogram is listed by its family name
    assert listed <= known, (
        f"docs/reference/metrics.md names metrics the code does not export: {sorted(listed - known)}")


def test_per_namespace_and_per_pod_panels_for_use_against_allocation() -> None:
    by_title = {p["title"]: [t["expr"] for t in p.get("targets", [])] for p in panels()}
    per_namespace = by_title["Memory used vs allocated, per namespace"]
    assert all("by (namespace)" in e for e in per_namespace)
    assert all("by (namespace, pod)" in e for e in by_title["Per pod: memory and compute used against allocation"])
    at_cap = by_title["Containers at their memory cap"][0]
    assert "gpushare_container_memory_used_bytes" in at_cap and ">=" in at_cap
    idle = by_title["Idle slices: allocated, unused for an hour"][0]
    assert "max_over_time(gpushare_container_memory_used_bytes" in idle and "[1h]" in idle and "offset 1h" in idle
    doc = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in doc["templating"]["list"]}
    assert "namespace" in variables
    assert all('namespace=~"$namespace"' in e for p in panels() if p["id"] >= 24 for e in
               [t["expr"] for t in p.get("targets", [])])
