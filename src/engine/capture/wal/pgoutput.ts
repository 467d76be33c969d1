/**
 * The pgoutput messages WAL capture reads (logical replication protocol, version 1), parsed
 * from an XLogData payload. Only what capture needs is kept: relations' column names and
 * which are the replica identity, the column values of rows as text, the WAL positions of
 * commits and messages. Other messages (Origin, Type) come back as `other`.
 * https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html
 */

/** A row's column values in the relation's column order: text, null, or unknown. */
export type TupleValue = string | null | undefined;

export interface RelationColumn {
  name: string;
  /** Part of the relation's replica identity (its primary key, for `DEFAULT`). */
  key: boolean;
}

export type PgOutputMessage =
  | { tag: 'begin'; finalLsn: bigint }
  | { tag: 'commit'; commitLsn: bigint; endLsn: bigint }
  | { tag: 'relation'; relid: number; columns: RelationColumn[] }
  | { tag: 'insert'; relid: number; row: TupleValue[] }
  /** `old`: the old key ('K') or whole old row ('O') when sent (the key changed, or FULL). */
  | { tag: 'update'; relid: number; old: TupleValue[] | null; row: TupleValue[] }
  | { tag: 'delete'; relid: number; old: TupleValue[] }
  | { tag: 'truncate'; relids: number[] }
  | { tag: 'message'; transactional: boolean; lsn: bigint; prefix: string }
  | { tag: 'other'; type: string };

class Reader {
  offset = 0;
  constructor(private readonly buffer: Buffer) {}

  byte(): number {
    const value = this.buffer.readUInt8(this.offset);
    this.offset += 1;
    return value;
  }

  int16(): number {
    const value = this.buffer.readInt16BE(this.offset);
    this.offset += 2;
    return value;
  }

  int32(): number {
    const value = this.buffer.readInt32BE(this.offset);
    this.offset += 4;
    return value;
  }

  uint32(): number {
    const value = this.buffer.readUInt32BE(this.offset);
    this.offset += 4;
    return value;
  }

  lsn(): bigint {
    const value = this.buffer.readBigUInt64BE(this.offset);
    this.offset += 8;
    return value;
  }

  skip(bytes: number): void {
    this.offset += bytes;
  }

  /** A NUL-terminated string. */
  string(): string {
    const end = this.buffer.indexOf(0, this.offset);
    if (end < 0) throw new Error('pgoutput: unterminated string');
    const value = this.buffer.toString('utf8', this.offset, end);
    this.offset = end + 1;
    return value;
  }

  /** TupleData: per column 'n' (null), 'u' (unchanged TOAST: unknown), 't'/'b' (a value). */
  tuple(): TupleValue[] {
    const count = this.int16();
    const values: TupleValue[] = [];
    for (let i = 0; i < count; i += 1) {
      const kind = String.fromCharCode(this.byte());
      if (kind === 'n') values.push(null);
      else if (kind === 'u') values.push(undefined);
      else if (kind === 't' || kind === 'b') {
        const length = this.int32();
        values.push(this.buffer.toString('utf8', this.offset, this.offset + length));
        this.offset += length;
      } else {
        throw new Error(`pgoutput: unknown tuple column kind ${JSON.stringify(kind)}`);
      }
    }
    return values;
  }
}

/** Parses one pgoutput message (an XLogData payload, after its 25-byte header). */
export function parsePgOutput(payload: Buffer): PgOutputMessage {
  const r = new Reader(payload);
  const type = String.fromCharCode(r.byte());
  switch (type) {
    case 'B': {
      const finalLsn = r.lsn();
      return { tag: 'begin', finalLsn };
    }
    case 'C': {
      r.byte(); // flags
      const commitLsn = r.lsn();
      const endLsn = r.lsn();
      return { tag: 'commit', commitLsn, endLsn };
    }
    case 'R': {
      const relid = r.uint32();
      r.string(); // namespace
      r.string(); // name
      r.byte(); // replica identity setting
      const count = r.int16();
      const columns: RelationColumn[] = [];
      for (let i = 0; i < count; i += 1) {
        const flags = r.byte();
        const name = r.string();
        r.skip(8); // type oid, type modifier
        columns.push({ name, key: (flags & 1) === 1 });
      }
      return { tag: 'relation', relid, columns };
    }
    case 'I': {
      const relid = r.uint32();
      r.byte(); // 'N'
      return { tag: 'insert', relid, row: r.tuple() };
    }
    case 'U': {
      const relid = r.uint32();
      let marker = String.fromCharCode(r.byte());
      let old: TupleValue[] | null = null;
      if (marker === 'K' || marker === 'O') {
        old = r.tuple();
        marker = String.fromCharCode(r.byte());
      }
      if (marker !== 'N') throw new Error(`pgoutput: update without a new row (${marker})`);
      return { tag: 'update', relid, old, row: r.tuple() };
    }
    case 'D': {
      const relid = r.uint32();
      r.byte(); // 'K' or 'O'
      return { tag: 'delete', relid, old: r.tuple() };
    }
    case 'T': {
      const count = r.int32();
      r.byte(); // options (CASCADE, RESTART IDENTITY)
      const relids: number[] = [];
      for (let i = 0; i < count; i += 1) relids.push(r.uint32());
      return { tag: 'truncate', relids };
    }
    case 'M': {
      const transactional = (r.byte() & 1) === 1;
      const lsn = r.lsn();
      const prefix = r.string();
      return { tag: 'message', transactional, lsn, prefix };
    }
    default:
      return { tag: 'other', type };
  }
}

/** An LSN as Postgres writes it (`16/B374D848`). */
export function formatLsn(lsn: bigint): string {
  return `${(lsn >> 32n).toString(16).toUpperCase()}/${(lsn & 0xffffffffn).toString(16).toUpperCase()}`;
}

/** An LSN from its text form. */
export function parseLsn(text: string): bigint {
  const match = /^([0-9A-Fa-f]+)\/([0-9A-Fa-f]+)$/.exec(text);
  if (!match) throw new Error(`not an LSN: ${text}`);
  return (BigInt(`0x${match[1]}`) << 32n) | BigInt(`0x${match[2]}`);
}
