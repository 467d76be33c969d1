import type postgres from 'postgres';

/**
 * DEPRECATED, being replaced by ./oracle.ts (issue #10): this recompute is built from the
 * engine's own catalog, so a mistake in the engine's SQL is copied into both sides.
 *
 * The test suite's old oracle: a target must equal its definition recomputed from the
 * sources right now. The recompute is built from the catalog's record of the definition
 * (its FROM/JOIN clause, expressions, WHERE, GROUP BY and HAVING) and compared both ways
 * with EXCEPT ALL, as text so every column type compares.
 */
export async function differences(
  sql: postgres.Sql,
  target: string,
  schema = 'trellis',
): Promise<{ missing: unknown[]; extra: unknown[] }> {
  const [def] = await sql.unsafe(
    `SELECT t.target_oid::regclass::text AS target_sql, t.spec, t.search_path,
            ARRAY(SELECT c.name FROM "${schema}".transform_columns c WHERE c.transform_id = t.id ORDER BY c.ordinal) AS names,
            ARRAY(SELECT c.expression FROM "${schema}".transform_columns c WHERE c.transform_id = t.id ORDER BY c.ordinal) AS exprs
       FROM "${schema}".transforms t WHERE t.target_name = $1`,
    [target],
  );
  if (!def) throw new Error(`no transform ${target}`);
  const spec = def.spec as {
    from_sql: string;
    ast: { where: string | null; group_by: string[]; having: string | null };
  };
  const quote = (n: string) => `"${n.replaceAll('"', '""')}"`;
  const names = def.names as string[];
  const exprs = def.exprs as string[];
  const recompute = `SELECT ${exprs.map((e, i) => `(${e})::text AS ${quote(names[i]!)}`).join(', ')}
      FROM ${spec.from_sql}
      ${spec.ast.where ? `WHERE (${spec.ast.where})` : ''}
      ${spec.ast.group_by.length ? `GROUP BY ${spec.ast.group_by.join(', ')}` : ''}
      ${spec.ast.having ? `HAVING (${spec.ast.having})` : ''}`;
  const current = `SELECT ${names.map((n) => `${quote(n)}::text`).join(', ')} FROM ${def.target_sql}`;
  return sql.begin(async (tx) => {
    await tx.unsafe(`SET LOCAL search_path = ${def.search_path || 'pg_catalog'}`);
    const missing = await tx.unsafe(`${recompute} EXCEPT ALL ${current}`);
    const extra = await tx.unsafe(`${current} EXCEPT ALL ${recompute}`);
    return { missing: [...missing], extra: [...extra] };
  });
}
