import { readFileSync } from 'node:fs';
import type { ConnectionOptions as TlsOptions } from 'node:tls';
import { TrellisError } from '../errors.js';

/** The libpq `sslmode` values the URL may carry. */
export type SslMode = 'disable' | 'allow' | 'prefer' | 'require' | 'verify-ca' | 'verify-full';

const SSL_MODES: readonly SslMode[] = [
  'disable',
  'allow',
  'prefer',
  'require',
  'verify-ca',
  'verify-full',
];

/** URL parameters that configure TLS on the client; they are never sent to the server. */
const TLS_PARAMS = ['sslmode', 'sslrootcert', 'sslcert', 'sslkey', 'sslpassword'] as const;

export interface ConnectionConfig {
  /** The URL with the TLS parameters removed (they are carried by `ssl`). */
  url: string;
  ssl: false | 'prefer' | 'require' | TlsOptions;
  sslMode: SslMode;
  /** `user@host:port/database`, without the password, for messages. */
  description: string;
  database: string;
}

function readPem(param: string, path: string): Buffer {
  try {
    return readFileSync(path);
  } catch (cause) {
    throw new TrellisError('connection', `cannot read ${param} file "${path}"`, { cause });
  }
}

/**
 * Turns a Postgres URL into what the driver needs, with libpq's TLS semantics:
 * `sslmode=verify-full` checks the chain and the host name, `verify-ca` the chain only,
 * `require` encrypts without checking (unless `sslrootcert` is given, which makes it
 * `verify-ca`, as in libpq), `prefer`/`allow` encrypt when the server offers it.
 */
export function parseConnectionUrl(raw: string): ConnectionConfig {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    // No `cause`: Node's URL error carries the whole input (password included) in `input`,
    // and anyone logging this error would print it.
    throw new TrellisError(
      'connection',
      'the url is not a valid Postgres URL (expected postgres://user:password@host:port/database)',
    );
  }
  if (url.protocol !== 'postgres:' && url.protocol !== 'postgresql:') {
    throw new TrellisError(
      'connection',
      `the url must start with postgres:// or postgresql://, not ${url.protocol}//`,
    );
  }
  const params = Object.fromEntries(TLS_PARAMS.map((p) => [p, url.searchParams.get(p)]));
  for (const p of TLS_PARAMS) url.searchParams.delete(p);

  const modeParam = params.sslmode ?? 'prefer';
  if (!SSL_MODES.includes(modeParam as SslMode)) {
    throw new TrellisError(
      'connection',
      `sslmode=${modeParam} is not one of ${SSL_MODES.join(', ')}`,
    );
  }
  let sslMode = modeParam as SslMode;
  if (sslMode === 'require' && params.sslrootcert) sslMode = 'verify-ca';

  let ssl: ConnectionConfig['ssl'];
  if (sslMode === 'disable') ssl = false;
  else if (sslMode === 'allow' || sslMode === 'prefer') ssl = 'prefer';
  else if (sslMode === 'require') ssl = 'require';
  else {
    const tls: TlsOptions = { rejectUnauthorized: true };
    if (params.sslrootcert && params.sslrootcert !== 'system') {
      tls.ca = readPem('sslrootcert', params.sslrootcert);
    }
    if (sslMode === 'verify-ca') tls.checkServerIdentity = () => undefined;
    ssl = tls;
  }
  if (params.sslcert && params.sslkey && typeof ssl === 'object') {
    ssl.cert = readPem('sslcert', params.sslcert);
    ssl.key = readPem('sslkey', params.sslkey);
    if (params.sslpassword) ssl.passphrase = params.sslpassword;
  } else if (params.sslcert && params.sslkey) {
    const tls: TlsOptions = {
      rejectUnauthorized: false,
      cert: readPem('sslcert', params.sslcert),
      key: readPem('sslkey', params.sslkey),
    };
    if (params.sslpassword) tls.passphrase = params.sslpassword;
    ssl = tls;
  }

  const database = decodeURIComponent(url.pathname.replace(/^\//, '')) || 'postgres';
  const user = decodeURIComponent(url.username) || process.env.PGUSER || 'postgres';
  const host = url.hostname || url.searchParams.get('host') || 'localhost';
  const port = url.port || '5432';
  return {
    url: url.toString(),
    ssl,
    sslMode,
    description: `${user}@${host}:${port}/${database}`,
    database,
  };
}
