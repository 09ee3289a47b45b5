"""Signal quality of a batch: how far its operational picture can be trusted.

Present's grader rates every batch ``high``, ``medium``, ``low`` or ``noisy`` from four measured
shares (:class:`Measures`). Each share is held against the limits of :data:`THRESHOLDS`; the
batch gets the worst grade any share reaches. The limits live here and nowhere else (the README's
"Signal quality" section quotes them).

A ``noisy`` batch is *held*: present writes its tables and commits its checkpoint, but delivers
nothing and the partition stays at tier 3, "held for review", until an operator releases it
(``stormlake release KEY --reason TEXT``) or its inputs change.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

GRADES = ("high", "medium", "low", "noisy")  # best first
HELD_GRADE = "noisy"
#: The tier label of a partition whose present phase held its deliveries (migration 006 says the same).
HELD_LABEL = "held_for_review"


@dataclass(frozen=True)
class Limits:
    """A share above ``medium`` (``low``, ``noisy``) makes the batch at best medium (low, noisy)."""

    medium: float
    low: float
    noisy: float
    what: str

    def grade(self, share: float) -> str:
        for grade, limit in (("noisy", self.noisy), ("low", self.low), ("medium", self.medium)):
            if share > limit:
                return grade
        return "high"

    def limit(self, grade: str) -> float:
        return {"medium": self.medium, "low": self.low, "noisy": self.noisy}[grade]


#: measure -> its limits. Every measure is a share in [0, 1] where more is worse.
THRESHOLDS: dict[str, Limits] = {
    "quarantined_share": Limits(0.01, 0.05, 0.15, "rows of the batch's own landing files (outages, weather) quarantined"),
    "outages_without_weather": Limits(0.02, 0.10, 0.30,
                                      "outages whose nearest station has no reading in their hour"),
    "station_hours_missing": Limits(0.02, 0.10, 0.30,
                                    "station-hours of the day so far (to its last reading) without a reading"),
    "outages_without_feeder": Limits(0.02, 0.05, 0.20, "outages whose cell has no known customers or feeder"),
}


@dataclass(frozen=True)
class Measures:
    """The measured shares a batch's quality is graded on (each in [0, 1], more is worse)."""

    quarantined_share: float
    outages_without_weather: float
    station_hours_missing: float
    outages_without_feeder: float

    @classmethod
    def of(cls, *, rows_read: int, rows_quarantined: int, outages: int, outages_with_reading: int,
           station_hours: int, station_hours_observed: int, outages_without_feeder: int) -> Measures:
        def share(part: int, whole: int) -> float:
            return round(part / whole, 4) if whole else 0.0

        return cls(
            quarantined_share=share(rows_quarantined, rows_read),
            outages_without_weather=share(outages - outages_with_reading, outages),
            # a batch with outages but no weather at all misses every hour of the day
            station_hours_missing=(share(station_hours - station_hours_observed, station_hours) if station_hours
                                   else (1.0 if outages else 0.0)),
            outages_without_feeder=share(outages_without_feeder, outages),
        )


@dataclass(frozen=True)
class Quality:
    grade: str
    measures: Measures
    reasons: tuple[str, ...]  # one line per measure that lowered the grade, worst first

    @property
    def held(self) -> bool:
        return self.grade == HELD_GRADE

    def as_json(self) -> dict:
        return {"grade": self.grade, "measures": asdict(self.measures), "reasons": list(self.reasons)}


def grade_signal(measures: Measures) -> Quality:
    """The batch's grade: the worst any measure reaches, with a reason for each lowering measure."""
    found: list[tuple[int, str]] = []
    for name, limits in THRESHOLDS.items():
        share = getattr(measures, name)
        g = limits.grade(share)
        if g != "high":
            found.append((GRADES.index(g), f"{name} {share:.1%} > {limits.limit(g):.0%} ({limits.what}): {g}"))
    found.sort(key=lambda f: -f[0])
    worst = GRADES[found[0][0]] if found else "high"
    return Quality(worst, measures, tuple(reason for _, reason in found))
