import { KeySpace, type WorkloadShape } from './workload.js';

/**
 * The accounts workload (see workload.ts): one table for projections, filters and chains,
 * and a second (branches) for a join; accounts' owner for GROUP BY.
 */

/** Branches 1..30 exist at first; accounts also name 31..36, and none. */
export const INITIAL_BRANCHES = 30;

export const ACCOUNTS_DDL = `
  CREATE TABLE branches (id int PRIMARY KEY, city text NOT NULL);
  CREATE TABLE accounts (
    id int PRIMARY KEY, owner text NOT NULL, balance numeric NOT NULL,
    status text NOT NULL, tag int NOT NULL DEFAULT 0, branch_id int);
  CREATE INDEX ON accounts (branch_id);
  CREATE INDEX ON accounts (owner);`;

/** Rows for ACCOUNTS_DDL: accounts 1..rows, branches 1..30 (some accounts name none or a missing one). */
export function seedAccounts(rows: number): string {
  return `
    INSERT INTO branches SELECT g, 'city' || (g % 7) FROM generate_series(1, ${INITIAL_BRANCHES}) g;
    INSERT INTO accounts (id, owner, balance, status, branch_id)
    SELECT g, 'owner' || (g % 97), (g * 7919) % 1000, CASE WHEN g % 3 = 0 THEN 'closed' ELSE 'active' END,
           CASE WHEN g % 11 = 0 THEN NULL ELSE 1 + g % (${INITIAL_BRANCHES} + 6) END
      FROM generate_series(1, ${rows}) g;`;
}

/**
 * Writes to accounts and branches: single and multi-row inserts, updates moving rows in
 * and out of filters and groups, deletes, key changes (to new keys, and onto keys that
 * may exist: unique violations), bulk inserts, updates of a column nothing reads (`tag`),
 * rows moving between branches, branches changing, coming, going and changing key.
 */
export function accountsWorkload(initialRows: number): WorkloadShape {
  return {
    tables: ['accounts', 'branches'],
    writer(dice, writer, writers) {
      const ids = new KeySpace(dice, initialRows, writer, writers, 10_000_000);
      const branchIds = new KeySpace(dice, INITIAL_BRANCHES, writer, writers, 100_000);
      const status = () => (dice.chance(0.6) ? 'active' : dice.chance(0.5) ? 'closed' : 'frozen');
      const amount = () => dice.below(2000) - 200;
      const owner = () => `o${dice.below(50)}`;
      const branch = () =>
        dice.chance(0.1)
          ? 'NULL'
          : dice.chance(0.85)
            ? String(dice.int(INITIAL_BRANCHES + 6))
            : String(branchIds.existing());
      const row = () => `(${ids.fresh()}, '${owner()}', ${amount()}, '${status()}', ${branch()})`;
      const statements: Array<readonly [number, () => string]> = [
        [10, () => `INSERT INTO accounts (id, owner, balance, status, branch_id) VALUES ${row()}`],
        [
          3,
          () =>
            `INSERT INTO accounts (id, owner, balance, status, branch_id) VALUES ${row()}, ${row()}, ${row()}`,
        ],
        [
          5,
          () => {
            const first = ids.fresh(10);
            return `INSERT INTO accounts (id, owner, balance, status, branch_id)
                    SELECT g, 'multi', g % 300, 'active', 1 + g % 40
                      FROM generate_series(${first}, ${first + 9}) g`;
          },
        ],
        [
          15,
          () =>
            `UPDATE accounts SET balance = ${amount()}, status = '${status()}' WHERE id = ${ids.existing()}`,
        ],
        [
          5,
          () => {
            const from = ids.existing();
            return `UPDATE accounts SET balance = balance + ${amount()} WHERE id BETWEEN ${from} AND ${from + 30}`;
          },
        ],
        [6, () => `DELETE FROM accounts WHERE id = ${ids.existing()}`],
        [
          2,
          () => {
            const from = ids.existing();
            return `DELETE FROM accounts WHERE id BETWEEN ${from} AND ${from + 20}`;
          },
        ],
        [4, () => `UPDATE accounts SET id = ${ids.fresh()} WHERE id = ${ids.existing()}`],
        [2, () => `UPDATE accounts SET id = ${ids.existing()} WHERE id = ${ids.existing()}`],
        [
          1,
          () => {
            const from = ids.existing();
            return `UPDATE accounts SET id = id - ${from} + ${ids.fresh(6)} WHERE id BETWEEN ${from} AND ${from + 5}`;
          },
        ],
        [4, () => `UPDATE accounts SET owner = owner || 'x' WHERE id = ${ids.existing()}`],
        [4, () => `UPDATE accounts SET tag = tag + 1 WHERE id = ${ids.existing()}`],
        [
          1,
          () => {
            const first = ids.fresh(2000);
            return `INSERT INTO accounts (id, owner, balance, status, branch_id)
                    SELECT g, 'bulk' || (g % 13), g % 900, CASE WHEN g % 2 = 0 THEN 'active' ELSE 'closed' END, g % 50
                      FROM generate_series(${first}, ${first + 1999}) g`;
          },
        ],
        [
          3,
          () => {
            const from = ids.existing();
            return `UPDATE accounts SET branch_id = ${branch()} WHERE id BETWEEN ${from} AND ${from + 3}`;
          },
        ],
        [2, () => `UPDATE branches SET city = 'city${dice.below(9)}' WHERE id = ${branch()}`],
        [
          1,
          () =>
            `INSERT INTO branches VALUES (${dice.chance(0.5) ? branchIds.fresh() : dice.int(INITIAL_BRANCHES + 6)}, 'city${dice.below(9)}')
               ON CONFLICT (id) DO UPDATE SET city = excluded.city`,
        ],
        [1, () => `DELETE FROM branches WHERE id = ${branch()}`],
        [
          1,
          () =>
            `UPDATE branches SET id = ${dice.chance(0.5) ? branchIds.fresh() : dice.int(INITIAL_BRANCHES + 6)} WHERE id = ${dice.int(INITIAL_BRANCHES + 6)}`,
        ],
      ];
      return {
        statement: () => dice.weighted(statements)(),
        truncate: () => 'TRUNCATE accounts',
      };
    },
  };
}
