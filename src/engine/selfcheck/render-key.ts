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
