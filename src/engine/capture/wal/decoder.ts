import type { ConnectionConfig } from '../../db/connection-config.js';
import type { ConnectionPool } from '../../db/pool.js';
import type { Session } from '../../db/session.js';
import { TrellisError } from '../../errors.js';
import { quoteIdent } from '../../identifiers.js';
import { LOCK_CLASS } from '../../internal/advisory-locks.js';
import type { Logger } from '../../logger.js';
import { SQLSTATE, sqlstateOf } from '../../sqlstate.js';
import type { ElectedHealth } from '../../workers/health.js';
import { WorkerLoop } from '../../workers/worker-loop.js';
import { KeyBatch } from './key-batch.js';
import { formatLsn, parseLsn } from './pgoutput.js';
import { PUBLICATION_OPTIONS } from './publication.js';
import { checkReplicationConnection, ReplicationStream } from './replication-stream.js';

/**
 * WAL capture streams the slot on a replication connection, which a connection pooler may
 * not pass on (PgBouncer refuses the `replication` startup parameter before 1.23): through
 * one, a failure to open the stream says so. The sources stay on their triggers meanwhile
 * (ADR 0037).
 */
function throughPooler(session: Session, error: unknown): unknown {
  if (!session.server?.pooled) return error;
  const message = error instanceof Error ? error.message : String(error);
  return new TrellisError(
    'connection',
    `the replication stream could not be opened through the connection pooler at ${session.server.description} (${message}): WAL capture needs a replication connection, which a pooler may not pass on; connect the staging worker's handle (staging: true) to Postgres directly, or capture with triggers`,
    { cause: error },
  );
}

/** A batch is written once it holds this many keys, even inside a transaction. */
export const BATCH_KEYS = 5_000;
/**
 * ... or, between transactions, once the last write is this long ago. Each write is a
 * durable commit (a WAL flush, on the writers' own cores and disk): at most one per
 * interval, whatever the stream does, costs a change at most this much freshness; after
 * a quiet spell the next change is written at once.
 */
const WRITE_EVERY_MS = 25;
/** How often a streaming decoder looks at the catalog (a slot to drop, a lost lock). */
const CHECK_MS = 5_000;
/** How often an idle decoder (nothing captured from the WAL) looks whether it is needed. */
const IDLE_MS = 2_000;
const STANDBY_MS = 1_000;
/**
 * Decoding failures of the slot in a row (an internal error from the WAL sender: Postgres
 * cannot decode past some record) before it is given up on while sources rely on it alone.
 * A stream that ran this long without failing starts the count again.
 */
const DECODE_FAILURES_TO_GIVE_UP = 3;
const DECODE_FAILURE_RESET_MS = 60_000;

export interface WalDecoderOptions {
  config: ConnectionConfig;
  applicationName: string;
  connectTimeoutMs: number;
}

interface DecoderState {
  capture: 'trigger' | 'logical';
  wal_slot: string | null;
  drain_lsn: string | null;
  slot_name: string;
  publication: string;
  published: boolean;
  has_publication: boolean;
  slot_exists: boolean;
  wal_status: string | null;
  confirmed: string | null;
}

/**
 * WAL capture's decoder (ADR 0023): streams the instance's replication slot and writes
 * the keys of committed changes into the ledger, acknowledging a position to the slot only
 * once every change before it is there, committed. One per instance: every `staging: true`
 * process runs one, and an advisory lock elects which streams. It also makes the slot (and
 * the publication) when the instance asks for WAL capture, and drops them when it is back
 * on triggers with nothing left to decode. Idle (trigger capture), it looks every 2 s.
 */
export class WalDecoder {
  private readonly loop: WorkerLoop;
  private leaderPid: number | undefined;
  /** The election was logged (at info only once capture is logical: under triggers it idles). */
  private announced = false;
  private stream: ReplicationStream | undefined;
  private decodeFailures = 0;
  /** A replication connection was had through the pooler (checkReplication). */
  private replicationChecked = false;

  constructor(
    pool: ConnectionPool,
    private readonly schema: string,
    private readonly log: Logger,
    private readonly signal: AbortSignal,
    private readonly options: WalDecoderOptions,
  ) {
    this.loop = new WorkerLoop({
      name: 'WAL decoder',
      pool,
      log,
      signal,
      onSession: async () => {
        this.leaderPid = undefined;
        this.announced = false;
      },
      step: (session) => this.step(session),
    });
  }

  get done(): Promise<void> {
    return this.loop.done;
  }

  interrupt(): void {
    void this.stream?.close();
    this.loop.interrupt();
  }

  /** How it fares, for the process registry (ADR 0038): elected, and its last pass. */
  health(): ElectedHealth {
    return { ...this.loop.health(), elected: this.leaderPid !== undefined && this.loop.connected };
  }

  private async step(session: Session): Promise<number> {
    const s = quoteIdent(this.schema);
    if (this.leaderPid === undefined) {
      const [row] = await session.query<{ leader: boolean; pid: number }>(
        'SELECT pg_try_advisory_lock($1, hashtext($2)) AS leader, pg_backend_pid() AS pid',
        [LOCK_CLASS.wal, this.schema],
      );
      if (!row?.leader) return STANDBY_MS;
      this.leaderPid = row.pid;
      // Commits of the decoder's batches are durable before the slot hears of them.
      await session.query(`SELECT set_config('synchronous_commit', 'on', false)`);
      this.announced = false;
    }
    const state = await this.state(session);
    // Under trigger capture the elected decoder only waits: an info line would say WAL is
    // decoded when it is not. It is told at info once there is WAL to decode.
    if (!this.announced && (state.capture === 'logical' || state.wal_slot !== null)) {
      this.announced = true;
      this.log.info({ pid: this.leaderPid }, 'WAL decoder elected');
    }
    if (state.wal_slot === null) {
      if (state.capture !== 'logical') return IDLE_MS;
      await this.checkReplication(session);
      await this.ensurePublication(session, state.publication);
      await this.createSlot(session, state.slot_name);
      return 0;
    }
    if (!state.slot_exists || state.wal_status === 'lost') {
      const reason = state.slot_exists
        ? `replication slot ${state.wal_slot} was invalidated by Postgres (wal_status lost: it held more WAL than max_slot_wal_keep_size allows): changes it had not delivered are lost`
        : `replication slot ${state.wal_slot} does not exist on this server (a promoted standby or a restored backup?), or was dropped outside Trellis: changes it had not delivered are lost`;
      const stopped = await session.query<{ target: string }>(
        `SELECT t AS target FROM ${s}._wal_lost($1, $2) t`,
        [state.wal_slot, reason],
      );
      this.log.warn({ slot: state.wal_slot, stopped: stopped.map((r) => r.target) }, reason);
      return 0;
    }
    if (this.drained(state)) {
      await this.dropSlot(session, state);
      return 0;
    }
    await this.ensurePublication(session, state.publication);
    const started = Date.now();
    try {
      await this.consume(session, state.wal_slot, state.publication);
    } catch (error) {
      if (Date.now() - started >= DECODE_FAILURE_RESET_MS) this.decodeFailures = 0;
      if (sqlstateOf(error) !== SQLSTATE.internalError) throw error;
      await this.decodingFailed(session, state.wal_slot, error);
    }
    return 0;
  }

  /**
   * The WAL sender failed to decode the slot (seen: "pg_attribute catalog is missing 3
   * attribute(s) for relation", a slot made while tables were being created and dropped).
   * It fails on the same record every time, so streaming again never gets past it: the
   * slot is dropped as lost (`_wal_lost`) and made again. While no source relies on the
   * slot alone (each still has its triggers) nothing is lost, and that is done at once;
   * otherwise after DECODE_FAILURES_TO_GIVE_UP failures in a row, and the transforms
   * reading those sources stop with the reason (captureFailure 'disruption'; RESUME
   * rebuilds) rather than wait for ever on a slot that cannot move (I7).
   */
  private async decodingFailed(session: Session, slot: string, error: unknown): Promise<void> {
    const s = quoteIdent(this.schema);
    this.decodeFailures += 1;
    const [row] = await session.query<{ relied: boolean }>(
      `SELECT EXISTS (SELECT 1 FROM ${s}.sources
                       WHERE wal_state = 'ready' AND installed_at IS NULL) AS relied`,
    );
    if (row?.relied && this.decodeFailures < DECODE_FAILURES_TO_GIVE_UP) throw error;
    this.decodeFailures = 0;
    const message = error instanceof Error ? error.message : String(error);
    const reason = `replication slot ${slot} cannot be decoded past a record (${message}): it is dropped and made again${row?.relied ? ', and changes it had not delivered are lost' : ''}`;
    await this.dropSlotNamed(session, slot);
    const stopped = await session.query<{ target: string }>(
      `SELECT t AS target FROM ${s}._wal_lost($1, $2) t`,
      [slot, reason],
    );
    this.log.warn({ slot, stopped: stopped.map((r) => r.target) }, reason);
  }

  /** Back on triggers, nothing published, and every change decoded: the slot can go. */
  private drained(state: DecoderState): boolean {
    if (state.capture !== 'trigger' || state.published || state.confirmed === null) return false;
    return state.drain_lsn === null || parseLsn(state.confirmed) >= parseLsn(state.drain_lsn);
  }

  private async state(session: Session): Promise<DecoderState> {
    const s = quoteIdent(this.schema);
    const [row] = await session.query<DecoderState>(
      `SELECT c.capture, c.wal_slot, c.wal_drain_lsn::text AS drain_lsn,
              ${s}._wal_slot_name() AS slot_name, ${s}._wal_publication() AS publication,
              EXISTS (SELECT 1 FROM ${s}.sources WHERE wal_state IS NOT NULL) AS published,
              EXISTS (SELECT 1 FROM pg_publication WHERE pubname = ${s}._wal_publication()) AS has_publication,
              rs.slot_name IS NOT NULL AS slot_exists, rs.wal_status,
              rs.confirmed_flush_lsn::text AS confirmed
         FROM ${s}.config c
         LEFT JOIN pg_replication_slots rs ON rs.slot_name = c.wal_slot AND rs.database = current_database()`,
    );
    return row!;
  }

  private async ensurePublication(session: Session, publication: string): Promise<void> {
    const s = quoteIdent(this.schema);
    const [row] = await session.query<{ exists: boolean }>(
      'SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1) AS exists',
      [publication],
    );
    if (row?.exists) return;
    await session.transaction(async () => {
      await session.query(
        `CREATE PUBLICATION ${quoteIdent(publication)} WITH (${PUBLICATION_OPTIONS})`,
      );
      await session.query(
        `UPDATE ${s}.config SET wal_publication_xmin =
           (SELECT xmin::text FROM pg_publication WHERE pubname = $1)`,
        [publication],
      );
    });
    this.log.info({ publication }, 'WAL capture: publication created');
  }

  /**
   * Makes the slot (waiting, as Postgres does, for the transactions running now to end),
   * and records it. Sources published before it wait from now on: changes before its
   * consistent point are not in it.
   */
  private async createSlot(session: Session, name: string): Promise<void> {
    const s = quoteIdent(this.schema);
    // One left by a decoder that died before recording it has nothing anyone waits for.
    await this.dropSlotNamed(session, name);
    const [made] = await session.query<{ lsn: string }>(
      `SELECT lsn::text AS lsn FROM pg_create_logical_replication_slot($1, 'pgoutput')`,
      [name],
    );
    await session.query(`UPDATE ${s}.config SET wal_slot = $1`, [name]);
    await session.query(
      `UPDATE ${s}.sources SET wal_xmax = pg_snapshot_xmax(pg_current_snapshot())
        WHERE wal_state = 'publishing' AND wal_xmax IS NULL`,
    );
    this.log.info({ slot: name, lsn: made?.lsn }, 'WAL capture: replication slot created');
  }

  /**
   * Through a connection pooler, checks once that a replication connection can be had
   * before making a slot: a slot no decoder can stream would hold WAL back and keep every
   * awaitConverged waiting, while the sources are as well captured by their triggers. The
   * decoder fails saying so instead, and no slot is made.
   */
  private async checkReplication(session: Session): Promise<void> {
    if (!session.server?.pooled || this.replicationChecked) return;
    await checkReplicationConnection({
      config: this.options.config,
      applicationName: `${this.options.applicationName}:wal`,
      connectTimeoutMs: this.options.connectTimeoutMs,
    }).catch((error: unknown) => {
      throw throughPooler(session, error);
    });
    this.replicationChecked = true;
  }

  private async dropSlot(session: Session, state: DecoderState): Promise<void> {
    const s = quoteIdent(this.schema);
    await this.dropSlotNamed(session, state.wal_slot!);
    await session.query(`UPDATE ${s}.config SET wal_slot = NULL, wal_drain_lsn = NULL`);
    if (state.has_publication) {
      await session.query(`DROP PUBLICATION IF EXISTS ${quoteIdent(state.publication)}`);
      await session.query(`UPDATE ${s}.config SET wal_publication_xmin = NULL`);
    }
    this.log.info(
      { slot: state.wal_slot },
      'WAL capture: back on triggers, every change decoded: slot dropped',
    );
  }

  /** Drops slot `name` of this database if it exists, ending the session that streams it. */
  private async dropSlotNamed(session: Session, name: string): Promise<void> {
    const deadline = Date.now() + 5_000;
    for (;;) {
      const [slot] = await session.query<{ pid: number | null }>(
        `SELECT active_pid AS pid FROM pg_replication_slots
          WHERE slot_name = $1 AND database = current_database()`,
        [name],
      );
      if (!slot) return;
      if (slot.pid === null) {
        await session.query(
          `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
            WHERE slot_name = $1 AND NOT active`,
          [name],
        );
      } else {
        await session.query('SELECT pg_terminate_backend($1)', [slot.pid]);
      }
      if (Date.now() > deadline) throw new Error(`replication slot ${name} stays in use`);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }

  /**
   * Streams the slot until the stream fails, the handle shuts down, or a look at the
   * catalog says to stop. Keys go into a batch; a batch is written between transactions
   * once the last write is WRITE_EVERY_MS ago (a single change after a quiet spell at
   * once, a steady stream of them in a few commits a second), or when it is BATCH_KEYS
   * big. The slot is told a position only
   * once everything before it is written: the end of the last transaction whose keys a
   * written batch held, or, between transactions with nothing held, where the server says
   * its WAL ends (a keepalive) or a non-transactional message is.
   */
  private async consume(session: Session, slot: string, publication: string): Promise<void> {
    const stream = await ReplicationStream.open({
      config: this.options.config,
      slot,
      publication,
      applicationName: `${this.options.applicationName}:wal`,
      connectTimeoutMs: this.options.connectTimeoutMs,
    }).catch((error: unknown) => {
      throw throughPooler(session, error);
    });
    this.stream = stream;
    this.log.debug({ slot }, 'WAL decoder streaming');
    const batch = new KeyBatch();
    let inTransaction = false;
    /** Every transaction that committed before this position is in the ledger. */
    let durable = 0n;
    /** The end of the last committed transaction whose keys the batch holds. */
    let batchEnd = 0n;
    let nextCheck = Date.now() + CHECK_MS;
    let lastWrite = 0;
    const write = async () => {
      if (batch.empty) return;
      const changes = batch.take();
      await session.query(`SELECT ${quoteIdent(this.schema)}._wal_append($1::text::jsonb)`, [
        JSON.stringify(changes),
      ]);
      lastWrite = Date.now();
      if (batchEnd > durable) durable = batchEnd;
    };
    /** How long until a held batch may be written between transactions (0: now). */
    const dueIn = () => Math.max(0, lastWrite + WRITE_EVERY_MS - Date.now());
    try {
      for (;;) {
        if (this.signal.aborted) return;
        // A held batch between transactions waits only until it is due.
        const wait = batch.empty || inTransaction ? 250 : Math.max(1, dueIn());
        const item = await stream.next(wait);
        if (item?.kind === 'keepalive') {
          // Between transactions with nothing held, every change before the server's WAL
          // end is in the ledger. A held batch waits for its time: the walsender sends a
          // keepalive whenever it waits for WAL with our position behind, which under a
          // steady stream of writes is about once per transaction (writing at each one
          // made a commit per transaction, and the decoder fell behind at ~300 a second).
          if (!inTransaction && batch.empty && item.walEnd > durable) durable = item.walEnd;
          if (item.replyRequested) stream.reply();
        } else if (item?.kind === 'data') {
          const m = item.message;
          switch (m.tag) {
            case 'begin':
              inTransaction = true;
              break;
            case 'commit':
              inTransaction = false;
              if (batch.empty) {
                if (m.endLsn > durable) durable = m.endLsn;
              } else {
                batchEnd = m.endLsn;
              }
              break;
            case 'relation':
              batch.relation(m.relid, m.columns);
              break;
            case 'insert':
              batch.add(m.relid, m.row);
              break;
            case 'update':
              batch.add(m.relid, m.row);
              if (m.old) batch.add(m.relid, m.old);
              break;
            case 'delete':
              batch.add(m.relid, m.old);
              break;
            case 'truncate':
              for (const relid of m.relids) batch.everything(relid);
              break;
            case 'message':
              if (!m.transactional && !inTransaction) {
                await write();
                if (m.lsn > durable) durable = m.lsn;
              }
              break;
            case 'other':
              break;
          }
        }
        if (!batch.empty && (batch.size >= BATCH_KEYS || (!inTransaction && dueIn() === 0))) {
          await write();
        }
        if (durable > 0n) stream.acknowledge(durable);
        if (Date.now() >= nextCheck) {
          nextCheck = Date.now() + CHECK_MS;
          if (await this.shouldStop(session, slot)) return;
          // Streaming is one long step: its checks count as passes (worker health).
          this.loop.progressed();
        }
      }
    } finally {
      this.stream = undefined;
      await stream.close();
      this.log.debug({ slot, acknowledged: formatLsn(durable) }, 'WAL decoder stopped streaming');
    }
  }

  /**
   * Whether to stop streaming: this session lost its lock (the driver reconnected it), or
   * the slot is to be dropped (back on triggers, everything decoded), or it is not the
   * instance's slot any more.
   */
  private async shouldStop(session: Session, slot: string): Promise<boolean> {
    const [row] = await session.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
    if (row?.pid !== this.leaderPid) {
      this.leaderPid = undefined;
      return true;
    }
    const state = await this.state(session);
    return state.wal_slot !== slot || this.drained(state);
  }
}
