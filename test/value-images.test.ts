import { describe, it } from 'vitest';
import { livePipeline } from './support/live.js';
import type { Definition } from './support/oracle.js';

// "Changes" means a different value image, not the type's = (ENGINE.md, capture): an
// UPDATE to a value equal to the old one but written differently must reach the target,
// which compares by exact text (the oracle: 1.0 is not 1.00).

const live = livePipeline({
  drainThreads: 1,
  setup: async (db) => {
    await db.sql.unsafe(`
      CREATE EXTENSION IF NOT EXISTS citext;
      CREATE COLLATION case_blind (provider = icu, locale = 'und-u-ks-level2', deterministic = false);`);
  },
});

describe('value images', () => {
  it('numeric scale, negative zero and case under citext or a case-blind collation are changes', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE images (id int PRIMARY KEY, amount numeric, ratio float8, nick citext,
                           label text COLLATE case_blind, doc json, g text COLLATE case_blind);
      INSERT INTO images VALUES (1, 1.0, 0, 'abc', 'abc', '{"a": 1}', 'x'), (2, 2.50, 1, 'Def', 'Def', '[]', 'y');`);
    const rows: Definition = {
      target: 'images_rows',
      from: 'images',
      select: 'amount, ratio, nick, label, doc',
      implicit: 'id',
    };
    // A GROUP BY keyed by a case-blind value: the group keeps its row, its key's image follows.
    const groups: Definition = {
      target: 'images_groups',
      from: 'images',
      select: 'g, sum(amount) AS total',
      groupBy: 'g',
    };
    await live.define(rows, groups);
    await live.converged([rows, groups], { floatTolerance: 0 });
    await live.db.sql.unsafe(`
      UPDATE images SET amount = 1.00 WHERE id = 1;
      UPDATE images SET ratio = '-0' WHERE id = 1;
      UPDATE images SET nick = 'ABC', label = 'ABC' WHERE id = 1;
      UPDATE images SET doc = '{"a":1}' WHERE id = 1;
      UPDATE images SET amount = 2.5 WHERE id = 2;
      UPDATE images SET g = 'X' WHERE id = 1;`);
    await live.converged([rows, groups], { floatTolerance: 0 });
  });

  it('a key changed only in case (case-blind collation) or only in scale moves the target row with it', async () => {
    await live.db.sql.unsafe(`
      CREATE TABLE keyed_ci (code text COLLATE case_blind PRIMARY KEY, v int);
      CREATE TABLE keyed_num (n numeric PRIMARY KEY, v int);
      INSERT INTO keyed_ci VALUES ('alpha', 1), ('Beta', 2);
      INSERT INTO keyed_num VALUES (1.0, 1), (2, 2);`);
    const ci: Definition = { target: 'keyed_ci_t', from: 'keyed_ci', select: 'code, v' };
    const num: Definition = { target: 'keyed_num_t', from: 'keyed_num', select: 'n, v' };
    await live.define(ci, num);
    await live.converged([ci, num], { floatTolerance: 0 });
    await live.db.sql.unsafe(`
      UPDATE keyed_ci SET code = 'ALPHA' WHERE code = 'alpha';
      UPDATE keyed_num SET n = 1.000 WHERE n = 1;
      UPDATE keyed_num SET n = 2.0, v = 20 WHERE n = 2;`);
    await live.converged([ci, num], { floatTolerance: 0 });
  });
});
