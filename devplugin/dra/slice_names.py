"""The names a node's ResourceSlices may take, and which of them a node owns.

A node's slices are `<node>-gpushare-counters` and `<node>-gpushare-devices`; when one of those names is taken by
an object that is not this node's slice of this driver (another node's plugin before the slice policy was
installed, an administrator, another controller), the slice takes `<name>-<8 hex digits>` instead. The node owns
exactly these names: no other node name gives any of them (the suffix `counters` / `devices` / 8 hex digits
decides where the node's name ends), and the admission policy gpushare-dra-plugin-own-slices
(deploy/components/dra-node/slice-policy.yaml) lets a node's plugin create slices under these names only.
"""

from __future__ import annotations

import re
import secrets

ROLES = ("counters", "devices")
SUFFIX_HEX = 8  # hex digits of an alternative name's suffix
MAX_NAME = 253  # a ResourceSlice's name is a DNS subdomain
_SUFFIX = re.compile(rf"^-[0-9a-f]{{{SUFFIX_HEX}}}$")


def slice_names(node: str) -> tuple[str, str]:
    """(counters slice, devices slice): the names tried first. ValueError when the node's name leaves no room for
    them."""
    names = (f"{node}-gpushare-{ROLES[0]}", f"{node}-gpushare-{ROLES[1]}")
    longest = max(len(n) for n in names) + 1 + SUFFIX_HEX
    if longest > MAX_NAME:
        raise ValueError(f"node name {node!r} is {len(node)} characters: its ResourceSlice names would pass the "
                         f"{MAX_NAME} characters a name may have; a node served through DRA needs a name of at most "
                         f"{len(node) - (longest - MAX_NAME)} characters")
    return names


def alternative_name(primary: str) -> str:
    """Another name of the slice `primary` names, for when `primary` is taken: `<primary>-<8 random hex digits>`."""
    return f"{primary}-{secrets.token_hex(SUFFIX_HEX // 2)}"


def primary_of(node: str, name: str) -> str | None:
    """The first-tried name (slice_names) that `name` stands for, when this node owns `name`; else None."""
    for primary in slice_names(node):
        if name == primary or (name.startswith(primary) and _SUFFIX.match(name[len(primary):])):
            return primary
    return None
