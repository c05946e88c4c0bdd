-- A final status (succeeded, failed, canceled) is never left, and a final job's results never
-- change: every script that writes checks the status first, inside the same atomic step.
local function is_final(s)
  return s == 'succeeded' or s == 'failed' or s == 'canceled'
end
