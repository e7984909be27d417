-- broker_receive, broker_renew (allow-oom: they run on a full server too, maxmemory reached;
-- lib.lua): taking messages moves them (LRANGE + LTRIM of a band, LPUSH onto the in-flight
-- list) and renews a lease, adding no memory to speak of, and consuming (then
-- acknowledging, broker_ack) is how a full server's memory is freed.
-- A consumer takes up to N messages of one subscription into its own in-flight
-- list, highest priority first (Jakarta Messaging §3.4.10), oldest first within
-- a priority. The call is also the consumer's heartbeat: its lease is renewed.
-- A message whose expiration has passed is never handed over: it is counted in the
-- subscription's own expired count (and kept as a poison message when asked). The
-- delivery count of a message redelivered after its consumer died comes from the
-- redelivery hash. docs/protocol.md is the API.
-- Message groups (JMSXGroupID; ActiveMQ Classic, Artemis), on a shared subscription: a
-- message whose header's props hold a string JMSXGroupID goes to the group's owner, the
-- consumer that took the group's first message (recorded in the subscription's groups hash
-- "{qm}:sub:<id>:groups", group -> consumer id), until broker_recover releases the group when
-- the owner closes or its lease lapses; a message of another consumer's group stays where it
-- is, in order, and the call takes the next messages after it. A JMSXGroupSeq below 0 closes
-- the group after its message (ActiveMQ Classic). Without an owned group the call costs one
-- TYPE more and, per message, a look at its first bytes (subscription.lua's may_be_grouped: a
-- worker writes a grouped message's header with "grouped" first), so a message of no group is
-- never searched; an envelope older than protocol 7 is searched for its group as before.
-- Contention: a call passes over at most GROUP_PASS_FACTOR x the messages it may take (at least
-- GROUP_PASS_MIN) of groups other consumers own, and leaves them where they are without writing
-- them again; a call that took nothing and passed some over clears the bell, so its consumer
-- waits for the bell (a new message, another consumer's take) rather than looking again.
--
-- KEYS[1] the subscription's key "{qm}:sub:<id>" (subscription.lua derives the others:
--   consumers zset consumer -> lease deadline ms, this consumer's in-flight list, the bell
--   (one element while messages may wait), redelivery counts, the holder (string consumer
--   id, held while its lease runs), poison stream, expired count, the ten priority bands,
--   the groups hash group -> owning consumer id (a shared subscription only))
-- ARGV[1] consumer id
-- ARGV[2] most messages to take, default 1; 0 makes the call a heartbeat only
-- ARGV[3] lease_ms of the consumer, default 10000
-- ARGV[4] now, ms since the epoch, or "" for the server's clock
-- ARGV[5] the consumer mode: shared (0); exclusive (1, must hold the subscription);
--   activestandby (2, must hold it to receive; waits as a standby, registered, while another
--   holds it); "": the subscription record's
-- ARGV[6] 1: expired messages are kept as poison messages; 0 (default): dropped (counted)
-- ARGV[7] approximate cap of the poison stream, default 100000
-- ARGV[8] max_consumers_per_subscription, default 1000: a consumer not attached (no live lease)
--   is refused while this many consumers have live leases; 0: no limit
-- returns {status, expired, env1, count1, env2, count2, ...}
--   status: "ok" | "standby" (another consumer holds the subscription: nothing taken)
--     | "full" (max_consumers_per_subscription live consumers already: nothing written; the
--     second value is how many)
--   count: the delivery count (JMSXDeliveryCount), 1 for a first delivery
-- errors "BROKER foreign key: ..." (a key of another type), "BROKER bad argument: ...",
--   "BROKER not a subscription key: ...", all before any write

-- most values one LPUSH is given (unpack() takes at most about 8000)
local PUSH_CHUNK = 1000
-- most messages of groups other consumers own that one call passes over (in all bands), per
-- message it may take, and at least (message groups: they stay in place; what lies behind
-- them waits for a later call, usually after their owner took them)
local GROUP_PASS_FACTOR = 2
local GROUP_PASS_MIN = 16

-- The state of one broker_receive while it takes messages (`st`): out (the reply), taken,
-- n_expired, max_n, now, consumer, inflight, redelivered, any_redelivered, to_dlq, dlq,
-- dlq_len, sub_id, with_groups, groups (the groups hash's key), owners (this call's view of
-- it: group -> consumer id, or false: nobody's), pass_left (how many more messages of other
-- consumers' groups it may pass over), passed (how many it passed over).

-- Push the envelopes handed over onto the in-flight list with LPUSH, oldest first (so it ends
-- as a run of LMOVE ... RIGHT LEFT would leave it: newest on the left).
local function hand_over(st, keep)
  for i = 1, #keep, PUSH_CHUNK do
    redis.call('LPUSH', st.inflight, unpack(keep, i, math.min(i + PUSH_CHUNK - 1, #keep)))
  end
end

-- true when `env` has expired (then counted, and kept as a poison message when asked); only
-- an envelope that holds the text "expiration": has its header read
local function expired_now(st, env)
  if not string.find(env, '"expiration":', 1, true) then return false end
  local head = envelope_head(env)
  local expiration = tonumber(string.match(head, '"expiration":(%d+)') or '0')
  if expiration <= 0 or expiration > st.now then return false end
  local entry_id = string.match(head, '"entry_id":"([^"]*)"') or ''
  st.n_expired = st.n_expired + 1
  if st.any_redelivered then redis.call('HDEL', st.redelivered, entry_id) end
  if st.to_dlq then
    dead_letter_envelope(st.dlq, st.dlq_len, env, 'expired while waiting in subscription ' .. st.sub_id,
      entry_id, st.sub_id)
  end
  return true
end

-- hand `env` over: its delivery count, in the reply and in `keep` (for hand_over)
local function deliver(st, env, keep)
  local count = 1
  if st.any_redelivered then
    local entry_id = string.match(envelope_head(env), '"entry_id":"([^"]*)"') or ''
    count = 1 + tonumber(redis.call('HGET', st.redelivered, entry_id) or '0')
  end
  keep[#keep + 1] = env
  st.out[#st.out + 1] = env
  st.out[#st.out + 1] = count
  st.taken = st.taken + 1
end

-- Message groups, on a shared subscription only (an exclusive or active-standby one has one
-- consumer at a time, so its groups hold by themselves): the owner of `group`, or false.
local function owner_of(st, group)
  local owner = st.owners[group]
  if owner == nil then
    owner = redis.call('HGET', st.groups, group) or false
    st.owners[group] = owner
  end
  return owner
end

-- The consumer takes a message of `group` (seq): it owns the group from now on, unless a
-- negative JMSXGroupSeq closes the group (ActiveMQ Classic: the group's next message may go
-- to any consumer).
local function own(st, group, seq)
  local owners = st.owners
  if seq and seq < 0 then
    if owners[group] then redis.call('HDEL', st.groups, group) end
    owners[group] = false
  elseif owners[group] ~= st.consumer then
    redis.call('HSET', st.groups, group, st.consumer)
    owners[group] = st.consumer
  end
end

-- The usual way: a band's oldest messages are its rightmost: take up to the number still
-- wanted with one LRANGE and one LTRIM, and hand them over. With groups in force and the
-- groups hash empty at the start of the call, every group met is nobody's or this
-- consumer's (it takes them in this call): the same, with each group owned as it is taken.
local function take_band(st, band)
  local out, max_n, with_groups, owners = st.out, st.max_n, st.with_groups, st.owners
  local any_redelivered, redelivered = st.any_redelivered, st.redelivered
  while st.taken < max_n do
    local want = max_n - st.taken
    local envs = redis.call('LRANGE', band, -want, -1)
    if #envs == 0 then break end
    redis.call('LTRIM', band, 0, -(#envs + 1))
    local keep, taken = {}, st.taken
    for i = #envs, 1, -1 do
      local env = envs[i]
      -- deliver, written out: this loop runs once per message taken
      if not (string.find(env, '"expiration":', 1, true) and expired_now(st, env)) then
        if with_groups and may_be_grouped(env) then
          local group, seq = group_of(env)
          if group then
            if owners[group] == nil then owners[group] = false end   -- the hash was empty
            own(st, group, seq)
          end
        end
        local count = 1
        if any_redelivered then
          local entry_id = string.match(envelope_head(env), '"entry_id":"([^"]*)"') or ''
          count = 1 + tonumber(redis.call('HGET', redelivered, entry_id) or '0')
        end
        keep[#keep + 1] = env
        out[#out + 1] = env
        out[#out + 1] = count
        taken = taken + 1
      end
    end
    st.taken = taken
    hand_over(st, keep)
    if #envs < want then break end   -- the band is empty now
  end
end

-- With groups owned: a message of a group another consumer owns stays where it is, in
-- order; the band is read from its oldest end, first as many as the call wants, then as many
-- more as it may still look at (two LRANGE at most), until it has what it wants or has passed
-- over st.pass_left such messages. Then the messages read up to the last one
-- taken (or expired) are cut off with one LTRIM and those among them passed over put back with
-- RPUSH, in their order; the ones passed over after it are not written at all (a call that
-- takes nothing writes nothing to the bands).
local function take_band_grouped(st, band)
  local max_n, consumer = st.max_n, st.consumer
  local scanned, passed, keep, chunk = 0, {}, {}, max_n - st.taken
  -- cut: messages read up to the last one removed; kept: how many of `passed` are before it
  local cut, kept = 0, 0
  while st.taken < max_n and st.pass_left > 0 do
    local envs = redis.call('LRANGE', band, -(scanned + chunk), -(scanned + 1))
    if #envs == 0 then break end
    for i = #envs, 1, -1 do
      if st.taken >= max_n or st.pass_left <= 0 then break end
      local env = envs[i]
      scanned = scanned + 1
      if expired_now(st, env) then
        cut, kept = scanned, #passed
      else
        local group, seq
        if may_be_grouped(env) then group, seq = group_of(env) end
        local owner = group and owner_of(st, group)
        if owner and owner ~= consumer then
          passed[#passed + 1] = env
          st.pass_left = st.pass_left - 1
        else
          if group then own(st, group, seq) end
          deliver(st, env, keep)
          cut, kept = scanned, #passed
        end
      end
    end
    if #envs < chunk then break end   -- the band is read to its end
    chunk = st.pass_left + max_n - st.taken   -- the most the call may still look at
  end
  st.passed = st.passed + #passed
  if cut == 0 then return end
  redis.call('LTRIM', band, 0, -(cut + 1))
  -- passed[1] is the oldest: it goes back rightmost, so the newest is pushed first
  for i = kept, 1, -PUSH_CHUNK do
    local from = math.max(i - PUSH_CHUNK + 1, 1)
    local chunk_envs = {}
    for j = i, from, -1 do chunk_envs[#chunk_envs + 1] = passed[j] end
    redis.call('RPUSH', band, unpack(chunk_envs))
  end
  hand_over(st, keep)
end

local function receive(KEYS, ARGV)
  local sub = subscription_keys(KEYS[1])
  local consumer = consumer_arg(ARGV[1], true)
  local max_n = count_arg(ARGV[2], 'most messages', 1)
  local lease_ms = count_arg(ARGV[3], 'lease_ms', 10000)
  local now = now_arg(ARGV[4])
  local mode = mode_arg(ARGV[5], sub)
  local must_hold, standby_ok = mode ~= '0', mode == '2'
  local to_dlq, dlq_len, sub_id = ARGV[6] == '1', count_arg(ARGV[7], 'poison cap', 100000), sub.id
  local max_consumers = count_arg(ARGV[8], 'most consumers', 1000)
  local consumers, inflight, bell, redelivered = sub.consumers, sub.inflight_prefix .. consumer, sub.bell, sub.redelivered
  local active, dlq, expired, band_keys = sub.holder, sub.poison, sub.expired, sub.bands

  -- The keys this call may use are checked (the holder only for a mode that has one, the
  -- poison stream only when expired messages go there). Only a band that exists can be
  -- foreign, and usually only the default one (KEYS[1]) does: two EXISTS calls tell, and
  -- then only the bands that may hold messages are checked and read.
  local checks = {{consumers, 'zset'}, {inflight, 'list'}, {bell, 'list'}, {redelivered, 'hash'},
                  {expired, 'string'}}
  if must_hold then checks[#checks + 1] = {active, 'string'} end
  if to_dlq then checks[#checks + 1] = {dlq, 'stream'} end
  local bands = {}
  local default_band = redis.call('EXISTS', KEYS[1])
  if redis.call('EXISTS', unpack(band_keys)) == default_band then
    if default_band == 1 then bands[1] = KEYS[1] end
  else
    bands = band_keys
  end
  for _, k in ipairs(bands) do checks[#checks + 1] = {k, 'list'} end
  require_types(checks)
  -- message groups are in force on a shared subscription: one TYPE tells the groups hash
  -- (consumer per group) is foreign, absent (no group owned: the usual way) or there
  local with_groups, groups, groups_type = mode == '0', sub.groups, 'none'
  if with_groups then
    groups_type = redis.call('TYPE', groups)['ok']
    if groups_type ~= 'none' and groups_type ~= 'hash' then
      error({err = 'BROKER foreign key: ' .. groups .. ' holds a ' .. groups_type .. ', not a hash'})
    end
  end

  if max_consumers > 0 then
    -- a consumer joins when it has no live lease; refused, before any write, when the
    -- subscription has max_consumers live ones (standbys included)
    local mine = tonumber(redis.call('ZSCORE', consumers, consumer) or '-1')
    if mine < now then
      local live = redis.call('ZCOUNT', consumers, now, '+inf')
      if live >= max_consumers then return {'full', live} end
    end
  end
  if must_hold then
    -- the holder keeps the subscription while its lease (its deadline in the
    -- consumers zset) runs; a dead holder's messages are given back by broker_recover
    local holder = redis.call('GET', active)
    if holder and holder ~= consumer then
      local deadline = tonumber(redis.call('ZSCORE', consumers, holder) or '0')
      if deadline >= now then
        -- a standby (active-standby) is a consumer too; a refused second exclusive one is not
        if standby_ok then redis.call('ZADD', consumers, now + lease_ms, consumer) end
        return {'standby', 0}
      end
    end
    if holder ~= consumer then redis.call('SET', active, consumer) end
  end
  redis.call('ZADD', consumers, now + lease_ms, consumer)

  local st = {out = {'ok', 0}, taken = 0, n_expired = 0, max_n = max_n, now = now, consumer = consumer,
              inflight = inflight, redelivered = redelivered,
              any_redelivered = redis.call('EXISTS', redelivered) == 1, to_dlq = to_dlq, dlq = dlq,
              dlq_len = dlq_len, sub_id = sub_id, with_groups = with_groups, groups = groups, owners = {},
              pass_left = math.max(GROUP_PASS_FACTOR * max_n, GROUP_PASS_MIN), passed = 0}
  local grouped = with_groups and groups_type == 'hash'
  for _, band in ipairs(bands) do
    if st.taken >= max_n then break end
    if grouped then take_band_grouped(st, band) else take_band(st, band) end
  end
  local out, taken, n_expired = st.out, st.taken, st.n_expired
  -- pcall: a count that is not a number (the subscription's own key, written by hand) is not
  -- counted, and stops nothing
  if n_expired > 0 then redis.pcall('INCRBY', expired, n_expired) end
  out[2] = n_expired
  if max_n == 0 then
    -- a heartbeat: nothing taken, the bell left as it is
  elseif taken >= max_n or (taken > 0 and st.passed > 0) then
    ring(bell)                    -- more may wait (for another consumer): wake the next one
  else
    -- every band is empty, or holds messages of other consumers' groups only (as far as this
    -- call looked): this consumer waits for the bell, rung by a new message or another's take
    redis.call('DEL', bell)
  end
  return out
end

redis.register_function{function_name = 'broker_receive', callback = receive, flags = {'allow-oom'}}

-- broker_renew: KEYS[1] the subscription's key; ARGV[1] consumer id, ARGV[2] lease_ms,
-- ARGV[3] now, ARGV[4] mode, ARGV[5] max_consumers_per_subscription (as broker_receive's
-- 1, 3, 4, 5, 8); returns {status, 0} (or {"full", live consumers}): broker_receive taking nothing.
redis.register_function{
  function_name = 'broker_renew',
  callback = function(KEYS, ARGV)
    return receive(KEYS, {ARGV[1] or '', '0', ARGV[2] or '', ARGV[3] or '', ARGV[4] or '', '0', '', ARGV[5] or ''})
  end,
  flags = {'allow-oom'},
}
