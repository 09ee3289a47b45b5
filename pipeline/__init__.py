"""Top floor: the processes (CLI, Dagster code location, schedules, sensors, benchmark).

Every process that imports this package runs phases, or may: the allocator settings of
:mod:`resources.memory` are applied here, once, before the first phase allocates.
"""

from resources.memory import keep_freed_memory

keep_freed_memory()
