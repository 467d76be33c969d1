-- The instance's settings: one row, written by the first install.
CREATE TABLE @schema@.config (
  singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  -- Where `apply()` creates targets. Handles connecting with another targetSchema are refused.
  target_schema name NOT NULL,
  installed_at timestamptz NOT NULL DEFAULT now()
);
