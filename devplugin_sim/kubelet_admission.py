"""Pod admission as the kubelet's device manager does it: choose device IDs, Allocate, PreStart, merge.

Init containers are admitted first; their devices are reused by the app containers (ManagerImpl.Allocate's
devicesToReuse): an app container takes reusable devices first and asks the plugin only for the rest, naming
the reused ones in must_include.
Deviations from the kubelet, all for a test bench: admissions of one emulator are serialised by the caller;
a PreStartContainer failure rejects the pod and frees its devices (the kubelet keeps the pod and retries the
container); a pod asking for an extended resource nobody registered is refused like the kubelet's resource
predicate does, after the device plugins were called.
"""

from __future__ import annotations

import logging

from devplugin_sim.kubelet_container_options import merge_responses
from devplugin_sim.kubelet_endpoint import EndpointError
from devplugin_sim.kubelet_manager import DeviceManager
from devplugin_sim.kubelet_pod_devices import ContainerAllocation
from devplugin_sim.kubelet_registration import is_native_resource
from devplugin_sim.kubelet_results import AdmissionError, AdmitResult, ContainerResult
from devplugin_sim.pods import ContainerSpec, PodSpec

log = logging.getLogger(__name__)


class _Trace:
    """RPCs made and unadvertised IDs seen, per container."""

    def __init__(self) -> None:
        self.calls: dict[str, list[str]] = {}
        self.unknown: dict[str, dict[str, list[str]]] = {}

    def call(self, container: str, text: str) -> None:
        self.calls.setdefault(container, []).append(text)

    def all_calls(self) -> list[str]:
        return [c for calls in self.calls.values() for c in calls]


# mirrors ManagerImpl.devicesToAllocate (reusable init-container devices first; no NUMA alignment)
def devices_to_allocate(m: DeviceManager, pod: PodSpec, container: str, resource: str, required: int,
                        trace: _Trace, reusable: set[str] | None = None) -> list[str] | None:
    with m.lock:
        healthy = m.table.healthy.get(resource)
        if healthy is None:
            raise AdmissionError(f"cannot allocate unregistered device {resource}")
        if not healthy:
            raise AdmissionError(f"no healthy devices present; cannot allocate unhealthy devices {resource}")
        if required == 0:
            return None
        reused = sorted(reusable or ())[:required]  # allocateRemainingFrom(reusableDevices)
        if len(reused) == required:
            return m.shuffled(reused)
        needed = required - len(reused)
        in_use = m.pod_devices.devices().get(resource, set())
        available = healthy - in_use
        if len(available) < needed:
            raise AdmissionError(f"requested number of devices unavailable for {resource}. "
                                 f"Requested: {required}, Available: {len(available)}")
        endpoint = m.endpoints.get(resource)
        advertised = set(m.table.all.get(resource, {}))
        available_list = m.shuffled(available)
    if endpoint is None:
        raise AdmissionError(f"endpoint not found in cache for a registered resource: {resource}")
    chosen: list[str] = list(reused)
    # mirrors ManagerImpl.callGetPreferredAllocationIfAvailable: only when the plugin offers it
    if endpoint.options.get_preferred_allocation_available:
        trace.call(container, f"GetPreferredAllocation {resource}")
        log.debug("pod %s container %s: GetPreferredAllocation %s size %d from %d available", pod.key,
                  container, resource, required, len(available_list))
        try:
            preferred = endpoint.get_preferred_allocation(available_list + reused, reused, required)
        except EndpointError as err:
            raise AdmissionError(str(err)) from None
        unknown = sorted({i for i in preferred if i not in advertised})
        if unknown:
            log.warning("pod %s container %s: plugin of %s preferred IDs it never advertised: %s", pod.key,
                        container, resource, unknown)
            trace.unknown.setdefault(container, {})[resource] = unknown
            with m.lock:
                m.unknown_ids.extend((resource, i) for i in unknown)
        chosen = reused + m.shuffled(set(preferred) & available)[:needed]
        if len(chosen) < required:
            log.debug("pod %s container %s: %s preference gave %d of %d usable IDs; the rest filled "
                      "at random", pod.key, container, resource, len(chosen), required)
    # mirrors the allocateRemainingFrom fall-back: the rest from what is available, in map (random) order
    rest = m.shuffled(available - set(chosen))
    chosen += rest[: required - len(chosen)]
    return chosen


# mirrors ManagerImpl.allocateContainerResources: one Allocate per resource, resources in Go-map order
def allocate_container_resources(m: DeviceManager, pod: PodSpec, c: ContainerSpec, trace: _Trace,
                                 reuse: dict[str, set[str]] | None = None) -> None:
    m.update_allocated_devices()
    for resource in m.shuffled(c.limits):
        needed = c.limits[resource]
        if not m.is_device_plugin_resource(resource):
            continue
        ids = devices_to_allocate(m, pod, c.name, resource, needed, trace, (reuse or {}).get(resource))
        if not ids:
            continue
        with m.lock:
            endpoint = m.endpoints.get(resource)
        if endpoint is None:
            raise AdmissionError(f"unknown Device Plugin {resource}")
        sent = m.shuffled(ids)  # the kubelet sends a set's UnsortedList: the plugin cannot rely on order
        trace.call(c.name, f"Allocate {resource}")
        log.debug("pod %s container %s: Allocate %s %s", pod.key, c.name, resource, sent)
        try:
            resp = endpoint.allocate(sent)
        except EndpointError as err:
            raise AdmissionError(str(err)) from None
        if not resp.container_responses:
            raise AdmissionError(f"no containers return in allocation response for {resource} "
                                 "(the plugin's AllocateResponse has no container_responses)")
        with m.lock:
            numa = {i: m.table.numa_nodes(resource, i) for i in sent}
            alloc = ContainerAllocation(sent, resp.container_responses[0], numa)
            m.pod_devices.insert(pod.uid, c.name, resource, alloc)
            m.write_checkpoint()


# stands in for the kubelet's resource predicate (GeneralPredicates) for extended resources nobody serves
def check_unserved_resources(m: DeviceManager, pod: PodSpec) -> None:
    for c in pod.containers:
        for resource, value in sorted(c.limits.items()):
            if value > 0 and not is_native_resource(resource) and not m.is_device_plugin_resource(resource):
                raise AdmissionError(
                    f"Node didn't have enough resource: {resource}, requested: {value}, used: 0, capacity: 0",
                    reason=f"OutOf{resource}",
                    message=f"Node didn't have enough resource: {resource}, requested: {value}, used: 0, "
                            f"capacity: 0 (no device plugin registered {resource})")


# mirrors ManagerImpl.GetDeviceRunContainerOptions: PreStartContainer where asked, then the merged options
def start_container(m: DeviceManager, pod: PodSpec, c: ContainerSpec, trace: _Trace) -> ContainerResult:
    for resource in m.shuffled(c.limits):
        if c.limits[resource] == 0 or not m.is_device_plugin_resource(resource):
            continue
        with m.lock:
            endpoint = m.endpoints.get(resource)
            devices = m.pod_devices.container_devices(pod.uid, c.name, resource)
        if endpoint is None:
            raise AdmissionError(f"endpoint not found in cache for a registered resource: {resource}")
        if not endpoint.options.pre_start_required:
            continue
        if devices is None:
            raise AdmissionError(f"no devices found allocated in local cache for pod {pod.uid}, "
                                 f"container {c.name}, resource {resource}")
        trace.call(c.name, f"PreStartContainer {resource}")
        try:
            endpoint.pre_start_container(devices)
        except EndpointError as err:
            raise AdmissionError(str(err), reason="CreateContainerConfigError", message=str(err)) from None
    with m.lock:
        allocations = m.pod_devices.container(pod.uid, c.name)
    order = m.shuffled(allocations)  # podDevices.deviceRunContainerOptions walks a Go map
    opts = merge_responses(c.name, [(r, allocations[r].response) for r in order], c.env)
    return ContainerResult(
        name=c.name, envs=opts.envs, mounts=opts.mounts, devices=opts.devices, annotations=opts.annotations,
        device_ids={r: list(a.device_ids) for r, a in allocations.items()}, calls=trace.calls.get(c.name, []),
        conflicts=opts.conflicts, cdi_devices=opts.cdi_devices, unknown_ids=trace.unknown.get(c.name, {}))


def admit_pod(m: DeviceManager, pod: PodSpec) -> AdmitResult:
    """Allocate every container, then start them; on any failure free what the pod got and raise."""
    with m.lock:
        if pod.uid in m.pods:
            raise ValueError(f"pod {pod.key} (uid {pod.uid}) is already admitted: remove_pod() it first")
        m.pods[pod.uid] = pod  # the pod being admitted is active, as in the kubelet's pod manager
    trace = _Trace()
    try:
        # mirrors ManagerImpl.Allocate: init containers first, their devices put up for reuse
        # (addContainerAllocatedResources); an app container's devices leave the pool
        # (removeContainerAllocatedResources)
        reuse: dict[str, set[str]] = {}
        for c in pod.init_containers:
            allocate_container_resources(m, pod, c, trace, reuse)
            with m.lock:
                for resource, alloc in m.pod_devices.container(pod.uid, c.name).items():
                    reuse.setdefault(resource, set()).update(alloc.device_ids)
        for c in pod.containers:
            allocate_container_resources(m, pod, c, trace, reuse)
            with m.lock:
                for resource, alloc in m.pod_devices.container(pod.uid, c.name).items():
                    reuse.get(resource, set()).difference_update(alloc.device_ids)
        check_unserved_resources(m, pod)
        init_results = [start_container(m, pod, c, trace) for c in pod.init_containers]
        results = [start_container(m, pod, c, trace) for c in pod.containers]
    except AdmissionError as err:
        err.calls = trace.all_calls()
        log.debug("pod %s rejected (%s): %s; its devices are freed", pod.key, err.reason, err)
        m.release_pod(pod.uid)
        raise
    except BaseException:
        m.release_pod(pod.uid)
        raise
    log.debug("pod %s admitted: %s", pod.key, {r.name: r.device_ids for r in results})
    m.notify()
    return AdmitResult(pod=pod, containers=results, init_containers=init_results)
