import type postgres from 'postgres';

/**
 * Parsers and serializers for Postgres's built-in array types, so that postgres.js
 * clients can run with `fetch_types: false` (see ADR 0007).
 *
 * postgres.js learns array types by querying `pg_type` as the first statement of every
 * connection, from a promise nobody awaits: when that connection is terminated mid-query
 * (a failover, `pg_terminate_backend`, a restart) the rejection escapes as an
 * `unhandledRejection`, which ends a Node process (porsager/postgres#1192, #1205, #1223).
 * Built-in types have fixed OIDs (they are part of Postgres's catalog data, the same on
 * every server), so the arrays the engine and its users' keys need are declared here
 * instead. Arrays of other types (enums, domains, composites) come back as their text.
 */

type Scalar = (text: string) => unknown;
type Serialize = (value: unknown) => string;

const asNumber: Scalar = (x) => +x;
const asBoolean: Scalar = (x) => x === 't';
const asJson: Scalar = (x) => JSON.parse(x);
const asDate: Scalar = (x) => new Date(x);
const asBytes: Scalar = (x) => Buffer.from(x.slice(2), 'hex');

const toText: Serialize = (x) =>
  x instanceof Date
    ? x.toISOString()
    : x instanceof Uint8Array
      ? `\\x${Buffer.from(x).toString('hex')}`
      : typeof x === 'boolean'
        ? x
          ? 't'
          : 'f'
        : String(x);
const toJson: Serialize = (x) => JSON.stringify(x);

/**
 * `[element oid, array oid, element parser]` for every built-in type with an array type;
 * element values parse as postgres.js parses the scalar type (numbers for int2/int4/oid/
 * float, booleans, JSON, Dates, Buffers), everything else stays text (int8 and numeric too,
 * as postgres.js returns them). A test checks these pairs against `pg_type`.
 */
export const BUILTIN_ARRAY_TYPES: ReadonlyArray<readonly [number, number, Scalar?]> = [
  [16, 1000, asBoolean], // bool
  [17, 1001, asBytes], // bytea
  [18, 1002], // char
  [19, 1003], // name
  [20, 1016], // int8
  [21, 1005, asNumber], // int2
  [22, 1006], // int2vector
  [23, 1007, asNumber], // int4
  [24, 1008], // regproc
  [25, 1009], // text
  [26, 1028, asNumber], // oid
  [27, 1010], // tid
  [28, 1011], // xid
  [29, 1012], // cid
  [30, 1013], // oidvector
  [114, 199, asJson], // json
  [142, 143], // xml
  [600, 1017], // point
  [601, 1018], // lseg
  [602, 1019], // path
  [603, 1020], // box
  [604, 1027], // polygon
  [628, 629], // line
  [650, 651], // cidr
  [700, 1021, asNumber], // float4
  [701, 1022, asNumber], // float8
  [718, 719], // circle
  [774, 775], // macaddr8
  [790, 791], // money
  [829, 1040], // macaddr
  [869, 1041], // inet
  [1033, 1034], // aclitem
  [1042, 1014], // bpchar
  [1043, 1015], // varchar
  [1082, 1182, asDate], // date
  [1083, 1183], // time
  [1114, 1115, asDate], // timestamp
  [1184, 1185, asDate], // timestamptz
  [1186, 1187], // interval
  [1266, 1270], // timetz
  [1560, 1561], // bit
  [1562, 1563], // varbit
  [1700, 1231], // numeric
  [1790, 2201], // refcursor
  [2202, 2207], // regprocedure
  [2203, 2208], // regoper
  [2204, 2209], // regoperator
  [2205, 2210], // regclass
  [2206, 2211], // regtype
  [2249, 2287], // record
  [2275, 1263], // cstring
  [2950, 2951], // uuid
  [2970, 2949], // txid_snapshot
  [3220, 3221], // pg_lsn
  [3614, 3643], // tsvector
  [3615, 3645], // tsquery
  [3642, 3644], // gtsvector
  [3734, 3735], // regconfig
  [3769, 3770], // regdictionary
  [3802, 3807, asJson], // jsonb
  [3904, 3905], // int4range
  [3906, 3907], // numrange
  [3908, 3909], // tsrange
  [3910, 3911], // tstzrange
  [3912, 3913], // daterange
  [3926, 3927], // int8range
  [4072, 4073], // jsonpath
  [4089, 4090], // regnamespace
  [4096, 4097], // regrole
  [4191, 4192], // regcollation
  [4451, 6150], // int4multirange
  [4532, 6151], // nummultirange
  [4533, 6152], // tsmultirange
  [4534, 6153], // tstzmultirange
  [4535, 6155], // datemultirange
  [4536, 6157], // int8multirange
  [5038, 5039], // pg_snapshot
  [5069, 271], // xid8
];

/** box is the one built-in type whose array elements are separated by `;`. */
const delimiterOf = (arrayOid: number) => (arrayOid === 1020 ? ';' : ',');

/**
 * Parses an array in Postgres's text output format (`{a,"b c",NULL,{1,2}}`, with an
 * optional `[lower:upper]=` dimension prefix) into nested JS arrays, parsing elements with
 * `element` (text when absent). Unquoted NULL is null; a quoted "NULL" is the string.
 */
export function parseArray(text: string, element?: Scalar, delimiter = ','): unknown[] {
  let i = 0;
  if (text[0] === '[') {
    i = text.indexOf('=') + 1;
  }
  const parseLevel = (): unknown[] => {
    // text[i] is '{'
    i += 1;
    const out: unknown[] = [];
    if (text[i] === '}') {
      i += 1;
      return out;
    }
    for (;;) {
      const c = text[i];
      if (c === '{') {
        out.push(parseLevel());
      } else if (c === '"') {
        let value = '';
        i += 1;
        while (text[i] !== '"') {
          if (text[i] === '\\') i += 1;
          value += text[i];
          i += 1;
          if (i > text.length) throw new Error(`malformed array literal: ${text}`);
        }
        i += 1;
        out.push(element ? element(value) : value);
      } else {
        let end = i;
        while (end < text.length && text[end] !== delimiter && text[end] !== '}') end += 1;
        const raw = text.slice(i, end);
        i = end;
        out.push(raw.toUpperCase() === 'NULL' ? null : element ? element(raw) : raw);
      }
      if (text[i] === delimiter) {
        i += 1;
      } else if (text[i] === '}') {
        i += 1;
        return out;
      } else {
        throw new Error(`malformed array literal: ${text}`);
      }
    }
  };
  if (text[i] !== '{') throw new Error(`malformed array literal: ${text}`);
  return parseLevel();
}

/**
 * A JS array as a Postgres array literal, every element quoted. Nested arrays are further
 * dimensions, except for JSON elements (`json`), where an array is a JSON value.
 */
export function serializeArray(
  value: unknown,
  element: Serialize = toText,
  delimiter = ',',
  json = false,
): string {
  if (!Array.isArray(value)) return element(value);
  const items = value.map((x) => {
    if (x === null || x === undefined) return 'NULL';
    if (Array.isArray(x) && !json) return serializeArray(x, element, delimiter);
    return `"${element(x).replace(/[\\"]/g, '\\$&')}"`;
  });
  return `{${items.join(delimiter)}}`;
}

/** The `types` option that teaches a postgres.js client every built-in array type. */
export function builtinArrayTypes(): Record<string, postgres.PostgresType> {
  const types: Record<string, postgres.PostgresType> = {};
  for (const [elementOid, arrayOid, element] of BUILTIN_ARRAY_TYPES) {
    const delimiter = delimiterOf(arrayOid);
    const json = elementOid === 114 || elementOid === 3802;
    types[`array_${arrayOid}`] = {
      to: arrayOid,
      from: [arrayOid],
      serialize: (xs: unknown) => serializeArray(xs, json ? toJson : toText, delimiter, json),
      parse: (text: string) => parseArray(text, element, delimiter),
    };
  }
  return types;
}
