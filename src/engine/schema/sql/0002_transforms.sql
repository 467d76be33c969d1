-- Registered transforms: what `apply()` records for the engine that maintains them.

CREATE TABLE @schema@.transforms (
  id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  target_schema name NOT NULL,
  target_name name NOT NULL,
  -- The target table. Kept by OID so a rename of the target schema is followed.
  target_oid oid NOT NULL,
  -- The normalised statement: re-applying it defines the same transform (schema dumps).
  statement text NOT NULL,
  -- The parsed statement with every name resolved (see 0004_apply.sql).
  spec jsonb NOT NULL,
  -- Whether the SELECT list aggregates (GROUP BY, or aggregates without it: one row).
  aggregates boolean NOT NULL,
  without_source_index boolean NOT NULL DEFAULT false,
  -- The schemas names in expressions resolved through when the transform was defined; the
  -- engine re-derives rows with exactly this search_path.
  search_path text NOT NULL,
  -- Set while the whole transform is paused; reason: operator, build_failure,
  -- capture_failure, disruption, schema_change, quarantine.
  paused_at timestamptz,
  pause_reason text,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (target_schema, target_name)
);

-- The tables a transform reads: ordinal 0 is the FROM source, then each JOIN in order.
CREATE TABLE @schema@.transform_sources (
  transform_id int NOT NULL REFERENCES @schema@.transforms ON DELETE CASCADE,
  ordinal int NOT NULL,
  source_oid oid NOT NULL,
  source_schema name NOT NULL,
  source_name name NOT NULL,
  -- The name expressions use for this source (its table name when no alias was given).
  alias name NOT NULL,
  -- NULL for the FROM source; 'inner' or 'left' for a join.
  join_type text CHECK (join_type IN ('inner', 'left')),
  join_condition text,
  -- The source's primary key, and its column types (format_type).
  key_columns name[] NOT NULL,
  key_types text[] NOT NULL,
  -- The target columns holding this source's key; NULL when the transform aggregates.
  target_key_columns name[],
  -- Every column of this source the definition reads (capture watches these).
  read_columns name[] NOT NULL,
  -- This side's columns in the equi-join conditions, and in the GROUP BY (index gaps).
  join_columns name[] NOT NULL DEFAULT '{}',
  group_columns name[] NOT NULL DEFAULT '{}',
  PRIMARY KEY (transform_id, ordinal)
);

CREATE INDEX transform_sources_by_source ON @schema@.transform_sources (source_oid);

-- The target's columns, in order: the SELECT list, then any key columns Trellis added.
CREATE TABLE @schema@.transform_columns (
  transform_id int NOT NULL REFERENCES @schema@.transforms ON DELETE CASCADE,
  ordinal int NOT NULL,
  name name NOT NULL,
  expression text NOT NULL,
  -- format_type() of the column, as Postgres typed the expression; and its collation.
  type text NOT NULL,
  collation_name text,
  is_key boolean NOT NULL,
  -- Added by Trellis to carry the target's key; not in the SELECT list.
  implicit boolean NOT NULL DEFAULT false,
  -- The source columns the expression reads: [{"source": ordinal, "column": name}, ...].
  reads jsonb NOT NULL DEFAULT '[]',
  paused_at timestamptz,
  pause_reason text,
  PRIMARY KEY (transform_id, ordinal),
  UNIQUE (transform_id, name)
);
