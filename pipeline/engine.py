"""Where a run's steps run: the executor of the code location's jobs, chosen by ``STORMLAKE_EXECUTOR``.

- ``in_process`` (the default): every step in the run's own process, one after another. A phase
  then reads what the phase before it wrote from the process's partition cache.
- ``multiprocess``: Dagster's multiprocess executor, a process per step on the run's host.
- ``celery``: Dagster's Celery executor (``dagster-celery``). The run's process puts each step
  on the broker (Redis, ``STORMLAKE_BROKER_URL``, also the result backend) and waits for its
  events; Celery workers anywhere take the steps and run them (``celery -A
  pipeline.celery_worker worker``, docs/OPERATIONS.md). A worker shares nothing with the run's
  process but the ledger and Dagster's storage (PostgreSQL over TCP, each with its login), the
  object store, the broker and the installed code: its settings are its own environment's.

A worker lost in the middle of a step: the step's message is acknowledged only when the step
has run (``task_acks_late``), so it stays with the broker. A worker process that dies while its
worker lives hands the message back at once (``task_reject_on_worker_lost``); a worker lost
whole (its host, a SIGKILL of all its processes) leaves it unacknowledged, and the broker hands
it to another worker after ``STORMLAKE_REDELIVER_AFTER`` seconds (Redis's visibility timeout).
The step then starts again on that worker and resumes from the ledger's checkpoints: what the
lost attempt committed is skipped, its Delta writes without a checkpoint are invisible, its
lease died with its connection, and its receipts keep delivery once. The timeout must exceed
the longest step: a step still running past it is handed out a second time (the second waits
for the first's lease, then finds its work done).
"""

from __future__ import annotations

from typing import Any

import dagster as dg

from resources.settings import Settings

BROKER_ENV = "STORMLAKE_BROKER_URL"
#: The queue Dagster's Celery executor puts steps on by default (``dagster-celery/queue`` tag).
QUEUE = "dagster"


def celery_settings(settings: Settings) -> dict[str, Any]:
    """The Celery settings shared by the run's process (which sends steps) and the workers."""
    redeliver = settings.redeliver_after_s
    return {
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,  # a worker holds no step beyond the one it runs
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {
            "visibility_timeout": redeliver,
            # look for steps of lost workers often enough for the timeout (kombu's default sweep is
            # every 10 s x 10 calls)
            "unacked_restore_interval": max(1, min(10, redeliver // 4)),
            "unacked_restore_throttle": 1,
            "max_retries": 3, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5,
        },
        "result_expires": 86_400,
    }


def executor_def(settings: Settings) -> dg.ExecutorDefinition:
    """The executor of every job of the code location (``STORMLAKE_EXECUTOR``)."""
    if settings.executor == "multiprocess":
        return dg.multiprocess_executor
    if settings.executor == "celery":
        from dagster_celery import celery_executor

        # The broker URL is read from the environment by Dagster inside the run (StringSource's
        # ``env``): it is never part of the run's config, the UI or a log.
        return celery_executor.configured({
            "broker": {"env": BROKER_ENV},
            "backend": {"env": BROKER_ENV},
            "config_source": celery_settings(settings),
        }, name="celery")
    return dg.in_process_executor


def worker_app(settings: Settings):  # -> celery.Celery
    """The Celery app of a worker: the broker, queues and routes the executor sends with, and the
    task that runs a step (``dagster_celery.tasks.create_task``)."""
    from dagster_celery.config import DEFAULT_CONFIG, dict_wrapper
    from dagster_celery.make_app import make_app
    from dagster_celery.tasks import create_task

    app = make_app({"broker": settings.broker_url, "backend": settings.broker_url, "include": [],
                    "config_source": dict_wrapper(dict(DEFAULT_CONFIG, **celery_settings(settings)))})
    create_task(app)
    return app
