"""Generate the Python stubs under devplugin/api from the vendored protos in proto/.

Besides the modules, protoc writes a typed interface (.pyi) for each message module, which is what
mypy reads in place of the generated descriptor code.

Run `make proto` (or `python -m devplugin.api.generate`). A test regenerates into a temporary
directory and fails when the committed stubs differ, so stale stubs cannot land.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROTO_DIR = REPO / "proto"
OUT_DIR = Path(__file__).resolve().parent
PROTOS = ("deviceplugin/v1beta1/api.proto", "podresources/v1/api.proto", "dra/v1/api.proto",
          "pluginregistration/v1/api.proto")
_IMPORT = re.compile(r"^from (deviceplugin|podresources|dra|pluginregistration)\.(\w+) import ", re.MULTILINE)


def generate(out_dir: Path) -> list[Path]:
    """Compile every vendored proto into out_dir; return the files written."""
    import grpc_tools
    from grpc_tools import protoc

    include = str(Path(grpc_tools.__file__).parent / "_proto")
    written: list[Path] = []
    with tempfile.TemporaryDirectory() as tmp:
        for proto in PROTOS:
            rc = protoc.main(
                ["protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={tmp}",
                 f"--pyi_out={tmp}", f"--grpc_python_out={tmp}", str(PROTO_DIR / proto)]
            )
            if rc != 0:
                raise RuntimeError(f"protoc failed on {proto} (exit {rc})")
        for src in sorted(p for p in Path(tmp).rglob("*") if p.suffix in (".py", ".pyi")):
            rel = src.relative_to(tmp)
            text = _IMPORT.sub(r"from devplugin.api.\1.\2 import ", src.read_text())
            dest = out_dir / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text)
            written.append(dest)
    for pkg in {p.parent for p in written} | {p.parent.parent for p in written}:
        init = pkg / "__init__.py"
        if not init.exists():
            init.write_text("")
            written.append(init)
    return written


def main() -> int:
    for path in generate(OUT_DIR):
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
