/**
 * `/metrics` and `/healthz` on a port of their own, for a process that runs workers and no
 * web server (`trellis worker --metrics-port`, an app's worker process): ADR 0043. The web
 * process of an app keeps serving `renderPrometheus()` on its own routes (ADR 0016).
 */
import { once } from 'node:events';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { TrellisError } from '../errors.js';
import type { Trellis } from '../trellis.js';
import type { ProcessHealth } from '../workers/health.js';
import { prometheusContentType, renderPrometheus } from './registry.js';

/** Options of {@link serveMetrics}. */
export interface ServeMetricsOptions {
  /** The port to listen on; 0 picks a free one (see `port` on the result). */
  port: number;
  /**
   * The address to listen on.
   * @defaultValue `'0.0.0.0'` (every IPv4 interface: Prometheus scrapes from elsewhere)
   */
  host?: string;
  /**
   * `/healthz` fails when a worker loop of the handle has completed no pass for this long
   * (an idle loop completes one every few seconds), and until every loop has completed its
   * first.
   * @defaultValue `60_000`
   */
  staleAfterMs?: number;
}

/** The server {@link serveMetrics} started. */
export interface MetricsServer {
  /** The port it listens on (the one picked, for `port: 0`). */
  port: number;
  /** `http://<host>:<port>`, for logs. */
  url: string;
  /** Stops listening; resolves once open connections are closed. */
  close(): Promise<void>;
}

/** What `/healthz` answers: `ok` with HTTP 200, or the reasons it is not, with 503. */
export interface HealthReport {
  ok: boolean;
  /** Why not, one sentence each (empty when ok). */
  problems: string[];
  /** The handle's workers as they know themselves (null when it runs none). */
  workers: (ProcessHealth & { running: boolean }) | null;
}

const ROLES = ['staging', 'decoder', 'drain'] as const;

/**
 * Whether the handle's worker loops are running: none stopped, and every one has completed
 * a pass within `staleAfterMs`. Read from memory.
 */
export function workerHealthReport(
  trellis: Trellis,
  staleAfterMs: number,
  now: number = Date.now(),
): HealthReport {
  const workers = trellis.processHealth();
  const problems: string[] = [];
  if (workers === null) {
    problems.push('this handle runs no workers (staging: false and drainThreads: 0)');
  } else {
    if (workers.refused) problems.push(`the workers stopped: ${workers.refused.message}`);
    else if (!workers.running) problems.push('the workers stopped (the handle was shut down)');
    for (const role of ROLES) {
      const loop = workers[role];
      if (!loop || !workers.running) continue;
      const error = loop.lastError ? `: ${loop.lastError.message}` : '';
      if (loop.lastPassAt === null) {
        problems.push(`the ${role} loop has completed no pass yet${error}`);
        continue;
      }
      const ago = now - Date.parse(loop.lastPassAt);
      if (ago > staleAfterMs) {
        problems.push(
          `the ${role} loop last completed a pass ${Math.round(ago / 1000)} s ago${error}`,
        );
      }
    }
  }
  return { ok: problems.length === 0, problems, workers };
}

/**
 * Serves `GET /metrics` (every open handle's series in this process, as
 * `renderPrometheus()`) and `GET /healthz` (200 while `trellis`'s worker loops run, 503
 * with the reasons when they do not) on `options.port`. For a worker process without a web
 * server of its own; `trellis worker --metrics-port` runs it. Resolves once listening.
 */
export async function serveMetrics(
  trellis: Trellis,
  options: ServeMetricsOptions,
): Promise<MetricsServer> {
  const { port } = options;
  if (!Number.isInteger(port) || port < 0 || port > 65_535) {
    throw new TrellisError('validation', `serveMetrics: port must be 0 to 65535, not ${port}`);
  }
  const staleAfterMs = options.staleAfterMs ?? 60_000;
  const host = options.host ?? '0.0.0.0';
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const path = (req.url ?? '/').split('?')[0];
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.writeHead(405, { allow: 'GET, HEAD' }).end();
      return;
    }
    if (path === '/metrics') {
      renderPrometheus().then(
        (text) => res.writeHead(200, { 'content-type': prometheusContentType }).end(text),
        (error: unknown) =>
          res
            .writeHead(500, { 'content-type': 'text/plain' })
            .end(`metrics failed: ${error instanceof Error ? error.message : String(error)}\n`),
      );
      return;
    }
    if (path === '/healthz') {
      const report = workerHealthReport(trellis, staleAfterMs);
      res
        .writeHead(report.ok ? 200 : 503, { 'content-type': 'application/json' })
        .end(`${JSON.stringify(report)}\n`);
      return;
    }
    res
      .writeHead(404, { 'content-type': 'text/plain' })
      .end('not found: try /metrics or /healthz\n');
  });
  server.listen(port, host);
  await Promise.race([
    once(server, 'listening'),
    once(server, 'error').then(([error]) => {
      throw new TrellisError(
        'validation',
        `serveMetrics could not listen on ${host}:${port}: ${(error as Error).message}`,
      );
    }),
  ]);
  const bound = (server.address() as AddressInfo).port;
  const shown = host === '0.0.0.0' || host === '::' ? 'localhost' : host;
  return {
    port: bound,
    url: `http://${shown}:${bound}`,
    close: () =>
      new Promise<void>((done) => {
        server.close(() => done());
        server.closeAllConnections();
      }),
  };
}
