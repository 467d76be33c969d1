-- WAL capture (issue #14, ADR 0023): the instance's capture setting, each source's place in
-- the publication, and what the decoder, the staging worker and awaitConverged need to
-- turn a replication slot's changes into ledger rows with the promises of trigger capture.

-- The instance's capture setting ('trigger' is the default; 'logical' is the wish, and each
-- source follows it when it can), the slot ceiling, and what exists of WAL capture now:
-- the slot (named once made; NULL while none is), and the WAL position past which the slot
-- must have acknowledged before it can go (the last switch of a source back to triggers).
ALTER TABLE @schema@.config
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
ALTER TABLE @schema@.sources
  ADD COLUMN wal_state text CHECK (wal_state IN ('publishing', 'ready')),
  ADD COLUMN wal_xmax xid8,
  ADD COLUMN wal_since timestamptz,
  ADD COLUMN wal_rel_xmin text;

-- A partition or child that left a WAL-captured source (detached, NO INHERIT) stays a
-- recorded member until the slot has acknowledged the WAL position where the staging
-- worker saw it go: changes made in it before it left may still be decoded, and must still
-- reach the source (see _wal_sources_of). NULL for a member that has not left.
ALTER TABLE @schema@.source_members ADD COLUMN left_lsn pg_lsn;

-- The instance's publication and slot names. Slot names are cluster-wide: the database's
-- oid keeps a database cloned from another (with its catalog) from taking the other's slot.
CREATE FUNCTION @schema@._wal_publication()
RETURNS name LANGUAGE sql STABLE AS $fn$
  SELECT ('trellis_' || substr(md5(@schema_literal@), 1, 12))::name
$fn$;
CREATE FUNCTION @schema@._wal_slot_name()
RETURNS name LANGUAGE sql STABLE AS $fn$
  SELECT ('trellis_' || (SELECT oid FROM pg_database WHERE datname = current_database())
          || '_' || substr(md5(@schema_literal@), 1, 12))::name
$fn$;

-- Raises TRV01, naming the setting to change, when this server and role cannot run WAL
-- capture.
CREATE FUNCTION @schema@._check_logical_capture()
RETURNS void LANGUAGE plpgsql STABLE AS $fn$
BEGIN
  IF current_setting('wal_level') <> 'logical' THEN
    PERFORM @schema@._fail('TRV01', format(
      'capture ''logical'' needs wal_level = logical, and this server has wal_level = %s: set wal_level = logical (in postgresql.conf, or ALTER SYSTEM SET wal_level = logical) and restart Postgres',
      current_setting('wal_level')));
  END IF;
  IF NOT (SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user) THEN
    PERFORM @schema@._fail('TRV01', format(
      'capture ''logical'' needs the REPLICATION attribute, and role %1$I lacks it: ALTER ROLE %1$I REPLICATION (as a superuser), or run Trellis as a role that has it',
      current_user));
  END IF;
  IF current_setting('max_replication_slots')::int = 0 OR current_setting('max_wal_senders')::int = 0 THEN
    PERFORM @schema@._fail('TRV01',
      'capture ''logical'' needs a replication slot and a WAL sender, and max_replication_slots or max_wal_senders is 0: set both to at least 1 and restart Postgres');
  END IF;
END
$fn$;

-- Sets the instance's capture ('trigger' or 'logical') and, when given, the slot ceiling
-- (bytes of WAL the slot may hold back). 'logical' is checked first (_check_logical_capture).
-- The staging worker moves each source over. Callable from a migration.
CREATE FUNCTION @schema@.set_capture(mode text, wal_retention_limit bigint DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
  IF mode IS NULL OR mode NOT IN ('trigger', 'logical') THEN
    PERFORM @schema@._fail('TRV01', format('capture must be ''trigger'' or ''logical'', not %L', mode));
  END IF;
  IF wal_retention_limit IS NOT NULL AND wal_retention_limit <= 0 THEN
    PERFORM @schema@._fail('TRV01', format('wal_retention_limit must be a positive number of bytes, not %s', wal_retention_limit));
  END IF;
  IF mode = 'logical' THEN
    PERFORM @schema@._check_logical_capture();
  END IF;
  UPDATE @schema@.config c
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
CREATE FUNCTION @schema@._wal_ineligible(rel oid)
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
CREATE FUNCTION @schema@._wal_sources_of(rel oid)
RETURNS SETOF int LANGUAGE sql STABLE AS $fn$
  SELECT src.id FROM @schema@.sources src
   WHERE src.source_oid = rel
      OR EXISTS (SELECT 1 FROM @schema@.source_members m WHERE m.source_id = src.id AND m.relid = rel)
      OR rel IN (SELECT @schema@._descendants(src.source_oid))
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
CREATE FUNCTION @schema@._wal_append(p_changes jsonb)
RETURNS int LANGUAGE plpgsql SET jit = off AS $fn$
DECLARE
  x bigint := pg_current_xact_id()::text::bigint;
  g smallint := @schema@.ledger_generation(x);
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
    @schema_literal@, 'ledger_' || g)
  USING p_changes, g, x;
  GET DIAGNOSTICS n = ROW_COUNT;
  RETURN n;
END
$fn$;

-- Whether the instance's slot has acknowledged (every change before it is in the ledger,
-- committed) the WAL position p_lsn. True when the instance has no slot: nothing is
-- captured from the WAL, and a slot made later starts past p_lsn. False while the slot it
-- had is missing or lost (its readers are disrupted until it is made again).
CREATE FUNCTION @schema@._wal_decoded(p_lsn pg_lsn)
RETURNS boolean LANGUAGE sql STABLE AS $fn$
  SELECT CASE WHEN c.wal_slot IS NULL OR p_lsn IS NULL THEN true
              ELSE coalesce((SELECT s.confirmed_flush_lsn >= p_lsn AND s.wal_status IS DISTINCT FROM 'lost'
                               FROM pg_replication_slots s WHERE s.slot_name = c.wal_slot), false) END
    FROM @schema@.config c
$fn$;

-- The slot was lost (dropped outside Trellis, invalidated by Postgres, or dropped by the
-- staging worker past its ceiling): the changes it had not delivered never reached the
-- ledger. Every transform reading a source captured from the WAL alone stops
-- (captureFailure.kind 'disruption', RESUME rebuilds); published sources wait for a new
-- slot (publishing again), and config forgets the slot, so the decoder makes a new one.
-- Nothing when p_slot is not the instance's slot any more (someone acted already).
-- Returns the targets stopped.
CREATE FUNCTION @schema@._wal_lost(p_slot name, reason text)
RETURNS SETOF text LANGUAGE plpgsql AS $fn$
BEGIN
  -- Once per slot: whoever sees it lost first (the decoder, the staging worker) acts.
  UPDATE @schema@.config SET wal_slot = NULL WHERE wal_slot = p_slot;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  RETURN QUERY
  WITH lost AS (
    SELECT src.id, src.source_oid FROM @schema@.sources src
     WHERE src.wal_state = 'ready' AND src.installed_at IS NULL),
  reset AS (
    UPDATE @schema@.sources src
       SET wal_state = 'publishing', wal_xmax = NULL, wal_since = now()
     WHERE src.wal_state IS NOT NULL
    RETURNING src.id)
  UPDATE @schema@.transforms t
     SET paused_at = coalesce(t.paused_at, now()),
         pause_reason = CASE WHEN t.paused_at IS NULL THEN 'disruption' ELSE t.pause_reason END,
         capture_failure = jsonb_build_object('kind', 'disruption', 'error', reason,
                                              'columns', '[]'::jsonb, 'detected_at', now()),
         updated_at = now()
   WHERE t.capture_failure IS NULL
     AND t.id IN (SELECT ts.transform_id FROM @schema@.transform_sources ts
                   WHERE ts.source_oid IN (SELECT source_oid FROM lost))
  RETURNING t.target_name::text;
END
$fn$;

-- Something the staging worker's reconcile pass must come back to soon: as before (0015),
-- and a source waiting for older transactions to end before its WAL capture is trusted, or
-- whose triggers can go now that it is, or a member that left a WAL-captured source and
-- waits to be decoded past.
CREATE OR REPLACE FUNCTION @schema@._capture_pending()
RETURNS boolean LANGUAGE sql STABLE AS $fn$
  SELECT EXISTS (SELECT 1 FROM @schema@.sources WHERE widened_at IS NOT NULL)
      OR EXISTS (SELECT 1 FROM @schema@.corrections)
      OR EXISTS (SELECT 1 FROM @schema@.pipeline p JOIN @schema@.transforms t ON t.id = p.transform_id
                  WHERE p.phase = 'waiting_to_backfill' AND t.paused_at IS NULL)
      OR EXISTS (SELECT 1 FROM @schema@.sources
                  WHERE wal_state = 'publishing' OR (wal_state = 'ready' AND installed_at IS NOT NULL))
      OR EXISTS (SELECT 1 FROM @schema@.source_members WHERE left_lsn IS NOT NULL)
$fn$;

-- What the reconcile pass reads, as one text (0015), now with the instance's settings and
-- slot (config), and the publication's row and members: a capture setting changed, a slot
-- made, or the publication changed outside Trellis is acted on within a look.
CREATE OR REPLACE FUNCTION @schema@._capture_fingerprint()
RETURNS text LANGUAGE sql STABLE AS $fn$
  WITH RECURSIVE src(oid) AS (SELECT DISTINCT source_oid FROM @schema@.transform_sources),
  tree(relid) AS (
    SELECT oid FROM src
    UNION SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid),
  rel(oid) AS (SELECT relid FROM tree UNION SELECT target_oid FROM @schema@.transforms),
  pub AS (SELECT p.oid, p.xmin FROM pg_publication p WHERE p.pubname = @schema@._wal_publication())
  SELECT concat_ws('/',
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM @schema@.transforms),
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM @schema@.transform_columns),
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM @schema@.transform_sources),
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM @schema@.sources),
    (SELECT count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM @schema@.config),
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
      WHERE n.nspname = @schema_literal@),
    (SELECT count(*) || ':' || coalesce(sum(pub.xmin::text::bigint), 0) FROM pub),
    (SELECT count(*) || ':' || coalesce(sum(r.xmin::text::bigint), 0)
       FROM pg_publication_rel r WHERE r.prpubid IN (SELECT oid FROM pub)))
$fn$;
