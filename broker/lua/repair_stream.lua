-- broker repair stream: move the publish stream's pending and unread entries to a
-- fresh stream under the same name, in one atomic call, in stream order, each with
-- a new id ('*'), so that a stream whose last id is exhausted or far in the future
-- takes entries again. The work moved is every entry pending in the workers' group
-- (read, not committed), every entry in a publisher's FIFO (filed, not committed)
-- and every entry after the group's last delivered id (not read): handled entries
-- (acknowledged) are dropped, each remaining one is added again to the fresh stream,
-- unread by the workers' group, which is created at its start. The FIFOs and turns
-- of the publishers in KEYS[2] are deleted, and so is KEYS[2]: the workers file the
-- moved entries again, in order, when they read them. A worker that built units of
-- work from the old entries is fenced (commit.lua: its turn is gone, and its entry
-- is not its FIFO's head), so nothing is delivered twice, and it is safe while
-- workers run. A moved entry keeps its fields, plus `msgid` = its old id when it had
-- none (its default message id, so that a publisher waiting for its result finds it
-- under the same reply key) and `ts` = its old id's ms when it had none and that is
-- not far ahead of the server's clock (its publish time, the protocol's default).
--
-- Everything is checked before the first write (lib.lua): key types, the group, the
-- number of entries (at most ARGV[3]) and of fields per entry (one XADD each). The
-- first write is an XADD to KEYS[3] (refused on a full server, writing nothing),
-- renamed over KEYS[1] once every entry is in it.
--
-- KEYS[1] publish stream            "{qm}:publish"
-- KEYS[2] active publishers set     "{qm}:publishers"
-- KEYS[3] the fresh stream, built here and renamed to KEYS[1]  "{qm}:publish:repair"
-- ARGV[1] consumer group
-- ARGV[2] per-publisher key prefix  "{qm}:pub:"  (.. publisher .. ":fifo" / ":turn")
-- ARGV[3] max_entries: the most entries moved; more refuses the repair (nothing written)
-- ARGV[4] "1": check and count only, write nothing (a dry run); "0": move
-- ARGV[5] future_ms: an old id's ms more than this ahead of the server's clock is not kept as ts
-- returns {moved, pending, unread, gone, dropped, publishers, first new id, last new id, old last id}
--   moved = pending + unread (entries added to the fresh stream); gone: ids in a FIFO or
--   pending whose entry is no longer in the stream (not moved); dropped: acknowledged
--   entries left behind; publishers: FIFOs deleted; new ids "" when none (or a dry run)

local stream, set, fresh = KEYS[1], KEYS[2], KEYS[3]
local group, prefix, max_entries = ARGV[1], ARGV[2], tonumber(ARGV[3])
local dry = ARGV[4] == '1'
local MAX_VALUES = 7900  -- unpack() takes about 8000 values: XADD key * <fields> msgid <id> ts <ms>

require_types({{stream, 'stream'}, {set, 'set'}, {fresh, 'stream'}})
if redis.call('EXISTS', fresh) == 1 then
  error({err = 'BROKER ' .. fresh .. ' exists (left by something else): remove it, then repair again'})
end
if redis.call('EXISTS', stream) == 0 then
  return {0, 0, 0, 0, 0, 0, '', '', ''}
end

-- Decimal strings compared as numbers (ids' parts go up to 2^64-1, beyond Lua's exact numbers).
local function num_less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
local function id_less(a, b)
  local ams, aseq = string.match(a, '^(%d+)-(%d+)$')
  local bms, bseq = string.match(b, '^(%d+)-(%d+)$')
  if ams ~= bms then return num_less(ams, bms) end
  return num_less(aseq, bseq)
end

local last_delivered = last_delivered_of(stream, group)
if not last_delivered then
  error({err = 'BROKER ' .. stream .. ' has no consumer group ' .. group .. ': which entries were handled '
               .. 'is unknown; start the workers (they create it again), then repair'})
end
local info = redis.call('XINFO', 'STREAM', stream)
local old_last = ''
for j = 1, #info, 2 do
  if info[j] == 'last-generated-id' then old_last = info[j + 1] end
end

local function too_many(n)
  error({err = 'BROKER ' .. n .. ' entries or more to move, over max_entries ' .. max_entries
               .. ' (one atomic call holds the server meanwhile): raise --max-entries'})
end

-- The work: ids pending, ids in FIFOs, and entries not read yet.
local wanted, ids = {}, {}
local function want(id)
  if not wanted[id] then
    wanted[id] = true
    ids[#ids + 1] = id
    if #ids > max_entries then too_many(#ids) end
  end
end
for _, p in ipairs(redis.call('XPENDING', stream, group, '-', '+', max_entries + 1)) do want(p[1]) end
local fifos = {}
for _, pub in ipairs(redis.call('SMEMBERS', set)) do
  local filed = redis.pcall('LRANGE', prefix .. pub .. ':fifo', 0, -1)
  if type(filed) == 'table' then  -- a foreign FIFO is left alone (its entries were refused)
    fifos[#fifos + 1] = pub
    for _, id in ipairs(filed) do want(id) end
  end
end
local fields_of = {}
if last_delivered ~= '18446744073709551615-18446744073709551615' then
  for _, entry in ipairs(redis.call('XRANGE', stream, '(' .. last_delivered, '+', 'COUNT', max_entries + 1)) do
    fields_of[entry[1]] = entry[2]
    want(entry[1])
  end
end
table.sort(ids, id_less)

local horizon = string.format('%.0f', now_ms() + tonumber(ARGV[5]))
local moves, pending, unread, gone = {}, 0, 0, 0
for _, id in ipairs(ids) do
  local fields = fields_of[id] or entry_fields(stream, id)
  if not fields then
    gone = gone + 1
  else
    if #fields > MAX_VALUES then
      error({err = 'BROKER entry ' .. id .. ' has ' .. (#fields / 2) .. ' fields, more than one XADD takes: '
                   .. 'remove it (XDEL) or move it by hand, then repair'})
    end
    local copy = {}
    for j = 1, #fields do copy[j] = fields[j] end
    if field_of(fields, 'msgid') == nil then
      copy[#copy + 1] = 'msgid'
      copy[#copy + 1] = id
    end
    local ms = string.match(id, '^(%d+)-')
    if field_of(fields, 'ts') == nil and not num_less(horizon, ms) then
      copy[#copy + 1] = 'ts'
      copy[#copy + 1] = ms
    end
    moves[#moves + 1] = copy
    if id_less(last_delivered, id) then unread = unread + 1 else pending = pending + 1 end
  end
end
local dropped = redis.call('XLEN', stream) - #moves
if dry then
  return {#moves, pending, unread, gone, dropped, #fifos, '', '', old_last}
end

-- Writes: the fresh stream first, then swap it in, then the group, FIFOs and turns.
local first, last = '', ''
for i, copy in ipairs(moves) do
  last = redis.call('XADD', fresh, '*', unpack(copy))
  if i == 1 then first = last end
end
if #moves > 0 then
  redis.call('RENAME', fresh, stream)
else
  redis.call('DEL', stream)
end
redis.call('XGROUP', 'CREATE', stream, group, '0', 'MKSTREAM')
for _, pub in ipairs(fifos) do
  redis.call('DEL', prefix .. pub .. ':fifo')
  if redis.call('TYPE', prefix .. pub .. ':turn')['ok'] == 'string' then
    redis.call('DEL', prefix .. pub .. ':turn')
  end
end
redis.call('DEL', set)
return {#moves, pending, unread, gone, dropped, #fifos, first, last, old_last}
