-- Give up publishers' turns (graceful stop): delete each turn key this worker
-- still holds, so that another worker's orphan sweep takes the turn at once
-- instead of waiting for the lease to run out.
--
-- ARGV[1] per-publisher key prefix  "{qm}:pub:"
-- ARGV[2] the worker's fencing token
-- ARGV[3..] publishers
-- returns the number of turns given up

local prefix, token, given_up = ARGV[1], ARGV[2], 0
for i = 3, #ARGV do
  local turn = prefix .. ARGV[i] .. ':turn'
  if redis.pcall('GET', turn) == token then  -- pcall: a foreign key is not ours
    redis.call('DEL', turn)
    given_up = given_up + 1
  end
end
return given_up
