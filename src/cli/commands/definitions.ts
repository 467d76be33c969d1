import { connectCli, printJson } from '../connect.js';
import { type ConnectionFlags, defineCommand, type JsonFlag } from '../define-command.js';

export const definitions = defineCommand<ConnectionFlags & JsonFlag>({
  name: 'definitions',
  summary: 'list every registered transform and its statement',
  description: `Lists every registered transform (Trellis.definitions()), by target name: its
statement as the catalog holds it (applying it again defines the same transform). --json
prints the whole definitions: sources, columns, options, created and updated times.`,
  connects: true,
  json: true,
  async run({ options, io }) {
    await using trellis = await connectCli(options, io, 'definitions');
    const list = await trellis.definitions();
    if (options.json) {
      printJson(io, list);
      return;
    }
    if (list.length === 0) {
      io.out('no transforms are defined\n');
      return;
    }
    for (const d of list) io.out(`${d.target}\t${d.statement}\n`);
  },
});
