-- Give up publishers' turns (graceful stop): delete each turn key this worker
-- still holds, so that another worker's orphan sweep takes the turn at once
-- instead of waiting for the lease to run out.
--
-- KEYS[1..] the publishers' turn keys  "{qm}:pub:<publisher>:turn" (declared, not
--           built here: a script with no KEYS is sent to any node of a cluster,
--           where it cannot reach the queue manager's slot)
-- ARGV[1] the worker's fencing token
-- returns the number of turns given up

local token, given_up = ARGV[1], 0
for i = 1, #KEYS do
  local turn = KEYS[i]
  if redis.pcall('GET', turn) == token then  -- pcall: a foreign key is not ours
    redis.call('DEL', turn)
    given_up = given_up + 1
  end
end
return given_up
