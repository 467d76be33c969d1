import type postgres from 'postgres';
import { Trellis } from '../../src/engine/index.js';
import type { CaptureMode, ConnectOptions } from '../../src/engine/options.js';
import { waitFor } from './trellis.js';

/**
 * The capture the suite runs with: `TRELLIS_TEST_CAPTURE=logical` runs every test file
 * with WAL capture (ADR 0023), on the suite's cluster (wal_level = logical); unset, with
 * triggers, the default.
 */
export const TEST_CAPTURE: CaptureMode =
  process.env.TRELLIS_TEST_CAPTURE === 'logical' ? 'logical' : 'trigger';

/** `Trellis.connect` as the engine has it, whatever the suite's capture. */
export const plainConnect: (options: ConnectOptions) => Promise<Trellis> =
  Trellis.connect.bind(Trellis);

/**
 * Under TRELLIS_TEST_CAPTURE=logical, every handle a test (or a fixture process) makes to
 * run a staging worker records WAL capture unless it says otherwise, so the instance's
 * staging worker moves its sources to the slot. Only those: the role that runs the
 * staging worker is the one that needs REPLICATION (a handle that records the setting
 * must have it), and the others (calls, migrations, a TLS login) need nothing new. A test
 * support switch, not an option of the engine: the engine's own default stays 'trigger'.
 */
export function applyTestCapture(): void {
  if (TEST_CAPTURE === 'trigger') return;
  Trellis.connect = (options: ConnectOptions) =>
    plainConnect(options.staging ? { capture: TEST_CAPTURE, ...options } : options);
}

/**
 * Waits until every source of the instance installed in schema `trellis` of `sql`'s
 * database is captured from the slot alone: decoded from the WAL and its triggers gone.
 * Making a slot waits for every transaction running in the cluster (Postgres builds its
 * snapshot so): another test file's long or prepared transaction can hold it a while, and
 * the sources stay on triggers meanwhile, as designed (ADR 0023); hence the long default.
 */
export async function waitUntilOnTheSlot(sql: postgres.Sql, timeoutMs = 180_000): Promise<void> {
  await waitFor(
    async () => {
      const [row] = await sql<{ n: number }[]>`
        SELECT count(*)::int AS n FROM trellis.sources
         WHERE wal_state IS DISTINCT FROM 'ready' OR installed_at IS NOT NULL`;
      return row?.n === 0;
    },
    'every source captured from the slot alone',
    timeoutMs,
  );
}
