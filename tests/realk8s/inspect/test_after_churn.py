"""`devplugin inspect` (text and `-o json`) on the real cluster after a seeded churn: every GPU's memory and
compute held, whole GPUs and the containers on each equal the kubelets' own books, and what the pods that run see
from inside is what they were given (tests/realk8s/inside.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.realk8s.books import inspect_json_disagreements, inspect_text_disagreements
from tests.realk8s.churn import run_churn
from tests.realk8s.cluster import Cluster
from tests.realk8s.inside import Sampler, running_pods_see_what_they_were_given

pytestmark = pytest.mark.realk8s


def inspect(cluster: Cluster, *args: str) -> str:
    return subprocess.run([sys.executable, "-m", "devplugin", "inspect", "--kubeconfig", str(cluster.admin), *args],
                          capture_output=True, text=True, check=True).stdout


def test_inspect_equals_the_kubelets_books_after_churn(realk8s: Cluster, ns: str) -> None:
    sampled = Sampler(realk8s, seed=7)
    run_churn(realk8s.core, ns, realk8s.books, seed=7, pods=40, delete_fraction=0.2, settled=sampled)
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
    assert sampled.checked and sampled.found == [], sampled.found
    alive, found = running_pods_see_what_they_were_given(realk8s, ns)
    assert alive > 0 and found == []
