import { existsSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { startPostgres } from '../src/testing/index.js';
import { serverInfo } from './support/database.js';
import { killHard, startFixture } from './support/processes.js';
import { waitFor } from './support/trellis.js';

function running(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

describe('startPostgres options', () => {
  const kind = serverInfo().kind;
  it.runIf(kind === 'path' || kind === 'embedded')(
    'durable turns fsync on, settings reach postgresql.conf, and url reuses a running server',
    async () => {
      const server = await startPostgres({
        kind: kind as 'path' | 'embedded',
        durable: true,
        settings: { work_mem: "'7MB'", application_name: "'harness-test'" },
      });
      try {
        const [row] = await server.adminQuery<{ fsync: string; work_mem: string; app: string }>(
          `SELECT current_setting('fsync') AS fsync, current_setting('work_mem') AS work_mem,
                  (SELECT setting FROM pg_file_settings WHERE name = 'application_name') AS app`,
        );
        expect(row).toEqual({ fsync: 'on', work_mem: '7MB', app: 'harness-test' });
        expect(server.serverVersion).toBe(serverInfo().serverVersion);
        expect(server.dataDirectory && existsSync(server.dataDirectory)).toBe(true);
        // kind 'url': the server given, not a new one; it creates and drops databases beside it.
        const reused = await startPostgres({ kind: 'url', url: server.adminUrl });
        const { name } = await reused.createDatabase();
        expect(
          await server.adminQuery<{ n: number }>(
            `SELECT count(*)::int AS n FROM pg_database WHERE datname = '${name}'`,
          ),
        ).toEqual([{ n: 1 }]);
        await reused.dropDatabase(name);
        expect(reused.dataDirectory).toBeUndefined();
        await expect(reused.restart()).rejects.toThrow('cannot be restarted');
        await reused.stop();
        // Stopping a 'url' server leaves it running.
        expect(await server.adminQuery('SELECT 1 AS one')).toEqual([{ one: 1 }]);
      } finally {
        await server.stop();
      }
      expect(existsSync(server.dataDirectory!)).toBe(false);
    },
  );

  it('refuses an unknown TRELLIS_TEST_PG', async () => {
    const before = process.env.TRELLIS_TEST_PG;
    process.env.TRELLIS_TEST_PG = 'docker';
    try {
      await expect(startPostgres()).rejects.toThrow(
        'TRELLIS_TEST_PG must be path, embedded or container',
      );
    } finally {
      if (before === undefined) delete process.env.TRELLIS_TEST_PG;
      else process.env.TRELLIS_TEST_PG = before;
    }
  });
});

// The harness's throwaway clusters never outlive the process that started them, however
// it ends: a run that hangs, times out or is killed leaves no Postgres behind.
describe('test harness', () => {
  const kind = serverInfo().kind;
  it.runIf(kind === 'path' || kind === 'embedded')(
    'stops and deletes a cluster whose process was killed -9',
    async () => {
      let output = '';
      const child = await startFixture('start-cluster.ts', [kind], 'ignore', (chunk) => {
        output += chunk;
      });
      const { dataDir, postmaster } = JSON.parse(output.split('\n')[0]!) as {
        dataDir: string;
        postmaster: number;
      };
      expect(running(postmaster)).toBe(true);
      await killHard(child);
      await waitFor(async () => !running(postmaster), 'the orphaned server to stop', 15_000);
      await waitFor(async () => !existsSync(dataDir), 'its directory to be deleted', 5_000);
    },
  );
});
