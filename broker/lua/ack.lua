#!lua flags=allow-oom
-- allow-oom: acknowledging only removes (LTRIM, LREM, HDEL), and it is how a full
-- server's memory is freed.
-- A consumer acknowledges messages it received: each is removed from its own in-flight
-- list (the exact bytes received). When the acknowledged messages are the oldest ones in
-- flight (the whole batch last received, in any order, or its oldest part), one LTRIM
-- removes them all; otherwise each is removed with LREM ... -1, searched from the
-- oldest end. A message no longer in flight (its consumer's lease lapsed and recover.lua
-- gave it back) is not counted and changes nothing. The redelivery count of each
-- message removed is forgotten.
--
-- KEYS[1] this consumer's in-flight list "{qm}:sub:<id>:inflight:<consumer>"
-- KEYS[2] the redelivery counts          "{qm}:sub:<id>:redelivered" hash entry id -> failed deliveries
-- ARGV[1..n] the envelopes acknowledged, as received
-- returns the number of messages removed from the in-flight list
-- errors "BROKER foreign key: ..." before any write when a key is foreign

local inflight, redelivered = KEYS[1], KEYS[2]
require_types({{inflight, 'list'}, {redelivered, 'hash'}})

local n = #ARGV
if n == 0 then return 0 end
local removed = {}
-- the oldest n in flight (the rightmost) are exactly the ones acknowledged: one LTRIM
local tail = redis.call('LRANGE', inflight, -n, -1)
if #tail == n then
  local wanted = {}
  for i = 1, n do wanted[ARGV[i]] = (wanted[ARGV[i]] or 0) + 1 end
  local all = true
  for i = 1, n do
    local left = wanted[tail[i]]
    if not left or left == 0 then all = false break end
    wanted[tail[i]] = left - 1
  end
  if all then
    redis.call('LTRIM', inflight, 0, -(n + 1))
    removed = tail
  end
end
if #removed == 0 then
  for i = 1, n do
    if redis.call('LREM', inflight, -1, ARGV[i]) > 0 then removed[#removed + 1] = ARGV[i] end
  end
end
if #removed > 0 and redis.call('EXISTS', redelivered) == 1 then
  for _, env in ipairs(removed) do
    local entry_id = string.match(envelope_head(env), '"entry_id":"([^"]*)"')
    if entry_id then redis.call('HDEL', redelivered, entry_id) end
  end
end
return #removed
