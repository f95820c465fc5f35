"""`devplugin inspect [NODE] [-d] [-o json]`, also installed as `kubectl-inspect-gpushare`."""

from __future__ import annotations

import argparse
import json
import sys

from devplugin.inspect.dra_layout import render_dra_text
from devplugin.inspect.dra_report import DraReport, build_dra_report
from devplugin.inspect.layout import render_text
from devplugin.inspect.report import attach_use, build_report
from devplugin.kube.command_client import add_kubeconfig_argument, command_client


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("node", nargs="?", default="", help="show this node only")
    p.add_argument("-d", "--details", action="store_true",
                   help="list the pods (DRA: the claims) on each GPU, with what each uses")
    p.add_argument("--no-use", action="store_true",
                   help="allocation only: do not ask the node daemons what their containers use")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text", help="output format")
    add_kubeconfig_argument(p)


def run(args: argparse.Namespace) -> int:
    from kubernetes.client.rest import ApiException

    from devplugin.inspect.read import read_cluster

    api = command_client(args.kubeconfig, "inspect", hint=True)
    if api is None:
        return 1
    try:
        nodes, pods = read_cluster(api, args.node)
    except ApiException as exc:
        if exc.status == 404 and args.node:
            sys.stderr.write(f"inspect: node {args.node!r} not found\n")
        else:
            sys.stderr.write(f"inspect: the apiserver answered {exc.status}: {exc.reason}\n")
        return 1
    except Exception as exc:  # connection refused, timeouts
        sys.stderr.write(f"inspect: cannot reach the apiserver: {exc}\n")
        return 1
    report = build_report(nodes, pods, with_pending=not args.node)
    dra = _dra_report(api, args.node)
    if not args.no_use:
        from devplugin.inspect.use import read_use

        attach_use(report, read_use(api, [n.name for n in report.nodes if n.gpus]))
    if args.output == "json":
        out = report.to_json()
        if dra is not None:
            out["dra"] = dra.to_json()
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
    elif dra is not None and not report.nodes and not report.pending:  # a cluster that shares GPUs by DRA alone
        sys.stdout.write(render_dra_text(dra, args.details))
    else:
        sys.stdout.write(render_text(report, args.details))
        if dra is not None:
            sys.stdout.write("\n" + render_dra_text(dra, args.details))
    return 0


def _dra_report(api: object, node: str) -> DraReport | None:
    """The DRA part when the cluster has the driver's slices or claims of its classes; None otherwise (the
    device-plugin view alone, as before). Not readable (e.g. 403): said on stderr, the rest is still shown."""
    from kubernetes.client.rest import ApiException

    from devplugin.inspect.dra_read import read_dra

    try:
        objects = read_dra(api, node)
    except ApiException as exc:
        sys.stderr.write(f"inspect: DRA claims not shown: the apiserver answered {exc.status}: {exc.reason}\n")
        return None
    dra = build_dra_report(objects.slices, objects.claims, node, objects.limit)
    return dra if dra.nodes or dra.pending or dra.unplaced else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kubectl inspect gpushare",
                                     description="GPU memory and compute allocated per node and per GPU, and what "
                                                 "the containers use of it.")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
