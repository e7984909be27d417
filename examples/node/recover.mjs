// Give back what dead consumers held: one FCALL broker_recover.
//
//   node recover.mjs SUB_ID
//
// A consumer whose lease passed (it received, then died or hung without acknowledging) is
// dead: its in-flight messages go back to the head of their priority band, each with its
// delivery count raised, and a message delivered too often (max redeliveries, 10) becomes a
// poison message. The workers do this on every sweep; any consumer may do it too.
//
// Prints "recovered consumers=<n> given_back=<n> poison=<n>".
import { commandLine, connect, main, subscriptionKey } from './broker.mjs';

const { positionals } = commandLine('node recover.mjs SUB_ID', {}, ({ positionals }) => positionals.length === 1);
const [subId] = positionals;

await main(async () => {
  const client = await connect();
  try {
    // FCALL broker_recover 1 <sub key> -> [consumers recovered, given back, made poison]
    // (its arguments, all optional: now, max redeliveries, poison cap, ...: docs/protocol.md)
    const [consumers, givenBack, poison] = await client.fCall('broker_recover', {
      keys: [subscriptionKey(subId)],
    });
    console.log(`recovered consumers=${consumers} given_back=${givenBack} poison=${poison}`);
  } finally {
    await client.close();
  }
});
