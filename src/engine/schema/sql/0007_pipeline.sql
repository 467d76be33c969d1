-- The live pipeline's state: captured sources, the ledger and its ticks, each
-- transform's progress, open drain pages, and keys held back from a transform.
-- How they work together: src/engine/DESIGN.md.

-- Tables the staging worker captures: one row per source table any transform reads.
CREATE TABLE @schema@.sources (
  id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  source_oid oid NOT NULL UNIQUE,
  -- schema.table when capture was installed (for messages once the table is gone).
  qualified text NOT NULL,
  key_columns name[] NOT NULL,
  key_types text[] NOT NULL,
  -- The columns the installed UPDATE trigger compares: an UPDATE changing none of them
  -- captures nothing. Grows (widen) when a new transform reads more.
  captured_columns name[] NOT NULL DEFAULT '{}',
  installed_at timestamptz,
  -- pg_snapshot_xmax just after capture last changed: a transform whose backfill starts at a
  -- tick with xmin at or past it knows no writer still runs older trigger code.
  ready_xmax xid8,
  -- While an install, widen or uninstall waits on a lock: {operation, lock_mode, since}.
  wait jsonb
);

-- The ledger: (source, keys, xid) for every captured change, nothing else. A row holds the
-- keys of every row one statement changed (one row per key would make a bulk write pay a
-- ledger row per row). Each key is one text: a one-column key's own text form, a
-- wider key's text[] in its text form ('{1,abc}'); see src/engine/capture/trigger-sql.ts.
-- NULL keys mark a TRUNCATE of the source. xid is the writing transaction's id
-- (pg_current_xact_id() as a bigint, so a BRIN index can range over it: rows arrive
-- roughly in xid order, and a BRIN index costs writers next to nothing, where a btree
-- costs every captured row).
--
-- Partitioned into three generations by xid epoch: gen = (xid >> 16) % 3, a pure function
-- of the transaction, so a trigger needs no lookup to know where to write. A generation
-- whose rows every cursor has passed is TRUNCATEd (no DELETE, no bloat); the current
-- epoch's never is. See src/engine/staging/ledger-maintenance.ts.
CREATE TABLE @schema@.ledger (
  gen smallint NOT NULL,
  source_id int NOT NULL,
  xid bigint NOT NULL,
  keys text[]
) PARTITION BY LIST (gen);
CREATE TABLE @schema@.ledger_0 PARTITION OF @schema@.ledger FOR VALUES IN (0);
CREATE TABLE @schema@.ledger_1 PARTITION OF @schema@.ledger FOR VALUES IN (1);
CREATE TABLE @schema@.ledger_2 PARTITION OF @schema@.ledger FOR VALUES IN (2);
CREATE INDEX ledger_by_xid ON @schema@.ledger USING brin (xid)
  WITH (pages_per_range = 16, autosummarize = on);

-- The generation a transaction's ledger rows go to.
CREATE FUNCTION @schema@.ledger_generation(xid bigint)
RETURNS smallint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
  SELECT ((xid >> 16) % 3)::smallint
$fn$;

-- Ticks seal segments: a tick records pg_current_snapshot(); the segment after tick A up
-- to tick B holds the ledger rows whose transactions B sees and A does not, so a
-- transaction committing out of xid order is never skipped (as in PgQ).
CREATE SEQUENCE @schema@.tick_seq;
CREATE TABLE @schema@.ticks (
  seq bigint PRIMARY KEY,
  snap pg_snapshot NOT NULL,
  at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Each transform's progress through its lifecycle.
CREATE TABLE @schema@.pipeline (
  transform_id int PRIMARY KEY REFERENCES @schema@.transforms ON DELETE CASCADE,
  phase text NOT NULL DEFAULT 'waiting_to_backfill'
    CHECK (phase IN ('waiting_to_backfill', 'backfilling', 'catching_up', 'live')),
  -- Empty the target before the next backfill (a rebuild).
  rebuild boolean NOT NULL DEFAULT false,
  -- The last tick whose changes are all applied; NULL before the first backfill starts.
  cursor_tick bigint,
  -- Backfill progress: the last driving-table key filled, keys done and in all (estimate).
  backfill_position text[],
  -- A projection or join backfills in 'rows' chunks; a GROUP BY transform in one 'groups'
  -- statement that fills its key map too ('repair' re-derives its groups key by key when
  -- that fails on a row). See src/engine/drain/backfill.ts.
  backfill_stage text NOT NULL DEFAULT 'rows' CHECK (backfill_stage IN ('rows', 'groups', 'repair')),
  backfill_done bigint NOT NULL DEFAULT 0,
  -- A build into an empty target drops the target's (and key map's) indexes and key
  -- constraint, and adds them back when it is done: one index build instead of index
  -- inserts row by row. What re-creates them waits here meanwhile.
  deferred_ddl text[],
  backfill_total bigint,
  backfill_started_at timestamptz,
  live_since timestamptz,
  -- The range of ticks being drained, and its pages still to do.
  open_lo bigint,
  open_hi bigint,
  open_pages int,
  pages_left int,
  -- A failing backfill: attempts, latest error, when it is tried again.
  build_attempts int NOT NULL DEFAULT 0,
  build_error text,
  build_next_at timestamptz,
  updated_at timestamptz NOT NULL DEFAULT now()
);

-- A build that deferred its target's key (deferred_ddl above) puts it back now: a transform
-- being defined over that target needs its key, and will look rows up by it. Waits for the
-- chunk being filled (it holds the pipeline row).
CREATE FUNCTION @schema@._restore_deferred_ddl(target oid)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
  building int;
  ddl text;
BEGIN
  SELECT p.transform_id INTO building
    FROM @schema@.pipeline p JOIN @schema@.transforms t ON t.id = p.transform_id
   WHERE t.target_oid = target AND p.deferred_ddl IS NOT NULL
     FOR UPDATE OF p;
  IF building IS NULL THEN RETURN; END IF;
  FOR ddl IN SELECT unnest(deferred_ddl) FROM @schema@.pipeline WHERE transform_id = building LOOP
    EXECUTE ddl;
  END LOOP;
  UPDATE @schema@.pipeline SET deferred_ddl = NULL WHERE transform_id = building;
END
$fn$;

-- Pages of an open range not yet applied. A drain claims one with FOR UPDATE SKIP LOCKED
-- and deletes it in the transaction that applies it; a claim dies with its session.
CREATE TABLE @schema@.pages (
  transform_id int NOT NULL REFERENCES @schema@.pipeline ON DELETE CASCADE,
  page int NOT NULL,
  -- A big range is split by ledger blocks: generation gen, blocks blk_lo up to (not
  -- including) blk_hi. NULL for a range small enough to be one page.
  gen smallint,
  blk_lo bigint,
  blk_hi bigint,
  -- A page takes only the keys whose hash falls in its bucket (of `buckets`): pages of
  -- different buckets hold different keys, so they can be applied at once.
  bucket smallint NOT NULL DEFAULT 0,
  buckets smallint NOT NULL DEFAULT 1,
  attempts int NOT NULL DEFAULT 0,
  error text,
  sqlstate text,
  first_failed_at timestamptz,
  last_failed_at timestamptz,
  not_before timestamptz,
  PRIMARY KEY (transform_id, page)
);

-- One row per (transform, bucket): a drain applying a page locks its bucket's slot, so
-- pages of one bucket (which may share keys, and so target rows) apply one at a time.
CREATE TABLE @schema@.page_slots (
  transform_id int NOT NULL REFERENCES @schema@.pipeline ON DELETE CASCADE,
  bucket smallint NOT NULL,
  PRIMARY KEY (transform_id, bucket)
);

-- Source keys a transform's re-derivation failed on: held back from that transform (every
-- other key, and every other transform, goes on) until released.
CREATE TABLE @schema@.held_keys (
  transform_id int NOT NULL REFERENCES @schema@.transforms ON DELETE CASCADE,
  source_id int NOT NULL,
  key text[] NOT NULL,
  error text NOT NULL,
  sqlstate text,
  held_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (transform_id, source_id, key)
);

-- A transform's pipeline row comes with it.
CREATE FUNCTION @schema@._pipeline_for_new_transform()
RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  INSERT INTO @schema@.pipeline (transform_id) VALUES (NEW.id);
  RETURN NULL;
END
$fn$;
CREATE TRIGGER pipeline_for_new_transform AFTER INSERT ON @schema@.transforms
  FOR EACH ROW EXECUTE FUNCTION @schema@._pipeline_for_new_transform();

-- Sends a transform back to be built again from its sources (after a change the ledger
-- cannot replay: a new column, a resumed column, a repaired capture, a TRUNCATE).
CREATE FUNCTION @schema@._request_rebuild(transform_id int)
RETURNS void LANGUAGE sql AS $fn$
  UPDATE @schema@.pipeline
     SET phase = 'waiting_to_backfill', rebuild = true, backfill_stage = 'rows',
         open_lo = NULL, open_hi = NULL,
         open_pages = NULL, pages_left = NULL, backfill_position = NULL, backfill_done = 0,
         backfill_total = NULL, build_attempts = 0, build_error = NULL, build_next_at = NULL,
         updated_at = now()
   WHERE pipeline.transform_id = _request_rebuild.transform_id;
  DELETE FROM @schema@.pages WHERE pages.transform_id = _request_rebuild.transform_id;
$fn$;
