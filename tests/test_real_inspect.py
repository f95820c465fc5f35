"""`devplugin inspect` (text and `-o json`) on the real cluster after a seeded churn: every GPU's memory and
compute held, whole GPUs and the containers on each equal the kubelets' own books."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.realk8s.books import inspect_json_disagreements, inspect_text_disagreements
from tests.realk8s.churn import run_churn
from tests.realk8s.cluster import Cluster

pytestmark = pytest.mark.realk8s


def inspect(cluster: Cluster, *args: str) -> str:
    return subprocess.run([sys.executable, "-m", "devplugin", "inspect", "--kubeconfig", str(cluster.admin), *args],
                          capture_output=True, text=True, check=True).stdout


def test_inspect_equals_the_kubelets_books_after_churn(realk8s: Cluster, ns: str) -> None:
    run_churn(realk8s.core, ns, realk8s.books, seed=7, pods=40, delete_fraction=0.2)
    deadline = time.monotonic() + 15  # the node daemons republish their usage just after each change
    while True:
        report = json.loads(inspect(realk8s, "-o", "json"))
        bad = inspect_json_disagreements(report, realk8s.books())
        if not bad or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert bad == []
    text = inspect(realk8s)
    assert inspect_text_disagreements(text, report) == [], text
    assert sum(len(g["pods"]) for n in report["nodes"] for g in n["gpus"]) > 0
