-- Finished lines were written to a part in the blob store: name the part and drop the lines
-- from Redis. A part written by a replica that lost the lease meanwhile is never named (its
-- lines are still here, for the next part).
--
-- KEYS: 1 lines not yet in a part, 2 parts, 3 lease.
-- ARGV: 1 this replica, 2 the part's blob key, then the line indices it holds.
-- Returns 1, or -1 when this replica no longer holds the batch's lease.
if redis.call('GET', KEYS[3]) ~= ARGV[1] then return -1 end
redis.call('RPUSH', KEYS[2], ARGV[2])
for i = 3, #ARGV, 500 do
  redis.call('HDEL', KEYS[1], unpack(ARGV, i, math.min(i + 499, #ARGV)))
end
return 1
