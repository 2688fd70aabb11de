"""``bin/chaos``: the chaos check, start to end.

Starts a private Redis (append-only file; with --sentinel a primary, two replicas and three
Sentinels; with --cluster a Redis Cluster of three primaries and three replicas), API replicas
and workers serving ``chaos.tools``;
runs the load (calls, jobs, webhook deliveries and streams without a request id) while the
injector plays faults; heals the cluster, lets the calls
in flight finish, asks once more for every request with its request id, reads every job until it
has finished and twice more, reads the audit trail and every record from Redis; then reconciles
the answers and the trail with the ledger and prints one table.
Exits 1 if a promise was broken, 2 if the run could not be made.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, cast

import msgspec

from bench.processes import ROOT, StartError
from carmy_worker.store import keys
from chaos import hookload, imported, jobload, ledger, report, streams
from chaos.auditcheck import reconcile_audit
from chaos.auditread import read_trail
from chaos.cluster import Cluster
from chaos.facts import Facts
from chaos.faults import Injector, default_kinds, refusal
from chaos.hookcheck import reconcile_hooks
from chaos.hookload import HookLoad, Secrets
from chaos.imported import ImportedLoad, Upstream, reconcile_imported
from chaos.jobcheck import FINISHED, reconcile_jobs
from chaos.jobload import JobLoad
from chaos.load import Load, final_retries
from chaos.model import FAULT_KINDS, FaultKind, RedisKind
from chaos.receiver import Receiver
from chaos.reconcile import Bounds, reconcile
from chaos.scheduleread import ScheduleSeen, excused_at_kill, read_missed, summary
from chaos.streams import StreamLoad, reconcile_streams
from chaos.tools import EXCLUSIVE, HOOK_TOOLS, IDEMPOTENT, JOB_RETRY, JOB_TOOLS, TICK, TICK_GRACE_S

SHORT_S = 72.0  # seconds of load in --short (each default fault once, as a rule): about two minutes in all
QUIET_S = 2.0  # after the load, before the final retries: let late effects reach the ledger
REPLICAS = 2  # with --sentinel: a failover leaves one, so WAIT still has a replica to wait for
# The schedule's occurrences are checked up to this long before the jobs' last reads: the later
# ones may not have run yet.
TICK_MARGIN_S = 2.0
CALLBACKS_S = 60.0  # the most the end waits for every callback to be delivered and shown so
# A cluster's partitions, its default (carmy_worker.settings.env_partitions): spread over its three primaries.
CLUSTER_PARTITIONS = 16


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bin/chaos", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load and faults (default 600)")
    p.add_argument("--short", action="store_true", help=f"the CI run: {SHORT_S:g} s of load, about 2 min in all")
    p.add_argument("--seed", type=int, default=None, help="seed of the faults and the call mix (default: random)")
    p.add_argument("--faults", default=None,
                   help="comma-separated subset of: " + ", ".join(FAULT_KINDS) + " (default: all that the "
                   "Redis allows: redis-term and redis-kill alone, or redis-failover with --sentinel; 'none' for none)")
    p.add_argument("--sentinel", action="store_true",
                   help=f"Redis as production runs it: a primary, {REPLICAS} replicas (each with its AOF) and three "
                   "Sentinels; APIs and workers on its redis+sentinel:// URL")
    p.add_argument("--cluster", action="store_true",
                   help="a Redis Cluster: 3 primaries and 3 replicas (each with its AOF); APIs and workers on "
                   "CARMY_REDIS_CLUSTER_NODES")
    p.add_argument("--partitions", type=int, default=None, metavar="N",
                   help=f"CARMY_REDIS_PARTITIONS for APIs and workers (default 1; {CLUSTER_PARTITIONS} with --cluster)")
    p.add_argument("--wait-replicas", type=int, default=None, metavar="N",
                   help="CARMY_REDIS_WAIT_REPLICAS for APIs and workers (default 0; 1 with --cluster, so that a "
                   "write a primary acknowledged has reached its replica before a kill -9 can take it)")
    p.add_argument("--workers", type=int, default=3, help="worker processes (default 3)")
    p.add_argument("--apis", type=int, default=2, help="API processes (default 2)")
    p.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    p.add_argument("--jobs", type=float, default=jobload.SHARE, metavar="SHARE",
                   help=f"share of the clients' turns that create a job instead of a call (default {jobload.SHARE:g}; "
                   "0 for none: the schedule still fires every second)")
    p.add_argument("--hooks", type=float, default=hookload.SHARE, metavar="SHARE",
                   help=f"share of the clients' turns that deliver a webhook event (default {hookload.SHARE:g}; 0 for "
                   "none)")
    p.add_argument("--streams", type=float, default=streams.SHARE, metavar="SHARE",
                   help=f"share of the clients' turns that make one SSE call without a request id (default "
                   f"{streams.SHARE:g}; 0 for none)")
    p.add_argument("--imported", type=float, default=imported.SHARE, metavar="SHARE",
                   help=f"share of the clients' turns that call the tool imported from an OpenAPI document (default "
                   f"{imported.SHARE:g}; 0 for none)")
    p.add_argument("--fsync", choices=["everysec", "always", "no"], default="everysec",
                   help="Redis appendfsync (default everysec, what the README recommends)")
    p.add_argument("--patience", type=float, default=30.0,
                   help="seconds a request may take to its final answer before it is a hang (default 30)")
    p.add_argument("--slow", type=float, default=10.0, help="seconds past which an answer is slow (default 10)")
    p.add_argument("--after-verdict", type=float, default=1.0,
                   help="seconds an effect may land after an EXECUTION_UNCERTAIN verdict (default 1)")
    p.add_argument("--out", type=Path, help="write the table as JSON to this file")
    p.add_argument("--keep", action="store_true", help="keep the run's directory (logs, ledger, Redis files)")
    args = p.parse_args(argv)
    if args.short:
        args.duration = SHORT_S
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(2), "big")
    if args.sentinel and args.cluster:
        p.error("--sentinel or --cluster: one Redis per run")
    redis: RedisKind = "cluster" if args.cluster else "sentinel" if args.sentinel else "single"
    args.redis = redis
    if args.partitions is None:
        args.partitions = CLUSTER_PARTITIONS if args.cluster else 1
    if args.wait_replicas is None:
        args.wait_replicas = 1 if args.cluster else 0
    if args.faults is None:
        kinds: list[str] = list(default_kinds(redis))
    else:
        kinds = [] if args.faults == "none" else [k.strip() for k in args.faults.split(",") if k.strip()]
    if (why := refusal(kinds, redis)) is not None:
        p.error(why)
    if not 0 <= args.jobs <= 1 or not 0 <= args.hooks <= 1 - args.jobs or not 0 <= args.streams <= 1 \
            or not 0 <= args.imported <= 1:
        p.error("--jobs and --hooks are shares of the clients' turns: 0 to 1 together; --streams and --imported, "
                "of what is left")
    if args.wait_replicas and redis == "single":
        p.error("--wait-replicas needs replicas: add --sentinel or --cluster")
    if args.workers < 2 and {"worker-kill", "worker-term", "worker-stop"} & set(kinds):
        p.error("worker faults need --workers 2 or more: one is always out while a fault lasts")
    args.kinds = kinds
    return args


def commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    keys.use_partitions(args.partitions)  # the end reads every partition's records
    workdir = Path(tempfile.mkdtemp(prefix="carmy-chaos-"))
    print(f"chaos: seed {args.seed}, {args.duration:g} s, faults {','.join(args.kinds) or 'none'}; "
          f"logs and ledger in {workdir}", file=sys.stderr, flush=True)
    receiver, secrets, upstream = Receiver(args.seed), Secrets(), Upstream()
    receiver.start()  # before anything can fail: ``close`` waits for its loop
    upstream.start()  # before the workers, which read its document as they start
    env = dict(os.environ) | secrets.env() | receiver.env()
    if args.wait_replicas:
        env["CARMY_REDIS_WAIT_REPLICAS"] = str(args.wait_replicas)
    cluster = Cluster(workdir, apis=args.apis, workers=args.workers, fsync=args.fsync, env=env,
                      replicas=REPLICAS if args.sentinel else 0, clustered=args.cluster, partitions=args.partitions,
                      worker_args=upstream.worker_args() if args.imported else [])
    try:
        try:
            cluster.start()
        except (StartError, RuntimeError) as exc:
            print(f"chaos: the cluster did not start: {exc}", file=sys.stderr)
            return 2
        code = play(args, cluster, receiver, secrets, upstream)
    finally:
        cluster.close()
        receiver.close()
        upstream.close()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return code


def play(args: argparse.Namespace, cluster: Cluster, receiver: Receiver, secrets: Secrets, upstream: Upstream) -> int:
    started, at = time.time(), commit()  # the code under test is the one checked out now
    run_id = f"c{uuid.uuid4().hex[:8]}"
    jobs = JobLoad(cluster.bases, args.patience, run_id, share=args.jobs, notify=receiver.url)
    hooks = HookLoad(cluster.bases, args.patience, run_id, secrets, share=args.hooks)
    unnamed = StreamLoad(share=args.streams)
    orders = ImportedLoad(cluster.bases, args.patience, run_id, share=args.imported)
    load = Load(cluster.bases, args.clients, args.seed, args.patience, run_id=run_id, jobs=jobs, hooks=hooks,
                streams=unnamed, imported=orders)
    jobs.start()
    load.start()
    injector = Injector(cluster, cast(list[FaultKind], args.kinds), args.seed, load.burst, started)
    injector.run(until=started + args.duration)
    load.stop.set()
    receiver.failing = False
    cluster.heal()
    print(f"[{time.time() - started:6.1f} s] load stopped; waiting for calls in flight", file=sys.stderr, flush=True)
    load.finish(args.patience + 10)
    time.sleep(QUIET_S)
    calls = list(load.requests) + list(orders.requests)
    print(f"[{time.time() - started:6.1f} s] final retry of {len(calls)} requests", file=sys.stderr, flush=True)
    final_retries(cluster.bases, calls, each=min(args.patience, 20.0))
    print(f"[{time.time() - started:6.1f} s] delivering {len(hooks.events)} webhook events again",
          file=sys.stderr, flush=True)
    hooks.finish(each=min(args.patience, 20.0))
    print(f"[{time.time() - started:6.1f} s] reading {len(jobs.jobs)} jobs until finished", file=sys.stderr, flush=True)
    jobs.finish(each=min(args.patience, 20.0))
    settle_callbacks(jobs, receiver, time.time() + CALLBACKS_S)
    time.sleep(QUIET_S)
    with cluster.reader() as client:  # every call and job has finished: their records are all in
        trail = read_trail(client)
    bounds = Bounds(patience=args.patience, slow=args.slow, after_verdict=args.after_verdict)
    requests, lines = list(load.requests), ledger.read(cluster.ledger_dir)
    table = reconcile(requests, lines, injector.faults, IDEMPOTENT, EXCLUSIVE, bounds, args.workers)
    facts = Facts(lines, injector.faults)
    table.jobs = reconcile_jobs(jobs.jobs, lines, facts, IDEMPOTENT, JOB_TOOLS,
                                cutoff=jobs.read_at - TICK_MARGIN_S, grace=TICK_GRACE_S,
                                backoff=(round(JOB_RETRY.backoff * 1000), round(JOB_RETRY.max_backoff * 1000)))
    missed = missed_trail(cluster, table.jobs.missed)
    if missed is not None:
        excused_at_kill(table.jobs, missed, facts)
    table.hooks = reconcile_hooks(hooks.events, lines, HOOK_TOOLS, jobs.jobs, list(receiver.callbacks))
    table.audit = reconcile_audit(trail, requests + list(orders.requests), hooks.events, jobs.jobs, lines, facts)
    table.streams = reconcile_streams(unnamed.streams, trail.records)
    if args.imported:
        table.imported = reconcile_imported(list(orders.requests), list(upstream.orders))
    log_errors = cluster.log_errors()
    title = (f"chaos check at {at}: seed {args.seed}, {args.duration:g} s of load, {args.clients} clients "
             f"({args.jobs:.0%} of turns jobs, {args.hooks:.0%} webhooks, {args.streams:.0%} streams without "
             f"a request id, {args.imported:.0%} imported calls), "
             f"{args.workers} workers, {args.apis} APIs, appendfsync {args.fsync}"
             + (f", Sentinel with {REPLICAS} replicas, WAIT {args.wait_replicas}" if args.sentinel else "")
             + (f", Redis Cluster (3 primaries, 3 replicas), WAIT {args.wait_replicas}" if args.cluster else "")
             + (f", CARMY_REDIS_PARTITIONS {args.partitions}" if args.partitions > 1 or args.cluster else ""))
    print(report.text(table, title, log_errors))
    if missed is not None:
        print("\nschedule occurrences missed, as the store holds them:")
        print("\n".join(f"- {summary(o)}" for o in missed.occurrences))
    if args.out:
        run: dict[str, Any] = {"commit": at, "seed": args.seed, "duration": args.duration,
                               "clients": args.clients, "jobs": args.jobs, "hooks": args.hooks,
                               "streams": args.streams, "imported": args.imported, "workers": args.workers,
                               "apis": args.apis,
                               "fsync": args.fsync, "faults": args.kinds, "sentinel": args.sentinel,
                               "cluster": args.cluster, "partitions": args.partitions,
                               "wait_replicas": args.wait_replicas,
                               "injected": msgspec.to_builtins(injector.faults)}
        proof = report.evidence(table, requests, lines, jobs.jobs, hooks.events, trail, unnamed.streams)
        if missed is not None:
            proof["schedule"] = msgspec.to_builtins(missed)
        args.out.write_bytes(report.as_json(table, run, proof, log_errors))
    return 1 if table.violations() else 0


def missed_trail(cluster: Cluster, missed: list[str]) -> ScheduleSeen | None:
    """What the store holds for each occurrence the check found missed (``chaos.scheduleread``),
    read now, while the cluster still runs; None if none was."""
    if not missed:
        return None
    at_ms = [round(datetime.datetime.fromisoformat(at).timestamp() * 1000) for at in missed]
    with cluster.reader() as client:
        return read_missed(client, TICK, at_ms)


def settle_callbacks(jobs: JobLoad, receiver: Receiver, deadline: float) -> None:
    """Waits, until ``deadline`` at most, for every finished job that asked for a callback to have
    a verified delivery of its final status and a view that says so (those that do not, re-read)."""
    while True:
        got = {(c.job_id, c.status) for c in list(receiver.callbacks) if c.verified}
        waiting = [job for job in jobs.jobs if job.notify is not None and job.reads and job.job_ids()
                   and job.reads[-1].status in FINISHED
                   and ((min(job.job_ids()), job.reads[-1].status) not in got or job.reads[-1].notify != "delivered")]
        if not waiting or time.time() > deadline:
            return
        time.sleep(0.5)
        jobs.reread(waiting)
