import { WalDecoder } from '../capture/wal/decoder.js';
import type { ConnectionConfig } from '../db/connection-config.js';
import { ConnectionPool } from '../db/pool.js';
import { DrainLoop, SharedWait } from '../drain/drain-loop.js';
import type { AppliedWork } from '../drain/tally.js';
import type { Logger } from '../logger.js';
import { STAGING_TIMINGS, type StagingHooks, StagingWorker } from '../staging/staging-worker.js';
import { drainHealth, type ProcessHealth } from './health.js';

export interface BackgroundOptions {
  schema: string;
  staging: boolean;
  drainThreads: number;
  applicationName: string;
  connectTimeoutMs: number;
}

/** What the workers tell the handle (metrics, the catalog watch). Hooks must not throw. */
export interface BackgroundHooks extends StagingHooks {
  applied(work: AppliedWork): void;
}

/**
 * The background work a handle runs: its staging worker (if `staging`) and its drain
 * loops, each on a connection of its own from a pool apart from the calls' pool, so
 * background work never takes a connection a call is waiting for.
 */
export class Background {
  private readonly controller = new AbortController();
  private readonly pool: ConnectionPool;
  private readonly staging: StagingWorker | undefined;
  private readonly decoder: WalDecoder | undefined;
  private readonly drains: DrainLoop[] = [];

  constructor(
    config: ConnectionConfig,
    options: BackgroundOptions,
    log: Logger,
    hooks: BackgroundHooks,
  ) {
    this.pool = new ConnectionPool(config, {
      // A staging process also runs a WAL decoder (idle under trigger capture).
      max: (options.staging ? 2 : 0) + options.drainThreads,
      applicationName: `${options.applicationName}:worker`,
      // A safety net only: a page or chunk is far shorter. A claim held by a session that
      // stopped talking is given up by the server.
      statementTimeoutMs: 300_000,
      connectTimeoutMs: options.connectTimeoutMs,
      settings: {
        idle_in_transaction_session_timeout: '60000',
        work_mem: '64MB',
      },
    });
    const signal = this.controller.signal;
    if (options.staging) {
      this.staging = new StagingWorker(
        this.pool,
        options.schema,
        log,
        signal,
        STAGING_TIMINGS,
        hooks,
      );
      this.decoder = new WalDecoder(this.pool, options.schema, log, signal, {
        config,
        applicationName: options.applicationName,
        connectTimeoutMs: options.connectTimeoutMs,
      });
    }
    // The loops wait for work together: one backend waits for all of them.
    const wait = new SharedWait();
    for (let i = 0; i < options.drainThreads; i += 1) {
      this.drains.push(
        new DrainLoop(this.pool, options.schema, log, signal, i + 1, wait, (work) =>
          hooks.applied(work),
        ),
      );
    }
  }

  /** 1 when this process's staging worker is the elected one, 0 standing by, null without one. */
  stagingLeader(): number | null {
    if (!this.staging) return null;
    return this.staging.isLeader ? 1 : 0;
  }

  /** Drain loops connected and registered; null without any. */
  drainLoopsAlive(): number | null {
    if (this.drains.length === 0) return null;
    return this.drains.filter((d) => d.alive).length;
  }

  /** How each worker fares, as the process reports it to the catalog (ADR 0038). */
  health(): ProcessHealth {
    return {
      ...(this.staging ? { staging: this.staging.health() } : {}),
      ...(this.decoder ? { decoder: this.decoder.health() } : {}),
      ...(this.drains.length > 0 ? { drain: drainHealth(this.drains.map((d) => d.health())) } : {}),
    };
  }

  poolStats(): { inUse: number; max: number; waiting: number } {
    return this.pool.stats();
  }

  get running(): boolean {
    return (
      !this.controller.signal.aborted && (this.staging !== undefined || this.drains.length > 0)
    );
  }

  /** Stops every loop (cancelling the query each has in flight) and closes their connections. */
  async stop(): Promise<void> {
    this.controller.abort();
    const loops = [
      ...(this.staging ? [this.staging] : []),
      ...(this.decoder ? [this.decoder] : []),
      ...this.drains,
    ];
    for (const loop of loops) loop.interrupt();
    await Promise.allSettled(loops.map((loop) => loop.done));
    await this.pool.end(5);
  }
}
