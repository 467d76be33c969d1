import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, rm, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const run = promisify(execFile);
const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');

/**
 * An earlier trellis-pg: the source tree of a commit of this repository, taken from git
 * into `.tmp/old-builds/<commit>` (ignored by git), where it runs on this checkout's
 * node_modules through tsx. Undefined when the commit is not in the clone (a shallow one):
 * the upgrade tests then skip, saying so.
 */
export async function oldBuild(commit: string): Promise<string | undefined> {
  try {
    await run('git', ['-C', root, 'cat-file', '-e', `${commit}^{commit}`]);
  } catch {
    return undefined;
  }
  const dir = join(root, '.tmp', 'old-builds', commit);
  if (existsSync(join(dir, '.complete'))) return dir;
  await rm(dir, { recursive: true, force: true });
  await mkdir(dir, { recursive: true });
  const archive = join(dir, 'tree.tar');
  await run('git', [
    '-C',
    root,
    'archive',
    '--format=tar',
    '-o',
    archive,
    commit,
    'src',
    'package.json',
  ]);
  await run('tar', ['-xf', archive, '-C', dir]);
  await rm(archive);
  await writeFile(join(dir, '.complete'), commit);
  return dir;
}

export interface OldScenario {
  /** TRANSFORM statements the earlier build defines, then waits to be live. */
  statements: Array<{ target: string; statement: string }>;
  /** Writes made while its workers run, right before it shuts down (some stay in flight). */
  writesWhileLive: string[];
}

/**
 * Runs the earlier build against `url` as a deploy of it would: migrate() to its schema,
 * a handle with a staging worker and two drain loops, the transforms defined and live, a
 * last burst of writes, and a shutdown. Fails with the child's output.
 */
export async function runOldBuild(dir: string, url: string, scenario: OldScenario): Promise<void> {
  const script = join(root, 'test', 'support', 'old-build-scenario.ts');
  try {
    await run(process.execPath, ['--import', 'tsx', script, dir, url, JSON.stringify(scenario)], {
      cwd: root,
      timeout: 120_000,
      maxBuffer: 16 * 1024 * 1024,
    });
  } catch (error) {
    const e = error as { stdout?: string; stderr?: string; message: string };
    throw new Error(
      `the earlier build at ${dir} failed: ${e.message}\n${e.stdout ?? ''}\n${e.stderr ?? ''}`,
    );
  }
}
