-- Take over entries another worker dequeued (a hand-over, or a dead worker's
-- entries) and say how often each was delivered, so that an entry that keeps
-- failing can be dead-lettered instead of retried forever.
--
-- KEYS[1] publish stream
-- ARGV[1] consumer group
-- ARGV[2] the worker's consumer name
-- ARGV[3..] entry ids
-- returns {{entry id, {field, value, ...}, times delivered}, ...} for the entries that still exist

local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local ids = {}
for i = 3, #ARGV do ids[#ids + 1] = ARGV[i] end
local claimed = redis.call('XCLAIM', stream, group, consumer, 0, unpack(ids))
local out = {}
for _, entry in ipairs(claimed) do
  if entry and entry[2] then
    local info = redis.call('XPENDING', stream, group, entry[1], entry[1], 1)
    local times = 1
    if info[1] then times = info[1][4] end
    out[#out + 1] = {entry[1], entry[2], times}
  end
end
return out
