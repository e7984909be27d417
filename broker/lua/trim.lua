#!lua flags=allow-oom
-- Trim the publish stream to the entries not yet acknowledged by every worker, in one call
-- (broker.operations.maintenance.trim_acknowledged; the workers' housekeeping with the trim lock,
-- the scheduler's job without). allow-oom: trimming is how a full server's memory is freed.
--
-- An entry is safe to remove when it is older than both the oldest pending entry and the first
-- entry never delivered (trimming a pending entry would make XCLAIM drop it: a lost
-- publication): XTRIM MINID (exact) to the smaller of the group's last-delivered id plus one and
-- the oldest pending id.
--
-- KEYS[1] publish stream       "{qm}:publish"
-- KEYS[2] (optional) the trim lock "{qm}:trim_lock": taken first (SET NX PX); when another
--   worker holds it nothing is trimmed
-- ARGV[1] the workers' consumer group
-- ARGV[2] the lock's value (the worker's name), with KEYS[2]
-- ARGV[3] the lock's PX, ms, with KEYS[2]
-- returns {removed, pending}: the number of entries removed (-1 when another worker holds the
--   lock), and how many entries the group has pending (what stopped the trim; 0 when it did not
--   look: the lock taken, or nothing delivered yet)
-- errors "BROKER foreign key: ..." (KEYS[1] holds another type), before any write

local stream, group = KEYS[1], ARGV[1]
local kind = redis.call('TYPE', stream).ok
if kind == 'none' then return {0, 0} end
require_types({{stream, 'stream'}})
if KEYS[2] and not redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', ARGV[3]) then return {-1, 0} end

local last = last_delivered_of(stream, group)
if not last or last == '0-0' then return {0, 0} end

local function parts(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local ms, seq = parts(last)
local floor_ms, floor_seq = ms, seq + 1
local pending = redis.call('XPENDING', stream, group)
if pending[1] > 0 then
  local pms, pseq = parts(pending[2])
  if pms < floor_ms or (pms == floor_ms and pseq < floor_seq) then floor_ms, floor_seq = pms, pseq end
end
return {redis.call('XTRIM', stream, 'MINID', string.format('%d-%d', floor_ms, floor_seq)), pending[1]}
