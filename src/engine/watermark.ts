import type { CallRunner } from './calls.js';
import type { Session } from './db/session.js';
import { TrellisError } from './errors.js';
import { quoteIdent } from './identifiers.js';

/** Tokens of earlier versions: a snapshot alone. */
const PREFIX_V1 = 'wm1:';
/** A snapshot and the WAL insert position when it was taken (`wm2:<snapshot>@<lsn>`). */
const PREFIX = 'wm2:';
const SNAPSHOT = /^\d+:\d+:(\d+(,\d+)*)?$/;
const LSN = /^[0-9A-F]+\/[0-9A-F]+$/i;
/** An idle WAL is moved on (to be decoded past a token's position) at most this often. */
const NUDGE_MS = 100;

/** The longest wait `awaitConverged` accepts: what a Node timer can hold (about 24.8 days). */
export const MAX_WAIT_MS = 2 ** 31 - 1;

/** Checks of waiting calls: the first soon after a wait starts, then less often. */
const FIRST_CHECK_MS = 5;
const MAX_CHECK_MS = 50;

/**
 * A token standing for "every write committed so far": the server's current snapshot, and
 * the WAL insert position read after it was taken (every transaction the snapshot sees
 * committed wrote its commit record before that position: under WAL capture, a write is in
 * the ledger once the slot has acknowledged past it; ADR 0023). Opaque to callers; only
 * awaitConverged reads it.
 */
export async function watermarkToken(session: Session): Promise<string> {
  const [row] = await session.query<{ snap: string; lsn: string }>(
    'SELECT pg_current_snapshot()::text AS snap, pg_current_wal_insert_lsn()::text AS lsn',
  );
  return `${PREFIX}${row!.snap}@${row!.lsn}`;
}

/** What a token stands for: a snapshot, and (tokens of this version) a WAL position. */
interface Token {
  snap: string;
  lsn: string | null;
}

function tokenOf(token: string): Token {
  let snap = '';
  let lsn: string | null = null;
  if (typeof token === 'string' && token.startsWith(PREFIX)) {
    const [s, l, ...rest] = token.slice(PREFIX.length).split('@');
    if (rest.length === 0 && l !== undefined && LSN.test(l)) {
      snap = s ?? '';
      lsn = l;
    }
  } else if (typeof token === 'string' && token.startsWith(PREFIX_V1)) {
    snap = token.slice(PREFIX_V1.length);
  }
  if (!SNAPSHOT.test(snap)) {
    throw new TrellisError(
      'validation',
      'not a watermark token: pass what watermarkToken() returned',
    );
  }
  return { snap, lsn };
}

/**
 * A paused transform converges on nothing until it is resumed: a wait on it, or on a
 * transform reading it (a chain waits for each upstream first), fails at once with
 * `conflict` rather than at its deadline (ADR 0038).
 */
function refuseIfPaused(waitedOn: string, progress: Progress): void {
  if (progress.pausedFor === null) return;
  const paused = progress.target ?? waitedOn;
  const which =
    paused === waitedOn ? `${waitedOn} is paused` : `${waitedOn} reads ${paused}, which is paused`;
  throw new TrellisError(
    'conflict',
    `${which} (${progress.pausedFor}): it does not converge until RESUME TRANSFORM ${paused} (status() says why it stopped)`,
  );
}

/** `timeoutMs` as given, or `validation`: never shortened, never stretched. */
export function waitTimeout(timeoutMs: unknown, fallback: number): number {
  if (timeoutMs === undefined) return fallback;
  if (
    typeof timeoutMs !== 'number' ||
    !Number.isFinite(timeoutMs) ||
    timeoutMs < 0 ||
    timeoutMs > MAX_WAIT_MS
  ) {
    throw new TrellisError(
      'validation',
      `awaitConverged timeoutMs must be a number of milliseconds from 0 to ${MAX_WAIT_MS}, got ${String(timeoutMs)}`,
    );
  }
  return timeoutMs;
}

interface Progress {
  /** The transform exists. */
  found: boolean;
  /** Its target's name. */
  target: string | null;
  /**
   * Why it is paused (`pause_reason`), when it is: a paused transform converges on nothing
   * until RESUME, so a wait on it (or on a transform reading it) fails at once.
   */
  pausedFor: string | null;
  /**
   * It reflects every captured write the snapshot sees (`<schema>._converged`), and its
   * sources are settled.
   */
  covered: boolean;
  /**
   * No rows came or went without DML that are still to be put into the ledger
   * (`<schema>._sources_settled`: a partition attached or detached, being corrected).
   */
  settled: boolean;
  /**
   * A source has (or had: `sources.members_changed_at`) partitions or inheritance
   * children: rows can come or go without DML there, and be corrected after the token was
   * taken, even before the wait first looks (leaving no member and no correction behind).
   */
  members: boolean;
  /** Transforms whose targets it reads (a chain). */
  upstream: number[];
  /** The instance has a replication slot (WAL capture, ADR 0023). */
  wal: boolean;
  /** The slot has acknowledged the check's WAL position (true without a slot or position). */
  decoded: boolean;
}

/** One check a wait asks for: a transform's progress on a snapshot (null: the round's). */
interface Check {
  wait: Wait;
  transform: string | number;
  snap: string | null;
  lsn: string | null;
  /** It asks again what was not there yet (paced), rather than a wait's next step. */
  poll: boolean;
  resolve: (result: Checked) => void;
}

/** A check's answer: the transform's progress, and the snapshot of the round. */
interface Checked {
  progress: Progress;
  snapshot: Token;
}

/** A check that asks again (`Check.poll`). */
const POLL = true;

interface Wait {
  settled: boolean;
  fail: (error: TrellisError) => void;
}

/**
 * The handle's convergence waits (`awaitConverged`). A wait is not a call stuck on the
 * server: it lasts as long as its caller asks (`timeoutMs`), and holds no connection while
 * it waits. All the handle's waits are checked together, one short query at a time (each
 * a call of its own, bounded by the call timeout, on a pooled session released at once),
 * so any number of waits cost one session for a moment per check, and calls always find
 * connections. A wait fails with `timeout` at its own deadline and with `shutdown` when
 * the handle shuts down; a check that fails fails the waits it was checking.
 */
export class ConvergenceWaits {
  private readonly waits = new Set<Wait>();
  private queue: Check[] = [];
  private timer: NodeJS.Timeout | undefined;
  private checking = false;
  private lastCheck = 0;
  private gap = FIRST_CHECK_MS;
  private shutDown = false;
  private lastNudge = 0;

  constructor(
    private readonly calls: CallRunner,
    private readonly schema: string,
    /** Runs first in every check (the handle's not_migrated check). */
    private readonly prepare: (session: Session) => Promise<void>,
  ) {}

  /**
   * Resolves once every write committed before `token` was taken is reflected in
   * `target` (read-your-writes). For a chain, each upstream transform converges first;
   * the target then converges on a snapshot taken after that, which covers what the
   * upstream wrote.
   */
  wait(target: string, token: string, timeoutMs: number): Promise<void> {
    if (this.shutDown) {
      return Promise.reject(
        new TrellisError('shutdown', 'awaitConverged: the handle is shut down'),
      );
    }
    let given: Token;
    try {
      given = tokenOf(token);
    } catch (error) {
      return Promise.reject(error);
    }
    return new Promise<void>((resolve, reject) => {
      const wait: Wait = {
        settled: false,
        fail: (error) => {
          if (wait.settled) return;
          wait.settled = true;
          clearTimeout(deadline);
          this.waits.delete(wait);
          reject(error);
        },
      };
      const deadline = setTimeout(
        () =>
          wait.fail(
            new TrellisError(
              'timeout',
              `${target} did not converge within ${timeoutMs} ms (is it paused, or are no staging and drain workers running?)`,
            ),
          ),
        timeoutMs,
      );
      this.waits.add(wait);
      this.gap = FIRST_CHECK_MS;

      /**
       * The snapshot to converge `t` on for `on` (a token, or `fresh`: the snapshot and WAL
       * position of the round that checks it), and `t`'s progress on it. With a slot,
       * writes `on` covers may still be in the WAL: once the slot has acknowledged past
       * its position they are in the ledger, in transactions the snapshot of a later
       * round sees (this round's was taken before it read the slot's position).
       */
      const settle = async (
        t: string | number,
        on: Token | 'fresh',
      ): Promise<{ snap: string; state: Checked }> => {
        let state =
          on === 'fresh' ? await this.check(wait, t, null) : await this.check(wait, t, on);
        const token = on === 'fresh' ? state.snapshot : on;
        if (!state.progress.found || !state.progress.wal || token.lsn === null) {
          return { snap: token.snap, state };
        }
        while (!state.progress.decoded) state = await this.check(wait, t, token, POLL);
        const later = await this.check(wait, t, null);
        return { snap: later.snapshot.snap, state: later };
      };

      // Each upstream transform converges on the token once per wait, however many paths
      // lead to it (a set operation's parts share branches: walked path by path, the waits
      // grew with the paths, not the parts), and upstreams of one transform converge side
      // by side, so their checks share rounds.
      const upstreamDone = new Map<number, Promise<void>>();
      const convergeUpstream = (up: number, on: Token): Promise<void> => {
        let done = upstreamDone.get(up);
        if (done === undefined) {
          done = converge(up, on);
          upstreamDone.set(up, done);
        }
        return done;
      };

      const converge = async (t: string | number, on: Token): Promise<void> => {
        const first = await settle(t, on);
        if (!first.state.progress.found) {
          if (typeof t === 'string') {
            throw new TrellisError('not_found', `there is no transform named ${t}`);
          }
          return; // an upstream transform dropped meanwhile
        }
        refuseIfPaused(target, first.state.progress);
        await Promise.all(first.state.progress.upstream.map((up) => convergeUpstream(up, on)));
        // Upstream writes happened after `on`: wait for them through a fresh snapshot.
        const chained = first.state.progress.upstream.length > 0;
        const { snap: start, state: startState } = chained ? await settle(t, 'fresh') : first;
        let current = start;
        let state = startState;
        // Where rows can come or go without DML, a change the token saw (an ATTACH, say)
        // is corrected later, its keys written into the ledger after the token: converge
        // on a snapshot of a round that saw the sources settled, which sees those keys.
        let pinned = !state.progress.members;
        for (;;) {
          // Not there yet (a poll, paced), or a step on (checked in the next round).
          let poll = POLL;
          if (!state.progress.settled) {
            pinned = false;
          } else if (!pinned) {
            current = state.snapshot.snap;
            pinned = true;
            poll = !POLL;
          } else if (state.progress.covered) {
            return;
          }
          state = await this.check(wait, t, { snap: current, lsn: null }, poll);
          if (state.progress.found) refuseIfPaused(target, state.progress);
        }
      };
      converge(target, given).then(
        () => {
          if (wait.settled) return;
          wait.settled = true;
          clearTimeout(deadline);
          this.waits.delete(wait);
          resolve();
        },
        (error: unknown) =>
          wait.fail(
            error instanceof TrellisError
              ? error
              : new TrellisError('unknown', String(error), { cause: error }),
          ),
      );
    });
  }

  /** Fails every wait with `shutdown`; later waits are refused the same way. */
  shutdown(): void {
    this.shutDown = true;
    clearTimeout(this.timer);
    for (const wait of [...this.waits]) {
      wait.fail(
        new TrellisError('shutdown', 'the handle was shut down while awaitConverged waited'),
      );
    }
    this.queue = [];
  }

  /**
   * A transform's progress on `on` (null: on the snapshot and WAL position of the round
   * that checks it), and that round's snapshot. A `poll` asks again what was not there
   * yet, and is paced; any other check is a wait's next step, made in the next round.
   */
  private check(
    wait: Wait,
    transform: string | number,
    on: Token | null,
    poll = !POLL,
  ): Promise<Checked> {
    return new Promise((resolve) => {
      this.queue.push({
        wait,
        transform,
        snap: on?.snap ?? null,
        lsn: on?.lsn ?? null,
        poll,
        resolve,
      });
      this.schedule();
    });
  }

  /**
   * The next round of checks, one at a time: at once when a wait has a next step to check,
   * else (every check a poll) FIRST_CHECK_MS to MAX_CHECK_MS after the last.
   */
  private schedule(): void {
    if (this.checking || this.timer !== undefined || this.shutDown) return;
    const stepping = this.queue.some((c) => !c.poll && !c.wait.settled);
    const delay = stepping ? 0 : Math.max(0, this.lastCheck + this.gap - Date.now());
    this.timer = setTimeout(() => {
      this.timer = undefined;
      void this.round();
    }, delay);
  }

  private async round(): Promise<void> {
    const checks = this.queue.filter((c) => !c.wait.settled);
    this.queue = [];
    if (checks.length === 0) return;
    this.checking = true;
    try {
      const result = await this.calls.run('awaitConverged', async (session) => {
        await this.prepare(session);
        return this.query(session, checks);
      });
      checks.forEach((c, i) => {
        c.resolve({ progress: result.progress[i]!, snapshot: result.snapshot });
      });
    } catch (error) {
      const failure =
        error instanceof TrellisError
          ? error
          : new TrellisError('unknown', String(error), { cause: error });
      for (const c of checks) c.wait.fail(failure);
    } finally {
      this.checking = false;
      this.lastCheck = Date.now();
      // Polls back off; a wait that stepped on looks again soon.
      this.gap = checks.some((c) => !c.poll)
        ? FIRST_CHECK_MS
        : Math.min(MAX_CHECK_MS, this.gap * 2);
      if (this.queue.length > 0) this.schedule();
    }
  }

  /**
   * Every check of a round in one query, and the round's snapshot and WAL position (those
   * of checks on the round's own). Identical checks (many waits on one transform and
   * token) are made once.
   */
  private async query(
    session: Session,
    checks: Check[],
  ): Promise<{ progress: Array<Progress | undefined>; snapshot: Token }> {
    const s = quoteIdent(this.schema);
    const unique = new Map<string, number>();
    const of = checks.map((c) => {
      const key = `${typeof c.transform}:${c.transform}:${c.snap}:${c.lsn}`;
      let index = unique.get(key);
      if (index === undefined) {
        index = unique.size;
        unique.set(key, index);
      }
      return index;
    });
    const rows = [...unique.keys()].map((key) => checks[of.indexOf(unique.get(key)!)]!);
    const names = rows.map((c) => (typeof c.transform === 'string' ? c.transform : null));
    const ids = rows.map((c) => (typeof c.transform === 'number' ? c.transform : null));
    const snaps = rows.map((c) => c.snap);
    const lsns = rows.map((c) => c.lsn);
    const [row] = await session.query<{
      snapshot: string;
      lsn: string;
      progress: Array<{
        ord: number;
        found: boolean;
        target: string | null;
        pausedFor: string | null;
        covered: boolean;
        settled: boolean;
        members: boolean;
        upstream: number[];
        wal: boolean;
        decoded: boolean;
      }>;
    }>(
      `SELECT pg_current_snapshot()::text AS snapshot, pg_current_wal_insert_lsn()::text AS lsn,
              coalesce((
                SELECT json_agg(json_build_object(
                         'ord', r.ord, 'found', t.id IS NOT NULL, 'target', t.target_name,
                         'pausedFor', CASE WHEN t.paused_at IS NOT NULL
                                           THEN coalesce(t.pause_reason, 'operator') END,
                         -- Rows attached or detached without DML are re-derived too
                         -- (corrections): not covered until they are.
                         'settled', coalesce(st.settled, false),
                         'covered', coalesce(st.settled AND ${s}._converged(t.id, coalesce(r.snap::pg_snapshot, pg_current_snapshot())), false),
                         'members', EXISTS (
                           SELECT 1 FROM ${s}.transform_sources ts
                             LEFT JOIN ${s}.sources src ON src.source_oid = ts.source_oid
                            WHERE ts.transform_id = t.id
                              AND (EXISTS (SELECT 1 FROM ${s}._descendants(ts.source_oid))
                                   OR EXISTS (SELECT 1 FROM ${s}.source_members m
                                               WHERE m.source_id = src.id)
                                   OR src.members_changed_at IS NOT NULL)),
                         -- What it reads that a transform writes: targets, and a
                         -- union's table (fed by its branches, ADR 0059).
                         'upstream', ARRAY(SELECT ${s}._upstream_ids(t.id)),
                         'wal', (SELECT c.wal_slot IS NOT NULL FROM ${s}.config c),
                         'decoded', ${s}._wal_decoded(CASE WHEN r.snap IS NULL THEN pg_current_wal_insert_lsn()
                                                                     ELSE r.lsn::pg_lsn END))
                         ORDER BY r.ord)
                  FROM unnest($1::text[], $2::int[], $3::text[], $4::text[])
                       WITH ORDINALITY AS r(name, id, snap, lsn, ord)
                  LEFT JOIN ${s}.transforms t
                    ON CASE WHEN r.id IS NOT NULL THEN t.id = r.id ELSE t.target_name = r.name END
                  LEFT JOIN LATERAL (SELECT ${s}._sources_settled(t.id) AS settled) st ON t.id IS NOT NULL),
                '[]') AS progress`,
      [names, ids, snaps, lsns],
    );
    const found: Array<Progress | undefined> = [];
    let behind = false;
    for (const p of row?.progress ?? []) {
      found[p.ord - 1] = {
        found: p.found,
        target: p.target,
        pausedFor: p.pausedFor,
        covered: p.covered,
        settled: p.settled,
        members: p.members,
        upstream: p.upstream,
        wal: p.wal,
        decoded: p.decoded,
      };
      behind ||= p.wal && !p.decoded;
    }
    // The slot acknowledges what the WAL sender has read; on an idle database the WAL may
    // end right at a token's position (or in a page header just before it). A commit
    // record moves it on, and the decoder's acknowledgement follows.
    if (behind && Date.now() - this.lastNudge >= NUDGE_MS) {
      this.lastNudge = Date.now();
      await session.query('SELECT pg_current_xact_id()');
    }
    return {
      progress: of.map((i) => found[i]),
      snapshot: { snap: row!.snapshot, lsn: row!.lsn },
    };
  }
}
