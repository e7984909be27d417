-- broker_recover (allow-oom: giving a dead consumer's messages back moves them, adding no
-- memory to speak of, and consumers must go on when the server is full, since consuming is
-- what frees memory).
-- Give back the in-flight messages of a subscription's dead consumers: those whose lease
-- deadline has passed. Each message goes back to the head of its priority band, ahead of
-- newer ones, in the order it was received, and its failed deliveries are counted; one
-- delivered more than max_redeliveries times becomes a poison message instead (the
-- subscription's own poison stream). A live consumer's in-flight list is never touched.
-- Consumers dead for longer than forget_ms are forgotten; the subscription's last use
-- ("{qm}:sub:<id>:last_active", ms) is set to now when a consumer closes and raised to the
-- newest lease deadline of the consumers it forgets (idle durable expiry reads it).
-- Message groups: the groups the dead (or closing) consumers own are released (their
-- entries in "{qm}:sub:<id>:groups" removed) in the same call that gives their messages back
-- to the head of the bands, so the group's next owner receives those first, in order
-- (ActiveMQ Artemis: "If that consumer closes another consumer is chosen and will receive all
-- messages with the same group id"). A removed subscription's groups hash is deleted.
--
-- KEYS[1] the subscription's key "{qm}:sub:<id>" (consumers, redelivery counts, bell, poison
--   stream, the ten bands, holder, last use, groups hash, in-flight lists derived from it; the
--   subscription hash "{qm}:subs" only read: nothing is given back to a removed subscription)
-- ARGV[1] now, ms since the epoch, or "" for the server's clock
-- ARGV[2] max_redeliveries, default 10
-- ARGV[3] approximate cap of the poison stream, default 100000
-- ARGV[4] forget_ms, default 120000: a consumer dead for longer is removed from the consumers zset
-- ARGV[5] a consumer id to give back now whatever its lease (its own close), or "" (it also
--   gives up the holder key if it holds it, and leaves the consumers zset)
-- returns {consumers recovered, messages given back, messages made poison}
-- errors "BROKER foreign key: ...", "BROKER bad argument: ...", "BROKER not a subscription
--   key: ...", before any write

local function recover(KEYS, ARGV)
  local sub = subscription_keys(KEYS[1])
  local now = now_arg(ARGV[1])
  local max_redeliveries = count_arg(ARGV[2], 'max_redeliveries', 10)
  local dlq_len = count_arg(ARGV[3], 'poison cap', 100000)
  local forget_ms = count_arg(ARGV[4], 'forget_ms', 120000)
  local closing = consumer_arg(ARGV[5], false)
  local consumers, redelivered, bell, poison = sub.consumers, sub.redelivered, sub.bell, sub.poison
  local prefix, sub_id, last_active = sub.inflight_prefix, sub.id, sub.last_active

  local checks = {{consumers, 'zset'}, {redelivered, 'hash'}, {bell, 'list'}, {poison, 'stream'},
                  {sub.subs, 'hash'}, {sub.holder, 'string'}, {last_active, 'string'},
                  {sub.groups, 'hash'}}
  for _, band in ipairs(sub.bands) do checks[#checks + 1] = {band, 'list'} end
  require_types(checks)

  local dead = redis.call('ZRANGEBYSCORE', consumers, '-inf', '(' .. now)
  if closing ~= '' and redis.call('ZSCORE', consumers, closing) then dead[#dead + 1] = closing end
  local lists = {}
  for _, c in ipairs(dead) do
    local key = prefix .. c
    local why = foreign(key, 'list')
    if why then error({err = 'BROKER ' .. why}) end
    lists[#lists + 1] = key
  end

  local exists = redis.call('HEXISTS', sub.subs, sub_id) == 1
  local given, dropped, recovered = 0, 0, 0
  for _, key in ipairs(lists) do
    local envs = redis.call('LRANGE', key, 0, -1)   -- newest first (receive pushes on the left)
    if #envs > 0 then recovered = recovered + 1 end
    if exists then
      for _, env in ipairs(envs) do
        local head = envelope_head(env)
        local entry_id = string.match(head, '"entry_id":"([^"]*)"') or ''
        local priority = tonumber(string.match(head, '"priority":(%d)') or '4')
        local failed = redis.call('HINCRBY', redelivered, entry_id, 1)
        if failed > max_redeliveries then
          redis.call('HDEL', redelivered, entry_id)
          dead_letter_envelope(poison, dlq_len, env,
            'delivered ' .. failed .. ' times to consumers that died without acknowledging it '
              .. '(max_redeliveries ' .. max_redeliveries .. ')',
            entry_id, sub_id)
          dropped = dropped + 1
        else
          -- RPUSH newest first: the oldest ends rightmost, where receive takes from
          redis.call('RPUSH', sub.bands[1 + (9 - priority)], env)
          given = given + 1
        end
      end
    end
    redis.call('DEL', key)
  end
  if given > 0 then ring(bell) end
  -- the dead consumers' groups are released: one HGETALL, only when a consumer is dead or
  -- closing and some group is owned
  if not exists then
    redis.call('DEL', sub.groups)
  elseif #dead > 0 and redis.call('EXISTS', sub.groups) == 1 then
    local gone = {}
    for _, c in ipairs(dead) do gone[c] = true end
    local owned, released = redis.call('HGETALL', sub.groups), 0
    for i = 1, #owned, 2 do
      if gone[owned[i + 1]] then released = released + redis.call('HDEL', sub.groups, owned[i]) end
    end
    -- a released group's waiting messages are anybody's now: wake a consumer that passed them over
    if released > 0 and given == 0 then ring(bell) end
  end
  -- the subscription's last use, kept when its consumers leave the zset (a durable
  -- subscription idle for durable_idle_expiry_ms is removed: broker.operations.durables)
  local function used_at(ms)
    if not exists then return end
    local known = tonumber(redis.call('GET', last_active) or '0') or 0
    if ms > known then redis.call('SET', last_active, ms) end
  end
  if closing ~= '' then
    if redis.call('ZREM', consumers, closing) == 1 then used_at(now) end
    if redis.call('GET', sub.holder) == closing then redis.call('DEL', sub.holder) end
  end
  local forgotten = '(' .. (now - forget_ms)
  local newest = redis.call('ZREVRANGEBYSCORE', consumers, forgotten, '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if #newest > 0 then
    used_at(tonumber(newest[2]))
    redis.call('ZREMRANGEBYSCORE', consumers, '-inf', forgotten)
  end
  return {recovered, given, dropped}
end

redis.register_function{function_name = 'broker_recover', callback = recover, flags = {'allow-oom'}}
