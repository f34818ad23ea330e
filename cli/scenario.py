"""`powercut scenario list|show`: the seed experiments as workloads."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from workloads import scenarios


def list_scenarios(args: argparse.Namespace) -> int:
    for name in scenarios.MODULES:
        mod = scenarios.get(name)
        print(f"{name}: {mod.SUMMARY}")
        defaults = dataclasses.asdict(mod.Params())
        print("    parameters at scale 1.0: " + ", ".join(f"{k}={v}" for k, v in defaults.items()))
        if mod.RUN_DEFAULTS:
            print("    run defaults: " + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in mod.RUN_DEFAULTS.items()))
    return 0


def show(args: argparse.Namespace) -> int:
    json.dump(scenarios.document(args.name, args.scale, args.param), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("scenario", help="the seed experiments as workloads: list them, print one as JSON",
                       description="Scenario workloads (run one with `powercut run scenario:NAME --fs FS --scale S`).")
    ssub = p.add_subparsers(dest="scenario_command", metavar="COMMAND")
    ls = ssub.add_parser("list", help="every scenario with its parameters at scale 1.0")
    ls.set_defaults(func=list_scenarios)
    sh = ssub.add_parser("show", help="print the workload JSON of a scenario")
    sh.add_argument("name", help="scenario name (see `powercut scenario list`)")
    sh.add_argument("--scale", type=float, default=1.0, help="1.0 = the paper's counts (default)")
    sh.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="set a parameter")
    sh.set_defaults(func=show)
