"""The Celery app that workers of Dagster's Celery executor run: ``celery -A pipeline.celery_worker
worker`` (docs/OPERATIONS.md). Its broker and settings come from the worker's environment
(``STORMLAKE_BROKER_URL`` and the rest, pipeline/engine.py); the code location is loaded here,
once, before Celery forks the processes that run the steps."""

from __future__ import annotations

import pipeline.definitions  # noqa: F401 - loaded once in the worker, inherited by its processes
from pipeline.engine import worker_app
from resources.settings import load_settings

app = worker_app(load_settings())
