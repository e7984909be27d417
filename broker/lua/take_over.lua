-- Fetch entries another worker dequeued (a hand-over, or a dead worker's
-- entries) for the worker holding their publisher's turn. Only the first K ids (each
-- publisher's FIFO head) are claimed (XCLAIM), which counts a new delivery;
-- the others are only read, their delivery count untouched, so that a worker
-- dying on one entry is charged to that entry alone and an entry that keeps
-- killing its workers can be dead-lettered (max_deliveries). The unit of work
-- XACKs an entry whichever consumer's pending list holds it.
--
-- KEYS[1] publish stream
-- ARGV[1] consumer group
-- ARGV[2] the worker's consumer name
-- ARGV[3] K: how many of the ids that follow count as a delivery
-- ARGV[4..] entry ids, the K counted ones first
-- returns {{entry id, {field, value, ...}, times delivered (0 when not counted)}, ...}

local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local counted = tonumber(ARGV[3])

local function xclaim(first, last)
  local args = {stream, group, consumer, 0}
  for i = first, last do args[#args + 1] = ARGV[i] end
  return redis.call('XCLAIM', unpack(args))
end

local fields_of = {}
if counted > 0 then
  for _, entry in ipairs(xclaim(4, 3 + counted)) do
    if entry and entry[2] then fields_of[entry[1]] = entry[2] end
  end
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
