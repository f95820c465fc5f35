"""`devplugin scheduler` as a process, flooded: 40 anonymous callers post the worst bodies a tenant can (reviews of
pods with tens of thousands of containers or env names, and the most expensive review the limits let through),
twice each, all at once. The process stays under half the memory limit the Deployment ships, and the apiserver's
review and kube-scheduler's filter are answered in time meanwhile."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml
from kubernetes.utils import parse_quantity

from devplugin_sim.fake_apiserver import FakeApiserver
from tests.scheduler import review_bodies
from tests.scheduler.test_cluster import wait_for
from tests.scheduler.test_service import free_port
from tests.scheduler.tls_certs import make_ca, make_leaf
from tests.support.scheduler_objects import node, pod

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command for test certs")
REPO = Path(__file__).resolve().parents[2]
BODY = int(3.9 * (1 << 20))


def shipped_memory_limit() -> int:
    docs = yaml.safe_load_all((REPO / "deploy" / "scheduler" / "deployment.yaml").read_text())
    [deployment] = [d for d in docs if d and d["kind"] == "Deployment"]
    [c] = deployment["spec"]["template"]["spec"]["containers"]
    return int(parse_quantity(c["resources"]["limits"]["memory"]))


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


def test_a_flood_of_the_worst_reviews_stays_under_half_the_memory_limit(tmp_path: Path) -> None:
    ca = make_ca(tmp_path, "ca")
    server = make_leaf(tmp_path, ca, "localhost", "serverAuth", ("localhost",))
    scheduler_cert = make_leaf(tmp_path, ca, "kube-scheduler", "clientAuth")
    bodies = ([review_bodies.wide_pod(BODY)] * 30 + [review_bodies.env_bomb(BODY)] * 6
              + [review_bodies.heaviest_accepted(BODY)] * 4)
    limit = shipped_memory_limit()
    port = free_port()
    with FakeApiserver() as api:
        n = node("n1", gpus=4, units=15)
        api.add_node("n1", labels=n["metadata"]["labels"], annotations=n["metadata"]["annotations"])
        log = (tmp_path / "log").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "devplugin", "scheduler", "--address", "127.0.0.1", "--port", str(port),
             "--tls-cert-file", str(server[0]), "--tls-private-key-file", str(server[1]),
             "--client-ca-file", str(ca[0]), "--kubeconfig", api.kubeconfig_path, "--log-level", "WARNING"],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(REPO)})
        url = f"https://127.0.0.1:{port}"

        def client(source: str, cert: tuple[Path, Path] | None = None, timeout: float = 120) -> httpx.Client:
            ctx = ssl.create_default_context(cafile=str(ca[0]))
            ctx.check_hostname = False
            if cert:
                ctx.load_cert_chain(str(cert[0]), str(cert[1]))
            return httpx.Client(verify=ctx, timeout=timeout, transport=httpx.HTTPTransport(
                verify=ctx, local_address=source))

        try:
            with client("127.0.0.3", scheduler_cert, timeout=5) as scheduler:
                def ready() -> bool:
                    try:
                        return scheduler.get(f"{url}/readyz").status_code == 200
                    except httpx.TransportError:
                        assert proc.poll() is None, (tmp_path / "log").read_text()
                        return False

                wait_for(ready, timeout=60, what="readyz")
                before = peak_rss(proc.pid)
                statuses: list[int | str] = []

                def flood(body: bytes) -> None:
                    with client("127.0.0.1") as c:
                        for _ in range(2):
                            try:
                                statuses.append(c.post(f"{url}/admission/validate", content=body).status_code)
                            except httpx.TransportError as exc:
                                statuses.append(type(exc).__name__)

                threads = [threading.Thread(target=flood, args=(b,), daemon=True) for b in bodies]
                for t in threads:
                    t.start()
                time.sleep(1.0)  # the flood is under way
                with client("127.0.0.2", timeout=5) as apiserver:
                    review = timed(lambda: apiserver.post(f"{url}/admission/validate",
                                                          content=review_bodies.legit()))
                filtered = timed(lambda: scheduler.post(f"{url}/scheduler/filter",
                                                        json={"Pod": pod(mem=20), "NodeNames": ["n1"]}))
                for t in threads:
                    t.join(timeout=300)
                peak = peak_rss(proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
    assert peak < limit // 2, (f"peak RSS {peak >> 20} MiB (from {before >> 20} MiB before the flood) against "
                               f"half the shipped limit, {limit >> 21} MiB")
    assert len(statuses) == 80 and set(statuses) <= {200, 413, 429}, statuses
    (r, review_s), (f, filter_s) = review, filtered
    assert isinstance(r, httpx.Response) and r.status_code == 200, r
    assert r.json()["response"]["allowed"] is True and review_s < 2.0, (r.text, review_s)
    assert isinstance(f, httpx.Response) and f.status_code == 200, f
    assert f.json()["FailedNodes"] == {"n1": "GPU 0..3: at most 15 GiB free on one GPU, 20 GiB asked"}
    assert filter_s < 2.0, filter_s


def timed(call: Callable[[], httpx.Response]) -> tuple[httpx.Response | str, float]:
    """(the answer, or the error that came instead, and the seconds it took)."""
    t0 = time.perf_counter()
    try:
        return call(), time.perf_counter() - t0
    except httpx.TransportError as exc:
        return f"{type(exc).__name__}: {exc}", time.perf_counter() - t0
