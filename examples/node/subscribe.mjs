// Create a durable subscription, in one of the protocol's two ways:
//
//   node subscribe.mjs [--client-id app] [--name orders] [--mode exclusive] FILTER
//     as an administrator: its record in the subscription hash and a bump of the routing
//     table's version, in one transaction (MULTI/EXEC);
//   node subscribe.mjs --request [--client-id app] [--name orders] [--timeout-s 10] FILTER
//     as a subscriber user (security on: it may not write the subscription hash): one FCALL
//     broker_request (a subscribe request on its control stream {QM1}:ctl:<client id>), then one
//     BLPOP of the broker's answer; the workers check the user's subscribe grants and make the subscription.
//
// The subscription id is <client id>$<name> (app$orders); the workers see the new version
// with their next dequeue and deliver to the subscription from then on. FILTER is an MQTT
// filter ('+' one level, '#' the rest). --mode: exclusive (one consumer at a time, the
// broker's default), shared (consumers share the messages) or activestandby.
// Prints "subscribed <sub id> to <filter>" ("(replaced)" when the record existed), or, for a
// refused request, "error: <the broker's reason>" and exit status 3.
import { randomUUID } from 'node:crypto';
import {
  commandLine, connect, controlStream, main, subscriptionKey, subscriptions, version,
} from './broker.mjs';

const NAME = /^[A-Za-z0-9_.-]{1,128}$/; // a sub id names keys: no ':', no '$' inside its parts
const MODES = ['exclusive', 'shared', 'activestandby'];
const { values, positionals } = commandLine(
  'node subscribe.mjs [--request [--timeout-s S]] [--client-id ID] [--name NAME] [--mode exclusive|shared|activestandby] FILTER',
  {
    'client-id': { type: 'string', default: 'app' },
    name: { type: 'string', default: 'orders' },
    mode: { type: 'string', default: 'exclusive' },
    request: { type: 'boolean', default: false },
    'timeout-s': { type: 'string', default: '10' },
  },
  ({ values, positionals }) =>
    positionals.length === 1 && NAME.test(values['client-id']) && NAME.test(values.name)
    && MODES.includes(values.mode) && Number(values['timeout-s']) > 0,
);
const [filter] = positionals;
const clientId = values['client-id'];
const subId = `${clientId}$${values.name}`;

/** The administrator's way: the record and the version bump in one MULTI/EXEC. */
async function administer(client) {
  const record = JSON.stringify({ filter, durable: true, created_ms: Date.now(), mode: values.mode });
  const [created] = await client.multi().hSet(subscriptions(), subId, record).incr(version()).exec();
  console.log(`subscribed ${subId} to ${filter}${created ? '' : ' (replaced)'}`);
  console.log(`key ${subscriptionKey(subId)}`);
}

/** The subscriber's way: a request on its control stream, answered by the broker. */
async function request(client) {
  // FCALL broker_request 1 <control stream> field value ...: returns [entry id, the answer's key]
  const [, answerKey] = await client.fCall('broker_request', {
    keys: [controlStream(clientId)],
    arguments: ['op', 'subscribe', 'name', values.name, 'topic', filter, 'durable', '1', 'reply', randomUUID()],
  });
  const answer = await client.blPop(answerKey, Number(values['timeout-s']));
  if (answer === null) throw new Error(`no answer within ${values['timeout-s']} s (are the workers running with security on?)`);
  const got = JSON.parse(answer.element);
  if (!got.ok) {
    console.error(`error: ${got.error}`);
    process.exitCode = got.exit_code || 3;
    return;
  }
  console.log(`subscribed ${got.subscription} to ${filter}`);
  console.log(`key ${subscriptionKey(got.subscription)}`);
}

await main(async () => {
  const client = await connect();
  try {
    await (values.request ? request(client) : administer(client));
  } finally {
    await client.close();
  }
});
