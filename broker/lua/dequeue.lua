-- The queue mutex (seed 004): read the next publication requests and file each
-- entry id in its publisher's FIFO, in stream order, in one atomic call.
-- Then take the turn of publishers nobody holds the turn of (up to this worker's fair
-- share of the waiting entries), and return the FIFO heads of every publisher
-- whose turn it holds. A worker holding a *saturated* publisher (a FIFO of at least
-- `heads` entries: a whole round of work on its own) takes no other turn while
-- another live worker is spare (not known to hold a saturated publisher itself: when
-- every worker is saturated, each goes on taking free turns up to its fair share, so
-- no other publisher waits for a sweep): that publisher's order makes it the pool's bottleneck,
-- so its worker serves it alone. Such a worker may read nothing (count 0: its next
-- round is full already) and ask for the next heads of that publisher with their
-- fields (ARGV[15], ARGV[16]): the entries other workers read for it are handed over
-- in this call, not in a take_over.lua round trip of their own.
--
-- Nothing is filed for a publisher whose FIFO or turn key is foreign (another
-- Redis type): its entries are refused here, in stream order (dead-lettered
-- with the reason, acknowledged, "refused" posted when asked), so none stays
-- pending. Every queue-manager-wide key is checked before XREADGROUP. A dequeue with nothing to
-- do (nothing to read, no turn, no ingress: idle_reply) writes nothing and reads only the group's
-- state: at a high rate, where every idle worker wakes for each entry, most of them are such.
--
-- KEYS[1] publish stream            "{qm}:publish"
-- KEYS[2] index version counter     "{qm}:version"
-- KEYS[3] active publishers set     "{qm}:publishers"
-- KEYS[4] live workers              "{qm}:alive" (zset scored by last heartbeat, ms)
-- KEYS[5] dead-letter stream        "{qm}:dlq"
-- KEYS[6] principals                "{qm}:principals" (principal -> publisher ids, one per line)
-- KEYS[7] saturated workers         "{qm}:saturated" (worker -> ms of its last dequeue that found
--                                   it holding a saturated publisher; written here)
-- KEYS[8] entries handled alone     "{qm}:alone" (take_over in lib.lua; not type-checked here:
--                                   read and written with pcall, only when heads are taken over)
-- KEYS[9] wake-up list              "{qm}:wake" (worker.waiting; LPOP with pcall: a foreign key is skipped):
--                                   a wake-up nobody waited for (every idle worker on the stream, at a
--                                   high rate) is taken here, the publishers it names (a JSON list:
--                                   turns given up) considered as those of ARGV[19..] are
-- KEYS[10] delayed publications     "{qm}:delayed" (zset; touched only for an entry with a
--                                   delivery_time field, or when ARGV[18] asks: type-checked then)
-- ARGV[1] consumer group
-- ARGV[2] consumer name, also the worker's fencing token
-- ARGV[3] count: the most entries to read (0: read nothing, move nothing from ingress streams)
-- ARGV[4] per-publisher key prefix  "{qm}:pub:"  (keys are prefix .. publisher .. ":fifo" / ":turn")
-- ARGV[5] lease_ms of a publisher's turn
-- ARGV[6] heads: the most FIFO entry ids to return per turns publisher
-- ARGV[7] malformed publisher id, for entries without a valid "publisher" field
-- ARGV[8] liveness_ms: a worker whose last heartbeat is older is not counted
-- ARGV[9] most bytes of a publisher id
-- ARGV[10] reply key prefix         "{qm}:reply:" (id_key in lib.lua)
-- ARGV[11] reply_ttl_ms
-- ARGV[12] approximate cap of the dead-letter stream, records
-- ARGV[13] max_body_bytes: a dead letter keeps a field (the body) only up to this size
-- ARGV[14] ingress stream prefix    "{qm}:in:" (.. principal)
-- ARGV[15] publisher whose next heads to take over here ("" for none), if the worker holds its turn
-- ARGV[16] the entry id after which the worker has read none of them ("ms-seq"): only heads
--          after it are taken over (take_over in lib.lua: the FIFO head counted, when it is one)
-- ARGV[17] now: the worker's clock, ms since the epoch (delivery times are compared with it)
-- ARGV[18] "1": release the delayed publications due by ARGV[17] (the worker knows one is due), else "0"
-- ARGV[19..] publishers whose turn the worker believes it holds
-- returns {version, last_delivered_id or "", entries, turns, active, live, fair, taken_over, spare}
--   entries: XREADGROUP's entries {{id, {field, value, ...}}, ...}, less those refused here
--   turns:   {publisher, {head ids...}, backlog, publisher, {head ids...}, backlog, ...}
--   active:  publishers with entries waiting; live: workers seen within liveness_ms;
--   fair:    entries waiting per live worker (this worker's fair share of the work), less the
--            saturated publishers other workers hold, and those workers
--   taken_over: {{entry id, {field, value, ...}, times delivered (0 when not counted)}, ...}
--   spare:   other live workers not known to hold a saturated publisher (0: every other one does)
--   impersonations (only when there are any): {principal, claimed publisher id, ingress entry id, ...}
--            for each ingress entry dead-lettered here under a publisher id not bound to its principal
--            ({} when there are none but an 11th element follows)
--   delayed (11th, only when this call delayed or released a publication, or ARGV[18] asked):
--            {the earliest delivery time still waiting, ms ("" when none), publications moved in or out
--            of {qm}:delayed by this call}
--
-- Delivery delay (Jakarta Messaging 2.0 section 7.9, JMSDeliveryTime; Artemis scheduled delivery): an
-- entry read with a delivery_time field (digits, at most 15) and no delayed_from field is moved into
-- KEYS[10] (acknowledged, not filed), whatever its time, so that publications of equal delivery time
-- keep their stream order; then, before anything is filed, every entry due by ARGV[17] is moved back
-- (at most RELEASE_MAX) in (delivery time, original entry id) order, each XADDed with all its fields
-- plus delayed_from (its original entry id), ts and msgid (the original's, when it had none), and read
-- again in this call when the read had room (they are the stream's last entries), to be delivered as
-- any entry. A delivery_time that is not digits passes through: the worker refuses it.

local stream, group, token = KEYS[1], ARGV[1], ARGV[2]
local prefix, lease_ms, heads = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local malformed, max_pub = ARGV[7], tonumber(ARGV[9])
local ctx = {stream = stream, group = group, dlq = KEYS[5], dlq_len = ARGV[12], max_body = tonumber(ARGV[13]),
             reply_prefix = ARGV[10], reply_ttl = ARGV[11]}
local FIRST_OWNED = 19
local RELEASE_MAX = 1000
local delay_now, release_asked = ARGV[17], ARGV[18] == '1'

-- An empty dequeue (at a high rate every idle worker wakes for an entry one of them takes): nothing
-- to read (the group's lag is 0), no turn held or named (ARGV, a wake-up), no ingress, no record of
-- a saturated publisher to remove: answered from the group's state alone. Nothing is written, so
-- nothing needs a type check; any key that answers an error takes the whole path below.
-- (the group's last-delivered id and pending count it read: the fair share below starts from them)
local pre_last, pre_pending = nil, nil
local function idle_reply()
  if #ARGV >= FIRST_OWNED or ARGV[15] ~= '' or release_asked then return nil end
  local groups = redis.pcall('XINFO', 'GROUPS', stream)
  if groups.err then return nil end
  for _, info in ipairs(groups) do
    local name, last, lag, count = nil, nil, nil, 0
    for j = 1, #info, 2 do
      if info[j] == 'name' then name = info[j + 1] end
      if info[j] == 'last-delivered-id' then last = info[j + 1] end
      if info[j] == 'lag' then lag = info[j + 1] end
      if info[j] == 'pending' then count = info[j + 1] end
    end
    if name == group then
      pre_last, pre_pending = last, count
      if lag ~= 0 or redis.pcall('LLEN', KEYS[9]) ~= 0 or redis.pcall('HLEN', KEYS[6]) ~= 0
         or redis.pcall('HEXISTS', KEYS[7], token) ~= 0 then return nil end
      local version, active = redis.pcall('GET', KEYS[2]), redis.pcall('SCARD', KEYS[3])
      if type(version) == 'table' or type(active) ~= 'number' then return nil end
      return {version or '0', last, {}, {}, active, 1, 0, {}, 0}
    end
  end
  return nil
end
local idle = idle_reply()
if idle then return idle end

-- the index version and the principals are read here (each read checks its key's type), the
-- other queue-manager-wide keys type-checked, all before the first write
local version = redis.pcall('GET', KEYS[2])
if type(version) == 'table' then error({err = 'BROKER ' .. foreign(KEYS[2], 'string')}) end
local bindings = redis.pcall('HGETALL', KEYS[6])
if bindings.err then error({err = 'BROKER ' .. foreign(KEYS[6], 'hash')}) end
require_types({{stream, 'stream'}, {KEYS[3], 'set'}, {KEYS[4], 'zset'}, {KEYS[5], 'stream'}, {KEYS[7], 'hash'}})

-- Authenticated ingress (broker.core.principals): each principal (an ACL user) may XADD only to its
-- own ingress stream, so the stream says who published. Its entries are moved here, in order,
-- into the publish stream, each with the field "principal" set to it and without every other
-- field only the broker may set (broker_only in lib.lua: "origin", "route", "dlq.*"); one whose
-- publisher id is not bound to the principal is dead-lettered with the reason, those fields left
-- out too (no result is posted: the reply key belongs to the id it claims), and named in the
-- reply's `refused`. An ingress stream of another type is skipped.
local room = tonumber(ARGV[3])
local impersonations = {}  -- {principal, claimed publisher id, entry id, ...}: the reply's 10th element
for i = 1, #bindings, 2 do
  if room <= 0 then break end
  local principal, ids = bindings[i], bindings[i + 1]
  local ingress = ARGV[14] .. principal
  if redis.call('TYPE', ingress)['ok'] == 'stream' then
    local bound = {}
    for id in string.gmatch(ids, '[^\n]+') do bound[id] = true end
    local batch = redis.call('XRANGE', ingress, '-', '+', 'COUNT', room)
    local done = {}
    for _, entry in ipairs(batch) do
      local fields, copy, pub = entry[2], {}, nil
      for j = 1, #fields, 2 do
        if not broker_only(fields[j]) then
          copy[#copy + 1] = fields[j]
          copy[#copy + 1] = fields[j + 1]
        end
        if fields[j] == 'publisher' then pub = fields[j + 1] end
      end
      if pub and bound[pub] then
        copy[#copy + 1] = 'principal'
        copy[#copy + 1] = principal
        redis.call('XADD', stream, '*', unpack(copy))
      else
        local why = 'publisher id ' .. string.format('%q', pub or '') .. ' is not bound to principal '
                    .. principal .. ' (ingress ' .. ingress .. ')'
        -- dlq.principal: the ingress stream it came in by (broker.operations.dead_letters replays it there)
        dead_letter(KEYS[5], ARGV[12], tonumber(ARGV[13]), entry[1], copy, why, {'dlq.principal', principal})
        impersonations[#impersonations + 1] = principal
        impersonations[#impersonations + 1] = pub or ''
        impersonations[#impersonations + 1] = entry[1]
      end
      done[#done + 1] = entry[1]
    end
    if #done > 0 then redis.call('XDEL', ingress, unpack(done)) end
    room = room - #done
  end
end

local entries = {}
if tonumber(ARGV[3]) > 0 then  -- COUNT 0 would read everything
  local reply = redis.call('XREADGROUP', 'GROUP', group, token, 'COUNT', ARGV[3], 'STREAMS', stream, '>')
  if reply then entries = reply[1][2] end
end
local read_count = #entries
local read_last = read_count > 0 and entries[read_count][1] or nil

-- Delivery delay: the entries with a delivery_time (one comparison per field) go to KEYS[10].
local delayed_moves, delayed_due = 0, false
local later = nil  -- {[index in entries] = delivery time (digits)}
for i, entry in ipairs(entries) do
  local fields = entry[2]
  for j = 1, #fields, 2 do
    if fields[j] == 'delivery_time' then
      local at = fields[j + 1]
      if #at <= 15 and string.match(at, '^%d+$') and not field_of(fields, 'delayed_from') then
        later = later or {}
        later[i] = at
      end
      break
    end
  end
end
local function padded(part) return string.rep('0', 20 - #part) .. part end
if later then
  local why = foreign(KEYS[10], 'zset')
  local rest, members, acks = {}, {}, {}
  for i, entry in ipairs(entries) do
    local at = later[i]
    if not at then
      rest[#rest + 1] = entry
    elseif why then
      refuse_unparsed(ctx, entry[1], entry[2], publisher_of(entry[2], malformed, max_pub),
                      why .. '; the delayed publication could not be kept')
    else
      local ms, seq = string.match(entry[1], '^(%d+)-(%d+)$')
      members[#members + 1] = at
      members[#members + 1] = padded(ms) .. '-' .. padded(seq) .. cmsgpack.pack(entry[2])
      acks[#acks + 1] = entry[1]
      if tonumber(at) <= tonumber(delay_now) then delayed_due = true end
    end
  end
  for i = 1, #acks, 1000 do  -- one ZADD and one XACK per 1,000 (unpack() takes a few thousand values)
    redis.call('ZADD', KEYS[10], unpack(members, 2 * i - 1, math.min(2 * i + 1998, #members)))
    redis.call('XACK', stream, group, unpack(acks, i, math.min(i + 999, #acks)))
  end
  delayed_moves = #acks
  entries = rest
end

-- Delivery delay: the delayed publications due by now go back to the publish stream, in order, and
-- are read in this call when the read above reached the stream's end (they follow it).
local delayed_reply = nil
if (release_asked or delayed_due or delayed_moves > 0) and not foreign(KEYS[10], 'zset') then
  if release_asked or delayed_due then
    local due = redis.call('ZRANGEBYSCORE', KEYS[10], '-inf', delay_now, 'LIMIT', 0, RELEASE_MAX)
    for _, member in ipairs(due) do
      local fields = cmsgpack.unpack(string.sub(member, 42))
      local ms = string.gsub(string.sub(member, 1, 20), '^0+(%d)', '%1')
      local seq = string.gsub(string.sub(member, 22, 41), '^0+(%d)', '%1')
      local original = ms .. '-' .. seq
      -- the publish time and the msgid default to the original entry's (an empty one too)
      local defaults = {ts = ms, msgid = original}
      for j = 1, #fields, 2 do
        local default = defaults[fields[j]]
        if default then
          if fields[j + 1] == '' then fields[j + 1] = default end
          defaults[fields[j]] = nil
        end
      end
      for _, name in ipairs({'ts', 'msgid'}) do
        if defaults[name] then
          fields[#fields + 1] = name
          fields[#fields + 1] = defaults[name]
        end
      end
      fields[#fields + 1] = 'delayed_from'
      fields[#fields + 1] = original
      redis.call('XADD', stream, '*', unpack(fields))
    end
    for i = 1, #due, 500 do
      redis.call('ZREM', KEYS[10], unpack(due, i, math.min(i + 499, #due)))
    end
    delayed_moves = delayed_moves + #due
    if #due > 0 and read_count < tonumber(ARGV[3]) then
      local again = redis.call('XREADGROUP', 'GROUP', group, token, 'COUNT', tonumber(ARGV[3]) - read_count,
                               'STREAMS', stream, '>')
      if again then
        for _, entry in ipairs(again[1][2]) do entries[#entries + 1] = entry end
        read_last = entries[#entries][1]
      end
    end
  end
  local head = redis.call('ZRANGE', KEYS[10], 0, 0, 'WITHSCORES')
  delayed_reply = {head[2] or '', delayed_moves}
elseif release_asked then
  delayed_reply = {'', 0}  -- a foreign key: nothing to release (broker status names it)
end

local candidates, seen = {}, {}
local function consider(pub)
  if not seen[pub] then
    seen[pub] = true
    candidates[#candidates + 1] = pub
  end
end
for i = FIRST_OWNED, #ARGV do consider(ARGV[i]) end
if KEYS[9] then
  local named = redis.pcall('LPOP', KEYS[9])
  if type(named) == 'string' then
    local ok, list = pcall(cjson.decode, named)
    if ok and type(list) == 'table' then
      for _, pub in ipairs(list) do
        if type(pub) == 'string' and pub ~= '' and #pub <= max_pub then consider(pub) end
      end
    end
  end
end

-- Check each publisher's FIFO and turn keys before writing anything.
local filed, filed_order, refused = {}, {}, {}
for _, entry in ipairs(entries) do
  local pub = publisher_of(entry[2], malformed, max_pub)
  if refused[pub] == nil then
    refused[pub] = foreign(prefix .. pub .. ':fifo', 'list') or foreign(prefix .. pub .. ':turn', 'string') or false
  end
  if not refused[pub] then
    local ids = filed[pub]
    if not ids then
      ids = {}
      filed[pub] = ids
      filed_order[#filed_order + 1] = pub
    end
    ids[#ids + 1] = entry[1]
    consider(pub)
  end
end
-- Refuse, in stream order, the entries of publishers whose keys are foreign.
local kept = {}
for _, entry in ipairs(entries) do
  local pub = publisher_of(entry[2], malformed, max_pub)
  if refused[pub] then
    refuse_unparsed(ctx, entry[1], entry[2], pub, refused[pub] .. '; the entry could not be filed in order')
  else
    kept[#kept + 1] = entry
  end
end
-- one RPUSH per publisher keeps each FIFO in stream order
for _, pub in ipairs(filed_order) do
  redis.call('RPUSH', prefix .. pub .. ':fifo', unpack(filed[pub]))
end
if #filed_order > 0 then redis.call('SADD', KEYS[3], unpack(filed_order)) end

-- Fair share of the work: the entries waiting in FIFOs (the group's pending
-- entries) split over the live workers. A worker takes a free turn only while
-- the FIFOs it holds add up to less than its share, so one busy publisher is
-- not served by a worker that also holds everyone else. A saturated publisher
-- another worker holds (seen among the candidates) keeps that worker busy alone:
-- its backlog and its worker are left out of the share of the others.
local pending, last_id = 0, ''
if pre_last then
  -- read before (idle_reply), nothing else ran since: what this call read is delivered and pending,
  -- what it refused acknowledged
  pending = pre_pending + #kept
  last_id = read_last or pre_last
else
  for _, info in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local name, last, count = nil, nil, 0
    for j = 1, #info, 2 do
      if info[j] == 'name' then name = info[j + 1] end
      if info[j] == 'last-delivered-id' then last = info[j + 1] end
      if info[j] == 'pending' then count = info[j + 1] end
    end
    if name == group then last_id, pending = last, count end
  end
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = math.max(redis.call('ZCOUNT', KEYS[4], now_ms - tonumber(ARGV[8]), '+inf'), 1)

-- a foreign turn or FIFO key (planted after its entries were filed) is never
-- taken; the orphan sweep refuses the entries it strands (pcall)
local holders, others, busy, was_saturated = {}, 0, {}, false
for i, pub in ipairs(candidates) do
  local holder = redis.pcall('GET', prefix .. pub .. ':turn')
  holders[i] = holder
  if live > 1 and type(holder) == 'string' and holder ~= token and not busy[holder] then
    local backlog = redis.pcall('LLEN', prefix .. pub .. ':fifo')
    if type(backlog) == 'number' and backlog >= heads then
      busy[holder] = true
      others = others + 1
      pending = pending - backlog
    end
  end
end
local fair = math.ceil(math.max(pending, 0) / math.max(live - others, 1))
-- Workers known to hold a saturated publisher: those seen above, and those whose own last
-- dequeue found it so (within the liveness window; older records are forgotten here).
if live > 1 then
  local since = now_ms - tonumber(ARGV[8])
  local records = redis.call('HGETALL', KEYS[7])
  for j = 1, #records, 2 do
    local name, at = records[j], tonumber(records[j + 1])
    if name == token then
      was_saturated = true
    elseif not at or at < since then
      redis.call('HDEL', KEYS[7], name)
    elseif not busy[name] then
      busy[name] = true
      others = others + 1
    end
  end
end
local spare = math.max(live - 1 - others, 0)

local turns, held, load, saturated, holds_saturated = {}, 0, 0, false, false
for i, pub in ipairs(candidates) do
  local turn_key, fifo_key = prefix .. pub .. ':turn', prefix .. pub .. ':fifo'
  local holder = holders[i]
  local mine = holder == token
  -- the turns it holds come first (ARGV), so a saturated one is known before any free turn
  if not holder and not saturated and (held == 0 or load < fair) then
    mine = redis.call('SET', turn_key, token, 'NX', 'PX', lease_ms) ~= false
  end
  local backlog = 0
  if mine then
    backlog = redis.pcall('LLEN', fifo_key)
    if type(backlog) ~= 'number' then backlog = 0 end
    if backlog == 0 then
      redis.call('DEL', turn_key)
      redis.call('SREM', KEYS[3], pub)
    else
      redis.call('PEXPIRE', turn_key, lease_ms)
      turns[#turns + 1] = pub
      turns[#turns + 1] = redis.call('LRANGE', fifo_key, 0, heads - 1)
      turns[#turns + 1] = backlog
      held = held + 1
      load = load + backlog
      if backlog >= heads and live > 1 then holds_saturated = true end
      if backlog >= heads and spare > 0 then saturated = true end
    end
  end
end
if #kept > 0 then last_id = '' end  -- entries refused above leave nothing to handle: block as idle
if holds_saturated then
  redis.call('HSET', KEYS[7], token, now_ms)
elseif was_saturated then  -- read above (HGETALL): no second look
  redis.call('HDEL', KEYS[7], token)
end

-- The next heads of a saturated publisher, read by other workers: taken over here.
local taken = {}
local ahead = ARGV[15]
if ahead ~= '' then
  local after_ms, after_seq = string.match(ARGV[16], '^(%d+)-(%d+)$')
  after_ms, after_seq = tonumber(after_ms), tonumber(after_seq)
  for i = 1, #turns, 3 do
    if turns[i] == ahead and after_ms then
      local ids, first = {}, nil
      for j, id in ipairs(turns[i + 1]) do
        if not first then
          local ms, seq = string.match(id, '^(%d+)-(%d+)$')
          ms = tonumber(ms)
          if ms > after_ms or (ms == after_ms and tonumber(seq) > after_seq) then first = j end
        end
        if first then ids[#ids + 1] = id end
      end
      if first then taken = take_over(stream, group, token, ids, first == 1 and 1 or 0, KEYS[8]) end
    end
  end
end

local reply = {version or '0', last_id, kept, turns, redis.call('SCARD', KEYS[3]), live, fair,
               taken, spare}
if #impersonations > 0 then reply[10] = impersonations end
if delayed_reply then
  reply[10] = impersonations
  reply[11] = delayed_reply
end
return reply
