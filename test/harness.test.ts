import { existsSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
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
