-- Take over entries another worker dequeued (a hand-over, or a dead worker's
-- entries). Only the first K ids (each publisher's FIFO head) count as a new
-- delivery; the others are claimed without touching their delivery count, so
-- that a worker dying on one entry is charged to that entry alone and an entry
-- that keeps killing its workers can be dead-lettered (max_deliveries).
-- Every id that still exists in the stream is returned, claimed or not (an id
-- in a FIFO is the FIFO owner's to handle).
--
-- KEYS[1] publish stream
-- ARGV[1] consumer group
-- ARGV[2] the worker's consumer name
-- ARGV[3] K: how many of the ids that follow count as a delivery
-- ARGV[4..] entry ids, the K counted ones first
-- returns {{entry id, {field, value, ...}, times delivered (0 when not counted)}, ...}

local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local counted = tonumber(ARGV[3])

local function xclaim(first, last, justid)
  local args = {stream, group, consumer, 0}
  for i = first, last do args[#args + 1] = ARGV[i] end
  if justid then args[#args + 1] = 'JUSTID' end
  return redis.call('XCLAIM', unpack(args))
end

local fields_of = {}
if counted > 0 then
  for _, entry in ipairs(xclaim(4, 3 + counted, false)) do
    if entry and entry[2] then fields_of[entry[1]] = entry[2] end
  end
end
if #ARGV > 3 + counted then
  xclaim(4 + counted, #ARGV, true)
end

local out = {}
for i = 4, #ARGV do
  local id = ARGV[i]
  local fields = fields_of[id]
  if not fields then
    local found = redis.call('XRANGE', stream, id, id)
    if found[1] then fields = found[1][2] end
  end
  if fields then
    local times = 0
    if i < 4 + counted then
      times = 1
      local info = redis.call('XPENDING', stream, group, id, id, 1)
      if info[1] then times = info[1][4] end
    end
    out[#out + 1] = {id, fields, times}
  end
end
return out
