"""Request and response bodies of the service, as pydantic models (the OpenAPI document is built from them).

Kubernetes objects are checked for the fields the service reads (with their types) and keep every other field
(extra="allow"). The extender's field names are Go's (capitalised, as kube-scheduler sends them); lower-case
names are accepted too, as Go's decoder would.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class ObjectMeta(_Open):
    name: str = ""
    namespace: str = ""
    generateName: str = ""
    uid: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class EnvVar(_Open):
    name: str


class Resources(_Open):
    limits: dict[str, str | int] = Field(default_factory=dict)
    requests: dict[str, str | int] = Field(default_factory=dict)


class Container(_Open):
    name: str
    resources: Resources = Field(default_factory=Resources)
    env: list[EnvVar] | None = None


class PodSpec(_Open):
    containers: list[Container]
    initContainers: list[Container] | None = None
    nodeName: str | None = None


class PodStatus(_Open):
    phase: str | None = None


class PodObject(_Open):
    metadata: ObjectMeta
    spec: PodSpec
    status: PodStatus | None = None


class NodeObject(_Open):
    metadata: ObjectMeta


class NodeListObject(_Open):
    items: list[NodeObject] = Field(default_factory=list)


def _go(name: str) -> Any:
    return Field(default=None, validation_alias=AliasChoices(name, name[0].lower() + name[1:]))


# --- kube-scheduler extender (k8s.io/kube-scheduler/extender/v1) ---------------------------------------------
class ExtenderArgs(BaseModel):
    model_config = ConfigDict(extra="ignore")
    Pod: PodObject = Field(validation_alias=AliasChoices("Pod", "pod"))
    Nodes: NodeListObject | None = _go("Nodes")
    NodeNames: list[str] | None = _go("NodeNames")


class ExtenderFilterResult(BaseModel):
    Nodes: NodeListObject | None = None
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str] = Field(default_factory=dict)
    FailedAndUnresolvableNodes: dict[str, str] = Field(default_factory=dict)
    Error: str = ""


class HostPriority(BaseModel):
    Host: str
    Score: int


class ExtenderBindingArgs(BaseModel):
    model_config = ConfigDict(extra="ignore")
    PodName: str = Field(min_length=1, validation_alias=AliasChoices("PodName", "podName"))
    PodNamespace: str = Field(min_length=1, validation_alias=AliasChoices("PodNamespace", "podNamespace"))
    PodUID: str = Field(default="", validation_alias=AliasChoices("PodUID", "podUID"))
    Node: str = Field(min_length=1, validation_alias=AliasChoices("Node", "node"))


class ExtenderBindingResult(BaseModel):
    Error: str = ""


class MetaPod(BaseModel):
    model_config = ConfigDict(extra="ignore")
    UID: str = Field(validation_alias=AliasChoices("UID", "uid"))


class MetaVictims(BaseModel):
    model_config = ConfigDict(extra="ignore")
    Pods: list[MetaPod] = Field(default_factory=list, validation_alias=AliasChoices("Pods", "pods"))
    NumPDBViolations: int = Field(default=0, validation_alias=AliasChoices("NumPDBViolations", "numPDBViolations"))


class Victims(BaseModel):
    model_config = ConfigDict(extra="ignore")
    Pods: list[PodObject] = Field(default_factory=list, validation_alias=AliasChoices("Pods", "pods"))
    NumPDBViolations: int = Field(default=0, validation_alias=AliasChoices("NumPDBViolations", "numPDBViolations"))


class ExtenderPreemptionArgs(BaseModel):
    model_config = ConfigDict(extra="ignore")
    Pod: PodObject = Field(validation_alias=AliasChoices("Pod", "pod"))
    NodeNameToVictims: dict[str, Victims] | None = _go("NodeNameToVictims")
    NodeNameToMetaVictims: dict[str, MetaVictims] | None = _go("NodeNameToMetaVictims")


class ExtenderPreemptionResult(BaseModel):
    NodeNameToMetaVictims: dict[str, MetaVictims] = Field(default_factory=dict)


# --- AdmissionReview (admission.k8s.io/v1) ---------------------------------------------------------------------
class GroupVersionKind(_Open):
    group: str = ""
    version: str = ""
    kind: str = ""


class AdmissionRequest(_Open):
    uid: str = Field(min_length=1)
    kind: GroupVersionKind = Field(default_factory=GroupVersionKind)
    namespace: str = ""
    operation: str = "CREATE"
    object: dict[str, Any] | None = None
    oldObject: dict[str, Any] | None = None  # the pod before an UPDATE (an ephemeral container being added)
    subResource: str = ""
    dryRun: bool | None = None


class AdmissionReview(_Open):
    apiVersion: Literal["admission.k8s.io/v1"]
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest


class Status(BaseModel):
    code: int
    message: str
    reason: str = ""


class AdmissionResponse(BaseModel):
    uid: str
    allowed: bool
    status: Status | None = None
    patch: str | None = None  # base64 of a JSON Patch
    patchType: Literal["JSONPatch"] | None = None
    warnings: list[str] | None = None


class AdmissionReviewResponse(BaseModel):
    apiVersion: Literal["admission.k8s.io/v1"] = "admission.k8s.io/v1"
    kind: Literal["AdmissionReview"] = "AdmissionReview"
    response: AdmissionResponse


class Problem(BaseModel):
    """The body of every 400."""

    error: str
