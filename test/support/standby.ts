import { execFile } from 'node:child_process';
import { chmod, chown, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { binariesOnPath, freePort, unprivilegedUser } from '../../src/testing/cluster.js';
import type { TestPostgres } from '../../src/testing/index.js';

const run = promisify(execFile);

/** A streaming standby of a cluster the suite started, made with `pg_basebackup -R`. */
export interface Standby {
  /** A URL for `database` on the standby. */
  url(database: string): string;
  /** `pg_ctl promote`: the standby becomes a primary (a failover). */
  promote(): Promise<void>;
  /** Stops it and deletes its directory. */
  stop(): Promise<void>;
}

/**
 * Starts a standby of `primary` (a local cluster: `kind: 'path'`), on a free loopback
 * port, in a directory of its own, run as the same OS user as the primary. Stop it when
 * the test ends.
 */
export async function startStandby(primary: TestPostgres): Promise<Standby> {
  const binaries = binariesOnPath();
  if (!binaries) throw new Error('initdb, pg_ctl and postgres are not all on PATH');
  const runAs = await unprivilegedUser();
  const dir = await mkdtemp(join(tmpdir(), 'trellis-standby-'));
  await chmod(dir, 0o755);
  if (runAs) await chown(dir, runAs.uid, runAs.gid);
  const data = join(dir, 'data');
  const exec = (file: string, args: string[]) =>
    run(file, args, { ...(runAs ?? {}), cwd: dir, env: { ...process.env, LC_ALL: 'C' } });
  const source = new URL(primary.adminUrl);
  const port = await freePort();
  let started = false;
  const stop = async () => {
    if (started) {
      await exec(binaries.pgCtl, ['-D', data, '-m', 'immediate', '-w', 'stop']).catch(() => {});
      started = false;
    }
    await rm(dir, { recursive: true, force: true });
  };
  try {
    await exec('pg_basebackup', [
      '-D',
      data,
      '-R',
      '-X',
      'stream',
      '-c',
      'fast',
      '-h',
      source.hostname,
      '-p',
      source.port,
      '-U',
      'postgres',
    ]);
    // The primary's settings came with the copy; later lines win.
    const conf = join(data, 'postgresql.auto.conf');
    const { readFile } = await import('node:fs/promises');
    await writeFile(
      conf,
      `${await readFile(conf, 'utf8')}\nport = ${port}\nunix_socket_directories = '${dir}'\n`,
    );
    if (runAs) await chown(conf, runAs.uid, runAs.gid);
    await exec(binaries.pgCtl, ['-D', data, '-l', join(dir, 'server.log'), '-w', 'start']);
    started = true;
  } catch (error) {
    await stop();
    throw error;
  }
  return {
    url(database: string) {
      return `postgres://postgres@127.0.0.1:${port}/${encodeURIComponent(database)}`;
    },
    async promote() {
      await exec(binaries.pgCtl, ['-D', data, '-w', 'promote']);
    },
    stop,
  };
}
