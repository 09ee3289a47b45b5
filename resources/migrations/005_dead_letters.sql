-- Dead letters and operator actions.
--
-- 1. checkpoints.failures: how many attempts of this checkpoint (one partition, phase and input
--    hash) failed for a reason that would fail again (bad input, a failed grader, a code error).
--    A transient failure (the ledger or a delivery target unreachable) does not count. At the
--    dead-letter limit (STORMLAKE_DEAD_LETTER_AFTER, 3 by default) the phase is no longer tried
--    for those inputs until an operator releases it; a change of its inputs, code or schema
--    version is a new input hash, a new checkpoint, and starts from 0.
-- 2. operator_actions: every action an operator takes on the ledger (a release, a forced
--    re-run), with who, when and why.

ALTER TABLE checkpoints ADD COLUMN failures integer NOT NULL DEFAULT 0 CHECK (failures >= 0);

CREATE TABLE operator_actions (
    action_id     bigserial PRIMARY KEY,
    at            timestamptz NOT NULL DEFAULT now(),
    action        text NOT NULL CHECK (action IN ('release', 'force')),
    partition_key text NOT NULL,
    phase         text,
    actor         text NOT NULL CHECK (actor <> ''),
    reason        text NOT NULL CHECK (reason <> ''),
    detail        jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX operator_actions_partition ON operator_actions (partition_key, at);
