"""`stormlake show KEY`: why a partition is the way it is, from the ledger alone.

The history (:func:`resources.provenance.history`) is turned into one record (:func:`provenance`)
and printed as text, as JSON (``--json``) or written as a page with a timeline (``--html``):

- every checkpoint of every phase, superseded ones included, in order, with why it was computed
  (its first run, new inputs and which, another schema or code version, a forced re-run, a
  release), its input and state hashes, tier, quality, the Delta versions and files it pinned,
  its recorded calls with their answers, and each of its attempts (status, duration, error)
  and skips;
- every delivery (receipt, target, generation, what it superseded), the operator actions on the
  partition, and the reads of it in the access log.

Every stored summary is checked against its phase's model (:mod:`assets.summaries`), every
event's detail against its status's. A head checkpoint whose summary does not read, or an event
whose detail does not, is a problem: one line naming the partition, the phase, the checkpoint's
seq and the field (for a summary, the re-run that replaces it); the command then exits 1 after
showing the rest. A superseded checkpoint's summary that does not read is only noted: no run
reads it any more.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import html
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from assets.phases import BY_NAME, PHASES
from assets.summaries import detail_problem, invalid_summary, summary_problem
from resources.errors import EventDetailInvalid
from resources.ledger import Checkpoint, Event
from resources.provenance import History

#: A recorded call's input or answer longer than this (as compact JSON) is shown as its digest.
BIG_JSON = 240


def _iso(t: dt.datetime | None) -> str | None:
    return t.isoformat(timespec="milliseconds") if t is not None else None


def _compact(value: Any) -> Any:
    """A JSON value as it is shown: itself, or its digest and size when it is big."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    if len(text) <= BIG_JSON:
        return value
    return {"sha256": hashlib.sha256(text.encode()).hexdigest()[:16], "bytes": len(text)}


def _attempts(cp: Checkpoint, events: list[Event]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A checkpoint's attempts (from its PENDING events to the COMPLETED or FAILED one that ends
    each) and its skips. An attempt with no end that a later attempt took over was cut short (its
    process died); the last one with no end is the checkpoint's own status."""
    mine = [e for e in events if e.checkpoint_id == cp.id]
    starts = [e for e in mine if e.status == "PENDING"]
    ends = {e.attempt: e for e in mine if e.status in ("COMPLETED", "FAILED")}
    attempts = []
    for i, start in enumerate(starts):
        end = ends.get(start.attempt)
        last = i == len(starts) - 1
        status = end.status if end is not None else (cp.status if last else "INTERRUPTED")
        error = None
        if status == "FAILED":
            error = (end.detail or {}).get("error_class") if end is not None else cp.error_class
            if last and cp.error_message:
                error = f"{cp.error_class}: {cp.error_message}"
        attempts.append({
            "attempt": start.attempt, "seq": start.seq, "status": status, "run_id": start.run_id,
            "started_at": _iso(start.at), "ended_at": _iso(end.at) if end is not None else None,
            "duration_s": round((end.at - start.at).total_seconds(), 3) if end is not None else None,
            "error": error,
        })
    if not starts:  # its events pruned: the checkpoint row says what it can
        attempts.append({"attempt": cp.attempt, "seq": cp.seq, "status": cp.status, "run_id": cp.run_id,
                         "started_at": _iso(cp.created_at), "ended_at": _iso(cp.completed_at),
                         "duration_s": None, "error": cp.error_class})
    skips = [{"at": _iso(e.at), "run_id": e.run_id} for e in mine if e.status == "SKIPPED"]
    return attempts, skips


def _why(cp: Checkpoint, before: Checkpoint | None, summary: dict[str, Any] | None,
         before_summary: dict[str, Any] | None, forces: list[dict[str, Any]]) -> str:
    """Why this checkpoint was computed rather than its predecessor of the same phase reused."""
    summary = summary or {}
    if summary.get("released"):
        r = summary["released"]
        return f"release #{r['action_id']} by {r['by']}: {r['reason']}"
    if summary.get("forced"):
        f = summary["forced"]
        return f"forced re-run from {f['from']} by {f['by']}: {f['reason']}"
    for f in forces:
        return f"forced re-run from {f['phase']} by {f['actor']}: {f['reason']}"
    if before is None:
        return "first run"
    changed = []
    if before.schema_version != cp.schema_version:
        changed.append(f"schema version {before.schema_version} -> {cp.schema_version}")
    if before.code_version != cp.code_version:
        changed.append(f"code version {before.code_version} -> {cp.code_version}")
    if changed:
        return ", ".join(changed)
    if summary and before_summary:
        up, was = summary.get("upstream") or {}, before_summary.get("upstream") or {}
        names = [p for p in up if up.get(p) != was.get(p)]
        files, old = summary.get("input_files") or {}, before_summary.get("input_files") or {}
        names += [f for f in sorted(set(files) | set(old)) if files.get(f) != old.get(f)]
        if names:
            return "new inputs: " + ", ".join(names)
    return "new inputs"


def provenance(h: History) -> dict[str, Any]:
    """The partition's history as one JSON-able record (what every output shows), with its problems."""
    problems: list[dict[str, str]] = []  # {"error": its class's name, "message": one line}
    events = h.events
    for e in events:
        bad = detail_problem(e.status, e.detail)
        if bad is not None:
            err = EventDetailInvalid(f"{e.phase} of {h.partition_key} (event {e.event_id}, {e.status}, seq {e.seq}):"
                                     f" its detail's field {bad[0]!r} is invalid ({bad[1]}); the event is shown as stored")
            problems.append({"error": type(err).__name__, "message": str(err)})
    calls_of: dict[int, list[dict[str, Any]]] = {}
    for c in h.calls:
        calls_of.setdefault(c.checkpoint_id, []).append({
            "kind": c.kind, "name": c.name, "seq": c.seq, "recorded_at": _iso(c.recorded_at),
            "input": _compact(c.input), "output": _compact(c.output)})
    phases: dict[str, list[dict[str, Any]]] = {}
    by_phase: dict[str, list[Checkpoint]] = {}
    for cp in h.checkpoints:
        by_phase.setdefault(cp.phase, []).append(cp)
    for name, cps in by_phase.items():
        readable: list[dict[str, Any] | None] = []
        unread: dict[int, str] = {}
        for cp in cps:
            bad = summary_problem(cp.phase, cp.schema_version, cp.summary) if cp.status == "COMPLETED" else None
            if bad is not None:
                unread[cp.id] = f"field {bad[0]!r}: {bad[1]}"
                if cp.superseded_at is None:  # the head is what a run reads: it wants replacing
                    err = invalid_summary(partition_key=cp.partition_key, phase=cp.phase, seq=cp.seq, field=bad[0],
                                          problem=bad[1])
                    problems.append({"error": type(err).__name__, "message": str(err)})
            readable.append(cp.summary if cp.status == "COMPLETED" and bad is None else None)
        out = []
        for i, cp in enumerate(cps):
            summary = readable[i]
            attempts, skips = _attempts(cp, events)
            runs = {a["run_id"] for a in attempts}
            forces = [{"phase": a.phase, "actor": a.actor, "reason": a.reason} for a in h.actions
                      if a.action == "force" and (a.detail or {}).get("run_id") in runs and a.phase in BY_NAME
                      and BY_NAME[a.phase].tier <= BY_NAME[cp.phase].tier]
            entry: dict[str, Any] = {
                "checkpoint_id": cp.id, "seq": cp.seq, "first_seq": cp.first_seq, "status": cp.status,
                "superseded_at": _iso(cp.superseded_at), "why": _why(cp, cps[i - 1] if i else None, summary,
                                                                     readable[i - 1] if i else None, forces),
                "input_hash": cp.input_hash, "state_hash": cp.state_hash, "schema_version": cp.schema_version,
                "code_version": cp.code_version, "tier": cp.tier, "tier_label": cp.tier_label,
                "attempts": attempts, "skips": skips, "calls": calls_of.get(cp.id, []),
                "summary_problem": unread.get(cp.id),
            }
            if summary is not None:
                figures = summary.get("figures") or {}
                quality = (figures.get("quality") or {}).get("grade") if isinstance(figures.get("quality"), dict) else None
                checks = summary.get("checks") or {}
                entry.update({
                    "quality": quality, "held": summary.get("held"),
                    "checks": {"passed": sum(bool(v) for v in checks.values()), "of": len(checks),
                               "failed": sorted(k for k, v in checks.items() if not v)},
                    "rows": summary.get("rows"), "delta_versions": summary.get("delta_versions"),
                    "delta_files": summary.get("delta_files"), "natural_input_hash": summary.get("natural_input_hash"),
                })
            out.append(entry)
        phases[name] = out
    superseded_by = {r.supersedes: r.artifact_id for r in h.receipts if r.supersedes}
    deliveries = [{
        "artifact_id": r.artifact_id, "kind": r.kind, "target": r.target, "target_ref": r.target_ref,
        "generation": r.generation, "receipt": r.idempotency_key, "receipt_id": r.receipt_id, "status": r.status,
        "content_hash": r.content_hash, "supersedes": r.supersedes, "superseded_by": superseded_by.get(r.artifact_id),
        "attempts": r.attempts, "last_error": r.last_error, "created_at": _iso(r.created_at),
        "delivered_at": _iso(r.delivered_at), "checkpoint_id": r.checkpoint_id,
    } for r in h.receipts]
    actions = [{"action_id": a.action_id, "at": _iso(a.at), "action": a.action, "phase": a.phase, "actor": a.actor,
                "reason": a.reason, "detail": a.detail} for a in h.actions]
    reads: dict[int, dict[str, Any]] = {}
    for r in h.reads or []:
        got = reads.setdefault(r.request_id, {"request_id": r.request_id, "at": _iso(r.at), "role": r.role,
                                              "what": r.what, "allowed": [], "denied": []})
        got["allowed" if r.allowed else "denied"].append(r.phase)
    day, _, region = h.partition_key.partition("|")
    return {
        "partition": h.partition_key, "region": region, "day": day, "role": h.role, "hidden_phases": h.hidden,
        "phases": {p.name: phases[p.name] for p in PHASES if p.name in phases},
        "deliveries": deliveries, "actions": actions, "reads": None if h.reads is None else list(reads.values()), "problems": problems,
    }


# ---- text ------------------------------------------------------------------------------------
def _short(h: str | None) -> str:
    return (h or "-")[:12]


_HEX64 = re.compile(r"\b([0-9a-f]{12})[0-9a-f]{52}\b")


def _json_text(value: Any) -> str:
    """A recorded call's input or answer on one line, each full sha256 cut to its first 12 digits."""
    return _HEX64.sub(r"\1…", json.dumps(value, sort_keys=True, separators=(",", ":"), default=str))


def render_text(rec: dict[str, Any]) -> Iterator[str]:
    """The record as lines for a person."""
    yield f"{rec['partition']}" + (f" (as {rec['role']})" if rec["role"] else "")
    if not rec["phases"] and not rec["deliveries"]:
        yield "  nothing in the ledger" + (" that this role may see" if rec["hidden_phases"] else " (never run)")
    for phase, cps in rec["phases"].items():
        yield phase
        for c in cps:
            state = "superseded " + c["superseded_at"][:19] if c["superseded_at"] else "head"
            yield (f"  checkpoint seq {c['seq']} ({state}): {c['status']}, schema {c['schema_version']},"
                   f" code {c['code_version']}, tier {c['tier']} {c['tier_label']}")
            yield f"    why: {c['why']}"
            line = f"    input {_short(c['input_hash'])}  state {_short(c['state_hash'])}"
            if "checks" in c:
                k = c["checks"]
                line += f"  checks {k['passed']}/{k['of']} passed"
                if c.get("quality"):
                    line += f"  quality {c['quality']}"
                if c.get("held"):
                    line += f"  held for review ({c['held'].get('quality')})"
            yield line
            if c["summary_problem"]:
                yield f"    summary: does not read ({c['summary_problem']})"
            for a in c["attempts"]:
                took = f" after {a['duration_s']:.2f} s" if a["duration_s"] is not None else ""
                err = f": {a['error']}" if a["error"] else ""
                yield (f"    attempt {a['attempt']} (seq {a['seq']}) {a['started_at'][:23] if a['started_at'] else '-'}"
                       f" {a['status']}{took}{err}  run {(a['run_id'] or '-')[:8]}")
            if c["skips"]:
                yield f"    skipped {len(c['skips'])} times, last {c['skips'][-1]['at'][:19]}"
            for table, version in (c.get("delta_versions") or {}).items():
                files = (c.get("delta_files") or {}).get(table)
                yield f"    delta {table} v{version}" + (f" files {', '.join(files)}" if files else "")
            for call in c["calls"]:
                yield (f"    call {call['kind']} {call['name']} (seq {call['seq']}): {_json_text(call['input'])}"
                       f" -> {_json_text(call['output'])}")
    if rec["deliveries"]:
        yield "deliveries"
        for d in rec["deliveries"]:
            sup = f", supersedes {d['supersedes']}" if d["supersedes"] else ""
            yield (f"  {d['artifact_id']} -> {d['target']} gen {d['generation']}: {d['status']}"
                   f" {(d['delivered_at'] or d['created_at'] or '')[:19]}  receipt {d['receipt']}{sup}"
                   + (f"  (superseded by {d['superseded_by']})" if d["superseded_by"] else ""))
    if rec["actions"]:
        yield "operator actions"
        for a in rec["actions"]:
            yield f"  {a['at'][:19]} {a['action']} {a['phase'] or '-'} by {a['actor']}: {a['reason']}"
    if rec["reads"] is None:
        yield "reads (access log): left out, this login may not read the access log (compliance_auditor and admin may)"
    elif rec["reads"]:
        yield "reads (access log)"
        for r in rec["reads"]:
            denied = f"; denied {', '.join(r['denied'])}" if r["denied"] else ""
            yield f"  {r['at'][:19]} #{r['request_id']} {r['role']} {r['what']}: {', '.join(r['allowed']) or '-'}{denied}"


# ---- the page ----------------------------------------------------------------------------------
_COLORS = {"COMPLETED": "#1a7f37", "FAILED": "#d7191c", "INTERRUPTED": "#e66101", "PENDING": "#667085",
           "DELIVERED": "#1f3b73", "SUPERSEDED": "#98a2b3"}
_FONT = "DejaVu Sans,Verdana,Arial,sans-serif"


def _t(s: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(s) if s else None


def timeline_svg(rec: dict[str, Any]) -> str:
    """The attempts of every phase and the deliveries on one time axis, as an SVG drawing: a bar
    per attempt (its colour its status, faded once its checkpoint was superseded), a diamond per
    delivery, a triangle per operator action."""
    rows = [*rec["phases"], "deliveries", "actions"]
    marks: list[tuple[str, dt.datetime, dt.datetime, str, float, str]] = []  # row, start, end, colour, opacity, title
    for phase, cps in rec["phases"].items():
        for c in cps:
            for a in c["attempts"]:
                start = _t(a["started_at"])
                if start is None:
                    continue
                end = _t(a["ended_at"]) or start
                marks.append((phase, start, end, _COLORS.get(a["status"], "#667085"), 0.45 if c["superseded_at"] else 1.0,
                              f"{phase} seq {a['seq']} attempt {a['attempt']}: {a['status']}"
                              + (f" ({a['duration_s']} s)" if a["duration_s"] is not None else "")))
    for d in rec["deliveries"]:
        at = _t(d["delivered_at"] or d["created_at"])
        if at is not None:
            marks.append(("deliveries", at, at, _COLORS.get(d["status"], "#667085"), 1.0,
                          f"{d['artifact_id']} -> {d['target']}: {d['status']}"))
    for a in rec["actions"]:
        marks.append(("actions", _t(a["at"]), _t(a["at"]), "#6a3d9a", 1.0, f"{a['action']} by {a['actor']}: {a['reason']}"))
    width, left, right, top, row_h = 880, 110, 20, 40, 34
    height = top + row_h * len(rows) + 52
    body = [f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="15">Attempts and deliveries of'
            f' {html.escape(rec["partition"])}</text>']
    if not marks:
        body.append(f'<text x="{width / 2}" y="{top + 20}" text-anchor="middle" font-size="12">nothing to draw</text>')
        return _svg(width, height, body)
    t0 = min(m[1] for m in marks)
    t1 = max(m[2] for m in marks)
    span = max((t1 - t0).total_seconds(), 1e-3)
    plot = width - left - right

    def x(t: dt.datetime) -> float:
        return left + plot * (t - t0).total_seconds() / span

    for i, name in enumerate(rows):
        y = top + i * row_h
        body.append(f'<line x1="{left}" x2="{width - right}" y1="{y + row_h}" y2="{y + row_h}" stroke="#e4e7ec"/>')
        body.append(f'<text x="{left - 8}" y="{y + row_h / 2 + 4}" text-anchor="end" font-size="12">{html.escape(name)}</text>')
    for k in range(5):
        t = t0 + dt.timedelta(seconds=span * k / 4)
        anchor = "start" if k == 0 else "end" if k == 4 else "middle"
        body.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top}" y2="{top + row_h * len(rows)}" stroke="#c8c8c8"'
                    ' stroke-dasharray="2,3"/>')
        body.append(f'<text x="{x(t):.1f}" y="{top + row_h * len(rows) + 16}" text-anchor="{anchor}" font-size="11">'
                    f'{t.strftime("%m-%d %H:%M:%S")}</text>')
    legend = [(c, s) for s, c in _COLORS.items() if s not in ("DELIVERED", "SUPERSEDED")]
    for i, (color, status) in enumerate(legend):
        lx = left + i * 100
        body.append(f'<rect x="{lx}" y="{height - 14}" width="12" height="10" fill="{color}"/>'
                    f'<text x="{lx + 16}" y="{height - 5}" font-size="11">{status.lower()}</text>')
    body.append(f'<text x="{left + len(legend) * 100}" y="{height - 5}" font-size="11">faded: superseded;'
                ' diamond: a delivery; triangle: an operator action</text>')
    for row, start, end, color, opacity, title in marks:
        y = top + rows.index(row) * row_h
        title_el = f"<title>{html.escape(title)}</title>"
        if row == "deliveries":
            cx, cy = x(start), y + row_h / 2
            body.append(f'<path d="M{cx:.1f},{cy - 7:.1f} l7,7 l-7,7 l-7,-7 z" fill="{color}" fill-opacity="{opacity}">'
                        f"{title_el}</path>")
        elif row == "actions":
            cx, cy = x(start), y + row_h / 2
            body.append(f'<path d="M{cx:.1f},{cy - 7:.1f} l7,13 l-14,0 z" fill="{color}">{title_el}</path>')
        else:
            x0, x1 = x(start), max(x(end), x(start) + 4)
            body.append(f'<rect x="{x0:.1f}" y="{y + 8}" width="{x1 - x0:.1f}" height="{row_h - 16}" fill="{color}"'
                        f' fill-opacity="{opacity}">{title_el}</rect>')
    return _svg(width, height, body)


def _svg(width: int, height: int, body: list[str]) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" height="{height}"'
            f' font-family="{_FONT}" role="img" aria-label="timeline">' + "".join(body) + "</svg>")


def render_html(rec: dict[str, Any]) -> str:
    """The record as one self-contained page: the timeline, then the same history as the text."""
    css = (Path(__file__).parent / "templates" / "report.css").read_text()
    hidden = (f'<p class="note">Read as {html.escape(rec["role"] or "")}, which may not see the'
              f' {html.escape(", ".join(rec["hidden_phases"]))} phase(s): they are left out.</p>'
              if rec["hidden_phases"] else "")
    problems = "".join(f'<p class="verdict bad">{html.escape(p["message"])}</p>' for p in rec["problems"])
    text = "\n".join(render_text(rec))
    return (
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>stormlake show {html.escape(rec['partition'])}</title><style>{css}</style></head><body>"
        f"<header><h1>{html.escape(rec['partition'])}</h1><p>Every attempt, call, delivery, operator action and"
        " read the ledger holds of this partition</p></header><main>"
        f"<section><h2>Timeline</h2>{hidden}{problems}{timeline_svg(rec)}</section>"
        f"<section><h2>History</h2><pre class=\"mono\" style=\"white-space: pre-wrap\">{html.escape(text)}</pre></section>"
        "</main></body></html>"
    )
