"""The ledger's view of every partition (contract section 8), as JSON or a readable table."""

from __future__ import annotations

from typing import Any

from assets.phases import PHASES, TIER_LABELS
from resources.ledger import Checkpoint, Ledger, Receipt


def _tier(heads: dict[str, Checkpoint]) -> int:
    """Highest phase reached: every phase up to it COMPLETED on its upstream's current state."""
    tier = 0
    for phase in PHASES:
        cp = heads.get(phase.name)
        if cp is None or cp.status != "COMPLETED":
            break
        upstream = (cp.summary or {}).get("upstream", {})
        if any(heads.get(name) is None or heads[name].state_hash != h for name, h in upstream.items()):
            break  # computed from an upstream state that has since been replaced
        tier = phase.tier
    return tier


def partition_status(ledger: Ledger) -> list[dict[str, Any]]:
    by_key: dict[str, dict[str, Checkpoint]] = {}
    for cp in ledger.heads():
        by_key.setdefault(cp.partition_key, {})[cp.phase] = cp
    receipts: dict[str, list[Receipt]] = {}
    for r in ledger.receipts():
        receipts.setdefault(r.partition_key, []).append(r)
    out = []
    for key in sorted(by_key, key=lambda k: (k.split("|")[0], k.split("|")[-1])):
        heads = by_key[key]
        any_cp = next(iter(heads.values()))
        tier = _tier(heads)
        phases: dict[str, Any] = {}
        for phase in PHASES:
            cp = heads.get(phase.name)
            if cp is None:
                continue
            entry: dict[str, Any] = {
                "status": cp.status,
                "seq": cp.seq,
                "attempts": cp.attempt,
                "input_hash": cp.input_hash,
                "state_hash": cp.state_hash,
                "schema_version": cp.schema_version,
                "delta_versions": (cp.summary or {}).get("delta_versions", {}),
            }
            if cp.status == "FAILED":
                entry["error"] = f"{cp.error_class}: {cp.error_message}"
            phases[phase.name] = entry
        out.append({
            "region": any_cp.region_id,
            "day": any_cp.day,
            "tier": tier,
            "tier_label": TIER_LABELS[tier],
            "phases": phases,
            "deliveries": [
                {"artifact_id": r.artifact_id, "target": r.target, "status": r.status,
                 "content_hash": r.content_hash, **({"supersedes": r.supersedes} if r.supersedes else {})}
                for r in receipts.get(key, [])
            ],
        })
    return out


def render_table(partitions: list[dict[str, Any]]) -> str:
    if not partitions:
        return "no partitions in the ledger yet (run `stormlake demo` or `stormlake backfill`)"
    head = f"{'day':<10}  {'region':<16} {'tier':<14} " + " ".join(f"{p.name:<11}" for p in PHASES) + " delivered"
    lines = [head, "-" * len(head)]
    for p in partitions:
        cells = []
        for phase in PHASES:
            e = p["phases"].get(phase.name)
            if e is None:
                cells.append(f"{'-':<11}")
            else:
                short = {"COMPLETED": "ok", "FAILED": "FAILED", "PENDING": "pending"}[e["status"]]
                cells.append(f"{short + (' x' + str(e['attempts']) if e['attempts'] > 1 else ''):<11}")
        delivered = sum(d["status"] == "DELIVERED" for d in p["deliveries"])
        pending = sum(d["status"] == "PENDING" for d in p["deliveries"])
        lines.append(f"{p['day']:<10}  {p['region']:<16} {str(p['tier']) + ' ' + p['tier_label']:<14} "
                     + " ".join(cells) + f" {delivered}" + (f" (+{pending} pending)" if pending else ""))
    tiers = [p["tier"] for p in partitions]
    lines.append(f"{len(partitions)} partitions; {sum(t == 4 for t in tiers)} published")
    return "\n".join(lines)
