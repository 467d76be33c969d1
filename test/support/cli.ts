import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { afterAll } from 'vitest';

/** The CLI as a user runs it: a process of its own, from the source through tsx. */
const MAIN = fileURLToPath(new URL('../../src/cli/main.ts', import.meta.url));
export const CLI_COMMAND = [process.execPath, '--import', 'tsx', MAIN] as const;

export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs `trellis <args>` to the end. DATABASE_URL is unset unless `env` sets it. */
export function trellisCli(
  args: string[],
  env: Record<string, string | undefined> = {},
): Promise<CliResult> {
  return new Promise((resolve) => {
    execFile(
      CLI_COMMAND[0],
      [...CLI_COMMAND.slice(1), ...args],
      {
        env: { ...process.env, DATABASE_URL: undefined, ...env },
        timeout: 150_000,
        // `trellis sql install` prints every migration: over execFile's 1 MiB default since
        // schema version 60 (the child is killed at the limit, code -1).
        maxBuffer: 64 * 1024 * 1024,
      },
      (error, stdout, stderr) => {
        const code = error ? (typeof error.code === 'number' ? error.code : -1) : 0;
        resolve({ code, stdout, stderr });
      },
    );
  });
}

const running = new Set<ChildProcess>();
afterAll(() => {
  for (const child of running) child.kill('SIGKILL');
});

/** Starts `trellis <args>` and leaves it running; killed when the file ends. */
export function spawnTrellisCli(
  args: string[],
  env: Record<string, string | undefined> = {},
): ChildProcess & { output: { stdout: string; stderr: string }; exited: Promise<number | null> } {
  const child = spawn(CLI_COMMAND[0], [...CLI_COMMAND.slice(1), ...args], {
    env: { ...process.env, DATABASE_URL: undefined, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  running.add(child);
  const output = { stdout: '', stderr: '' };
  child.stdout.on('data', (chunk: Buffer) => {
    output.stdout += chunk.toString();
  });
  child.stderr.on('data', (chunk: Buffer) => {
    output.stderr += chunk.toString();
  });
  const exited = new Promise<number | null>((resolve) =>
    child.on('exit', (code) => {
      running.delete(child);
      resolve(code);
    }),
  );
  return Object.assign(child, { output, exited });
}

/**
 * Runs `trellis <args>` in this process (runCli, which main.ts binds to the process): for
 * tests of what commands print and exit with, without a process start each.
 */
export async function trellisInProcess(
  args: string[],
  env: Record<string, string | undefined> = {},
): Promise<CliResult> {
  const { runCli } = await import('../../src/cli/run.js');
  let stdout = '';
  let stderr = '';
  const code = await runCli(args, {
    out: (text) => {
      stdout += text;
    },
    err: (text) => {
      stderr += text;
    },
    env,
  });
  return { code, stdout, stderr };
}
