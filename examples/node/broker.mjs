// What every example shares: the server and queue manager they talk to, the key names they
// build (the protocol's rules: docs/protocol.md, broker/core/keys.py) and the envelope's shape.
//
// BROKER_REDIS_URL  the server (default redis://127.0.0.1:6380/0, `broker server`'s port)
// BROKER_QM         the queue manager (default QM1)
// The same variables the broker's own commands read.
import { parseArgs } from 'node:util';
import { createClient, RESP_TYPES } from 'redis';

export const REDIS_URL = process.env.BROKER_REDIS_URL || 'redis://127.0.0.1:6380/0';
export const QM = process.env.BROKER_QM || 'QM1';

/** A connected client; a server that cannot be reached is an error, not a retry loop. */
export async function connect() {
  const client = createClient({ url: REDIS_URL, socket: { reconnectStrategy: false } });
  client.on('error', () => {}); // connect() and each command reject with the error themselves
  await client.connect();
  return client;
}

/**
 * The same connection, with every bulk string replied as a Buffer: an envelope is bytes
 * (its body need not be UTF-8), and it is acknowledged with exactly the bytes received.
 */
export const binary = (client) => client.withTypeMapping({ [RESP_TYPES.BLOB_STRING]: Buffer });

/**
 * The command line (node:util parseArgs: `values` and `positionals`). An unknown option, or a
 * command line `valid` refuses, prints the usage and exits with status 2.
 */
export function commandLine(usage, options, valid) {
  let parsed = null;
  try {
    parsed = parseArgs({ allowPositionals: true, options });
  } catch (err) {
    console.error(`error: ${err.message}`);
  }
  if (parsed === null || !valid(parsed)) {
    console.error(`usage: ${usage}`);
    process.exit(2);
  }
  return parsed;
}

/**
 * Run an example's body; an error (no server, a refused command) is one line on stderr and
 * exit status 1, not a stack trace.
 */
export async function main(body) {
  try {
    await body();
  } catch (err) {
    console.error(`error: ${err.message || err}`);
    process.exitCode = 1;
  }
}

/** Every key of a queue manager starts with its hash tag: `{QM1}`. */
export const tag = (qm = QM) => `{${qm}}`;

/** The publish stream a publisher XADDs to: `{QM1}:publish`. */
export const publishStream = (qm = QM) => `${tag(qm)}:publish`;

/**
 * With security on, a publisher's ACL user (its principal) XADDs to its own ingress stream
 * `{QM1}:in:<principal>` instead; the broker moves each entry to the publish stream.
 */
export const ingressStream = (principal, qm = QM) => `${tag(qm)}:in:${principal}`;

/**
 * Where the result of a publication with `reply 1` is posted:
 * `{QM1}:reply:<n>:<publisher>:<msgid>`, `<n>` the publisher id's length in bytes.
 */
export const replyKey = (publisher, msgid, qm = QM) =>
  `${tag(qm)}:reply:${Buffer.byteLength(publisher)}:${publisher}:${msgid}`;

/** The subscription records (one hash field per subscription id): `{QM1}:subs`. */
export const subscriptions = (qm = QM) => `${tag(qm)}:subs`;

/**
 * A subscriber's control stream, `{QM1}:ctl:<client id>`: with security on, a subscriber user asks
 * the broker for a subscription with one FCALL broker_request on it (docs/protocol.md, "Subscribing as a request").
 */
export const controlStream = (clientId, qm = QM) => `${tag(qm)}:ctl:${clientId}`;

/** The routing table's version, bumped with every subscription change: `{QM1}:version`. */
export const version = (qm = QM) => `${tag(qm)}:version`;

/**
 * A subscription's key, the one key every function of the `broker` library takes:
 * `{QM1}:sub:<sub id>`; its bell is `<key>:bell`, a consumer's in-flight list
 * `<key>:inflight:<consumer id>`.
 */
export const subscriptionKey = (subId, qm = QM) => `${tag(qm)}:sub:${subId}`;

/**
 * An envelope (a Buffer) split at its first newline byte: the header (JSON, UTF-8) and the
 * body (bytes, as published).
 */
export function parseEnvelope(envelope) {
  const newline = envelope.indexOf(0x0a);
  return {
    header: JSON.parse(envelope.subarray(0, newline).toString('utf8')),
    body: envelope.subarray(newline + 1),
  };
}
