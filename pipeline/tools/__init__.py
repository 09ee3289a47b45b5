"""Tools around the pipeline, not part of it: the scenario generator (landing files for demos,
tests and the bench) and the benchmark. Nothing under ``assets/`` or ``resources/`` imports them."""
