import type { Duplex } from 'node:stream';
import type postgres from 'postgres';
import { createClient } from '../../db/client.js';
import type { ConnectionConfig } from '../../db/connection-config.js';
import { quoteIdent, quoteLiteral } from '../../identifiers.js';
import { formatLsn, type PgOutputMessage, parsePgOutput } from './pgoutput.js';

export type StreamItem =
  | { kind: 'data'; walStart: bigint; message: PgOutputMessage }
  | { kind: 'keepalive'; walEnd: bigint; replyRequested: boolean };

export interface ReplicationStreamOptions {
  config: ConnectionConfig;
  slot: string;
  publication: string;
  applicationName: string;
  connectTimeoutMs: number;
}

/**
 * Opens a replication connection as `ReplicationStream.open` does, asks the server who it
 * is (IDENTIFY_SYSTEM), and closes it: whether this URL leads to a server that takes one.
 * A connection pooler may not pass one on (PgBouncer before 1.23 refuses the `replication`
 * startup parameter): checked before a slot is made for a decoder that could never
 * stream it (ADR 0037). Rejects with the server's (or pooler's) error.
 */
export async function checkReplicationConnection(
  options: Omit<ReplicationStreamOptions, 'slot' | 'publication'>,
): Promise<void> {
  const sql = createClient(options.config.url, {
    max: 1,
    ssl: options.config.ssl,
    connect_timeout: Math.max(1, Math.ceil(options.connectTimeoutMs / 1000)),
    idle_timeout: 0,
    connection: { replication: 'database', application_name: options.applicationName },
  });
  let timer: NodeJS.Timeout | undefined;
  try {
    await Promise.race([
      sql.unsafe('IDENTIFY_SYSTEM').simple(),
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error('the replication connection did not answer in time')),
          options.connectTimeoutMs + 1_000,
        );
      }),
    ]);
  } finally {
    clearTimeout(timer);
    await sql.end({ timeout: 1 }).catch(() => undefined);
  }
}

/** Messages queued before the stream is paused (and the socket with it), and resumed. */
const HIGH_WATER = 2_000;
const LOW_WATER = 200;
/** A status update goes out at least this often (wal_sender_timeout is 60 s by default). */
const STATUS_EVERY_MS = 10_000;
/** Microseconds between 1970-01-01 and 2000-01-01, Postgres's epoch. */
const PG_EPOCH_MS = 946_684_800_000;

/**
 * Session settings of the replication connection. The walsender writes every value with
 * its type's output function under these: the same text the capture functions write for
 * setting-dependent key types (src/engine/capture/trigger-sql.ts), so the drain reads a
 * key back the same way whichever capture wrote it.
 */
const OUTPUT_SETTINGS = {
  DateStyle: 'ISO, YMD',
  IntervalStyle: 'postgres',
  extra_float_digits: '3',
  bytea_output: 'hex',
  TimeZone: 'UTC',
};

/**
 * A logical replication stream of one slot (pgoutput, protocol version 1), on a connection
 * of its own (ADR 0024). Messages are read from the driver's CopyBoth stream one `data`
 * event each, into a queue that pauses the stream (and so the socket) when it fills. The
 * position reported to the slot is only ever the one the caller acknowledges. However the
 * stream ends (an error, the server closing it, `close()`), `next()` says so: it rejects
 * with the error, or resolves to null once closed by us; nothing escapes unhandled.
 */
export class ReplicationStream {
  private readonly queue: StreamItem[] = [];
  private waiter: (() => void) | undefined;
  private failure: Error | undefined;
  private closedByUs = false;
  private ended = false;
  private paused = false;
  private acknowledged = 0n;
  private lastStatusAt = 0;
  private readonly timer: NodeJS.Timeout;

  private constructor(
    private readonly sql: postgres.Sql,
    private readonly stream: Duplex,
  ) {
    stream.on('data', (chunk: Buffer) => this.receive(chunk));
    stream.on('error', (error: Error) => this.end(error));
    stream.on('end', () => this.end(new Error('the server ended the replication stream')));
    stream.on('close', () => this.end(new Error('the replication connection closed')));
    this.timer = setInterval(() => {
      if (Date.now() - this.lastStatusAt >= STATUS_EVERY_MS) this.sendStatus(false);
    }, STATUS_EVERY_MS / 2);
    this.timer.unref();
  }

  /**
   * Connects and starts streaming `slot` from its confirmed position. Fails (and closes
   * the connection) when the slot is missing or in use, or the server does not answer in
   * time.
   */
  static async open(options: ReplicationStreamOptions): Promise<ReplicationStream> {
    let closed = false;
    const sql = createClient(options.config.url, {
      max: 1,
      ssl: options.config.ssl,
      connect_timeout: Math.max(1, Math.ceil(options.connectTimeoutMs / 1000)),
      idle_timeout: 0,
      max_lifetime: null,
      onclose: () => {
        closed = true;
      },
      connection: {
        replication: 'database',
        application_name: options.applicationName,
        ...OUTPUT_SETTINGS,
      },
    });
    let timer: NodeJS.Timeout | undefined;
    try {
      const start = sql
        .unsafe(
          `START_REPLICATION SLOT ${quoteIdent(options.slot)} LOGICAL 0/0 (proto_version '1', publication_names ${quoteLiteral(quoteIdent(options.publication))}, messages 'true')`,
        )
        .writable();
      const stream = (await Promise.race([
        start,
        new Promise<never>((_, reject) => {
          timer = setTimeout(
            () => reject(new Error('the replication stream did not start in time')),
            options.connectTimeoutMs + 1_000,
          );
        }),
      ])) as unknown as Duplex;
      if (closed) throw new Error('the replication connection closed');
      return new ReplicationStream(sql, stream);
    } catch (error) {
      await sql.end({ timeout: 1 }).catch(() => undefined);
      throw error;
    } finally {
      clearTimeout(timer);
    }
  }

  /** Messages received and not taken yet. */
  get queued(): number {
    return this.queue.length;
  }

  /**
   * The next message, or null when none came within `waitMs` or the stream was closed by
   * `close()`; rejects once the stream failed (after the messages received before).
   */
  async next(waitMs: number): Promise<StreamItem | null> {
    if (this.queue.length === 0 && !this.ended) {
      let timer: NodeJS.Timeout | undefined;
      await new Promise<void>((resolve) => {
        this.waiter = resolve;
        timer = setTimeout(resolve, waitMs);
      });
      clearTimeout(timer);
      this.waiter = undefined;
    }
    const item = this.queue.shift();
    if (this.paused && this.queue.length <= LOW_WATER && !this.ended) {
      this.paused = false;
      this.stream.resume();
    }
    if (item) return item;
    if (this.ended && !this.closedByUs) throw this.failure ?? new Error('replication stream ended');
    return null;
  }

  /**
   * Reports `lsn` to the slot as written, flushed and applied: the server may then free the
   * WAL before it, and streams from there after a reconnect. Only positions the caller
   * knows to be durable (every change before them in the ledger, committed).
   */
  acknowledge(lsn: bigint): void {
    if (lsn <= this.acknowledged) return;
    this.acknowledged = lsn;
    this.sendStatus(false);
  }

  /** Answers a keepalive that asks for a reply. */
  reply(): void {
    this.sendStatus(false);
  }

  /** The last position acknowledged. */
  get position(): string {
    return formatLsn(this.acknowledged);
  }

  /** Ends the stream and its connection; messages still queued are dropped. */
  async close(): Promise<void> {
    if (!this.ended) {
      this.closedByUs = true;
      this.ended = true;
      clearInterval(this.timer);
      try {
        this.stream.end();
      } catch {
        // Already torn down.
      }
    }
    this.wake();
    await this.sql.end({ timeout: 1 }).catch(() => undefined);
  }

  private receive(chunk: Buffer): void {
    if (this.ended) return;
    try {
      const type = chunk[0];
      if (type === 0x77) {
        // XLogData: 'w', start LSN, end LSN, send time, then the pgoutput message.
        const walStart = chunk.readBigUInt64BE(1);
        this.queue.push({ kind: 'data', walStart, message: parsePgOutput(chunk.subarray(25)) });
      } else if (type === 0x6b) {
        // Primary keepalive: 'k', the server's WAL end, send time, reply requested.
        this.queue.push({
          kind: 'keepalive',
          walEnd: chunk.readBigUInt64BE(1),
          replyRequested: chunk[17] === 1,
        });
      } else {
        return;
      }
    } catch (error) {
      this.end(error instanceof Error ? error : new Error(String(error)));
      this.stream.destroy();
      return;
    }
    if (!this.paused && this.queue.length >= HIGH_WATER) {
      this.paused = true;
      this.stream.pause();
    }
    this.wake();
  }

  private sendStatus(replyRequested: boolean): void {
    if (this.ended) return;
    const message = Buffer.alloc(34);
    message.write('r', 0);
    message.writeBigUInt64BE(this.acknowledged, 1); // written
    message.writeBigUInt64BE(this.acknowledged, 9); // flushed
    message.writeBigUInt64BE(this.acknowledged, 17); // applied
    message.writeBigInt64BE(BigInt(Date.now() - PG_EPOCH_MS) * 1000n, 25);
    message.writeUInt8(replyRequested ? 1 : 0, 33);
    this.lastStatusAt = Date.now();
    try {
      this.stream.write(message);
    } catch (error) {
      this.end(error instanceof Error ? error : new Error(String(error)));
    }
  }

  private end(error: Error): void {
    if (this.ended) return;
    this.ended = true;
    this.failure = error;
    clearInterval(this.timer);
    this.wake();
  }

  private wake(): void {
    const waiter = this.waiter;
    this.waiter = undefined;
    waiter?.();
  }
}
