"""The phases' transforms: pure pandas/pyarrow, tested without Dagster; one module per phase, named
after it (``assets.transforms.<phase>``), which the phase's step imports before its first claim."""
