"""`powercut fuzz` (campaigns) and `powercut minimize` (shrink one failing workload)."""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from typing import Any

from foundation.jsondoc import write_json
from checkers.findings import KINDS
from cli.options import add_backend_options, add_known_damage_option, add_option, add_semantics_option, run_config
from foundation import internal_error, ownership
from foundation.errors import UsageError
from cli.run import add_recovery_args
from harness.pipeline.config import RunConfig
from harness.pipeline.run import default_out_dir
from fuzz.campaign import Campaign, CampaignSpec
from fuzz.engines import ENGINES, default_engine, engine_options, option_groups
from fuzz.engines import engine as fuzz_engine
from fuzz.coordinator import Coordinator, check_url, identity
from fuzz.layout import CampaignDir
from fuzz.minimize import MATCHES, MAX_RUNS, Shrinker
from fuzz.trial import Signature, Trial, op_count, run_doc
from replay.crashpoints import DEFAULT as DEFAULT_POINTS, EVERY_POINT
from replay.crashstates import DEFAULT_PER_POINT, DEFAULT_REORDER
from workloads.format import load_workload

_DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s?)?")


def parse_duration(text: str) -> float:
    """90, 90s, 10m, 1h30m -> seconds."""
    m = _DURATION.fullmatch(text.strip())
    if not text.strip() or m is None:
        raise UsageError(f"--duration {text!r}: use e.g. 90s, 10m, 1h30m")
    h, mi, s = (int(g or 0) for g in m.groups())
    return h * 3600 + mi * 60 + s


def _run_config(args: argparse.Namespace) -> RunConfig:
    if not args.fs:
        raise UsageError("--fs is required (ext4, xfs, btrfs or f2fs), unless --resume DIR")
    # auto is resolved here: the campaign records (and says) dm or fuse.
    cfg = run_config(args, fs=args.fs, mkfs_opts=args.mkfs_opts, mount_opts=args.mount_opts, size_mib=args.size,
                     quiet=True, crash_points=args.crash_points, reorder=args.reorder,
                     states_per_point=args.states_per_point, semantics=args.semantics,
                     known_damage_findings=args.known_damage_findings, max_states=args.max_states)
    cfg.backend.engine.require()
    chosen = getattr(args, "engine", None)
    if cfg.backend.engine.keeps_guest and chosen and fuzz_engine(chosen).one_process_per_workload:
        others = " or ".join(sorted(e.name for e in ENGINES.values() if not e.one_process_per_workload))
        raise UsageError(f"--engine {chosen} runs every workload in a new process and cannot keep a "
                         f"{cfg.backend.name} guest: use --engine {others} with --backend {cfg.backend.name}")
    return cfg


def _spec(args: argparse.Namespace, cfg: RunConfig) -> CampaignSpec:
    if args.engine is None:  # a guest kernel (vm) is slow: spend its workloads on the likeliest shapes first
        args.engine = default_engine("guest" if cfg.backend.engine.keeps_guest else "host")
    given = {o.key: getattr(args, o.key) for g, _ in option_groups() for o in g.options}
    options: dict[str, Any] = {**engine_options(args.engine, given), "shrink_seconds": args.shrink_seconds,
                               "shrink_match": args.shrink_match, "joined": _joined(args)}
    return CampaignSpec(args.engine, 0.0, 1, args.seed if args.seed is not None else int(time.time()) & 0xFFFFFF,
                        options=options)


def _joined(args: argparse.Namespace) -> dict[str, str] | None:
    if not args.coordinator:
        if args.campaign:
            raise UsageError("--campaign NAME goes with --coordinator redis://HOST:PORT/N")
        return None
    if not args.campaign:
        raise UsageError("--coordinator needs --campaign NAME (the same on every machine)")
    if args.shard != "0/1" or args.hypothesis_db:
        raise UsageError("--coordinator shares the work and the example database itself: "
                         "leave out --shard and --hypothesis-db")
    return {"coordinator": check_url(args.coordinator), "campaign": args.campaign}


def fuzz_cmd(args: argparse.Namespace) -> int:
    duration = parse_duration(args.duration)
    if args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: must be at least 1")
    coord = None
    if args.resume:
        cdir = CampaignDir.open(args.resume)
        saved = cdir.config()
        cfg, spec = RunConfig.parse(saved["run"]), CampaignSpec(**saved["spec"])
        coord = _join(cfg, spec, args.jobs)
    else:
        cfg = _run_config(args)
        spec = _spec(args, cfg)
        coord = _join(cfg, spec, args.jobs)  # before the directory: a mismatch leaves nothing behind
        name = f"joined-{args.campaign}" if coord else spec.engine
        out = args.out or os.path.join("campaigns", f"{name}-{cfg.fs}-{time.strftime('%Y%m%d-%H%M%S')}")
        cdir = CampaignDir.create(out, {"run": cfg.to_json(), "spec": vars(spec)})
    internal_error.note_output_dir(cdir.path)
    # Per session: how long, how wide, when to stop.
    spec.duration_s, spec.jobs = duration, args.jobs
    spec.max_workloads, spec.max_findings = args.max_workloads, args.max_findings
    spec.generator.require()  # fail now, with the install hint, not in a worker
    return Campaign(cdir, cfg, spec, coord).run()


def _join(cfg: RunConfig, spec: CampaignSpec, jobs: int) -> Coordinator | None:
    """--coordinator: join the campaign in Redis (recording its options if this machine is the first)."""
    joined = spec.options.get("joined")
    if not joined:
        return None
    coord = Coordinator(joined["coordinator"], joined["campaign"])
    coord.join(identity(cfg.to_json(), vars(spec)), jobs)
    return coord


def minimize_cmd(args: argparse.Namespace) -> int:
    cfg = _run_config(args)
    workload = load_workload(args.workload)  # validates
    with open(args.workload) as f:
        doc = json.load(f)
    out = ownership.make_dir(args.out or default_out_dir(f"minimize-{workload.name}", cfg.fs))
    internal_error.note_output_dir(out)
    trial = run_doc(doc, cfg, out)
    target = _target(trial, args)
    shrinker = Shrinker(lambda d: run_doc(d, cfg, out), target, os.path.join(out, "best"), max_runs=args.max_runs,
                        match=args.shrink_match)
    os.replace(trial.out_dir, shrinker.best_dir)
    trial.out_dir = shrinker.best_dir
    best = shrinker.shrink(trial)
    path = write_json(os.path.join(out, "workload.min.json"), best.doc, indent=1)
    finding = next(f for f in best.findings if shrinker.is_target(f, best))
    still = target.key() if args.shrink_match == "signature" else f"a {target.kind} finding"
    print(f"powercut minimize: {op_count(doc)} -> {op_count(best.doc)} ops in {shrinker.runs} runs, "
          f"still {still}")
    print(f"  {finding.detail.splitlines()[0][:200]}")
    print(f"  shrunk workload: {path}\n  its run: {best.out_dir} (powercut recheck {best.out_dir} "
          f"--state {finding.state_id})")
    return 0


def _target(trial: Trial, args: argparse.Namespace) -> Signature:
    """The finding of TRIAL to shrink: --signature, else the first of --kind, else the first of all."""
    sigs = [s for s, _ in trial.signatures()]
    if args.signature:
        try:
            wanted = Signature.parse(args.signature)
        except ValueError:
            raise UsageError(f"--signature {args.signature!r}: expected KIND|OP|RULE") from None
        if wanted not in sigs:
            raise UsageError(f"{args.workload} does not show {args.signature} on {args.fs} "
                             f"(found: {', '.join(s.key() for s in sigs) or 'nothing'}): nothing to minimize")
        return wanted
    kinds = [s for s in sigs if s.kind == args.kind] if args.kind else sigs
    if not kinds:
        raise UsageError(f"{args.workload} shows no {args.kind or ''} finding on {args.fs} "
                         f"(found: {', '.join(sorted({s.kind for s in sigs})) or 'nothing'}): nothing to minimize")
    return kinds[0]


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mkfs-opts", default="", help="extra mkfs options, e.g. \"-O ^has_journal\"")
    add_semantics_option(p)
    add_known_damage_option(p)
    p.add_argument("--mount-opts", default="", help="mount options, e.g. data=writeback,nodelalloc")
    p.add_argument("--size", type=int, default=0, help="device size in MiB (default: per file system)")
    p.add_argument("--crash-points", default=DEFAULT_POINTS, metavar="KINDS",
                   help=f"where to crash, as for `powercut run` (default: {DEFAULT_POINTS})")
    p.add_argument("--reorder", default=DEFAULT_REORDER, metavar="MODES",
                   help=f"crash states per crash point besides the in-order prefix, as for `powercut run` "
                        f"(default: {DEFAULT_REORDER})")
    p.add_argument("--states-per-point", type=int, default=DEFAULT_PER_POINT, metavar="N",
                   help=f"at most N states per reorder mode and crash point (default: {DEFAULT_PER_POINT})")
    p.add_argument("--max-states", default=EVERY_POINT, metavar="N|design+N|all",
                   help="crash-point budget per workload, as for `powercut run`: design+N checks every design "
                        "point (around each fsync/fdatasync/sync, rename, open/creat/close and truncate, where "
                        "the promises apply) and N others spread evenly: a way to spend a slow backend's (vm) "
                        f"time where findings are (default: {EVERY_POINT})")
    add_recovery_args(p)
    add_backend_options(p, scopes=("test",))


def _add_match_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shrink-match", choices=MATCHES, default="signature",
                   help="what a smaller workload must still show to be kept: signature (default): the same finding "
                        "(kind, op, rule or what the file system said); kind: any finding of the same kind (the "
                        "old behaviour: the shrink may slide into another bug of that kind)")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("fuzz", help="run a fuzzing campaign: generated workloads, deduplicated and shrunk findings",
                       description="Generate workloads, run each through `powercut run`'s pipeline, save every new "
                                   "finding shrunk, with its crash image and reproduce.sh. Exit 0: nothing found, "
                                   "1: findings saved, 2: error, 3: internal error (a worker died of a bug), "
                                   "130: interrupted (the report is written).")
    p.add_argument("--fs", help="ext4, xfs, btrfs or f2fs")
    p.add_argument("--engine", choices=sorted(ENGINES), default=None,
                   help="workload generator: " + "; ".join(f"{e.name}: {e.summary}" for e in ENGINES.values()))
    p.add_argument("--duration", default="10m", help="how long this session runs, e.g. 90s, 10m, 2h (default 10m)")
    p.add_argument("--jobs", type=int, default=1, help="parallel workers, each with its own recorded device")
    _add_run_options(p)
    p.add_argument("--out", default="", help="campaign directory (default: campaigns/ENGINE-FS-TIME)")
    p.add_argument("--seed", type=int, default=None, help="seed of the generators (default: from the clock; recorded)")
    p.add_argument("--resume", metavar="DIR", help="continue the campaign in DIR with its own options "
                   "(--duration, --jobs and the --max-* limits apply to this session)")
    p.add_argument("--max-workloads", type=int, default=0, metavar="N", help="stop after N workloads this session")
    p.add_argument("--max-findings", type=int, default=0, metavar="N", help="stop after N saved findings this session")
    p.add_argument("--shrink-seconds", type=float, default=600, help="time limit of one delta-debugging shrink")
    _add_match_option(p)
    g = p.add_argument_group("a campaign joined by several machines (docs/scale-out.md)")
    g.add_argument("--coordinator", metavar="redis://HOST:PORT/N",
                   help="join a campaign coordinated through this Redis server (the same command on every machine)")
    g.add_argument("--campaign", metavar="NAME", help="the joined campaign's name (with --coordinator)")
    for group, _ in option_groups():  # each engine's own options, as it declares them
        g = p.add_argument_group(group.title)
        for o in group.options:
            add_option(g, o)
    p.set_defaults(func=fuzz_cmd)

    m = sub.add_parser("minimize", help="shrink a failing workload by itself (delta debugging over its ops)",
                       description="Run WORKLOAD, then remove ops and simplify fields as long as the same finding "
                                   "(its signature: kind, op, rule) still shows. Writes OUT/workload.min.json and the shrunk run.")
    m.add_argument("workload", help="a powercut-workload/1 .json file that shows a finding")
    m.add_argument("--fs", required=True, help="ext4, xfs, btrfs or f2fs")
    _add_run_options(m)
    m.add_argument("--kind", choices=KINDS, help="the finding kind to keep (default: the first the workload shows)")
    m.add_argument("--out", default="", help="output directory (default: out/minimize-NAME-FS-TIME)")
    m.add_argument("--signature", metavar="KIND|OP|RULE",
                   help="the finding to keep, as finding.json's signatures or the journal name them (default: the "
                        "first finding of --kind)")
    _add_match_option(m)
    m.add_argument("--max-runs", type=int, default=MAX_RUNS, help=f"at most N runs (default {MAX_RUNS})")
    m.set_defaults(func=minimize_cmd)
