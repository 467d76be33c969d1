-- Written by `trellis generate upgrade` (trellis-pg 0.1.0).
-- trellis-pg: upgrade the Trellis catalog schema "trellis" from version 18 to version 20.
-- Only the migrations after version 18, each version-guarded and locked: safe to run again,
-- and beside Trellis.migrate(). A database below version 18 is refused with what to run.
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
  IF installed < 18 THEN
    RAISE EXCEPTION 'the Trellis schema % is at version %, and this migration upgrades it from version 18 to 20', 'trellis', installed
      USING ERRCODE = 'TRI01',
            HINT = 'run the migrations that bring it to version 18 first, or the whole install SQL instead (trellis sql install prints it; Trellis.migrate() runs it)';
  END IF;
  SELECT max(version) INTO newer FROM "trellis".migrations WHERE version > 20 AND breaking;
  IF newer IS NOT NULL THEN
    RAISE EXCEPTION 'the Trellis schema % is at breaking version %, newer than this trellis-pg knows (20): upgrade trellis-pg',
      'trellis', newer USING ERRCODE = 'TRI01';
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 19) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (19, 'wal_capture', false);
    EXECUTE $trellis_m19$-- WAL capture (issue #14, ADR 0023): the instance's capture setting, each source's place in
-- the publication, and what the decoder, the staging worker and awaitConverged need to
-- turn a replication slot's changes into ledger rows with the promises of trigger capture.

-- The instance's capture setting ('trigger' is the default; 'logical' is the wish, and each
-- source follows it when it can), the slot ceiling, and what exists of WAL capture now:
-- the slot (named once made; NULL while none is), and the WAL position past which the slot
-- must have acknowledged before it can go (the last switch of a source back to triggers).
ALTER TABLE "trellis".config
  ADD COLUMN capture text NOT NULL DEFAULT 'trigger' CHECK (capture IN ('trigger', 'logical')),
  ADD COLUMN wal_retention_limit bigint NOT NULL DEFAULT 4294967296 CHECK (wal_retention_limit > 0),
  ADD COLUMN wal_slot name,
  ADD COLUMN wal_drain_lsn pg_lsn,
  -- xmin of the publication's pg_publication row after Trellis last changed it: any other
  -- change to it (options, a drop and create) is a disruption.
  ADD COLUMN wal_publication_xmin text;

-- A source's place in the publication: NULL (not in it), 'publishing' (in it, but a
-- transaction that began before may still write it unpublished: wait until the snapshot's
-- xmin passes wal_xmax, NULL until a slot exists), 'ready' (every change to it is decoded).
-- wal_rel_xmin: the xmin of its pg_publication_rel row as Trellis added it.
ALTER TABLE "trellis".sources
  ADD COLUMN wal_state text CHECK (wal_state IN ('publishing', 'ready')),
  ADD COLUMN wal_xmax xid8,
  ADD COLUMN wal_since timestamptz,
  ADD COLUMN wal_rel_xmin text;

-- A partition or child that left a WAL-captured source (detached, NO INHERIT) stays a
-- recorded member until the slot has acknowledged the WAL position where the staging
-- worker saw it go: changes made in it before it left may still be decoded, and must still
-- reach the source (see _wal_sources_of). NULL for a member that has not left.
ALTER TABLE "trellis".source_members ADD COLUMN left_lsn pg_lsn;

-- The instance's publication and slot names. Slot names are cluster-wide: the database's
-- oid keeps a database cloned from another (with its catalog) from taking the other's slot.
CREATE FUNCTION "trellis"._wal_publication()
RETURNS name LANGUAGE sql STABLE AS $fn$
  SELECT ('trellis_' || substr(md5('trellis'), 1, 12))::name
$fn$;
CREATE FUNCTION "trellis"._wal_slot_name()
RETURNS name LANGUAGE sql STABLE AS $fn$
  SELECT ('trellis_' || (SELECT oid FROM pg_database WHERE datname = current_database())
          || '_' || substr(md5('trellis'), 1, 12))::name
$fn$;

-- Raises TRV01, naming the setting to change, when this server and role cannot run WAL
-- capture.
CREATE FUNCTION "trellis"._check_logical_capture()
RETURNS void LANGUAGE plpgsql STABLE AS $fn$
BEGIN
  IF current_setting('wal_level') <> 'logical' THEN
    PERFORM "trellis"._fail('TRV01', format(
      'capture ''logical'' needs wal_level = logical, and this server has wal_level = %s: set wal_level = logical (in postgresql.conf, or ALTER SYSTEM SET wal_level = logical) and restart Postgres',
      current_setting('wal_level')));
  END IF;
  IF NOT (SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user) THEN
    PERFORM "trellis"._fail('TRV01', format(
      'capture ''logical'' needs the REPLICATION attribute, and role %1$I lacks it: ALTER ROLE %1$I REPLICATION (as a superuser), or run Trellis as a role that has it',
      current_user));
  END IF;
  IF current_setting('max_replication_slots')::int = 0 OR current_setting('max_wal_senders')::int = 0 THEN
    PERFORM "trellis"._fail('TRV01',
      'capture ''logical'' needs a replication slot and a WAL sender, and max_replication_slots or max_wal_senders is 0: set both to at least 1 and restart Postgres');
  END IF;
END
$fn$;

-- Sets the instance's capture ('trigger' or 'logical') and, when given, the slot ceiling
-- (bytes of WAL the slot may hold back). 'logical' is checked first (_check_logical_capture).
-- The staging worker moves each source over. Callable from a migration.
CREATE FUNCTION "trellis".set_capture(mode text, wal_retention_limit bigint DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  IF mode IS NULL OR mode NOT IN ('trigger', 'logical') THEN
    PERFORM "trellis"._fail('TRV01', format('capture must be ''trigger'' or ''logical'', not %L', mode));
  END IF;
  IF wal_retention_limit IS NOT NULL AND wal_retention_limit <= 0 THEN
    PERFORM "trellis"._fail('TRV01', format('wal_retention_limit must be a positive number of bytes, not %s', wal_retention_limit));
  END IF;
  IF mode = 'logical' THEN
    PERFORM "trellis"._check_logical_capture();
  END IF;
  UPDATE "trellis".config c
     SET capture = mode, wal_retention_limit = coalesce(set_capture.wal_retention_limit, c.wal_retention_limit)
   WHERE c.capture IS DISTINCT FROM mode
      OR c.wal_retention_limit IS DISTINCT FROM coalesce(set_capture.wal_retention_limit, c.wal_retention_limit);
END
$fn$;

-- Why a table cannot be captured from the WAL (NULL when it can): every relation with
-- storage in its tree must carry its primary key in what a DELETE publishes (replica
-- identity DEFAULT with a primary key, FULL, or USING INDEX of the primary key), be logged,
-- and be the table or one of its partitions (an INHERITS child would need its own entry in
-- the publication, and may have no key at all).
CREATE FUNCTION "trellis"._wal_ineligible(rel oid)
RETURNS text LANGUAGE sql STABLE AS $fn$
  WITH RECURSIVE tree(relid, depth) AS (
    SELECT rel, 0
    UNION ALL
    SELECT i.inhrelid, tree.depth + 1 FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid),
  problems AS (
    SELECT t.depth, quote_ident(n.nspname) || '.' || quote_ident(c.relname) AS name,
           CASE
             WHEN c.relkind NOT IN ('r', 'p') THEN 'is not a table'
             WHEN t.depth > 0 AND NOT c.relispartition THEN 'is an inheritance child'
             WHEN c.relpersistence <> 'p' THEN 'is not logged'
             WHEN c.relkind = 'p' THEN NULL
             WHEN c.relreplident = 'f' THEN NULL
             WHEN c.relreplident = 'n' THEN 'has REPLICA IDENTITY NOTHING'
             WHEN NOT EXISTS (SELECT 1 FROM pg_index x WHERE x.indrelid = c.oid AND x.indisprimary)
               THEN 'has no primary key'
             WHEN c.relreplident = 'i' AND NOT EXISTS (
                    SELECT 1 FROM pg_index x WHERE x.indrelid = c.oid AND x.indisprimary AND x.indisreplident)
               THEN 'has REPLICA IDENTITY USING INDEX of an index other than its primary key'
           END AS problem
      FROM tree t JOIN pg_class c ON c.oid = t.relid JOIN pg_namespace n ON n.oid = c.relnamespace)
  SELECT p.name || ' ' || p.problem FROM problems p WHERE p.problem IS NOT NULL
   ORDER BY p.depth, p.name LIMIT 1
$fn$;

-- The sources a change to relation `rel` belongs to: `rel` itself, and every source it is a
-- partition of now, or was when the staging worker last recorded the members (a change
-- decoded after its partition was detached still reaches the source it was made in).
CREATE FUNCTION "trellis"._wal_sources_of(rel oid)
RETURNS SETOF int LANGUAGE sql STABLE AS $fn$
  SELECT src.id FROM "trellis".sources src
   WHERE src.source_oid = rel
      OR EXISTS (SELECT 1 FROM "trellis".source_members m WHERE m.source_id = src.id AND m.relid = rel)
      OR rel IN (SELECT "trellis"._descendants(src.source_oid))
$fn$;

-- Writes decoded changes into the ledger, with this transaction's xid (as a capture
-- trigger writes its own): one row per source with every key, or a keys-NULL row (rebuild
-- the readers) for a source whose change was a TRUNCATE or whose key could not be read.
-- p_changes: [{r: relation oid, t: true (truncated, or keys unknown)} or
--             {r: relation oid, c: [column names], k: [[value texts, in c's order], ...]}]
-- A key is encoded as the capture triggers encode it: a one-column key's text, a wider key's
-- text[] as text. Returns the ledger rows written.
-- JIT off: the planner cannot see how small a batch is, and compiling the plan took
-- seconds of a one-key batch.
CREATE FUNCTION "trellis"._wal_append(p_changes jsonb)
RETURNS int LANGUAGE plpgsql SET jit = off AS $fn$
DECLARE
  x bigint := pg_current_xact_id()::text::bigint;
  g smallint := "trellis".ledger_generation(x);
  n int;
BEGIN
  -- Straight into the generation's partition, as the triggers do.
  EXECUTE format($sql$
    WITH rel AS (
      SELECT (e->>'r')::oid AS relid, coalesce((e->>'t')::boolean, false) AS everything,
             ARRAY(SELECT jsonb_array_elements_text(coalesce(e->'c', '[]'))) AS cols,
             coalesce(e->'k', '[]') AS rows
        FROM jsonb_array_elements($1) e),
    mapped AS (
      SELECT rel.*, src.id AS source_id,
             ARRAY(SELECT array_position(rel.cols, kc::text)
                     FROM unnest(src.key_columns) WITH ORDINALITY AS u(kc, i) ORDER BY u.i) AS pos
        FROM rel CROSS JOIN LATERAL %1$I._wal_sources_of(rel.relid) s(id)
        JOIN %1$I.sources src ON src.id = s.id),
    everything AS (
      SELECT DISTINCT source_id FROM mapped
       WHERE everything OR array_position(pos, NULL) IS NOT NULL),
    keyed AS (
      SELECT m.source_id,
             CASE WHEN cardinality(m.pos) = 1 THEN r.v ->> (m.pos[1] - 1)
                  ELSE ARRAY(SELECT r.v ->> (q.p - 1)
                               FROM unnest(m.pos) WITH ORDINALITY AS q(p, i) ORDER BY q.i)::text END AS k
        FROM mapped m CROSS JOIN LATERAL jsonb_array_elements(m.rows) r(v)
       WHERE m.source_id NOT IN (SELECT source_id FROM everything))
    INSERT INTO %1$I.%2$I (gen, source_id, xid, keys)
    SELECT $2, source_id, $3, NULL FROM everything
    UNION ALL
    SELECT $2, source_id, $3, array_agg(DISTINCT k) FROM keyed GROUP BY source_id$sql$,
    'trellis', 'ledger_' || g)
  USING p_changes, g, x;
  GET DIAGNOSTICS n = ROW_COUNT;
  RETURN n;
END
$fn$;

-- Whether the instance's slot has acknowledged (every change before it is in the ledger,
-- committed) the WAL position p_lsn. True when the instance has no slot: nothing is
-- captured from the WAL, and a slot made later starts past p_lsn. False while the slot it
-- had is missing or lost (its readers are disrupted until it is made again).
CREATE FUNCTION "trellis"._wal_decoded(p_lsn pg_lsn)
RETURNS boolean LANGUAGE sql STABLE AS $fn$
  SELECT CASE WHEN c.wal_slot IS NULL OR p_lsn IS NULL THEN true
              ELSE coalesce((SELECT s.confirmed_flush_lsn >= p_lsn AND s.wal_status IS DISTINCT FROM 'lost'
                               FROM pg_replication_slots s WHERE s.slot_name = c.wal_slot), false) END
    FROM "trellis".config c
$fn$;

-- The slot was lost (dropped outside Trellis, invalidated by Postgres, or dropped by the
-- staging worker past its ceiling): the changes it had not delivered never reached the
-- ledger. Every transform reading a source captured from the WAL alone stops
-- (captureFailure.kind 'disruption', RESUME rebuilds); published sources wait for a new
-- slot (publishing again), and config forgets the slot, so the decoder makes a new one.
-- Nothing when p_slot is not the instance's slot any more (someone acted already).
-- Returns the targets stopped.
CREATE FUNCTION "trellis"._wal_lost(p_slot name, reason text)
RETURNS SETOF text LANGUAGE plpgsql AS $fn$
BEGIN
  -- Once per slot: whoever sees it lost first (the decoder, the staging worker) acts.
  UPDATE "trellis".config SET wal_slot = NULL WHERE wal_slot = p_slot;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  RETURN QUERY
  WITH lost AS (
    SELECT src.id, src.source_oid FROM "trellis".sources src
     WHERE src.wal_state = 'ready' AND src.installed_at IS NULL),
  reset AS (
    UPDATE "trellis".sources src
       SET wal_state = 'publishing', wal_xmax = NULL, wal_since = now()
     WHERE src.wal_state IS NOT NULL
    RETURNING src.id)
  UPDATE "trellis".transforms t
     SET paused_at = coalesce(t.paused_at, now()),
         pause_reason = CASE WHEN t.paused_at IS NULL THEN 'disruption' ELSE t.pause_reason END,
         capture_failure = jsonb_build_object('kind', 'disruption', 'error', reason,
                                              'columns', '[]'::jsonb, 'detected_at', now()),
         updated_at = now()
   WHERE t.capture_failure IS NULL
     AND t.id IN (SELECT ts.transform_id FROM "trellis".transform_sources ts
                   WHERE ts.source_oid IN (SELECT source_oid FROM lost))
  RETURNING t.target_name::text;
END
$fn$;

-- Something the staging worker's reconcile pass must come back to soon: as before (0015),
-- and a source waiting for older transactions to end before its WAL capture is trusted, or
-- whose triggers can go now that it is, or a member that left a WAL-captured source and
-- waits to be decoded past.
CREATE OR REPLACE FUNCTION "trellis"._capture_pending()
RETURNS boolean LANGUAGE sql STABLE AS $fn$
  SELECT EXISTS (SELECT 1 FROM "trellis".sources WHERE widened_at IS NOT NULL)
      OR EXISTS (SELECT 1 FROM "trellis".corrections)
      OR EXISTS (SELECT 1 FROM "trellis".pipeline p JOIN "trellis".transforms t ON t.id = p.transform_id
                  WHERE p.phase = 'waiting_to_backfill' AND t.paused_at IS NULL)
      OR EXISTS (SELECT 1 FROM "trellis".sources
                  WHERE wal_state = 'publishing' OR (wal_state = 'ready' AND installed_at IS NOT NULL))
      OR EXISTS (SELECT 1 FROM "trellis".source_members WHERE left_lsn IS NOT NULL)
$fn$;

-- What the reconcile pass reads, as one text (0015), now with the instance's settings and
-- slot (config), and the publication's row and members: a capture setting changed, a slot
-- made, or the publication changed outside Trellis is acted on within a look.
CREATE OR REPLACE FUNCTION "trellis"._capture_fingerprint()
RETURNS text LANGUAGE sql STABLE AS $fn$
  WITH RECURSIVE src(oid) AS (SELECT DISTINCT source_oid FROM "trellis".transform_sources),
  tree(relid) AS (
    SELECT oid FROM src
    UNION SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid),
  rel(oid) AS (SELECT relid FROM tree UNION SELECT target_oid FROM "trellis".transforms),
  pub AS (SELECT p.oid, p.xmin FROM pg_publication p WHERE p.pubname = "trellis"._wal_publication())
  SELECT concat_ws('/',
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM "trellis".transforms),
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM "trellis".transform_columns),
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM "trellis".transform_sources),
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM "trellis".sources),
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM "trellis".config),
    (SELECT count(*) || ':' || coalesce(sum(c.xmin::text::bigint), 0)
       FROM pg_class c WHERE c.oid IN (SELECT oid FROM rel)),
    (SELECT count(*) || ':' || coalesce(sum(a.xmin::text::bigint), 0)
       FROM pg_attribute a WHERE a.attrelid IN (SELECT oid FROM rel) AND a.attnum > 0),
    (SELECT count(*) || ':' || coalesce(sum(x.xmin::text::bigint), 0)
       FROM pg_index x WHERE x.indrelid IN (SELECT oid FROM rel)),
    (SELECT count(*) || ':' || coalesce(sum(g.xmin::text::bigint), 0)
       FROM pg_trigger g WHERE g.tgrelid IN (SELECT oid FROM rel)),
    (SELECT count(*) || ':' || coalesce(sum(p.xmin::text::bigint), 0)
       FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
      WHERE n.nspname = 'trellis'),
    (SELECT count(*) || ':' || coalesce(sum(pub.xmin::text::bigint), 0) FROM pub),
    (SELECT count(*) || ':' || coalesce(sum(r.xmin::text::bigint), 0)
       FROM pg_publication_rel r WHERE r.prpubid IN (SELECT oid FROM pub)))
$fn$;
$trellis_m19$;
  END IF;

  IF NOT EXISTS (SELECT 1 FROM "trellis".migrations WHERE version = 20) THEN
    -- The version row goes in first: an installer that skipped the lock fails on its key.
    INSERT INTO "trellis".migrations (version, name, breaking)
      VALUES (20, 'wal_status', false);
    EXECUTE $trellis_m20$-- status() under WAL capture (issue #14, ADR 0023): what a transform's capture is, and
-- what a backfill waits on when WAL capture has just published a source.

-- The transactions a published source waits out (as 32-bit xid texts): those of this
-- database that began before the publication changed (an xid below `p_xmax` that the
-- current snapshot still counts as running), prepared ones included. Only this database's:
-- another database's transactions cannot write the source, and a long one there (another
-- app, a test suite's other files) must not hold capture here. Found through pg_locks (each
-- transaction holds the lock on its own xid), which every role may read.
CREATE FUNCTION "trellis"._publish_waits_on(p_xmax xid8)
RETURNS SETOF text LANGUAGE sql STABLE AS $fn$
  SELECT (x::text::bigint % 4294967296)::text
    FROM pg_snapshot_xip(pg_current_snapshot()) x
   WHERE p_xmax IS NOT NULL AND x < p_xmax
     AND (x::text::bigint % 4294967296)::text IN (
       SELECT l.transactionid::text FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted
          AND a.datname = current_database()
       UNION ALL
       SELECT p.transaction::text FROM pg_prepared_xacts p WHERE p.database = current_database())
$fn$;

-- The sessions and prepared transactions a published source waits out (_publish_waits_on).
-- Same shape as _capture_wait_blockers (0017).
CREATE FUNCTION "trellis"._publish_wait_blockers(p_xmax xid8)
RETURNS jsonb LANGUAGE sql STABLE AS $fn$
  WITH running AS (SELECT w AS xid FROM "trellis"._publish_waits_on(p_xmax) w)
  SELECT jsonb_build_object(
    'blockers', coalesce((SELECT jsonb_agg(jsonb_build_object(
                   'pid', a.pid, 'applicationName', a.application_name, 'database', a.datname,
                   'state', a.state, 'xactStart', a.xact_start, 'queryStart', a.query_start,
                   'query', a.query) ORDER BY a.pid)
                   FROM pg_stat_activity a
                  WHERE a.pid IN (SELECT l.pid FROM pg_locks l
                                   WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock'
                                     AND l.transactionid::text IN (SELECT xid FROM running))
                    AND a.pid <> pg_backend_pid()), '[]'),
    'prepared', coalesce((SELECT jsonb_agg(jsonb_build_object(
                   'gid', p.gid, 'owner', p.owner, 'database', p.database,
                   'prepared', p.prepared, 'transaction', p.transaction::text)
                   ORDER BY p.prepared, p.gid)
                   FROM pg_prepared_xacts p
                  WHERE p.transaction::text IN (SELECT xid FROM running)), '[]'))
$fn$;

-- A transform's capture (Status.capture): the instance's setting; each source's mode
-- ('logical' once the slot alone captures it, 'switching' while both or while it is not
-- trusted yet) and, under 'logical', why one stays on triggers; the slot, while the
-- instance has one, with the WAL it holds back against the ceiling.
CREATE FUNCTION "trellis"._capture_status(p_transform_id bigint)
RETURNS jsonb LANGUAGE sql STABLE AS $fn$
  SELECT jsonb_build_object(
    'setting', c.capture,
    'sources', coalesce((
      SELECT jsonb_agg(jsonb_build_object(
               'table', coalesce(src.qualified, ts.source_schema || '.' || ts.source_name),
               'mode', CASE WHEN src.wal_state = 'ready' AND src.installed_at IS NULL THEN 'logical'
                            WHEN src.wal_state IS NULL THEN 'trigger'
                            ELSE 'switching' END,
               'reason', CASE WHEN c.capture = 'logical' AND src.wal_state IS NULL
                               AND EXISTS (SELECT 1 FROM pg_class rc WHERE rc.oid = ts.source_oid)
                              THEN "trellis"._wal_ineligible(ts.source_oid) END)
             ORDER BY ts.ordinal)
        FROM "trellis".transform_sources ts
        LEFT JOIN "trellis".sources src ON src.source_oid = ts.source_oid
       WHERE ts.transform_id = p_transform_id), '[]'),
    'slot', CASE WHEN c.wal_slot IS NOT NULL THEN (
      SELECT jsonb_build_object(
               'name', c.wal_slot, 'limitBytes', c.wal_retention_limit,
               'retainedBytes', pg_wal_lsn_diff(pg_current_wal_lsn(), rs.restart_lsn)::bigint,
               'confirmedLsn', rs.confirmed_flush_lsn::text)
        FROM (SELECT 1) one
        LEFT JOIN pg_replication_slots rs
               ON rs.slot_name = c.wal_slot AND rs.database = current_database()) END)
  FROM "trellis".config c
$fn$;

-- status(target) as in 0017, with WAL capture: a backfill waiting for a published source's
-- older transactions to end (captureWait 'publish'), and `capture`: the instance's setting,
-- each source's capture mode (and why one stays on triggers), and the slot's retained WAL
-- against its ceiling. (A function is replaced whole: 0017's body, with the two additions.)
CREATE OR REPLACE FUNCTION "trellis".status(target text)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $fn$
DECLARE
  t "trellis".transforms;
  p "trellis".pipeline;
  lifecycle text;
  paused_columns jsonb;
  paused_upstream jsonb;
  correcting jsonb;
  upstream_behind boolean;
  lag_segments bigint;
  lag_seconds float8;
  wait jsonb;
  drain jsonb;
  -- Lock modes that conflict with SHARE ROW EXCLUSIVE, the mode capture DDL takes; a widen
  -- waits on writers (ROW EXCLUSIVE and stronger), which is the same list.
  conflicting constant text[] := ARRAY['RowExclusiveLock', 'ShareUpdateExclusiveLock',
    'ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock'];
BEGIN
  SELECT * INTO t FROM "trellis".transforms WHERE target_name = status.target;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'TRN01',
      MESSAGE = format('there is no transform named %s', status.target);
  END IF;
  SELECT * INTO p FROM "trellis".pipeline WHERE transform_id = t.id;

  paused_columns := to_jsonb(ARRAY(
    SELECT t.target_name || '.' || c.name FROM "trellis".transform_columns c
     WHERE c.transform_id = t.id AND c.paused_at IS NOT NULL ORDER BY c.name));
  -- Columns this transform reads of an upstream transform's target that are paused there
  -- (every column it reads, when the upstream transform is paused as a whole).
  paused_upstream := to_jsonb(ARRAY(
    SELECT DISTINCT u.target_name || '.' || uc.name
      FROM "trellis".transform_sources src
      JOIN "trellis".transforms u ON u.target_oid = src.source_oid
      JOIN "trellis".transform_columns uc ON uc.transform_id = u.id
     WHERE src.transform_id = t.id
       AND uc.name = ANY (src.read_columns)
       AND (uc.paused_at IS NOT NULL OR u.paused_at IS NOT NULL)
     ORDER BY 1));
  SELECT coalesce(jsonb_agg(jsonb_build_object(
           'node', c.node, 'since', c.since,
           'keysRemaining', CASE WHEN c.keys_total IS NOT NULL
                                 THEN greatest(c.keys_total - c.keys_done, 0) END)
         ORDER BY c.since, c.node), '[]')
    INTO correcting
    FROM "trellis".corrections c JOIN "trellis".sources src ON src.id = c.source_id
    JOIN "trellis".transform_sources ts ON ts.source_oid = src.source_oid
   WHERE ts.transform_id = t.id;
  -- Some transform upstream (at any depth) is paused or not live yet: this one cannot be
  -- keeping up with its sources' sources.
  upstream_behind := EXISTS (
    WITH RECURSIVE up(id) AS (
      SELECT u.id FROM "trellis".transform_sources ts
        JOIN "trellis".transforms u ON u.target_oid = ts.source_oid
       WHERE ts.transform_id = t.id
      UNION
      SELECT u.id FROM up
        JOIN "trellis".transform_sources ts ON ts.transform_id = up.id
        JOIN "trellis".transforms u ON u.target_oid = ts.source_oid)
    SELECT 1 FROM up JOIN "trellis".transforms u ON u.id = up.id
      JOIN "trellis".pipeline pu ON pu.transform_id = u.id
     WHERE u.paused_at IS NOT NULL OR pu.phase <> 'live');

  lifecycle := CASE WHEN t.paused_at IS NOT NULL THEN 'paused' ELSE p.phase END;
  -- Rows that came or went without DML are being re-derived: a build, of a part of it.
  IF lifecycle IN ('live', 'catching_up') AND jsonb_array_length(correcting) > 0 THEN
    lifecycle := 'backfilling';
  END IF;
  -- A live transform reading a paused upstream column, or reading a target that is still
  -- being built, is not keeping up with its sources.
  IF lifecycle = 'live' AND (jsonb_array_length(paused_upstream) > 0 OR upstream_behind) THEN
    lifecycle := 'catching_up';
  END IF;

  IF p.cursor_tick IS NOT NULL THEN
    SELECT count(*), extract(epoch FROM clock_timestamp() - min(k.at))::float8
      INTO lag_segments, lag_seconds
      FROM "trellis".ticks k WHERE k.seq > p.cursor_tick;
  END IF;

  -- A lock capture waits for first; else, for a transform not built yet, a widen of a
  -- column it reads waiting for writers that may run the older trigger.
  SELECT jsonb_build_object(
           'operation', src.wait->>'operation', 'table', src.qualified,
           'lockMode', src.wait->>'lock_mode', 'since', (src.wait->>'since')::timestamptz,
           'attempts', coalesce((src.wait->>'attempts')::int, 1))
         || "trellis"._capture_wait_blockers(src.source_oid, conflicting, NULL)
    INTO wait
    FROM "trellis".transform_sources ts JOIN "trellis".sources src ON src.source_oid = ts.source_oid
   WHERE ts.transform_id = t.id AND src.wait IS NOT NULL
   ORDER BY ts.ordinal LIMIT 1;
  IF wait IS NULL AND p.phase = 'waiting_to_backfill' THEN
    SELECT jsonb_build_object(
             'operation', 'widen', 'table', src.qualified, 'lockMode', 'ROW EXCLUSIVE',
             'since', src.widened_at, 'attempts', NULL)
           || "trellis"._capture_wait_blockers(
                src.source_oid, conflicting,
                -- null until the staging worker has recorded them: every writer
                CASE WHEN src.widen_holders IS NULL THEN NULL
                     ELSE ARRAY(SELECT h->>'vxid' FROM jsonb_array_elements(src.widen_holders) h) END)
      INTO wait
      FROM "trellis".transform_sources ts JOIN "trellis".sources src ON src.source_oid = ts.source_oid
     WHERE ts.transform_id = t.id
       AND src.widened_at IS NOT NULL AND ts.read_columns && src.widen_columns
     ORDER BY ts.ordinal LIMIT 1;
  END IF;
  -- WAL capture published a source and waits out the transactions that began before
  -- (they could write it unpublished) before a backfill reads it (ADR 0023).
  IF wait IS NULL AND p.phase = 'waiting_to_backfill' THEN
    SELECT jsonb_build_object(
             'operation', 'publish', 'table', src.qualified, 'lockMode', 'none',
             'since', src.wal_since, 'attempts', NULL)
           || "trellis"._publish_wait_blockers(src.wal_xmax)
      INTO wait
      FROM "trellis".transform_sources ts JOIN "trellis".sources src ON src.source_oid = ts.source_oid
     WHERE ts.transform_id = t.id
       AND src.wal_state = 'publishing' AND src.installed_at IS NULL
     ORDER BY ts.ordinal LIMIT 1;
  END IF;

  SELECT jsonb_build_object(
           'segSeq', p.open_hi, 'attempts', pg.attempts, 'error', pg.error,
           'sqlstate', pg.sqlstate, 'since', pg.first_failed_at, 'lastSeen', pg.last_failed_at,
           'tables', to_jsonb(ARRAY(SELECT ts.source_schema || '.' || ts.source_name
                                      FROM "trellis".transform_sources ts
                                     WHERE ts.transform_id = t.id ORDER BY ts.ordinal)))
    INTO drain
    FROM "trellis".pages pg WHERE pg.transform_id = t.id AND pg.attempts > 0
   ORDER BY pg.attempts DESC, pg.page LIMIT 1;

  RETURN jsonb_build_object(
    'target', t.target_name,
    'status', lifecycle,
    'pauseReason', t.pause_reason,
    'heldKeys', (SELECT count(*) FROM "trellis".held_keys h WHERE h.transform_id = t.id),
    'pausedColumns', paused_columns,
    'pausedUpstreamColumns', paused_upstream,
    'sourceIndexGaps', (
      SELECT coalesce(jsonb_agg(jsonb_build_object(
               'table', g->'table', 'columns', g->'columns', 'role', g->'role',
               'optedOut', g->'opted_out', 'fix', g->'fix')), '[]')
        FROM jsonb_array_elements("trellis".source_index_gaps(t.id)) g),
    'correcting', correcting,
    'captureFailure', CASE WHEN t.capture_failure IS NOT NULL THEN jsonb_build_object(
        'kind', t.capture_failure->'kind', 'error', t.capture_failure->'error',
        'columns', t.capture_failure->'columns',
        'detectedAt', (t.capture_failure->>'detected_at')::timestamptz) END,
    'captureWait', wait,
    'buildFailure', CASE WHEN p.build_attempts > 0 AND p.build_error IS NOT NULL
                          AND p.build_next_at IS NOT NULL THEN jsonb_build_object(
        'attempts', p.build_attempts, 'error', p.build_error,
        'nextAttemptAt', p.build_next_at) END,
    'drainFailure', drain,
    'backfill', CASE WHEN p.backfill_started_at IS NOT NULL
                      AND (p.phase = 'backfilling' OR p.backfill_done > 0) THEN jsonb_build_object(
        'keysDone', p.backfill_done, 'keysTotal', p.backfill_total,
        'startedAt', p.backfill_started_at) END,
    'lag', jsonb_build_object('segments', coalesce(lag_segments, 0),
                              'seconds', coalesce(lag_seconds, 0)),
    'capture', "trellis"._capture_status(t.id));
END
$fn$;
$trellis_m20$;
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
