import { describe, expect, it } from 'vitest';
import { latestVersion } from '../src/engine/schema/install-sql.js';
import { freshDatabase } from './support/database.js';
import { oldBuild, runOldBuild } from './support/old-build.js';
import { type Definition, expectMatchesDefinition, transformStatement } from './support/oracle.js';
import { migratedTrellis } from './support/trellis.js';

// Upgrades carry live transforms over (issue #21 item 4, ADR 0036): an instance left by an
// earlier trellis-pg (the commit of this repository whose schema was at that version, run
// from git) with transforms live, capture installed and writes still in the ledger, is
// upgraded by this one and converges with no RESUME, no pause and no rebuild.

/** The last commit of main at each schema version (its newest migration). */
const BUILDS: Record<number, string> = {
  8: 'b0fb1234f59c5a0c2243c611336ed073141dfd41',
  9: 'd3a4dbcdddbb2e5c54ebf1ccdc5ee63fc32750f2',
  10: '4dff4c7455a9ff709cbcfb2a4c19770902872eb3',
  11: '27f62c4b9b21bda24badfae8af99e42188648da1',
  12: '2b1aadbd141fd6e25051125fcfc902c086df3cfa',
  13: 'ffa345fdf4cf16661d4569fa427265df569b9afb',
  14: '4ae21fb3890b8ff052944e3a889d49845728e87e',
  15: '157b4690b0f4b85631a6843211702c9682e98d99',
  16: 'cf45c642134a8670b8aa6992048f84b3f735f4f1',
  17: '094a1ed26d14bac983e973c1008ae22971660350',
  18: 'cb524aecd0d99ec6b075b5d9c0e30484eec418be',
  23: '897c784b60c96c057408fe34b9b687fb947c8ba5',
  24: '6f550c98cb4695c56a31355b458a03d14a585aea',
  25: '712fac34c6f808961ce386ab50a8aae5c914bd6b',
  26: '0ac1a957c60b1f90839403ff44cd61a7c78c2abb',
  27: 'f74ddec6428aa5df5d0ea54440f2b6ad1be2060a',
  28: 'b3303d96d884f9144579b29eaaeddc2c22a569e7',
};

/** `npm test` runs these; a soak (TRELLIS_TEST_SOAK=1) runs every version above. */
const QUICK = [8, 11, 12, 18, 26];
const versions = process.env.TRELLIS_TEST_UPGRADE_FROM
  ? process.env.TRELLIS_TEST_UPGRADE_FROM.split(',').map(Number)
  : process.env.TRELLIS_TEST_SOAK
    ? Object.keys(BUILDS).map(Number)
    : QUICK;

const paid: Definition = {
  target: 'ug_paid',
  from: 'ug_orders',
  select: 'customer, amount',
  where: "status = 'paid'",
  implicit: 'id',
};
const totals: Definition = {
  target: 'ug_totals',
  from: 'ug_orders',
  select: 'customer, count(*) AS n, sum(amount) AS total',
  groupBy: 'customer',
};
const regions: Definition = {
  target: 'ug_regions',
  from: 'ug_orders o JOIN ug_customers c ON c.id = o.customer',
  select: 'o.amount, c.region',
  implicit: 'o.id AS id, c.id AS c_id',
};
// A join that multiplies rows (every order of a customer with every other): a key map per
// join row before schema version 33, a shadow of the sources from the next build after it
// (ADR 0051).
const pairs: Definition = {
  target: 'ug_pairs',
  from: 'ug_orders o JOIN ug_orders p ON p.customer = o.customer',
  select: 'o.customer AS customer, count(*) AS n, sum(p.amount) AS total',
  groupBy: 'o.customer',
};
const definitions = [paid, totals, regions, pairs];

describe('upgrades from an earlier trellis-pg', () => {
  it.each(versions)(
    'carries live transforms over from schema version %i',
    async (version) => {
      const dir = await oldBuild(BUILDS[version]!);
      if (!dir) {
        if (process.env.CI || process.env.TRELLIS_CI_RELOCATED) {
          throw new Error(`commit ${BUILDS[version]} (schema ${version}) is not in this clone`);
        }
        console.log(
          `[upgrades] skipped: commit ${BUILDS[version]} is not in this clone (shallow?)`,
        );
        return;
      }
      const db = await freshDatabase();
      await db.sql.unsafe(`
      CREATE TABLE ug_customers (id int PRIMARY KEY, region text NOT NULL);
      CREATE TABLE ug_orders (id int PRIMARY KEY, customer int NOT NULL, amount int NOT NULL,
                              status text NOT NULL);
      INSERT INTO ug_customers SELECT g, 'r' || (g % 3) FROM generate_series(1, 20) g;
      INSERT INTO ug_orders SELECT g, 1 + g % 20, g, CASE WHEN g % 2 = 0 THEN 'paid' ELSE 'open' END
        FROM generate_series(1, 400) g;`);
      await runOldBuild(dir, db.url, {
        statements: definitions.map((d) => ({
          target: d.target,
          statement: transformStatement(d),
        })),
        writesWhileLive: [
          `UPDATE ug_orders SET amount = amount + 1 WHERE id % 7 = 0`,
          `INSERT INTO ug_orders SELECT g, 1 + g % 20, g, 'paid' FROM generate_series(401, 450) g`,
          `UPDATE ug_customers SET region = 'moved' WHERE id = 3`,
        ],
      });
      const [before] = await db.sql.unsafe(`SELECT max(version)::int AS v FROM trellis.migrations`);
      expect(before?.v).toBe(version);
      // Writes with no worker running: in the ledger when the upgrade runs.
      await db.sql.unsafe(`
      UPDATE ug_orders SET status = 'paid' WHERE id % 5 = 0;
      DELETE FROM ug_orders WHERE id % 11 = 0;
      INSERT INTO ug_orders VALUES (451, 4, 451, 'paid');`);

      const trellis = await migratedTrellis(db, { staging: true, drainThreads: 2 });
      try {
        const [after] = await db.sql.unsafe(
          `SELECT max(version)::int AS v FROM trellis.migrations`,
        );
        expect(after?.v).toBe(latestVersion());
        const token = await trellis.watermarkToken();
        for (const d of definitions) {
          // A transform paused on the way fails this at once (ADR 0038).
          await trellis.awaitConverged(d.target, token, { timeoutMs: 30_000 });
          const status = await trellis.status(d.target);
          expect(status, d.target).toMatchObject({
            status: 'live',
            pauseReason: null,
            captureFailure: null,
          });
          await expectMatchesDefinition(db.sql, d);
        }
        // Nothing paused on the way (a pause and RESUME would rebuild).
        const paused = await db.sql.unsafe(
          `SELECT target_name FROM trellis.transforms WHERE paused_at IS NOT NULL`,
        );
        expect(paused).toEqual([]);
        // The join's map stays as it was until its next build, which makes it a shadow.
        const kind = async () =>
          (
            await db.sql.unsafe<{ kind: string }[]>(
              `SELECT spec->>'key_map' AS kind FROM trellis.transforms WHERE target_name = 'ug_pairs'`,
            )
          )[0]?.kind;
        expect(await kind()).toBe('groups');
        const [def] = (await trellis.definitions()).filter((d) => d.target === 'ug_pairs');
        expect(def?.maintenance.mode).toBe('group');
        await trellis.requestBackfill('ug_pairs');
        await db.sql.unsafe(`UPDATE ug_orders SET customer = 5 WHERE id % 13 = 0`);
        const rebuilt = await trellis.watermarkToken();
        await trellis.awaitConverged('ug_pairs', rebuilt, { timeoutMs: 30_000 });
        expect(await kind()).toBe('shadow');
        // Its count and sum are kept by delta over the shadow from then on (ADR 0067).
        const [rebuiltDef] = (await trellis.definitions()).filter((d) => d.target === 'ug_pairs');
        expect(rebuiltDef?.maintenance.mode).toBe('delta');
        await expectMatchesDefinition(db.sql, pairs);
      } finally {
        await trellis.shutdown();
      }
    },
    180_000,
  );
});
