"""What a node's GPUs are, for a pod's GPU selection (devplugin/allocation/gpu_selection.py): each GPU's index,
UUID, model and MIG parent from the node's inventory, and what each selection seen there leaves out, remembered
while the inventory stands (filter and prioritize ask every node, and most pods of a workload select alike).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from devplugin.contract import NodeInventory

T = TypeVar("T")
MEMO_SIZE = 64  # selections remembered per node; past that the memo starts again


@dataclass(frozen=True, slots=True)
class CatalogGpu:
    index: int
    uuid: str
    model: str  # NVML's product name
    parent: str = ""  # a MIG device's GPU's UUID


class GpuCatalog:
    """A node's GPUs as a selection matches them, and the memo of what selections left out (thread-safe enough:
    two threads that miss the memo at once compute the same answer)."""

    __slots__ = ("gpus", "memo")

    def __init__(self, gpus: tuple[CatalogGpu, ...] = ()) -> None:
        self.gpus = gpus
        self.memo: dict[str, object] = {}

    @classmethod
    def of(cls, inventory: NodeInventory | None) -> GpuCatalog:
        if inventory is None:
            return cls()
        return cls(tuple(CatalogGpu(g.index, g.uuid, g.model, g.parent_uuid) for g in inventory.gpus))

    def remembered(self, key: str, compute: Callable[[], T]) -> T:
        """compute(), remembered under `key` (a selection's key) for this inventory."""
        got = self.memo.get(key)
        if got is None:
            got = compute()
            if len(self.memo) >= MEMO_SIZE:
                self.memo.clear()
            self.memo[key] = got
        return got  # type: ignore[return-value]
