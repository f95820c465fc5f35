"""A Dockerfile read into stages of instructions: enough for tests to check and replay what the image build does
without a Docker engine."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, ...
    text: str  # the rest of the line, continuation lines joined with a space
    line: int  # where it starts in the file (1-based)

    def words(self) -> list[str]:
        """The instruction's arguments: its JSON (exec) form, or the shell form split like a shell would."""
        stripped = self.text.strip()
        if stripped.startswith("["):
            return list(json.loads(stripped))
        return shlex.split(stripped)


@dataclass
class Stage:
    base: str  # the FROM image, its build arguments substituted
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def one(self, keyword: str) -> Instruction:
        found = self.all(keyword)
        assert len(found) == 1, f"stage {self.name or self.base}: expected one {keyword}, found {len(found)}"
        return found[0]


def global_args(path: Path) -> dict[str, str]:
    """The ARGs declared before the first FROM, with their defaults ('' when none)."""
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        keyword, _, text = line.strip().partition(" ")
        if keyword.upper() == "FROM":
            break
        if keyword.upper() == "ARG":
            name, _, default = text.strip().partition("=")
            found[name] = default
    return found


def substitute(text: str, args: Mapping[str, str], where: str) -> str:
    """`${NAME}` and `$NAME` replaced by the build argument's value, as FROM lines are."""
    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in args, f"{where}: ${name} is no ARG declared before the first FROM"
        return args[name]
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, text)


def parse(path: Path, build_args: Mapping[str, str] | None = None) -> list[Stage]:
    """The stages of the Dockerfile at `path`, in order, their bases with the ARGs declared before the first FROM
    substituted (their defaults, or `build_args` as `--build-arg` gives them). Comment lines (also inside
    continuations) are dropped."""
    declared = global_args(path)
    unknown = set(build_args or {}) - set(declared)
    assert not unknown, f"{path}: no ARG before the first FROM for the build arguments {sorted(unknown)}"
    args = {**declared, **(build_args or {})}
    stages: list[Stage] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not pending:
            start = number
        continues = line.endswith("\\")
        pending.append(line[:-1].strip() if continues else line)
        if continues:
            continue
        keyword, _, text = " ".join(pending).partition(" ")
        pending = []
        instruction = Instruction(keyword.upper(), text.strip(), start)
        if instruction.keyword == "FROM":
            words = instruction.text.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=substitute(words[0], args, f"{path}:{start}"), name=name))
        elif instruction.keyword == "ARG" and not stages:
            continue  # a build argument of the FROM lines (global_args)
        else:
            assert stages, f"{path}:{number}: {keyword} before any FROM"
            stages[-1].instructions.append(instruction)
    assert not pending, f"{path}: ends inside a continued line"
    return stages


def copy_sources(instruction: Instruction) -> tuple[list[str], str, str | None]:
    """A COPY's (sources, destination, --from stage or None)."""
    words = instruction.words()
    flags = [w for w in words if w.startswith("--")]
    paths = [w for w in words if not w.startswith("--")]
    origin = next((f.split("=", 1)[1] for f in flags if f.startswith("--from=")), None)
    return paths[:-1], paths[-1], origin
