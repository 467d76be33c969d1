import { formatExplanation } from '../../engine/catalog/explain.js';
import { connectCli, printJson } from '../connect.js';
import { type ConnectionFlags, defineCommand, type JsonFlag } from '../define-command.js';

export const explain = defineCommand<ConnectionFlags & JsonFlag>({
  name: 'explain',
  summary: 'show how a transform is kept: its parts, modes, source indexes, drain SQL',
  description: `Shows how a transform is kept (Trellis.explain()): its parts (derived tables, WITH
queries, UNION branches, each a hidden transform) in the order a change flows through
them, how each is maintained (delta, group recompute, re-derive) and why, the source
indexes each uses or needs (with the CREATE INDEX that makes them), and the SQL the drain
runs for changed keys. --json prints the explanation as an object.`,
  connects: true,
  json: true,
  setup(command) {
    command.argument('<target>', 'the transform');
  },
  epilog: `Examples:
  trellis explain orders_by_customer
  trellis explain q13 --json | jq '.parts[].mode'`,
  async run({ operands, options, io }) {
    const [target] = operands;
    await using trellis = await connectCli(options, io, 'explain');
    const explanation = await trellis.explain(target!);
    if (options.json) printJson(io, explanation);
    else io.out(formatExplanation(explanation));
  },
});
