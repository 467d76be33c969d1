/**
 * Advisory lock keys. Every lock is (class, hashtext(catalog schema)), so instances in
 * different catalog schemas of one database never contend. The classes spell ASCII tags.
 */
export const LOCK_CLASS = {
  /** Held by an installer for its transaction (migrate(), the printed install SQL). */
  migrate: 0x7472656c, // "trel"
  /** Held by apply() for its transaction: statements of one instance never interleave. */
  apply: 0x74726170, // "trap"
  /** Held, session-level, by the instance's elected staging worker. */
  staging: 0x74727374, // "trst"
  /** Held, session-level, by the instance's elected WAL decoder (ADR 0023). */
  wal: 0x7472776c, // "trwl"
  /** Held shared, session-level, by every live drain loop (hasLiveDrainWorkers). */
  drain: 0x74726472, // "trdr"
  /**
   * Held, session-level, by the session running a self-check, for as long as it runs; the
   * second key is hashtext('<schema>:<job id>'), not the schema's (selfcheck/claim-lock.ts).
   */
  selfCheck: 0x74727363, // "trsc"
  /**
   * Held shared, for its transaction, by a drain loop working for a transform (a page, a
   * range applied at once, a build's chunk or step); the second key is
   * hashtext('<schema>:<transform id>'). Loops take work for transforms nobody is serving
   * first (`<schema>._drain_ranks`, ADR 0045).
   */
  serving: 0x74727376, // "trsv"
} as const;

/**
 * SQL that tells whether some session holds `lockClass` for `schemaParam` (a `$n`
 * placeholder). pg_locks shows the second key as an unsigned oid.
 */
export function lockHeldSql(lockClass: number, schemaParam: string): string {
  return `SELECT ${lockHeldExpr(lockClass, `hashtext(${schemaParam})`)} AS held`;
}

/**
 * SQL true while some session of this database holds advisory lock (`lockClass`,
 * `keySql`), `keySql` an int4 expression. pg_locks shows the second key as an unsigned oid.
 */
export function lockHeldExpr(lockClass: number, keySql: string): string {
  return `EXISTS (
    SELECT 1 FROM pg_locks l
     WHERE l.locktype = 'advisory' AND l.granted
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND l.classid = ${lockClass}::oid
       AND l.objid = (((${keySql})::bigint + 4294967296) % 4294967296)::oid
       AND l.objsubid = 2)`;
}
