-- Rows that arrive or leave without DML (issue #9, ADR 0010): ATTACH PARTITION, DETACH
-- PARTITION, INHERIT / NO INHERIT, DROP of a partition. The staging worker keeps the
-- members of each captured source (its partitions and children at every level) and,
-- when they change, re-derives the keys of the rows that came or went (a correction).

-- A captured source's members as the staging worker last saw them. `members_at` on
-- sources says when they were first recorded (before that there is nothing to compare).
ALTER TABLE @schema@.sources ADD COLUMN members_at timestamptz;
CREATE TABLE @schema@.source_members (
  source_id int NOT NULL REFERENCES @schema@.sources ON DELETE CASCADE,
  relid oid NOT NULL,
  PRIMARY KEY (source_id, relid)
);

-- A node whose rows came (attached) or went (detached) while capture saw nothing: its
-- keys go into the ledger chunk by chunk, as changes of the source, in key order after
-- `position`; `keys_total` is an estimate (NULL until counted).
CREATE TABLE @schema@.corrections (
  source_id int NOT NULL REFERENCES @schema@.sources ON DELETE CASCADE,
  relid oid NOT NULL,
  -- schema.table of the node, for status() (the table may be renamed later).
  node text NOT NULL,
  since timestamptz NOT NULL DEFAULT now(),
  keys_total bigint,
  keys_done bigint NOT NULL DEFAULT 0,
  position text[],
  PRIMARY KEY (source_id, relid)
);

-- The partitions and children of a table at every level (not the table itself).
CREATE FUNCTION @schema@._descendants(rel oid)
RETURNS SETOF oid LANGUAGE sql STABLE AS $fn$
  WITH RECURSIVE tree(relid) AS (
    SELECT i.inhrelid FROM pg_inherits i WHERE i.inhparent = rel
    UNION SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid)
  SELECT relid FROM tree
$fn$;

-- Records a source's members as they are now (at install, under its lock).
CREATE FUNCTION @schema@._record_members(p_source_id int)
RETURNS void LANGUAGE sql AS $fn$
  DELETE FROM @schema@.source_members WHERE source_id = p_source_id;
  INSERT INTO @schema@.source_members (source_id, relid)
  SELECT src.id, d FROM @schema@.sources src, @schema@._descendants(src.source_oid) d
   WHERE src.id = p_source_id;
  UPDATE @schema@.sources SET members_at = now() WHERE id = p_source_id;
$fn$;

-- Whether every source of a transform has its rows where capture last saw them: members
-- unchanged since the staging worker last looked, and no correction left to queue. A
-- watermark covers a transform only then (an ATTACH committed before the token may not
-- have been noticed yet).
CREATE FUNCTION @schema@._sources_settled(p_transform_id int)
RETURNS boolean LANGUAGE sql STABLE AS $fn$
  SELECT NOT EXISTS (
    SELECT 1 FROM @schema@.transform_sources ts
      JOIN @schema@.sources src ON src.source_oid = ts.source_oid
     WHERE ts.transform_id = p_transform_id
       AND (EXISTS (SELECT 1 FROM @schema@.corrections c WHERE c.source_id = src.id)
            OR (src.members_at IS NOT NULL AND EXISTS (
                  (SELECT d FROM @schema@._descendants(src.source_oid) d
                   EXCEPT SELECT m.relid FROM @schema@.source_members m WHERE m.source_id = src.id)
                  UNION ALL
                  (SELECT m.relid FROM @schema@.source_members m WHERE m.source_id = src.id
                   EXCEPT SELECT d FROM @schema@._descendants(src.source_oid) d)))))
$fn$;
