"""The Dockerfile's base is a build argument (BASE, default python:3.11-slim-bookworm) that both stages take, so
the tests can build the shipped Dockerfile from a Debian 12 base of their own (tests/realk8s/product_image.py),
and its build stage runs none of the package's code: it installs none of the package's dependencies."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.dockerfile_parse import copy_sources, global_args, parse

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
SHIPPED_BASE = "python:3.11-slim-bookworm"


def test_both_stages_take_the_base_argument_whose_default_is_the_shipped_base() -> None:
    assert global_args(DOCKERFILE) == {"BASE": SHIPPED_BASE}
    assert [stage.base for stage in parse(DOCKERFILE)] == [SHIPPED_BASE, SHIPPED_BASE]
    other = "localhost/gpushare-base:test"
    assert [stage.base for stage in parse(DOCKERFILE, {"BASE": other})] == [other, other]


def test_the_build_stage_runs_none_of_the_package() -> None:
    build = parse(DOCKERFILE)[0]
    for run in build.all("RUN"):
        assert not re.search(r"python3?\s+(-m\s+devplugin|-c\s+.*\bdevplugin\b)", run.text), \
            f"Dockerfile:{run.line}: the build stage has none of the package's dependencies installed: {run.text}"
    copied = [source for copy in build.all("COPY") for source in copy_sources(copy)[0]]
    assert "shim/" in copied and (REPO / "shim" / "gpushare_contract.h").is_file(), \
        "the shim compiles with the contract header as committed " \
        "(tests/contract/test_generated_code.py keeps it current)"


def test_the_parser_substitutes_build_arguments_and_refuses_unknown_ones(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("ARG REGISTRY=docker.io\nARG TAG\nFROM $REGISTRY/library/python:${TAG} AS one\n"
                          "ARG LOCAL=1\nRUN true\nFROM ${REGISTRY}/busybox\n")
    assert global_args(dockerfile) == {"REGISTRY": "docker.io", "TAG": ""}
    one, two = parse(dockerfile, {"TAG": "3.11"})
    assert (one.base, one.name, two.base) == ("docker.io/library/python:3.11", "one", "docker.io/busybox")
    assert [i.keyword for i in one.instructions] == ["ARG", "RUN"]  # an ARG inside a stage stays its own
    with pytest.raises(AssertionError, match="UNKNOWN"):
        parse(dockerfile, {"UNKNOWN": "x"})
    dockerfile.write_text("FROM ${NOWHERE}\n")
    with pytest.raises(AssertionError, match="NOWHERE"):
        parse(dockerfile)
