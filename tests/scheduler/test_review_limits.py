"""An admission review costs memory bounded by its body, not by what the body parses into: a body of absurd shape
is refused before it is parsed, a pod of more containers or env entries than a review takes is denied before any
model is built from it, and a denial's message stays small however many problems and however long the names."""

from __future__ import annotations

import json
import threading
import tracemalloc
import warnings

from hypothesis import given, settings
from hypothesis import strategies as st

with warnings.catch_warnings():  # Starlette's note about the HTTP library under its test client
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from devplugin.scheduler.admission import MAX_LISTED_PROBLEMS
from devplugin.scheduler.http import Service, build_app
from devplugin.scheduler.review_limits import DEFAULT_MAX_BODY, DEFAULT_MAX_CONTAINERS, DEFAULT_MAX_ENV, json_tokens
from devplugin.scheduler.state import ClusterState
from tests.scheduler.test_http import review
from tests.support.scheduler_objects import container, node, pod


def app() -> TestClient:
    state = ClusterState()
    state.replace_nodes([node("n1", gpus=2, units=16)])
    return TestClient(build_app(Service(state, None, max_body=DEFAULT_MAX_BODY)))


def many_containers(n: int, image: str = "x") -> dict:
    return pod("wide", containers=[{"name": f"c{i}", "image": image} for i in range(n)])


IMAGE = "registry.example.com/team/inference-server:v1.2.3-" + "0" * 30  # 80 bytes a container


def compact(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def peak_while(fn: object) -> tuple[object, int]:
    """fn()'s result and the most memory Python held above the start while it ran (every thread traced)."""
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        out = fn()  # type: ignore[operator]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return out, peak - start


def test_a_review_of_tens_of_thousands_of_containers_is_refused_before_it_is_parsed() -> None:
    # 3.9 MiB of JSON that parsed into well over 100 MiB of dicts and models; a few of them at once took the
    # process past its 1 GiB limit. Now it is refused from its raw bytes, costing about the body once more.
    body = compact(review(many_containers(36_000, IMAGE)))
    assert 3 << 20 < len(body) < DEFAULT_MAX_BODY
    http = app()
    r, peak = peak_while(lambda: http.post("/admission/validate", content=body))
    assert r.status_code == 413, r.text  # type: ignore[attr-defined]
    error = r.json()["error"]  # type: ignore[attr-defined]
    assert "JSON separators" in error and "--max-review-tokens" in error
    assert peak < 3 * len(body), f"{peak >> 20} MiB held answering a {len(body) >> 20} MiB body"


def test_a_pod_with_more_containers_than_a_review_takes_is_denied_by_both_webhooks() -> None:
    http = app()
    body = review(many_containers(DEFAULT_MAX_CONTAINERS + 1))
    for hook in ("validate", "mutate"):
        r = http.post(f"/admission/{hook}", json=body)
        assert r.status_code == 200, r.text
        out = r.json()["response"]
        assert out["allowed"] is False and out["uid"] == "req-1"
        assert out["status"]["message"] == (
            f"pod has {DEFAULT_MAX_CONTAINERS + 1} containers (init, app and ephemeral), more than the "
            f"{DEFAULT_MAX_CONTAINERS} a review takes (--max-pod-containers); split the workload over several pods")
    # one fewer is reviewed as usual
    r = http.post("/admission/validate", json=review(many_containers(DEFAULT_MAX_CONTAINERS)))
    assert r.json()["response"]["allowed"] is True


def test_a_container_with_more_env_entries_than_a_review_takes_is_denied() -> None:
    env = {f"V{i}": "x" for i in range(DEFAULT_MAX_ENV + 1)}
    body = review(pod("envs", containers=[container("main", env=env)]))
    r = app().post("/admission/validate", json=body)
    out = r.json()["response"]
    assert out["allowed"] is False
    assert out["status"]["message"].startswith(
        f"pod containers[0] has {DEFAULT_MAX_ENV + 1} env and envFrom entries, more than the {DEFAULT_MAX_ENV}")


def test_a_container_name_longer_than_kubernetes_allows_is_denied() -> None:
    body = review(pod("named", containers=[container("n" * 64)]))
    out = app().post("/admission/mutate", json=body).json()["response"]
    assert out["allowed"] is False and "patch" not in out
    assert out["status"]["message"] == ("pod containers[0]: a container name of 64 characters is not a DNS label "
                                        "(at most 63, as Kubernetes requires); shorten it")


def test_a_denial_lists_twenty_problems_and_clips_the_names_it_repeats() -> None:
    # Each problem repeats its container's and its env's name: 500 reserved names of 2,000 characters made a
    # message of a megabyte, and longer names or more entries made it grow with their product.
    name = "CUDA_DEVICE_" + "X" * 2000
    env = [{"name": f"{name}{i}", "value": "0"} for i in range(500)]
    body = review(pod("loud", containers=[{**container("main"), "env": env}]))
    out = app().post("/admission/validate", json=body).json()["response"]
    message = out["status"]["message"]
    assert out["allowed"] is False
    assert len(message) < 8192, len(message)
    assert message.count("which only the node daemon may set") == MAX_LISTED_PROBLEMS
    assert message.endswith(f"; and {500 - MAX_LISTED_PROBLEMS} more problems like these")
    assert f"sets env {name[:63]}... (2013 characters)" in message


def test_reviews_in_flight_stay_small_while_many_are_posted_at_once() -> None:
    # The flood in one process: 14 bodies of 3.9 MiB posted together. Python's heap grows by a few bodies, not
    # by 14 times what each parses into.
    body = compact(review(many_containers(36_000, IMAGE)))
    http = app()
    statuses: list[int] = []

    def flood() -> None:
        threads = [threading.Thread(target=lambda: statuses.append(
            http.post("/admission/validate", content=body).status_code)) for _ in range(14)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)

    _, peak = peak_while(flood)
    assert peak < 80 << 20, f"{peak >> 20} MiB"
    assert len(statuses) == 14 and 413 in statuses
    assert set(statuses) <= {413, 429}  # refused unparsed, or turned away while others from the client ran


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(alphabet=",:[]{}\"\\ ab", max_size=8),
                    lambda kids: st.lists(kids, max_size=6) | st.dictionaries(st.text(max_size=4), kids, max_size=6),
                    max_leaves=60))
def test_the_raw_token_count_bounds_what_the_body_parses_into(value: object) -> None:
    def parsed(v: object) -> int:
        if isinstance(v, list):
            return 1 + sum(parsed(x) for x in v)
        if isinstance(v, dict):
            return 1 + sum(1 + parsed(x) for x in v.values())  # each key and its value
        return 1

    for text in (json.dumps(value), json.dumps(value, separators=(",", ":")), json.dumps(value, indent=2)):
        assert json_tokens(text.encode()) >= parsed(value)
