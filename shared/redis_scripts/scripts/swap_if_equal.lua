-- Changes a value only if it is still the one the caller read (Idempotency-Key claims: a request
-- never frees or overwrites a claim another request made in the meantime).
--
-- KEYS: 1 key.
-- ARGV: 1 expected value, 2 new value ('' to delete).
-- Returns 1 when changed, else 0.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
end
return 1
