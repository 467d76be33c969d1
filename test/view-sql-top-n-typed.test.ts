import { describe, it } from 'vitest';
import { livePipeline } from './support/live.js';
import type { Definition } from './support/oracle.js';

// rank() and dense_rank() top-N (ADR 0065) compare ORDER BY values with their own type's
// equality (ADR 0076), as Postgres ranks them: numeric 1.0, 1.00 and 1 are one value and
// share a rank, though their texts differ (the engine compared them as text before). Each
// target is compared with the statement as written, run by Postgres, through writes that
// make and break such ties.

const live = livePipeline({
  drainThreads: 1,
  setup: async (db) => {
    await db.sql.unsafe(`
      CREATE TABLE tn_scores (id int PRIMARY KEY, team int NOT NULL, score numeric, at timestamptz NOT NULL);
      CREATE INDEX ON tn_scores (team);
      INSERT INTO tn_scores VALUES
        (1, 1, 1.0, '2026-01-01'), (2, 1, 1.00, '2026-01-02'), (3, 1, 1, '2026-01-03'),
        (4, 1, 2.5, '2026-01-04'), (5, 1, 2.50, '2026-01-05'), (6, 1, 3, '2026-01-06'),
        (7, 2, 10.000, '2026-01-01'), (8, 2, 10, '2026-01-02'), (9, 2, NULL, '2026-01-03'),
        (10, 2, 9.9, '2026-01-04'), (11, 3, 0.0, '2026-01-01'), (12, 3, -0.00, '2026-01-02'),
        (13, 3, 0.10, '2026-01-03'), (14, 3, 0.1, '2026-01-04');`);
  },
});

const ranked: Definition = {
  form: 'as',
  target: 'tn_ranked',
  select: 'r.id, r.team, r.score, r.rk',
  from: `(SELECT id, team, score, rank() OVER (PARTITION BY team ORDER BY score) AS rk
          FROM tn_scores) AS r WHERE r.rk <= 4`,
};
const dense: Definition = {
  form: 'as',
  target: 'tn_dense',
  select: 'd.id, d.team, d.score, d.dr',
  from: `(SELECT id, team, score, dense_rank() OVER (PARTITION BY team ORDER BY score DESC) AS dr
          FROM tn_scores) AS d WHERE d.dr <= 2`,
};
// An order expression over a column (its type numeric), ranked over the whole table.
const overall: Definition = {
  form: 'as',
  target: 'tn_overall',
  select: 'o.id, o.team, o.rk',
  from: `(SELECT id, team, dense_rank() OVER (PARTITION BY team ORDER BY score * 2 NULLS FIRST) AS rk
          FROM tn_scores) AS o WHERE o.rk < 3`,
};

// Several order expressions: values equal in order but not in text in each of them
// (numeric scale; float8 zero and minus zero), compared with the type's equality too.
const multi: Definition = {
  form: 'as',
  target: 'tn_multi',
  select: 'm.id, m.team, m.score, m.rk',
  from: `(SELECT id, team, score, rank() OVER (PARTITION BY team ORDER BY score, score * 1) AS rk
          FROM tn_scores) AS m WHERE m.rk <= 4`,
};
const multiDense: Definition = {
  form: 'as',
  target: 'tn_multi_dense',
  select: 'md.id, md.team, md.dr',
  from: `(SELECT id, team, dense_rank() OVER (PARTITION BY team ORDER BY score DESC NULLS LAST,
                   CASE WHEN id % 2 = 0 THEN '-0'::float8 ELSE 0::float8 END) AS dr
          FROM tn_scores) AS md WHERE md.dr <= 3`,
};

const steps = [
  // Ties made in another scale, and broken.
  `INSERT INTO tn_scores VALUES (15, 1, 1.000, '2026-02-01'), (16, 2, 9.90, '2026-02-01'),
     (17, 4, 5.0, '2026-02-01'), (18, 4, 5.00, '2026-02-02');
   UPDATE tn_scores SET score = 3.00 WHERE id = 4;`,
  // The lowest value's rows deleted but one; a row moved to another team with an equal value.
  `DELETE FROM tn_scores WHERE id IN (1, 3, 15);
   UPDATE tn_scores SET team = 3, score = 0.100 WHERE id = 10;
   UPDATE tn_scores SET score = NULL WHERE id = 12;`,
  `UPDATE tn_scores SET score = 10.0 WHERE id = 9;
   INSERT INTO tn_scores VALUES (19, 3, 0.00, '2026-03-01'), (20, 1, 2.5000, '2026-03-01');`,
];

describe('rank() and dense_rank() top-N over values equal in order but not in text', () => {
  it('rank equal values alike, through writes, compared with Postgres', {
    timeout: 120_000,
  }, async () => {
    const all = [ranked, dense, overall, multi, multiDense];
    await live.define(...all);
    await live.converged(all);
    for (const step of steps) {
      await live.db.sql.unsafe(step);
      await live.converged(all);
    }
  });
});
