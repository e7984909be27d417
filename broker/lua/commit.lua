-- Units of work for a batch of publications, in one atomic call: for each one,
-- fan out to every subscriber queue, record the message id, journal it,
-- acknowledge the stream entry, post the result and pass the publisher's turn
-- on. Fenced per publication: nothing is written for it unless this worker
-- holds the publisher's turn and the entry is next in the publisher's FIFO (a
-- worker resumed after its lease cannot write).
--
-- Two phases, so that no command can fail after the first write (Redis does
-- not roll back a script): the first checks the type of every key a
-- publication would write (its dedup record, with one SET NX GET, then its
-- reply list and subscriber queues) and decides its outcome; a publication that would have to write
-- to a foreign key is refused as a whole, with that reason (IBM MQ's
-- PMSGDLV(ALL): delivered to every subscriber or to none). The second phase
-- writes, grouped (one LPUSH per queue, one XACK, one LTRIM per FIFO).
--
-- Cost (this script is most of the broker's Redis time): each subscriber queue is
-- looked at once per call, with one LLEN (its depth; 0 when absent; an error when it
-- holds another type); each publisher's FIFO with one LRANGE of as many heads as it
-- has units in the call (the fence); a unit makes one redis.call (its dedup record)
-- and its copies join one LPUSH per queue.
--
-- Flow control (ARGV[13], SwiftMQ's delay-based flow control, seed 003): the
-- depth of each subscriber queue (KEYS[9..]) is read once per batch (one LLEN;
-- none for a queue that does not exist) and counted up as publications go to
-- it; a publication's delay is curve(the deepest queue it went to, itself
-- included): the slowest subscriber's. It is posted in the result
-- ("flow_control_delay_ms") and, when above 0, set on the publisher's flow key
-- (the largest of its publications in the batch, PX that delay), which a
-- publisher that does not wait for results reads. ARGV[13] "" reads nothing.
--
-- Slow-subscriber conditions (a unit's option "slow", seed 003): a publication whose
-- root topic has a condition that applies to it gives no copy to a watched
-- subscriber queue (ARGV[12]) holding max_messages or more (every band); the
-- others get theirs. Counted in KEYS[7] and KEYS[8]. A queue withheld a
-- publication is no recipient of it: MAXDEPTH is looked at after, on the rest.
-- When the condition says so, the subscription is returned (after the units'
-- integers) for the worker to disconnect after this call.
--
-- KEYS[1] publish stream               "{qm}:publish"
-- KEYS[2] active publishers set        "{qm}:publishers"
-- KEYS[3] dead-letter stream           "{qm}:dlq"
-- KEYS[4] delivery journal stream      "{qm}:journal"
-- KEYS[5] the subscription hash        "{qm}:subs" (fence: a subscription removed since the
--   worker resolved the topic gets nothing, and its queue is never made again)
-- KEYS[6] the index version            "{qm}:version" (unchanged since the worker loaded its
--   routing table: every subscription it resolved to still exists, nothing to look up)
-- KEYS[7] deliveries skipped per subscription "{qm}:skipped" (a full queue, ALLDUR/ALLAVAIL,
--   or a slow subscriber)
-- KEYS[8] deliveries withheld per subscription by a slow-subscriber condition "{qm}:slow"
-- KEYS[9..] the subscriber queues (priority bands) this batch delivers to
--   ("{qm}:sub:<id>" or "{qm}:sub:<id>:p<N>"); each one's subscription's bell
--   ("{qm}:sub:<id>:bell") is rung when an empty band gets messages; and the transmission
--   streams of the channels it forwards on ("{qm}:xmit:<to qm>", ARGV[8])
-- ARGV[1] consumer group
-- ARGV[2] the worker's fencing token
-- ARGV[3] lease_ms of a publisher's turn
-- ARGV[4] per-publisher key prefix     "{qm}:pub:"   (.. publisher .. ":fifo" / ":turn" / ":flow")
-- ARGV[5] dedup key prefix             "{qm}:dedup:" (id_key in lib.lua)
-- ARGV[6] reply key prefix             "{qm}:reply:" (id_key in lib.lua)
-- ARGV[7] journal: approximate max length of the journal stream; 0 = no journal
-- ARGV[8] the subscriber queue prefix "{qm}:sub:" (subscription ids and bells are read from
--   the queue keys); a recipient key outside it is a transmission stream "{qm}:xmit:<to qm>"
--   (a proxy subscription's queue, broker.network): it gets one XADD * e <envelope> per
--   publication, is never gone, watched or counted for flow control, and holds a stream
-- ARGV[9] approximate cap of the dead-letter stream, records
-- ARGV[10] max_body_bytes: a dead letter keeps a field (the body) only up to this size
-- ARGV[11] the index version the worker's routing table was loaded at
-- ARGV[12] watched queues: "<KEYS index>:<maxdepth>:<durable 1|0> ...", "" for none; maxdepth
--   is the topic objects' MAXDEPTH, 0 for none (a queue watched for a slow-subscriber
--   condition only). A watched queue's depth is the sum of its subscription's priority bands
--   ("{qm}:sub:<id>" and "{qm}:sub:<id>:p<N>", built here from the queue key), read once
--   per subscription per batch and counted up as publications go to any of its bands
-- ARGV[13] flow control: "<start depth>:<full depth>:<max delay ms>", "" when off. A delay is
--   0 up to the start depth, max from the full depth on, linear (rounded down) in between
-- ARGV[14] Y, the number of publishers whose turn to give up after this call
--   even if their FIFO is not empty (fair share: another worker takes them)
-- ARGV[15 .. 14+Y] those publishers
-- then one unit of work per publication, its fields in this order (UNIT_FIELDS
-- in broker/unit_of_work.py; a test checks the two lists match). Few fields, because
-- each ARGV costs Redis a string object and Lua an interned string: what most units
-- of a batch share (options, recipient sets) is parsed once per distinct value.
-- unit field 0 publisher
-- unit field 1 entry_id
-- unit field 2 payload: deliver: the envelope; refuse: the reason
-- unit field 3 msgid
-- unit field 4 recipients: the KEYS indexes of its recipient queues, 3 bytes each
--   (big-endian), "" for none; parsed once per distinct value per call
-- unit field 5 options: "<action>|<dedup_window_ms>|<reply_ttl_ms>|<delivery>|<dead_letter>|<slow>|<suggestion>",
--   parsed once per distinct value per call:
--   action: "deliver" | "expire" | "refuse" | "skip"
--   dedup_window_ms: 0 = no dedup record; reply_ttl_ms: 0 = no reply
--   delivery: "ALL" | "ALLDUR" | "ALLAVAIL" when a recipient queue is full (PMSGDLV/NPMSGDLV)
--   dead_letter: "1" a refused publication is dead-lettered, "0" not (USEDLQ)
--   slow: "" or the slow-subscriber condition of its root topic, when it applies
--   to the publication: "<max_messages>:<disconnect non-durable 1|0>:<disconnect durable 1|0>";
--   every queue of its recipient set is watched (ARGV[12])
--   suggestion: "" or a corrected topic (the rest of the string)
-- unit field 6 journal: "<seq or empty>|<enqueued_ms>|<topic>", or "" (no journal: ARGV[7] 0)
-- returns 3 integers per publication: status, subscriptions, gave_up
--   status: 0 fenced, 1 delivered, 2 duplicate, 3 expired, 4 refused, 5 skipped
--   gave_up: 1 when the FIFO is now empty and the turn was given up
-- then, per subscription a delivered publication's condition asks to disconnect, each once:
--   its id and the condition's max_messages (the worker removes it only if still that deep)
-- errors "BROKER foreign key: ..." before any write when a queue-manager-wide key is foreign

local stream, active, dlq, journal, subs = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, token, lease_ms = ARGV[1], ARGV[2], ARGV[3]
local pub_prefix, dedup_prefix, reply_prefix = ARGV[4], ARGV[5], ARGV[6]
local journal_len, sub_prefix = tonumber(ARGV[7]), ARGV[8]
local sub_prefix_len = #sub_prefix
local dlq_len, max_body = ARGV[9], tonumber(ARGV[10])
local resolved_version, limits_arg, flow_arg = ARGV[11], ARGV[12], ARGV[13]
local ngive_up = tonumber(ARGV[14])
local give_up = {}
for i = 15, 14 + ngive_up do give_up[ARGV[i]] = true end
local first = 15 + ngive_up
local PUBLISHER, ENTRY_ID, PAYLOAD, MSGID, RECIPIENTS, OPTIONS, JOURNAL = 0, 1, 2, 3, 4, 5, 6
local UNIT = 7
local FIRST_QUEUE = 9

local skipped_key, slow_key = KEYS[7], KEYS[8]
local fixed = {{stream, 'stream'}, {active, 'set'}, {dlq, 'stream'}, {subs, 'hash'}, {KEYS[6], 'string'}}
if limits_arg ~= '' then
  fixed[#fixed + 1] = {skipped_key, 'hash'}
  fixed[#fixed + 1] = {slow_key, 'hash'}
end
if journal_len > 0 then fixed[#fixed + 1] = {journal, 'stream'} end
require_types(fixed)

-- Flow control: the curve, or nil when off.
local fc_start, fc_full, fc_max
if flow_arg ~= '' then
  local a, b, c = string.match(flow_arg, '^(%d+):(%d+):(%d+)$')
  fc_start, fc_full, fc_max = tonumber(a), tonumber(b), tonumber(c)
end
local function flow_delay(depth)
  if depth <= fc_start then return 0 end
  if depth >= fc_full then return fc_max end
  return math.floor(fc_max * (depth - fc_start) / (fc_full - fc_start))
end

-- The subscriber queues: each checked once per batch; whether its subscription
-- still exists (gone: it gets nothing; looked up only when the index changed
-- since the worker loaded it); for an empty band, its bell (rung below); and its
-- depth (flow control, MAXDEPTH), all with one LLEN.
local changed = redis.call('GET', KEYS[6]) ~= resolved_version
local queue_foreign, sub_of, bell_of, gone, band_depth = {}, {}, {}, {}, {}
local xmit = {}  -- KEYS index -> true: a transmission stream
-- the subscription id of queue KEYS[k] (its band suffix cut), worked out only when needed
local function sub_id_of(k)
  local id = sub_of[k]
  if not id then
    local rest = string.sub(KEYS[k], sub_prefix_len + 1)
    id = string.match(rest, '^(.*):p%d$') or rest
    sub_of[k] = id
  end
  return id
end
for k = FIRST_QUEUE, #KEYS do
  local queue = KEYS[k]
  if string.sub(queue, 1, sub_prefix_len) ~= sub_prefix then
    xmit[k] = true
    gone[k] = false
    queue_foreign[k] = foreign(queue, 'stream')
    band_depth[k] = 0
  else
    gone[k] = changed and redis.call('HEXISTS', subs, sub_id_of(k)) == 0
    if not gone[k] then
      -- a list is never empty: 0 is an absent key; an error is another type (a foreign key)
      local depth = redis.pcall('LLEN', queue)
      if type(depth) ~= 'number' then
        queue_foreign[k] = foreign(queue, 'list') or ('subscriber queue ' .. queue .. ': ' .. tostring(depth.err))
      elseif depth == 0 then
        -- an empty band: its bell is rung when it gets messages (a non-empty band's is rung already)
        bell_of[k] = sub_prefix .. sub_id_of(k) .. ':bell'
        queue_foreign[k] = foreign(bell_of[k], 'list')
        band_depth[k] = 0
      else
        band_depth[k] = depth
      end
    end
  end
end

-- Watched queues (MAXDEPTH, slow-subscriber conditions): the messages waiting in every band
-- of their subscription, read once per subscription. limit[k] = MAXDEPTH or nil.
local watching = limits_arg ~= ''
local limit, durable_q, depth_of = {}, {}, {}
-- the suffixes of the bands other than the default one (built once: number to string is slow)
local OTHER_BANDS = {':p0', ':p1', ':p2', ':p3', ':p5', ':p6', ':p7', ':p8', ':p9'}
-- messages waiting in every band of the subscription of queue KEYS[k]
local function waiting_in(k)
  local id = sub_id_of(k)
  local queue, waiting = KEYS[k], nil
  if #queue == sub_prefix_len + #id then
    waiting = band_depth[k]  -- the default band, its depth read above
  else
    queue = sub_prefix .. id
  end
  local others = {}
  for i = 1, 9 do others[i] = queue .. OTHER_BANDS[i] end
  -- pcall: a band of another type (a foreign key) holds no messages of this subscription
  if not waiting then waiting = redis.pcall('LLEN', queue) end
  if type(waiting) ~= 'number' then waiting = 0 end
  -- the other bands are usually absent: one EXISTS says so
  if redis.call('EXISTS', unpack(others)) > 0 then waiting = waiting + total_length(others) end
  return waiting
end
-- the deepest watched subscription and the lowest MAXDEPTH: the n-th unit of the batch cannot
-- find a queue deeper than deepest_watched + n, so below a threshold it need not look at each one
local deepest_watched, lowest_limit = 0, math.huge
for k, depth, dur in string.gmatch(limits_arg, '(%d+):(%d+):(%d)') do
  k = tonumber(k)
  if not gone[k] and not queue_foreign[k] and not xmit[k] then
    local id = sub_id_of(k)
    if not depth_of[id] then
      depth_of[id] = waiting_in(k)
      if depth_of[id] > deepest_watched then deepest_watched = depth_of[id] end
    end
    durable_q[k] = dur == '1'
    if depth ~= '0' then
      limit[k] = tonumber(depth)
      if limit[k] < lowest_limit then lowest_limit = limit[k] end
    end
  end
end
local skipped, withheld = {}, {}   -- sub id -> deliveries skipped (full queue or slow), withheld (slow)
local disconnect, disconnect_order = {}, {}  -- sub id -> max_messages of the condition
local conditions = {}    -- a unit's slow option -> {max_messages, non-durable flag, durable flag}

-- A unit's recipient set (field 4) as a list of KEYS indexes, parsed once per distinct value,
-- with what phase 1 asks of every unit sent to it: why = the first foreign queue's reason;
-- plain = every queue is a subscriber queue still subscribed (none gone, no transmission stream).
local sets, set_why, set_plain = {}, {}, {}
local function set_of(packed)
  local set = {}
  for at = 1, #packed, 3000 do  -- string.byte returns its bytes on the Lua stack: a slice at a time
    local b = {string.byte(packed, at, math.min(at + 2999, #packed))}
    for i = 1, #b, 3 do set[#set + 1] = (b[i] * 256 + b[i + 1]) * 256 + b[i + 2] end
  end
  local plain = true
  for i = 1, #set do
    local k = set[i]
    if queue_foreign[k] and set_why[set] == nil then set_why[set] = queue_foreign[k] end
    if gone[k] or xmit[k] then plain = false end
  end
  set_plain[set] = plain
  sets[packed] = set
  return set
end

-- A unit's options (field 5), parsed once per distinct value.
local options = {}
local function options_of(text)
  local action, window, reply_ttl, delivery, dead, slow, suggestion =
    string.match(text, '^(%a+)|(%d+)|(%d+)|(%u+)|([01])|([%d:]*)|(.*)$')
  local o = {action = action, window = window, reply_ttl = reply_ttl, delivery = delivery,
             dead_letter = dead == '1', slow = slow, suggestion = suggestion}
  options[text] = o
  return o
end

local STATUS = {delivered = 1, duplicate = 2, expired = 3, refused = 4, skipped = 5}
local turns = {}         -- publisher -> {ok = bool, popped = n, heads = ids, fifo = key, turn = key, delay = ms}
local turn_order = {}

-- units per publisher in this call: how many FIFO heads its fence reads
local units_of = {}
for u = first, #ARGV, UNIT do
  local pub = ARGV[u + PUBLISHER]
  units_of[pub] = (units_of[pub] or 0) + 1
end

-- dedup = id_key(dedup_prefix, pub, '') and reply the same for reply_prefix (lib.lua), built once
local function turn_of(pub)
  local turn, fifo = pub_prefix .. pub .. ':turn', pub_prefix .. pub .. ':fifo'
  -- pcall: a foreign turn or FIFO key is simply not this worker's turn
  local ok, heads = redis.pcall('GET', turn) == token, nil
  if ok then
    heads = redis.pcall('LRANGE', fifo, 0, units_of[pub] - 1)
    ok = heads.err == nil
  end
  local t = {ok = ok, popped = 0, heads = heads, fifo = fifo, turn = turn, delay = 0,
             dedup = id_key(dedup_prefix, pub, ''), reply = id_key(reply_prefix, pub, '')}
  turns[pub] = t
  turn_order[#turn_order + 1] = pub
  return t
end

-- Phase 1: read and decide. plan[i] = nil (fenced) or
-- {u = ARGV index, status, count, reason, reply = key to post on, skip = {k = true}, delay = ms}.
-- The copies of a delivered publication are queued in pushes (written in phase 2).
local plan = {}
local n = 0
local pushes = {}        -- queue KEYS index -> envelopes, in order
local push_order = {}    -- queue KEYS indexes in first-use order
for u = first, #ARGV, UNIT do
  n = n + 1
  local pub, entry_id = ARGV[u + PUBLISHER], ARGV[u + ENTRY_ID]
  local t = turns[pub] or turn_of(pub)
  if t.ok and t.heads[t.popped + 1] ~= entry_id then t.ok = false end
  if t.ok then
    t.popped = t.popped + 1
    local text = ARGV[u + OPTIONS]
    local o = options[text] or options_of(text)
    local action, payload, msgid = o.action, ARGV[u + PAYLOAD], ARGV[u + MSGID]
    local set = nil
    local packed = ARGV[u + RECIPIENTS]
    if packed ~= '' then set = sets[packed] or set_of(packed) end
    local step = {u = u, o = o, set = set, status = 'skipped', count = 0, delay = 0}
    local reply_why = nil
    if o.reply_ttl ~= '0' then
      local reply_key = t.reply .. msgid
      reply_why = foreign(reply_key, 'list')
      if not reply_why then step.reply = reply_key end
    end
    if action == 'deliver' then
      -- The dedup record first: a retry of a delivered message is a duplicate,
      -- whatever else changed since. One SET NX GET records it (nil: fresh), finds
      -- it (a string: duplicate) or fails on a foreign key, writing nothing.
      local why, duplicate, recorded = nil, false, nil
      local slow_said = nil  -- sub id -> max_messages: subscriptions to disconnect if delivered
      if o.window ~= '0' then
        local key = t.dedup .. msgid
        local found = redis.pcall('SET', key, entry_id, 'NX', 'PX', o.window, 'GET')
        if type(found) == 'table' and found.err and string.sub(found.err, 1, 3) == 'OOM' then
          -- a full server refuses the first write of a script, so nothing is written yet:
          -- stop with the error (the worker retries), never refuse the publication for it
          return redis.error_reply(found.err)
        elseif type(found) == 'table' and found.err then
          why = foreign(key, 'string') or ('dedup record ' .. key .. ': ' .. found.err)
        elseif found then
          duplicate = true
        else
          recorded = key
        end
      end
      if not why and not duplicate then
        why = reply_why and (reply_why .. '; the result could not be posted')
        if not why and set then why = set_why[set] end
        -- a slow subscriber (its root topic's condition): withheld this publication
        local condition = o.slow
        if not why and set and condition ~= '' then
          local parsed = conditions[condition]
          if not parsed then
            local m, nd, dd = string.match(condition, '^(%d+):(%d):(%d)$')
            parsed = {tonumber(m), nd, dd}
            conditions[condition] = parsed
          end
          local most, non_durable, durable = parsed[1], parsed[2], parsed[3]
          if deepest_watched + n >= most then
            for _, k in ipairs(set) do
              local id = not gone[k] and not xmit[k] and sub_id_of(k)
              if id and depth_of[id] and depth_of[id] >= most then
                step.skip = step.skip or {}
                step.skip[k] = 'slow'
                if (durable_q[k] and durable == '1') or (not durable_q[k] and non_durable == '1') then
                  slow_said = slow_said or {}
                  slow_said[id] = most
                end
              end
            end
          end
        end
        -- a full bounded queue: refuse as a whole (ALL; ALLDUR for a durable subscription) or skip it
        if not why and set and deepest_watched + n >= lowest_limit then
          local policy = o.delivery
          for _, k in ipairs(set) do
            if limit[k] and not (step.skip and step.skip[k]) and depth_of[sub_id_of(k)] >= limit[k] then
              if policy == 'ALL' or (policy == 'ALLDUR' and durable_q[k]) then
                why = 'subscriber queue ' .. KEYS[k] .. ' is full (MAXDEPTH ' .. limit[k] .. ', delivery ' .. policy .. ')'
                step.skip = nil
                break
              end
              step.skip = step.skip or {}
              step.skip[k] = 'full'
            end
          end
        end
        -- refused after all: the record this script just made did not exist before it
        if why and recorded then redis.call('DEL', recorded) end
      end
      if why then
        step.status, step.reason = 'refused', why .. '; delivered to no subscription'
      elseif duplicate then
        step.status = 'duplicate'
      else
        step.status = 'delivered'
        local skip = step.skip
        if set and set_plain[set] and not skip and not watching then
          -- the usual case: a copy for every queue of the set
          for i = 1, #set do
            local k = set[i]
            local list = pushes[k]
            if not list then
              list = {}
              pushes[k] = list
              push_order[#push_order + 1] = k
            end
            list[#list + 1] = payload
          end
          step.count = #set
          if fc_start then
            local flow_depth = 0
            for i = 1, #set do
              local k = set[i]
              local depth = band_depth[k] + 1
              band_depth[k] = depth
              if depth > flow_depth then flow_depth = depth end
            end
            if flow_depth > fc_start then
              step.delay = flow_delay(flow_depth)
              if step.delay > t.delay then t.delay = step.delay end
            end
          end
        elseif set then
          local flow_depth = 0
          for _, k in ipairs(set) do
            if gone[k] then
              -- removed since the worker resolved the topic: gets nothing
            elseif skip and skip[k] then
              local id = sub_id_of(k)
              skipped[id] = (skipped[id] or 0) + 1
              if skip[k] == 'slow' then withheld[id] = (withheld[id] or 0) + 1 end
            else
              local list = pushes[k]
              if not list then
                list = {}
                pushes[k] = list
                push_order[#push_order + 1] = k
              end
              list[#list + 1] = payload
              if xmit[k] then
                step.forwarded = (step.forwarded or 0) + 1
              else
                step.count = step.count + 1
                if watching then
                  local id = sub_id_of(k)
                  if depth_of[id] then depth_of[id] = depth_of[id] + 1 end
                end
                if fc_start then
                  local depth = band_depth[k] + 1
                  band_depth[k] = depth
                  if depth > flow_depth then flow_depth = depth end
                end
              end
            end
          end
          if fc_start and flow_depth > fc_start then
            step.delay = flow_delay(flow_depth)
            if step.delay > t.delay then t.delay = step.delay end
          end
        end
        for id, most in pairs(slow_said or {}) do
          if not disconnect[id] then disconnect_order[#disconnect_order + 1] = id end
          disconnect[id] = most
        end
      end
    elseif action == 'expire' then
      step.status = 'expired'
    elseif action == 'refuse' then
      step.status, step.reason = 'refused', payload
    end
    plan[n] = step
  end
end

-- The flow keys to set: a publisher's largest delay of this batch, unless its key is foreign.
local flow_keys = {}
if fc_start then
  for _, pub in ipairs(turn_order) do
    local t = turns[pub]
    if t.delay > 0 then
      local key = pub_prefix .. pub .. ':flow'
      if not foreign(key, 'string') then flow_keys[#flow_keys + 1] = {key, t.delay} end
    end
  end
end

-- Phase 2: write. Every key written below was checked above (or is the
-- publish stream, FIFO, turn and set, whose types were checked or read).
local now_ms = ''
if journal_len > 0 then
  local tm = redis.call('TIME')
  now_ms = tostring(tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000))
end
local names = {}
local function subscription_ids(set)
  if not set then return '[]' end
  if not names[set] then
    local ids = {}
    for _, k in ipairs(set) do
      if not gone[k] and not xmit[k] then ids[#ids + 1] = sub_id_of(k) end
    end
    names[set] = cjson.encode(ids)
  end
  return names[set]
end

local out = {}
local acks = {}          -- entry ids to XACK, in order
for i = 1, n do
  local step = plan[i]
  if not step then
    out[#out + 1] = 0; out[#out + 1] = 0; out[#out + 1] = 0
  else
    local u, o, set = step.u, step.o, step.set
    local pub, entry_id, msgid = ARGV[u + PUBLISHER], ARGV[u + ENTRY_ID], ARGV[u + MSGID]
    local status = step.status
    if status == 'refused' then
      local original = redis.call('XRANGE', stream, entry_id, entry_id)
      local fields = {}
      if #original == 1 then fields = original[1][2] end
      if o.dead_letter then dead_letter(dlq, dlq_len, max_body, entry_id, fields, step.reason) end
    end
    acks[#acks + 1] = entry_id
    if step.reply then
      local result = {status = status, subscriptions = step.count, entry_id = entry_id,
                      publisher = pub, msgid = msgid}
      if status == 'refused' then
        result.reason = step.reason
        if o.suggestion ~= '' then result.suggestion = o.suggestion end
      end
      if fc_start then result.flow_control_delay_ms = step.delay end
      if step.forwarded then result.forwarded = step.forwarded end
      post_reply(step.reply, o.reply_ttl, result)
    end
    if journal_len > 0 and status ~= 'skipped' then
      local subs = '[]'
      if status == 'delivered' and step.skip then
        local ids = {}
        for _, k in ipairs(set) do
          if not gone[k] and not step.skip[k] and not xmit[k] then ids[#ids + 1] = sub_id_of(k) end
        end
        if #ids > 0 then subs = cjson.encode(ids) end
      elseif status == 'delivered' then
        subs = subscription_ids(set)
      end
      local seq, enqueued_ms, topic = string.match(ARGV[u + JOURNAL], '^([^|]*)|([^|]*)|(.*)$')
      redis.call('XADD', journal, 'MAXLEN', '~', journal_len, '*',
        'entry_id', entry_id, 'msgid', msgid, 'publisher', pub, 'seq', seq or '',
        'topic', topic or '', 'subs', subs, 'enq_ms', enqueued_ms or '', 'dlv_ms', now_ms, 'status', status)
    end
    out[#out + 1] = STATUS[status]; out[#out + 1] = step.count; out[#out + 1] = 0
  end
end

for id, n in pairs(skipped) do redis.call('HINCRBY', skipped_key, id, n) end
for id, n in pairs(withheld) do redis.call('HINCRBY', slow_key, id, n) end
for _, pair in ipairs(flow_keys) do redis.call('SET', pair[1], pair[2], 'PX', pair[2]) end

-- Apply the fan-out (one variadic LPUSH per queue keeps each queue's order),
-- the acknowledgements and the FIFO pops, then pass on the turns.
local CHUNK = 1000
for _, k in ipairs(push_order) do
  local list = pushes[k]
  if xmit[k] then  -- a channel: one entry per publication, its id the channel sequence
    for i = 1, #list do redis.call('XADD', KEYS[k], '*', 'e', list[i]) end
  else
    for i = 1, #list, CHUNK do
      redis.call('LPUSH', KEYS[k], unpack(list, i, math.min(i + CHUNK - 1, #list)))
    end
    if bell_of[k] then ring(bell_of[k]) end
  end
end
for i = 1, #acks, CHUNK do
  redis.call('XACK', stream, group, unpack(acks, i, math.min(i + CHUNK - 1, #acks)))
end
local gave_up = {}
for _, pub in ipairs(turn_order) do
  local t = turns[pub]
  if t.popped > 0 then
    redis.call('LTRIM', t.fifo, t.popped, -1)
    if redis.call('LLEN', t.fifo) == 0 then
      redis.call('DEL', t.turn)
      redis.call('SREM', active, pub)
      gave_up[pub] = true
    elseif give_up[pub] then
      redis.call('DEL', t.turn)  -- still active: another worker's sweep takes the turn
      gave_up[pub] = true
    else
      redis.call('PEXPIRE', t.turn, lease_ms)
    end
  end
end
-- mark "gave_up" on the last handled unit of each publisher that gave up its turn
local last_of = {}
for i = 1, n do
  if plan[i] then last_of[ARGV[plan[i].u + PUBLISHER]] = i end
end
for pub, i in pairs(last_of) do
  if gave_up[pub] then out[3 * i] = 1 end
end
-- the subscriptions to disconnect, after the units' integers
for _, id in ipairs(disconnect_order) do
  out[#out + 1] = id; out[#out + 1] = disconnect[id]
end
return out
