/**
 * Postgres's record text format, as `ROW(...)::text` writes it (record_out): `(a,b,c)`,
 * each value its type's text form; NULL is nothing at all; a value that is empty or holds
 * a quote, backslash, comma, parenthesis or white space is double-quoted, with `"` and `\`
 * doubled inside. The self-check reads both sides of a comparison in this form (one text
 * per row is far cheaper to hash than an array of texts), and parses only what differs.
 */
export function parseRecord(text: string, arity: number): Array<string | null> {
  if (!text.startsWith('(') || !text.endsWith(')')) {
    throw new Error(`not a record text: ${text.slice(0, 40)}`);
  }
  const values: Array<string | null> = [];
  const body = text.slice(1, -1);
  // `()` is a record of no values, or of one NULL.
  if (body.length === 0) return arity === 0 ? [] : [null];
  let i = 0;
  for (;;) {
    if (body[i] === '"') {
      let value = '';
      i += 1;
      for (;;) {
        const ch = body[i];
        if (ch === undefined) throw new Error(`unterminated quoted value in ${text.slice(0, 40)}`);
        if ((ch === '"' || ch === '\\') && body[i + 1] === ch) {
          value += ch;
          i += 2;
        } else if (ch === '"') {
          i += 1;
          break;
        } else if (ch === '\\') {
          // record_out doubles backslashes; a lone one escapes the next character.
          value += body[i + 1] ?? '';
          i += 2;
        } else {
          value += ch;
          i += 1;
        }
      }
      values.push(value);
    } else {
      const end = body.indexOf(',', i);
      const raw = end === -1 ? body.slice(i) : body.slice(i, end);
      values.push(raw.length === 0 ? null : raw);
      i = end === -1 ? body.length : end;
    }
    if (i >= body.length) break;
    i += 1; // the comma
    if (i === body.length) {
      values.push(null); // a trailing NULL
      break;
    }
  }
  if (values.length !== arity) {
    throw new Error(`record text with ${values.length} values, expected ${arity}`);
  }
  return values;
}

/**
 * A target key rendered as Trellis renders keys everywhere: a one-column key as its text
 * (null for NULL), a wider one as its text[] literal (`{1,abc}`, `{21,NULL}`).
 */
export function renderKey(key: Array<string | null>): string | null {
  if (key.length === 1) return key[0] ?? null;
  const element = (v: string | null) =>
    v === null
      ? 'NULL'
      : v === '' || /[{},"\\\s]/.test(v) || v.toUpperCase() === 'NULL'
        ? `"${v.replace(/[\\"]/g, '\\$&')}"`
        : v;
  return `{${key.map(element).join(',')}}`;
}
