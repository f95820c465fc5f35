"""The DRA mode's claim policies (deploy/components/dra/claim-policies.yaml), evaluated by the real kube-apiserver
(1.36, from e2e/bin): a tenant's ResourceClaim or ResourceClaimTemplate that asks our DeviceClasses for what no
GPU share can be (off the 256Mi step, cores off 5..100 by 5, zero, negative, a capacity that does not exist, a
share naming only one capacity, more memory than the largest GPU) is refused at create with a message naming the
request and what to change, in exact requests and in firstAvailable subrequests alike; the examples of
deploy/examples/dra are accepted. Without the policies the apiserver takes all of them (REFERENCE: "Claims'
capacity requests are NOT validated at create").

A bare apiserver (etcd and kube-apiserver; RBAC on) is enough: the policies are the apiserver's own CEL."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes.utils import parse_quantity

from tests.realk8s.apiserver import bare_apiserver

REPO = Path(__file__).resolve().parents[3]
KUBECTL = REPO / ".venv" / "bin" / "kubectl"
COMPONENT = REPO / "deploy" / "components" / "dra"
EXAMPLES = REPO / "deploy" / "examples" / "dra"
pytestmark = pytest.mark.realk8s
ADMIN = "admintoken"
NS = "tenant-a"
SHARE, WHOLE = "gpu.gpushare.io", "whole.gpu.gpushare.io"
LIMITS = "gpushare-dra-limits"
KINDS = ("resourceclaims", "resourceclaimtemplates")


@dataclass
class Api:
    server: str
    kubeconfig: Path

    def kubectl(self, *args: str, stdin: str = "") -> str:
        proc = subprocess.run([str(KUBECTL), "--kubeconfig", str(self.kubeconfig), *args], input=stdin,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def create(self, resource: str, body: dict, user: str = "tenant") -> tuple[int, str]:
        """(HTTP status, the refusal after "denied request: " or "") of creating `body` in NS as `user`."""
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        req = urllib.request.Request(f"{self.server}/apis/resource.k8s.io/v1/namespaces/{NS}/{resource}",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {ADMIN}", "Impersonate-User": user,
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
                return resp.status, ""
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read()).get("message", "").split("denied request: ")[-1]

    def set_limit(self, value: str | None) -> None:
        """largestGpuMemory of the ConfigMap (None: delete it); returns once a claim shows the apiserver uses it."""
        if value is None:
            self.kubectl("-n", "kube-system", "delete", "configmap", LIMITS)
        else:
            self.kubectl("-n", "kube-system", "apply", "-f", "-", stdin=json.dumps(
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": LIMITS, "namespace": "kube-system"},
                 "data": {"largestGpuMemory": value}}))
        probe = _claim([_exact("gpu", SHARE, {"memory": "16Gi", "cores": "5"})])
        want = {"15Gi": "more than the largest GPU", "15 GiB": "not a quantity"}.get(value or "", "")
        deadline = time.monotonic() + 30  # the apiserver reads the parameter through an informer
        while True:
            code, msg = self.create("resourceclaims", {**probe, "metadata": {"name": f"c{next(_seq)}"}})
            if (code, want in msg) == ((422, True) if want else (201, True)):
                return
            assert time.monotonic() < deadline, f"largestGpuMemory {value!r} never took effect ({code} {msg})"
            time.sleep(0.3)


_seq = iter(range(1_000_000))


def _claim(requests: list[dict], constraints: list[dict] | None = None) -> dict:
    devices: dict = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"c{next(_seq)}"}, "spec": {"devices": devices}}


def _template(requests: list[dict]) -> dict:
    claim = _claim(requests)
    return {**claim, "kind": "ResourceClaimTemplate", "spec": {"spec": claim["spec"]}}


def _body(resource: str, requests: list[dict]) -> dict:
    return _claim(requests) if resource == "resourceclaims" else _template(requests)


def _exact(name: str, cls: str, caps: dict[str, str] | None = None, **extra: object) -> dict:
    exactly: dict = {"deviceClassName": cls, **extra}
    if caps is not None:
        exactly["capacity"] = {"requests": caps}
    return {"name": name, "exactly": exactly}


def _sub(name: str, cls: str, caps: dict[str, str] | None = None) -> dict:
    sub: dict = {"name": name, "deviceClassName": cls}
    if caps is not None:
        sub["capacity"] = {"requests": caps}
    return sub


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
    root = Path(tempfile.mkdtemp(prefix="gs-dvap-", dir="/tmp"))
    with ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, root, ignore_errors=True)
        bare = cleanup.enter_context(bare_apiserver(root, ADMIN, timeout=90))
        a = Api(bare.server, bare.kubeconfig)
        a.kubectl("apply", "-f", str(COMPONENT / "deviceclasses.yaml"), "-f", str(COMPONENT / "claim-policies.yaml"))
        a.kubectl("create", "namespace", NS)
        a.kubectl("-n", NS, "create", "serviceaccount", "default")  # no controller-manager runs
        a.kubectl("-n", NS, "create", "role", "tenant", "--verb=create,get",
                  "--resource=resourceclaims.resource.k8s.io,resourceclaimtemplates.resource.k8s.io,pods,"
                  "deployments.apps")
        a.kubectl("-n", NS, "create", "rolebinding", "tenant", "--role=tenant", "--user=tenant")
        # a policy takes effect once the apiserver has compiled it: wait until an off-step claim is refused
        deadline = time.monotonic() + 90
        while a.create("resourceclaims", _claim([_exact("gpu", SHARE, {"memory": "1000Mi", "cores": "30"})]))[0] \
                != 422:
            assert time.monotonic() < deadline, "the claim policy never took effect"
            time.sleep(0.5)
        yield a


def _step(request: str, value: str) -> str:
    return (f"gpushare: request {request} asks memory {value}; a GPU share's memory is a positive multiple of "
            "256Mi (e.g. 256Mi, 1Gi, 1280Mi, 4Gi): ask that (the scheduler would otherwise round it up)")


def _cores(request: str, value: str) -> str:
    return (f"gpushare: request {request} asks cores {value}; cores is the percent of one GPU's compute, a "
            "multiple of 5 from 5 to 100 (e.g. \"30\"): ask that (for more than one GPU, ask count or several "
            "requests)")


def _half(requests: str) -> str:
    return (f"gpushare: request {requests} of DeviceClass gpu.gpushare.io must name both capacity.requests.memory "
            "and capacity.requests.cores (e.g. memory: 4Gi, cores: \"30\"); one left out would take the device's "
            "default, not a share of your choosing. For a whole GPU use DeviceClass whole.gpu.gpushare.io")


def _names(request: str, names: str, cls: str = SHARE) -> str:
    return (f"gpushare: request {request} asks capacity {names}; the GPUs of DeviceClass {cls} have only the "
            "capacities memory and cores (plain names, no domain): rename or remove it")


def _whole(request: str, asked: str) -> str:
    return (f"gpushare: request {request} of DeviceClass whole.gpu.gpushare.io asks capacity {asked}; a whole "
            "GPU's capacity requests are the least memory / cores the GPU must have: positive, cores at most 100, "
            "or leave them out")


def _too_large(asked: str, limit: str = "15Gi") -> str:
    return (f"gpushare: {asked}, more than the largest GPU of this cluster has ({limit}, ConfigMap "
            f"kube-system/{LIMITS}): no device can hold it; ask at most {limit}, or several GPUs")


REFUSED = [
    ("off the step", [_exact("gpu", SHARE, {"memory": "1000Mi", "cores": "30"})], _step("gpu", "1000Mi")),
    ("zero memory", [_exact("gpu", SHARE, {"memory": "0", "cores": "30"})], _step("gpu", "0")),
    ("negative memory", [_exact("gpu", SHARE, {"memory": "-4Gi", "cores": "30"})], _step("gpu", "-4Gi")),
    ("fractional bytes", [_exact("gpu", SHARE, {"memory": "1.5", "cores": "30"})], _step("gpu", "1500m")),
    ("cores off the step", [_exact("gpu", SHARE, {"memory": "4Gi", "cores": "33"})], _cores("gpu", "33")),
    ("cores above 100", [_exact("gpu", SHARE, {"memory": "4Gi", "cores": "150"})], _cores("gpu", "150")),
    ("cores zero", [_exact("gpu", SHARE, {"memory": "4Gi", "cores": "0"})], _cores("gpu", "0")),
    ("cores negative", [_exact("gpu", SHARE, {"memory": "4Gi", "cores": "-30"})], _cores("gpu", "-30")),
    ("cores fractional", [_exact("gpu", SHARE, {"memory": "4Gi", "cores": "30500m"})], _cores("gpu", "30500m")),
    ("memory only", [_exact("gpu", SHARE, {"memory": "4Gi"})], _half("gpu")),
    ("cores only", [_exact("gpu", SHARE, {"cores": "50"})], _half("gpu")),
    ("no capacity", [_exact("a", SHARE), _exact("b", SHARE, {})], _half("a, b")),
    ("a domain-qualified name", [_exact("gpu", SHARE, {"gpu.gpushare.io/memory": "4Gi", "memory": "4Gi",
                                                       "cores": "30"})], _names("gpu", "gpu.gpushare.io/memory")),
    ("an unknown capacity", [_exact("gpu", WHOLE, {"sm": "10"})], _names("gpu", "sm", WHOLE)),
    ("whole, zero memory", [_exact("gpu", WHOLE, {"memory": "0"})], _whole("gpu", "memory 0")),
    ("whole, cores above 100", [_exact("gpu", WHOLE, {"cores": "200"})], _whole("gpu", "cores 200")),
    ("the second request", [_exact("ok", SHARE, {"memory": "1Gi", "cores": "10"}),
                            _exact("bad", SHARE, {"memory": "1Gi", "cores": "12"})], _cores("bad", "12")),
    ("a firstAvailable subrequest",
     [{"name": "gpu", "firstAvailable": [_sub("big", SHARE, {"memory": "8Gi", "cores": "50"}),
                                         _sub("small", SHARE, {"memory": "300Mi", "cores": "10"})]}],
     _step("gpu/small", "300Mi")),
    ("a firstAvailable subrequest naming one capacity",
     [{"name": "gpu", "firstAvailable": [_sub("share", SHARE, {"memory": "2Gi"}), _sub("whole", WHOLE)]}],
     _half("gpu/share")),
]


@pytest.mark.parametrize("resource", KINDS)
@pytest.mark.parametrize(("case", "requests", "message"), REFUSED, ids=[c[0] for c in REFUSED])
def test_an_impossible_request_is_refused_saying_what_to_change(api: Api, resource: str, case: str,
                                                                requests: list[dict], message: str) -> None:
    assert api.create(resource, _body(resource, requests)) == (422, message)


ACCEPTED = [
    ("a 4Gi / 30 share", [_exact("gpu", SHARE, {"memory": "4Gi", "cores": "30"})]),
    ("the smallest share", [_exact("gpu", SHARE, {"memory": "256Mi", "cores": "5"})]),
    ("bytes on the step", [_exact("gpu", SHARE, {"memory": "1342177280", "cores": "100"})]),
    ("two shares", [_exact("gpu", SHARE, {"memory": "2Gi", "cores": "20"}, count=2)]),
    ("a whole GPU", [_exact("gpu", WHOLE)]),
    ("a whole GPU of at least 40Gi", [_exact("gpu", WHOLE, {"memory": "40Gi"})]),
    ("firstAvailable share, else whole",
     [{"name": "gpu", "firstAvailable": [_sub("share", SHARE, {"memory": "2Gi", "cores": "20"}),
                                         _sub("whole", WHOLE)]}]),
    ("another driver's class is not ours to check", [_exact("gpu", "gpu.nvidia.com", {"memory": "1000Mi"})]),
]


@pytest.mark.parametrize("resource", KINDS)
@pytest.mark.parametrize(("case", "requests"), ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_a_possible_request_is_accepted(api: Api, resource: str, case: str, requests: list[dict]) -> None:
    assert api.create(resource, _body(resource, requests)) == (201, "")


def test_the_examples_are_accepted(api: Api) -> None:
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            out = subprocess.run([str(KUBECTL), "--kubeconfig", str(api.kubeconfig), "--as", "tenant", "-n", NS,
                                  "create", "-f", "-"], input=json.dumps(doc), capture_output=True, text=True,
                                 timeout=60)
            assert out.returncode == 0, f"{path.name}: {doc['kind']} {doc['metadata']['name']}: {out.stderr}"


def test_memory_above_the_largest_gpu_is_refused_once_the_operator_sets_it(api: Api) -> None:
    huge = [_exact("gpu", SHARE, {"memory": "81Gi", "cores": "30"})]
    assert api.create("resourceclaims", _claim(huge)) == (201, "")  # shipped empty: not checked
    try:
        api.set_limit("15Gi")
        for resource in KINDS:
            assert api.create(resource, _body(resource, huge)) == (422, _too_large("request gpu asks memory 81Gi"))
            whole = [_exact("gpu", WHOLE, {"memory": "40Gi"})]
            assert api.create(resource, _body(resource, whole)) == (422, _too_large("request gpu asks memory 40Gi"))
            sub = [{"name": "gpu", "firstAvailable": [_sub("big", SHARE, {"memory": "16Gi", "cores": "50"}),
                                                      _sub("small", SHARE, {"memory": "15Gi", "cores": "50"})]}]
            assert api.create(resource, _body(resource, sub)) == (
                422, _too_large("request gpu/big asks memory 16Gi"))
            assert api.create(resource, _body(resource, [_exact("gpu", SHARE, {"memory": "15Gi",
                                                                                "cores": "50"})])) == (201, "")
        api.set_limit("15 GiB")
        code, msg = api.create("resourceclaims", _claim([_exact("gpu", SHARE, {"memory": "1Gi", "cores": "5"})]))
        assert (code, msg) == (422, f"gpushare: ConfigMap kube-system/{LIMITS} has largestGpuMemory \"15 GiB\", not "
                                    "a quantity; the cluster operator must set it to the largest GPU memory (e.g. "
                                    "80Gi) or empty it")
        assert api.create("resourceclaims", _claim([_exact("gpu", "gpu.nvidia.com")])) == (201, "")
        api.set_limit(None)  # no ConfigMap: not checked, the other rules still are
        assert api.create("resourceclaims", _claim(huge)) == (201, "")
        assert api.create("resourceclaims", _claim([_exact("gpu", SHARE, {"memory": "81Gi"})])) == (422, _half("gpu"))
    finally:
        api.set_limit("")


# --- the rule, as a property: the policy accepts a share exactly when the devices' request policy takes it as asked
MIB = 1 << 20


def _takes_as_asked(memory: str, cores: str) -> bool:
    """What the devices' request policy (validRange min 256Mi step 256Mi; min 5 max 100 step 5) takes without
    rounding: whole numbers on the steps, from the minimum up (the maximum is the GPU's, checked apart)."""
    m, c = parse_quantity(memory), parse_quantity(cores)
    return (m == m.to_integral_value() and m >= 256 * MIB and m % (256 * MIB) == 0
            and c == c.to_integral_value() and 5 <= c <= 100 and c % 5 == 0)


def _quantity(amounts: st.SearchStrategy[int], suffixes: list[str]) -> st.SearchStrategy[str]:
    whole = st.builds(lambda n, s: f"{n}{s}", amounts, st.sampled_from(suffixes))
    decimal = st.builds(lambda n, f, s: f"{n}.{f}{s}", amounts, st.sampled_from(["5", "25", "75", "125"]),
                        st.sampled_from(suffixes))
    return st.one_of(whole, decimal)


MEMORY = _quantity(st.integers(-3, 5000), ["", "Ki", "Mi", "Gi", "k", "M", "G", "m"])
CORES = _quantity(st.integers(-10, 120), ["", "m"])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(memory=MEMORY, cores=CORES)
def test_the_policy_accepts_a_share_exactly_when_the_request_policy_takes_it_as_asked(api: Api, memory: str,
                                                                                      cores: str) -> None:
    code, message = api.create("resourceclaims", _claim([_exact("gpu", SHARE, {"memory": memory, "cores": cores})]))
    if _takes_as_asked(memory, cores):
        assert (code, message) == (201, ""), (memory, cores)
    else:
        assert code == 422 and message.startswith("gpushare: request gpu asks "), (memory, cores, message)
        assert ("asks memory" in message) == (not _takes_as_asked(memory, "5")), (memory, cores, message)


def test_the_model_is_the_rounding_the_scheduler_would_do() -> None:
    """_takes_as_asked is the scheduler's roundUpRange as the identity: a value on the step from the minimum up."""
    def round_up(value: Decimal, low: int, step: int) -> Decimal:
        if value < low:
            return Decimal(low)
        n, mod = divmod(int(value) - low, step)  # the scheduler's integer arithmetic (Quantity.Value() rounds up)
        return Decimal(low + step * (n + (1 if mod else 0)))
    for memory, cores in (("1Gi", "30"), ("1000Mi", "30"), ("0", "5"), ("1Gi", "33"), ("256Mi", "5")):
        m, c = parse_quantity(memory), parse_quantity(cores)
        same = round_up(m, 256 * MIB, 256 * MIB) == m and round_up(c, 5, 5) == c
        assert same == _takes_as_asked(memory, cores), (memory, cores)


def test_a_claim_at_the_apis_size_limits_is_judged_not_failed_by_the_cel_cost_limit(api: Api) -> None:
    """32 requests of 8 firstAvailable subrequests each (the API's maxima): the policies still decide within the
    apiserver's CEL cost budget, and the message names three requests and counts the rest (an evaluated message
    above 5 KiB would be replaced by the bare expression)."""
    def many(cores: str) -> list[dict]:
        return [{"name": f"r{i}", "firstAvailable": [_sub(f"s{j}", SHARE, {"memory": "1Gi", "cores": cores})
                                                     for j in range(8)]} for i in range(32)]
    for resource in KINDS:
        assert api.create(resource, _body(resource, many("30"))) == (201, "")
        code, message = api.create(resource, _body(resource, many("33")))
        assert (code, message) == (422, "gpushare: request r0/s0 asks cores 33; request r0/s1 asks cores 33; request "
                                         "r0/s2 asks cores 33; and 253 more; cores is the percent of one GPU's "
                                         "compute, a multiple of 5 from 5 to 100 (e.g. \"30\"): ask that (for more "
                                         "than one GPU, ask count or several requests)")
