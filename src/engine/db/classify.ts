import { TrellisError } from '../errors.js';
import { SQLSTATE, sqlstateOf } from '../sqlstate.js';
import type { ConnectionConfig } from './connection-config.js';

/** Node and postgres.js error codes that mean the server could not be reached or was lost. */
const NETWORK_CODES: Readonly<Record<string, string>> = {
  ECONNREFUSED: 'connection refused: is Postgres running and listening on that host and port?',
  ENOTFOUND: 'host name not found: check the host in the url',
  EAI_AGAIN: 'host name lookup failed: check the host in the url and DNS',
  ETIMEDOUT: 'the connection timed out: check the host, port and firewall',
  EHOSTUNREACH: 'host unreachable: check the host and network',
  ECONNRESET: 'the server closed the connection',
  EPIPE: 'the server closed the connection',
  CONNECT_TIMEOUT: 'connecting timed out: check the host, port and firewall',
  CONNECTION_CLOSED: 'the connection to Postgres was closed',
  CONNECTION_DESTROYED: 'the connection to Postgres was destroyed',
  CONNECTION_ENDED: 'the connection to Postgres was ended',
  DEPTH_ZERO_SELF_SIGNED_CERT:
    'the server certificate is self-signed: give its CA as sslrootcert=/path/ca.pem in the url',
  SELF_SIGNED_CERT_IN_CHAIN:
    'the server certificate chain is not trusted: give its CA as sslrootcert=/path/ca.pem',
  UNABLE_TO_VERIFY_LEAF_SIGNATURE:
    'the server certificate cannot be verified: give its CA as sslrootcert=/path/ca.pem',
  ERR_TLS_CERT_ALTNAME_INVALID:
    'the server certificate does not name this host: connect by the name in the certificate, or use sslmode=verify-ca',
};

function pgMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

function parsePosition(detail: unknown): number | undefined {
  if (typeof detail !== 'string') return undefined;
  try {
    const parsed = JSON.parse(detail) as { position?: unknown };
    return typeof parsed.position === 'number' ? parsed.position : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Errors met while connecting: each becomes a `connection` error that names the server and
 * says what to change. `config` describes where we tried to connect (never the password).
 */
export function classifyConnectError(error: unknown, config: ConnectionConfig): TrellisError {
  if (error instanceof TrellisError) return error;
  const where = config.description;
  const state = sqlstateOf(error);
  const code = (error as { code?: unknown } | null)?.code;
  const sqlstate = state ? { sqlstate: state } : {};
  if (state === SQLSTATE.invalidPassword) {
    return new TrellisError(
      'connection',
      `password authentication failed for ${where}: check the user and password in the url`,
      { cause: error, ...sqlstate },
    );
  }
  if (state === SQLSTATE.invalidAuthorizationSpecification) {
    const tlsHint =
      config.sslMode === 'disable' || config.sslMode === 'allow' || config.sslMode === 'prefer'
        ? ' The server may require TLS for this user: add sslmode=require (or verify-full with sslrootcert) to the url.'
        : '';
    return new TrellisError(
      'connection',
      `the server refused ${where} (${pgMessage(error)}).${tlsHint}`,
      { cause: error, ...sqlstate },
    );
  }
  if (state === SQLSTATE.invalidCatalogName) {
    return new TrellisError(
      'connection',
      `database "${config.database}" does not exist on ${where}: create it or fix the url`,
      { cause: error, ...sqlstate },
    );
  }
  if (state === SQLSTATE.tooManyConnections) {
    return new TrellisError(
      'connection',
      `the server has no free connection slots (${where}): lower pool.max or raise max_connections`,
      { cause: error, ...sqlstate },
    );
  }
  if (state === SQLSTATE.cannotConnectNow) {
    return new TrellisError(
      'connection',
      `the server at ${where} is starting up or shutting down: try again`,
      { cause: error, ...sqlstate },
    );
  }
  if (
    code === 'ECONNRESET' &&
    (config.sslMode === 'require' ||
      config.sslMode === 'verify-ca' ||
      config.sslMode === 'verify-full')
  ) {
    // A server without TLS answers the driver's SSLRequest with "no"; the driver goes on
    // with the TLS handshake anyway and the server hangs up, so this reset is what
    // `sslmode=require` against a server without TLS looks like.
    return new TrellisError(
      'connection',
      `cannot connect to ${where}: the server closed the connection before TLS was set up; it may not accept TLS connections. Enable TLS on the server (ssl = on), or use sslmode=prefer or sslmode=disable in the url`,
      { cause: error },
    );
  }
  if (typeof code === 'string' && code in NETWORK_CODES) {
    return new TrellisError('connection', `cannot connect to ${where}: ${NETWORK_CODES[code]}`, {
      cause: error,
    });
  }
  const message = pgMessage(error);
  if (config.sslMode !== 'disable' && /SSL|TLS/i.test(code === undefined ? '' : String(code))) {
    return new TrellisError('connection', `TLS to ${where} failed: ${message}`, { cause: error });
  }
  return classifyError(error, { connectionDescription: where });
}

export interface ClassifyContext {
  /** What the engine was doing, for the message. */
  doing?: string;
  connectionDescription?: string;
}

/**
 * Any error from a call: Trellis's own SQLSTATEs map to their codes, a lost session to
 * `connection`, every other Postgres error to `database` (the SQLSTATE is kept).
 */
export function classifyError(error: unknown, context: ClassifyContext = {}): TrellisError {
  if (error instanceof TrellisError) return error;
  const state = sqlstateOf(error);
  const message = pgMessage(error);
  const prefix = context.doing ? `${context.doing}: ` : '';
  if (state) {
    const opts = { cause: error, sqlstate: state };
    switch (state) {
      case SQLSTATE.trellisParse: {
        const position = parsePosition((error as { detail?: unknown }).detail);
        return new TrellisError('parse', message, {
          ...opts,
          ...(position === undefined ? {} : { position }),
        });
      }
      case SQLSTATE.trellisValidation:
        return new TrellisError('validation', message, opts);
      case SQLSTATE.trellisNotFound:
        return new TrellisError('not_found', message, opts);
      case SQLSTATE.trellisConflict:
        return new TrellisError('conflict', message, opts);
      case SQLSTATE.trellisIncompatibleSchema:
        return new TrellisError('incompatible_schema', message, opts);
      case SQLSTATE.trellisTransient:
        return new TrellisError('transient', message, opts);
      case SQLSTATE.readOnlySqlTransaction:
        // The session cannot write (ADR 0036): it is replaced, and the next one checked.
        return new TrellisError(
          'read_only',
          `${prefix}${message}: the session is read-only (default_transaction_read_only is on for the database or role, or the server is a standby); Trellis retries on new sessions until the server takes writes`,
          opts,
        );
      case SQLSTATE.adminShutdown:
      case SQLSTATE.crashShutdown:
      case SQLSTATE.cannotConnectNow:
      case SQLSTATE.idleSessionTimeout:
        return new TrellisError(
          'connection',
          `${prefix}the server ended the session: ${message}`,
          opts,
        );
    }
    if (state.startsWith('08')) {
      return new TrellisError('connection', `${prefix}${message}`, opts);
    }
    return new TrellisError('database', `${prefix}${message}`, opts);
  }
  const code = (error as { code?: unknown } | null)?.code;
  if (typeof code === 'string' && code in NETWORK_CODES) {
    const where = context.connectionDescription ? ` (${context.connectionDescription})` : '';
    return new TrellisError('connection', `${prefix}${NETWORK_CODES[code]}${where}`, {
      cause: error,
    });
  }
  return new TrellisError('unknown', `${prefix}${message}`, { cause: error });
}
