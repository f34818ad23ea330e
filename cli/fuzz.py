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
from cli.options import add_backend_options, add_known_damage_option, add_semantics_option, fault_choices, run_config
from foundation import internal_error, ownership
from foundation.errors import UsageError
from cli.run import add_recovery_args
from harness.pipeline.config import RunConfig
from harness.pipeline.run import default_out_dir
from fuzz.campaign import ENGINES, Campaign, CampaignSpec
from fuzz.coordinator import Coordinator, check_url, identity
from fuzz.layout import CampaignDir
from fuzz.minimize import MATCHES, MAX_RUNS, Shrinker
from fuzz.trial import Signature, Trial, op_count, run_doc
from replay.crashpoints import DEFAULT as DEFAULT_POINTS, EVERY_POINT
from replay.crashstates import DEFAULT_PER_POINT, DEFAULT_REORDER
from workloads import exhaustive
from workloads.format import load_workload

_DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s?)?")
SEQ3_CAP = 20000


def parse_duration(text: str) -> float:
    """90, 90s, 10m, 1h30m -> seconds."""
    m = _DURATION.fullmatch(text.strip())
    if not text.strip() or m is None:
        raise UsageError(f"--duration {text!r}: use e.g. 90s, 10m, 1h30m")
    h, mi, s = (int(g or 0) for g in m.groups())
    return h * 3600 + mi * 60 + s


def parse_shard(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)/(\d+)", text)
    if m is None or not 0 <= int(m[1]) < int(m[2]):
        raise UsageError(f"--shard {text!r}: use K/N with 0 <= K < N, e.g. 0/2")
    return int(m[1]), int(m[2])


def _run_config(args: argparse.Namespace) -> RunConfig:
    if not args.fs:
        raise UsageError("--fs is required (ext4, xfs or btrfs), unless --resume DIR")
    # auto is resolved here: the campaign records (and says) dm or fuse.
    cfg = run_config(args, fs=args.fs, mkfs_opts=args.mkfs_opts, mount_opts=args.mount_opts, size_mib=args.size,
                     quiet=True, crash_points=args.crash_points, reorder=args.reorder,
                     states_per_point=args.states_per_point, semantics=args.semantics,
                     known_damage_findings=args.known_damage_findings, max_states=args.max_states)
    cfg.backend.engine.require()
    if cfg.backend.engine.keeps_guest and getattr(args, "engine", "") == "afl":
        raise UsageError(f"--engine afl runs every workload in a new process and cannot keep a {cfg.backend.name} "
                         f"guest: use --engine hypothesis or exhaustive with --backend {cfg.backend.name}")
    return cfg


def parse_ops_range(text: str) -> list[int]:
    lo, sep, hi = text.partition("-")
    if not (sep and lo.isdigit() and hi.isdigit() and 1 <= int(lo) <= int(hi)):
        raise UsageError(f"--ops {text}: expected LO-HI with 1 <= LO <= HI, e.g. 5-20")
    return [int(lo), int(hi)]


def _spec(args: argparse.Namespace, cfg: RunConfig) -> CampaignSpec:
    if args.engine is None:  # a guest kernel (vm) is slow: spend its workloads on the likeliest shapes first
        args.engine = "mixed" if cfg.backend.engine.keeps_guest else "hypothesis"
    if args.seq is None:
        args.seq = 2 if args.engine == "mixed" else 1
    if args.seq not in (1, 2, 3):
        raise UsageError(f"--seq {args.seq}: 1, 2 or 3")
    core = args.core_ops.split(",") if args.core_ops else None
    unknown = sorted(set(core or []) - set(exhaustive.CORE_NAMES))
    if unknown:
        raise UsageError(f"--core-ops: unknown {', '.join(unknown)}; choose from {', '.join(exhaustive.CORE_NAMES)}")
    if not 1 <= args.min_ops <= args.max_ops:
        raise UsageError("--min-ops/--max-ops: need 1 <= min <= max")
    ops_range = parse_ops_range(args.ops) if args.ops else None
    options: dict[str, Any] = {
        "seq": args.seq, "seq_cap": args.seq_cap if args.seq_cap is not None else (SEQ3_CAP if args.seq == 3 else 0),
        "shard": parse_shard(args.shard), "hypothesis_db": args.hypothesis_db, "afl_sync_dir": args.afl_sync_dir,
        "afl_prefix": args.afl_prefix, "afl_secondary": args.afl_secondary, "min_ops": args.min_ops,
        "max_ops": args.max_ops, "shrink_seconds": args.shrink_seconds,
        "shrink_match": args.shrink_match, "core_ops": core,
        "ops_range": ops_range, "joined": _joined(args),
    }
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
    if spec.engine == "afl":
        from fuzz.engine_afl import afl_fuzz
        afl_fuzz()  # fail now, with the install hint, not in a worker
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
    p.add_argument("--fault", choices=fault_choices(), default=None,
                   help="test-only: drop-flush: flushes are acknowledged but not logged (fuse recorder; with "
                        "--backend vm, left out of the kernel's log); recovery-drop-flush: the same, only while a "
                        "recovery is recorded for --recovery-crash; recovery-panic (vm): the guest kernel crashes "
                        "at the first recovery mount of every batch; recovery-hang (vm): that mount waits for I/O "
                        "that never completes (the live guest's hang watchdog, POWERCUT_VM_HANG_S); coverage-plant (vm): a "
                        "planted kernel finding for every workload whose path ran POWERCUT_VM_PLANT_FUNCTIONS (300) "
                        "functions of the file system's modules")
    add_backend_options(p)


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
    p.add_argument("--fs", help="ext4, xfs or btrfs")
    p.add_argument("--engine", choices=sorted(ENGINES), default=None,
                   help="workload generator (default: hypothesis; with --backend vm, mixed: the ordered exhaustive "
                        "seq-2 space and hypothesis, half the workers each)")
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
    g = p.add_argument_group("hypothesis engine")
    g.add_argument("--min-ops", type=int, default=2, help="fewest op records in a generated workload (default 2; a "
                   "record is an op and maybe a persistence op after it)")
    g.add_argument("--max-ops", type=int, default=10, help="most op records (default 10)")
    g.add_argument("--ops", metavar="LO-HI", help="keep only workloads of LO..HI ops as the executor runs them "
                   "(opens and persistence ops count), e.g. 5-20; shrinking stays in the range too")
    g.add_argument("--hypothesis-db", metavar="DIR|redis://HOST:PORT/N",
                   help="example database to share between machines (default: CAMPAIGN/hypothesis-db)")
    g = p.add_argument_group("exhaustive engine (and the mixed engine's exhaustive half)")
    g.add_argument("--seq", type=int, default=None,
                   help="sequence length: 1, 2 or 3 core ops (default 1; 2 for the mixed engine)")
    g.add_argument("--seq-cap", type=int, default=None, metavar="N",
                   help=f"visit N workloads of a larger space: the first N of the ordered seq-2/3 space, N evenly "
                        f"spread ones with --core-ops (default: all; {SEQ3_CAP} for --seq 3)")
    g.add_argument("--core-ops", metavar="NAMES", help="bound the space to these core ops, comma-separated, enumerated "
                   f"in that order (default all: {', '.join(exhaustive.CORE_NAMES)})")
    g.add_argument("--shard", default="0/1", metavar="K/N", help="only workloads with index %% N == K (several machines)")
    g = p.add_argument_group("afl engine")
    g.add_argument("--afl-sync-dir", metavar="DIR", help="AFL++ sync directory shared with other machines "
                   "(default: CAMPAIGN/afl)")
    g.add_argument("--afl-prefix", default="w", help="instance name prefix, unique per machine (default: w)")
    g.add_argument("--afl-secondary", action="store_true", help="no main (-M) instance here: another machine has it")
    p.set_defaults(func=fuzz_cmd)

    m = sub.add_parser("minimize", help="shrink a failing workload by itself (delta debugging over its ops)",
                       description="Run WORKLOAD, then remove ops and simplify fields as long as the same finding "
                                   "(its signature: kind, op, rule) still shows. Writes OUT/workload.min.json and the shrunk run.")
    m.add_argument("workload", help="a powercut-workload/1 .json file that shows a finding")
    m.add_argument("--fs", required=True, help="ext4, xfs or btrfs")
    _add_run_options(m)
    m.add_argument("--kind", choices=KINDS, help="the finding kind to keep (default: the first the workload shows)")
    m.add_argument("--out", default="", help="output directory (default: out/minimize-NAME-FS-TIME)")
    m.add_argument("--signature", metavar="KIND|OP|RULE",
                   help="the finding to keep, as finding.json's signatures or the journal name them (default: the "
                        "first finding of --kind)")
    _add_match_option(m)
    m.add_argument("--max-runs", type=int, default=MAX_RUNS, help=f"at most N runs (default {MAX_RUNS})")
    m.set_defaults(func=minimize_cmd)
