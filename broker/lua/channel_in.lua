-- The receiving end of a channel (broker.channel): file the entries a mover brought
-- from another queue manager's transmission stream into this queue manager's publish
-- stream, each once and in order, in one atomic call.
--
-- An entry's channel sequence is its id in the sender's transmission stream. One that is
-- not above the last sequence filed from that sender was filed already (the mover sent it
-- again after its own crash, a lost reply, or a restart of either server) and is dropped:
-- nothing is filed twice, and since the mover always sends in sequence order from the
-- last one filed, nothing is skipped.
--
-- Every sequence is checked before the first write (Redis does not roll back a script).
--
-- KEYS[1] publish stream     "{qm}:publish"
-- KEYS[2] received           "{qm}:received"  (<from qm> -> last sequence, <from qm>:count -> filed)
-- ARGV[1] the sending queue manager
-- ARGV[2..] per entry: its channel sequence "<ms>-<n>", the number of field/value items n,
--   then the n items (the publication's fields, protocol version 3)
-- returns {filed, dropped, last sequence filed from that sender}

local publish, received, sender = KEYS[1], KEYS[2], ARGV[1]
require_types({{publish, 'stream'}, {received, 'hash'}})

local function split(id)
  local ms, n = string.match(id, '^(%d+)-(%d+)$')
  if not ms then return nil end
  return tonumber(ms), tonumber(n)
end

-- read every entry first: a malformed one stops the call before any write
local entries = {}
local i = 2
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
return {filed, dropped, last}
