import { formatExplanation } from '../../engine/catalog/explain.js';
import { TrellisError } from '../../engine/errors.js';
import { connectCli, printJson } from '../connect.js';
import { type ConnectionFlags, defineCommand, type JsonFlag } from '../define-command.js';

export const explain = defineCommand<ConnectionFlags & JsonFlag>({
  name: 'explain',
  summary: 'show how a transform is (or a statement would be) kept: parts, modes, state, indexes',
  description: `Shows how a transform is kept (Trellis.explain()): its parts (derived tables, WITH
queries, UNION branches, each a hidden transform) in the order a change flows through
them, how each is maintained (delta, group recompute, re-derive) and why, the source
indexes each uses or needs (with the CREATE INDEX that makes them), and the SQL the drain
runs for changed keys. --json prints the explanation as an object.

Given a TRANSFORM statement instead of a name (quoted, EXPLAIN in front optional), shows
the plan it would get without defining anything (EXPLAIN TRANSFORM): the same, with the
state it would keep per row and no drain SQL; a statement defining would refuse exits as
defining it would (2 for parse and validation), with the reason.`,
  connects: true,
  json: true,
  setup(command) {
    command.argument('<target>', 'the transform, or a TRANSFORM statement to explain');
  },
  epilog: `Examples:
  trellis explain orders_by_customer
  trellis explain q13 --json | jq '.parts[].mode'
  trellis explain 'TRANSFORM t AS SELECT g, count(*) AS n FROM items GROUP BY g'`,
  async run({ operands, options, io }) {
    const [target] = operands;
    await using trellis = await connectCli(options, io, 'explain');
    const explanation = await trellis.explain(target!);
    const refused = explanation.refused;
    if (options.json) printJson(io, explanation);
    else if (!refused) io.out(formatExplanation(explanation));
    // A refused statement: the reason, and the exit status defining it would have.
    if (refused) {
      const hint = refused.hint ? ` (${refused.hint})` : '';
      throw new TrellisError(refused.code, `${refused.message}${hint}`);
    }
  },
});
