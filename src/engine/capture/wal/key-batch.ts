import type { RelationColumn, TupleValue } from './pgoutput.js';

/** One relation's part of a batch, with the columns as they were when it began. */
interface Entry {
  relid: number;
  /** Positions, in the relation's rows, of its replica identity's columns. */
  positions: number[];
  columns: string[];
  rows: string[][];
  /** A TRUNCATE, or a change whose key could not be read: the readers are rebuilt. */
  everything: boolean;
}

/**
 * The keys of decoded changes not yet written to the ledger, per relation: the values of
 * each changed row's replica identity columns (its primary key, for a `DEFAULT` identity),
 * as the walsender wrote them. `<schema>._wal_append` maps relations to sources and encodes
 * the keys as capture triggers do.
 */
export class KeyBatch {
  private entries: Entry[] = [];
  private current = new Map<number, Entry>();
  private readonly relations = new Map<number, RelationColumn[]>();
  /** Keys (rows) held. */
  size = 0;

  get empty(): boolean {
    return this.entries.length === 0;
  }

  /** A relation's columns, as a Relation message describes them (sent before its first change, and after it changed). */
  relation(relid: number, columns: RelationColumn[]): void {
    this.relations.set(relid, columns);
    // Rows keep the columns they were read with: later ones go to a new entry.
    this.current.delete(relid);
  }

  /** A changed row's key (a new row, an old key, or an old row). */
  add(relid: number, row: TupleValue[]): void {
    const entry = this.entry(relid);
    if (entry.everything) return;
    const values: string[] = [];
    for (const position of entry.positions) {
      const value = row[position];
      // Unknown (an unchanged out-of-line value) or absent: the key cannot be read.
      if (value === undefined || value === null) {
        entry.everything = true;
        return;
      }
      values.push(value);
    }
    entry.rows.push(values);
    this.size += 1;
  }

  /** Every row of the relation may have changed (a TRUNCATE). */
  everything(relid: number): void {
    const entry = this.entry(relid);
    entry.everything = true;
    this.size += 1;
  }

  /** The batch as `_wal_append` takes it; the batch is empty after. */
  take(): unknown[] {
    const changes = this.entries.map((e) =>
      e.everything ? { r: e.relid, t: true } : { r: e.relid, c: e.columns, k: e.rows },
    );
    this.entries = [];
    this.current.clear();
    this.size = 0;
    return changes;
  }

  private entry(relid: number): Entry {
    let entry = this.current.get(relid);
    if (!entry) {
      const columns = this.relations.get(relid);
      const keyed = (columns ?? []).flatMap((c, i) => (c.key ? [{ name: c.name, i }] : []));
      entry = {
        relid,
        positions: keyed.map((k) => k.i),
        columns: keyed.map((k) => k.name),
        rows: [],
        // A relation never described, or without identity columns: no key to read.
        everything: keyed.length === 0,
      };
      this.entries.push(entry);
      this.current.set(relid, entry);
    }
    return entry;
  }
}
