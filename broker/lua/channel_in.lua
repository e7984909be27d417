-- The receiving end of a channel (broker.network.channel): file the entries a mover brought
-- from another queue manager's transmission stream into this queue manager's publish
-- stream, each once and in order, in one atomic call.
--
-- An entry's channel sequence is its id in the sender's transmission stream. One that is
-- not above the last sequence filed from that sender was filed already (the mover sent it
-- again after its own crash, a lost reply, or a restart of either server) and is dropped:
-- nothing is filed twice, and since the mover always sends in sequence order from the
-- last one filed, nothing is skipped.
--
-- The mover also says after which sequence it read the batch (the last one it knows
-- filed here). When this queue manager's record is below it, this queue manager lost
-- entries it had filed (restarted from an older AOF or snapshot, with a mover that never
-- saw the restart: its client reconnects on its own): nothing is filed, and the reply
-- gives the record, from which the mover sends again. Without this check the entries
-- between the record and the mover's sequence would never be sent again.
--
-- Every sequence is checked before the first write (Redis does not roll back a script).
--
-- KEYS[1] publish stream     "{qm}:publish"
-- KEYS[2] received           "{qm}:received"  (<from qm> -> last sequence, <from qm>:count -> filed)
-- ARGV[1] the sending queue manager
-- ARGV[2] the sequence the mover read the batch after ("" to not check it)
-- ARGV[3..] per entry: its channel sequence "<ms>-<n>", the number of field/value items n,
--   then the n items (the publication's fields, protocol version 3)
-- returns {filed, dropped, last sequence filed from that sender, behind}: behind is 1 when
--   the record was below ARGV[2] (then nothing was filed), else 0

local publish, received, sender, expected = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
require_types({{publish, 'stream'}, {received, 'hash'}})

local function split(id)
  local ms, n = string.match(id, '^(%d+)-(%d+)$')
  if not ms then return nil end
  return tonumber(ms), tonumber(n)
end

-- read every entry first: a malformed one stops the call before any write
local entries = {}
local i = 3
while i <= #ARGV do
  local seq, count = ARGV[i], tonumber(ARGV[i + 1])
  if not split(seq) or not count or count < 2 or count % 2 ~= 0 or i + 1 + count > #ARGV then
    return redis.error_reply('BROKER bad channel batch at item ' .. i)
  end
  entries[#entries + 1] = {seq, i + 2, count}
  i = i + 2 + count
end

local last = redis.call('HGET', received, sender) or '0-0'
local last_ms, last_n = split(last)
if not last_ms then last_ms, last_n = 0, 0 end
if expected ~= '' then
  local want_ms, want_n = split(expected)
  if not want_ms then return redis.error_reply('BROKER bad channel batch: sequence ' .. expected) end
  if last_ms < want_ms or (last_ms == want_ms and last_n < want_n) then
    return {0, 0, last, 1}
  end
end
local filed, dropped = 0, 0
for _, entry in ipairs(entries) do
  local ms, n = split(entry[1])
  if ms > last_ms or (ms == last_ms and n > last_n) then
    redis.call('XADD', publish, '*', unpack(ARGV, entry[2], entry[2] + entry[3] - 1))
    last, last_ms, last_n = entry[1], ms, n
    filed = filed + 1
  else
    dropped = dropped + 1
  end
end
if filed > 0 then
  redis.call('HSET', received, sender, last)
  redis.call('HINCRBY', received, sender .. ':count', filed)
end
return {filed, dropped, last, 0}
