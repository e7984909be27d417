-- broker_commit (no flags: a full server refuses the call as a whole before it runs, nothing
-- written; lib.lua): the workers' unit of work, FCALL broker_commit in the pipeline that also
-- carries their next dequeue (worker/loop.py _send).
-- Units of work for a batch of publications, in one atomic call: for each one,
-- fan out to every subscriber queue, record the message id, journal it,
-- acknowledge the stream entry, post the result and pass the publisher's turn
-- on. Fenced per publication: nothing is written for it unless this worker
-- holds the publisher's turn and the entry is next in the publisher's FIFO (a
-- worker resumed after its lease cannot write).
--
-- Three named phases, so that no command can fail after the first write (Redis
-- does not roll back a script), except a subscriber queue's push, made with
-- redis.pcall, whose failure writes nothing:
--   check: the type of every queue-manager-wide key (a foreign one stops the
--     call with an error, before any write); per recipient queue only whether its
--     subscription is gone (when the index version changed) or it is a
--     transmission stream (its type: a broker role's key);
--   plan: per publication, the fence, the type of every key it would write (its
--     dedup record, with one SET NX GET, its reply list) and its outcome; a
--     publication that would have to write to a foreign key is refused as a whole,
--     with that reason. Its copies are queued per queue;
--   write: one push routine per queue (one LPUSH per band: its return is the
--     band's depth after it, for flow control and the bell), then the settling of
--     what the pushes said (only when a push failed or a band is past flow
--     control's start depth), dead letters, results, journal, counters, flow keys,
--     one XACK, one LTRIM per FIFO.
-- A feature nothing in the call asks for costs nothing: no journal key is looked
-- at when ARGV[7] is 0, no watched queue when ARGV[12] is "", no flow work when
-- ARGV[13] is "" or no band is past the start depth after the pushes, and KEYS[9]
-- (retained publications) only when a unit's option says "retain": one TYPE per call
-- and one HSET (HDEL) per retained publication.
--
-- Unavailable subscriptions (issue 27): a subscriber queue (any priority band)
-- holding another type, a subscription's own key a subscriber role may write, makes
-- that subscription unavailable for the publications it matches, as a full queue
-- does: the unit's delivery option (PMSGDLV/NPMSGDLV, IBM MQ) decides. ALLAVAIL
-- (the default): its LPUSH fails and writes nothing, the others get theirs, its
-- copy is dead-lettered ("subscription unavailable: <key> holds a <type>", with
-- dlq.subscription) and counted in KEYS[7]. ALL (every queue) and ALLDUR (the
-- durable ones, known from ARGV[12]) must know before any write: one TYPE per
-- queue of such a unit, once per call, and an unavailable one refuses the
-- publication as a whole. A bell of another type is not rung (ring in lib.lua)
-- and refuses nothing.
--
-- Cost (this script is most of the broker's Redis time): a recipient queue costs
-- its LPUSH and nothing else (no depth read, no type read) unless a feature asks;
-- each publisher's FIFO with one LRANGE of as many heads as it has units in the
-- call (the fence); a unit makes one redis.call (its dedup record) and its copies
-- join one LPUSH per queue. docs/design.md has the instructions per phase.
--
-- Flow control (ARGV[13], SwiftMQ's delay-based flow control, seed 003): a
-- publication's delay is curve(the deepest band it went to, itself included): the
-- slowest subscriber's. A band's depth before the call is its LPUSH's return minus
-- the copies the call gave it; a copy's depth, that plus its place among them. Only
-- "hot" bands are followed: those past the start depth after the pushes; any other
-- stayed where the delay is 0. The delay is posted in the result
-- ("flow_control_delay_ms": its copies are then gone over in order, the only
-- per-copy work) and, when above 0, set on the publisher's flow key (PX that delay),
-- which a publisher that does not wait for results reads: the delay of the deepest
-- band its publications in the call went to, as deep as the call leaves it (worked
-- out once per recipient set).
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
-- KEYS[7] deliveries skipped per subscription "{qm}:skipped" (a full queue or an unavailable
--   subscription under ALLDUR/ALLAVAIL, or a slow subscriber)
-- KEYS[8] deliveries withheld per subscription by a slow-subscriber condition "{qm}:slow"
-- KEYS[9] the retained publications "{qm}:retained" (topic -> envelope), looked at only when a
--   unit of the call is retained (option "retain")
-- KEYS[10..] the subscriber queues (priority bands) this batch delivers to
--   ("{qm}:sub:<id>" or "{qm}:sub:<id>:p<N>"); each one's subscription's bell
--   ("{qm}:sub:<id>:bell") is rung when an empty band gets messages (its LPUSH returned as many
--   as it pushed); and the transmission
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
--   (a proxy subscription's queue, broker.topics.topology): it gets one XADD * e <envelope> per
--   publication, is never gone, watched or counted for flow control, and holds a stream
-- ARGV[9] approximate cap of the dead-letter stream, records
-- ARGV[10] max_body_bytes: a dead letter keeps a field (the body) only up to this size
-- ARGV[11] the index version the worker's routing table was loaded at
-- ARGV[12] watched queues: "<KEYS index>:<maxdepth>:<durable 1|0> ...", "" for none; maxdepth
--   is the topic objects' MAXDEPTH, 0 for none (a queue watched for a slow-subscriber
--   condition or ALLDUR only). A watched queue's depth is the sum of its subscription's priority bands
--   ("{qm}:sub:<id>" and "{qm}:sub:<id>:p<N>", built here from the queue key), read once
--   per subscription per batch and counted up as publications go to any of its bands
-- ARGV[13] flow control: "<start depth>:<full depth>:<max delay ms>", "" when off. A delay is
--   0 up to the start depth, max from the full depth on, linear (rounded down) in between
-- ARGV[14] Y, the number of publishers whose turn to give up after this call
--   even if their FIFO is not empty (fair share: another worker takes them)
-- ARGV[15 .. 14+Y] those publishers
-- then one unit of work per publication, its fields in this order (UNIT_FIELDS
-- in broker/core/unit_of_work.py; a test checks the two lists match). Few fields, because
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
--   delivery: "ALL" | "ALLDUR" | "ALLAVAIL" when a recipient queue is full or unavailable
--   (PMSGDLV/NPMSGDLV); ALLDUR's queues are watched (ARGV[12]: which are durable)
--   dead_letter: "1" a refused publication is dead-lettered, "0" not (USEDLQ)
--   slow: "" or the slow-subscriber condition of its root topic, when it applies
--   to the publication: "<max_messages>:<disconnect non-durable 1|0>:<disconnect durable 1|0>";
--   every queue of its recipient set is watched (ARGV[12])
--   retain: "" (not retained) or "s<n>" (store: a delivered publication's envelope becomes its
--   topic's retained one, HSET KEYS[9]) or "c<n>" (clear: an empty body, HDEL), n the topic's
--   length in bytes: the rest of the string then starts with the topic
--   suggestion: "" or a corrected topic (the rest of the string, after the retained topic)
-- unit field 6 journal: "<seq or empty>|<enqueued_ms>|<topic>"; only when ARGV[7] > 0 (without the
--   journal a unit has the 6 fields before it)
-- returns 3 integers per publication: status, subscriptions, gave_up
--   status: 0 fenced, 1 delivered, 2 duplicate, 3 expired, 4 refused, 5 skipped, 6 retry (a
--   retained publication when the index version changed since the worker resolved it, and the
--   publisher's units after it in the call: nothing written, the turn kept; the worker decides
--   them again with its table brought to the new version, so a subscription made meanwhile
--   either gets it delivered or finds it in the retained store)
--   gave_up: 1 when the FIFO is now empty and the turn was given up
-- then, per subscription a delivered publication's condition asks to disconnect, each once:
--   its id and the condition's max_messages (the worker removes it only if still that deep)
-- errors "BROKER foreign key: ..." before any write when a queue-manager-wide key is foreign,
--   and "OOM ..." when the server is full (its first write refused, the dedup record's or a
--   push's: nothing written); "BROKER malformed unit of work: ..." when a unit's recipient set
--   names a key the call does not have (never from the worker: the units planned before it may
--   have written their dedup records, nothing else);
--   broker/core/scripts.py raises them as ForeignKey and ServerFull


do  -- the unit of work's names are local to this block (Lua 5.1: 200 locals in the library's main chunk)

-- A function of the library, not a script: its helpers below are made once, when the library is
-- loaded, instead of on every call (an EVALSHA runs its whole chunk per call, making each
-- `local function` again: docs/design.md, the unit of work's cost). What a call works out from its
-- KEYS and ARGV, and the tables it fills, are the block's locals below, (re)assigned at the start
-- of each call (begin and each phase; functions run one at a time). KEYS, ARGV and redis.pcall are
-- locals: a global is a table lookup on every use, and the plan reads a few ARGV per unit.
local KEYS, ARGV, pcall_redis
local stream, active, dlq, journal, subs
local group, token, lease_ms
local pub_prefix, dedup_prefix, reply_prefix
local journal_len, sub_prefix, sub_prefix_len
local dlq_len, max_body
local resolved_version, limits_arg, flow_arg
local give_up, first
local PUBLISHER, ENTRY_ID, PAYLOAD, MSGID, RECIPIENTS, OPTIONS, JOURNAL = 0, 1, 2, 3, 4, 5, 6
local UNIT_FIELDS = 7
local UNIT  -- UNIT_FIELDS, or one less without the journal (no journal field per unit)
local FIRST_QUEUE = 10
local skipped_key, slow_key, retained_key, watching
-- A call's optional tables are EMPTY (lib.lua) until it writes to them (`writable`): a call of one
-- publication pays its fixed cost per publication (the paced row, docs/design.md).

local nkeys  -- #KEYS
local function begin(keys_, argv_)
  KEYS, ARGV, pcall_redis = keys_, argv_, redis.pcall
  nkeys = #KEYS
  stream, active, dlq, journal, subs = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
  group, token, lease_ms = ARGV[1], ARGV[2], ARGV[3]
  pub_prefix, dedup_prefix, reply_prefix = ARGV[4], ARGV[5], ARGV[6]
  journal_len, sub_prefix = tonumber(ARGV[7]), ARGV[8]
  sub_prefix_len = #sub_prefix
  dlq_len, max_body = ARGV[9], tonumber(ARGV[10])
  resolved_version, limits_arg, flow_arg = ARGV[11], ARGV[12], ARGV[13]
  local ngive_up = tonumber(ARGV[14])
  give_up = EMPTY
  if ngive_up > 0 then give_up = {} end
  for i = 15, 14 + ngive_up do give_up[ARGV[i]] = true end
  first = 15 + ngive_up
  UNIT = UNIT_FIELDS
  if journal_len == 0 then UNIT = UNIT_FIELDS - 1 end
  skipped_key, slow_key, retained_key = KEYS[7], KEYS[8], KEYS[9]
  watching = limits_arg ~= ''
end

-- Outcomes, as the reply codes them (broker.core.unit_of_work.OUTCOMES) and the result names them.
local DELIVERED, DUPLICATE, EXPIRED, REFUSED, SKIPPED, RETRY = 1, 2, 3, 4, 5, 6
local STATUS_NAME = {'delivered', 'duplicate', 'expired', 'refused', 'skipped'}

-- ==== Phase "check": the queue-manager-wide keys, then every recipient queue =================

-- the index version: read (GET checks its type too) before the others; the subscription hash is
-- looked at (HEXISTS, below) only when the version changed since the worker resolved the topics
local changed, moved
local function check_fixed()
  local version = pcall_redis('GET', KEYS[6])
  if type(version) == 'table' then error({err = 'BROKER ' .. foreign(KEYS[6], 'string')}) end
  changed = version ~= resolved_version
  -- moved on since the worker resolved (an absent version and "" or "0" are the same): retained units retry
  moved = changed and (version or '0') ~= (resolved_version == '' and '0' or resolved_version)
  require_type(stream, 'stream')
  require_type(active, 'set')
  require_type(dlq, 'stream')
  if changed then require_type(subs, 'hash') end
  if watching then
    require_type(skipped_key, 'hash')
    require_type(slow_key, 'hash')
  end
  if journal_len > 0 then require_type(journal, 'stream') end
end

-- Per recipient queue KEYS[k]: queue_foreign[k] (a transmission stream that cannot be written, or
-- nil); gone[k] (its subscription was removed since the worker resolved it); xmit[k] (a
-- transmission stream); pushed[k] (copies this call gives it, nil for none) and copies[k] (those
-- copies). A subscriber queue's type is not looked at here: its push (write phase) says it.
-- pushed and copies outlive the call: each push empties what it pushed, so that a queue's list is
-- not made again for each call; `clean` is false from a call's start until its pushes are done (a
-- call stopped before, by an error, leaves them to be made afresh by the next one). Lists of up to
-- KEEP_COPIES copies are kept, and none after a call of KEEP_QUEUES queues or more.
local queue_foreign, sub_of, gone, xmit
local pushed, copies, clean = {}, {}, true
local KEEP_QUEUES, KEEP_COPIES = 64, 64

-- the subscription id of queue KEYS[k] (its band suffix cut), worked out only when needed
local function sub_id_of(k)
  local id = sub_of[k]
  if not id then
    local rest = string.sub(KEYS[k], sub_prefix_len + 1)
    id = string.match(rest, '^(.*):p%d$') or rest
    sub_of = writable(sub_of)
    sub_of[k] = id
  end
  return id
end

local function check_queue(k)
  local queue = KEYS[k]
  if string.find(queue, sub_prefix, 1, true) ~= 1 then  -- (plain: no substring made)
    xmit, queue_foreign = writable(xmit), writable(queue_foreign)
    xmit[k] = true
    queue_foreign[k] = foreign(queue, 'stream')
  elseif changed and redis.call('HEXISTS', subs, sub_id_of(k)) == 0 then
    gone = writable(gone)
    gone[k] = true
  end
end
local function check_queues()
  queue_foreign, sub_of, gone, xmit = EMPTY, EMPTY, EMPTY, EMPTY
  if not clean then pushed, copies = {}, {} end
  clean = false
  for k = FIRST_QUEUE, nkeys do check_queue(k) end
end

-- Why subscriber queue KEYS[k] is unavailable (it holds another type: a subscriber's own key,
-- planted), or false; looked at (one TYPE) only for a unit whose policy must know before any
-- write (ALL, ALLDUR), once per call. A push that fails says the same for the others.
local unavailable
local function unavailable_of(k)
  local why = unavailable[k]
  if why == nil then
    local found = redis.call('TYPE', KEYS[k])['ok']
    why = found ~= 'none' and found ~= 'list' and
      ('subscription unavailable: ' .. KEYS[k] .. ' holds a ' .. found)
    unavailable = writable(unavailable)
    unavailable[k] = why
  end
  return why
end

-- Flow control (ARGV[13]): the curve. Whether it is in force for this call is known after the
-- pushes (each LPUSH returns its band's depth): only when some band is past the start depth.
-- (parsed when it differs from the last call's: it is a setting, the same in every call)
-- fc_limit: the start depth, or no limit without flow control
local fc_start, fc_full, fc_max
local fc_arg, fc_limit = '', 1 / 0  -- (1 / 0: infinity; `math` is not there while the library loads)
local function flow_curve()
  if flow_arg == fc_arg then return end
  fc_start, fc_full, fc_max, fc_arg, fc_limit = nil, nil, nil, flow_arg, math.huge
  if flow_arg ~= '' then
    local a, b, c = string.match(flow_arg, '^(%d+):(%d+):(%d+)$')
    fc_start, fc_full, fc_max = tonumber(a), tonumber(b), tonumber(c)
    fc_limit = fc_start or math.huge
  end
end
local function flow_delay(depth)
  if depth <= fc_start then return 0 end
  if depth >= fc_full then return fc_max end
  local delay = fc_max * (depth - fc_start) / (fc_full - fc_start)
  return delay - delay % 1  -- rounded down
end

-- Watched queues (ARGV[12]: MAXDEPTH, slow-subscriber conditions): the messages waiting in every
-- band of their subscription, read once per subscription. limit[k] = MAXDEPTH or nil.
local limit, durable_q, depth_of
-- the suffixes of the bands other than the default one (built once: number to string is slow)
local OTHER_BANDS = {':p0', ':p1', ':p2', ':p3', ':p5', ':p6', ':p7', ':p8', ':p9'}
local function waiting_in(k)
  local id = sub_id_of(k)
  local queue = sub_prefix .. id
  local others = {}
  for i = 1, 9 do others[i] = queue .. OTHER_BANDS[i] end
  -- pcall: a band of another type (a foreign key) holds no messages of this subscription
  local waiting = redis.pcall('LLEN', queue)
  if type(waiting) ~= 'number' then waiting = 0 end
  -- the other bands are usually absent: one EXISTS says so
  if redis.call('EXISTS', unpack(others)) > 0 then waiting = waiting + total_length(others) end
  return waiting
end
-- the deepest watched subscription and the lowest MAXDEPTH: the n-th unit of the batch cannot
-- find a queue deeper than deepest_watched + n, so below a threshold it need not look at each one
local deepest_watched, lowest_limit
local function watch(k, depth, dur)
  if gone[k] or queue_foreign[k] or xmit[k] then return end
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
-- watched_id[k] = the subscription id of band k when its subscription is watched (its depth counted up)
local watched_id
local function watch_queues()
  unavailable, limit, durable_q, depth_of, watched_id = EMPTY, EMPTY, EMPTY, EMPTY, EMPTY
  deepest_watched, lowest_limit = 0, math.huge
  if not watching then return end
  limit, durable_q, depth_of, watched_id = {}, {}, {}, {}
  for k, depth, dur in string.gmatch(limits_arg, '(%d+):(%d+):(%d)') do watch(tonumber(k), depth, dur) end
  for k = FIRST_QUEUE, nkeys do
    if not xmit[k] and not gone[k] and depth_of[sub_id_of(k)] then watched_id[k] = sub_id_of(k) end
  end
end

-- ==== Phase "plan": per unit, the fence, its keys' types, its outcome and its copies ===========

-- A unit's recipient set (field 4) as a list of KEYS indexes: sets[packed], parsed once per
-- distinct value and kept across calls (the list depends on the packed string alone; the table is
-- made afresh at the start of a call once it holds more than KEEP_SETS), never written once made.
-- What every unit sent to it asks depends on the call's queues: set_why[set] = the first foreign
-- transmission stream's reason, if any; set_kind[set] = MIXED (a queue gone or a transmission
-- stream), nil for PLAIN (every queue a subscriber queue still subscribed); worked out once per
-- call (classified[set]), and only in a call that has a queue gone or a transmission stream.
local PLAIN, MIXED = 1, 2
local sets, sets_kept, KEEP_SETS = {}, 0, 256
-- set_top[set]: its highest KEYS index (infinity for an index below FIRST_QUEUE, a fixed key): a
-- set naming a key the call does not have stops the call (a malformed call, never the worker's)
local set_top = {}
local classified, set_why, set_kind
local function classify(set)
  classified = writable(classified)
  classified[set] = true
  local kind, why = PLAIN, nil
  for i = 1, #set do
    local k = set[i]
    why = why or queue_foreign[k]
    if gone[k] or xmit[k] then kind = MIXED end
  end
  if why then
    set_why = writable(set_why)
    set_why[set] = why
  end
  if kind == MIXED then
    set_kind = writable(set_kind)
    set_kind[set] = MIXED
  end
end
local function set_of(packed)
  local set = sets[packed]
  if not set then
    set = {}
    local m, top = 0, 0
    for at = 1, #packed, 3000 do  -- string.byte returns its bytes on the Lua stack: a slice at a time
      local b = {string.byte(packed, at, math.min(at + 2999, #packed))}
      for i = 1, #b - 2, 3 do
        local k = (b[i] * 256 + b[i + 1]) * 256 + b[i + 2]
        m = m + 1
        set[m] = k
        if k > top then top = k end
        if k < FIRST_QUEUE then top = 1 / 0 end
      end
    end
    if #packed % 3 ~= 0 then top = 1 / 0 end
    sets[packed], set_top[set] = set, top
    sets_kept = sets_kept + 1
  end
  if set_top[set] > nkeys then
    error({err = 'BROKER malformed unit of work: a recipient set names a key the call does not have'})
  end
  if (xmit ~= EMPTY or gone ~= EMPTY) and not classified[set] then classify(set) end
  return set
end

-- A unit's options (field 5), parsed once per distinct value, kept across calls (a call's units
-- mostly share one value, and so do the calls: string.match is a good part of a small call's cost);
-- the table is made afresh at the start of a call once it holds more than KEEP_OPTIONS values.
local options, options_kept = {}, 0
local KEEP_OPTIONS = 256
local function options_of(text)
  local action, window, reply_ttl, delivery, dead, slow, retain, size, rest =
    string.match(text, '^(%a+)|(%d+)|(%d+)|(%u+)|([01])|([%d:]*)|(%l?)(%d*)|(.*)$')
  local o = {action = action, window = window, reply_ttl = reply_ttl, delivery = delivery,
             dead_letter = dead == '1', slow = slow, suggestion = rest}
  if retain ~= '' then  -- a retained publication: its topic, then the suggestion
    size = tonumber(size)
    o.retain, o.topic, o.suggestion = retain, string.sub(rest, 1, size), string.sub(rest, size + 1)
  end
  options[text] = o
  options_kept = options_kept + 1
  return o
end

-- The fence: per publisher, its turn (this worker's token?) and as many FIFO heads as it has
-- units in the call, read once. turns[pub] = {ok, popped, heads, fifo, turn, depth (the deepest band its units
-- met, flow control), last (its last unit), and when needed dedup, reply (the prefixes of its keys)}.
local turns, turn_order, units_of
local function turn_of(pub)
  local turn, fifo = pub_prefix .. pub .. ':turn', pub_prefix .. pub .. ':fifo'
  -- pcall: a foreign turn or FIFO key is simply not this worker's turn
  local ok, heads = redis.pcall('GET', turn) == token, nil
  if ok then
    heads = redis.pcall('LRANGE', fifo, 0, units_of[pub] - 1)
    ok = heads.err == nil
  end
  local t = {ok = ok, popped = 0, heads = heads, fifo = fifo, turn = turn, depth = 0, last = 0}
  turns[pub] = t
  turn_order[#turn_order + 1] = pub
  return t
end

-- The plan, one slot per unit n (so that a plain unit makes no table): its outcome and count in
-- the reply (out[3n - 2], out[3n - 1], below) and, only when there is one: reply_of[n] (the key
-- its result is posted on), reason_of[n], skip_of[n] ({KEYS index = 'full' | 'slow'}),
-- delay_of[n] (ms), forwarded_of[n].
local reply_of, reason_of, skip_of, delay_of, forwarded_of
-- retained publications (option "retain"): the delivered units' {options, ARGV index}, in order
-- (the last of a topic wins); why KEYS[9] cannot be written (nil: not looked at yet)
local retains, retained_why
local skipped, withheld   -- sub id -> deliveries skipped (full queue or slow), withheld (slow)
local disconnect, disconnect_order  -- sub id -> max_messages of the condition
local conditions    -- a unit's slow option -> {max_messages, non-durable flag, durable flag}

-- A slow-subscriber condition (option "slow"): a watched queue of the set holding max_messages or
-- more is withheld the publication (skip[k] = 'slow'); returns skip and the subscriptions the
-- condition asks to disconnect if the publication is delivered.
local function withhold_slow(n, set, condition, skip)
  local parsed = conditions[condition]
  if not parsed then
    local m, nd, dd = string.match(condition, '^(%d+):(%d):(%d)$')
    parsed = {tonumber(m), nd, dd}
    conditions = writable(conditions)
    conditions[condition] = parsed
  end
  local most, non_durable, durable = parsed[1], parsed[2], parsed[3]
  if deepest_watched + n < most then return skip, nil end
  local said = nil
  for _, k in ipairs(set) do
    local id = not gone[k] and not xmit[k] and sub_id_of(k)
    if id and depth_of[id] and depth_of[id] >= most then
      skip = skip or {}
      skip[k] = 'slow'
      if (durable_q[k] and durable == '1') or (not durable_q[k] and non_durable == '1') then
        said = said or {}
        said[id] = most
      end
    end
  end
  return skip, said
end

-- MAXDEPTH (PMSGDLV/NPMSGDLV): a full bounded queue refuses the publication as a whole (ALL;
-- ALLDUR for a durable subscription: returns why) or is skipped (skip[k] = 'full').
local function bound(n, set, policy, skip)
  if deepest_watched + n < lowest_limit then return nil, skip end
  for _, k in ipairs(set) do
    if limit[k] and not (skip and skip[k]) and depth_of[sub_id_of(k)] >= limit[k] then
      if policy == 'ALL' or (policy == 'ALLDUR' and durable_q[k]) then
        return 'subscriber queue ' .. KEYS[k] .. ' is full (MAXDEPTH ' .. limit[k] .. ', delivery ' .. policy .. ')', nil
      end
      skip = skip or {}
      skip[k] = 'full'
    end
  end
  return nil, skip
end

-- ALL, ALLDUR (PMSGDLV/NPMSGDLV): an unavailable subscriber queue of the set (ALLDUR: a durable
-- one's) refuses the publication as a whole, before any write: returns why, or nil. Under
-- ALLAVAIL (the default) nothing is looked at here: the push says it (write phase).
local function refuse_unavailable(set, policy, skip)
  for _, k in ipairs(set) do
    if not gone[k] and not xmit[k] and not (skip and skip[k]) and (policy == 'ALL' or durable_q[k]) then
      local why = unavailable_of(k)
      if why then return why .. ' (delivery ' .. policy .. ')' end
    end
  end
  return nil
end

-- A delivery skipped (a full queue, an unavailable subscription) or withheld (a slow subscriber),
-- counted per subscription.
local function count_skipped(k, why)
  local id = sub_id_of(k)
  skipped = writable(skipped)
  skipped[id] = (skipped[id] or 0) + 1
  if why == 'slow' then
    withheld = writable(withheld)
    withheld[id] = (withheld[id] or 0) + 1
  end
end

-- Queue k gets a copy (its list, kept across calls, made the first time: `copies`).
local function give(k, payload)
  local c = (pushed[k] or 0) + 1
  pushed[k] = c
  local list = copies[k]
  if not list then
    list = {}
    copies[k] = list
  end
  list[c] = payload
end

-- Give copies to the queues of a set that are not gone or skipped, counting what was skipped.
-- Returns how many subscriptions got one.
local function copy_each(n, set, payload, skip)
  local given, forwarded = 0, 0
  for i = 1, #set do
    local k = set[i]
    local why = skip and skip[k]
    if why then
      count_skipped(k, why)
    elseif not gone[k] then
      give(k, payload)
      if xmit[k] then
        forwarded = forwarded + 1
      else
        given = given + 1
        local id = watched_id[k]
        if id then depth_of[id] = depth_of[id] + 1 end
      end
    end
  end
  if forwarded > 0 then
    forwarded_of = writable(forwarded_of)
    forwarded_of[n] = forwarded
  end
  return given
end

-- The subscriptions a delivered publication's slow-subscriber condition asks to disconnect.
local function ask_disconnect(said)
  disconnect, disconnect_order = writable(disconnect), writable(disconnect_order)
  for id, most in pairs(said) do
    if not disconnect[id] then disconnect_order[#disconnect_order + 1] = id end
    disconnect[id] = most
  end
end

-- Decide a deliver unit n whose turn holds: refused (a foreign key, a full or unavailable queue
-- under ALL),
-- duplicate, or delivered with its copies queued. Returns the outcome, the reason it is refused
-- (or nil) and how many subscriptions get a copy.
local function plan_deliver(n, t, o, set, u, reply_why)
  local entry_id, recorded = ARGV[u + ENTRY_ID], nil
  if o.retain then
    -- a retained publication writes KEYS[9]: its type is looked at once per call, before the
    -- unit's first write; a foreign one refuses the publication as a whole
    if retained_why == nil then retained_why = foreign(retained_key, 'hash') or false end
    if retained_why then return REFUSED, retained_why end
  end
  if o.window ~= '0' then
    -- The dedup record first: a retry of a delivered message is a duplicate, whatever else
    -- changed since. One SET NX GET records it (nil: fresh), finds it (a string: duplicate) or
    -- fails on a foreign key, writing nothing.
    local dedup = t.dedup
    if not dedup then
      dedup = id_key(dedup_prefix, ARGV[u + PUBLISHER], '')
      t.dedup = dedup
    end
    local key = dedup .. ARGV[u + MSGID]
    local found = pcall_redis('SET', key, entry_id, 'NX', 'PX', o.window, 'GET')
    if found == false then  -- fresh (the usual case, tested first: type() is a call)
      recorded = key
    elseif type(found) == 'table' and found.err then
      -- a full server refuses the first write of a script, so nothing is written yet: stop with
      -- the error (the worker retries), never refuse the publication for it
      if string.sub(found.err, 1, 3) == 'OOM' then error({err = found.err}) end
      return REFUSED, foreign(key, 'string') or ('dedup record ' .. key .. ': ' .. found.err)
    else
      return DUPLICATE
    end
  end
  local why = reply_why and (reply_why .. '; the result could not be posted')
  local kind = set and (set_kind[set] or PLAIN)
  if not why and kind == MIXED then why = set_why[set] end
  local skip, said = nil, nil
  if not why and set and o.slow ~= '' then skip, said = withhold_slow(n, set, o.slow, skip) end
  if not why and set and watching then why, skip = bound(n, set, o.delivery, skip) end
  if not why and set and o.delivery ~= 'ALLAVAIL' then why = refuse_unavailable(set, o.delivery, skip) end
  if why then
    -- refused after all: the record this script just made did not exist before it
    if recorded then redis.call('DEL', recorded) end
    return REFUSED, why
  end
  if o.retain then
    retains = writable(retains)
    retains[#retains + 1] = {o, u}
  end
  if not set then return DELIVERED end
  local payload = ARGV[u + PAYLOAD]
  local given
  if skip or watching then kind = MIXED end
  if kind == PLAIN then
    for i = 1, #set do give(set[i], payload) end  -- the usual case: a copy for every queue of the set
    given = #set
  else
    if skip then
      skip_of = writable(skip_of)
      skip_of[n] = skip
    end
    given = copy_each(n, set, payload, skip)
  end
  if said then ask_disconnect(said) end
  return DELIVERED, nil, given
end

-- Plan every unit n (ARGV index u): fenced (its reply 0, 0, 0), or its outcome.
-- The reply (3 integers per unit, filled in as each is planned), the entries to acknowledge and
-- the units the write phase has more to do for (a dead letter, a result, a journal record).
local out, acks, nacks, writes
local function plan()
  if sets_kept > KEEP_SETS then sets, set_top, sets_kept = {}, {}, 0 end
  classified, set_why, set_kind = EMPTY, EMPTY, EMPTY
  if options_kept > KEEP_OPTIONS then options, options_kept = {}, 0 end
  turns, turn_order, units_of = {}, {}, {}
  reply_of, reason_of, skip_of, delay_of, forwarded_of = EMPTY, EMPTY, EMPTY, EMPTY, EMPTY
  retains, retained_why = EMPTY, nil
  skipped, withheld, disconnect, disconnect_order, conditions = EMPTY, EMPTY, EMPTY, EMPTY, EMPTY
  out, acks, nacks, writes = {}, {}, 0, EMPTY
  for u = first, #ARGV, UNIT do
    local pub = ARGV[u + PUBLISHER]
    units_of[pub] = (units_of[pub] or 0) + 1
  end
  local n = 0
  for u = first, #ARGV, UNIT do
    n = n + 1
    local pub, entry_id = ARGV[u + PUBLISHER], ARGV[u + ENTRY_ID]
    local t = turns[pub] or turn_of(pub)
    if t.ok and t.heads[t.popped + 1] ~= entry_id then t.ok = false end
    if moved and t.ok and not t.retry then
      -- a retained publication resolved before a subscription was made or removed: decided again
      -- (a new subscription read the retained store before this one is written), with the
      -- publisher's units after it; looked at only when the index version changed
      local o = options[ARGV[u + OPTIONS]] or options_of(ARGV[u + OPTIONS])
      t.retry = o.retain ~= nil and o.action == 'deliver'
    end
    out[3 * n] = 0
    if not t.ok then
      out[3 * n - 2], out[3 * n - 1] = 0, 0  -- fenced
    elseif t.retry then
      out[3 * n - 2], out[3 * n - 1] = RETRY, 0  -- nothing written: its turn and FIFO head stay
    else
      t.popped, t.last = t.popped + 1, n
      nacks = nacks + 1
      acks[nacks] = entry_id
      local text, packed = ARGV[u + OPTIONS], ARGV[u + RECIPIENTS]
      local o = options[text] or options_of(text)
      local set = packed ~= '' and set_of(packed) or nil
      local reply_why = nil
      if o.reply_ttl ~= '0' then
        t.reply = t.reply or id_key(reply_prefix, pub, '')
        local reply_key = t.reply .. ARGV[u + MSGID]
        reply_why = foreign(reply_key, 'list')
        if not reply_why then
          reply_of = writable(reply_of)
          reply_of[n] = reply_key
        end
      end
      local action, why, code, given = o.action, nil, nil, 0
      if action == 'deliver' then
        code, why, given = plan_deliver(n, t, o, set, u, reply_why)
        if why then
          reason_of = writable(reason_of)
          reason_of[n] = why .. '; delivered to no subscription'
        end
      elseif action == 'refuse' then
        reason_of = writable(reason_of)
        code, reason_of[n] = REFUSED, ARGV[u + PAYLOAD]
      else
        code = action == 'expire' and EXPIRED or SKIPPED
      end
      out[3 * n - 2], out[3 * n - 1] = code, given or 0
      if reply_of[n] or reason_of[n] or journal_len > 0 then
        writes = writable(writes)
        writes[#writes + 1] = {n, u}
      end
    end
  end
end

-- ==== Phase "write": every key written below was checked above (or is the publish stream, a
-- FIFO, a turn or the active set, whose types were checked or read), or is a subscriber queue
-- pushed with redis.pcall: a push that fails wrote nothing ==========================================

-- The one push routine: queue k's copies, in order (one variadic LPUSH per CHUNK keeps the
-- queue's order; a transmission stream gets one XADD per copy, its id the channel sequence).
-- LPUSH returns the band's depth after it: after[k]; the band was empty when it returned as many
-- as it pushed, and then its bell is rung. A push refused (the key holds another type: a
-- subscriber's own key, planted) makes the subscription unavailable for this call: failed[k].
local CHUNK = 1000
local failed
local any_failed  -- a push failed
local function unpushed(k, err)
  -- a full server refuses only the first write of a script: nothing is written yet, stop (the
  -- worker retries) rather than call the subscription unavailable
  if string.sub(err, 1, 3) == 'OOM' then error({err = err}) end
  local found = redis.call('TYPE', KEYS[k])['ok']
  failed = writable(failed)
  failed[k] = 'subscription unavailable: ' .. KEYS[k] .. ' holds a ' .. found
  any_failed = true
end

-- Flow control is in force for this call when some band is now past the start depth; then only
-- those bands ("hot") are followed: any other stayed at or under it, where the delay is 0.
-- hot[k] = band k's depth after its push; a copy's depth is its band's depth before the call
-- (base[k]) plus its place among the call's.
local flowing, hot, base
local function push(k)
  local list, c = copies[k], pushed[k]
  pushed[k] = nil
  if xmit[k] then
    for i = 1, c do redis.call('XADD', KEYS[k], '*', 'e', list[i]) end
  else
    local depth = 0
    for i = 1, c, CHUNK do
      local last = c
      if c > CHUNK then last = math.min(i + CHUNK - 1, c) end
      depth = pcall_redis('LPUSH', KEYS[k], unpack(list, i, last))
      if type(depth) == 'table' then
        unpushed(k, depth.err)
        depth = 0
        break
      end
      if depth == last and i == 1 then ring(sub_prefix .. sub_id_of(k) .. ':bell') end
    end
    if depth > fc_limit then
      hot, base = writable(hot), writable(base)
      hot[k], base[k] = depth, depth - c
    end
  end
  -- emptied for the next call (its payloads are not kept), or left to be made again
  if c == 1 then
    list[1] = nil
  elseif c > KEEP_COPIES then
    copies[k] = nil
  else
    for i = 1, c do list[i] = nil end
  end
end

local function push_all()
  failed, any_failed, hot, base = EMPTY, false, EMPTY, EMPTY
  for k = FIRST_QUEUE, nkeys do
    if pushed[k] then push(k) end
  end
  clean = true
  flowing = hot ~= EMPTY
end

-- The copy of unit n (ARGV index u) for failed band k: not delivered, dead-lettered with its
-- subscription named (USEDLQ), counted in {qm}:skipped. Returns the unit's skip table.
local function drop_copy(n, u, k, skip)
  skip = skip or {}
  skip[k] = 'unavailable'
  skip_of = writable(skip_of)
  skip_of[n] = skip
  count_skipped(k, 'unavailable')
  out[3 * n - 1] = out[3 * n - 1] - 1
  if options[ARGV[u + OPTIONS]].dead_letter then
    dead_letter_envelope(dlq, dlq_len, ARGV[u + PAYLOAD], failed[k], ARGV[u + ENTRY_ID], sub_id_of(k))
  end
  return skip
end

-- Go over delivered unit n's copies in the plan's order: drop those of failed bands; returns the
-- deepest hot band its copy met, itself included (its result's delay).
local seen  -- KEYS index -> copies gone over
local function settle_unit(n, u, set)
  local skip, depth = skip_of[n], 0
  for i = 1, #set do
    local k = set[i]
    if not gone[k] and not xmit[k] and not (skip and skip[k]) then
      local c = (seen[k] or 0) + 1
      seen[k] = c
      if failed[k] then
        skip = drop_copy(n, u, k, skip)
      elseif hot[k] and base[k] + c > depth then
        depth = base[k] + c
      end
    end
  end
  return depth
end

-- The deepest hot band unit n went to, as deep as this call leaves it: its publisher's flow key
-- (once per set, unless the unit skipped some of it).
local set_after
local function after_depth(n, set)
  local skip, depth = skip_of[n], 0
  for i = 1, #set do
    local k = set[i]
    local after = hot[k]
    if after and after > depth and not (skip and skip[k]) then depth = after end
  end
  if not skip then set_after[set] = depth end
  return depth
end

-- Settle the delivered units after the pushes, only when a push failed or flow control is in
-- force: their copies one by one only when a push failed or a result must post its own delay.
local function settle()
  local replay = any_failed or (flowing and next(reply_of) ~= nil)
  if not replay and not flowing then return end
  seen, set_after = replay and {} or EMPTY, flowing and {} or EMPTY
  local un = 0
  for u = first, #ARGV, UNIT do
    un = un + 1
    local packed = ARGV[u + RECIPIENTS]
    if out[3 * un - 2] == DELIVERED and packed ~= '' then
      local set = sets[packed]
      local depth = replay and settle_unit(un, u, set)
      if flowing then
        local t, deepest_after = turns[ARGV[u + PUBLISHER]], not skip_of[un] and set_after[set]
        if not deepest_after then deepest_after = after_depth(un, set) end
        if deepest_after > t.depth then t.depth = deepest_after end
        if depth then
          delay_of = writable(delay_of)
          delay_of[un] = flow_delay(depth)
        end
      end
    end
  end
end

local now_ms  -- the journal's delivery time, ms ('' without the journal)

-- The subscription ids a delivered unit went to, as JSON (journal); once per set unless skipped.
local names
local function subscription_ids(set, skip)
  if not set then return '[]' end
  if names[set] and not skip then return names[set] end
  local ids = {}
  for _, k in ipairs(set) do
    if not gone[k] and not xmit[k] and not (skip and skip[k]) then ids[#ids + 1] = sub_id_of(k) end
  end
  local text = #ids > 0 and cjson.encode(ids) or '[]'
  if not skip then names[set] = text end
  return text
end

-- A refused unit's dead letter, its result and its journal record.
local function write_unit(n, u, o)
  local pub, entry_id, msgid = ARGV[u + PUBLISHER], ARGV[u + ENTRY_ID], ARGV[u + MSGID]
  local code = out[3 * n - 2]
  if code == REFUSED and o.dead_letter then
    local original = redis.call('XRANGE', stream, entry_id, entry_id)
    local fields = #original == 1 and original[1][2] or {}
    dead_letter(dlq, dlq_len, max_body, entry_id, fields, reason_of[n])
  end
  if reply_of[n] then
    local result = {status = STATUS_NAME[code], subscriptions = out[3 * n - 1], entry_id = entry_id,
                    publisher = pub, msgid = msgid}
    if code == REFUSED then
      result.reason = reason_of[n]
      if o.suggestion ~= '' then result.suggestion = o.suggestion end
    end
    if flow_arg ~= '' then result.flow_control_delay_ms = delay_of[n] or 0 end
    result.forwarded = forwarded_of[n]
    post_reply(reply_of[n], o.reply_ttl, result)
  end
  if journal_len > 0 and code ~= SKIPPED then
    local packed = ARGV[u + RECIPIENTS]
    local subs_json = code == DELIVERED and packed ~= '' and subscription_ids(sets[packed], skip_of[n]) or '[]'
    local seq, enqueued_ms, topic = string.match(ARGV[u + JOURNAL], '^([^|]*)|([^|]*)|(.*)$')
    redis.call('XADD', journal, 'MAXLEN', '~', journal_len, '*',
      'entry_id', entry_id, 'msgid', msgid, 'publisher', pub, 'seq', seq or '',
      'topic', topic or '', 'subs', subs_json, 'enq_ms', enqueued_ms or '', 'dlv_ms', now_ms,
      'status', STATUS_NAME[code])
  end
end

local function write_all()
  now_ms, names = '', EMPTY
  if journal_len > 0 then
    names = {}
    local tm = redis.call('TIME')
    now_ms = tostring(tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000))
  end
  for _, w in ipairs(writes) do write_unit(w[1], w[2], options[ARGV[w[2] + OPTIONS]]) end
  -- the retained publications, in unit order: the envelope as delivered, or cleared (an empty body)
  for _, r in ipairs(retains) do
    local o = r[1]
    if o.retain == 's' then
      redis.call('HSET', retained_key, o.topic, ARGV[r[2] + PAYLOAD])
    else
      redis.call('HDEL', retained_key, o.topic)
    end
  end

  -- pcall: {qm}:skipped is type-checked only when a queue is watched; a subscription found
  -- unavailable in a call that watches none is then not counted when that key is foreign
  for id, c in pairs(skipped) do pcall_redis('HINCRBY', skipped_key, id, c) end
  for id, c in pairs(withheld) do redis.call('HINCRBY', slow_key, id, c) end
  -- The flow keys: a publisher's largest delay of this call, PX that delay, unless its key is foreign.
  for _, pub in ipairs(flowing and turn_order or EMPTY) do
    local delay, key = flow_delay(turns[pub].depth), pub_prefix .. pub .. ':flow'
    if delay > 0 and not foreign(key, 'string') then redis.call('SET', key, delay, 'PX', delay) end
  end
  for i = 1, #acks, CHUNK do
    redis.call('XACK', stream, group, unpack(acks, i, math.min(i + CHUNK - 1, #acks)))
  end
end

-- Pass the turns on: a publisher whose FIFO is now empty (or who is to give its turn up) gives
-- it up, marked "gave_up" on its last unit of the call; the others' leases are renewed.
local function pass_turn(pub, t)
  redis.call('LTRIM', t.fifo, t.popped, -1)
  if redis.call('LLEN', t.fifo) == 0 then
    redis.call('DEL', t.turn)
    redis.call('SREM', active, pub)
  elseif give_up[pub] then
    redis.call('DEL', t.turn)  -- still active: another worker's sweep takes the turn
  else
    redis.call('PEXPIRE', t.turn, lease_ms)
    return
  end
  out[3 * t.last] = 1
end
local function pass_turns()
  for _, pub in ipairs(turn_order) do
    local t = turns[pub]
    if t.popped > 0 then pass_turn(pub, t) end
  end
  -- the subscriptions to disconnect, after the units' integers
  for _, id in ipairs(disconnect_order) do
    out[#out + 1] = id; out[#out + 1] = disconnect[id]
  end
end

-- ==== The call: the phases in order ==============================================================

local function commit(keys_, argv_)
  begin(keys_, argv_)
  check_fixed()
  check_queues()
  flow_curve()
  watch_queues()
  plan()
  push_all()
  settle()
  write_all()
  pass_turns()
  local reply = out
  -- the call's arguments are not kept until the next call (its copies are gone from `copies`)
  if nkeys >= FIRST_QUEUE + KEEP_QUEUES then pushed, copies = {}, {} end  -- not kept for a call that large
  KEYS, ARGV, acks, out = nil, nil, nil, nil
  return reply
end

redis.register_function{function_name = 'broker_commit', callback = commit}

end
