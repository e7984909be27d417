#!/usr/bin/env bash
# The broker's protocol from a shell, with redis-cli only (docs/protocol.md): make a
# subscription, publish with a result, receive (a body that is not UTF-8 too), acknowledge,
# and recover the messages of a consumer that was killed. Run it with the server and a
# worker running (broker server; broker worker), as a user that may make subscriptions:
#
#   CLI="redis-cli" PORT=6380 QM=QM1 bash examples/redis-cli/consume.sh
#
# Each step prints one line the test suite checks (tests/integration/test_examples.py).
set -euo pipefail
export LC_ALL=C
CLI=${CLI:-redis-cli}
PORT=${PORT:-6380}
QM=${QM:-QM1}
cli() { "$CLI" -p "$PORT" "$@"; }
SUB='app$orders'
KEY="{$QM}:sub:$SUB"          # the subscription's key: every FCALL takes it, and only it

# Subscribe (an administrator's step): one hash field and a version bump, in one transaction.
# Shared: several consumers of this example take from it in turn.
cli <<END >/dev/null
MULTI
HSET '{$QM}:subs' '$SUB' '{"filter":"/ORDERS/+","durable":true,"created_ms":0,"mode":"shared"}'
INCR '{$QM}:version'
EXEC
END

# Publish, asking for the result: one XADD, then one BLPOP on the reply key
# ({qm}:reply:<byte length of the publisher id>:<publisher id>:<msgid>)
publish() {  # msgid, then the body on standard input (-x: binary-safe, the last argument)
  cli -x XADD "{$QM}:publish" '*' publisher svc-7 topic /ORDERS/EU msgid "$1" reply 1 body >/dev/null
  local result
  result=$(cli --raw BLPOP "{$QM}:reply:5:svc-7:$1" 10 | tail -n 1)
  case $result in
    *'"status":"delivered"'*) echo "published $1: delivered" ;;
    *) echo "published $1: $result"; exit 1 ;;
  esac
}
printf 'hello' | publish o-1
printf 'caf\xe9 \xff\xfe' | publish o-2      # Latin-1 and bytes that are not UTF-8

# The body of the oldest envelope in a consumer's in-flight list, in hex
# (an envelope is <header JSON>\n<body>; --raw adds one newline, which head -c -1 drops)
oldest_body_hex() {
  cli --raw LINDEX "$KEY:inflight:$1" -1 | head -c -1 | sed '1d' | od -An -tx1 | tr -d ' \n'
}
# Acknowledge the oldest envelope in flight, with the exact bytes received
ack_oldest() {
  cli --raw LINDEX "$KEY:inflight:$1" -1 | head -c -1 | cli -x FCALL broker_ack 1 "$KEY" "$1"
}

# Receive as consumer c1: up to 10 messages, a 30 s lease (the call is also its heartbeat)
cli FCALL broker_receive 1 "$KEY" c1 10 30000 >/dev/null
echo "c1 holds $(cli LLEN "$KEY:inflight:c1") messages"
for _ in 1 2; do
  echo "c1 received body $(oldest_body_hex c1), acknowledged $(ack_oldest c1)"
done

# A consumer killed while it held a message: c2 takes one and never acknowledges it
printf 'again' | publish o-3
cli FCALL broker_receive 1 "$KEY" c2 1 30000 >/dev/null
echo "c2 holds $(cli LLEN "$KEY:inflight:c2") message and is killed"
# Once its lease has passed, recover gives its messages back (the workers' sweep does it too);
# here the call is told the time just after c2's deadline instead of waiting 30 s
deadline=$(cli ZSCORE "$KEY:consumers" c2)
recovered=$(cli FCALL broker_recover 1 "$KEY" "$((deadline + 1))" | paste -sd ' ')
echo "recovered (consumers, given back, poison): $recovered"
# The next consumer receives it again, its delivery count 2 (the last element of the reply)
count=$(cli FCALL broker_receive 1 "$KEY" c3 1 30000 | tail -n 1)
echo "c3 received body $(oldest_body_hex c3), delivery count $count, acknowledged $(ack_oldest c3)"
