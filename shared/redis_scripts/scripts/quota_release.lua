-- Gives back reservations of a key's batch work on a model: each member once, however many
-- callers release it (a line's submission that failed, a line's job seen final).
--
-- KEYS: 1 the key's batch work on the model (zset), 2 its total.
-- ARGV: the members ("<sub-requests>:<job id>").
-- Returns the sub-requests given back.
local freed = 0
for _, member in ipairs(ARGV) do
  if redis.call('ZREM', KEYS[1], member) == 1 then
    freed = freed + tonumber(string.match(member, '^(%d+):'))
  end
end
if freed > 0 and redis.call('DECRBY', KEYS[2], freed) <= 0 then
  redis.call('DEL', KEYS[2])
end
return freed
