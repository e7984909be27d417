-- Units of work for a batch of publications, in one atomic call: for each one,
-- fan out to every subscriber queue, record the message id, journal it,
-- acknowledge the stream entry, post the result and pass the publisher's turn
-- on. Fenced per publication: nothing is written for it unless this worker
-- holds the publisher's turn and the entry is next in the publisher's FIFO (a
-- worker resumed after its lease cannot write). The script is atomic, so the
-- writes are grouped (one LPUSH per queue, one XACK, one LTRIM per FIFO) and
-- each publication is still all or nothing.
--
-- KEYS[1] publish stream               "{qm}:publish"
-- KEYS[2] active publishers set        "{qm}:publishers"
-- KEYS[3] dead-letter stream           "{qm}:dlq"
-- KEYS[4] delivery journal stream      "{qm}:journal"
-- KEYS[5..] the subscriber queues this batch delivers to ("{qm}:sub:<id>")
-- ARGV[1] consumer group
-- ARGV[2] the worker's fencing token
-- ARGV[3] lease_ms of a publisher's turn
-- ARGV[4] per-publisher key prefix     "{qm}:pub:"   (.. publisher .. ":fifo" / ":owner")
-- ARGV[5] dedup key prefix             "{qm}:dedup:" (.. publisher .. ":" .. msgid)
-- ARGV[6] reply key prefix             "{qm}:reply:" (.. publisher .. ":" .. msgid)
-- ARGV[7] journal: approximate max length of the journal stream; 0 = no journal
-- ARGV[8] length of the subscriber queue prefix "{qm}:sub:" (to journal subscription ids)
-- ARGV[9] Y, the number of publishers whose turn to give up after this call
--   even if their FIFO is not empty (fair share: another worker takes them)
-- ARGV[10 .. 9+Y] those publishers
-- ARGV[10+Y] S, the number of recipient sets
-- ARGV[11+Y .. 10+Y+S] recipient sets: space-separated KEYS indexes, e.g. "5 6 9"
-- then 12 ARGV per publication:
--   publisher, entry id, action ("deliver" | "expire" | "refuse" | "skip"),
--   payload (deliver: the envelope; refuse: the reason), msgid,
--   dedup_window_ms (0: no dedup record), reply_ttl_ms (0: no reply),
--   recipient set (1-based index, 0: none), suggestion ("" or a corrected topic),
--   seq ("" or decimal), topic, enqueue time ms
-- returns 3 integers per publication: status, subscriptions, released
--   status: 0 fenced, 1 delivered, 2 duplicate, 3 expired, 4 refused, 5 skipped
--   released: 1 when the FIFO is now empty and the turn was given up

local stream, active, dlq, journal = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, token, lease_ms = ARGV[1], ARGV[2], ARGV[3]
local pub_prefix, dedup_prefix, reply_prefix = ARGV[4], ARGV[5], ARGV[6]
local journal_len, sub_prefix_len = tonumber(ARGV[7]), tonumber(ARGV[8])
local nyield = tonumber(ARGV[9])
local yield = {}
for i = 10, 9 + nyield do yield[ARGV[i]] = true end
local nsets = tonumber(ARGV[10 + nyield])
local sets_at = 10 + nyield

local sets = {}
for s = 1, nsets do
  local idx = {}
  for i in string.gmatch(ARGV[sets_at + s], '%d+') do idx[#idx + 1] = tonumber(i) end
  sets[s] = idx
end

local now_ms = ''
if journal_len > 0 then
  local t = redis.call('TIME')
  now_ms = tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
end
local names = {}
local function subscription_ids(set)
  if set == 0 then return '[]' end
  if not names[set] then
    local ids = {}
    for _, k in ipairs(sets[set]) do ids[#ids + 1] = string.sub(KEYS[k], sub_prefix_len + 1) end
    names[set] = cjson.encode(ids)
  end
  return names[set]
end

local STATUS = {delivered = 1, duplicate = 2, expired = 3, refused = 4, skipped = 5}
local out = {}
local acks = {}          -- entry ids to XACK, in order
local pushes = {}        -- queue KEYS index -> envelopes, in order
local push_order = {}    -- queue KEYS indexes in first-use order
local turns = {}         -- publisher -> {ok = bool, popped = n, fifo = key, owner = key}
local turn_order = {}

local function turn_of(pub)
  local t = turns[pub]
  if not t then
    local owner = pub_prefix .. pub .. ':owner'
    t = {ok = redis.call('GET', owner) == token, popped = 0,
         fifo = pub_prefix .. pub .. ':fifo', owner = owner}
    turns[pub] = t
    turn_order[#turn_order + 1] = pub
  end
  return t
end

local first = sets_at + 1 + nsets
for u = first, #ARGV, 12 do
  local pub, entry_id, action, payload = ARGV[u], ARGV[u + 1], ARGV[u + 2], ARGV[u + 3]
  local msgid, window, reply_ttl = ARGV[u + 4], tonumber(ARGV[u + 5]), tonumber(ARGV[u + 6])
  local set = tonumber(ARGV[u + 7])
  local t = turn_of(pub)
  if not t.ok or redis.call('LINDEX', t.fifo, t.popped) ~= entry_id then
    t.ok = false  -- fenced: nothing more of this publisher in this call
    out[#out + 1] = 0; out[#out + 1] = 0; out[#out + 1] = 0
  else
    local status, count = 'skipped', 0
    if action == 'deliver' then
      local fresh = true
      if window > 0 then
        fresh = redis.call('SET', dedup_prefix .. pub .. ':' .. msgid, entry_id, 'NX', 'PX', window) ~= false
      end
      if fresh then
        if set > 0 then
          for _, k in ipairs(sets[set]) do
            local list = pushes[k]
            if not list then
              list = {}
              pushes[k] = list
              push_order[#push_order + 1] = k
            end
            list[#list + 1] = payload
          end
          count = #sets[set]
        end
        status = 'delivered'
      else
        status = 'duplicate'
      end
    elseif action == 'expire' then
      status = 'expired'
    elseif action == 'refuse' then
      status = 'refused'
      local original = redis.call('XRANGE', stream, entry_id, entry_id)
      local fields = {}
      if #original == 1 then fields = original[1][2] end
      fields[#fields + 1] = 'dlq.reason'
      fields[#fields + 1] = payload
      fields[#fields + 1] = 'dlq.entry_id'
      fields[#fields + 1] = entry_id
      redis.call('XADD', dlq, '*', unpack(fields))
    end

    acks[#acks + 1] = entry_id
    t.popped = t.popped + 1

    if reply_ttl > 0 then
      local result = {status = status, subscriptions = count, entry_id = entry_id,
                      publisher = pub, msgid = msgid}
      if status == 'refused' then
        result.reason = payload
        if ARGV[u + 8] ~= '' then result.suggestion = ARGV[u + 8] end
      end
      local reply_key = reply_prefix .. pub .. ':' .. msgid
      redis.call('LPUSH', reply_key, cjson.encode(result))
      redis.call('PEXPIRE', reply_key, reply_ttl)
    end

    if journal_len > 0 and status ~= 'skipped' then
      local subs = '[]'
      if status == 'delivered' then subs = subscription_ids(set) end
      redis.call('XADD', journal, 'MAXLEN', '~', journal_len, '*',
        'entry_id', entry_id, 'msgid', msgid, 'publisher', pub, 'seq', ARGV[u + 9],
        'topic', ARGV[u + 10], 'subs', subs, 'enq_ms', ARGV[u + 11], 'dlv_ms', now_ms, 'status', status)
    end
    out[#out + 1] = STATUS[status]; out[#out + 1] = count; out[#out + 1] = 0
  end
end

-- Apply the fan-out (one variadic LPUSH per queue keeps each queue's order),
-- the acknowledgements and the FIFO pops, then pass on the turns.
local CHUNK = 1000
for _, k in ipairs(push_order) do
  local list = pushes[k]
  for i = 1, #list, CHUNK do
    redis.call('LPUSH', KEYS[k], unpack(list, i, math.min(i + CHUNK - 1, #list)))
  end
end
for i = 1, #acks, CHUNK do
  redis.call('XACK', stream, group, unpack(acks, i, math.min(i + CHUNK - 1, #acks)))
end
local released = {}
for _, pub in ipairs(turn_order) do
  local t = turns[pub]
  if t.popped > 0 then
    redis.call('LTRIM', t.fifo, t.popped, -1)
    if redis.call('LLEN', t.fifo) == 0 then
      redis.call('DEL', t.owner)
      redis.call('SREM', active, pub)
      released[pub] = true
    elseif yield[pub] then
      redis.call('DEL', t.owner)  -- still active: another worker's sweep takes the turn
      released[pub] = true
    else
      redis.call('PEXPIRE', t.owner, lease_ms)
    end
  end
end
-- mark "released" on the last handled unit of each publisher that gave up its turn
local u_index = 0
local last_of = {}
for u = first, #ARGV, 12 do
  u_index = u_index + 1
  if out[3 * u_index - 2] ~= 0 then last_of[ARGV[u]] = u_index end
end
for pub, i in pairs(last_of) do
  if released[pub] then out[3 * i] = 1 end
end
return out
