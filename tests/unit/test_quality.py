"""The signal-quality grade: each measure against its limits, the worst wins, reasons name them."""

from __future__ import annotations

import pytest

from assets.quality import GRADES, THRESHOLDS, Measures, grade_signal

CLEAN = dict(rows_read=1000, rows_quarantined=2, outages=500, outages_with_reading=500, station_hours=600,
             station_hours_observed=600, outages_without_feeder=0)


def test_a_clean_batch_is_high_with_no_reasons() -> None:
    q = grade_signal(Measures.of(**CLEAN))
    assert (q.grade, q.reasons, q.held) == ("high", (), False)
    assert q.as_json()["measures"]["quarantined_share"] == 0.002


@pytest.mark.parametrize("measure", sorted(THRESHOLDS))
@pytest.mark.parametrize("grade", GRADES[1:])
def test_each_measure_alone_lowers_the_grade_just_past_its_limit(measure: str, grade: str) -> None:
    limits = THRESHOLDS[measure]
    at = {"quarantined_share": 0.0, "outages_without_weather": 0.0, "station_hours_missing": 0.0,
          "outages_without_feeder": 0.0}
    at[measure] = limits.limit(grade)
    assert grade_signal(Measures(**at)).grade == GRADES[GRADES.index(grade) - 1], "the limit itself is allowed"
    at[measure] = limits.limit(grade) + 0.0001
    q = grade_signal(Measures(**at))
    assert q.grade == grade and len(q.reasons) == 1 and q.reasons[0].startswith(measure)
    assert q.held == (grade == "noisy")


def test_the_worst_measure_wins_and_comes_first() -> None:
    m = Measures.of(**{**CLEAN, "rows_quarantined": 30, "station_hours_observed": 300})
    q = grade_signal(m)
    assert q.grade == "noisy"
    assert q.reasons[0].startswith("station_hours_missing 50.0% > 30%")
    assert q.reasons[1].startswith("quarantined_share 3.0% > 1%")


def test_a_batch_with_outages_and_no_weather_misses_every_hour() -> None:
    m = Measures.of(**{**CLEAN, "station_hours": 0, "station_hours_observed": 0, "outages_with_reading": 0})
    assert (m.station_hours_missing, m.outages_without_weather) == (1.0, 1.0)
    empty = Measures.of(rows_read=0, rows_quarantined=0, outages=0, outages_with_reading=0, station_hours=0,
                        station_hours_observed=0, outages_without_feeder=0)
    assert grade_signal(empty).grade == "high"
