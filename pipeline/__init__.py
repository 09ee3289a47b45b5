"""Top floor: the processes (CLI, Dagster code location, schedules, sensors) and the tools
around them (:mod:`pipeline.tools`)."""
