"""What node-local pairing asks the kubelet's PodResources during an admission: the pods it lists now (after a
sync of the node view, or without one), and whether devices an earlier container holds are handed on to this one.
Each read is one local call through the allocator's links (ports.Links); None where the kubelet cannot be asked."""

from __future__ import annotations

import logging
from collections.abc import Sequence, Set

from devplugin.allocation.holdings import Holdings
from devplugin.allocation.node import Node
from devplugin.allocation.ports import PAIRING_LOG, Links
from devplugin.allocation.units import Kind

log = logging.getLogger(PAIRING_LOG)


def kubelet_pods(links: Links) -> frozenset[tuple[str, str]] | None:
    """The pods the kubelet lists now, the node view synced with it (None when it cannot be asked)."""
    if links.read_kubelet is None:
        return None
    listing = links.read_kubelet()
    return listing.pods if listing is not None else None


def listed_pods(links: Links, holdings: Holdings) -> frozenset[tuple[str, str]] | None:
    """The pods the kubelet lists now (None when it cannot be asked), for the GetPreferredAllocation of a
    container's second resource. Without a pod cache that is all it needs: its GPU was chosen on its first call,
    right after a sync; its units come from the kubelet's `available`, which frees the stale holders of this
    resource (ViewSync.observe_available); a sync now could name no container (no pods to name them from) and would
    only forget ended holders a moment before the next container's first call does, before that places anything.
    It still syncs when the last sync kept devices the kubelet did not list (Holdings.unsettled: a container that
    ended just after its Allocate), which a sync a moment later may forget; and with a pod cache, where the kubelet
    lists the first resource's devices by now and the sync names the container from them (ViewSync.reconcile)."""
    if links.lookup is None and links.read_pods is not None and not holdings.unsettled:
        return links.read_pods()
    return kubelet_pods(links)


def handed_on(links: Links, node: Node, kind: Kind, ids: Sequence[str], holders: Set[str]) -> Set[str]:
    """`holders` when the kubelet hands their devices on to this container: no live container the kubelet lists
    holds them (an init container's devices, which the kubelet reuses for the pod's app containers without asking
    the plugin: PodResources does not list init containers), else nothing (a device given twice)."""
    listing = links.read_kubelet() if links.read_kubelet is not None else None
    if listing is None:
        return frozenset()
    wanted = set(ids)
    if any(wanted.intersection(entry.devices.get(kind, ())) for entry in listing.containers):
        return frozenset()
    log.info("%s: the kubelet hands devices of an earlier container on to this one (an init container's, "
             "reused by an app container of its pod)", node.resource_name(kind),
             extra={"fields": {"resource": node.resource_name(kind), "devices": len(ids),
                               "holders": ",".join(sorted(holders))}})
    return holders
