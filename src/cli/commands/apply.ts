import type { ApplyResult } from '../../engine/statements/apply.js';
import { connectCli, printJson } from '../connect.js';
import { type ConnectionFlags, defineCommand, type JsonFlag } from '../define-command.js';

/** What a statement did, in a sentence. */
function describe(result: ApplyResult): string {
  switch (result.kind) {
    case 'transform_defined':
      return `defined transform ${result.target}: a worker backfills it`;
    case 'paused':
      return `paused ${result.address}`;
    case 'resumed':
      return result.addresses.length > 0
        ? `resumed ${result.addresses.join(', ')}`
        : 'nothing was paused: nothing resumed';
    case 'dropped':
      return `dropped transform ${result.target} and its target`;
    case 'altered':
      return `altered transform ${result.target}`;
    case 'redefining':
      return [
        `redefining transform ${result.target}: its new definition is built while the target keeps serving reads, then switched to`,
        ...result.changes.map((change) => `  ${change}`),
      ].join('\n');
  }
}

export const apply = defineCommand<ConnectionFlags & JsonFlag>({
  name: 'apply',
  summary: 'apply one statement: TRANSFORM, PAUSE, RESUME, DROP, ALTER',
  description: `Applies one statement of Trellis's grammar (Trellis.apply()) and says what it did.
A refused statement exits 2 with the part refused (and, for a parse error, the position).`,
  connects: true,
  json: true,
  setup(command) {
    command.argument('<statement>', 'the statement, quoted as one argument');
  },
  epilog: `Examples:
  trellis apply "TRANSFORM widget_prices FROM widgets SELECT price AS price"
  trellis apply "TRANSFORM widget_prices AS SELECT price FROM widgets"
  trellis apply "PAUSE TRANSFORM widget_prices.price"
  trellis apply --json "RESUME TRANSFORM widget_prices"   # {"kind": "resumed", "addresses": [...]}`,
  async run({ operands, options, io }) {
    await using trellis = await connectCli(options, io, 'apply');
    const result = await trellis.apply(operands[0]!);
    if (options.json) printJson(io, result);
    else io.out(`${describe(result)}\n`);
  },
});
