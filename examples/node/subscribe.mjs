// Create a durable subscription as the protocol says: its record in the subscription hash
// and a bump of the routing table's version, in one transaction (MULTI/EXEC).
//
//   node subscribe.mjs [--client-id app] [--name orders] [--mode exclusive] FILTER
//
// The subscription id is <client id>$<name> (app$orders); the workers see the new version
// with their next dequeue and deliver to the subscription from then on. FILTER is an MQTT
// filter ('+' one level, '#' the rest). --mode: exclusive (one consumer at a time, the
// broker's default), shared (consumers share the messages) or activestandby.
// Prints "subscribed <sub id> to <filter>", and "(replaced)" when the record existed.
import { commandLine, connect, main, subscriptionKey, subscriptions, version } from './broker.mjs';

const NAME = /^[A-Za-z0-9_.-]{1,128}$/; // a sub id names keys: no ':', no '$' inside its parts
const MODES = ['exclusive', 'shared', 'activestandby'];
const { values, positionals } = commandLine(
  'node subscribe.mjs [--client-id ID] [--name NAME] [--mode exclusive|shared|activestandby] FILTER',
  {
    'client-id': { type: 'string', default: 'app' },
    name: { type: 'string', default: 'orders' },
    mode: { type: 'string', default: 'exclusive' },
  },
  ({ values, positionals }) =>
    positionals.length === 1 && NAME.test(values['client-id']) && NAME.test(values.name) && MODES.includes(values.mode),
);
const [filter] = positionals;
const subId = `${values['client-id']}$${values.name}`;
const record = JSON.stringify({ filter, durable: true, created_ms: Date.now(), mode: values.mode });

await main(async () => {
  const client = await connect();
  try {
    const [created] = await client.multi().hSet(subscriptions(), subId, record).incr(version()).exec();
    console.log(`subscribed ${subId} to ${filter}${created ? '' : ' (replaced)'}`);
    console.log(`key ${subscriptionKey(subId)}`);
  } finally {
    await client.close();
  }
});
