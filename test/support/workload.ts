import type postgres from 'postgres';

/** A small seeded PRNG (mulberry32): a failing seed replays the same choices. */
export function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export interface WorkloadOptions {
  seed: number;
  /** Concurrent writers. */
  clients: number;
  durationMs: number;
  /** Rows `accounts` starts with (ids 1..initialRows). */
  initialRows: number;
  /** Include an occasional TRUNCATE of the table. */
  truncate?: boolean;
  /**
   * Shrug off lost connections too (the server is being restarted under the workload).
   * Pass newClient then: each writer gets a client of its own and replaces it after a
   * lost connection (a postgres.js client reused after one can hang).
   */
  survivesRestarts?: boolean;
  /** Makes a client for one writer (instead of sharing the one passed in). */
  newClient?: () => postgres.Sql;
}

/** Errors concurrent writers can cause each other; the workload shrugs them off. */
const EXPECTED = new Set(['40P01', '40001', '23505', '55P03']);
/** What a server restart looks like to a client. */
const CONNECTION_LOST = new Set([
  '57P01',
  '57P02',
  '57P03',
  'CONNECTION_CLOSED',
  'CONNECTION_DESTROYED',
  'ECONNREFUSED',
  'ECONNRESET',
  'CONNECT_TIMEOUT',
]);

export const ACCOUNTS_DDL = `
  CREATE TABLE accounts (
    id int PRIMARY KEY, owner text NOT NULL, balance numeric NOT NULL,
    status text NOT NULL, tag int NOT NULL DEFAULT 0);`;

export function seedAccounts(rows: number): string {
  return `INSERT INTO accounts (id, owner, balance, status)
          SELECT g, 'owner' || (g % 97), (g * 7919) % 1000, CASE WHEN g % 3 = 0 THEN 'closed' ELSE 'active' END
            FROM generate_series(1, ${rows}) g`;
}

/**
 * Random writes to `accounts` from several clients at once, for the convergence tests:
 * single and multi-row inserts, updates moving rows in and out of filters, deletes,
 * key changes, transactions that roll back, bulk inserts, updates of uncaptured columns,
 * and (optionally) TRUNCATE. Returns how many statements committed.
 */
export async function runWorkload(shared: postgres.Sql, options: WorkloadOptions): Promise<number> {
  const random = prng(options.seed);
  let nextId = options.initialRows + 1;
  let committed = 0;
  const deadline = Date.now() + options.durationMs;
  const pick = () => 1 + Math.floor(random() * (nextId - 1));
  const status = () => (random() < 0.6 ? 'active' : random() < 0.5 ? 'closed' : 'frozen');
  const amount = () => Math.floor(random() * 2000) - 200;

  const operations: Array<
    [number, (tx: postgres.Sql | postgres.TransactionSql) => Promise<unknown>]
  > = [
    [
      10,
      (tx) =>
        tx`INSERT INTO accounts (id, owner, balance, status) VALUES (${nextId++}, ${`o${Math.floor(random() * 50)}`}, ${amount()}, ${status()})`,
    ],
    [
      5,
      (tx) => {
        const first = nextId;
        nextId += 10;
        return tx`INSERT INTO accounts (id, owner, balance, status)
                SELECT g, 'multi', g % 300, 'active' FROM generate_series(${first}::int, ${first + 9}::int) g`;
      },
    ],
    [
      15,
      (tx) =>
        tx`UPDATE accounts SET balance = ${amount()}, status = ${status()} WHERE id = ${pick()}`,
    ],
    [
      5,
      (tx) => {
        const from = pick();
        return tx`UPDATE accounts SET balance = balance + ${amount()} WHERE id BETWEEN ${from} AND ${from + 30}`;
      },
    ],
    [6, (tx) => tx`DELETE FROM accounts WHERE id = ${pick()}`],
    [
      2,
      (tx) => {
        const from = pick();
        return tx`DELETE FROM accounts WHERE id BETWEEN ${from} AND ${from + 20}`;
      },
    ],
    [4, (tx) => tx`UPDATE accounts SET id = ${nextId++} WHERE id = ${pick()}`],
    [4, (tx) => tx`UPDATE accounts SET owner = owner || 'x' WHERE id = ${pick()}`],
    [4, (tx) => tx`UPDATE accounts SET tag = tag + 1 WHERE id = ${pick()}`],
    [
      1,
      (tx) => {
        const first = nextId;
        nextId += 2000;
        return tx`INSERT INTO accounts (id, owner, balance, status)
                SELECT g, 'bulk' || (g % 13), g % 900, CASE WHEN g % 2 = 0 THEN 'active' ELSE 'closed' END
                  FROM generate_series(${first}::int, ${first + 1999}::int) g`;
      },
    ],
  ];
  const total = operations.reduce((sum, [weight]) => sum + weight, 0);
  const choose = () => {
    let r = random() * total;
    for (const [weight, op] of operations) {
      r -= weight;
      if (r < 0) return op;
    }
    return operations[0]![1];
  };

  const client = async () => {
    let sql = options.newClient ? options.newClient() : shared;
    while (Date.now() < deadline) {
      const roll = random();
      try {
        if (options.truncate && roll < 0.003) {
          await sql`TRUNCATE accounts`;
        } else if (options.survivesRestarts) {
          // No transactions here: postgres.js's begin() sends its ROLLBACK on the dead
          // connection and throws from a timer (porsager/postgres#1208).
          await choose()(sql);
          committed += 1;
        } else if (roll < 0.12) {
          // A multi-statement transaction that rolls back: none of it may show.
          await sql
            .begin(async (tx) => {
              for (let i = 0; i < 3; i += 1) await choose()(tx);
              throw new Error('rollback');
            })
            .catch((error: Error) => {
              if (error.message !== 'rollback') throw error;
            });
        } else if (roll < 0.25) {
          await sql.begin(async (tx) => {
            for (let i = 0; i < 3; i += 1) await choose()(tx);
          });
          committed += 3;
        } else {
          await choose()(sql);
          committed += 1;
        }
      } catch (error) {
        const code = (error as { code?: string }).code;
        if (code && options.survivesRestarts && CONNECTION_LOST.has(code)) {
          // A client that lost its connection is not reused (see isConnectionLoss).
          if (options.newClient) {
            void sql.end({ timeout: 0 });
            sql = options.newClient();
          }
          await new Promise((resolve) => setTimeout(resolve, 50));
          continue;
        }
        if (!code || !EXPECTED.has(code)) throw error;
      }
    }
    if (options.newClient) await sql.end({ timeout: 2 });
  };
  await Promise.all(Array.from({ length: options.clients }, client));
  return committed;
}
