"""`powercut campaign status|report redis://HOST:PORT/N NAME`: a joined campaign as a whole."""

from __future__ import annotations

import argparse
import os

from fuzz.coordinator import Coordinator
from fuzz.merged import status_text, write_merged


def status_cmd(args: argparse.Namespace) -> int:
    print(status_text(Coordinator(args.coordinator, args.name)))
    return 0


def report_cmd(args: argparse.Namespace) -> int:
    out = args.out or os.path.join("campaigns", f"joined-{args.name}-report")
    report = write_merged(Coordinator(args.coordinator, args.name), out)
    print(f"powercut campaign: {report['workloads']} workloads on {len(report['machines'])} machines, "
          f"{len(report['saved_findings'])} saved findings ({report['stop_reason']}): "
          f"{os.path.join(out, 'report.json')}, {os.path.join(out, 'report.md')}, {os.path.join(out, 'findings')}/")
    return 1 if report["saved_findings"] else 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("campaign", help="a campaign joined by several machines (fuzz --coordinator): status, report",
                       description="Read a joined campaign from its Redis server. Exit 0 (report: 1 if it saved "
                                   "findings), 2 if Redis is out of reach or holds no such campaign.")
    what = p.add_subparsers(dest="what", metavar="status|report", required=True)
    for name, func, text in (("status", status_cmd, "machines, workloads/min each and in total, findings, leases"),
                             ("report", report_cmd, "write the merged report.json, report.md and findings/")):
        q = what.add_parser(name, help=text, description=text)
        q.add_argument("coordinator", metavar="redis://HOST:PORT/N")
        q.add_argument("name", metavar="NAME", help="the campaign's name (fuzz --campaign)")
        q.set_defaults(func=func)
        if name == "report":
            q.add_argument("--out", default="", help="where to write it (default: campaigns/joined-NAME-report)")
