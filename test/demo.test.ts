import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { serverInfo, sqlClient } from './support/database.js';

// `npm run demo` as a newcomer runs it: a child process, with its own throwaway Postgres
// (and, second, with DATABASE_URL pointing at the suite's server).
const repo = fileURLToPath(new URL('..', import.meta.url));
const TARGETS = ['customer_labels', 'large_orders', 'large_open_orders'];

function runDemo(
  env: Record<string, string | undefined>,
): Promise<{ code: number; output: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', 'examples/demo.ts'], {
      cwd: repo,
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    child.stdout.on('data', (chunk: Buffer) => {
      output += chunk.toString();
    });
    child.stderr.on('data', (chunk: Buffer) => {
      output += chunk.toString();
    });
    // SIGINT, not SIGKILL: the demo then stops the cluster it started.
    const timer = setTimeout(() => child.kill('SIGINT'), 110_000); // a deadline, not a wait
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code: code ?? -1, output });
    });
  });
}

function expectSuccess({ code, output }: { code: number; output: string }): void {
  expect(code, output).toBe(0);
  for (const target of TARGETS) {
    expect(output, output).toMatch(new RegExp(`\\b${target}\\s+live\\b`));
    expect(output, output).toContain(`✓ ${target} matches its definition`);
  }
  expect(output, output).toContain('shut down cleanly');
}

describe('npm run demo', () => {
  it('runs end to end on its own Postgres and exits 0', { timeout: 120_000 }, async () => {
    expectSuccess(await runDemo({ DATABASE_URL: undefined }));
  });

  it('uses DATABASE_URL in a database of its own, and drops it', { timeout: 120_000 }, async () => {
    const { adminUrl } = serverInfo();
    const result = await runDemo({ DATABASE_URL: adminUrl });
    expectSuccess(result);
    const name = /DATABASE_URL's server, database (trellis_demo_\w+)/.exec(result.output)?.[1];
    expect(name, result.output).toBeDefined();
    const admin = sqlClient(adminUrl, { max: 1 });
    try {
      expect(await admin`SELECT 1 FROM pg_database WHERE datname = ${name!}`).toHaveLength(0);
    } finally {
      await admin.end({ timeout: 2 });
    }
  });
});
