"""Signal quality and held batches, as an operator meets them on the command line.

A generated scenario with planted noisy partitions (``stormlake generate --noisy``): exactly those
are graded noisy and held (tables written, nothing delivered, tier 3 "held for review"); a release
delivers a held batch once, recorded with who and why; a rerun delivers nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.test_cli import base_env, status_json, stormlake

pytestmark = pytest.mark.e2e


def _published(home: Path) -> dict[str, list[str]]:
    """Partition key -> the artifact files published for it."""
    out: dict[str, list[str]] = {}
    for f in sorted((home / "published").glob("*/*/*")):
        out.setdefault(f"{f.parent.name}|{f.parent.parent.name}", []).append(f.name)
    return out


def test_noisy_batches_are_held_until_released_and_delivered_once(tmp_path: Path, pg_dsn: str) -> None:
    home = tmp_path / "home"
    env = base_env(home, STORMLAKE_PG_DSN=pg_dsn, STORMLAKE_OPERATOR="ops-on-call")
    gen = stormlake("generate", "--regions", "3", "--days", "3", "--rows-per-partition", "400", "--noisy", "0.3",
                    env=env, cwd=tmp_path)
    assert gen.returncode == 0, gen.stderr
    truth = json.loads((home / "landing" / "_truth" / "scenario.json").read_text())
    noisy = {f"{k.split('/')[1]}|{k.split('/')[0]}" for k in truth["noisy"]}
    assert 0 < len(noisy) < 9, "the seed plants some noisy partitions, not all"

    run = stormlake("backfill", env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert f"{(9 - len(noisy)) * 3} artifact deliveries" in run.stdout, run.stdout
    parts = {f"{p['day']}|{p['region']}": p for p in status_json(env, tmp_path)["partitions"]}
    held = {k for k, p in parts.items() if p["held"]}
    assert held == noisy
    for key, p in parts.items():
        if key in noisy:
            assert (p["tier"], p["tier_label"], p["signal_quality"]) == (3, "held_for_review", "noisy")
            assert p["phases"]["present"]["status"] == "COMPLETED" and p["phases"]["present"]["held"] is True
            assert p["deliveries"] == []
        else:
            assert (p["tier"], p["tier_label"]) == (4, "published") and p["signal_quality"] != "noisy"
    assert set(_published(home)) == set(parts) - noisy

    review = stormlake("review", env=env, cwd=tmp_path)
    assert review.returncode == 0 and f"{len(noisy)} held for review" in review.stdout, review.stdout
    for key in noisy:
        assert f"stormlake release {key} --reason TEXT" in review.stdout
    table = stormlake("status", env=env, cwd=tmp_path)
    assert f"{len(noisy)} held for review" in table.stdout, table.stdout

    # A release needs a reason; with one, it delivers the held batch, once.
    key = sorted(noisy)[0]
    no_reason = stormlake("release", key, "--reason", " ", env=env, cwd=tmp_path)
    assert no_reason.returncode == 2 and "--reason" in no_reason.stderr
    released = stormlake("release", key, "--reason", "stations down, outages checked by hand", env=env, cwd=tmp_path)
    assert released.returncode == 0, released.stderr
    assert f"released {key}: present delivered 3 artifacts" in released.stdout, released.stdout
    assert sorted(_published(home)[key]) == ["clusters.geojson", "report.html", "summary.json"]
    after = {f"{p['day']}|{p['region']}": p for p in status_json(env, tmp_path)["partitions"]}
    assert (after[key]["tier"], after[key]["held"], after[key]["signal_quality"]) == (4, False, "noisy")
    assert [d["status"] for d in after[key]["deliveries"]] == ["DELIVERED"] * 3

    # Released once: a second release and a rerun deliver nothing; the other held batches stay held.
    again = stormlake("release", key, "--reason", "twice", env=env, cwd=tmp_path)
    assert again.returncode == 0 and "no dead-lettered, failed or held phase" in again.stdout, again.stdout
    rerun = stormlake("backfill", env=env, cwd=tmp_path)
    assert rerun.returncode == 0 and "0 phases computed, 0 artifact deliveries" in rerun.stdout, rerun.stdout
    final = {f"{p['day']}|{p['region']}": p for p in status_json(env, tmp_path)["partitions"]}
    assert {k for k, p in final.items() if p["held"]} == noisy - {key}
    assert len(final[key]["deliveries"]) == 3
    # Read as the compliance auditor: present only, said on stderr, every read in the access log.
    audit = stormlake("status", "--json", "--role", "compliance_auditor", env=env, cwd=tmp_path)
    assert audit.returncode == 0, audit.stderr
    assert "may not see the ingest, enrich, correlate phases" in audit.stderr, audit.stderr
    assert all(set(p["phases"]) == {"present"} for p in json.loads(audit.stdout)["partitions"])
    log = stormlake("access", "log", "--role", "compliance_auditor", "--since", "1h", env=env, cwd=tmp_path)
    assert log.returncode == 0, log.stderr
    lines = log.stdout.splitlines()
    assert "logged reads by compliance_auditor since 1h" in lines[0], lines[0]
    assert any(" ingest " in ln and ln.endswith("DENIED") for ln in lines[1:]), lines
    assert any(" present " in ln and ln.endswith("allowed") for ln in lines[1:]), lines
    from psycopg import connect

    with connect(pg_dsn) as conn:
        actions = conn.execute("SELECT action, partition_key, phase, actor, reason FROM operator_actions"
                               " ORDER BY action_id").fetchall()
    assert actions[0] == ("release", key, "present", "ops-on-call", "stations down, outages checked by hand")
