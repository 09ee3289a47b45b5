"""``stormlake``: the command line of contract section 7.

Exit codes: 0 success, 1 a partition or phase failed, 2 bad usage or configuration. Errors are
one line on stderr; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from resources.errors import ConfigError, StormlakeError
from resources.files import apply_file_mode
from resources.keys import split_partition_key
from resources.settings import DAY_RE, REGION_ID_RE, Settings, load_regions, load_settings

SAMPLE = {"regions": 3, "days": 2, "rows_per_partition": 5000, "seed": 7}


def _a_day(text: str) -> dt.date | None:
    """``text`` as a day when it is one written YYYY-MM-DD, else None (``fromisoformat`` alone
    also takes 20260901 and 2026-W36-2)."""
    if not DAY_RE.match(text):
        return None
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        return None


def _days(spec: str | None, first_day: str, flag: str = "--days") -> tuple[str, str] | None:
    if not spec:
        return None
    start, sep, end = spec.partition("..")
    a, b = _a_day(start), _a_day(end if sep else start)
    if a is None or b is None:
        shape = "YYYY-MM-DD..YYYY-MM-DD" if flag == "--days" else "YYYY-MM-DD"
        raise ConfigError(f"{flag} {spec!r}: expected {shape}")
    if a > b:
        raise ConfigError(f"{flag} {spec!r}: the start is after the end")
    if a < dt.date.fromisoformat(first_day):
        raise ConfigError(f"{flag} {spec!r}: starts before STORMLAKE_FIRST_DAY={first_day}")
    return a.isoformat(), b.isoformat()


def select_partitions(settings: Settings, regions_arg: str | None, days_arg: str | None):  # -> (keys, rejected)
    """Partition keys to run: the landing zone's folders, narrowed by --regions / --days, and the
    selected folders that are not partitions (:meth:`Landing.partition_keys`, each with its
    reason). A folder outside --regions / --days is neither."""
    from resources.landing import Landing

    known = {r.region_id for r in load_regions(settings.regions_file)}
    wanted = None
    if regions_arg:
        wanted = {r.strip() for r in regions_arg.split(",") if r.strip()}
        unknown = sorted(wanted - known)
        if unknown:
            raise ConfigError(f"--regions: unknown region(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    window = _days(days_arg, settings.first_day)

    def selected(day: str, region: str) -> bool:
        return (wanted is None or region in wanted) and (window is None or window[0] <= day <= window[1])

    keys, rejected = Landing(settings.landing).partition_keys(known, settings.first_day)
    keys = [key for key in keys if selected(*split_partition_key(key))]
    rejected = [r for r in rejected if selected(*reversed(r.folder.split("/", 1)))]
    return keys, rejected


def _say_rejected(rejected) -> None:  # noqa: ANN001 - list[resources.landing.NotAPartition]
    """One line on stderr for each landing folder that is not a partition."""
    for folder in rejected:
        print(f"stormlake: {folder}; not run", file=sys.stderr)


def _prepare(settings: Settings):  # -> resources.logins.Logins
    """Prepare the Dagster instance; the logins of the settings (the embedded server started)."""
    from pipeline.instance import prepare_dagster_home
    from resources.logins import resolve_logins

    prepare_dagster_home(settings)
    return resolve_logins(settings)


def _ledger(settings: Settings):
    """The pipeline's ledger (its own login, as resume_worker), migrated first as the owner when
    this process is given the owner's login."""
    from resources.ledger import get_ledger

    logins = _prepare(settings)
    return get_ledger(logins.pipeline, owner_dsn=logins.owner)


def _pipeline_ledger(settings: Settings):
    """:func:`_ledger` without preparing Dagster's instance (a release, the access log's changes)."""
    from resources.ledger import get_ledger
    from resources.logins import resolve_logins

    logins = resolve_logins(settings)
    return get_ledger(logins.pipeline, owner_dsn=logins.owner)


def _reading_ledger(settings: Settings, role: str | None = None):
    """A person's ledger (status, report, review): their login (``STORMLAKE_PG_DSN``), reading
    through the logged ``ledger_read`` views (migration 007). It runs no DDL: a ledger whose
    schema is behind is a usage error that says to run ``stormlake db migrate``. No Dagster
    instance is prepared, so the command neither imports Dagster nor touches its storage.

    ``role`` narrows the read to one role the login is a member of (the database refuses any
    other); without it the login reads as itself, with the phases of every role it belongs to.
    Returns the ledger and who the read is made as (the role, else the login's name)."""
    from resources.ledger import get_ledger, login_roles, schema_behind
    from resources.logins import resolve_logins

    dsn = resolve_logins(settings).reader
    login, roles, version = login_roles(dsn, role)
    behind = schema_behind(version)
    if behind is not None:
        raise behind
    if role is not None and role not in roles:
        raise ConfigError(f"--role {role}: the login {login} is not a member of {role}"
                          f" (it may read as {', '.join(roles) or 'itself only'})")
    return get_ledger(dsn, role=role, audited=True), role or login


def _say_hidden(ledger, role: str) -> None:  # noqa: ANN001 - a Ledger
    """One line on stderr naming the phases ``role`` may not see (the output shows the rest)."""
    from resources.ledger_views import LedgerViews

    hidden = LedgerViews(ledger).hidden_phases()
    if hidden:
        print(f"stormlake: reading as {role}, which may not see the {', '.join(hidden)} phase"
              f"{'s' if len(hidden) > 1 else ''}: they are left out"
              " (their tables, checkpoints and errors); `stormlake access show` lists who may read what",
              file=sys.stderr)


def cmd_generate(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.tools.generate import generate_scenario

    regions = load_regions(settings.regions_file)
    if not 1 <= args.regions <= len(regions):
        raise ConfigError(f"--regions must be between 1 and {len(regions)} (the region file's length)")
    if args.days < 1 or args.rows_per_partition < 1:
        raise ConfigError("--days and --rows-per-partition must be at least 1")
    if args.seed < 0:
        raise ConfigError(f"--seed {args.seed}: must be at least 0")
    noisy = getattr(args, "noisy", 0.0)
    if not 0.0 <= noisy <= 1.0:
        raise ConfigError(f"--noisy {noisy}: a share of partitions, between 0 and 1")
    start = args.start or settings.first_day
    _days(start, settings.first_day, flag="--start")
    as_of = _as_of(getattr(args, "as_of", None))
    days = args.days
    if as_of is not None:  # the days that begin after it get no folder
        first = dt.datetime.combine(dt.date.fromisoformat(start), dt.time(), dt.UTC)
        days = min(days, max(0, (as_of - first).days + 1))
        if days == 0:
            raise ConfigError(f"--as-of {as_of.isoformat()}: before the first day {start} begins; nothing is reported yet")
    total = args.regions * days

    def progress(stage: str, done: int, of: int) -> None:
        sys.stderr.write(f"\rgenerate: {stage} {done}/{of}\033[K" if sys.stderr.isatty() else f"generate: {stage} {done}/{of}\n")
        sys.stderr.flush()

    t = time.monotonic()
    from resources.storage import local_folder_for

    with local_folder_for(settings.landing) as folder:
        generate_scenario(folder, regions[: args.regions], days=args.days, start=start,
                          rows_per_partition=args.rows_per_partition, seed=args.seed, noisy=noisy,
                          as_of=as_of, progress=progress)
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    print(f"wrote {total} partitions ({args.regions} regions x {days} days, "
          f"{args.rows_per_partition} outage rows each"
          f"{f' over the whole day, those reported up to {as_of.isoformat()}' if as_of else ''}) "
          f"to {settings.landing} in {time.monotonic() - t:.1f}s")
    return 0


def _as_of(text: str | None) -> dt.datetime | None:
    """``--as-of``: ``now``, or an ISO-8601 time (UTC when it names no offset)."""
    if text is None:
        return None
    if text == "now":
        return dt.datetime.now(dt.UTC).replace(microsecond=0)
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"--as-of {text!r}: expected a time as YYYY-MM-DDTHH:MM[:SS][+HH:MM] (UTC without an"
                          " offset) or now") from None
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)


def _run(settings: Settings, keys: list[str], workers: int | None = None, force=None) -> list:  # noqa: ANN001
    """Run the partitions through one Dagster backfill (:mod:`pipeline.backfill`), with a progress
    display; each partition's outcome. The lines it has to say go to stderr after the display."""
    from pipeline.backfill import run_backfill
    from pipeline.progress import Progress
    from resources.landing import Landing

    _prepare(settings)
    if not keys:
        if not Landing(settings.landing).storage.exists():
            raise ConfigError(f"the landing zone {settings.landing} is not a folder (set STORMLAKE_LANDING,"
                              " or write a scenario with `stormlake generate`)")
        print(f"no partitions selected (the landing zone {settings.landing} has no matching <region>/<day>/ folders)")
        return []
    progress = Progress(len(keys))
    try:
        runs, lines = run_backfill(settings, keys, workers=workers, force=force, progress=progress)
    finally:
        progress.close()
    for line in lines:
        print(line, file=sys.stderr)
    return runs


def _force(args: argparse.Namespace):  # -> assets.runner.Force | None
    """``--from PHASE --reason TEXT``: recompute PHASE and every later phase, recorded as who and why."""
    if args.from_phase is None:
        if args.reason:
            raise ConfigError("--reason goes with --from PHASE")
        return None
    if not (args.reason or "").strip():
        raise ConfigError(f"--from {args.from_phase} needs --reason TEXT: the ledger records why the batch was re-run")
    import uuid

    from assets.runner import Force

    return Force(args.from_phase, args.reason.strip(), _operator(), uuid.uuid4().hex)


def _outcome(runs: list) -> tuple[list, int, int]:
    """(the partitions that failed, phases computed, artifacts delivered) of a backfill's runs."""
    return ([r for r in runs if not r.ok], sum(s == "COMPLETED" for r in runs for s in r.phases.values()),
            sum(len(r.delivered) for r in runs))


def _say_failed(failed: list) -> None:
    for r in failed:
        if r.error:
            print(f"stormlake: {r.key} failed: {r.error}", file=sys.stderr)


def cmd_backfill(args: argparse.Namespace, settings: Settings) -> int:
    keys, rejected = select_partitions(settings, args.regions, args.days)
    _say_rejected(rejected)
    runs = _run(settings, keys, args.workers, _force(args))
    failed, computed, delivered = _outcome(runs)
    print(f"{len(runs) - len(failed)}/{len(runs)} partitions succeeded; {computed} phases computed, "
          f"{delivered} artifact deliveries")
    _say_failed(failed)
    return 1 if failed or rejected else 0


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from resources.landing import Landing

    if Landing(settings.landing).is_empty():
        ns = argparse.Namespace(regions=SAMPLE["regions"], days=SAMPLE["days"], start=None,
                                rows_per_partition=SAMPLE["rows_per_partition"], seed=SAMPLE["seed"])
        cmd_generate(ns, settings)
    keys, rejected = select_partitions(settings, None, None)
    _say_rejected(rejected)
    runs = _run(settings, keys)
    from pipeline.status import render_table

    for line in render_table(_ledger(settings)):
        print(line)
    failed, computed, delivered = _outcome(runs)
    _say_failed(failed)
    if failed or rejected:
        return 1
    if computed == 0 and delivered == 0:
        print(f"nothing to do: all {len(runs)} partitions were already published; no phase ran, nothing delivered")
    else:
        print(f"computed {computed} phases, delivered {delivered} artifacts; "
              f"published files under {settings.publish_dir}")
    return 0


def status_filter(args: argparse.Namespace, settings: Settings):  # -> StatusFilter
    """The partitions ``status`` (and the views like it) were asked for."""
    from assets.phases import PHASES
    from resources.ledger_views import StatusFilter

    regions = tuple(r.strip() for r in (args.regions or "").split(",") if r.strip())
    bad = [r for r in regions if not REGION_ID_RE.match(r)]
    if bad:
        raise ConfigError(f"--regions: {', '.join(bad)} is not a region id")
    if args.tier is not None and not 0 <= args.tier <= len(PHASES):
        raise ConfigError(f"--tier {args.tier}: tiers go from 0 to {len(PHASES)}")
    if args.limit is not None and args.limit < 0:
        raise ConfigError(f"--limit {args.limit}: give a number of partitions, 0 or more")
    return StatusFilter(regions=regions, days=_days(args.days, "0001-01-01"), tier=args.tier, failed=args.failed,
                        limit=args.limit)


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.status import render_table, write_json

    flt = status_filter(args, settings)
    filtered = bool(flt.regions or flt.days or flt.tier is not None or flt.failed or flt.limit is not None)
    ledger, who = _reading_ledger(settings, args.role)
    _say_hidden(ledger, who)
    if args.json:
        write_json(ledger, sys.stdout, flt, dead_letter_after=settings.dead_letter_after)
    else:
        for line in render_table(ledger, flt, filtered=filtered, dead_letter_after=settings.dead_letter_after):
            print(line)
    return 0


def cmd_show(args: argparse.Namespace, settings: Settings) -> int:
    """One partition's history (pipeline/show.py); exit 1 when a stored summary does not read."""
    import json

    from pipeline.show import provenance, render_html, render_text
    from resources.keys import split_partition_key
    from resources.provenance import history

    day, region = split_partition_key(args.key)
    if _a_day(day) is None or not region:
        raise ConfigError(f"show {args.key!r}: give a partition key, YYYY-MM-DD|region (as status shows them)")
    ledger, who = _reading_ledger(settings, args.role)
    _say_hidden(ledger, who)
    rec = provenance(history(ledger, args.key))
    if args.html:
        Path(args.html).write_text(render_html(rec), encoding="utf-8")
        print(f"wrote {args.html}")
    elif args.json:
        json.dump(rec, sys.stdout, indent=1, default=str)
        print()
    else:
        for line in render_text(rec):
            print(line)
    for problem in rec["problems"]:
        print(f"stormlake: {problem['error']}: {problem['message']}", file=sys.stderr)
    return 1 if rec["problems"] else 0


def _operator() -> str:
    """Who an operator action is recorded as: ``STORMLAKE_OPERATOR``, else the login name."""
    import getpass

    return os.environ.get("STORMLAKE_OPERATOR") or getpass.getuser()


def cmd_release(args: argparse.Namespace, settings: Settings) -> int:
    from resources.keys import split_partition_key

    day, region = split_partition_key(args.key)
    when = _a_day(day)
    known = {r.region_id for r in load_regions(settings.regions_file)}
    if when is None or when < dt.date.fromisoformat(settings.first_day) or region not in known:
        raise ConfigError(f"release {args.key}: not a partition key (YYYY-MM-DD|region_id of the region file,"
                          f" from STORMLAKE_FIRST_DAY={settings.first_day})")
    if not (args.reason or "").strip():
        raise ConfigError("release needs --reason TEXT: the ledger records why")
    release = _pipeline_ledger(settings).release(args.key, actor=_operator(), reason=args.reason.strip())
    if release.phases:
        print(f"released {args.key}: {', '.join(release.phases)} will be tried again by the next run")
    if release.held_phase is None:
        if not release.phases:
            print(f"{args.key} had no dead-lettered, failed or held phase; the release is recorded")
        return 0
    # A held batch: deliver it now, exactly once, through the same run as a backfill of the key.
    failed, _, delivered = _outcome(_run(settings, [args.key]))
    _say_failed(failed)
    if not failed:
        print(f"released {args.key}: {release.held_phase} delivered {delivered} artifacts")
    return 1 if failed else 0


def cmd_review(args: argparse.Namespace, settings: Settings) -> int:
    """What waits for a person: the dead-lettered phases, each with its last error and what to run."""
    from resources.ledger_views import LedgerViews

    ledger, who = _reading_ledger(settings, args.role)
    _say_hidden(ledger, who)
    views = LedgerViews(ledger)
    dead, held = views.dead_letters(settings.dead_letter_after), views.held()
    if not dead and not held:
        print(f"nothing waits for review (no batch held, no phase failed {settings.dead_letter_after} times"
              " on the same inputs)")
        return 0
    if held:
        print(f"{len(held)} held for review (graded noisy: tables written, nothing delivered):")
    for cp in held:
        hold = (cp.summary or {}).get("held") or {}
        print(f"  {cp.partition_key:<28} {cp.phase:<9} {hold.get('quality', '?')}: "
              f"{'; '.join(hold.get('reasons') or [])}")
        print(f"    next: check the batch's landing files; to publish it as it is: "
              f"stormlake release {cp.partition_key} --reason TEXT")
    if dead:
        print(f"{len(dead)} dead-lettered (failed {settings.dead_letter_after}+ times on the same inputs; "
              "backfills, schedules and sensors skip them):")
    for cp in dead:
        error = (cp.error_message or "").splitlines()[0] if cp.error_message else ""
        print(f"  {cp.partition_key:<28} {cp.phase:<9} {cp.failures} failures  last: {cp.error_class}: {error}")
        print(f"    next: fix the cause, then stormlake release {cp.partition_key} --reason TEXT")
    return 0


def _since(text: str | None) -> dt.datetime | None:
    """``--since``: an ISO date or time (UTC when it names no zone), or an age such as 90m, 12h, 7d."""
    if not text:
        return None
    m = re.fullmatch(r"(\d+)([smhd])", text.strip())
    if m:
        seconds = int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        try:
            return dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds)
        except (OverflowError, ValueError):  # further back than the calendar goes: every read
            return dt.datetime(1, 1, 1, tzinfo=dt.UTC)
    try:
        t = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(f"--since {text!r}: give an ISO date or time, or an age such as 90m, 12h, 7d") from None
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def cmd_access(args: argparse.Namespace, settings: Settings) -> int:
    """The access policy, its changes, and the log of every read by a person (migrations 007, 009),
    each as the person's own login (``STORMLAKE_PG_DSN``); new logins as the owner."""
    from resources.ledger import get_ledger
    from resources.logins import resolve_logins

    if args.action == "add-login":
        return _add_login(args, settings)
    if args.action == "log" and args.limit < 0:
        raise ConfigError(f"--limit {args.limit}: give a number of rows, 0 or more")
    ledger = get_ledger(resolve_logins(settings).reader, role=None)
    ledger.require_schema()
    if args.action == "retain":
        if args.older_than is None or not (args.reason or "").strip():
            raise ConfigError("access retain needs --older-than DAYS and --reason TEXT (it records why)")
        rows, actions = ledger.retain(older_than_days=args.older_than, reason=args.reason.strip())
        print(f"removed {rows} access-log rows and {actions} operator actions older than {args.older_than} days"
              " (the retention itself is recorded)")
        return 0
    if args.action == "log":
        total, rows = ledger.access_log(role=args.role, since=_since(args.since), limit=args.limit)
        print(f"{total} logged reads" + (f" by {args.role}" if args.role else "")
              + (f" since {args.since}" if args.since else "") + (f"; the newest {len(rows)}:" if rows else ""))
        for r in rows:
            print(f"  {r.at.isoformat(timespec='seconds')}  #{r.request_id:<6} {r.login or '?':<20}"
                  f" {r.client_addr or 'local':<15} pid {r.backend_pid or '?':<7} {r.role:<18} {r.phase:<9}"
                  f" {r.what:<11} {r.partition_key or '(all partitions)':<24} {'allowed' if r.allowed else 'DENIED'}")
        return 0
    if args.action == "show":
        for phase, roles in ledger.access_policy().items():
            print(f"{phase:<9} read by: {', '.join(roles) or '(nobody)'}")
        return 0
    role = args.grantee or args.role
    if not (role and args.phase):
        raise ConfigError(f"access {args.action} needs a role and a phase: stormlake access {args.action} ROLE PHASE"
                          " --reason TEXT")
    if not (args.reason or "").strip():
        raise ConfigError(f"access {args.action} needs --reason TEXT: the ledger records why")
    changed = ledger.change_access(args.action, role, args.phase, reason=args.reason.strip())
    verb = "may now read" if args.action == "grant" else "may no longer read"
    print(f"{role} {verb} {args.phase}" if changed else
          f"nothing changed: {role} {'already' if args.action == 'grant' else 'could not'} read {args.phase}"
          " (the request is recorded)")
    return 0


def _add_login(args: argparse.Namespace, settings: Settings) -> int:
    """``access add-login NAME --role ROLE``: a login of its own for a person (or the pipeline), as
    the owner; its DSN with its password goes to a file only this user can read, never to the screen."""
    from resources.logins import add_login, resolve_logins

    if not args.grantee or args.phase:
        raise ConfigError("access add-login needs a name: stormlake access add-login NAME --role ROLE")
    if not args.role:
        raise ConfigError("access add-login needs --role ROLE (ops_reader, compliance_auditor, admin or resume_worker)")
    logins = resolve_logins(settings)
    if logins.owner is None:
        raise ConfigError("access add-login runs as the ledger's owner: set STORMLAKE_OWNER_DSN")
    path = add_login(logins.owner, args.grantee, args.role, folder=settings.home / "logins", tcp=logins.embedded)
    print(f"made login {args.grantee}, a member of {args.role}; its DSN, with its password, is in {path}"
          " (readable by you only): hand it over privately; its holder sets STORMLAKE_PG_DSN to it")
    return 0


def cmd_prune(args: argparse.Namespace, settings: Settings) -> int:
    if not 1 <= args.older_than <= 36_500:
        raise ConfigError(f"--older-than {args.older_than}: give a number of days from 1 to 36,500")
    window_start = settings.first_day
    if args.keep_from:
        try:
            window_start = dt.date.fromisoformat(args.keep_from).isoformat()
        except ValueError:
            raise ConfigError(f"--keep-from {args.keep_from!r}: expected YYYY-MM-DD") from None
    res = _ledger(settings).prune(older_than_days=args.older_than, keep_days_from=window_start)
    print(f"pruned {res.checkpoints} superseded checkpoints, {res.events} events, "
          f"{res.receipts} superseded receipts older than {args.older_than} days "
          f"(receipts of days from {window_start} kept)")
    if res.old_events_kept_current:
        print(f"kept {res.old_events_kept_current} older events of current checkpoints "
              "(their attempts and skips, which status and the report show)")
    if res.readers:
        if res.old_events_kept_unread:
            print(f"kept {res.old_events_kept_unread} older events not yet read by every event reader "
                  f"(kept after event {res.read_up_to})")
        for r in res.readers:
            print(f"  event reader {r.name}: read up to event {r.after_event_id}"
                  f" (recorded {r.updated_at.isoformat(timespec='seconds')})")
    else:
        print(f"kept all {res.old_events_kept_unread} older events of superseded checkpoints: no event reader has "
              "recorded how far it read (outbox_sensor records it on each tick), so any of them may be unread")
    return 0


def cmd_report(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.report import write_report

    out = Path(args.out) if args.out else settings.home / "report.html"
    if out.is_dir():
        raise ConfigError(f"--out {out}: is a folder; name the report's file (for example {out / 'report.html'})")
    ledger, who = _reading_ledger(settings, args.role)
    _say_hidden(ledger, who)
    problems = write_report(ledger, out, dead_letter_after=settings.dead_letter_after, role=who)
    for problem in problems:
        print(f"stormlake: SummaryInvalid: {problem}", file=sys.stderr)
    print(f"wrote {out}")
    return 1 if problems else 0


def cmd_bench(args: argparse.Namespace, settings: Settings) -> int:
    for flag, value in (("--partitions", args.partitions), ("--rows-per-partition", args.rows_per_partition),
                        ("--repeat", args.repeat)):
        if value is not None and value < 1:  # 0 is no default: a bench of nothing is a mistake
            raise ConfigError(f"{flag} {value}: must be at least 1")
    for flag, value in (("--regions", args.regions), ("--days", args.days)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} {value}: must be at least 1")
    if (args.regions or args.days or args.sides) and not (args.month or args.year):
        raise ConfigError("--regions, --days and --sides go with --month or --year")
    if args.month or args.year:
        from pipeline.tools.bench_month import run_month_bench

        return run_month_bench(args, settings, year=args.year)
    import importlib

    # The first of these flags given picks the bench (none: bare transforms against the pipeline):
    # its module, and whether it takes --partitions and --rows (defaults: the module's DEFAULTS).
    benches = {"live": ("bench_live", False), "all": ("bench_year", False), "scale": ("bench_scale", False),
               "ui": ("bench_ui", True), "engine": ("bench_engine", True), "workers": ("bench_workers", True)}
    name = next((n for n in benches if getattr(args, n)), None)
    module_name, sized = benches[name] if name else ("bench", True)
    module = importlib.import_module(f"pipeline.tools.{module_name}")
    if sized:
        args.partitions = args.partitions or module.DEFAULTS["partitions"]
        args.rows_per_partition = args.rows_per_partition or module.DEFAULTS["rows_per_partition"]
    return getattr(module, f"run_{module_name.removeprefix('bench_')}_bench" if name else "run_bench")(args, settings)


def cmd_db(args: argparse.Namespace, settings: Settings) -> int:
    from resources.logins import is_external
    from resources.pgserver import is_running, stop_embedded

    external = is_external(settings)
    if external and args.action in ("start", "stop"):
        raise ConfigError("a ledger DSN is set: the ledger's server is not stormlake's to start or stop")
    if args.action == "migrate":
        return _migrate(settings)
    if args.action == "stop":
        print("stopped the embedded PostgreSQL" if stop_embedded(settings.pgdata) else "the embedded PostgreSQL was not running")
    elif args.action == "start":
        _prepare(settings)
        print(f"embedded PostgreSQL running in {settings.pgdata}")
    elif args.action == "status":
        print("running" if (external or is_running(settings.pgdata)) else "stopped")
    return 0


def _migrate(settings: Settings) -> int:
    """``db migrate``: apply the pending migrations as the ledger's owner, the one login that runs DDL."""
    from resources.ledger import Ledger
    from resources.logins import resolve_logins

    owner = resolve_logins(settings).owner
    if owner is None:
        raise ConfigError("db migrate runs as the ledger's owner: set STORMLAKE_OWNER_DSN")
    ledger = Ledger(owner, role=None)
    try:
        applied = ledger.migrate()
        version = ledger.schema_version_as_owner()
    finally:
        ledger.close()
    print(f"applied migration{'s' if len(applied) > 1 else ''} {', '.join(f'{v:03d}' for v in applied)};"
          f" the ledger's schema is at version {version}" if applied else
          f"nothing to apply: the ledger's schema is at version {version}")
    return 0


def cmd_env(args: argparse.Namespace, settings: Settings) -> int:
    _prepare(settings)
    if args.dotenv:
        from pipeline.instance import write_dotenv

        target = write_dotenv(Path.cwd(), settings)
        print(f"wrote {target}: Dagster's CLI run in this folder (dg dev, dg launch, ...) uses the instance "
              f"{os.environ['DAGSTER_HOME']}")
        return 0
    from pipeline.instance import EVENT_BATCH_ENV

    print(f"export DAGSTER_HOME={os.environ['DAGSTER_HOME']}")
    print(f"export STORMLAKE_HOME={settings.home}")
    print(f"export {EVENT_BATCH_ENV}={os.environ[EVENT_BATCH_ENV]}")
    return 0


DEV_STOP_S = 150  # dg dev gives the webserver and then the daemon up to 60 s each to stop


def cmd_ui(args: argparse.Namespace, settings: Settings) -> int:
    """``dg dev`` (webserver, daemon and one code server) on this instance, 127.0.0.1 only.

    PostgreSQL is started first when embedded, and stopped last, after ``dg dev`` has stopped its
    processes.
    """
    from resources.logins import is_external
    from resources.pgserver import stop_embedded

    embedded = not is_external(settings)
    _prepare(settings)
    # The code location resolves the same settings in whatever folder dg dev's processes run.
    env = dict(os.environ, STORMLAKE_HOME=str(settings.home))
    from pipeline.instance import write_workspace

    workspace = write_workspace(Path(env["DAGSTER_HOME"]))
    stopping = False

    def stop(_sig: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    # Handlers first: dg dev inherits an ignored SIGINT (a shell's background job) and would then
    # ignore SIGTERM too (Dagster maps SIGTERM to the SIGINT handler); a handled one reaches it as
    # the default.
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    dg = Path(sys.executable).parent / "dg"
    # A session of its own: Ctrl-C reaches this process only, which stops dg dev (it stops the
    # webserver and the daemon) before PostgreSQL, and whatever of it is left goes as one group.
    proc = subprocess.Popen([str(dg), "dev", "-w", str(workspace), "-h", "127.0.0.1", "-p", str(args.port)],
                            env=env, start_new_session=True)
    print(f"Dagster UI on http://127.0.0.1:{args.port} (instance {env['DAGSTER_HOME']}); Ctrl-C stops it", file=sys.stderr)
    try:
        while not stopping and proc.poll() is None:
            time.sleep(0.3)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(DEV_STOP_S)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # what is left of its group: a hung server, a run worker
        proc.wait()
        if embedded:
            stop_embedded(settings.pgdata)
    return 1 if (proc.returncode not in (0, -signal.SIGTERM, 143) and not stopping) else 0


def _selection_args(parser: argparse.ArgumentParser) -> None:
    """``--regions`` and ``--days``: which partitions of the landing zone or the ledger."""
    parser.add_argument("--regions", help="comma-separated region ids")
    parser.add_argument("--days", help="START..END (inclusive) or one day")


def _positive(raw: str) -> int:
    if not raw.isdigit() or int(raw) < 1:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a whole number of at least 1")
    return int(raw)


def _add_generate(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("generate", help="write a deterministic synthetic storm scenario into the landing zone")
    g.add_argument("--regions", type=int, default=SAMPLE["regions"])
    g.add_argument("--days", type=int, default=SAMPLE["days"])
    g.add_argument("--start", default=None, help="first day, YYYY-MM-DD (default STORMLAKE_FIRST_DAY)")
    g.add_argument("--rows-per-partition", type=int, default=SAMPLE["rows_per_partition"])
    g.add_argument("--seed", type=int, default=SAMPLE["seed"])
    g.add_argument("--noisy", type=float, default=0.0, metavar="SHARE",
                   help="the share of partitions made noisy (many bad rows, station-hours missing): "
                        "present grades them noisy and holds them for review; listed in _truth/scenario.json")
    g.add_argument("--as-of", default=None, metavar="TIME",
                   help="a storm in progress: write only the rows reported up to TIME (ISO-8601, UTC without an "
                        "offset, or now), no day that begins after it; a later TIME writes longer files")
    g.set_defaults(fn=cmd_generate)


def _add_runs(sub: argparse._SubParsersAction) -> None:
    from assets.phases import PHASES

    sub.add_parser("demo", help="generate the sample if needed, run it all, print the status").set_defaults(fn=cmd_demo)
    b = sub.add_parser("backfill", help="run partitions of the landing zone through Dagster")
    _selection_args(b)
    b.add_argument("--from", dest="from_phase", choices=[p.name for p in PHASES], default=None, metavar="PHASE",
                   help="recompute PHASE and every later phase even when nothing changed (needs --reason)")
    b.add_argument("--reason", default=None, help="why the batches are re-run (recorded in the ledger)")
    b.add_argument("--workers", type=_positive, default=None, metavar="N",
                   help="runs at once, for the daemon this backfill starts (default STORMLAKE_WORKERS: the number"
                        " of cores; a live daemon keeps the instance's limit)")
    b.set_defaults(fn=cmd_backfill)
    u = sub.add_parser("ui", help="dg dev (Dagster webserver and daemon) on this instance")
    u.add_argument("--port", type=int, default=3000)
    u.set_defaults(fn=cmd_ui)


def _add_views(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("status", help="the ledger's view of every partition")
    s.add_argument("--json", action="store_true", help="every selected partition in the contract's JSON shape")
    _selection_args(s)
    s.add_argument("--tier", type=int, help="only partitions at this tier (0-4)")
    s.add_argument("--failed", action="store_true", help="only partitions with a FAILED phase")
    s.add_argument("--limit", type=int, help="at most this many partitions")
    _role_arg(s)
    s.set_defaults(fn=cmd_status)
    r = sub.add_parser("report", help="one HTML page on where every batch stands")
    r.add_argument("--out", default=None)
    _role_arg(r)
    r.set_defaults(fn=cmd_report)
    sh = sub.add_parser("show", help="one partition's history: every attempt, call, delivery, action and read")
    sh.add_argument("key", metavar="KEY", help="the partition, YYYY-MM-DD|region")
    sh.add_argument("--json", action="store_true", help="the history as JSON")
    sh.add_argument("--html", metavar="PATH", default=None, help="write the history as a page with a timeline")
    _role_arg(sh)
    sh.set_defaults(fn=cmd_show)


def _role_arg(p: argparse.ArgumentParser) -> None:
    from resources.ledger import READ_AS_ROLES

    p.add_argument("--role", default=None, choices=READ_AS_ROLES,
                   help="read as this one of the roles your login is a member of (default: the login itself,"
                        " with every role it belongs to); every read is in the access log")


def _add_bench(sub: argparse._SubParsersAction) -> None:
    be = sub.add_parser("bench", help="benchmark: bare transforms vs the pipeline vs a re-run")
    be.add_argument("--json", action="store_true")
    be.add_argument("--partitions", type=int, default=None, help="default 8 (16 with --workers)")
    be.add_argument("--rows-per-partition", "--rows", type=int, default=None,
                    help="default 200,000 (20,000 with --workers, 500 with --month and --year)")
    be.add_argument("--seed", type=int, default=11)
    be.add_argument("--skip", default="", help="comma-separated measurements to leave out")
    be.add_argument("--scale", action="store_true",
                    help="instead: time status, status --json, report, a rerun and a sensor tick on a ledger of a "
                         "year of 50 regions (real runs plus cloned rows)")
    be.add_argument("--ui", action="store_true",
                    help="instead: time a backfill launched in the Dagster UI (GraphQL) against stormlake backfill")
    be.add_argument("--workers", action="store_true",
                    help="instead: time a backfill in 1 process against STORMLAKE_WORKERS processes, side by side")
    be.add_argument("--engine", action="store_true",
                    help="instead: a backfill's steps on 1 Celery worker against 2, side by side (Redis, a local S3"
                         " endpoint, workers as another user when root)")
    be.add_argument("--all", action="store_true",
                    help="instead: every figure of a year of small partitions in one run (small partitions, "
                         "workers, the UI, the views at scale) against its target")
    be.add_argument("--live", action="store_true",
                    help="instead: from a new version of today's files for --partitions regions (default 50) "
                         "landing to every superseding artifact delivered, through the landing sensor of stormlake ui")
    be.add_argument("--month", action="store_true",
                    help="instead: a month of --regions (50) x --days (30) partitions from the CLI and from the UI, "
                         "side by side from fresh homes: seconds a partition, the tenths and the year projected")
    be.add_argument("--year", action="store_true",
                    help="instead: --month over 365 days, from the CLI (--sides cli,ui for both)")
    be.add_argument("--regions", type=int, default=None, help="with --month or --year: regions (default 50)")
    be.add_argument("--days", type=int, default=None, help="with --month or --year: days (default 30, 365)")
    be.add_argument("--sides", default=None, help="with --month or --year: cli, ui or cli,ui "
                                                    "(default cli,ui; cli with --year)")
    be.add_argument("--repeat", type=int, default=3,
                    help="alternate bare and pipeline (and repeat resume) this many times; the fastest of each counts")
    be.set_defaults(fn=cmd_bench)


def _add_operations(sub: argparse._SubParsersAction) -> None:
    rv = sub.add_parser("review", help="what waits for a person: held batches and dead-lettered phases, and what to run")
    _role_arg(rv)
    rv.set_defaults(fn=cmd_review)
    rl = sub.add_parser("release", help="re-arm a dead-lettered partition or deliver a held one (recorded with who and why)")
    rl.add_argument("key", metavar="KEY", help="the partition key, YYYY-MM-DD|region_id")
    rl.add_argument("--reason", required=True, help="why it is released (recorded in the ledger)")
    rl.set_defaults(fn=cmd_release)
    ac = sub.add_parser("access", help="who may read which phase, its changes, and the log of every read by a person")
    ac.add_argument("action", choices=["log", "show", "grant", "revoke", "add-login", "retain"])
    ac.add_argument("grantee", nargs="?", default=None, metavar="ROLE",
                    help="grant/revoke: the database role; add-login: the new login's name")
    ac.add_argument("phase", nargs="?", default=None, help="grant/revoke: the phase")
    ac.add_argument("--role", default=None,
                    help="log: only the reads made as this role or by this login; add-login: the role it joins")
    ac.add_argument("--older-than", type=int, default=None, metavar="DAYS",
                    help="retain: remove access-log rows and operator actions older than this (30 or more)")
    ac.add_argument("--since", default=None, help="log: reads since this time (ISO) or age (90m, 12h, 7d)")
    ac.add_argument("--limit", type=int, default=200, help="log: at most this many rows (newest first)")
    ac.add_argument("--reason", default=None, help="grant/revoke/retain: why (recorded in the ledger)")
    ac.set_defaults(fn=cmd_access)
    pr = sub.add_parser("prune", help="remove ledger history past the window")
    pr.add_argument("--older-than", type=int, required=True, metavar="DAYS")
    pr.add_argument("--keep-from", default=None, metavar="YYYY-MM-DD",
                    help="first day of the backfill window whose receipts are always kept (default STORMLAKE_FIRST_DAY)")
    pr.set_defaults(fn=cmd_prune)
    d = sub.add_parser("db", help="the embedded PostgreSQL server; migrate: the ledger's schema, as its owner")
    d.add_argument("action", choices=["start", "stop", "status", "migrate"])
    d.set_defaults(fn=cmd_db)
    e = sub.add_parser("env", help="print the exports that point Dagster's own CLI at this instance")
    e.add_argument("--dotenv", action="store_true",
                   help="instead, write them as defaults into ./.env, which dg and dagster read in this folder")
    e.set_defaults(fn=cmd_env)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="stormlake", description="Storm-outage intelligence pipeline on Dagster.")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)
    for add in (_add_generate, _add_runs, _add_views, _add_bench, _add_operations):
        add(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from pipeline.console import quiet_console

    quiet_console()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = load_settings()
        apply_file_mode(settings.file_mode)
        return int(args.fn(args, settings) or 0)
    except StormlakeError as exc:
        if args.debug:
            raise
        print(f"stormlake: {exc.__class__.__name__}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("stormlake: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of stdout went away (`stormlake status | head`): nothing more to say.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        # A path of the settings or the arguments that cannot be used (a file where a folder
        # goes, no permission, a read-only file system): one line naming it, as a usage error.
        if args.debug or exc.filename is None:
            raise
        print(f"stormlake: {exc.filename}: {exc.strerror or exc.__class__.__name__}"
              " (check the paths in the settings and the arguments)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
