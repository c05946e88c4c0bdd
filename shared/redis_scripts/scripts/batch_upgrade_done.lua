-- A batch recorded by a driver from before done lines were a bitmap: its `done` hash (line
-- index -> file line) becomes the bitmap, and its file lines wait in `lines` for a part.
--
-- KEYS: 1 done, 2 lines not yet in a part.
-- Returns how many lines it moved (0 when `done` is a bitmap already, or missing).
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then return 0 end
local entries = redis.call('HGETALL', KEYS[1])
redis.call('DEL', KEYS[1])
for i = 1, #entries, 2 do
  redis.call('SETBIT', KEYS[1], entries[i], 1)
  redis.call('HSET', KEYS[2], entries[i], entries[i + 1])
end
return #entries / 2
