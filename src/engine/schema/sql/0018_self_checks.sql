-- Self-checks (issue #11, ADR 0015): one row per transform for its latest check, so asking
-- again while one is unfinished returns it, and the next call after it finished replaces it
-- (the replaced job is gone: selfCheckJob returns null for it, as for a dropped transform,
-- whose row goes with it). The job itself runs on pg-boss, in the instance's jobs schema
-- (ADR 0014); its id is this row's id. What a row says is reconciled with pg-boss's own
-- state of the job when it is read (a worker that died mid-check leaves `running` here,
-- while pg-boss retries the job or gives up on it): see src/engine/selfcheck/read.ts.
CREATE TABLE @schema@.self_checks (
  id uuid PRIMARY KEY,
  transform_id int NOT NULL UNIQUE REFERENCES @schema@.transforms ON DELETE CASCADE,
  mode text NOT NULL CHECK (mode IN ('full', 'sample')),
  -- {sample, maxFindings, repair}: what was asked for.
  options jsonb NOT NULL,
  -- What the worker last recorded; queued until a worker takes it.
  state text NOT NULL DEFAULT 'queued'
    CHECK (state IN ('queued', 'running', 'done', 'failed', 'cancelled')),
  rows_compared bigint NOT NULL DEFAULT 0,
  -- Rows the check expects to compare (the target's row estimate, or the sample size).
  rows_total bigint,
  report jsonb,
  error text,
  -- How many times a worker has started it (pg-boss retries a check whose worker died).
  attempts int NOT NULL DEFAULT 0,
  created_at timestamptz NOT NULL DEFAULT now(),
  started_at timestamptz,
  finished_at timestamptz
);
