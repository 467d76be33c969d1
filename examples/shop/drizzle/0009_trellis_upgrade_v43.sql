-- Written by `trellis generate upgrade` (trellis-pg 0.2.0).
-- trellis-pg: upgrade the Trellis catalog schema "trellis" from version 36 to version 43.
-- Only the migrations after version 36, each version-guarded and locked: safe to run again,
-- and beside Trellis.migrate(). A database below version 36 is refused with what to run.
DO $trellis_upgrade$
DECLARE
  newer int;
  boss_version int;
  installed int := 0;
BEGIN
  PERFORM pg_advisory_xact_lock(1953654124, hashtext('trellis'));
  IF to_regclass('"trellis".migrations') IS NOT NULL THEN
    SELECT coalesce(max(version), 0) INTO installed FROM "trellis".migrations;
  END IF;
  IF installed < 36 THEN
    RAISE EXCEPTION 'the Trellis schema % is at version %, and this migration upgrades it from version 36 to 43', 'trellis', installed
      USING ERRCODE = 'TRI01',
            HINT = 'run the migrations that bring it to version 36 first, or the whole install SQL instead (trellis sql install prints it; Trellis.migrate() runs it)';
  END IF;
  SELECT max(version) INTO newer FROM "trellis".migrations WHERE version > 43 AND breaking;
  IF newer IS NOT NULL THEN
    RAISE EXCEPTION 'the Trellis schema % is at breaking version %, newer than this trellis-pg knows (43): upgrade trellis-pg',
      'trellis', newer USING ERRCODE = 'TRI01';
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 37) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (37, 'placeholder', false);
    EXECUTE $trellis_m37$-- Placeholder for another helper's migration 0037 (the lead removes it at merge).
$trellis_m37$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 38) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (38, 'placeholder', false);
    EXECUTE $trellis_m38$-- Placeholder for another helper's migration 0038 (the lead removes it at merge).
$trellis_m38$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 39) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (39, 'placeholder', false);
    EXECUTE $trellis_m39$-- Placeholder for another helper's migration 0039 (the lead removes it at merge).
$trellis_m39$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 40) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (40, 'placeholder', false);
    EXECUTE $trellis_m40$-- Placeholder for another helper's migration 0040 (the lead removes it at merge).
$trellis_m40$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 41) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (41, 'placeholder', false);
    EXECUTE $trellis_m41$-- Placeholder for another helper's migration 0041 (the lead removes it at merge).
$trellis_m41$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 42) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (42, 'placeholder', false);
    EXECUTE $trellis_m42$-- Placeholder for another helper's migration 0042 (the lead removes it at merge).
$trellis_m42$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 43) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (43, 'quiet_samples', false);
    EXECUTE $trellis_m43$-- Samples only when something changed (ADR 0063).
--
-- The staging worker sampled every transform every ten seconds (0034), so an idle instance
-- wrote a row per transform every ten seconds, against I8 (idle transforms cost next to
-- nothing). A sample is now written only when the transform's lag (in segments), its
-- changed keys applied or its build's keys done differ from its latest sample. When a
-- change comes after such a quiet stretch, the pass before it (which found nothing
-- changed) is written first, as a copy of the latest sample at that pass's time: the
-- charts then show the quiet stretch as it was, flat, and the change from where it began,
-- not a slope across the stretch. The latest sample of each transform is kept past the
-- hour (history() reads the last hour only), so that a quiet instance writes nothing to
-- find out whether it changed.
--
-- Hidden parts (0036) and the shadows of redefinitions being built (0035) are left out:
-- they are not transforms an operator sees, and their keys are counted by their own.

DELETE FROM "trellis".samples s
 USING "trellis".transforms t
 WHERE t.id = s.transform_id AND (t.part_of IS NOT NULL OR t.redefines IS NOT NULL);

-- The transforms whose lag (segments), changed keys applied or build's keys done differ
-- from their latest sample (or that have none) at `p_at`: their values now and their
-- latest sample's. Hidden parts and shadows of redefinitions left out.
CREATE FUNCTION "trellis"._sample_changes(p_at timestamptz)
RETURNS TABLE (transform_id int, lag_seconds float8, lag_segments bigint, keys bigint,
               backfill_done bigint, last_at timestamptz, last_lag_seconds float8,
               last_lag_segments bigint, last_keys bigint, last_backfill_done bigint)
LANGUAGE sql STABLE AS $fn$
  SELECT c.id, c.lag_seconds, c.lag_segments, c.keys, c.backfill_done,
         l.at, l.lag_seconds, l.lag_segments, l.keys, l.backfill_done
    FROM (SELECT t.id, coalesce(w.seconds, 0) AS lag_seconds, coalesce(w.segments, 0) AS lag_segments,
                 coalesce(d.keys, 0) AS keys, "trellis"._keys_built(p) AS backfill_done
            FROM "trellis".transforms t
            JOIN "trellis".pipeline p ON p.transform_id = t.id
            LEFT JOIN "trellis".drain_time d ON d.transform_id = t.id
            LEFT JOIN LATERAL (
              SELECT count(*) AS segments,
                     extract(epoch FROM p_at - min(k.at))::float8 AS seconds
                FROM "trellis".ticks k WHERE k.seq > p.cursor_tick) w ON p.cursor_tick IS NOT NULL
           WHERE t.part_of IS NULL AND t.redefines IS NULL) c
    LEFT JOIN LATERAL (
      SELECT s.* FROM "trellis".samples s WHERE s.transform_id = c.id ORDER BY s.at DESC LIMIT 1) l ON true
   WHERE l.transform_id IS NULL
      OR c.lag_segments <> l.lag_segments OR c.keys <> l.keys
      OR c.backfill_done IS DISTINCT FROM l.backfill_done
$fn$;

-- Takes a sample of every transform that changed since its latest, and forgets samples
-- older than an hour but each transform's latest. `p_last_pass` is the `at` the previous
-- call of this election returned (null at first): the time as of which every transform
-- not sampled then was as its latest sample says. Returns how many samples it wrote and
-- the time of this pass. With nothing changed and nothing turning an hour old it only
-- reads (no transaction id, no WAL).
CREATE FUNCTION "trellis"._sample(p_last_pass timestamptz, OUT written int, OUT at timestamptz)
LANGUAGE plpgsql AS $fn$
DECLARE
  carried int;
BEGIN
  at := clock_timestamp();
  written := 0;
  -- Deletes nothing (and so writes nothing) unless a sample has just turned an hour old.
  DELETE FROM "trellis".samples s
   WHERE s.at < _sample.at - interval '1 hour'
     AND EXISTS (SELECT 1 FROM "trellis".samples n WHERE n.transform_id = s.transform_id AND n.at > s.at);
  IF NOT EXISTS (SELECT 1 FROM "trellis"._sample_changes(at)) THEN
    RETURN;
  END IF;
  -- The quiet stretch, as the previous pass found it: the latest sample, at that pass.
  INSERT INTO "trellis".samples (transform_id, at, lag_seconds, lag_segments, keys, backfill_done)
  SELECT x.transform_id, p_last_pass,
         x.last_lag_seconds + CASE WHEN x.last_lag_segments > 0
                                   THEN extract(epoch FROM p_last_pass - x.last_at) ELSE 0 END,
         x.last_lag_segments, x.last_keys, x.last_backfill_done
    FROM "trellis"._sample_changes(at) x
   WHERE p_last_pass IS NOT NULL AND x.last_at IS NOT NULL AND p_last_pass > x.last_at
     AND p_last_pass < _sample.at
  ON CONFLICT DO NOTHING;
  GET DIAGNOSTICS carried = ROW_COUNT;
  -- Read again: the copies above are older than the samples they copy, not newer.
  INSERT INTO "trellis".samples (transform_id, at, lag_seconds, lag_segments, keys, backfill_done)
  SELECT x.transform_id, _sample.at, x.lag_seconds, x.lag_segments, x.keys, x.backfill_done
    FROM "trellis"._sample_changes(at) x
  ON CONFLICT DO NOTHING;
  GET DIAGNOSTICS written = ROW_COUNT;
  written := written + carried;
END
$fn$;

-- The 0034 form, for a process of the previous version: the same, with no previous pass.
CREATE OR REPLACE FUNCTION "trellis"._sample()
RETURNS int LANGUAGE sql AS $fn$
  SELECT written FROM "trellis"._sample(NULL::timestamptz)
$fn$;
$trellis_m43$;
  END IF;
  -- Postgres lets PUBLIC execute a new function: none of Trellis's is (ADR 0034), whichever
  -- migration made it. Only the owner calls them.
  REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "trellis" FROM PUBLIC;
  INSERT INTO "trellis".config (target_schema) VALUES ('public')
    ON CONFLICT DO NOTHING;

  -- Background jobs (self-checks) run on pg-boss, in the schema trellis_jobs at pg-boss's
  -- schema version 24 (ADR 0014).
  IF to_regclass('trellis_jobs.migrations') IS NOT NULL THEN
    RAISE EXCEPTION 'schema trellis_jobs, where Trellis instance trellis keeps its jobs, holds another Trellis instance''s catalog: choose another catalog schema'
      USING ERRCODE = 'TRC01';
  END IF;
  IF to_regclass('trellis_jobs.version') IS NULL THEN
    EXECUTE $trellis_boss$
    SELECT pg_advisory_xact_lock(
      ('x' || encode(sha224((current_database() || '.pgboss.trellis_jobs')::bytea), 'hex'))::bit(64)::bigint
  );
    
    CREATE SCHEMA IF NOT EXISTS trellis_jobs
  ;

    CREATE TYPE trellis_jobs.job_state AS ENUM (
      'created',
      'retry',
      'active',
      'completed',
      'cancelled',
      'failed'
    )
  ;

    CREATE TABLE trellis_jobs.version (
      version int primary key,
      maintained_on timestamp with time zone,
      cron_on timestamp with time zone,
      monitored_on timestamp with time zone
    )
  ;

    CREATE TABLE trellis_jobs.queue (
      name text,
      policy text,
      retry_limit int,
      retry_delay int,
      retry_backoff bool,
      expire_seconds int,
      retention_minutes int,
      dead_letter text REFERENCES trellis_jobs.queue (name),
      partition_name text,
      created_on timestamp with time zone not null default now(),
      updated_on timestamp with time zone not null default now(),
      PRIMARY KEY (name)
    )
  ;

    CREATE TABLE trellis_jobs.schedule (
      name text REFERENCES trellis_jobs.queue ON DELETE CASCADE,
      cron text not null,
      timezone text,
      data jsonb,
      options jsonb,
      created_on timestamp with time zone not null default now(),
      updated_on timestamp with time zone not null default now(),
      PRIMARY KEY (name)
    )
  ;

    CREATE TABLE trellis_jobs.subscription (
      event text not null,
      name text not null REFERENCES trellis_jobs.queue ON DELETE CASCADE,
      created_on timestamp with time zone not null default now(),
      updated_on timestamp with time zone not null default now(),
      PRIMARY KEY(event, name)
    )
  ;

    CREATE TABLE trellis_jobs.job (
      id uuid not null default gen_random_uuid(),
      name text not null,
      priority integer not null default(0),
      data jsonb,
      state trellis_jobs.job_state not null default('created'),
      retry_limit integer not null default(2),
      retry_count integer not null default(0),
      retry_delay integer not null default(0),
      retry_backoff boolean not null default false,
      start_after timestamp with time zone not null default now(),
      started_on timestamp with time zone,
      singleton_key text,
      singleton_on timestamp without time zone,
      expire_in interval not null default interval '15 minutes',
      created_on timestamp with time zone not null default now(),
      completed_on timestamp with time zone,
      keep_until timestamp with time zone NOT NULL default now() + interval '14 days',
      output jsonb,
      dead_letter text,
      policy text
    ) PARTITION BY LIST (name)
  ;
ALTER TABLE trellis_jobs.job ADD PRIMARY KEY (name, id);
CREATE TABLE trellis_jobs.archive (LIKE trellis_jobs.job);
ALTER TABLE trellis_jobs.archive ADD PRIMARY KEY (name, id);
ALTER TABLE trellis_jobs.archive ADD archived_on timestamptz NOT NULL DEFAULT now();
CREATE INDEX archive_i1 ON trellis_jobs.archive(archived_on);

    CREATE FUNCTION trellis_jobs.create_queue(queue_name text, options json)
    RETURNS VOID AS
    $$
    DECLARE
      table_name varchar := 'j' || encode(sha224(queue_name::bytea), 'hex');
      queue_created_on timestamptz;
    BEGIN

      WITH q as (
      INSERT INTO trellis_jobs.queue (
        name,
        policy,
        retry_limit,
        retry_delay,
        retry_backoff,
        expire_seconds,
        retention_minutes,
        dead_letter,
        partition_name
      )
      VALUES (
        queue_name,
        options->>'policy',
        (options->>'retryLimit')::int,
        (options->>'retryDelay')::int,
        (options->>'retryBackoff')::bool,
        (options->>'expireInSeconds')::int,
        (options->>'retentionMinutes')::int,
        options->>'deadLetter',
        table_name
      )
      ON CONFLICT DO NOTHING
      RETURNING created_on
      )
      SELECT created_on into queue_created_on from q;

      IF queue_created_on IS NULL THEN
        RETURN;
      END IF;

      EXECUTE format('CREATE TABLE trellis_jobs.%I (LIKE trellis_jobs.job INCLUDING DEFAULTS)', table_name);

      EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD PRIMARY KEY (name, id)', table_name);
      EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT q_fkey FOREIGN KEY (name) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
      EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT dlq_fkey FOREIGN KEY (dead_letter) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
      EXECUTE format('CREATE UNIQUE INDEX %1$s_i1 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''created'' AND policy = ''short''', table_name);
      EXECUTE format('CREATE UNIQUE INDEX %1$s_i2 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''active'' AND policy = ''singleton''', table_name);
      EXECUTE format('CREATE UNIQUE INDEX %1$s_i3 ON trellis_jobs.%1$I (name, state, COALESCE(singleton_key, '''')) WHERE state <= ''active'' AND policy = ''stately''', table_name);
      EXECUTE format('CREATE UNIQUE INDEX %1$s_i4 ON trellis_jobs.%1$I (name, singleton_on, COALESCE(singleton_key, '''')) WHERE state <> ''cancelled'' AND singleton_on IS NOT NULL', table_name);
      EXECUTE format('CREATE INDEX %1$s_i5 ON trellis_jobs.%1$I (name, start_after) INCLUDE (priority, created_on, id) WHERE state < ''active''', table_name);

      EXECUTE format('ALTER TABLE trellis_jobs.%I ADD CONSTRAINT cjc CHECK (name=%L)', table_name, queue_name);
      EXECUTE format('ALTER TABLE trellis_jobs.job ATTACH PARTITION trellis_jobs.%I FOR VALUES IN (%L)', table_name, queue_name);
    END;
    $$
    LANGUAGE plpgsql;
  ;

    CREATE FUNCTION trellis_jobs.delete_queue(queue_name text)
    RETURNS VOID AS
    $$
    DECLARE
      table_name varchar;
    BEGIN
      WITH deleted as (
        DELETE FROM trellis_jobs.queue
        WHERE name = queue_name
        RETURNING partition_name
      )
      SELECT partition_name from deleted INTO table_name;

      EXECUTE format('DROP TABLE IF EXISTS trellis_jobs.%I', table_name);
    END;
    $$
    LANGUAGE plpgsql;
  ;
INSERT INTO trellis_jobs.version(version) VALUES ('24');
    $trellis_boss$;
  ELSE
    SELECT version INTO boss_version FROM trellis_jobs.version;
    IF boss_version >= 24 THEN
      NULL; -- up to date, or installed by a newer trellis-pg
  ELSIF boss_version = 23 THEN
    EXECUTE $trellis_boss_23$
    SELECT pg_advisory_xact_lock(
      ('x' || encode(sha224((current_database() || '.pgboss.trellis_jobs')::bytea), 'hex'))::bit(64)::bigint
  );
    SELECT version::int/(version::int-24) from trellis_jobs.version;

        CREATE OR REPLACE FUNCTION trellis_jobs.create_queue(queue_name text, options json)
        RETURNS VOID AS
        $$
        DECLARE
          table_name varchar := 'j' || encode(sha224(queue_name::bytea), 'hex');
          queue_created_on timestamptz;
        BEGIN

          WITH q as (
            INSERT INTO trellis_jobs.queue (
              name,
              policy,
              retry_limit,
              retry_delay,
              retry_backoff,
              expire_seconds,
              retention_minutes,
              dead_letter,
              partition_name
            )
            VALUES (
              queue_name,
              options->>'policy',
              (options->>'retryLimit')::int,
              (options->>'retryDelay')::int,
              (options->>'retryBackoff')::bool,
              (options->>'expireInSeconds')::int,
              (options->>'retentionMinutes')::int,
              options->>'deadLetter',
              table_name
            )
            ON CONFLICT DO NOTHING
            RETURNING created_on
          )
          SELECT created_on into queue_created_on from q;

          IF queue_created_on IS NULL THEN
            RETURN;
          END IF;

          EXECUTE format('CREATE TABLE trellis_jobs.%I (LIKE trellis_jobs.job INCLUDING DEFAULTS)', table_name);
          
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD PRIMARY KEY (name, id)', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT q_fkey FOREIGN KEY (name) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT dlq_fkey FOREIGN KEY (dead_letter) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i1 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''created'' AND policy = ''short''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i2 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''active'' AND policy = ''singleton''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i3 ON trellis_jobs.%1$I (name, state, COALESCE(singleton_key, '''')) WHERE state <= ''active'' AND policy = ''stately''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i4 ON trellis_jobs.%1$I (name, singleton_on, COALESCE(singleton_key, '''')) WHERE state <> ''cancelled'' AND singleton_on IS NOT NULL', table_name);
          EXECUTE format('CREATE INDEX %1$s_i5 ON trellis_jobs.%1$I (name, start_after) INCLUDE (priority, created_on, id) WHERE state < ''active''', table_name);

          EXECUTE format('ALTER TABLE trellis_jobs.%I ADD CONSTRAINT cjc CHECK (name=%L)', table_name, queue_name);
          EXECUTE format('ALTER TABLE trellis_jobs.job ATTACH PARTITION trellis_jobs.%I FOR VALUES IN (%L)', table_name, queue_name);
        END;
        $$
        LANGUAGE plpgsql
        ;
UPDATE trellis_jobs.version SET version = '24';
    $trellis_boss_23$;
  ELSIF boss_version = 22 THEN
    EXECUTE $trellis_boss_22$
    SELECT pg_advisory_xact_lock(
      ('x' || encode(sha224((current_database() || '.pgboss.trellis_jobs')::bytea), 'hex'))::bit(64)::bigint
  );
    SELECT version::int/(version::int-24) from trellis_jobs.version;
ALTER TABLE trellis_jobs.job ADD PRIMARY KEY (name, id);

        CREATE OR REPLACE FUNCTION trellis_jobs.create_queue(queue_name text, options json)
        RETURNS VOID AS
        $$
        DECLARE
          table_name varchar := 'j' || encode(sha224(queue_name::bytea), 'hex');
          queue_created_on timestamptz;
        BEGIN

          WITH q as (
            INSERT INTO trellis_jobs.queue (
              name,
              policy,
              retry_limit,
              retry_delay,
              retry_backoff,
              expire_seconds,
              retention_minutes,
              dead_letter,
              partition_name
            )
            VALUES (
              queue_name,
              options->>'policy',
              (options->>'retryLimit')::int,
              (options->>'retryDelay')::int,
              (options->>'retryBackoff')::bool,
              (options->>'expireInSeconds')::int,
              (options->>'retentionMinutes')::int,
              options->>'deadLetter',
              table_name
            )
            ON CONFLICT DO NOTHING
            RETURNING created_on
          )
          SELECT created_on into queue_created_on from q;

          IF queue_created_on IS NULL THEN
            RETURN;
          END IF;

          EXECUTE format('CREATE TABLE trellis_jobs.%I (LIKE trellis_jobs.job INCLUDING DEFAULTS)', table_name);
          
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD PRIMARY KEY (name, id)', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT q_fkey FOREIGN KEY (name) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT dlq_fkey FOREIGN KEY (dead_letter) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i1 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''created'' AND policy = ''short''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i2 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''active'' AND policy = ''singleton''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i3 ON trellis_jobs.%1$I (name, state, COALESCE(singleton_key, '''')) WHERE state <= ''active'' AND policy = ''stately''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i4 ON trellis_jobs.%1$I (name, singleton_on, COALESCE(singleton_key, '''')) WHERE state <> ''cancelled'' AND singleton_on IS NOT NULL', table_name);
          EXECUTE format('CREATE INDEX %1$s_i5 ON trellis_jobs.%1$I (name, start_after) INCLUDE (priority, created_on, id) WHERE state < ''active''', table_name);

          EXECUTE format('ALTER TABLE trellis_jobs.%I ADD CONSTRAINT cjc CHECK (name=%L)', table_name, queue_name);
          EXECUTE format('ALTER TABLE trellis_jobs.job ATTACH PARTITION trellis_jobs.%I FOR VALUES IN (%L)', table_name, queue_name);
        END;
        $$
        LANGUAGE plpgsql
        ;
UPDATE trellis_jobs.version SET version = '24';
    $trellis_boss_22$;
  ELSIF boss_version = 21 THEN
    EXECUTE $trellis_boss_21$
    SELECT pg_advisory_xact_lock(
      ('x' || encode(sha224((current_database() || '.pgboss.trellis_jobs')::bytea), 'hex'))::bit(64)::bigint
  );
    SELECT version::int/(version::int-24) from trellis_jobs.version;
ALTER TABLE trellis_jobs.job ALTER COLUMN retry_limit SET DEFAULT 2;
ALTER TABLE trellis_jobs.job ADD PRIMARY KEY (name, id);

        CREATE OR REPLACE FUNCTION trellis_jobs.create_queue(queue_name text, options json)
        RETURNS VOID AS
        $$
        DECLARE
          table_name varchar := 'j' || encode(sha224(queue_name::bytea), 'hex');
          queue_created_on timestamptz;
        BEGIN

          WITH q as (
            INSERT INTO trellis_jobs.queue (
              name,
              policy,
              retry_limit,
              retry_delay,
              retry_backoff,
              expire_seconds,
              retention_minutes,
              dead_letter,
              partition_name
            )
            VALUES (
              queue_name,
              options->>'policy',
              (options->>'retryLimit')::int,
              (options->>'retryDelay')::int,
              (options->>'retryBackoff')::bool,
              (options->>'expireInSeconds')::int,
              (options->>'retentionMinutes')::int,
              options->>'deadLetter',
              table_name
            )
            ON CONFLICT DO NOTHING
            RETURNING created_on
          )
          SELECT created_on into queue_created_on from q;

          IF queue_created_on IS NULL THEN
            RETURN;
          END IF;

          EXECUTE format('CREATE TABLE trellis_jobs.%I (LIKE trellis_jobs.job INCLUDING DEFAULTS)', table_name);
          
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD PRIMARY KEY (name, id)', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT q_fkey FOREIGN KEY (name) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('ALTER TABLE trellis_jobs.%1$I ADD CONSTRAINT dlq_fkey FOREIGN KEY (dead_letter) REFERENCES trellis_jobs.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i1 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''created'' AND policy = ''short''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i2 ON trellis_jobs.%1$I (name, COALESCE(singleton_key, '''')) WHERE state = ''active'' AND policy = ''singleton''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i3 ON trellis_jobs.%1$I (name, state, COALESCE(singleton_key, '''')) WHERE state <= ''active'' AND policy = ''stately''', table_name);
          EXECUTE format('CREATE UNIQUE INDEX %1$s_i4 ON trellis_jobs.%1$I (name, singleton_on, COALESCE(singleton_key, '''')) WHERE state <> ''cancelled'' AND singleton_on IS NOT NULL', table_name);
          EXECUTE format('CREATE INDEX %1$s_i5 ON trellis_jobs.%1$I (name, start_after) INCLUDE (priority, created_on, id) WHERE state < ''active''', table_name);

          EXECUTE format('ALTER TABLE trellis_jobs.%I ADD CONSTRAINT cjc CHECK (name=%L)', table_name, queue_name);
          EXECUTE format('ALTER TABLE trellis_jobs.job ATTACH PARTITION trellis_jobs.%I FOR VALUES IN (%L)', table_name, queue_name);
        END;
        $$
        LANGUAGE plpgsql
        ;
UPDATE trellis_jobs.version SET version = '24';
    $trellis_boss_21$;
    ELSE
      RAISE EXCEPTION 'the jobs schema trellis_jobs is at pg-boss schema version %, which this trellis-pg cannot upgrade to 24', boss_version
        USING ERRCODE = 'TRI01';
    END IF;
  END IF;
  PERFORM trellis_jobs.create_queue('self_check', '{"policy": "standard"}'::json);

  REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA "trellis_jobs" FROM PUBLIC;
END
$trellis_upgrade$;
