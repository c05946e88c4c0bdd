-- Whether a job's live events are wanted: a live stream watches it (its `watch` field, set by
-- watch_job.lua or at create), or it was stored by an older API (no `r` in its `fin`), whose
-- streams expect them all. Events nobody hears are not published.
local function watched(watch, fin)
  return watch == '1' or not string.find(fin or '', 'r', 1, true)
end
