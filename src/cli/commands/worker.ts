import { once } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import { InvalidArgumentError, Option } from 'commander';
import { TrellisError } from '../../engine/errors.js';
import type { LogLevel } from '../../engine/logger.js';
import { type MetricsServer, serveMetrics } from '../../engine/metrics/serve-metrics.js';
import { DEFAULTS } from '../../engine/options.js';
import { connectCli } from '../connect.js';
import { CliExit, type ConnectionFlags, defineCommand } from '../define-command.js';
import { EXIT_CODES } from '../exit-codes.js';
import { jsonLineLogger } from '../worker/json-logger.js';

interface WorkerFlags extends ConnectionFlags {
  drainThreads: number;
  metricsPort?: number;
  metricsHost: string;
  staging: boolean;
  logLevel: LogLevel;
}

function port(value: string): number {
  const n = Number(value);
  if (!/^\d+$/.test(value) || n > 65_535) {
    throw new InvalidArgumentError('expected a port number from 0 to 65535');
  }
  return n;
}

function threads(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 0 || n > 64) {
    throw new InvalidArgumentError('expected a whole number from 0 to 64');
  }
  return n;
}

export const worker = defineCommand<WorkerFlags>({
  name: 'worker',
  summary: 'run the staging worker and drain loops as a process of their own',
  description: `Runs this instance's staging worker (one per fleet is elected; others stand by)
and --drain-threads drain loops, until SIGTERM or SIGINT. Logs are JSON lines on stdout
({"time", "level", "msg", "trellis_instance", …}).

On SIGTERM or SIGINT it stops gracefully: queries in flight are cancelled (claims they
held return to the ledger, nothing is lost or applied twice) and every connection is
closed, within the call timeout (30 s); past that it exits 1. A second signal ends it at
once.

With --metrics-port, it serves GET /metrics (this process's series, trellis_build_info
and the workers' among them) and GET /healthz: 200 with the loops' health as JSON while
every loop completes passes, 503 with the reasons when one has completed none for 60 s
or the workers stopped.`,
  connects: true,
  setup(command) {
    command
      .option('--drain-threads <n>', 'drain loops in this process', threads, 2)
      .option('--no-staging', 'run no staging worker (drain only)')
      .option(
        '--metrics-port <port>',
        'serve GET /metrics (Prometheus) and GET /healthz (200 while the loops run, else 503) on this port',
        port,
      )
      .option('--metrics-host <address>', 'the address --metrics-port listens on', '0.0.0.0')
      .addOption(
        new Option('--log-level <level>', 'the least severe level logged')
          .choices(['debug', 'info', 'warn', 'error'])
          .default('info'),
      );
  },
  epilog: `Examples:
  DATABASE_URL=postgres://… trellis worker
  trellis worker --drain-threads 4 --no-staging   # more drain capacity elsewhere
  trellis worker --metrics-port 9464              # scrape http://<host>:9464/metrics`,
  async run({ options, io }) {
    if (!options.staging && options.drainThreads === 0) {
      throw new TrellisError(
        'validation',
        'worker with --no-staging and --drain-threads 0 would run nothing',
      );
    }
    const log = jsonLineLogger((line) => io.out(line), options.logLevel);
    const trellis = await connectCli(options, io, 'worker', {
      staging: options.staging,
      drainThreads: options.drainThreads,
      logger: log,
    });
    const instance = { trellis_instance: trellis.instance };
    let metrics: MetricsServer | undefined;
    if (options.metricsPort !== undefined) {
      try {
        metrics = await serveMetrics(trellis, {
          port: options.metricsPort,
          host: options.metricsHost,
        });
      } catch (error) {
        await trellis.shutdown();
        throw error;
      }
    }
    log.info(
      {
        ...instance,
        staging: options.staging,
        drainThreads: options.drainThreads,
        pid: process.pid,
        ...(metrics ? { metrics: `${metrics.url}/metrics`, metricsPort: metrics.port } : {}),
      },
      'worker started',
    );
    const signal = io.stop;
    if (signal && !signal.aborted) await once(signal, 'abort');
    else if (!signal) await new Promise(() => {});
    const reason = String(signal?.reason ?? 'stop');
    log.info({ ...instance, signal: reason }, 'worker stopping');
    await metrics?.close();
    const started = Date.now();
    const deadline = sleep(DEFAULTS.callTimeoutMs, 'deadline' as const, { ref: false });
    const outcome = await Promise.race([
      trellis.shutdown().then(() => 'stopped' as const),
      deadline,
    ]);
    if (outcome === 'deadline') {
      log.error(
        { ...instance, ms: Date.now() - started },
        'worker did not stop within the call timeout',
      );
      throw new CliExit(
        EXIT_CODES.failed,
        `worker did not stop within ${DEFAULTS.callTimeoutMs} ms`,
      );
    }
    log.info({ ...instance, ms: Date.now() - started }, 'worker stopped');
  },
});
