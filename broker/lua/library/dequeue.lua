-- broker_dequeue (flag allow-oom: it runs on a full server, as the script it was did; lib.lua):
-- the queue mutex, FCALL broker_dequeue, called by itself (a worker with nothing prefetched) or in
-- the pipeline that carries the unit of work (worker/loop.py _send). A script without a shebang is
-- refused on a full server only a first write that may add memory (denyoom), and the dequeue's
-- first write is mostly XREADGROUP's, which is not one: its reads and filing went through, the
-- commit being the call that is refused (tests/integration/test_memory_full.py). A function
-- without flags would be refused as a whole, so that nothing would be read on a full server.
-- With allow-oom the few calls whose first write is a denyoom one (an ingress entry's or a
-- released delayed publication's XADD, a free turn's SET) run too: each moves what the server
-- holds already (at most `count` entries) or sets one short key.
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
-- pending. Every key the call may write is known to be of its type before its first write: most
-- by a read the call makes anyway, with redis.pcall (an error reply is a foreign key; no TYPE for
-- them), the dead-letter stream (no read) by TYPE only when the call may refuse an entry. A dequeue
-- with nothing to do (nothing to read, no turn, no ingress) writes nothing and reads only the
-- group's state: at a high rate, where every idle worker wakes for each entry, most of them are
-- such. A feature nobody configured costs nothing per call: no principals read without ingress
-- (ARGV[14] ""), no {qm}:saturated while this worker is the only live one, no XREADGROUP when the
-- group's lag is 0, and the delivery_time of an entry is found by the scan that finds its publisher.
--
-- KEYS[1] publish stream            "{qm}:publish"
-- KEYS[2] index version counter     "{qm}:version"
-- KEYS[3] active publishers set     "{qm}:publishers"
-- KEYS[4] live workers              "{qm}:alive" (zset scored by last heartbeat, ms)
-- KEYS[5] dead-letter stream        "{qm}:dlq"
-- KEYS[6] principals                "{qm}:principals" (principal -> publisher ids, one per line; read
--                                   only when ARGV[14] is not empty)
-- KEYS[7] saturated workers         "{qm}:saturated" (worker -> ms of its last dequeue that found
--                                   it holding a saturated publisher; read and written here only
--                                   while more than one worker is live)
-- KEYS[8] entries handled alone     "{qm}:alone" (take_over in lib.lua; not type-checked here:
--                                   read and written with pcall, only when heads are taken over)
-- KEYS[9] wake-up list              "{qm}:wake" (worker.waiting; LPOP with pcall: a foreign key is skipped):
--                                   a wake-up nobody waited for (every idle worker on the stream, at a
--                                   high rate) is taken here, the publishers it names (a JSON list:
--                                   turns given up) considered as those of ARGV[21..] are
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
-- ARGV[14] ingress stream prefix    "{qm}:in:" (.. principal), or "" when the worker's routing table
--          has no ingress stream (no principal): KEYS[6] is not read, nothing moved from ingress
-- ARGV[15] publisher whose next heads to take over here ("" for none), if the worker holds its turn
-- ARGV[16] the entry id after which the worker has read none of them ("ms-seq"): only heads
--          after it are taken over (take_over in lib.lua: the FIFO head counted, when it is one)
-- ARGV[17] now: the worker's clock, ms since the epoch (delivery times are compared with it)
-- ARGV[18] "1": release the delayed publications due by ARGV[17] (the worker knows one is due), else "0"
-- ARGV[19] min share: under this many entries of fair share (a low rate), every free turn read is
--   taken, whatever this worker holds already (worker.turns.MIN_SHARE: a hand-over costs more
--   than the work; 0: the fair share always applies)
-- ARGV[20] "1": the worker holds no entry in memory but those its commit in the same round trip
--   handles (gone from the FIFOs when this runs): every head of a turn it holds that this call did
--   not read was read by another worker (or by this one and forgotten) and is taken over here
--   (take_over in lib.lua: the FIFO head counted), so that its publication is handled in the round
--   this call starts, not a round later after a take_over.lua round trip; "0": not looked for
-- ARGV[21..] publishers whose turn the worker believes it holds
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
--            of {qm}:delayed by this call}; {} when it did not but a 12th element follows
--   plenty (12th, 1, only when plenty is left to read: see "Plenty left to read" below)
--
-- Delivery delay (Jakarta Messaging 2.0 section 7.9, JMSDeliveryTime; Artemis scheduled delivery): an
-- entry read with a delivery_time field (digits, at most 15) and no delayed_from field is moved into
-- KEYS[10] (acknowledged, not filed), whatever its time, so that publications of equal delivery time
-- keep their stream order; then, before anything is filed, every entry due by ARGV[17] is moved back
-- (at most RELEASE_MAX) in (delivery time, original entry id) order, each XADDed with all its fields
-- plus delayed_from (its original entry id), ts and msgid (the original's, when it had none), and read
-- again in this call when the read had room (they are the stream's last entries), to be delivered as
-- any entry. A delivery_time that is not digits passes through: the worker refuses it.

do  -- the dequeue's names are local to this block (Lua 5.1: 200 locals in the library's main chunk)

-- A function of the library, not a script: its helpers are made once, when the library is loaded,
-- instead of on every call (an EVALSHA runs its whole chunk per call, making each `local function`
-- again: docs/design.md, the unit of work's cost). What every call works out from its KEYS and ARGV,
-- and the state its helpers share, are the block's locals below, (re)assigned at the start of each
-- call (`dequeue`; functions run one at a time); the rest are the call's own locals.
local KEYS, ARGV
local stream, group, token
-- (a tonumber() of a string costs about as much as a small command: only the numbers used on
-- every call are converted here; lease_ms goes to Redis as the string it came as)
local count, heads
local prefix, lease_ms
local malformed, max_pub
-- how an entry is refused (refuse_unparsed in lib.lua), made on the first refusal of a call
local ctx
local function refusals()
  ctx = ctx or {stream = stream, group = group, dlq = KEYS[5], dlq_len = ARGV[12], max_body = tonumber(ARGV[13]),
                reply_prefix = ARGV[10], reply_ttl = ARGV[11]}
  return ctx
end
local FIRST_OWNED = 21
local RELEASE_MAX = 1000
local delay_now, release_asked

-- Reads first. A read made with redis.pcall checks its key's type on the way (an error reply: the
-- key holds another type), so no TYPE is sent for a key the call reads anyway; every key the call
-- may write is known to be of its type before the first write. `checked` stops the script, before
-- any write, with the broker's error naming the key ("BROKER foreign key: ...", as require_types).
local function checked(reply, key, want)
  if type(reply) == 'table' and reply.err then
    local why = foreign(key, want)
    if why then error({err = 'BROKER ' .. why}) end
    error(reply)
  end
  return reply
end

-- Delivery delay: whether KEYS[10] is foreign, its type read once per call, when needed.
local delayed_why  -- nil: not read yet; false: KEYS[10] is a zset or absent; else why it is foreign
local function delayed_foreign()
  if delayed_why == nil then delayed_why = foreign(KEYS[10], 'zset') or false end
  return delayed_why
end
local function padded(part) return string.rep('0', 20 - #part) .. part end

-- The publishers whose turn the call looks at, in order, each once (candidates, seen: per call).
local candidates, seen
local function consider(pub)
  if not seen[pub] then
    seen[pub] = true
    candidates[#candidates + 1] = pub
  end
end

-- The call. Its body reads as the script's did (not indented): its early return, for an empty
-- dequeue, and its last one give the reply.
-- Whether a turn this worker holds goes to the reader of its next head (a backlog only: see
-- "Plenty left to read"): that head is pending for another worker, live (a heartbeat since
-- `since`, in `alive`) and not keeping a saturated publisher (`busy`), which has it in memory.
-- `owners` caches each owner's liveness for the call.
local function left_to_reader(fifo_key, token, busy, since, owners)
  local head = redis.call('LINDEX', fifo_key, 0)
  local info = head and redis.call('XPENDING', stream, group, head, head, 1)[1]
  local owner = info and info[2]
  if not owner or owner == token or busy[owner] then return false end
  if owners[owner] == nil then
    owners[owner] = tonumber(redis.call('ZSCORE', KEYS[4], owner) or '0') >= since
  end
  return owners[owner]
end

local function dequeue()
stream, group, token = KEYS[1], ARGV[1], ARGV[2]
count, heads = tonumber(ARGV[3]), tonumber(ARGV[6])
prefix, lease_ms = ARGV[4], ARGV[5]
malformed, max_pub = ARGV[7], tonumber(ARGV[9])
delay_now, release_asked = ARGV[17], ARGV[18] == '1'
ctx, delayed_why = nil, nil

-- The group's state: its last-delivered id, pending count and lag (false when the server cannot
-- tell, or the group is missing: XREADGROUP below then answers NOGROUP, as the worker expects).
-- Read before anything else, it also checks the stream's type; the pending count and last id the
-- reply needs are worked out from it and what this call reads (nothing else moves them here).
local pre_last, pre_pending, lag = nil, 0, false
local groups = redis.pcall('XINFO', 'GROUPS', stream)
if groups.err then
  require_type(stream, 'stream')  -- a foreign stream stops here; a missing one reads nothing
else
  for _, info in ipairs(groups) do
    local name, last, behind, pending = nil, nil, false, 0
    for j = 1, #info, 2 do
      local field = info[j]
      if field == 'name' then name = info[j + 1]
      elseif field == 'last-delivered-id' then last = info[j + 1]
      elseif field == 'lag' then behind = info[j + 1]
      elseif field == 'pending' then pending = info[j + 1] end
    end
    if name == group then pre_last, pre_pending, lag = last, pending, behind end
  end
end
local version = checked(redis.pcall('GET', KEYS[2]), KEYS[2], 'string')
local active = checked(redis.pcall('SCARD', KEYS[3]), KEYS[3], 'set')

-- An empty dequeue (at a high rate every idle worker wakes for an entry one of them takes): nothing
-- to read (the group's lag is 0), no turn held or named (ARGV, a wake-up), no ingress, no record of
-- a saturated publisher to remove: answered from the reads above. Nothing is written.
if #ARGV < FIRST_OWNED and ARGV[15] == '' and not release_asked and lag == 0
   and redis.pcall('LLEN', KEYS[9]) == 0 and (ARGV[14] == '' or redis.pcall('HLEN', KEYS[6]) == 0)
   and redis.pcall('HEXISTS', KEYS[7], token) == 0 then
  return {version or '0', pre_last, {}, {}, active, 1, 0, {}, 0}
end

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local since = now_ms - tonumber(ARGV[8])  -- a worker whose last heartbeat is older is not live
local live = math.max(checked(redis.pcall('ZCOUNT', KEYS[4], since, '+inf'), KEYS[4], 'zset'), 1)
-- {qm}:saturated is read and written only while another worker is live (checked by its read)
local records = EMPTY
if live > 1 then records = checked(redis.pcall('HGETALL', KEYS[7]), KEYS[7], 'hash') end
-- the principals only when the worker's routing table has ingress streams (ARGV[14] not empty)
local bindings = EMPTY
if ARGV[14] ~= '' then bindings = checked(redis.pcall('HGETALL', KEYS[6]), KEYS[6], 'hash') end
-- the dead-letter stream has no read to check it: its type, only when this call may refuse an entry
-- (it reads entries or moves ingress entries)
if count > 0 and (lag ~= 0 or release_asked or #bindings > 0) then require_type(KEYS[5], 'stream') end

-- Authenticated ingress (broker.core.principals): each principal (an ACL user) may XADD only to its
-- own ingress stream, so the stream says who published. Its entries are moved here, in order,
-- into the publish stream, each with the field "principal" set to it and without every other
-- field only the broker may set (broker_only in lib.lua: "origin", "route", "dlq.*"); one whose
-- publisher id is not bound to the principal is dead-lettered with the reason, those fields left
-- out too (no result is posted: the reply key belongs to the id it claims), and named in the
-- reply's `refused`. An ingress stream of another type is skipped (its XRANGE's error reply).
local room, moved = count, 0
local impersonations = EMPTY  -- {principal, claimed publisher id, entry id, ...}: the reply's 10th element
for i = 1, #bindings, 2 do
  if room <= 0 then break end
  local principal, ids = bindings[i], bindings[i + 1]
  local ingress = ARGV[14] .. principal
  local batch = redis.pcall('XRANGE', ingress, '-', '+', 'COUNT', room)
  if not batch.err and #batch > 0 then
    local bound = {}
    for id in string.gmatch(ids, '[^\n]+') do bound[id] = true end
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
        moved = moved + 1
      else
        local why = 'publisher id ' .. string.format('%q', pub or '') .. ' is not bound to principal '
                    .. principal .. ' (ingress ' .. ingress .. ')'
        -- dlq.principal: the ingress stream it came in by (broker.operations.dead_letters replays it there)
        dead_letter(KEYS[5], ARGV[12], tonumber(ARGV[13]), entry[1], copy, why, {'dlq.principal', principal})
        impersonations = writable(impersonations)
        impersonations[#impersonations + 1] = principal
        impersonations[#impersonations + 1] = pub or ''
        impersonations[#impersonations + 1] = entry[1]
      end
      done[#done + 1] = entry[1]
    end
    redis.call('XDEL', ingress, unpack(done))
    room = room - #done
  end
end

-- XREADGROUP only when there is something to read (the lag, or entries moved from ingress)
local entries = EMPTY
if count > 0 and (lag ~= 0 or moved > 0) then  -- COUNT 0 would read everything
  local reply = redis.call('XREADGROUP', 'GROUP', group, token, 'COUNT', count, 'STREAMS', stream, '>')
  if reply then entries = reply[1][2] end
end
local read_count = #entries
local read_last = read_count > 0 and entries[read_count][1] or nil

-- One scan of each entry's fields finds its publisher and its delivery_time (delivery delay): an
-- entry without one costs nothing more than its publisher's look-up.
-- (the call's tables are made only when something is read: EMPTY until then)
local pubs, later = read_count > 0 and {} or EMPTY, nil  -- later: {[index in entries] = delivery time (digits)}
for i, entry in ipairs(entries) do
  local pub, at = publisher_and(entry[2], malformed, max_pub, 'delivery_time')
  pubs[i] = pub
  if at and #at <= 15 and string.match(at, '^%d+$') and not field_of(entry[2], 'delayed_from') then
    later = later or {}
    later[i] = at
  end
end
-- Delivery delay: the entries with a delivery_time go to KEYS[10] (its type read once, when needed).
local delayed_moves, delayed_due = 0, false
if later then
  local why = delayed_foreign()
  local rest, rest_pubs, members, acks = {}, {}, {}, {}
  for i, entry in ipairs(entries) do
    local at = later[i]
    if not at then
      rest[#rest + 1] = entry
      rest_pubs[#rest] = pubs[i]
    elseif why then
      refuse_unparsed(refusals(), entry[1], entry[2], pubs[i], why .. '; the delayed publication could not be kept')
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
  entries, pubs = rest, rest_pubs
end

-- Delivery delay: the delayed publications due by now go back to the publish stream, in order, and
-- are read in this call when the read above reached the stream's end (they follow it).
local delayed_reply = nil
if (release_asked or delayed_due or delayed_moves > 0) and not delayed_foreign() then
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
    if #due > 0 and read_count < count then
      local again = redis.call('XREADGROUP', 'GROUP', group, token, 'COUNT', count - read_count,
                               'STREAMS', stream, '>')
      if again then
        entries, pubs = writable(entries), writable(pubs)
        for _, entry in ipairs(again[1][2]) do
          entries[#entries + 1] = entry
          pubs[#entries] = publisher_of(entry[2], malformed, max_pub)
        end
        read_last = entries[#entries][1]
      end
    end
  end
  local head = redis.call('ZRANGE', KEYS[10], 0, 0, 'WITHSCORES')
  delayed_reply = {head[2] or '', delayed_moves}
elseif release_asked then
  delayed_reply = {'', 0}  -- a foreign key: nothing to release (broker status names it)
end

candidates, seen = {}, {}
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

-- Each publisher read: its FIFO's length and its turn's holder, read with pcall before anything is
-- filed (an error reply: a foreign key, and its entries are refused). Both are used below: the
-- backlog after filing, the FIFO heads when it was empty (no LRANGE), the holder (no second GET).
local filed, filed_order, refused = EMPTY, EMPTY, EMPTY
local before, holder_of = EMPTY, EMPTY  -- [publisher] = FIFO length before filing; turn holder (false: none)
if #entries > 0 then filed, filed_order, refused, before, holder_of = {}, {}, {}, {}, {} end
local refusing = false  -- a publisher read has a foreign key
for i, entry in ipairs(entries) do
  local pub = pubs[i]
  if refused[pub] == nil then
    local fifo_key, turn_key = prefix .. pub .. ':fifo', prefix .. pub .. ':turn'
    local why = false
    local length = redis.pcall('LLEN', fifo_key)
    if type(length) ~= 'number' then
      why = foreign(fifo_key, 'list') or ('foreign key: ' .. fifo_key)
    else
      local holder = redis.pcall('GET', turn_key)
      if type(holder) == 'table' then
        why = foreign(turn_key, 'string') or ('foreign key: ' .. turn_key)
      else
        before[pub], holder_of[pub] = length, holder
      end
    end
    refused[pub] = why
    refusing = refusing or why ~= false
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
-- Refuse, in stream order, the entries of publishers whose keys are foreign (kept: the others).
local kept = entries
if refusing then
  kept = {}
  for i, entry in ipairs(entries) do
    local pub = pubs[i]
    if refused[pub] then
      refuse_unparsed(refusals(), entry[1], entry[2], pub, refused[pub] .. '; the entry could not be filed in order')
    else
      kept[#kept + 1] = entry
    end
  end
end
-- one RPUSH per publisher keeps each FIFO in stream order
for _, pub in ipairs(filed_order) do
  redis.call('RPUSH', prefix .. pub .. ':fifo', unpack(filed[pub]))
end
if #filed_order > 0 then active = active + redis.call('SADD', KEYS[3], unpack(filed_order)) end

-- Fair share of the work: the entries waiting in FIFOs (the group's pending
-- entries) split over the live workers. A worker takes a free turn only while
-- the FIFOs it holds add up to less than its share, so one busy publisher is
-- not served by a worker that also holds everyone else. A saturated publisher
-- another worker holds (seen among the candidates) keeps that worker busy alone:
-- its backlog and its worker are left out of the share of the others.
-- (the group's state read first, nothing else ran since: what this call read is delivered and
-- pending, what it refused or delayed acknowledged)
local pending = pre_pending + #kept
local last_id = read_last or pre_last or ''

-- a foreign turn or FIFO key (planted after its entries were filed) is never
-- taken; the orphan sweep refuses the entries it strands (pcall)
local holders, backlogs, others, busy, was_saturated = {}, EMPTY, 0, EMPTY, false
if before ~= EMPTY then backlogs = {} end  -- (a backlog is known for each publisher read)
if live > 1 then busy = {} end
for i, pub in ipairs(candidates) do
  local holder
  if before[pub] then  -- read above
    holder = holder_of[pub]
    backlogs[i] = before[pub] + #filed[pub]
  else
    holder = redis.pcall('GET', prefix .. pub .. ':turn')
  end
  holders[i] = holder
  if live > 1 and type(holder) == 'string' and holder ~= token and not busy[holder] then
    local backlog = backlogs[i] or redis.pcall('LLEN', prefix .. pub .. ':fifo')
    if type(backlog) == 'number' and backlog >= heads then
      busy[holder] = true
      others = others + 1
      pending = pending - backlog
    end
  end
end
local fair = math.ceil(math.max(pending, 0) / math.max(live - others, 1))
local min_share = tonumber(ARGV[19])
-- Plenty left to read (a backlog: the group's lag after this read is a whole batch or more for
-- each other live worker): no other worker is idle for want of work, so the fair share does not
-- hold back a free turn, and a turn follows its entries: one whose next head another live worker
-- read (and holds in memory) is left to it (left_to_reader: given up here, not returned, that
-- worker takes it with its next dequeue), where taking that head over would read it from the
-- stream again (XCLAIM, XRANGE) and have it parsed twice; a free turn is not declined either,
-- for the same reason. The worker still gives up what is beyond its fair share once it has
-- handled what it read (worker.turns.turns_to_give_up). Without a backlog (a worker may be idle:
-- the usual case at a steady rate) the fair share and the take-overs apply as they did.
local plenty = live > 1 and count > 0 and type(lag) == 'number' and lag - read_count >= count * (live - 1)
local owners = plenty and {} or nil
-- Workers known to hold a saturated publisher: those seen above, and those whose own last
-- dequeue found it so (within the liveness window; older records are forgotten here).
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
local spare = math.max(live - 1 - others, 0)

local turns, held, load, saturated, holds_saturated = {}, 0, 0, false, false
for i, pub in ipairs(candidates) do
  local turn_key, fifo_key = prefix .. pub .. ':turn', prefix .. pub .. ':fifo'
  local holder, backlog = holders[i], backlogs[i]
  local mine, taken_now = holder == token, false
  -- the turns it holds come first (ARGV), so a saturated one is known before any free turn;
  -- a free turn is taken only when its FIFO holds entries
  if not holder and not saturated and (plenty or held == 0 or load < fair or fair < min_share) then
    if not backlog then
      backlog = redis.pcall('LLEN', fifo_key)
      if type(backlog) ~= 'number' then backlog = 0 end
    end
    if backlog > 0 then
      taken_now = redis.call('SET', turn_key, token, 'NX', 'PX', lease_ms) ~= false
      mine = taken_now
    elseif active > 0 then  -- nothing waits: no longer an active publisher (none is: nothing to remove)
      active = active - redis.call('SREM', KEYS[3], pub)
    end
  elseif mine and not backlog then
    backlog = redis.pcall('LLEN', fifo_key)
    if type(backlog) ~= 'number' then backlog = 0 end
  end
  if mine and plenty and backlog > 0 and before[pub] ~= 0 and left_to_reader(fifo_key, token, busy, since, owners) then
    redis.call('DEL', turn_key)  -- its next heads' reader takes it (the FIFO is not empty: still active)
  elseif mine then
    if backlog == 0 then
      redis.call('DEL', turn_key)
      if active > 0 then active = active - redis.call('SREM', KEYS[3], pub) end
    else
      if not taken_now then redis.call('PEXPIRE', turn_key, lease_ms) end  -- SET gave it its lease
      turns[#turns + 1] = pub
      if before[pub] == 0 then  -- the FIFO is what this call filed: its heads are known
        local ids, head = filed[pub], {}
        for j = 1, math.min(heads, #ids) do head[j] = ids[j] end
        turns[#turns + 1] = head
      else
        turns[#turns + 1] = redis.call('LRANGE', fifo_key, 0, heads - 1)
      end
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
local taken = EMPTY
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

-- The heads of its turns that other workers read, when the worker holds nothing else (ARGV[20]);
-- not looked for when every turn it holds is of a FIFO this call filed from empty (all read here).
local missing = false
if ARGV[20] == '1' then
  for i = 1, #turns, 3 do
    if before[turns[i]] ~= 0 then
      missing = true
      break
    end
  end
end
if missing then
  local read_here, counted, rest = {}, {}, {}
  for _, entry in ipairs(kept) do read_here[entry[1]] = true end
  for _, entry in ipairs(taken) do read_here[entry[1]] = true end
  for i = 1, #turns, 3 do
    for j, id in ipairs(turns[i + 1]) do
      if not read_here[id] then
        if j == 1 then counted[#counted + 1] = id else rest[#rest + 1] = id end
      end
    end
  end
  if #counted + #rest > 0 then
    for _, id in ipairs(rest) do counted[#counted + 1] = id end
    taken = writable(taken)
    for _, entry in ipairs(take_over(stream, group, token, counted, #counted - #rest, KEYS[8])) do
      taken[#taken + 1] = entry
    end
  end
end

local reply = {version or '0', last_id, kept, turns, active, live, fair, taken, spare}
if #impersonations > 0 then reply[10] = impersonations end
if delayed_reply or plenty then
  reply[10] = impersonations  -- EMPTY when none: {} in the reply
  reply[11] = delayed_reply or EMPTY
  if plenty then reply[12] = 1 end
end
return reply
end

local function call(keys_, argv_)
  KEYS, ARGV = keys_, argv_
  local reply = dequeue()
  -- the call's arguments and tables are not kept until the next call
  KEYS, ARGV, ctx, candidates, seen = nil, nil, nil, nil, nil
  return reply
end

redis.register_function{function_name = 'broker_dequeue', callback = call, flags = {'allow-oom'}}

end
