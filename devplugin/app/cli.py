"""`devplugin serve` (the node daemon), `devplugin dra` (the DRA kubelet plugin), `devplugin demo` (the daemon on
a simulated node), `devplugin scheduler`
(extender and webhooks), `devplugin inspect` (who holds which GPU) and `devplugin dra-limits` (the claim
policies' largest GPU memory)."""

from __future__ import annotations

import argparse
import sys

from devplugin.app import logs
from devplugin.app.config import add_arguments, from_args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="devplugin",
        description="Share GPUs between Kubernetes pods: serves aliyun.com/gpu-mem, gpu-core.percentage and "
        "gpu-count to the kubelet.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve", help="run the node daemon (a DaemonSet on every GPU node)",
        description="Run the device-plugin daemon. Every flag can also be set by the env var named in its help.",
    )
    add_arguments(serve)
    from devplugin.app.dra_config import DraConfig, dra_from_args

    dra = sub.add_parser(
        "dra", help="run the DRA kubelet plugin (driver gpu.gpushare.io) on a node labelled "
        "gpushare.io/allocation=dra",
        description="Publish this node's GPUs as ResourceSlices and prepare the ResourceClaims the scheduler "
        "allocates on them. Every flag can also be set by DEVPLUGIN_DRA_<FLAG> (NODE_NAME for --node-name).")
    add_arguments(dra, DraConfig)
    demo = sub.add_parser("demo", help="run the real daemon on a simulated 4 x 15 GiB node and admit example pods")
    demo.add_argument("--keep", action="store_true", help="keep the temporary directory for inspection")
    from devplugin.inspect import cli as inspect_cli
    from devplugin.scheduler import service as scheduler_service

    scheduler = sub.add_parser(
        "scheduler", help="run the scheduler extender and admission webhooks (control plane, HTTPS)",
        description="Serve kube-scheduler's extender verbs under /scheduler and the admission webhooks under "
        "/admission. Every flag can also be set by DEVPLUGIN_SCHEDULER_<FLAG>.")
    scheduler_service.add_arguments(scheduler)
    inspect = sub.add_parser("inspect", help="GPU memory and compute allocated per node and per GPU "
                             "(also `kubectl inspect gpushare`)")
    inspect_cli.add_arguments(inspect)
    from devplugin.dra import limits as dra_limits

    limits = sub.add_parser(
        "dra-limits", help="the largest GPU memory of the DRA slices beside the claim policies' limit; "
        "--write sets it", description="Print the largest GPU memory the gpu.gpushare.io ResourceSlices publish "
        "and the largestGpuMemory the claim policies check claims against (ConfigMap kube-system/"
        "gpushare-dra-limits); --write sets the ConfigMap to it.")
    dra_limits.add_arguments(limits)
    args = parser.parse_args(argv)
    if args.command == "scheduler":
        problem = scheduler_service.check_arguments(args)
        if problem:
            parser.exit(2, f"devplugin scheduler: {problem}\n")
        return scheduler_service.run(args)
    if args.command == "inspect":
        return inspect_cli.run(args)
    if args.command == "dra-limits":
        return dra_limits.run(args)
    if args.command == "dra":
        try:
            dra_cfg = dra_from_args(args)
        except ValueError as exc:
            parser.exit(2, f"devplugin dra: {exc}\n")
        logs.setup(dra_cfg.log_level, dra_cfg.log_format)
        from devplugin.app.dra import run as run_dra

        return run_dra(dra_cfg)
    if args.command == "serve":
        try:
            cfg = from_args(args)
        except ValueError as exc:
            parser.exit(2, f"devplugin serve: {exc}\n")
        logs.setup(cfg.log_level, cfg.log_format)
        from devplugin.app.serve import run

        return run(cfg)
    try:
        from devplugin_sim.demo import run_demo
    except ImportError:
        parser.exit(2, "devplugin demo: the simulated node (devplugin_sim) ships with the source checkout only; "
                    "run `make demo` there\n")
    return run_demo(keep=args.keep)


if __name__ == "__main__":
    sys.exit(main())
