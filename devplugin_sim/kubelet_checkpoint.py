"""The device manager checkpoint (kubelet_internal_checkpoint): allocations that outlive a kubelet restart.

The JSON has the shape of the kubelet's (Data.PodDeviceEntries, Data.RegisteredDevices) without its checksum.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from pathlib import Path

from google.protobuf.message import DecodeError

from devplugin.api.deviceplugin.v1beta1 import api_pb2
from devplugin_sim.kubelet_pod_devices import ContainerAllocation, PodDevices

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "kubelet_internal_checkpoint"  # devicemanager kubeletDeviceManagerCheckpoint
NO_NUMA = -1  # devicemanager nodeWithoutTopology


def _entry(uid: str, container: str, resource: str, alloc: ContainerAllocation) -> dict:
    per_numa: dict[str, list[str]] = {}
    for device_id in alloc.device_ids:
        for node in alloc.numa.get(device_id) or [NO_NUMA]:
            per_numa.setdefault(str(node), []).append(device_id)
    return {
        "PodUID": uid,
        "ContainerName": container,
        "ResourceName": resource,
        "DeviceIDs": per_numa,
        "AllocResp": base64.b64encode(alloc.response.SerializeToString()).decode(),
    }


# mirrors ManagerImpl.writeCheckpoint
def write_checkpoint(path: Path, pod_devices: PodDevices, registered: dict[str, set[str]]) -> None:
    entries = [
        _entry(uid, container, resource, alloc)
        for uid, containers in pod_devices.pods.items()
        for container, resources in containers.items()
        for resource, alloc in resources.items()
    ]
    data = {"Data": {"PodDeviceEntries": entries,
                     "RegisteredDevices": {r: sorted(ids) for r, ids in registered.items()}}}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


# mirrors ManagerImpl.readCheckpoint: returns the allocations and the names of the registered resources
def read_checkpoint(path: Path) -> tuple[PodDevices, list[str]]:
    pod_devices = PodDevices()
    if not path.exists():
        log.debug("no checkpoint at %s: starting with no allocations", path)
        return pod_devices, []
    try:
        data = json.loads(path.read_text())["Data"]
        for e in data.get("PodDeviceEntries") or []:
            ids: list[str] = []
            numa: dict[str, list[int]] = {}
            for node, devs in e["DeviceIDs"].items():
                for d in devs:
                    if d not in numa:
                        ids.append(d)
                        numa[d] = []
                    if int(node) != NO_NUMA:
                        numa[d].append(int(node))
            resp = api_pb2.ContainerAllocateResponse()
            resp.ParseFromString(base64.b64decode(e["AllocResp"]))
            pod_devices.insert(e["PodUID"], e["ContainerName"], e["ResourceName"],
                               ContainerAllocation(ids, resp, numa))
        registered = list(data.get("RegisteredDevices") or {})
    except (ValueError, KeyError, TypeError, DecodeError) as err:
        # the kubelet logs and continues: "Device allocation info may NOT be up-to-date"
        log.warning("checkpoint %s unreadable (%s): continuing with no allocations", path, err)
        return PodDevices(), []
    return pod_devices, registered
